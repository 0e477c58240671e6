"""Task synthesis: from a pristine source tree and its own tests to verified bug tasks.

  1. Run the suite `stability_runs` times (3) on the base; keep the tests that pass every
     time, and refuse a suite slower than `suite_limit_s`.
  2. Enumerate mutation sites in the library's code (`mutate.sites`), shuffle them with
     the seed, and run the suite on each mutant, in parallel on the sandbox cells.
  3. FAIL_TO_PASS = stable tests that fail on the mutant; PASS_TO_PASS = the rest of the
     stable tests. Keep the mutant when 1 <= |F2P| <= `max_f2p` (a mutant no test notices
     is uncovered code or an equivalent mutant; one that breaks everything is no puzzle).
  4. Write the issue from the failing tests (names and crash messages), with the mutated
     file and function scrubbed out; only the easy difficulty names the file. That text
     is level 2 of the issue ladder.

Issue levels (`at_level`, `records.LEVELS`), derived from a level-2 task and its
mutation, so any cached task set has them all: level 1 adds the function and the file
it is in; level 0 adds the faulty line too, its number and its text in the bugged file.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import pathlib
import random
import re
import shutil
import time
from typing import Sequence

from evotrainer.tasks.swe import mutate, pyedit, repo as repo_lib, runner as runner_lib
from evotrainer.tasks.swe.records import LEVELS, Mutation, SweTask
from evotrainer.tasks.swe.sources import Source


class SynthesisError(RuntimeError):
  """A source that cannot yield tasks (no stable tests, a suite too slow, ...)."""


@dataclasses.dataclass(frozen=True)
class SynthConfig:
  """Knobs of synthesis.

  Attributes:
    max_tasks: stop once this many tasks are kept.
    max_candidates: mutants tried at most (each costs one suite run).
    max_f2p: the most FAIL_TO_PASS tests a kept task may have (k).
    per_function: the most tasks kept per mutated function.
    stability_runs: base runs a test must pass in all of to be used.
    suite_limit_s: a base suite slower than this is refused.
    kinds: mutation kinds tried (see `mutate.KINDS`).
    seed: shuffles the sites; the same seed gives the same tasks.
    listed_failures: failing tests quoted in the issue text (the rest are counted).
  """
  max_tasks: int = 20
  max_candidates: int = 60
  max_f2p: int = 10
  per_function: int = 2
  stability_runs: int = 3
  suite_limit_s: float = 10.0
  kinds: tuple[str, ...] = mutate.KINDS
  seed: int = 0
  listed_failures: int = 5


@dataclasses.dataclass
class SynthStats:
  """What one source's synthesis did (the bench reports it)."""
  repo: str
  stable_tests: int = 0
  flaky_tests: int = 0
  base_suite_s: float = 0.0
  sites: int = 0
  tried: int = 0
  kept: int = 0
  rejected: dict = dataclasses.field(default_factory=dict)
  build_s: float = 0.0


def package_files(tree: pathlib.Path, source: Source) -> list[str]:
  """Relative paths of the library's mutable Python files (tests excluded)."""
  found = []
  for entry in source.package:
    path = tree / entry
    paths = [path] if path.is_file() else sorted(path.rglob("*.py"))
    for p in paths:
      rel = p.relative_to(tree).as_posix()
      if p.suffix == ".py" and not repo_lib.is_test_path(rel, source.tests):
        found.append(rel)
  if not found:
    raise SynthesisError(f"{source.repo}: no Python files under {source.package}")
  return found


def stable_tests(suite: runner_lib.SuiteRunner, files: dict[str, str], source: Source,
                 runs: int) -> tuple[set[str], set[str], float]:
  """(tests passing in every run, tests passing in some runs only, slowest run's s)."""
  results = suite.run_many([(files, list(source.tests))] * runs)
  passed = [r.passed() for r in results]
  stable = set.intersection(*passed)
  return stable, set.union(*passed) - stable, max(r.wall_s for r in results)


def fix_edit(base: str, mutant: str) -> tuple[str, str, int]:
  """(search, replace, line): a base snippet unique in `base` whose replacement gives
  `mutant`, with its replaced snippet unique in `mutant` (so the inverse edit applies)."""
  a, b = base.splitlines(keepends=True), mutant.splitlines(keepends=True)
  ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
         if op[0] != "equal"]
  i1, i2, j1, j2 = ops[0][1], ops[-1][2], ops[0][3], ops[-1][4]
  for context in range(0, 40):
    lo_a, lo_b = max(i1 - context, 0), max(j1 - context, 0)
    hi_a, hi_b = i2 + context, j2 + context
    search, replace = "".join(a[lo_a:hi_a]), "".join(b[lo_b:hi_b])
    if search and replace and base.count(search) == 1 and mutant.count(replace) == 1:
      return search, replace, i1 + 1
  raise SynthesisError("no unique snippet around the mutation")


def problem_statement(source: Source, f2p: Sequence[str], messages: dict[str, str],
                      mutation: Mutation, difficulty: str, listed: int) -> str:
  """The issue text: the failing tests and their messages, never the bug's location
  (the file and function names are scrubbed from messages); easy tasks name the file."""
  short = mutation.function.rsplit(".", 1)[-1]
  scrub = [re.escape(mutation.file), re.escape(pathlib.PurePosixPath(mutation.file).name),
           r"\b" + re.escape(short) + r"\b"]
  lines = [f"Some tests of {source.name} {source.version} fail.", "", "Failing tests:"]
  for test in list(f2p)[:listed]:
    message = " ".join(messages.get(test, "").split())[:300]
    for pattern in scrub:
      message = re.sub(pattern, "<...>", message)
    lines.append(f"- {test}" + (f": {message}" if message else ""))
  if len(f2p) > listed:
    lines.append(f"- ... and {len(f2p) - listed} more")
  lines += ["", "Make these tests pass without breaking the other tests. Do not edit the "
            "tests."]
  if difficulty == "easy":
    lines.append(_file_hint(mutation))
  return "\n".join(lines)


def _file_hint(mutation: Mutation) -> str:
  """The sentence the easy difficulty's level-2 issue ends with."""
  return f"The bug is in `{mutation.file}`."


def faulty_line(mutation: Mutation) -> tuple[int, str]:
  """(number, text) of the bug's line in the bugged file: `mutation.line` and the first
  line of `mutation.replace` that differs from `search` (the snippets share the lines
  before the change; the lines before the bug are the same in both files, so its number
  is too). For a removed statement that is the line now in its place; "" where the
  bugged file ends there (a removed last statement)."""
  search = mutation.search.splitlines()
  replace = mutation.replace.splitlines()
  same = 0
  while same < min(len(search), len(replace)) and search[same] == replace[same]:
    same += 1
  return mutation.line, replace[same] if same < len(replace) else ""


def level_statement(statement: str, mutation: Mutation, level: int) -> str:
  """The issue text at `level` (`records.LEVELS`) from the level-2 `statement`: level 1
  names the function and its file (in place of the easy difficulty's file sentence),
  level 0 also the faulty line (`faulty_line`)."""
  if level not in LEVELS:
    raise ValueError(f"issue level {level!r}: expected one of {LEVELS}")
  if level == 2:
    return statement
  lines = statement.split("\n")
  if lines[-1] == _file_hint(mutation):
    lines.pop()
  lines.append(f"The bug is in the function `{mutation.function}` of `{mutation.file}`.")
  if level == 0:
    number, text = faulty_line(mutation)
    lines.append(f"The faulty line is line {number}: `{text.strip()}`" if text.strip() else
                 f"The faulty line is line {number}, at the end of the file.")
  return "\n".join(lines)


def at_level(task: SweTask, level: int) -> SweTask:
  """`task` (a level-2 record) with its issue text at `level`; the same bug, split and
  `instance_id`.

  Raises:
    ValueError: an unknown level, a task not at level 2, or level < 2 for a task with no
      mutation (its bug's place is unknown).
  """
  if level == task.level:
    return task
  if task.level != 2:
    raise ValueError(f"{task.instance_id}: levels are derived from the level-2 task, not "
                     f"from level {task.level}")
  if task.mutation is None and level in LEVELS:
    raise ValueError(f"{task.instance_id}: no mutation known, so no level below 2")
  return dataclasses.replace(task, level=level, problem_statement=level_statement(
      task.problem_statement, task.mutation, level))


def with_code(task: SweTask, bugged: str) -> SweTask:
  """`task` (level 0 or 1: the issue names the function) with the named function's
  current source appended to its issue; `bugged` is the text of the task's mutated file
  (`repo.mutant_files`). A level-2 task is returned as it is (its issue names no
  function).

  Raises:
    ValueError: the function is not found in `bugged` around the bug's line.
  """
  if task.level == 2:
    return task
  m = task.mutation
  try:
    code = pyedit.named_source(bugged, m.function, m.line)
  except ValueError as e:
    raise ValueError(f"{task.instance_id}: {e} of {m.file}") from None
  return dataclasses.replace(task, problem_statement=(
      f"{task.problem_statement}\nThe function now reads:\n```python\n{code}\n```"))


def _difficulty(kind: str, instance_id: str) -> str:
  if kind not in mutate.ONE_TOKEN:
    return "hard"
  # One-token bugs: half are easy (the file is named), decided by the id (stable).
  return "easy" if int(hashlib.sha1(instance_id.encode()).hexdigest(), 16) % 2 else "medium"


def synthesize(source: Source, tree: str | pathlib.Path, suite: runner_lib.SuiteRunner,
               config: SynthConfig = SynthConfig()) -> tuple[list[SweTask], SynthStats]:
  """Tasks from one pristine source tree; see the module docstring for the steps."""
  start = time.monotonic()
  tree = pathlib.Path(tree)
  stats = SynthStats(source.repo)
  files = runner_lib.repo_files(tree)
  files.pop(repo_lib.MARKER, None)
  stable, flaky, base_s = stable_tests(suite, files, source, config.stability_runs)
  stats.stable_tests, stats.flaky_tests, stats.base_suite_s = len(stable), len(flaky), base_s
  if not stable:
    raise SynthesisError(f"{source.repo}: no test passes on the base")
  if base_s > config.suite_limit_s:
    raise SynthesisError(f"{source.repo}: the suite takes {base_s:.1f} s, over "
                         f"suite_limit_s={config.suite_limit_s}")
  candidates = [(path, site) for path in package_files(tree, source)
                for site in mutate.sites(files[path]) if site.kind in config.kinds]
  stats.sites = len(candidates)
  random.Random(config.seed).shuffle(candidates)
  timeout = max(10.0, 5 * base_s)
  tasks: list[SweTask] = []
  per_function: dict[tuple[str, str], int] = {}
  index = 0
  while (index < len(candidates) and len(tasks) < config.max_tasks and
         stats.tried < config.max_candidates):
    meta, index = _mutants(candidates, index, files, config, stats, per_function,
                           suite.pool.size)
    if not meta:
      continue
    stats.tried += len(meta)
    jobs = [({**files, path: mutant}, list(source.tests)) for path, _, mutant in meta]
    for (path, site, mutant), result in zip(meta, suite.run_many(jobs, timeout)):
      f2p = _failing(stable, result, config, stats.rejected)
      if (f2p is None or len(tasks) >= config.max_tasks or
          per_function.get((path, site.function), 0) >= config.per_function):
        continue
      task = _task(source, files[path], path, site, mutant, f2p, stable, result.messages,
                   config, stats.rejected)
      if task is not None:
        tasks.append(task)
        per_function[(path, site.function)] = per_function.get((path, site.function), 0) + 1
  stats.kept = len(tasks)
  stats.build_s = time.monotonic() - start
  return tasks, stats


def _mutants(candidates: list, index: int, files: dict, config: SynthConfig,
             stats: SynthStats, per_function: dict, batch: int) -> tuple[list, int]:
  """([(path, site, mutant)], the next index): up to `batch` mutants from `candidates`
  from `index` on, within max_candidates, skipping functions already at per_function and
  sites whose mutation changes nothing (counted `no_op`)."""
  meta = []
  while (index < len(candidates) and len(meta) < batch and
         stats.tried + len(meta) < config.max_candidates):
    path, site = candidates[index]
    index += 1
    if per_function.get((path, site.function), 0) >= config.per_function:
      continue
    mutant = mutate.mutate(files[path], site)
    if mutant is None:
      stats.rejected["no_op"] = stats.rejected.get("no_op", 0) + 1
      continue
    meta.append((path, site, mutant))
  return meta, index


def _failing(stable: set, result, config: SynthConfig, rejected: dict) -> list | None:
  """The stable tests a mutant fails (sorted), or None when none fails or more than
  max_f2p do (each counted in `rejected`)."""
  f2p = sorted(stable - result.passed())
  reason = ("no_failing_test" if not f2p else
            "too_many_failing" if len(f2p) > config.max_f2p else None)
  if reason:
    rejected[reason] = rejected.get(reason, 0) + 1
    return None
  return f2p


def _task(source: Source, text: str, path: str, site, mutant: str, f2p: list, stable: set,
          messages, config: SynthConfig, rejected: dict) -> SweTask | None:
  """The task of one mutant of `path` (pristine `text`) that fails `f2p`; None when its
  fix is no unique edit (counted `no_unique_edit`)."""
  try:
    search, replace, line = fix_edit(text, mutant)
  except SynthesisError:
    rejected["no_unique_edit"] = rejected.get("no_unique_edit", 0) + 1
    return None
  digest = hashlib.sha1(f"{source.repo}|{path}|{search}|{replace}".encode()).hexdigest()
  instance_id = f"{source.name}-{source.version}-{digest[:10]}"
  mutation = Mutation(path, site.function, site.kind, line, search, replace)
  difficulty = _difficulty(site.kind, instance_id)
  return SweTask(instance_id, source.repo, "", problem_statement(
      source, f2p, messages, mutation, difficulty, config.listed_failures),
      tuple(f2p), tuple(sorted(stable - set(f2p))), source.version, difficulty, "",
      mutation)


def with_base(task: SweTask, tree: str | pathlib.Path, scratch: str | pathlib.Path) -> SweTask:
  """The task with `base` set to the commit id of its checkout (made once in `scratch`)."""
  dest = pathlib.Path(scratch) / task.instance_id
  commit = repo_lib.checkout(tree, task, dest)
  shutil.rmtree(dest, ignore_errors=True)
  return dataclasses.replace(task, base=commit)
