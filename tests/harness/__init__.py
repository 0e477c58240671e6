"""Harness tests: crafted episodes whose right answers are computed by hand."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from evotrainer.types import Episode


def make_episode(row: int = 0, group: int = 0, completion: str = "",
                 reward_parts: Optional[dict] = None, ids: Optional[Sequence[int]] = None,
                 length: Optional[int] = None, truncated: bool = False,
                 info: Optional[dict] = None, reward: float = 0.0, step: int = 0,
                 answer: str = "1") -> Episode:
  """One episode. Token ids: `ids`, else `length` distinct ids (0, 1, ...), else none."""
  if ids is None and length is not None:
    ids = np.arange(length)
  return Episode(
      episode_id=f"v0/{step}/{row}", group_id=group, task_id=f"t{group}", prompt="q",
      completion=completion, answer=answer, reward_parts=dict(reward_parts or {}),
      reward=reward, info=dict(info or {}), version="v0", step=step,
      completion_ids=None if ids is None else np.asarray(ids, np.int32),
      truncated=truncated)


def make_groups(rewards: Sequence[Sequence[float]], part: str = "correct", step: int = 0,
                length: int = 4) -> list:
  """Contiguous groups: `rewards[g][j]` is task part `part` of row j of group g."""
  out = []
  for g, rs in enumerate(rewards):
    for r in rs:
      out.append(make_episode(row=len(out), group=g, reward_parts={part: float(r)},
                              length=length, step=step))
  return out
