"""The evolution controller: the EvoTrainer loop over versions (docs/method.md, docs/design.md).

Per generation (`Controller.run`):
  escalate    after `escalate_after` consecutive rejections: re-validate the evaluation
              pipeline (`eval_check`), switch layer, prefer a subtraction; a second
              escalation on the same incumbent also rolls back to its last good ancestor
  diagnose    the incumbent: active diagnostics over its stored training episodes (or its
              training series when no rollouts are stored) -> findings in the ledger
  propose     hypotheses ("change X, expect Y because Z"), see proposers.py; never a
              change already tried from the incumbent, nor one refuted on an ancestor
              whose value the incumbent still holds (`_excluded`: negative evidence)
  backtest    harness-side interventions (reward parts, filters, estimator) are replayed
              on the incumbent's cached rollouts (`backtester`); failures are 'dropped'
  train       K single-factor branches from the same parent with the same seed (common
              random numbers), one after another, and a control branch: the parent
              continued unchanged for the same steps (`control=True`)
  verify      a change is credited against continuing, not against standing still: a
              branch is kept only if it beats the control beyond noise (paired bootstrap,
              stats.py; Holm over the K branches), does not fall below the incumbent, and
              passes every active validator; the best kept one becomes the incumbent. A
              branch whose per-problem results equal the control's is *inert* (its knob
              never acted): never kept, never learned as a skill. When no change is kept
              and the control beats the incumbent beyond noise, the control (continued
              training) becomes the incumbent. Every other branch is rejected (negative
              evidence); a control that is not promoted is pruned (no evidence either way)
  learn       decision outcomes, skill outcomes; a skill is written for a non-skill
              intervention that worked, and for the change of an incumbent whose
              branches mostly failed badly (its subtraction, promotion.py)
  continue    (`continue_steps` > 0) the incumbent trains further unchanged as one version
              `v<g>.x` (a different seed): the search's short trials decide which change
              to keep, the continuation spends the rest of the generation's steps on the
              lineage itself. It becomes the incumbent unless it is worse than its parent
              beyond noise or a validator fails (then it is rejected). Successive halving
              with two rungs: all K + 1 arms for `branch_steps`, the winner for
              `continue_steps` more
  harness     on a diagnostic gap (generations without gain; a proxy rising while BC is
              flat) enable library diagnostics / validators that separate kept from
              rejected versions, record a harness version, re-check kept versions under
              new validators (a kept version can be demoted; the incumbent rolls back)

This module holds the loop itself (plan, train, verify, learn, summary); the steps with a
concept of their own are mixins the Controller inherits: promotion.py (verify and learn),
escalation.py (escalate),
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
import logging
import math
import os
import pathlib
import random
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
from evotrainer.evolution.promotion import (CONTINUE, CONTROL, REFUTED, Promotion, _avg8,
                                            _proxy)
from evotrainer.evolution.proposers import Hypothesis, propose
from evotrainer.evolution.search_space import SearchSpace, canonical, format_value
from evotrainer.evolution.skills import SkillLibrary
from evotrainer.evolution.stats import score_label
from evotrainer.evolution.trainer import BranchResult, Trainer

log = logging.getLogger(__name__)

class Controller(HumanGates, Escalation, HarnessEvolution, Promotion):
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
    proposer: 'skills' | 'recipe' | 'random' | 'proxy' (proposers.py).
    alpha, bootstrap_n: the paired bootstrap's level and resamples.
    backtester: `(store_root, version, values_before, values_after, iv) -> dict | None`
      with 'passed' (and 'why'); None to skip. Default: `harness_backtester` when
      `harness_builder` is given, else no backtests.
    eval_check: `() -> (ok, why)`, run before training and on escalation (default
      `no_eval_check`; the launcher passes `eval_check.task_eval_check(task)`).
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
    control: train a control branch per generation (the parent continued unchanged with
      the generation's seed and steps) and credit each change against it.
    strict_verify: `(gold, completion) -> bool`, the domain's strict verifier, given to
      validators in the evidence (`strict_verifier_agreement`); None: that validator is
      not applicable.
    progress: a bar over the trainings and one line per event on the terminal.
    continue_steps: RL steps of each generation's continuation (0: none), passed to the
      trainer as `train.steps`.
    relative_health: health validators (`kind = "health"`: training_stability,
      canary_prompts) veto a change only when its control did not fail them too, and
      never veto a control or continuation (which change nothing); their failures stay
      on the version and in its reason (promotion._waive_health). False: every failed
      validator vetoes.
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
               collapse_fraction: float = 0.5, control: bool = True,
               strict_verify: Optional[Callable[[str, str], bool]] = None,
               progress: bool = False, continue_steps: int = 0,
               relative_health: bool = False):
    if continue_steps < 0:
      raise ValueError(f"continue_steps={continue_steps}; expected >= 0 (0: no continuation)")
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
    self.collapse_fraction, self.control = collapse_fraction, control
    self.continue_steps = int(continue_steps)
    self.relative_health = bool(relative_health)
    self.strict_verify = strict_verify
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
    per_gen = self.k + (1 if self.control else 0) + (1 if self.continue_steps else 0)
    self.progress = Progress(1 + self.generations * per_gen, done, self.show_progress)
    self._ensure_harness()
    self._check_before_training()
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
    # Stops the run when no branch could train (infra.py); sets aside infra failures.
    infra.settle_generation(self.ledger, gen, plan["branches"], results, self._infra_failed)
    if plan.get("control"):
      results[plan["control"]["version"]] = self._train_control(plan)
      infra.settle_generation(self.ledger, gen, plan["branches"], results,
                              self._infra_failed)
    if not self.ledger.get_meta(f"controller/evaluated/{gen}"):
      self._evaluate(gen, plan, results)
    if not self.ledger.get_meta(f"controller/harness_done/{gen}"):
      self._evolve_harness(gen, plan)
    if self.continue_steps and not self.ledger.get_meta(f"controller/continued/{gen}"):
      self._continue(gen)

  # ---------------------------------------------------------------- setup

  def _check_before_training(self) -> None:
    """Runs `eval_check` before anything trains (each launch: it is cheap) and stores its
    verdict (`controller/eval_check`); a failure stops the run."""
    ok, why = self.eval_check()
    self.ledger.set_meta("controller/eval_check", {"ok": ok, "why": why, "time": time.time()})
    if not ok:
      raise EvaluationPipelineError(f"the evaluation pipeline failed its check before "
                                    f"training: {why}")
    self.progress.say(f"evaluation pipeline check: {why}")

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
                    heldout={**r.final, "avg8": _avg8(r), "canary_correct": r.canary},
                    parent=parent, strict_verify=self.strict_verify)

  # ---------------------------------------------------------------- plan

  def _diagnose(self, inc: VersionRecord, r: BranchResult) -> list:
    from evotrainer.harness.diagnostics import run_diagnostics
    from evotrainer.harness.validators import ProxyTrueDisagreement
    from evotrainer.types import Finding
    episodes = self._episodes(inc.id, r, "train")
    learner = {k: v[-1] for k, v in r.series.items() if isinstance(v, list) and v
               and v[-1] is not None and k not in ("correct", "reward")}
    parent = self.result(inc.parent) if inc.parent else None
    context = {"heldout": {**r.final, "avg8": _avg8(r)}, "series": dict(r.series),
               "learner": learner}
    if parent is not None:
      context["incumbent"] = {**parent.final, "avg8": _avg8(parent)}
    _, findings = run_diagnostics(self._diagnostics, episodes, context)
    # An incumbent found unstable that could not be rolled back (the root) carries its
    # `unstable_incumbent` finding (promotion.py) into the next generation's proposals.
    findings += [f.to_finding() for f in self.ledger.findings(version=inc.id)
                 if f.kind == "unstable_incumbent"]
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
    tried = self._excluded(inc.id)
    hyps = propose(self.proposer, findings=findings, values=values, space=self.space,
                   skills=self.skills, rng=random.Random(self.seed * 1_000_003 + gen),
                   k=self.k, exclude=tried, previous=previous,
                   prefer_subtraction=bool(esc.get("prefer_subtraction")),
                   avoid_groups=esc.get("avoid_groups", ()))
    self._gate("design", gen, {"incumbent": inc.id, "hypotheses": [
        h.statement for h in hyps[:2 * self.k]]})
    backtests = {}
    if self.proposer == "proxy":
      hyps, backtests = self._rank_by_proxy(hyps, r, inc.id, values)
    branches, dropped = [], []
    for h in hyps:
      if len(branches) >= self.k:
        break
      did = f"g{gen}-d{len(branches) + len(dropped)}"
      bt = backtests.get(h.intervention.id) or self._backtest(h, r, inc.id, values)
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
    control = ({"version": f"v{gen}.c", "decision": f"g{gen}-control"}
               if self.control and branches else None)
    return {"parent": inc.id, "seed": self._train_seed(gen), "branches": branches,
            "control": control, "dropped": dropped, "escalation": esc or None,
            "harness": self.ledger.get_meta("controller/harness")}

  def _excluded(self, vid: str) -> list:
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

  def _backtest(self, h: Hypothesis, r: BranchResult, vid: str,
                values: Mapping) -> Optional[dict]:
    """The backtester's verdict on a harness-side hypothesis (None: not backtested)."""
    if self.backtester is None or not is_harness_side(h.intervention, h.group):
      return None
    return self.backtester(r.rollouts, vid, values, self.space.apply(values, h.intervention),
                           h.intervention)

  def _rank_by_proxy(self, hyps: Sequence[Hypothesis], r: BranchResult, vid: str,
                     values: Mapping) -> tuple[list, dict]:
    """The proxy-chasing proposer's order: hypotheses by the mean reward gain their
    backtest predicts on `vid`'s stored rollouts (those without a backtest last), and the
    backtests by intervention id."""
    backtests = {h.intervention.id: self._backtest(h, r, vid, values) for h in hyps}

    def gain(h: Hypothesis) -> float:
      bt = backtests[h.intervention.id] or {}
      after, before = bt.get("reward_after"), bt.get("reward_before")
      if after is None or before is None or math.isnan(after - before):
        return -math.inf
      return after - before

    return sorted(hyps, key=gain, reverse=True), backtests

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

  def _train_control(self, plan: Mapping) -> Optional[BranchResult]:
    """Trains the generation's control branch: the parent continued unchanged."""
    vid, did, parent = plan["control"]["version"], plan["control"]["decision"], plan["parent"]
    aid = f"{vid}/train"
    with self.ledger.transaction():
      self.ledger.add_version(vid, parent, bindings={}, harness_version=plan["harness"])
      self.ledger.add_decision(did, parent, intervention=dict(CONTROL), version_id=vid,
                               hypothesis=f"continuing {parent} unchanged for the same steps "
                                          f"changes its score",
                               criterion="beats the parent beyond noise")
      self.ledger.add_attempt(aid, vid, parent, CONTROL["id"])
    return self._train_version(vid, parent, did, aid, plan["seed"],
                               lambda: self.values(parent), what="control")

  def _continue(self, gen: int) -> None:
    """Trains the generation's continuation `v<gen>.x` (the incumbent after verification,
    unchanged, `continue_steps` steps, its own seed) and settles it: promoted unless it is
    worse than its parent beyond noise or a validator fails (`Promotion._settle_continuation`)."""
    vid, did = f"v{gen}.x", f"g{gen}-continue"
    aid = f"{vid}/train"
    if not self.ledger.has_version(vid):
      inc = self.ledger.incumbent()
      with self.ledger.transaction():
        self.ledger.add_version(vid, inc.id, bindings={},
                                harness_version=self.ledger.get_meta("controller/harness"))
        self.ledger.add_decision(did, inc.id, intervention=dict(CONTINUE), version_id=vid,
                                 hypothesis=f"training {inc.id} unchanged for "
                                            f"{self.continue_steps} more steps keeps "
                                            f"improving it",
                                 criterion="not worse than the parent beyond noise; "
                                           "validators pass")
        self.ledger.add_attempt(aid, vid, inc.id, CONTINUE["id"])
    parent = self.ledger.version(vid).parent
    r = self._train_version(vid, parent, did, aid, self._train_seed(gen) + 500,
                            lambda: self.values(parent), what="continuation",
                            extra=[f"train.steps = {self.continue_steps}"])
    infra.settle_generation(self.ledger, gen, [{"version": vid}], {vid: r},
                            self._infra_failed)
    if r is not None and self.ledger.version(vid).status == "running":
      self._settle_continuation(gen, vid, did, parent, r)
    self.ledger.set_meta(f"controller/continued/{gen}", {
        "version": vid, "status": self.ledger.version(vid).status})

  def _train_version(self, vid: str, parent: str, did: str, aid: str, seed: int,
                     values: Callable[[], Mapping], what: str = "",
                     extra: Sequence[str] = ()) -> Optional[BranchResult]:
    """Trains the recorded version `vid` from `parent` under `values()` ({binding: value})
    and the `extra` bindings (e.g. its own `train.steps`) unless it finished before (its
    stored result) or failed before (None); a training error rejects the version and
    fails its attempt and decision."""
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
          bindings=[*self._gin(values()), *extra], seed=seed,
          workdir=str(self._vdir(vid))),
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
                       "proxy_reward": v.metrics.get("proxy_reward"),
                       "steps": v.metrics.get("steps"), "reason": v.reason,
                       "verdict": v.heldout.get("verdict"),
                       "validators": v.heldout.get("validators", {})})
    wall = self.ledger.get_meta("controller/wall_s", 0.0) + time.time() - self._t0
    return {"mode": "evolve", "wall_s": round(wall, 3), "incumbent": inc and inc.id,
            "generations": self.ledger.get_meta("controller/generation", 0),
            "harness": self.ledger.get_meta("controller/harness"), "versions": versions,
            # Apart from the verdicts: attempts that could not train say nothing (infra.py).
            "infrastructure_failures": infra.failures(self.ledger)}

  def write_summary(self, extra: Optional[Mapping] = None) -> pathlib.Path:
    """summary.json (`summary()` updated with `extra`), and report.html regenerated beside
    it (a report that fails to render is logged, never the end of the run)."""
    from evotrainer.report.test_split import attach_test, gate_power
    path = self.workdir / "summary.json"
    # Test scores join the summary here, after every decision, and nowhere else.
    summary = attach_test({**self.summary(), **(extra or {})}, self.workdir)
    write_json(path, {**summary, "gate": gate_power(self.ledger, self.workdir)})
    try:
      from evotrainer.report import render_report
      render_report(self.workdir, ledger=self.ledger)
    except Exception as e:  # pylint: disable=broad-except
      log.warning("report.html not rendered: %s: %s", type(e).__name__, e)
    return path


__all__ = ["Controller", "DEFAULT_DIAGNOSTICS", "DEFAULT_VALIDATORS", "EvaluationPipelineError",
           "GATES", "GateError", "GateTimeout", "approve_gate", "harness_backtester",
           "is_harness_side", "no_eval_check"]
