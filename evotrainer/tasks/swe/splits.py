"""Train / validation / test splits that share no repository version and no function.

Tasks are grouped, and a group goes whole to one split: `group_by="repo"` groups by
repository version (so also by function, which lives in one version); `"function"`
groups by (repository version, file, mutated function), for when there are too few
versions to spread. Groups are taken in a seeded hash order and each goes to the split
furthest below its target share of tasks, so the result is deterministic and a task set
grown later keeps its old groups where they were only as long as the order allows.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

from evotrainer.tasks.swe.records import SweTask

SPLITS = ("train", "validation", "test")


def group_key(task: SweTask, group_by: str) -> str:
  if group_by == "repo":
    return task.repo
  if group_by == "function":
    if task.mutation is None:
      return task.instance_id
    return f"{task.repo}|{task.mutation.file}|{task.mutation.function}"
  raise ValueError(f"group_by must be 'repo' or 'function', got {group_by!r}")


def assign_splits(tasks: Sequence[SweTask], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                  group_by: str = "function", seed: int = 0) -> list[SweTask]:
  """The tasks with `split` set; no group (see module docstring) spans two splits."""
  if len(fractions) != len(SPLITS) or abs(sum(fractions) - 1) > 1e-6 or min(fractions) < 0:
    raise ValueError(f"fractions must be 3 non-negative shares summing to 1, got {fractions}")
  groups: dict[str, list[int]] = {}
  for i, task in enumerate(tasks):
    groups.setdefault(group_key(task, group_by), []).append(i)
  order = sorted(groups, key=lambda k: hashlib.sha1(f"{seed}|{k}".encode()).hexdigest())
  counts = [0] * len(SPLITS)
  split_of: dict[int, str] = {}
  total = len(tasks)
  for key in order:
    members = groups[key]
    deficit = [fractions[s] * total - counts[s] for s in range(len(SPLITS))]
    s = max(range(len(SPLITS)), key=lambda s: (deficit[s], -s))
    counts[s] += len(members)
    for i in members:
      split_of[i] = SPLITS[s]
  return [dataclasses.replace(t, split=split_of[i]) for i, t in enumerate(tasks)]
