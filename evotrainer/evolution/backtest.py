"""Backtests of harness-side interventions on cached rollouts (docs/method.md, step 5).

A reward part, filter or estimator change (`is_harness_side`) can be judged before any
training: the incumbent's stored training steps are replayed under the harness before and
after the change (harness/replay.py). `harness_backtester` turns that replay into the
controller's `backtester`: a verdict with the criterion's numbers, or None when there is
nothing stored to replay.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping, Optional

from evotrainer.evolution.search_space import Intervention

HARNESS_GROUPS = ("reward", "filter", "harness", "estimator")
HARNESS_PREFIXES = ("RewardComposer.", "Harness.")


def is_harness_side(iv: Intervention, group: str) -> bool:
  """Reward parts, filters and the estimator: changes a backtest can replay."""
  return group in HARNESS_GROUPS or iv.binding.startswith(HARNESS_PREFIXES)


def harness_backtester(harness_builder: Callable[[Mapping], Any],
                       max_violation_rate: float = 0.01,
                       max_correct_cut_share: float = 0.05) -> Callable:
  """A `backtester` replaying the incumbent's stored steps (harness/replay.py).

  `harness_builder(values) -> Harness` builds a harness from {binding: value}. The
  criterion: BC ranking violations <= `max_violation_rate`, correct rows newly cut <=
  `max_correct_cut_share` of the correct rows, and no more groups die than are rescued.
  """

  def run(store_root: str, version: str, before: Mapping, after: Mapping,
          iv: Intervention) -> Optional[dict]:
    from evotrainer.harness.replay import backtest
    from evotrainer.rollouts.store import RolloutStore
    if not store_root or not os.path.isdir(store_root):
      return None
    store = RolloutStore(store_root)
    if not store.steps(version, "train"):
      return None
    t = backtest(store, harness_builder(after), harness_builder(before), version=version).totals
    vr = t["violation_rate"] if not math.isnan(t["violation_rate"]) else 0.0
    cut = t["correct_newly_cut"] / t["correct"] if t["correct"] else 0.0
    why = []
    if vr > max_violation_rate:
      why.append(f"BC ranking violations {vr:.4f} > {max_violation_rate}")
    if cut > max_correct_cut_share:
      why.append(f"correct rows newly cut {cut:.4f} > {max_correct_cut_share}")
    if t["newly_dead"] > t["rescued"]:
      why.append(f"{t['newly_dead']} groups die, {t['rescued']} rescued")
    keep = ("groups", "dead_before", "dead_after", "rescued", "newly_dead", "pairs",
            "violations", "correct", "cut", "correct_cut", "correct_newly_cut",
            "reward_before", "reward_after")
    return {"passed": not why, "why": "; ".join(why) or "criterion met",
            **{k: t[k] for k in keep}}

  return run


__all__ = ["HARNESS_GROUPS", "HARNESS_PREFIXES", "harness_backtester", "is_harness_side"]
