"""`SweTask`, the record of one task, and its SWE-bench-format JSONL.

A row carries SWE-bench's fields (`instance_id`, `repo`, `base`, `problem_statement`,
`FAIL_TO_PASS`, `PASS_TO_PASS`; `base` is SWE-bench's `base_commit`, which is also
accepted) plus ours: `version`, `difficulty`, `level` (the issue text's level; absent:
2, so rows written before levels existed read as today's tasks), `split` and `mutation`
(where the bug was put and the exact edit that undoes it; absent for tasks brought from
elsewhere).
`FAIL_TO_PASS`/`PASS_TO_PASS` may be JSON lists or, as SWE-bench ships them, strings
holding a JSON list. A bad row is reported as `file:line: field: what was expected`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable, Optional

REQUIRED = ("instance_id", "repo", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")
DIFFICULTIES = ("easy", "medium", "hard")
# Issue levels: what the issue text says of the bug's place (`synth.at_level`).
# 0: the file, the function and the faulty line; 1: the file and the function; 2: only
# the failing behaviour (the text synthesis writes).
LEVELS = (0, 1, 2)
MUTATION_FIELDS = ("file", "function", "kind", "line", "search", "replace")


class TaskFormatError(ValueError):
  """A JSONL row that is not a task; the message starts with `file:line:`."""


@dataclasses.dataclass(frozen=True)
class Mutation:
  """Where the bug is and how to undo it (known to synthesis and the oracle only).

  Attributes:
    file: the mutated file, relative to the repository root.
    function: qualified name of the mutated function (the splits keep these apart).
    kind: the mutation kind (see `mutate.KINDS`).
    line: 1-based line of the site in the base file.
    search: text found exactly once in the pristine file; `replace` in its place gives
      the mutant. Undoing the bug is the inverse edit (search `replace`, put `search`).
    replace: see `search`.
  """
  file: str
  function: str
  kind: str
  line: int
  search: str
  replace: str


@dataclasses.dataclass(frozen=True)
class SweTask:
  """One repository task: a repository with a bug, and the tests that judge a fix.

  Attributes:
    instance_id: unique name, e.g. "xmltodict-1.0.4-1a2b3c4d".
    repo: the source, "name==version" for synthesized tasks.
    base: the commit the episode's repository is at (its only commit).
    problem_statement: the issue text shown to the policy.
    FAIL_TO_PASS: tests failing on the bug, to pass after the fix.
    PASS_TO_PASS: tests passing before, to keep passing.
    version: the source's version.
    difficulty: "easy" (one-token bug, the file named), "medium" (one-token bug),
      "hard" (a structural bug: a removed statement, an inverted condition, ...).
    split: "train", "validation", "test" or "" (not assigned).
    mutation: see `Mutation`; None for tasks not synthesized here.
    level: the issue text's level (`LEVELS`): synthesis writes level 2, and
      `synth.at_level` derives the others from it and the mutation; the same bug, the
      same `instance_id` at every level (`level_id` tells the levels apart).
  """
  instance_id: str
  repo: str
  base: str
  problem_statement: str
  FAIL_TO_PASS: tuple[str, ...]
  PASS_TO_PASS: tuple[str, ...]
  version: str = ""
  difficulty: str = "medium"
  split: str = ""
  mutation: Optional[Mutation] = None
  level: int = 2

  @property
  def level_id(self) -> str:
    """The task's id at its level: `instance_id` at level 2 (the ids of the tasks
    synthesis writes), `instance_id` + "-L0" or "-L1" below."""
    return self.instance_id if self.level == 2 else f"{self.instance_id}-L{self.level}"

  def to_row(self) -> dict:
    row = dataclasses.asdict(self)
    row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = list(self.FAIL_TO_PASS), list(self.PASS_TO_PASS)
    if self.mutation is None:
      del row["mutation"]
    return row


def _tests(value, where: str, field: str) -> tuple[str, ...]:
  if isinstance(value, str):  # SWE-bench ships these as JSON inside a string
    try:
      value = json.loads(value)
    except ValueError:
      raise TaskFormatError(f"{where}: {field}: a string that is not a JSON list") from None
  if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
    raise TaskFormatError(f"{where}: {field}: expected a list of test ids (strings)")
  return tuple(value)


def from_row(row: dict, where: str = "<row>") -> SweTask:
  """A task from one decoded row; errors name `where` and the field."""
  if not isinstance(row, dict):
    raise TaskFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
  row = dict(row)
  if "base" not in row and "base_commit" in row:
    row["base"] = row.pop("base_commit")
  missing = [k for k in REQUIRED + ("base",) if k not in row]
  if missing:
    raise TaskFormatError(f"{where}: missing field(s) {', '.join(missing)}")
  for field in ("instance_id", "repo", "base", "problem_statement"):
    if not isinstance(row[field], str) or (field != "base" and not row[field]):
      raise TaskFormatError(f"{where}: {field}: expected a non-empty string")
  f2p = _tests(row["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
  p2p = _tests(row["PASS_TO_PASS"], where, "PASS_TO_PASS")
  if not f2p:
    raise TaskFormatError(f"{where}: FAIL_TO_PASS: a task needs at least one test")
  if set(f2p) & set(p2p):
    raise TaskFormatError(f"{where}: a test is in both FAIL_TO_PASS and PASS_TO_PASS: "
                          f"{sorted(set(f2p) & set(p2p))[:3]}")
  difficulty = row.get("difficulty", "medium")
  if difficulty not in DIFFICULTIES:
    raise TaskFormatError(f"{where}: difficulty: expected one of {DIFFICULTIES}, "
                          f"got {difficulty!r}")
  mutation = row.get("mutation")
  if mutation is not None:
    if not isinstance(mutation, dict) or any(k not in mutation for k in MUTATION_FIELDS):
      raise TaskFormatError(f"{where}: mutation: expected an object with "
                            f"{', '.join(MUTATION_FIELDS)}")
    mutation = Mutation(**{k: mutation[k] for k in MUTATION_FIELDS})
  level = row.get("level", 2)
  if type(level) is not int or level not in LEVELS:
    raise TaskFormatError(f"{where}: level: expected one of {LEVELS}, got {level!r}")
  return SweTask(row["instance_id"], row["repo"], row["base"], row["problem_statement"],
                 f2p, p2p, str(row.get("version", "")), difficulty,
                 str(row.get("split", "")), mutation, level)


def read_jsonl(path: os.PathLike | str) -> list[SweTask]:
  """Tasks from a JSONL file (blank lines skipped); a task twice (the same `level_id`)
  is an error."""
  tasks, seen = [], {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      try:
        row = json.loads(line)
      except ValueError as e:
        raise TaskFormatError(f"{where}: not JSON ({e})") from None
      task = from_row(row, where)
      if task.level_id in seen:
        raise TaskFormatError(f"{where}: instance_id {task.instance_id!r} at level "
                              f"{task.level} already on line {seen[task.level_id]}")
      seen[task.level_id] = number
      tasks.append(task)
  return tasks


def write_jsonl(tasks: Iterable[SweTask], path: os.PathLike | str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for task in tasks:
      f.write(json.dumps(task.to_row(), sort_keys=True) + "\n")
