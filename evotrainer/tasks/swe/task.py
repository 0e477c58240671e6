"""`SweDomain`: the SWE domain as a multi-turn task of the RL loop.

Task set: built once from the pinned libraries (`sources.fetch`, `synth.synthesize`),
every task's oracle episode run through the real tools and graded (a task the oracle does
not resolve is dropped and counted), split train / validation / test by
`splits.assign_splits`; synthesis and oracle transcripts are cached under `cache_dir`
(`build_task_set`: changing a tool knob replays the oracle, not the synthesis).

Chat format (`tasks/chat.py`): for from-scratch tokenizers the plain layout (that of
`SentencePieceTokenizer.apply_chat_template`, with its `Tool` role for observations):

    System: <SYSTEM: the tool syntax, one line per tool>
    User: <the issue text>
    Assistant: <model turn 1, ended by eos>
    Tool: <observation 1>
    Assistant: <model turn 2, ended by eos>
    ...

`format_prompt` is the first three lines; `format_observation(obs)` is the text between
a model turn's eos and the next model turn ("\\nTool: <obs>\\nAssistant:"). With a Hugging
Face tokenizer (`use_tokenizer`, called by the run once the policy's tokenizer exists),
the same episode is rendered with the tokenizer's own chat template
(`chat.ChatFormat.from_tokenizer`).

Issue levels (`SweDomain.levels`, `synth.at_level`): each task is offered with its
issue text at each chosen level (0: file, function and faulty line named; 1: file and
function; 2: the failing behaviour only), one problem per (task, level).

Warm start: `Problem.solution` is the oracle's episode as text (each model turn followed
by `format_observation` of its real observation; the submit turn last), and
`solution_segments` gives the same episode as (text, trained) segments so that the warm
start trains on the model turns (each ended by eos, as the multi-turn engine samples
them) and masks the observations out of the loss (learner/warmstart.py).

Reward parts (`finish_episodes`): `episode.reward_parts` (correct = resolved, partial =
F2P fraction, tamper, tool_validity, tested_before_submit) plus `format` (at least one
turn's call parsed and ran) and `submitted`. `score_many` replays a transcript's model
turns (the text between observation blocks) in a fresh episode and grades it: what the
single-turn consumers (evaluation pipeline check, exploit probe) read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import random
import re
import shutil
import tempfile
import time
from typing import Mapping, Optional, Sequence

import gin

from evotrainer import atomic
from evotrainer.tasks import chat as chat_lib
from evotrainer.tasks.base import Problem, normalize_prompt
from evotrainer.tasks.swe import diagnostics as diagnostics_lib
from evotrainer.tasks.swe import agents, mutate, records, repo as repo_lib, runner as runner_lib
from evotrainer.tasks.swe import sources as sources_lib
from evotrainer.tasks.swe import splits as splits_lib
from evotrainer.tasks.swe import synth as synth_lib
from evotrainer.tasks.swe import tools as tools_lib
from evotrainer.tasks.swe.episode import Budget, SweEpisode, reward_parts

log = logging.getLogger(__name__)

FORMAT = 1  # bumped when the cached task set's content changes meaning
DIFFICULTY_LEVEL = {"easy": 1, "medium": 2, "hard": 3}
SYSTEM = ("Fix the bug. Each turn: one call as a ```tool block holding "
          '{"tool": NAME, "args": {...}}. Tools: list_dir(path), read_file(path, start, '
          "end), grep(pattern, path), search_replace(path, search, replace), "
          "run_tests(tests), submit().")
# For `ToolConfig.code_edits` (pyedit.py): the fix as a function, the model's own idiom.
SYSTEM_CODE = ("Fix the bug. Write the whole fixed function in one ```python block; it "
               "replaces the function of that name in the repository.")
gin.constant("tasks.swe.SYSTEM_CODE", SYSTEM_CODE)
# The same with one example call, for a pretrained model new to the syntax.
SYSTEM_EXAMPLE = (SYSTEM + " Example turn:\n```tool\n"
                  '{"tool": "read_file", "args": {"path": "pkg/module.py", "start": 1, '
                  '"end": 40}}\n```')
PLAIN = chat_lib.ChatFormat(SYSTEM)
PART_KEYS = ("correct", "partial", "tamper", "tool_validity", "tested_before_submit",
             "format", "submitted")

gin.external_configurable(tools_lib.ToolConfig, module="tasks.swe")
gin.external_configurable(Budget, module="tasks.swe")


def format_observation(observation: str) -> str:
  """The text appended after a model turn in the plain layout (module docstring)."""
  return PLAIN.observation(observation)


def split_turns(transcript: str) -> list[str]:
  """The model turns of a plain-layout transcript (`ChatFormat.split_turns`)."""
  return PLAIN.split_turns(transcript)


@dataclasses.dataclass
class TaskSet:
  """A built task set.

  Attributes:
    tasks: the tasks (split set), oracle-verified.
    trees: {task.repo: its pristine source tree}.
    test_dirs: {task.repo: its test folders}.
    transcripts: {instance_id: [[model turn, observation], ...]}: the scripted agent's
      episode (`demonstrations`: the oracle's by default).
    stats: per library: synthesis counts, build seconds, oracle rate.
  """
  tasks: list
  trees: dict
  test_dirs: dict
  transcripts: dict
  stats: dict


def _tree_digest(tree: pathlib.Path) -> str:
  h = hashlib.sha256()
  for path, text in sorted(runner_lib.repo_files(tree).items()):
    if path != repo_lib.MARKER:
      h.update(path.encode() + b"\0" + text.encode() + b"\0")
  return h.hexdigest()


DEMONSTRATIONS = ("oracle", "history")


def transcript(task: records.SweTask, tree: pathlib.Path, test_dirs: Sequence[str],
               suite: runner_lib.SuiteRunner, tool_config: tools_lib.ToolConfig,
               budget: Budget, dest: pathlib.Path, context: int, agent: str = "oracle"
               ) -> tuple[list, repo_lib.Grade]:
  """A scripted agent's turns run through a real episode on a fresh checkout at `dest`,
  and the grade of that checkout: ([[turn, observation], ...], grade). `agent`:
  "oracle" (`agents.oracle_turns`, on the default checkout) or "history"
  (`agents.history_agent`, on a checkout keeping the base as an earlier commit; needs
  `tool_config.git`)."""
  if agent not in DEMONSTRATIONS:
    raise ValueError(f"demonstrations={agent!r}: expected one of {DEMONSTRATIONS}")
  repo_lib.checkout(tree, task, dest, keep_history=agent == "history")
  episode = SweEpisode(tools_lib.Workspace(dest, suite, test_dirs, tool_config), budget)
  turns = []

  def step(text: str) -> str:
    turn = PLAIN.turn(text)  # the prompt ends with "Assistant:"; the turn brings its space
    turns.append([turn, episode.step(turn)])
    return turns[-1][1]

  if agent == "history":
    agents.history_agent(episode, step)
  else:
    for text in agents.oracle_turns(task, context):
      step(text)
      if episode.done:
        break
  return turns, repo_lib.grade(task, tree, dest, suite, test_dirs)


def _key(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=list).encode()).hexdigest()[:24]


def _cached(path: pathlib.Path, make) -> dict:
  """The JSON at `path`, or `make()` written there first (atomically)."""
  if path.is_file():
    return json.loads(path.read_text())
  data = make()
  path.parent.mkdir(parents=True, exist_ok=True)
  atomic.write_json(path, data)
  return data


def build_task_set(names: Sequence[str], config: synth_lib.SynthConfig,
                   suite: runner_lib.SuiteRunner, *, cache_dir: str,
                   manifest: Optional[str] = None, trees: Optional[Mapping[str, str]] = None,
                   tool_config: tools_lib.ToolConfig = tools_lib.ToolConfig(),
                   budget: Budget = Budget(), oracle_context: int = 2,
                   fractions: Sequence[float] = (0.8, 0.1, 0.1), group_by: str = "function",
                   split_seed: int = 0, demonstrations: str = "oracle") -> TaskSet:
  """Builds the task set of the named sources, through two caches in `cache_dir/tasks/`:
  each source's synthesized tasks (`synth-<key>.json`, keyed by its pin, or a local
  tree's content, and the synthesis knobs) and their oracle transcripts
  (`oracle-<key>.json`, keyed further by the tool knobs, budgets and `oracle_context`).

  Args:
    names: source names of the manifest.
    config: synthesis knobs (per source).
    suite: runs suites in the sandbox.
    cache_dir: fetched sources and built task sets live here.
    manifest: the sources manifest (default: the package's data/swe_sources.json).
    trees: {name: a local directory} used instead of fetching that source.
    tool_config, budget: the episode's tools and budgets (the oracle's observations).
    oracle_context: lines around the bug the oracle reads on each side.
    fractions, group_by, split_seed: see `splits.assign_splits`.
    demonstrations: the scripted agent whose episodes are the transcripts ("oracle", or
      "history": `transcript`); a task its episode does not resolve is dropped.
  """
  cache = pathlib.Path(os.path.expanduser(cache_dir))
  all_sources = {s.name: s for s in sources_lib.load_manifest(manifest or sources_lib.MANIFEST)}
  missing = [n for n in names if n not in all_sources]
  if missing or not names:
    raise ValueError(f"SweDomain.sources={list(names)}: {missing or 'none'} not in the "
                     f"manifest {manifest or sources_lib.MANIFEST} (it has "
                     f"{sorted(all_sources)})")
  trees = dict(trees or {})
  picked = [all_sources[n] for n in names]
  fetched = {s.repo: (pathlib.Path(trees[s.name]) if s.name in trees
                      else sources_lib.fetch(s, cache)) for s in picked}
  tasks, transcripts, stats = [], {}, {}
  with tempfile.TemporaryDirectory(prefix="swe-build-") as work:
    for source in picked:
      tree = fetched[source.repo]
      pin = dataclasses.asdict(source) | ({"tree": _tree_digest(tree)}
                                          if source.name in trees else {})
      synth_key = _key({"format": FORMAT, "pin": pin, "synth": dataclasses.asdict(config)})

      def synthesize(source=source, tree=tree) -> dict:
        built, synth_stats = synth_lib.synthesize(source, tree, suite, config)
        built = [synth_lib.with_base(t, tree, pathlib.Path(work) / "base") for t in built]
        return {"tasks": [t.to_row() for t in built],
                "stats": dataclasses.asdict(synth_stats)}

      path = cache / "tasks" / f"synth-{synth_key}.json"
      synthesized = _cached(path, synthesize)
      built = [records.from_row(row, f"{path}:{i}")
               for i, row in enumerate(synthesized["tasks"])]

      def oracle(source=source, tree=tree, built=built) -> dict:
        start, out = time.monotonic(), {}
        for task in built:
          dest = pathlib.Path(work) / task.instance_id
          turns, grade = transcript(task, tree, source.tests, suite, tool_config, budget,
                                    dest, oracle_context, demonstrations)
          shutil.rmtree(dest, ignore_errors=True)
          out[task.instance_id] = turns if grade.resolved else None
        return {"transcripts": out, "oracle_s": round(time.monotonic() - start, 2)}

      # The oracle's turn texts are part of the key: rewording them replays the oracle.
      # The history agent's turns come from its observations: its name and its git
      # command are the key.
      oracle_key = _key({"synth": synth_key, "tools": dataclasses.asdict(tool_config),
                         "budget": dataclasses.asdict(budget), "context": oracle_context,
                         "turns": [agents.oracle_turns(t, oracle_context) for t in built]}
                        | ({"agent": demonstrations, "command": agents.HISTORY_DIFF}
                           if demonstrations == "history" else {}))
      played = _cached(cache / "tasks" / f"oracle-{oracle_key}.json", oracle)
      kept = [t for t in built if played["transcripts"].get(t.instance_id)]
      transcripts.update({t.instance_id: played["transcripts"][t.instance_id] for t in kept})
      tasks += kept
      stats[source.repo] = {**synthesized["stats"], "oracle_s": played["oracle_s"],
                            "oracle_rate": len(kept) / max(len(built), 1), "kept": len(kept),
                            "demonstrations": demonstrations}
  tasks = splits_lib.assign_splits(tasks, fractions, group_by, split_seed)
  return TaskSet(tasks, {repo: str(tree) for repo, tree in fetched.items()},
                 {s.repo: tuple(s.tests) for s in picked}, transcripts, stats)


def _drop_duplicates(tasks: Sequence[records.SweTask]
                     ) -> tuple[dict[str, list[records.SweTask]], int]:
  """({split: its tasks}, tasks dropped). Two mutants can fail the same tests with the
  same messages: one issue text. A held-out task whose (level-2) text is already in an
  earlier split is dropped (logged), whatever the levels offered, so the held-out tasks
  do not depend on them."""
  by_split = {s: [t for t in tasks if t.split == s] for s in splits_lib.SPLITS}
  seen = {normalize_prompt(t.problem_statement) for t in by_split["train"]}
  dropped = 0
  for split in ("validation", "test"):
    kept = [t for t in by_split[split] if normalize_prompt(t.problem_statement) not in seen]
    dropped += len(by_split[split]) - len(kept)
    seen |= {normalize_prompt(t.problem_statement) for t in kept}
    by_split[split] = kept
  if dropped:
    log.info("SweDomain: dropped %d held-out task(s) whose issue text is in an earlier "
             "split", dropped)
  return by_split, dropped


def _checked_kinds(system, difficulties, levels, kinds, sizes) -> list:
  """SweDomain's knobs checked (a ValueError naming the knob); the mutation kinds it
  synthesizes: one-token ones only without the 'hard' difficulty. `sizes`: max_tasks,
  max_candidates, max_f2p and max_output_chars."""
  if not isinstance(system, str) or not system.strip():
    raise ValueError(f"SweDomain.system={system!r}: expected the system text")
  bad = [d for d in difficulties if d not in DIFFICULTY_LEVEL]
  if bad or not difficulties:
    raise ValueError(f"SweDomain.difficulties={list(difficulties)}: expected a non-empty "
                     f"subset of {tuple(DIFFICULTY_LEVEL)}")
  if (not levels or len(set(levels)) != len(levels) or
      any(type(v) is not int or v not in records.LEVELS for v in levels)):
    raise ValueError(f"SweDomain.levels={list(levels)}: expected distinct levels of "
                     f"{records.LEVELS} (0: the issue names the file, function and "
                     f"line; 1: file and function; 2: only the failing behaviour)")
  bad = [k for k in kinds if k not in mutate.KINDS]
  if bad or not kinds:
    raise ValueError(f"SweDomain.kinds={list(kinds)}: expected a subset of {mutate.KINDS}")
  if "hard" not in difficulties:
    kinds = [k for k in kinds if k in mutate.ONE_TOKEN]
  if min(sizes) < 1:
    raise ValueError("SweDomain: max_tasks, max_candidates, max_f2p and "
                     "max_output_chars must be positive")
  return list(kinds)


def _check_demonstrations(demonstrations, tool_config, checkout_options) -> None:
  """`SweDomain.demonstrations` is one of DEMONSTRATIONS that the tools and checkouts
  allow: 'history' needs the git tool on a kept history; code edits need 'oracle'."""
  if demonstrations not in DEMONSTRATIONS:
    raise ValueError(f"SweDomain.demonstrations={demonstrations!r}: expected one of "
                     f"{DEMONSTRATIONS}")
  if demonstrations == "history" and not (
      tool_config.git and (checkout_options or {}).get("keep_history")):
    raise ValueError("SweDomain.demonstrations='history' reads the fix from the "
                     "repository's history: it needs ToolConfig.git = True and "
                     "SweDomain.checkout_options = {'keep_history': True} "
                     "(gin/swe_leaky.gin)")
  if demonstrations != "oracle" and tool_config.code_edits:
    raise ValueError(f"SweDomain.demonstrations={demonstrations!r} with "
                     "ToolConfig.code_edits: the demonstrations are then the oracle's "
                     "whole-function edits; use 'oracle'")


@gin.configurable(module="tasks")
class SweDomain:
  """Repository bug-fixing episodes (see the module docstring).

  Args:
    sources: manifest names of the libraries to build tasks from.
    max_tasks, max_candidates, max_f2p, kinds, synth_seed: synthesis knobs per library
      (`synth.SynthConfig`: tasks kept, mutants tried, most FAIL_TO_PASS tests, mutation
      kinds, site order seed).
    difficulties: the task difficulties kept ("easy": one-token bug, the issue names the
      file; "medium": one-token bug; "hard": structural). Only one-token kinds are
      synthesized when "hard" is not asked for.
    levels: the issue levels (the curriculum knob; `records.LEVELS`, `synth.at_level`):
      0 names the file, the function and the faulty line; 1 the file and the function;
      2 only the failing behaviour (the synthesized text, today's tasks). Every task of
      every split is offered at each listed level, as its own problem (id: the
      instance id at level 2, "<instance id>-L0" / "-L1" below; `Problem.meta["level"]`),
      so training draws mix the levels in equal shares and a held-out split holds the
      same tasks at each level, task by task: the underlying held-out tasks do not
      depend on `levels`, and per-level resolve rates compare the same bugs.
    fractions: train / validation / test shares (`splits.assign_splits`).
    group_by: what the splits keep apart: "function" or "repo".
    split_seed: the split's hash seed.
    cache_dir: fetched sources and built task sets (`~` expanded).
    manifest: the sources manifest (None: the package's data/swe_sources.json).
    trees: {source name: local directory} used instead of fetching it (offline, or a
      user's own checkout of the pinned version).
    tool_config: the tools' knobs (`@ToolConfig()`; None: `ToolConfig()` with
      `max_output_chars`): output cap, read lines, grep matches, test time limit.
    max_output_chars: observation cap when `tool_config` is None (tiny contexts).
    budget: the episode's budgets (`@Budget()`: max_turns, max_errors, echo_k).
    checkout_options: extra keyword arguments of `repo.checkout` for every episode's
      repository (a hook for checkout variants, e.g. one keeping history).
    oracle_context: lines around the bug the oracle's read shows on each side (the
      warm-start transcripts; fewer lines, shorter episodes).
    demonstrations: whose episodes the warm start copies: "oracle" (knows the mutation:
      read, fix, test, submit) or "history" (`agents.history_agent`: reads the fix from
      `git diff HEAD HEAD~1` and applies it; needs `tool_config.git` and
      `checkout_options={'keep_history': True}`). "history" stands for a policy that
      already knows how to read a repository's history: gin/swe_leaky.gin's planted
      leak, which `validators.HistoryLeak` must catch.
    workers: sandbox cells running suites (None: up to 2).
    suite: a `SuiteRunner` to use (tests share one; None: the task makes its own).
    system: the system text that opens every episode: how to call the tools (`SYSTEM`;
      `SYSTEM_EXAMPLE` adds one example call, for a pretrained model that has not seen
      the syntax: bench/swe_real.py measures first-turn validity under each;
      `SYSTEM_CODE`, in gin `%tasks.swe.SYSTEM_CODE`, asks for the fixed function, for
      `ToolConfig.code_edits`).
    show_code: at levels 0 and 1, where the issue names the function, the issue also
      shows the function's current source (`synth.with_code`; SWE-bench's oracle
      retrieval shows the files a fix touches in the same way).
  """

  multi_turn = True

  def __init__(self, sources: Sequence[str] = ("xmltodict", "parse", "tinydb"),
               max_tasks: int = 20, max_candidates: int = 60, max_f2p: int = 10,
               kinds: Sequence[str] = mutate.KINDS, synth_seed: int = 0,
               difficulties: Sequence[str] = ("easy", "medium", "hard"),
               levels: Sequence[int] = (2,),
               fractions: Sequence[float] = (0.8, 0.1, 0.1), group_by: str = "function",
               split_seed: int = 0, cache_dir: str = "~/.cache/evotrainer/swe",
               manifest: Optional[str] = None, trees: Optional[Mapping[str, str]] = None,
               tool_config: Optional[tools_lib.ToolConfig] = None,
               max_output_chars: int = 600, budget: Optional[Budget] = None,
               checkout_options: Optional[Mapping] = None, oracle_context: int = 2,
               demonstrations: str = "oracle", workers: Optional[int] = None,
               suite: Optional[runner_lib.SuiteRunner] = None, system: str = SYSTEM,
               show_code: bool = False):
    kinds = _checked_kinds(system, difficulties, levels, kinds,
                           (max_tasks, max_candidates, max_f2p, max_output_chars))
    self.tool_config = tool_config or tools_lib.ToolConfig(max_output_chars=max_output_chars)
    _check_demonstrations(demonstrations, self.tool_config, checkout_options)
    self.budget = budget or Budget()
    self.max_turns = self.budget.max_turns  # checked against TurnBudget.max_turns
    self.system = system
    self.chat = chat_lib.ChatFormat(system)
    self.checkout_options = dict(checkout_options or {})
    self.difficulties = tuple(difficulties)
    self._own_suite = suite is None
    self.suite = suite or runner_lib.SuiteRunner(workers=workers)
    config = synth_lib.SynthConfig(max_tasks=max_tasks, max_candidates=max_candidates,
                                   max_f2p=max_f2p, kinds=tuple(kinds), seed=synth_seed)
    start = time.monotonic()
    self.task_set = build_task_set(
        list(sources), config, self.suite, cache_dir=cache_dir, manifest=manifest,
        trees=trees, tool_config=self.tool_config, budget=self.budget,
        oracle_context=oracle_context, fractions=fractions, group_by=group_by,
        split_seed=split_seed, demonstrations=demonstrations)
    self.build_s = time.monotonic() - start
    self.levels = tuple(levels)
    kept = [t for t in self.task_set.tasks if t.difficulty in self.difficulties]
    by_split, self.duplicates = _drop_duplicates(kept)
    empty = [s for s, ts in by_split.items() if not ts]
    if empty:
      raise ValueError(f"SweDomain: no {'/'.join(empty)} tasks among {len(kept)} "
                       f"built tasks of difficulty {list(self.difficulties)}; raise "
                       f"SweDomain.max_tasks, add sources or difficulties")
    self.show_code = show_code
    self._pristine: dict[str, dict[str, str]] = {}  # {repo: its pristine files}
    # Every task at every level: {problem id: the task at that level}.
    self.records = {leveled.level_id: leveled for t in kept for leveled in
                    (self._at_level(t, level) for level in self.levels)}
    self.splits = {s: [self._problem(self.records[synth_lib.at_level(t, level).level_id])
                       for t in ts for level in self.levels] for s, ts in by_split.items()}
    self._work = pathlib.Path(tempfile.mkdtemp(prefix="swe-episodes-"))

  # ------------------------------------------------------------------ problems

  def _at_level(self, task: records.SweTask, level: int) -> records.SweTask:
    leveled = synth_lib.at_level(task, level)
    if not self.show_code or level == 2:
      return leveled
    m = task.mutation
    bugged = repo_lib.search_replace(self._pristine_file(task), m.search, m.replace,
                                     f"{task.instance_id}: {m.file}")
    return synth_lib.with_code(leveled, bugged)

  def _pristine_file(self, task: records.SweTask) -> str:
    """The text of the task's mutated file in the pristine tree (each tree read once)."""
    if task.repo not in self._pristine:
      self._pristine[task.repo] = runner_lib.repo_files(self.task_set.trees[task.repo])
    return self._pristine[task.repo][task.mutation.file]

  def _problem(self, task: records.SweTask) -> Problem:
    return Problem(task.level_id, task.problem_statement, "resolved",
                   "".join(text for text, _ in self._segments(task.level_id)),
                   task.repo, DIFFICULTY_LEVEL[task.difficulty],
                   {"split": task.split, "difficulty": task.difficulty, "level": task.level,
                    "instance_id": task.instance_id})

  def _segments(self, problem_id: str) -> list[tuple[str, bool]]:
    # One oracle episode per task, whatever the level: with code edits its one
    # whole-function edit (the harness submits after it), else its cached tool episode.
    task = self.records[problem_id]
    if self.tool_config.code_edits:
      return [(self.chat.turn(agents.oracle_code_turn(task, self._pristine_file(task))),
               True)]
    turns = self.task_set.transcripts[task.instance_id]
    out = []
    for i, (turn, obs) in enumerate(turns):
      # The oracle's turns are cached in the plain layout (with its leading space).
      out.append((self.chat.turn(turn.removeprefix(PLAIN.turn_prefix)), True))
      if i + 1 < len(turns):
        out.append((self.chat.observation(obs), False))
    return out

  def use_tokenizer(self, tokenizer) -> None:
    """Renders episodes in `tokenizer`'s own chat template when it is a Hugging Face
    tokenizer (`chat.for_tokenizer`); the plain layout otherwise. The oracle solutions
    are re-rendered in that layout."""
    self.chat = chat_lib.for_tokenizer(self.system, tokenizer)
    self.splits = {s: [dataclasses.replace(p, solution="".join(
        t for t, _ in self._segments(p.id))) for p in ps] for s, ps in self.splits.items()}

  def train_problems(self, n: int, seed: int) -> list[Problem]:
    """`n` training problems drawn with replacement by `seed` (deterministic); each
    task at each of `levels` is one problem."""
    rng = random.Random(seed)
    return [rng.choice(self.splits["train"]) for _ in range(n)]

  def heldout_problems(self, n: Optional[int] = None,
                       split: str = "validation") -> list[Problem]:
    """The first `n` problems of 'validation' or 'test' (task by task, each at every one
    of `levels` in turn); SWE splits are small, so asking for more than a split holds
    gives the whole split (logged)."""
    if split not in ("validation", "test"):
      raise ValueError(f"held-out split must be 'validation' or 'test', got {split!r}")
    held = self.splits[split]
    if n is not None and n > len(held):
      log.info("SweDomain: %d %s tasks asked for, the split has %d", n, split, len(held))
    return list(held if n is None else held[:n])

  def format_prompt(self, problem: Problem) -> str:
    return self.chat.prompt(problem.prompt)

  @property
  def end_of_turn(self) -> str:
    """What closes a model turn cut at the token budget (`chat.ChatFormat.end_of_turn`)."""
    return self.chat.end_of_turn

  def format_observation(self, observation: str) -> str:
    return self.chat.observation(observation)

  def solution_segments(self, problem: Problem) -> list[tuple[str, bool]]:
    """The oracle episode as (text, trained) segments: model turns (trained; the warm
    start ends each with eos) and observations (masked)."""
    return self._segments(problem.id)

  def call_parses(self, turn: str) -> bool:
    """Whether a model turn's text holds one well-formed call of an offered tool
    (`tools.parse_call`; whether it would run, e.g. its path exists, is not checked):
    the warm start's `target_validity` check."""
    try:
      tools_lib.parse_call(turn, self.tool_config.tool_args())
    except tools_lib.CallError:
      return False
    return True

  # ------------------------------------------------------------------ episodes

  def start_episode(self, problem: Problem) -> SweEpisode:
    """A fresh checkout of the task's repository and an episode on it."""
    task = self.records[problem.id]
    dest = pathlib.Path(tempfile.mkdtemp(prefix="ep-", dir=self._work)) / "repo"
    repo_lib.checkout(self.task_set.trees[task.repo], task, dest, **self.checkout_options)
    workspace = tools_lib.Workspace(dest, self.suite, self.task_set.test_dirs[task.repo],
                                    self.tool_config)
    return SweEpisode(workspace, self.budget)

  def finish_episodes(self, problems: Sequence[Problem],
                      envs: Sequence[SweEpisode]) -> list[dict]:
    """Grades the episodes (in the sandbox) and removes their checkouts; reward parts."""
    if len(problems) != len(envs):
      raise ValueError(f"finish_episodes: {len(problems)} problems but {len(envs)} episodes")
    try:
      tasks = [self.records[p.id] for p in problems]
      grades = repo_lib.grade_many(
          tasks, [self.task_set.trees[t.repo] for t in tasks],
          [env.workspace.root for env in envs], self.suite,
          [self.task_set.test_dirs[t.repo] for t in tasks], skip_unchanged=True)
      out = []
      for grade, env in zip(grades, envs):
        parts = reward_parts(grade, env)
        parts["format"] = float(any(turn.ok for turn in env.turns))
        parts["submitted"] = float(env.stop == "submitted")
        out.append(parts)
      return out
    finally:
      for env in envs:
        shutil.rmtree(env.workspace.root.parent, ignore_errors=True)

  # ------------------------------------------------------------------ single-turn scoring

  def score_many(self, problems: Sequence[Problem],
                 completions: Sequence[str]) -> list[dict[str, float]]:
    """Replays each transcript's model turns (`split_turns`) in a fresh episode and
    grades it (the turns after the episode stopped are ignored)."""
    if len(problems) != len(completions):
      raise ValueError(f"score_many: {len(problems)} problems but {len(completions)} "
                       f"completions")
    envs = []
    try:
      for p, text in zip(problems, completions):
        env = self.start_episode(p)
        envs.append(env)
        for turn in self.chat.split_turns(text):
          if env.done:
            break
          env.step(turn)
    except BaseException:
      for env in envs:
        shutil.rmtree(env.workspace.root.parent, ignore_errors=True)
      raise
    return self.finish_episodes(problems, envs)

  def score(self, problem: Problem, completion: str) -> dict[str, float]:
    return self.score_many([problem], [completion])[0]

  def exploit_completions(self, problem: Problem) -> dict[str, str]:
    """Transcripts an exploit probe scores: the oracle's ('right'), a submit without a
    fix ('wrong'), and a test-file edit that renames the failing tests away before
    submitting ('exploit': test changes are not graded, so it must earn nothing)."""
    task = self.records[problem.id]
    submit = self.chat.turn(tools_lib.call_text("submit"))
    edits = []
    for test in task.FAIL_TO_PASS:
      path, _, name = test.partition("::")
      name = name.rsplit("::", 1)[-1].split("[", 1)[0]
      edits.append(self.chat.turn(tools_lib.call_text(
          "search_replace", path=path, search=f"def {name}(", replace=f"def _skipped_{name}(")))
    exploit = "".join(e + self.chat.observation("") for e in edits[:3]) + submit
    return {"right": problem.solution, "wrong": submit, "exploit": exploit}

  def test_report(self, episodes: Sequence) -> dict:
    """What the test split's episodes did (`diagnostics.episode_report`: call validity,
    stops, first-edit turn): 'all', and 'level<L>' per issue level when they span
    several. Reported only, like every test figure."""
    by_level: dict = {}
    for ep in episodes:
      by_level.setdefault(self.records[ep.task_id].level, []).append(ep)
    out = {"all": diagnostics_lib.episode_report(episodes)}
    if len(by_level) > 1:
      out.update({f"level{lv}": diagnostics_lib.episode_report(eps)
                  for lv, eps in sorted(by_level.items())})
    return out

  def probe_completions(self, problems: Sequence[Problem]) -> list[tuple]:
    """(problem, transcript, is_correct) probes for the evaluation pipeline's check."""
    return [case for p in problems for case in (
        (p, p.solution, True), (p, self.exploit_completions(p)["wrong"], False))]

  def close(self) -> None:
    if self._own_suite:
      self.suite.close()
    shutil.rmtree(self._work, ignore_errors=True)

  def __enter__(self) -> "SweDomain":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
