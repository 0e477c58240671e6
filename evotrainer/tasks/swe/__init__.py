"""The SWE domain's tasks: bugs synthesized offline in real Python repositories.

A leaf (no JAX), but for diagnostics.py and validators.py, which plug into the harness:
repository code only ever runs in the sandbox (`runner.py`).

  sources.py  the pinned source distributions (data/swe_sources.json): pip
              download into a cache, sha256 check, extraction.
  runner.py   a repository's pytest suite run in sandbox cells; per-test outcomes.
  mutate.py   libcst bug injection: operator swap, constant change, inverted condition,
              removed statement, swapped arguments.
  synth.py    stable tests -> mutants -> FAIL_TO_PASS / PASS_TO_PASS -> issue text;
              the issue levels (`at_level`: 0 names file, function and faulty line, 1
              file and function, 2 only the failing behaviour).
  records.py  `SweTask` (with its issue `level`) and its SWE-bench-format JSONL.
  repo.py     the episode's checkout (the mutant as the only commit; `keep_history` puts
              the base one commit back: the leak of gin/swe_leaky.gin) and grading (the
              episode's non-test changes over pristine tests, F2P + P2P).
  splits.py   train / validation / test, disjoint by repository version and function.
  agents.py   the oracle (inverse edit), the random agent and the history agent (reads
              the fix from git history): tests of the environment.
  tools.py    the episode's tools (list_dir, read_file, grep, search_replace, run_tests,
              submit) on its checkout, and the call syntax (one ```tool JSON block a turn).
  hints.py    what a failed call's observation suggests: the closest lines to a missed
              search text, the nearest paths to a missing one.
  pyedit.py   whole-function edits: a ```python block as the `edit_function` call
              (`ToolConfig.code_edits`), and the function's source for the issue.
  git_tool.py the read-only `git` tool (off by default): checked command lines run in a
              sandbox cell on the episode's files and `.git`.
  episode.py  one episode's turns, budgets and stop reasons; its `info` record and reward
              parts (resolved, F2P fraction, tamper, tool-call validity).
  diagnostics.py  tool mix, first edit, streaks, echo traps, git use and history reads,
              registered in the harness's diagnostic library.
  validators.py   the leak detector and the history leak, registered in the harness's
              validator library.
"""

from evotrainer.tasks.swe.records import Mutation, SweTask, TaskFormatError, read_jsonl, write_jsonl
from evotrainer.tasks.swe.repo import Grade, checkout, grade, grade_many
from evotrainer.tasks.swe.runner import SuiteRunner
from evotrainer.tasks.swe.sources import Source, SourceError, fetch, load_manifest
from evotrainer.tasks.swe.splits import assign_splits
from evotrainer.tasks.swe.synth import SynthConfig, SynthesisError, synthesize

__all__ = ["Mutation", "SweTask", "TaskFormatError", "read_jsonl", "write_jsonl", "Grade",
           "checkout", "grade", "grade_many", "SuiteRunner", "Source", "SourceError", "fetch",
           "load_manifest", "assign_splits", "SynthConfig", "SynthesisError", "synthesize"]
