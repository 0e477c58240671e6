"""The evolution's ledger I/O of trained versions: results, values, episodes, evidence.

A trained version's `BranchResult` is stored in the ledger (its metrics' 'result'), with
the figures the table and the verdicts read (proxy reward, steps, held-out Avg@8). Every
part of the controller reads versions back through `Results`: the stored result, the
version's {binding: value} (the root's values with its lineage's changes), its stored
training episodes, and the `Evidence` validators judge it on. The harness components
(and so JAX) are imported lazily; this module itself does not import them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping, Optional

from evotrainer.evolution.ledger import ROOT, Ledger
from evotrainer.evolution.search_space import canonical, format_value
from evotrainer.evolution.branch_result import BranchResult


def avg8(r: BranchResult) -> float:
  """The held-out score of a result: its 'avg8', else the mean per-problem score."""
  if "avg8" in r.final:
    return float(r.final["avg8"])
  vals = list(r.per_problem.values())
  return float(sum(vals) / len(vals)) if vals else math.nan


def proxy_reward(r: BranchResult) -> Optional[float]:
  """The last training reward of a result (the proxy), else its final 'reward'."""
  rew = r.series.get("reward") or []
  return float(rew[-1]) if rew else r.final.get("reward")


class Results:
  """Reads and writes the trained versions of `ledger`.

  Args:
    ledger: the run's ledger.
    strict_verify: `(gold, completion) -> bool`, the domain's strict verifier, given to
      validators in the evidence; None: `strict_verifier_agreement` is not applicable.
  """

  def __init__(self, ledger: Ledger,
               strict_verify: Optional[Callable[[str, str], bool]] = None):
    self.ledger, self.strict_verify = ledger, strict_verify

  def store(self, vid: str, r: BranchResult, attempt: Optional[str] = None) -> None:
    """Stores `vid`'s training result (and finishes its `attempt`, if any)."""
    with self.ledger.transaction():
      self.ledger.update_version(
          vid, checkpoint=r.checkpoint or None,
          metrics={"proxy_reward": proxy_reward(r), "steps": r.steps,
                   "result": dataclasses.asdict(r)},
          heldout={**{k: v for k, v in r.final.items() if isinstance(v, (int, float))},
                   "avg8": avg8(r)})
      if attempt:
        self.ledger.finish_attempt(attempt, "done")

  def result(self, vid: str) -> Optional[BranchResult]:
    """The stored BranchResult of a version (None when it never finished training)."""
    data = self.ledger.version(vid).metrics.get("result")
    return None if data is None else BranchResult(**data)

  def values(self, vid: str) -> dict:
    """{binding: value} of a version: the root's values with the lineage's changes."""
    out: dict = {}
    for v in reversed(self.ledger.lineage(vid)):
      out.update(v.bindings)
    return out

  def gin(self, values: Mapping) -> list:
    """The gin bindings of `values` that differ from what the command line sets: the
    root's values, with the ones adopted from skills (`controller/adopted`) taken back."""
    adopted = self.ledger.get_meta("controller/adopted") or {}
    root = {**self.ledger.version(ROOT).bindings, **adopted.get("base", {})}
    return [f"{b} = {format_value(v)}" for b, v in values.items()
            if b not in root or canonical(root[b]) != canonical(v)]

  def episodes(self, vid: str, r: Optional[BranchResult],
               split: Optional[str] = None) -> list:
    """`vid`'s stored episodes (of `split`, e.g. 'train') in `r`'s rollout store."""
    if r is None or not r.rollouts or not os.path.isdir(r.rollouts):
      return []
    from evotrainer.rollouts.store import RolloutStore
    store = RolloutStore(r.rollouts)
    if vid not in store.versions():
      return []
    return store.read(version=vid, split=split)

  def evidence(self, vid: str, parent: Optional[Any] = None):
    """The `Evidence` validators judge version `vid` on (`parent`: its parent's)."""
    from evotrainer.harness.base import Evidence
    r = self.result(vid)
    if r is None:
      return Evidence(episodes=[], series={}, heldout={}, parent=parent)
    return Evidence(episodes=self.episodes(vid, r), series=dict(r.series),
                    heldout={**r.final, "avg8": avg8(r), "canary_correct": r.canary},
                    parent=parent, strict_verify=self.strict_verify)


__all__ = ["Results", "avg8", "proxy_reward"]
