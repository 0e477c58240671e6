"""Backtests of harness-side interventions on cached rollouts (docs/method.md, step 5).

A reward part, filter or estimator change (`is_harness_side`) can be judged before any
training: the incumbent's stored training steps are replayed under the harness before and
after the change (harness/replay.py). `harness_backtester` turns that replay into the
controller's `backtester`: a verdict with the criterion's numbers, or None when there is
nothing stored to replay. `on_target` then fails a change that is harmless but misses
what it is aimed at: a reward part proposed for dead groups that rescues too few of them
on the stored steps would train a branch that differs from its parent by nothing the
finding asked for.
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
                       max_correct_cut_share: float = 0.05,
                       drop_inert: bool = True) -> Callable:
  """A `backtester` replaying the incumbent's stored steps (harness/replay.py).

  `harness_builder(values) -> Harness` builds a harness from {binding: value}. The
  criterion: BC ranking violations <= `max_violation_rate`, correct rows newly cut <=
  `max_correct_cut_share` of the correct rows, no more groups die than are rescued, and
  (`drop_inert`) the change alters the training signal of at least one stored row
  (`changed`): an inert one would train its branch exactly like its parent.
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
    if drop_inert and t["changed"] == 0:
      why.append(f"inert on the {t['steps']} stored steps: every row would train with the "
                 f"keep and advantage it had")
    keep = ("groups", "dead_before", "dead_after", "rescued", "newly_dead", "pairs",
            "violations", "correct", "cut", "correct_cut", "correct_newly_cut",
            "changed", "reward_before", "reward_after")
    return {"passed": not why, "why": "; ".join(why) or "criterion met",
            **{k: t[k] for k in keep}}

  return run


# A reward-part change aimed at dead groups (a `dead_group_ratio` finding) must rescue at
# least this share of the dead groups on the incumbent's stored steps (the seed skill
# dead_groups_add_partial_credit's criterion: "at least a quarter").
MIN_RESCUED_SHARE = 0.25


def on_target(bt: Optional[dict], finding: Optional[str], iv: Intervention) -> Optional[dict]:
  """`bt`, failed when the change is aimed at dead groups (`finding` 'dead_group_ratio',
  a `RewardComposer.parts` change) and rescues fewer than MIN_RESCUED_SHARE of the dead
  groups the backtest replayed; unchanged otherwise (None stays None: not backtested)."""
  if (bt is None or finding != "dead_group_ratio" or iv.binding != "RewardComposer.parts"
      or not bt.get("dead_before") or "rescued" not in bt):
    return bt
  need = math.ceil(MIN_RESCUED_SHARE * bt["dead_before"])
  if bt["rescued"] >= need:
    return bt
  miss = (f"aimed at dead groups, it rescues {bt['rescued']} of the {bt['dead_before']} "
          f"stored (at least {need})")
  why = miss if bt.get("passed", True) else f"{bt.get('why', '')}; {miss}"
  return {**bt, "passed": False, "why": why}


__all__ = ["HARNESS_GROUPS", "HARNESS_PREFIXES", "MIN_RESCUED_SHARE", "harness_backtester",
           "is_harness_side", "on_target"]
