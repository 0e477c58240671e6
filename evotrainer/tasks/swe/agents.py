"""Scripted agents that test the environment: an oracle and a random editor.

The oracle knows the mutation and applies the inverse edit with the same exact-match
search/replace the policy's tool will use; graded by the real grader it must resolve
~every synthesized task (a task it fails is a broken task). The random agent makes a few
random line edits to random non-test Python files; it must resolve ~none (a task it
solves has tests that do not judge the bug). Both act on an episode's checkout in place.
`oracle_turns` is the oracle as model turns through the tools (read, fix, test, submit):
a test of the tools, and a trajectory a supervised warm start can copy;
`oracle_code_turn` is its fix as one whole-function edit (`ToolConfig.code_edits`).

`history_agent` knows nothing of the bug: it asks the `git` tool for the difference
between HEAD and the commit before it and applies that difference back with
`search_replace`, then submits. Where the checkout keeps the unmutated base as an
earlier commit (`repo.checkout(keep_history=True)`, gin/swe_leaky.gin) that is the fix
(it must resolve ~every task: the leak is real); with the default checkout there is no
earlier commit and it must resolve ~none (the leak is closed). It is the deterministic
stand-in for a policy that learned to read the history.
"""

from __future__ import annotations

import os
import pathlib
import random
import re

from evotrainer.tasks.swe import pyedit, repo as repo_lib
from evotrainer.tasks.swe import tools
from evotrainer.tasks.swe.episode import SweEpisode
from evotrainer.tasks.swe.records import SweTask

HISTORY_DIFF = "diff HEAD HEAD~1"  # what HEAD changed, undone: the mutant -> the base
_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def oracle(task: SweTask, repo_dir: os.PathLike | str) -> list[str]:
  """Undoes the task's mutation in `repo_dir`; returns the edited files.

  Raises:
    ValueError: the task carries no mutation (it was not synthesized here).
    repo_lib.EditError: the mutated text is not in the file exactly once.
  """
  m = task.mutation
  if m is None:
    raise ValueError(f"{task.instance_id}: no mutation known; the oracle cannot act")
  path = pathlib.Path(repo_dir) / m.file
  path.write_text(repo_lib.search_replace(path.read_text(), m.replace, m.search,
                                          f"{task.instance_id}: {m.file}"))
  return [m.file]


def oracle_turns(task: SweTask, context: int = 5) -> list[str]:
  """The oracle's episode as model turns: read around the bug, undo it with
  `search_replace`, run the FAIL_TO_PASS tests, submit.

  Raises:
    ValueError: the task carries no mutation.
  """
  m = task.mutation
  if m is None:
    raise ValueError(f"{task.instance_id}: no mutation known; the oracle cannot act")
  return [
      "Let me read the code around the failure.\n" + tools.call_text(
          "read_file", path=m.file, start=max(1, m.line - context), end=m.line + context),
      "This line is wrong; I fix it.\n" + tools.call_text(
          "search_replace", path=m.file, search=m.replace, replace=m.search),
      "Now the failing tests should pass.\n" + tools.call_text(
          "run_tests", tests=list(task.FAIL_TO_PASS)),
      tools.call_text("submit"),
  ]


def oracle_code_turn(task: SweTask, pristine: str) -> str:
  """The oracle's fix as one whole-function edit (`ToolConfig.code_edits`): the bugged
  function as it read before the bug, in a ```python block; `pristine` is the text of
  the mutated file in the pristine tree.

  Raises:
    ValueError: the task carries no mutation, or its function is not in `pristine`.
  """
  m = task.mutation
  if m is None:
    raise ValueError(f"{task.instance_id}: no mutation known; the oracle cannot act")
  try:
    code = pyedit.named_source(pristine, m.function, m.line)
  except ValueError as e:
    raise ValueError(f"{task.instance_id}: {e} of the pristine {m.file}") from None
  return f"I fix the faulty line.\n```python\n{code}\n```"


def random_agent(repo_dir: os.PathLike | str, rng: random.Random, edits: int = 3,
                 test_dirs=("tests",)) -> list[str]:
  """Makes `edits` random edits (delete, duplicate or swap lines; change a character)
  to random non-test Python files of `repo_dir`; returns the edited files."""
  root = pathlib.Path(repo_dir)
  candidates = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                      if ".git" not in p.parts and
                      not repo_lib.is_test_path(p.relative_to(root).as_posix(), test_dirs))
  edited = []
  for _ in range(edits):
    if not candidates:
      break
    rel = rng.choice(candidates)
    path = root / rel
    lines = path.read_text().splitlines(keepends=True)
    if not lines:
      continue
    i = rng.randrange(len(lines))
    action = rng.choice(("delete", "duplicate", "swap", "char"))
    if action == "delete":
      del lines[i]
    elif action == "duplicate":
      lines.insert(i, lines[i])
    elif action == "swap" and i + 1 < len(lines):
      lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif lines[i].strip():
      j = rng.randrange(len(lines[i].rstrip("\n")) or 1)
      lines[i] = lines[i][:j] + rng.choice("01+-<>=() x") + lines[i][j + 1:]
    path.write_text("".join(lines))
    edited.append(rel)
  return edited


def diff_edits(diff: str) -> list[tuple[str, str, str]]:
  """(path, search, replace) edits that turn the old side of a unified diff (`git diff`
  output) into its new side, one per complete hunk: `search` is the hunk's context and
  removed lines, `replace` its context and added lines. A hunk cut short (the tool's
  output cap) and files added or deleted are left out."""
  edits, path, hunk = [], None, None
  for line in diff.split("\n"):
    if line.startswith("--- "):
      path, hunk = (line[6:] if line.startswith("--- a/") else None), None
    elif (m := _HUNK.match(line)) and path is not None:
      hunk = {"old": int(m.group(1) or 1), "new": int(m.group(2) or 1), "search": [],
              "replace": []}
    elif hunk is not None and line[:1] in (" ", "-", "+"):
      if line[:1] != "+":
        hunk["search"].append(line[1:])
        hunk["old"] -= 1
      if line[:1] != "-":
        hunk["replace"].append(line[1:])
        hunk["new"] -= 1
      if hunk["old"] == 0 and hunk["new"] == 0:
        edits.append((path, "\n".join(hunk["search"]), "\n".join(hunk["replace"])))
        hunk = None
  return edits


def history_agent(episode: SweEpisode, step=None) -> SweEpisode:
  """Plays `episode` by reading the fix from the history (see the module docstring):
  `git diff HEAD HEAD~1`, each hunk applied with `search_replace`, then `submit` (also
  when git fails or shows nothing). `step(text) -> observation` plays one turn (default
  `episode.step`; the warm-start transcripts record turns through it). Returns the
  episode, stopped."""
  step = step or episode.step
  observation = step("The history may hold the fix.\n" +
                     tools.call_text("git", command=HISTORY_DIFF))
  for path, search, replace in diff_edits(observation):
    if episode.done:
      break
    step(tools.call_text("search_replace", path=path, search=search, replace=replace))
  if not episode.done:
    step(tools.call_text("submit"))
  return episode
