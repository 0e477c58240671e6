"""The evolution controller: the EvoTrainer loop over versions (METHOD.md, DESIGN.md s.7).

Per generation (`Controller.run`):
  escalate    after `escalate_after` consecutive rejections: re-validate the evaluation
              pipeline (`eval_check`), switch layer, prefer a subtraction; a second
              escalation on the same incumbent also rolls back to its last good ancestor
  diagnose    the incumbent: active diagnostics over its stored training episodes (or its
              training series when no rollouts are stored) -> findings in the ledger
  propose     hypotheses ("change X, expect Y because Z"), see proposers.py
  backtest    harness-side interventions (reward parts, filters, estimator) are replayed
              on the incumbent's cached rollouts (`backtester`); failures are 'dropped'
  train       K single-factor branches from the same parent with the same seed (common
              random numbers), one after another
  verify      a branch is kept only if it beats the incumbent beyond noise (paired
              bootstrap, stats.py) AND passes every active validator; the best kept one
              becomes the incumbent, every other is rejected (negative evidence)
  learn       decision outcomes, skill outcomes; a skill is written for a non-skill
              intervention that worked
  harness     on a diagnostic gap (generations without gain; a proxy rising while BC is
              flat) enable library diagnostics / validators that separate kept from
              rejected versions, record a harness version, re-check kept versions under
              new validators (a kept version can be demoted; the incumbent rolls back)

This module holds the loop itself (plan, train, verify, learn, summary); the steps with a
concept of their own are mixins the Controller inherits: escalation.py (escalate),
harness_evolution.py (the active harness and its evolution), gates.py (human gates), and
backtest.py holds the default `backtester`. Their public names are re-exported here.

Resume: everything is in the ledger (plans, results, gate approvals, escalations under
`controller/*` meta keys), so a relaunch with the same ledger continues where it stopped,
never retrains a branch whose attempt finished, and with a fixed seed ends with the same
lineage as an uninterrupted run. The harness components import the records module
(and so JAX) lazily; this module itself does not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import pathlib
import random
import re
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from evotrainer import infra
from evotrainer.evolution.backtest import harness_backtester, is_harness_side
from evotrainer.evolution.escalation import (Escalation, EvaluationPipelineError,
                                             no_eval_check)
from evotrainer.evolution.gates import (GATES, GateError, GateTimeout, HumanGates,
                                        approve_gate, write_json)
from evotrainer.evolution.harness_evolution import (DEFAULT_DIAGNOSTICS, DEFAULT_VALIDATORS,
                                                    HarnessEvolution)
from evotrainer.evolution.ledger import ROOT, Ledger, VersionRecord
from evotrainer.evolution.progress import Progress
from evotrainer.evolution.proposers import Hypothesis, propose
from evotrainer.evolution.search_space import SearchSpace, canonical, format_value
from evotrainer.evolution.skills import (Skill, SkillError, SkillLibrary, state_of,
                                         template_of)
from evotrainer.evolution.stats import holm, paired_test, score_label
from evotrainer.evolution.trainer import BranchResult, Trainer

log = logging.getLogger(__name__)

_CATEGORY = {"reward": "reward design", "filter": "filter mechanism",
             "harness": "filter mechanism"}


def _avg8(r: BranchResult) -> float:
  if "avg8" in r.final:
    return float(r.final["avg8"])
  vals = list(r.per_problem.values())
  return float(sum(vals) / len(vals)) if vals else math.nan


def _proxy(r: BranchResult) -> Optional[float]:
  rew = r.series.get("reward") or []
  return float(rew[-1]) if rew else r.final.get("reward")


class Controller(HumanGates, Escalation, HarnessEvolution):
  """Runs the evolution over `ledger` (see the module docstring).

  Args:
    ledger: the run's ledger (all state lives there; a relaunch resumes from it).
    trainer: trains a branch (`Trainer` protocol); idempotent per branch workdir.
    space: the search space (the action boundary).
    skills: the run's skill library (None: no skills; catalog and exploration only).
    workdir: run directory: `versions/<id>/` branch workdirs, `summary.json`, gates.
    domain: the domain skill outcomes are recorded under.
    branches: K, branches per generation.
    generations: generations to run (in total, across relaunches).
    seed: the run's seed (proposal order; the branches' common training seed).
    values: initial {binding: value} of the space (default: `space.current_values()`).
    validators / diagnostics: active components, instances (default: DEFAULT_VALIDATORS
      / DEFAULT_DIAGNOSTICS from the harness libraries).
    proposer: 'skills' | 'recipe' | 'random' (proposers.py).
    alpha, bootstrap_n: the paired bootstrap's level and resamples.
    backtester: `(store_root, version, values_before, values_after, iv) -> dict | None`
      with 'passed' (and 'why'); None to skip. Default: `harness_backtester` when
      `harness_builder` is given, else no backtests.
    eval_check: `() -> (ok, why)`, run on escalation (default `no_eval_check`).
    escalate_after: consecutive rejections that trigger an escalation.
    gap_generations: generations without a kept branch that count as a diagnostic gap.
    separation: a new diagnostic is kept when |mean(kept) - mean(rejected)| exceeds
      `separation` times the metric's standard deviation over those versions.
    explain_tol: a held-out change beyond noise is "unexplained" (a diagnostic gap) when
      no active metric moved from the parent by more than this share of its magnitude;
      library diagnostics whose metrics did move are then enabled.
    human_gated: stop at GATES for approval (`<workdir>/approve` file or `approve`).
    approve: `(gate: dict) -> bool`, polled at a gate.
    poll_s, gate_timeout_s: gate polling interval and limit (None: wait forever).
    learn_skills: write a skill when a non-skill intervention is kept.
    collapse_fraction: a branch worse beyond noise whose validation avg8 is below this
      share of its parent's is reported as collapsed (not just worse).
    progress: a bar over the trainings and one line per event on the terminal.
  """

  def __init__(self, ledger: Ledger, trainer: Trainer, space: SearchSpace,
               skills: Optional[SkillLibrary] = None, *, workdir: str | os.PathLike,
               domain: str = "math", branches: int = 3, generations: int = 4, seed: int = 0,
               values: Optional[Mapping] = None, validators: Optional[Sequence] = None,
               diagnostics: Optional[Sequence] = None, proposer: str = "skills",
               alpha: float = 0.05, bootstrap_n: int = 2000,
               backtester: Optional[Callable] = None,
               harness_builder: Optional[Callable] = None,
               eval_check: Callable[[], tuple] = no_eval_check, escalate_after: int = 3,
               gap_generations: int = 3, separation: float = 1.0, explain_tol: float = 0.1,
               human_gated: bool = False,
               approve: Optional[Callable[[dict], bool]] = None, poll_s: float = 2.0,
               gate_timeout_s: Optional[float] = None, learn_skills: bool = True,
               collapse_fraction: float = 0.5, progress: bool = False):
    self.ledger, self.trainer, self.space, self.skills = ledger, trainer, space, skills
    self.workdir = pathlib.Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self.domain, self.k, self.generations, self.seed = domain, branches, generations, seed
    self._initial_values = None if values is None else dict(values)
    self.proposer, self.alpha, self.bootstrap_n = proposer, alpha, bootstrap_n
    self.backtester = backtester or (harness_backtester(harness_builder)
                                     if harness_builder else None)
    self.eval_check, self.escalate_after = eval_check, escalate_after
    self.gap_generations, self.separation = gap_generations, separation
    self.explain_tol = explain_tol
    self.collapse_fraction = collapse_fraction
    self.human_gated, self.approve = human_gated, approve
    self.poll_s, self.gate_timeout_s, self.learn_skills = poll_s, gate_timeout_s, learn_skills
    self._given = {"validators": validators, "diagnostics": diagnostics}
    self._validators: list = []
    self._diagnostics: list = []
    self._t0 = time.time()
    self.show_progress = progress
    self.progress = Progress(0, enabled=False)
    self._infra_failed: dict = {}  # {version: InfraFailure} of this launch (infra.py)

  # ---------------------------------------------------------------- the loop

  def run(self) -> Optional[VersionRecord]:
    """Runs (or resumes) up to `generations` generations; returns the incumbent."""
    self._t0 = time.time()
    done = sum(1 for v in self.ledger.versions() if "result" in v.metrics
               or v.status != "running")
    self.progress = Progress(1 + self.generations * self.k, done, self.show_progress)
    self._ensure_harness()
    self._ensure_root()
    while True:
      done = self.ledger.get_meta("controller/generation", 0)
      if done >= self.generations:
        break
      self._generation(done + 1)
      wall = self.ledger.get_meta("controller/wall_s", 0.0) + time.time() - self._t0
      self._t0 = time.time()
      with self.ledger.transaction():
        self.ledger.set_meta("controller/wall_s", wall)
        self.ledger.set_meta("controller/generation", done + 1)
      self.write_summary()
    self.write_summary()
    self.progress.close()
    inc = self.ledger.incumbent()
    if inc is not None:
      self.progress.say(f"done: incumbent {inc.id} (validation {score_label(inc.heldout)} "
                        f"{inc.heldout.get('avg8', float('nan')):.4f}); "
                        f"{len(self.ledger.versions())} versions; see {self.workdir}/report.html")
    return inc

  def _generation(self, gen: int) -> None:
    plan = self.ledger.get_meta(f"controller/plan/{gen}")
    if plan is None:
      inc = self.ledger.incumbent()
      self.progress.say(f"generation {gen}/{self.generations}: diagnosing incumbent {inc.id} "
                        f"(held-out {score_label(inc.heldout)} "
                        f"{inc.heldout.get('avg8', float('nan')):.4f})")
      plan = self._plan(gen)
      self.ledger.set_meta(f"controller/plan/{gen}", plan)
      self.progress.say(f"generation {gen}: {len(plan['branches'])} branches from "
                        f"{plan['parent']}" + (f", {len(plan['dropped'])} dropped by their "
                                               f"backtest" if plan["dropped"] else ""))
    results = {b["version"]: self._train(b, plan) for b in plan["branches"]}
    infra.settle_generation(self.ledger, gen, plan["branches"], results, self._infra_failed)
    if not self.ledger.get_meta(f"controller/evaluated/{gen}"):
      self._evaluate(gen, plan, results)
    if not self.ledger.get_meta(f"controller/harness_done/{gen}"):
      self._evolve_harness(gen, plan)

  # ---------------------------------------------------------------- setup

  def _ensure_root(self, checkpoint: Optional[str] = None, bindings: Sequence[str] = (),
                   reason: str = "root version (the base training)") -> None:
    """Records and trains the root (from the warm start; from `checkpoint` under
    `bindings` when given) and makes it the incumbent when there is none."""
    if not self.ledger.has_version(ROOT):
      values = self._initial_values
      if values is None:
        values = self.space.current_values()
      self.ledger.add_version(ROOT, None, bindings=values,
                              harness_version=self.ledger.get_meta("controller/harness"))
    root = self.ledger.version(ROOT)
    if "result" not in root.metrics:
      self.progress.training(ROOT, "the root" + (f" from {checkpoint}" if checkpoint else ""))
      start = time.time()
      try:
        r = infra.train_with_retry(lambda: self.trainer.train(
            version=ROOT, parent_checkpoint=checkpoint, bindings=list(bindings),
            seed=self._train_seed(0), workdir=str(self._vdir(ROOT))),
            on_retry=lambda f: self._infra_retry(ROOT, f))
      except infra.InfraFailure as f:
        infra.record(self.ledger, ROOT, f)
        raise infra.InfrastructureError(f"the root version could not train: {f}; fix the "
                                        f"cause and relaunch the same command") from f
      self._store_result(ROOT, r)
      self.progress.trained(ROOT, f"trained in {time.time() - start:.0f}s: held-out "
                                  f"{score_label(r.final)} "
                                  f"{_avg8(r):.4f}")
    if self.ledger.get_meta("incumbent") is None and root.status == "running":
      self.ledger.promote(ROOT, reason=reason)

  # ---------------------------------------------------------------- helpers

  def _infra_retry(self, vid: str, f: "infra.InfraFailure") -> None:
    infra.record(self.ledger, vid, f)
    self.progress.say(f"{vid}: infrastructure failure ({f.kind}), retrying once: "
                      f"{f.message.splitlines()[0][:200]}")

  def _vdir(self, vid: str) -> pathlib.Path:
    return self.workdir / "versions" / vid

  def _train_seed(self, gen: int) -> int:
    return self.seed * 1000 + gen  # the same for every branch of a generation (CRN)

  def _store_result(self, vid: str, r: BranchResult, attempt: Optional[str] = None) -> None:
    with self.ledger.transaction():
      self.ledger.update_version(
          vid, checkpoint=r.checkpoint or None,
          metrics={"proxy_reward": _proxy(r), "steps": r.steps,
                   "result": dataclasses.asdict(r)},
          heldout={**{k: v for k, v in r.final.items() if isinstance(v, (int, float))},
                   "avg8": _avg8(r)})
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

  def _gin(self, values: Mapping) -> list:
    root = self.ledger.version(ROOT).bindings
    return [f"{b} = {format_value(v)}" for b, v in values.items()
            if b not in root or canonical(root[b]) != canonical(v)]

  def _episodes(self, vid: str, r: Optional[BranchResult], split: Optional[str] = None) -> list:
    if r is None or not r.rollouts or not os.path.isdir(r.rollouts):
      return []
    from evotrainer.rollouts.store import RolloutStore
    store = RolloutStore(r.rollouts)
    if vid not in store.versions():
      return []
    return store.read(version=vid, split=split)

  def evidence(self, vid: str, parent: Optional[Any] = None):
    """The `Evidence` validators judge version `vid` on."""
    from evotrainer.harness.base import Evidence
    r = self.result(vid)
    if r is None:
      return Evidence(episodes=[], series={}, heldout={}, parent=parent)
    return Evidence(episodes=self._episodes(vid, r), series=dict(r.series),
                    heldout={**r.final, "avg8": _avg8(r)}, parent=parent)

  # ---------------------------------------------------------------- plan

  def _diagnose(self, inc: VersionRecord, r: BranchResult) -> list:
    from evotrainer.harness.diagnostics import run_diagnostics
    from evotrainer.harness.validators import ProxyTrueDisagreement
    from evotrainer.types import Finding
    episodes = self._episodes(inc.id, r, "train")
    learner = {k: v[-1] for k, v in r.series.items() if isinstance(v, list) and v
               and k not in ("correct", "reward")}
    parent = self.result(inc.parent) if inc.parent else None
    context = {"heldout": {**r.final, "avg8": _avg8(r)}, "series": dict(r.series),
               "learner": learner}
    if parent is not None:
      context["incumbent"] = {**parent.final, "avg8": _avg8(parent)}
    _, findings = run_diagnostics(self._diagnostics, episodes, context)
    if not any(f.kind == "proxy_true_disagreement" for f in findings):
      # The series-level gap detector (signal ambiguous) runs whatever is active.
      from evotrainer.harness.base import Evidence
      v = ProxyTrueDisagreement()(Evidence(episodes=[], series=dict(r.series), heldout={}))
      if not v.passed:
        findings.append(Finding(kind="proxy_true_disagreement", layer="integrity",
                                severity=0.9, value=v.value, threshold=v.threshold,
                                message=v.reason))
    return findings

  def _plan(self, gen: int) -> dict:
    esc = self._escalate(gen) or {}
    inc = self.ledger.incumbent()
    r = self.result(inc.id)
    values = self.values(inc.id)
    findings = self._diagnose(inc, r) if self.proposer == "skills" else []
    self.ledger.add_findings(inc.id, findings, stage=f"g{gen}")
    self._gate("diagnosis", gen, {"incumbent": inc.id, "findings": [
        {"kind": f.kind, "severity": f.severity, "message": f.message} for f in findings]})
    previous = {}
    for b in values:
      hist = self.ledger.binding_history(inc.id, b)
      if len(hist) >= 2:
        previous[b] = hist[-2][1]
    tried = [d.intervention["id"] for d in self.ledger.decisions(parent=inc.id)
             if "id" in d.intervention]
    hyps = propose(self.proposer, findings=findings, values=values, space=self.space,
                   skills=self.skills, rng=random.Random(self.seed * 1_000_003 + gen),
                   k=self.k, exclude=tried, previous=previous,
                   prefer_subtraction=bool(esc.get("prefer_subtraction")),
                   avoid_groups=esc.get("avoid_groups", ()))
    self._gate("design", gen, {"incumbent": inc.id, "hypotheses": [
        h.statement for h in hyps[:2 * self.k]]})
    branches, dropped = [], []
    for h in hyps:
      if len(branches) >= self.k:
        break
      did = f"g{gen}-d{len(branches) + len(dropped)}"
      bt = None
      if self.backtester is not None and is_harness_side(h.intervention, h.group):
        bt = self.backtester(r.rollouts, inc.id, values,
                             self.space.apply(values, h.intervention), h.intervention)
      if bt is not None and not bt.get("passed", True):
        with self.ledger.transaction():
          self.ledger.add_decision(did, inc.id, hypothesis=h.statement,
                                   intervention=h.intervention, criterion=h.criterion,
                                   backtest=bt, skill=h.skill)
          self.ledger.update_decision(did, outcome="dropped",
                                      why=f"backtest failed: {bt.get('why', '')}")
        dropped.append(did)
        continue
      branches.append({"version": f"v{gen}.{len(branches)}", "decision": did,
                       "hypothesis": h.to_dict(), "backtest": bt})
    self._gate("backtest", gen, {"branches": [b["hypothesis"]["statement"] for b in branches],
                                 "dropped": dropped})
    return {"parent": inc.id, "seed": self._train_seed(gen), "branches": branches,
            "dropped": dropped, "escalation": esc or None,
            "harness": self.ledger.get_meta("controller/harness")}

  # ---------------------------------------------------------------- train

  def _train(self, b: Mapping, plan: Mapping) -> Optional[BranchResult]:
    vid, did, parent = b["version"], b["decision"], plan["parent"]
    h = Hypothesis.from_dict(b["hypothesis"])
    iv, aid = h.intervention, f"{vid}/train"
    with self.ledger.transaction():
      self.ledger.add_version(vid, parent, bindings={iv.binding: iv.new},
                              harness_version=plan["harness"])
      self.ledger.add_decision(did, parent, hypothesis=h.statement, intervention=iv,
                               criterion=h.criterion, version_id=vid, backtest=b["backtest"],
                               skill=h.skill)
      self.ledger.add_attempt(aid, vid, parent, iv.id)
      if h.skill:
        self.ledger.add_skill_use(vid, h.skill, did, self.domain)
    return self._train_version(vid, parent, did, aid, plan["seed"],
                               lambda: self.space.apply(self.values(parent), iv),
                               what=iv.description)

  def _train_version(self, vid: str, parent: str, did: str, aid: str, seed: int,
                     values: Callable[[], Mapping], what: str = "") -> Optional[BranchResult]:
    """Trains the recorded version `vid` from `parent` under `values()` ({binding: value})
    unless it finished before (its stored result) or failed before (None); a training
    error rejects the version and fails its attempt and decision."""
    v = self.ledger.version(vid)
    if "result" in v.metrics:
      return self.result(vid)
    if v.status != "running":
      return None  # failed earlier and was rejected
    self.progress.training(vid, f"{what or 'branch'} (from {parent})")
    start = time.time()
    try:
      r = infra.train_with_retry(lambda: self.trainer.train(
          version=vid, parent_checkpoint=self.ledger.version(parent).checkpoint,
          bindings=self._gin(values()), seed=seed, workdir=str(self._vdir(vid))),
          on_retry=lambda f: self._infra_retry(vid, f))
    except infra.InfraFailure as f:  # not evidence: the version stays untried (infra.py)
      with self.ledger.transaction():
        self.ledger.finish_attempt(aid, "failed")
        infra.record(self.ledger, vid, f)
        self.ledger.update_decision(did, why=f"not trained: infrastructure failure ({f.kind})")
      self._infra_failed[vid] = f
      self.progress.trained(vid, f"could not train (infrastructure, {f.kind}): "
                                 f"{f.message.splitlines()[0][:200]}")
      return None
    except Exception as e:  # pylint: disable=broad-except  (one branch, not the run)
      reason = f"training failed: {type(e).__name__}: {str(e)[:300]}"
      with self.ledger.transaction():
        self.ledger.finish_attempt(aid, "failed")
        self.ledger.reject(vid, reason)
        self.ledger.update_decision(did, outcome="failure", why="training failed")
      self.progress.trained(vid, reason.splitlines()[0])
      return None
    self._store_result(vid, r, aid)
    self.progress.trained(vid, f"trained in {time.time() - start:.0f}s: held-out "
                               f"{score_label(r.final)} "
                               f"{_avg8(r):.4f}")
    return r

  # ---------------------------------------------------------------- verify

  def _judge(self, vid: str, r: BranchResult, parent: str, seed: int,
             parent_evidence: Any = None) -> dict:
    """Verification of `vid` against `parent`: the paired-bootstrap difference of held-out
    scores with its interval (stored on the version: its noise estimate) and every active
    validator's verdict ('failed': those that did not pass)."""
    from evotrainer.harness.validators import run_validators
    pres = self.result(parent)
    t = paired_test(r.per_problem, pres.per_problem, n=self.bootstrap_n, seed=seed,
                    alpha=self.alpha)
    diff, lo, hi = t["diff"], t["lo"], t["hi"]
    pev = parent_evidence if parent_evidence is not None else self.evidence(parent)
    verdicts = run_validators(self._validators, self.evidence(vid, pev))
    self.ledger.update_version(vid, heldout={
        **self.ledger.version(vid).heldout, "noise": (hi - lo) / 2, "diff": diff,
        "lo": lo, "hi": hi, "p": t["p"]})
    return {"version": vid, "avg8": _avg8(r), "parent_avg8": _avg8(pres), "proxy": _proxy(r),
            "diff": diff, "lo": lo, "hi": hi, "p": t["p"], "verdicts": verdicts,
            "failed": [v for v in verdicts if not v.passed], "label": score_label(r.final)}

  def _ci(self, x: Mapping, parent: str) -> str:
    return (f"{x.get('label', 'avg8')} {x['diff']:+.4f}, {100 * (1 - self.alpha):.0f}% CI [{x['lo']:+.4f}, "
            f"{x['hi']:+.4f}] vs {parent}")

  @staticmethod
  def _validator_rejection(x: Mapping, ci: str) -> str:
    names = ", ".join(v.validator for v in x["failed"])
    return f"rejected by validator {names}: {x['failed'][0].reason} ({ci})"

  def _evaluate(self, gen: int, plan: Mapping, results: Mapping) -> None:
    parent = plan["parent"]
    pev = self.evidence(parent)
    rows = []
    for i, b in enumerate(plan["branches"]):
      vid, r = b["version"], results.get(b["version"])
      if r is None:
        continue
      rows.append({**self._judge(vid, r, parent, self.seed * 7919 + gen, pev), "branch": b,
                   "order": i})
    # Family-wise correction over the generation's K branches (Holm), at the one-sided
    # level of the interval's lower bound: a branch is kept only if it survives both.
    for x, ok in zip(rows, holm([x["p"] for x in rows], self.alpha / 2)):
      x["holm"] = ok
    passing = [x for x in rows if not x["failed"] and x["lo"] > 0 and x["holm"]]
    best = max(passing, key=lambda x: (x["avg8"], x["diff"], -x["order"]), default=None)
    self._gate("verification", gen, {"parent": parent, "promote": best and best["version"],
                                     "branches": [{k: x[k] for k in ("version", "avg8", "diff",
                                                                     "lo", "hi")}
                                                  | {"failed": [v.validator for v in x["failed"]]}
                                                  for x in rows]})
    outcomes = {}
    for x in rows:
      ci = self._ci(x, parent)
      x["verdict"] = verdict = self._verdict(x, best)
      if verdict == "validator":
        reason, outcome = self._validator_rejection(x, ci), "failure"
      elif verdict == "kept":
        reason, outcome = (f"kept: beats {parent} beyond noise ({ci}; Holm-corrected over "
                           f"{len(rows)} branches); validators pass"), "success"
      elif verdict == "better_not_best":
        reason, outcome = f"beats {parent} beyond noise ({ci}) but {best['version']} is " \
                          f"better", "partial"
      elif verdict == "collapsed":
        reason, outcome = (f"collapsed: validation {x['label']} {x['avg8']:.4f} against "
                           f"{x['parent_avg8']:.4f} of {parent} ({ci})"), "failure"
      elif verdict == "worse_beyond_noise":
        reason, outcome = f"worse beyond noise: {ci}", "failure"
      elif verdict == "not_beyond_noise_corrected":
        reason, outcome = (f"not beyond noise after the Holm correction over {len(rows)} "
                           f"branches (p={x['p']:.4f}): {ci}"), "failure"
      else:
        reason, outcome = f"not beyond noise: {ci}", "failure"
      outcomes[x["version"]] = (reason, outcome)
    # Skill files first (idempotent per version), then the ledger in one transaction.
    for x in rows:
      h = Hypothesis.from_dict(x["branch"]["hypothesis"])
      success = outcomes[x["version"]][1] == "success"
      if h.skill and self.skills is not None and h.skill in self.skills:
        self.skills.record_outcome(h.skill, self.domain, success, version=x["version"])
      elif success and self.learn_skills and self.skills is not None:
        self._learn_skill(h, x["version"])
    with self.ledger.transaction():
      for x in sorted(rows, key=lambda x: x is best):  # rejections before the promotion
        reason, outcome = outcomes[x["version"]]
        h = Hypothesis.from_dict(x["branch"]["hypothesis"])
        self.ledger.update_decision(x["branch"]["decision"], outcome=outcome, why=reason)
        if h.skill:
          self.ledger.set_skill_outcome(x["version"], h.skill, outcome)
        self.ledger.update_version(x["version"], heldout={
            **self.ledger.version(x["version"]).heldout, "verdict": x["verdict"]})
        if x is best:
          self.ledger.promote(x["version"], reason)
        else:
          self.ledger.reject(x["version"], reason)
      suspect = None if best else self._suspect_incumbent(gen, parent, rows)
      self.ledger.set_meta(f"controller/evaluated/{gen}",
                           {"promoted": best and best["version"], "suspected": suspect})
    for x in rows:
      self.progress.say(f"{x['version']} {'KEPT' if x is best else 'rejected'}: "
                        f"{outcomes[x['version']][0]}")
    if suspect:
      self.progress.say(suspect)

  def _verdict(self, x: Mapping, best: Optional[Mapping]) -> str:
    """One of kept, better_not_best, validator, collapsed, worse_beyond_noise,
    not_beyond_noise_corrected, not_beyond_noise."""
    if x["failed"]:
      return "validator"
    if x is best:
      return "kept"
    if x["lo"] > 0 and x["holm"]:
      return "better_not_best"
    if x["hi"] < 0 and x["avg8"] < self.collapse_fraction * x["parent_avg8"]:
      return "collapsed"
    if x["hi"] < 0:
      return "worse_beyond_noise"
    return "not_beyond_noise_corrected" if x["lo"] > 0 else "not_beyond_noise"

  def _suspect_incumbent(self, gen: int, parent: str, rows: Sequence[Mapping]) -> Optional[str]:
    """When most branches of the incumbent fail badly (collapsed or worse beyond noise),
    the incumbent itself is suspect: it is demoted as unstable (negative evidence for
    its change) and the incumbent rolls back to its last good ancestor. Runs inside the
    caller's transaction; returns what was done, or None."""
    bad = [x["version"] for x in rows if x["verdict"] in ("collapsed", "worse_beyond_noise")]
    inc = self.ledger.version(parent)
    if inc.parent is None or len(bad) < 2 or 2 * len(bad) <= len(rows):
      return None
    why = (f"unstable: {len(bad)} of {len(rows)} branches from {parent} collapsed or "
           f"regressed beyond noise ({', '.join(bad)})")
    did = f"g{gen}-suspect"
    self.ledger.add_decision(did, parent, intervention={"demote": parent},
                             hypothesis=f"{parent}'s own change made it unstable: its "
                                        f"children fail whatever they change",
                             criterion="branches from the rolled-back incumbent do not "
                                       "collapse")
    self.ledger.update_decision(did, outcome="failure", why=why)
    self.ledger.reject(parent, why)
    back = self.ledger.incumbent()
    return f"{why}: {parent} demoted, incumbent rolled back to {back and back.id}"

  def _learn_skill(self, h: Hypothesis, vid: str) -> None:
    """Writes (or adds evidence to) a skill for a kept change that no skill proposed: it
    triggers on the finding that motivated the change, if any, in the binding state the
    change started from (`state_of`), and makes the same change."""
    iv = h.intervention
    state = state_of(iv)
    trigger = {"finding": h.finding, "and": [state]} if h.finding else state
    # One skill per (trigger, change): the same change from the same state adds evidence.
    digest = hashlib.sha256(json.dumps([trigger, template_of(iv)], sort_keys=True,
                                       default=str).encode()).hexdigest()[:6]
    name = "learned-" + re.sub(r"[^a-z0-9]+", "-",
                               f"{h.finding or 'state'}-{iv.binding}-{iv.kind}-"
                               f"{iv.key or ''}".lower()).strip("-") + f"-{digest}"
    when = f"{h.finding} fired" if h.finding else f"{state['binding']} {state['op']} " \
                                                  f"{state['value']!r}"
    try:
      if name not in self.skills:
        self.skills.add(Skill(
            name=name, category=_CATEGORY.get(h.group, "training stability"),
            description=f"learned on {vid}: {iv.description} when {when}",
            trigger=trigger, intervention=template_of(iv),
            expected_outcome=h.statement, validation_criterion=h.criterion,
            source="learned"))
      self.skills.record_outcome(name, self.domain, True, version=vid)
    except SkillError:
      pass  # a template the skill language cannot express (e.g. a whole-list value)

  # ---------------------------------------------------------------- summary

  def summary(self) -> dict:
    changes = {d.version_id: d.intervention.get("description", "")
               for d in self.ledger.decisions() if d.version_id}
    inc = self.ledger.incumbent()
    versions = []
    for v in self.ledger.versions():
      avg8 = v.heldout.get("avg8")
      versions.append({"id": v.id, "parent": v.parent, "status": v.status,
                       "intervention": changes.get(v.id, "(root)" if v.parent is None else ""),
                       "heldout_avg8": None if avg8 is None or (isinstance(avg8, float)
                                                                and math.isnan(avg8)) else avg8,
                       "proxy_reward": v.metrics.get("proxy_reward"), "reason": v.reason,
                       "verdict": v.heldout.get("verdict")})
    wall = self.ledger.get_meta("controller/wall_s", 0.0) + time.time() - self._t0
    return {"mode": "evolve", "wall_s": round(wall, 3), "incumbent": inc and inc.id,
            "generations": self.ledger.get_meta("controller/generation", 0),
            "harness": self.ledger.get_meta("controller/harness"), "versions": versions,
            # Apart from the verdicts: attempts that could not train say nothing (infra.py).
            "infrastructure_failures": infra.failures(self.ledger)}

  def write_summary(self, extra: Optional[Mapping] = None) -> pathlib.Path:
    """summary.json (`summary()` updated with `extra`), and report.html regenerated beside
    it (a report that fails to render is logged, never the end of the run)."""
    from evotrainer.report.test_split import attach_test
    path = self.workdir / "summary.json"
    # Test scores join the summary here, after every decision, and nowhere else.
    write_json(path, attach_test({**self.summary(), **(extra or {})}, self.workdir))
    try:
      from evotrainer.report import render_report
      render_report(self.workdir, ledger=self.ledger)
    except Exception as e:  # pylint: disable=broad-except
      log.warning("report.html not rendered: %s: %s", type(e).__name__, e)
    return path


__all__ = ["Controller", "DEFAULT_DIAGNOSTICS", "DEFAULT_VALIDATORS", "EvaluationPipelineError",
           "GATES", "GateError", "GateTimeout", "approve_gate", "harness_backtester",
           "is_harness_side", "no_eval_check"]
