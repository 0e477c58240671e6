"""The plan step of the evolution loop: diagnose, propose, backtest, rank (`Proposal`).

  diagnose    the incumbent: active diagnostics over its stored training episodes (or its
              training series when no rollouts are stored) -> findings
  propose     hypotheses ("change X, expect Y because Z"), see proposers.py; never a
              change already tried from the incumbent, nor one refuted on an ancestor
              whose value the incumbent still holds (`excluded`: negative evidence)
  rank        the proxy-chasing proposer orders hypotheses by the reward gain their
              backtest predicts (`rank_by_proxy`)
  backtest    harness-side interventions (reward parts, filters, estimator) are replayed
              on the incumbent's cached rollouts (the `backtester`, backtest.py);
              failures are 'dropped' (a decision in the ledger), the rest become the
              generation's branches (`select`)
The controller calls these between its human gates and stores the plan it makes.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Mapping, Optional, Sequence

from evotrainer.evolution.backtest import is_harness_side, on_target
from evotrainer.evolution.ledger import VersionRecord
from evotrainer.evolution.promotion import REFUTED
from evotrainer.evolution.proposers import Hypothesis, propose
from evotrainer.evolution.results import Results, avg8
from evotrainer.evolution.branch_result import BranchResult


class Proposal:
  """Proposes a generation's branches from the incumbent of `ledger`.

  Args:
    ledger: the run's ledger.
    space: the search space (the action boundary).
    skills: the run's skill library (None: no skills).
    results: the versions' stored results (results.py).
    backtester: `(store_root, version, values_before, values_after, iv) -> dict | None`
      with 'passed' (and 'why'); None: no backtests.
    proposer: 'skills' | 'recipe' | 'random' | 'proxy' (proposers.py).
    branches: K, branches per generation.
    seed: the run's seed (the proposal order derives from it).
  """

  def __init__(self, ledger: Any, space: Any, skills: Any, results: Results,
               backtester: Optional[Callable], *, proposer: str, branches: int, seed: int):
    self.ledger, self.space, self.skills, self.results = ledger, space, skills, results
    self.backtester, self.proposer, self.k, self.seed = backtester, proposer, branches, seed

  # ---------------------------------------------------------------- diagnose

  def diagnose(self, inc: VersionRecord, r: BranchResult, diagnostics: Sequence) -> list:
    """Findings on the incumbent `inc` (result `r`) of the active `diagnostics`, its
    carried `unstable_incumbent` finding, and the series-level proxy/true gap detector
    (none when the proposer is not 'skills')."""
    from evotrainer.harness.diagnostics import run_diagnostics
    if self.proposer != "skills":
      return []
    episodes = self.results.episodes(inc.id, r, "train")
    _, findings = run_diagnostics(list(diagnostics), episodes, self._context(inc, r))
    # An incumbent found unstable that could not be rolled back (the root) carries its
    # `unstable_incumbent` finding (promotion.py) into the next generation's proposals.
    findings += [f.to_finding() for f in self.ledger.findings(version=inc.id)
                 if f.kind == "unstable_incumbent"]
    if not any(f.kind == "proxy_true_disagreement" for f in findings):
      findings += _proxy_true_gap(r)
    return findings

  def _context(self, inc: VersionRecord, r: BranchResult) -> dict:
    """The diagnostics' context: held-out figures, series, last learner metrics, and the
    incumbent's parent's held-out figures."""
    learner = {k: v[-1] for k, v in r.series.items() if isinstance(v, list) and v
               and v[-1] is not None and k not in ("correct", "reward")}
    parent = self.results.result(inc.parent) if inc.parent else None
    context = {"heldout": {**r.final, "avg8": avg8(r)}, "series": dict(r.series),
               "learner": learner}
    if parent is not None:
      context["incumbent"] = {**parent.final, "avg8": avg8(parent)}
    return context

  # ---------------------------------------------------------------- propose

  def hypotheses(self, gen: int, vid: str, findings: Sequence, esc: Mapping) -> list:
    """Hypotheses from version `vid` for generation `gen` (proposers.py), the proxy
    proposer's in its ranked order; `esc`: the generation's escalation ({}: none)."""
    values = self.results.values(vid)
    previous = {}
    for b in values:
      hist = self.ledger.binding_history(vid, b)
      if len(hist) >= 2:
        previous[b] = hist[-2][1]
    return propose(self.proposer, findings=findings, values=values, space=self.space,
                   skills=self.skills, rng=random.Random(self.seed * 1_000_003 + gen),
                   k=self.k, exclude=self.excluded(vid), previous=previous,
                   prefer_subtraction=bool(esc.get("prefer_subtraction")),
                   avoid_groups=esc.get("avoid_groups", ()))

  def excluded(self, vid: str) -> list:
    """Intervention ids not to propose from `vid`: every change already tried from it,
    and every change refuted on one of its ancestors (negative evidence carried along the
    lineage): its branch failed a validator, collapsed, or scored worse than its reference
    beyond noise. An id names the binding's old and new value, so an ancestor's refuted
    change is excluded only while `vid` still holds the value it changed; a change that
    was merely not beyond noise there stays eligible (inconclusive, not refuted)."""
    out = []
    for v in self.ledger.lineage(vid):
      for d in self.ledger.decisions(parent=v.id):
        iv = d.intervention
        if "binding" not in iv:
          continue  # a control or a continuation: no change to exclude
        if v.id == vid or (d.version_id and self.ledger.version(d.version_id)
                           .heldout.get("verdict") in REFUTED):
          out.append(iv["id"])
    return out

  # ---------------------------------------------------------------- backtest

  def backtest(self, h: Hypothesis, r: BranchResult, vid: str,
               values: Mapping) -> Optional[dict]:
    """The backtester's verdict on a harness-side hypothesis (None: not backtested),
    failed too when the change misses the finding it is aimed at (`on_target`)."""
    if self.backtester is None or not is_harness_side(h.intervention, h.group):
      return None
    bt = self.backtester(r.rollouts, vid, values, self.space.apply(values, h.intervention),
                         h.intervention)
    return on_target(bt, h.finding, h.intervention)

  def rank_by_proxy(self, hyps: Sequence[Hypothesis], r: BranchResult,
                    vid: str) -> tuple[list, dict]:
    """The proxy-chasing proposer's order: hypotheses by the mean reward gain their
    backtest predicts on `vid`'s stored rollouts (those without a backtest last), and the
    backtests by intervention id."""
    values = self.results.values(vid)
    backtests = {h.intervention.id: self.backtest(h, r, vid, values) for h in hyps}

    def gain(h: Hypothesis) -> float:
      bt = backtests[h.intervention.id] or {}
      after, before = bt.get("reward_after"), bt.get("reward_before")
      if after is None or before is None or math.isnan(after - before):
        return -math.inf
      return after - before

    return sorted(hyps, key=gain, reverse=True), backtests

  def select(self, gen: int, hyps: Sequence[Hypothesis], r: BranchResult, vid: str,
             backtests: Mapping) -> tuple[list, list]:
    """(branches, dropped decision ids): the first K hypotheses whose backtest (given in
    `backtests` by intervention id, else run now) does not fail; a failed one is recorded
    as a 'dropped' decision."""
    values = self.results.values(vid)
    branches, dropped = [], []
    for h in hyps:
      if len(branches) >= self.k:
        break
      did = f"g{gen}-d{len(branches) + len(dropped)}"
      bt = backtests.get(h.intervention.id) or self.backtest(h, r, vid, values)
      if bt is not None and not bt.get("passed", True):
        self._drop(did, vid, h, bt)
        dropped.append(did)
        continue
      branches.append({"version": f"v{gen}.{len(branches)}", "decision": did,
                       "hypothesis": h.to_dict(), "backtest": bt})
    return branches, dropped

  def _drop(self, did: str, vid: str, h: Hypothesis, bt: Mapping) -> None:
    with self.ledger.transaction():
      self.ledger.add_decision(did, vid, hypothesis=h.statement,
                               intervention=h.intervention, criterion=h.criterion,
                               backtest=bt, skill=h.skill)
      self.ledger.update_decision(did, outcome="dropped",
                                  why=f"backtest failed: {bt.get('why', '')}")


def _proxy_true_gap(r: BranchResult) -> list:
  """The series-level gap detector (signal ambiguous) as a finding, when it fires."""
  from evotrainer.harness.base import Evidence
  from evotrainer.harness.validators import ProxyTrueDisagreement
  from evotrainer.types import Finding
  v = ProxyTrueDisagreement()(Evidence(episodes=[], series=dict(r.series), heldout={}))
  if v.passed:
    return []
  return [Finding(kind="proxy_true_disagreement", layer="integrity", severity=0.9,
                  value=v.value, threshold=v.threshold, message=v.reason)]


__all__ = ["Proposal"]
