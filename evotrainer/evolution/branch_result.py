"""The record one branch's training hands back to the controller: `branch_result.json`.

Written by the branch process (modes/branch.py, `run.mode='branch'`) through `to_json`, read by
the controller's trainers (trainer.py, pod.py) through `read`. One definition on both
sides: a key the reader does not know, or a required key it lacks, is an error naming
the file and the keys, never silently dropped. `steps` and `canary` may be absent (files
of branches trained before they existed).

Host side only (no JAX): the controller imports it, and `evotrainer/types.py` imports JAX.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

FILE_NAME = "branch_result.json"


class BranchResultError(ValueError):
  """A branch_result.json that is not one; the message names the file and the keys."""


@dataclasses.dataclass(frozen=True)
class BranchResult:
  """What one branch training returns to the controller."""

  version: str
  checkpoint: str  # directory of the saved model (parent of the next branches)
  final: dict  # held-out figures after training, e.g. {'avg8', 'pass8', 'greedy'}
  initial: dict  # the same figures before training (the parent's, on this eval)
  per_problem: dict  # {task_id: mean correctness over the k samples} (held-out)
  series: dict  # {'correct': [per step], 'reward': [per step]}: BC and the proxy
  rollouts: str  # RolloutStore root holding the branch's episodes
  steps: int = 0
  workdir: str = ""  # the directory it was read from; not stored in the file
  canary: dict = dataclasses.field(default_factory=dict)  # {canary id: 0/1}, greedy

  def to_json(self) -> dict:
    """The file's content (every field but `workdir`), in the order the file keeps."""
    return {"version": self.version, "steps": self.steps, "initial": self.initial,
            "final": self.final, "checkpoint": self.checkpoint, "rollouts": self.rollouts,
            "per_problem": self.per_problem, "series": self.series, "canary": self.canary}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], workdir: str = "",
                source: str = FILE_NAME) -> "BranchResult":
    """The result in a branch's branch_result.json (`data`, read from `source`), read
    from its `workdir`. Its paths (the branch's `model` and `rollouts`) are absolute
    where it trained; one that is gone is taken from `workdir` (a gs:// run resumed on
    another host: another mirror).

    Raises:
      BranchResultError: `data` is not an object, has a key that is not a stored field,
        or lacks a required one.
    """
    if not isinstance(data, Mapping):
      raise BranchResultError(f"{source}: expected a JSON object, got "
                              f"{type(data).__name__}")
    stored = [f for f in dataclasses.fields(cls) if f.name != "workdir"]
    unknown = sorted(set(data) - {f.name for f in stored})
    missing = [f.name for f in stored
               if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
      raise BranchResultError(
          f"{source}: " + "; ".join(
              ([f"unknown keys {unknown}"] if unknown else [])
              + ([f"missing keys {missing}"] if missing else []))
          + f" (a branch result has {[f.name for f in stored]})")
    fields = dict(data)
    for k in ("checkpoint", "rollouts"):
      moved = workdir and fields.get(k) and os.path.join(workdir, os.path.basename(fields[k]))
      if moved and not os.path.exists(fields[k]) and os.path.exists(moved):
        fields[k] = moved
    return cls(**fields, workdir=workdir)

  @classmethod
  def read(cls, workdir: str | os.PathLike) -> "BranchResult":
    """The branch_result.json of a branch's `workdir` (see `from_json`)."""
    path = pathlib.Path(workdir) / FILE_NAME
    try:
      data = json.loads(path.read_text())
    except ValueError as e:
      raise BranchResultError(f"{path}: not JSON ({e})") from None
    return cls.from_json(data, os.fspath(workdir), str(path))


__all__ = ["BranchResult", "BranchResultError", "FILE_NAME"]
