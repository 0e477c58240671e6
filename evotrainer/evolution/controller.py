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

Resume: everything is in the ledger (plans, results, gate approvals, escalations under
`controller/*` meta keys), so a relaunch with the same ledger continues where it stopped,
never retrains a branch whose attempt finished, and with a fixed seed ends with the same
lineage as an uninterrupted run. The harness components import the records module
(and so JAX) lazily; this module itself does not.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import random
import re
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from evotrainer.evolution.ledger import GOOD, Ledger, VersionRecord
from evotrainer.evolution.proposers import Hypothesis, propose
from evotrainer.evolution.search_space import (Intervention, SearchSpace, canonical,
                                               format_value)
from evotrainer.evolution.skills import Skill, SkillError, SkillLibrary, template_of
from evotrainer.evolution.stats import paired_bootstrap
from evotrainer.evolution.trainer import BranchResult, Trainer

log = logging.getLogger(__name__)

ROOT = "v0"
GATES = ("diagnosis", "design", "backtest", "verification")
HARNESS_GROUPS = ("reward", "filter", "harness", "estimator")
HARNESS_PREFIXES = ("RewardComposer.", "Harness.")
DEFAULT_DIAGNOSTICS = ("bc", "reward", "score_trend", "dead_group_ratio", "entropy",
                       "truncation")
DEFAULT_VALIDATORS = ("proxy_true_disagreement", "exploit_probe")
_CATEGORY = {"reward": "reward design", "filter": "filter mechanism",
             "harness": "filter mechanism"}


class EvaluationPipelineError(RuntimeError):
  """The evaluation pipeline failed its re-validation during an escalation."""


class GateTimeout(TimeoutError):
  """A human gate was not approved within `gate_timeout_s`."""


class GateError(RuntimeError):
  """No gate is waiting for an approval in the given run directory."""


def approve_gate(workdir: str | os.PathLike) -> str:
  """Approves the gate a human-gated run in `workdir` waits at (`--approve`): writes the
  `approve` file the controller polls for; returns what was approved."""
  gate_path, flag = pathlib.Path(workdir) / "gate.json", pathlib.Path(workdir) / "approve"
  if not gate_path.exists():
    raise GateError(f"no gate is waiting in {workdir} (no gate.json)")
  try:
    gate = json.loads(gate_path.read_text())
  except (OSError, ValueError) as e:
    raise GateError(f"{gate_path} is unreadable: {e}") from None
  flag.write_text(json.dumps({"approved_at": time.time()}) + "\n")
  return (f"approved gate '{gate.get('stage')}' of generation {gate.get('generation')} in "
          f"{workdir}")


def no_eval_check() -> tuple[bool, str]:
  """The default `eval_check`: passes without checking anything.

  A real check (per domain) should return (ok, why) after verifying that: the verifier
  accepts known-correct answers and refuses known-wrong ones (canaries, perturbed golds);
  the training and held-out splits are disjoint (task ids and normalized prompts); and a
  repeated evaluation of the same checkpoint with the same seed gives the same scores.
  """
  return True, "no evaluation check configured (default no-op)"


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
            "violations", "correct", "cut", "correct_cut", "correct_newly_cut")
    return {"passed": not why, "why": "; ".join(why) or "criterion met",
            **{k: t[k] for k in keep}}

  return run


def _config(obj: Any) -> dict:
  """The scalar public attributes of a component: its recorded configuration."""
  out = {"class": type(obj).__name__}
  for k, v in sorted(vars(obj).items()):
    if not k.startswith("_") and isinstance(v, (bool, int, float, str)) and not (
        isinstance(v, float) and math.isnan(v)):
      out[k] = v
  return out


def _avg8(r: BranchResult) -> float:
  if "avg8" in r.final:
    return float(r.final["avg8"])
  vals = list(r.per_problem.values())
  return float(sum(vals) / len(vals)) if vals else math.nan


def _proxy(r: BranchResult) -> Optional[float]:
  rew = r.series.get("reward") or []
  return float(rew[-1]) if rew else r.final.get("reward")


def _write_json(path: pathlib.Path, data: Any) -> None:
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
  os.replace(tmp, path)


class Controller:
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
               gate_timeout_s: Optional[float] = None, learn_skills: bool = True):
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
    self.human_gated, self.approve = human_gated, approve
    self.poll_s, self.gate_timeout_s, self.learn_skills = poll_s, gate_timeout_s, learn_skills
    self._given = {"validators": validators, "diagnostics": diagnostics}
    self._validators: list = []
    self._diagnostics: list = []
    self._t0 = time.time()

  # ---------------------------------------------------------------- the loop

  def run(self) -> Optional[VersionRecord]:
    """Runs (or resumes) up to `generations` generations; returns the incumbent."""
    self._t0 = time.time()
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
    return self.ledger.incumbent()

  def _generation(self, gen: int) -> None:
    plan = self.ledger.get_meta(f"controller/plan/{gen}")
    if plan is None:
      plan = self._plan(gen)
      self.ledger.set_meta(f"controller/plan/{gen}", plan)
    results = {b["version"]: self._train(b, plan) for b in plan["branches"]}
    if not self.ledger.get_meta(f"controller/evaluated/{gen}"):
      self._evaluate(gen, plan, results)
    if not self.ledger.get_meta(f"controller/harness_done/{gen}"):
      self._evolve_harness(gen, plan)

  # ---------------------------------------------------------------- setup

  def _ensure_harness(self) -> None:
    from evotrainer.harness.diagnostics import DIAGNOSTICS
    from evotrainer.harness.validators import VALIDATORS
    given_d = self._given["diagnostics"]
    given_v = self._given["validators"]
    if given_d is None:
      given_d = [DIAGNOSTICS[n]() for n in DEFAULT_DIAGNOSTICS]
    if given_v is None:
      given_v = [VALIDATORS[n]() for n in DEFAULT_VALIDATORS]
    hid = self.ledger.get_meta("controller/harness")
    if hid is None:
      self.ledger.add_harness_version("h0", {d.name: _config(d) for d in given_d},
                                      {v.name: _config(v) for v in given_v},
                                      reason="initial harness")
      self.ledger.set_meta("controller/harness", "h0")
      self._diagnostics, self._validators = list(given_d), list(given_v)
      return
    rec = self.ledger.harness_version(hid)  # rebuild: given instances, else library defaults
    by_d, by_v = {d.name: d for d in given_d}, {v.name: v for v in given_v}
    self._diagnostics = [by_d.get(n) or DIAGNOSTICS[n]() for n in rec.diagnostics]
    self._validators = [by_v.get(n) or VALIDATORS[n]() for n in rec.validators]

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
      r = self.trainer.train(version=ROOT, parent_checkpoint=checkpoint,
                             bindings=list(bindings), seed=self._train_seed(0),
                             workdir=str(self._vdir(ROOT)))
      self._store_result(ROOT, r)
    if self.ledger.get_meta("incumbent") is None and root.status == "running":
      self.ledger.promote(ROOT, reason=reason)

  # ---------------------------------------------------------------- helpers

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

  def _group(self, iv: Intervention) -> str:
    try:
      return self.space.knob_for(iv).group
    except Exception:  # pylint: disable=broad-except  (a decision from an older space)
      return ""

  # ---------------------------------------------------------------- gates

  def _gate(self, stage: str, gen: int, payload: Mapping) -> None:
    """Human-gated mode: write gate.json and wait for approval (file or callable)."""
    if not self.human_gated:
      return
    key = f"controller/gate/{gen}/{stage}"
    if self.ledger.get_meta(key):
      return
    gate = {"stage": stage, "generation": gen, "awaiting": payload,
            "approve": f"python -m evotrainer.launch --workdir={self.workdir} --approve "
                       f"(or create {self.workdir / 'approve'})"}
    path, flag = self.workdir / "gate.json", self.workdir / "approve"
    _write_json(path, gate)
    print(f"[evotrainer] human gate '{stage}' (generation {gen}) waits; see {path}; "
          f"approve: {gate['approve']}", flush=True)
    start = time.time()
    while True:
      if flag.exists():
        flag.unlink()
        break
      if self.approve is not None and self.approve(gate):
        break
      if self.gate_timeout_s is not None and time.time() - start > self.gate_timeout_s:
        raise GateTimeout(f"gate {stage} of generation {gen} not approved within "
                          f"{self.gate_timeout_s}s (see {path})")
      time.sleep(self.poll_s)
    self.ledger.set_meta(key, {"approved": True})
    path.unlink(missing_ok=True)

  # ---------------------------------------------------------------- plan

  def _escalate(self, gen: int) -> Optional[dict]:
    """Escalation after `escalate_after` consecutive rejections (stored per generation)."""
    key = f"controller/escalation/{gen}"
    stored = self.ledger.get_meta(key)
    if stored is not None:
      return stored or None
    n = self.ledger.consecutive_rejections()
    if n < self.escalate_after:
      self.ledger.set_meta(key, {})
      return None
    inc = self.ledger.incumbent()
    ok, why = self.eval_check()
    failed = [d for d in self.ledger.decisions(parent=inc.id) if d.outcome == "failure"]
    avoid = sorted({self._group(Intervention.from_dict(d.intervention)) for d in failed
                    if "binding" in d.intervention} - {""})
    actions = [f"re-validated the evaluation pipeline: {'ok' if ok else 'FAILED'}: {why}",
               f"switch layer: interventions on {avoid or 'other groups'} come last",
               "prefer a subtraction (remove / revert) first"]
    rollback = None
    if ok and n >= 2 * self.escalate_after:
      back = next((a for a in self.ledger.lineage(inc.id)[1:] if a.status in GOOD), None)
      if back is not None:
        rollback = back.id
        actions.append(f"rolled back from {inc.id} to the last good version {back.id}")
    did = f"g{gen}-escalation"
    esc = {"decision": did, "rejections": n, "avoid_groups": avoid,
           "prefer_subtraction": True, "rollback": rollback, "eval_ok": ok}
    with self.ledger.transaction():
      self.ledger.add_decision(
          did, inc.id, intervention={"escalation": actions, "avoid_groups": avoid},
          hypothesis=f"escalation: {n} consecutive rejections on {inc.id}; the bottleneck "
                     f"is elsewhere than the last changes assumed",
          criterion="the next generation keeps a version")
      self.ledger.update_decision(did, outcome="partial" if ok else "failure",
                                  why="; ".join(actions))
      if rollback:
        self.ledger.set_incumbent(rollback)
      self.ledger.set_meta(key, esc)
    if not ok:
      raise EvaluationPipelineError(f"escalation at generation {gen}: the evaluation "
                                    f"pipeline failed its re-validation: {why}")
    return esc

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
                               lambda: self.space.apply(self.values(parent), iv))

  def _train_version(self, vid: str, parent: str, did: str, aid: str, seed: int,
                     values: Callable[[], Mapping]) -> Optional[BranchResult]:
    """Trains the recorded version `vid` from `parent` under `values()` ({binding: value})
    unless it finished before (its stored result) or failed before (None); a training
    error rejects the version and fails its attempt and decision."""
    v = self.ledger.version(vid)
    if "result" in v.metrics:
      return self.result(vid)
    if v.status != "running":
      return None  # failed earlier and was rejected
    try:
      r = self.trainer.train(version=vid, parent_checkpoint=self.ledger.version(parent).checkpoint,
                             bindings=self._gin(values()), seed=seed,
                             workdir=str(self._vdir(vid)))
    except Exception as e:  # pylint: disable=broad-except  (one branch, not the run)
      with self.ledger.transaction():
        self.ledger.finish_attempt(aid, "failed")
        self.ledger.reject(vid, f"training failed: {type(e).__name__}: {str(e)[:300]}")
        self.ledger.update_decision(did, outcome="failure", why="training failed")
      return None
    self._store_result(vid, r, aid)
    return r

  # ---------------------------------------------------------------- verify

  def _judge(self, vid: str, r: BranchResult, parent: str, seed: int,
             parent_evidence: Any = None) -> dict:
    """Verification of `vid` against `parent`: the paired-bootstrap difference of held-out
    scores with its interval (stored on the version: its noise estimate) and every active
    validator's verdict ('failed': those that did not pass)."""
    from evotrainer.harness.validators import run_validators
    pres = self.result(parent)
    diff, lo, hi = paired_bootstrap(r.per_problem, pres.per_problem, n=self.bootstrap_n,
                                    seed=seed, alpha=self.alpha)
    pev = parent_evidence if parent_evidence is not None else self.evidence(parent)
    verdicts = run_validators(self._validators, self.evidence(vid, pev))
    self.ledger.update_version(vid, heldout={
        **self.ledger.version(vid).heldout, "noise": (hi - lo) / 2, "diff": diff,
        "lo": lo, "hi": hi})
    return {"version": vid, "avg8": _avg8(r), "proxy": _proxy(r), "diff": diff, "lo": lo,
            "hi": hi, "verdicts": verdicts, "failed": [v for v in verdicts if not v.passed]}

  def _ci(self, x: Mapping, parent: str) -> str:
    return (f"avg8 {x['diff']:+.4f}, {100 * (1 - self.alpha):.0f}% CI [{x['lo']:+.4f}, "
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
    passing = [x for x in rows if not x["failed"] and x["lo"] > 0]
    best = max(passing, key=lambda x: (x["avg8"], x["diff"], -x["order"]), default=None)
    self._gate("verification", gen, {"parent": parent, "promote": best and best["version"],
                                     "branches": [{k: x[k] for k in ("version", "avg8", "diff",
                                                                     "lo", "hi")}
                                                  | {"failed": [v.validator for v in x["failed"]]}
                                                  for x in rows]})
    outcomes = {}
    for x in rows:
      ci = self._ci(x, parent)
      if x["failed"]:
        reason, outcome = self._validator_rejection(x, ci), "failure"
      elif x is best:
        reason, outcome = f"kept: beats {parent} beyond noise ({ci}); validators pass", "success"
      elif x["lo"] > 0:
        reason, outcome = f"beats {parent} beyond noise ({ci}) but {best['version']} is " \
                          f"better", "partial"
      else:
        reason, outcome = f"not beyond noise: {ci}", "failure"
      outcomes[x["version"]] = (reason, outcome)
    # Skill files first (idempotent per version), then the ledger in one transaction.
    for x in rows:
      h = Hypothesis.from_dict(x["branch"]["hypothesis"])
      success = outcomes[x["version"]][1] == "success"
      if h.skill and self.skills is not None and h.skill in self.skills:
        self.skills.record_outcome(h.skill, self.domain, success, version=x["version"])
      elif success and self.learn_skills and self.skills is not None and h.finding:
        self._learn_skill(h, x["version"])
    with self.ledger.transaction():
      for x in sorted(rows, key=lambda x: x is best):  # rejections before the promotion
        reason, outcome = outcomes[x["version"]]
        h = Hypothesis.from_dict(x["branch"]["hypothesis"])
        self.ledger.update_decision(x["branch"]["decision"], outcome=outcome, why=reason)
        if h.skill:
          self.ledger.set_skill_outcome(x["version"], h.skill, outcome)
        if x is best:
          self.ledger.promote(x["version"], reason)
        else:
          self.ledger.reject(x["version"], reason)
      self.ledger.set_meta(f"controller/evaluated/{gen}",
                           {"promoted": best and best["version"]})

  def _learn_skill(self, h: Hypothesis, vid: str) -> None:
    iv = h.intervention
    name = "learned-" + re.sub(r"[^a-z0-9]+", "-",
                               f"{h.finding}-{iv.binding}-{iv.kind}-{iv.key or ''}".lower()
                               ).strip("-")
    try:
      if name not in self.skills:
        self.skills.add(Skill(
            name=name, category=_CATEGORY.get(h.group, "training stability"),
            description=f"learned on {vid}: {iv.description} when {h.finding} fired",
            trigger={"finding": h.finding}, intervention=template_of(iv),
            expected_outcome=h.statement, validation_criterion=h.criterion,
            source="learned"))
      self.skills.record_outcome(name, self.domain, True, version=vid)
    except SkillError:
      pass  # a template the skill language cannot express (e.g. a whole-list value)

  # ---------------------------------------------------------------- harness evolution

  def _gaps(self, gen: int, plan: Mapping) -> list:
    gaps = []
    quiet = 0
    for g in range(gen, 0, -1):
      if (self.ledger.get_meta(f"controller/evaluated/{g}") or {}).get("promoted"):
        break
      quiet += 1
    last = self.ledger.get_meta("controller/harness_changed_gen", 0)
    if quiet >= self.gap_generations and gen - last >= self.gap_generations:
      gaps.append(f"score insufficient: {quiet} generations without a kept version")
    for b in plan["branches"]:
      v = self.ledger.version(b["version"])
      h = v.heldout if v is not None else {}
      if "lo" in h and (h["lo"] > 0 or h["hi"] < 0):  # a change beyond noise
        moved = self._moved(self._diagnostics, v.id, plan["parent"])
        if moved is not None and not moved:
          gaps.append(f"score change unexplained on {v.id}: held-out {h['diff']:+.4f} "
                      f"beyond noise, and no active metric moved by more than "
                      f"{self.explain_tol:.0%} from {plan['parent']}")
          break
    from evotrainer.harness.validators import ProxyTrueDisagreement
    probe = ProxyTrueDisagreement()
    inc = self.ledger.incumbent()
    ids = [b["version"] for b in plan["branches"]] + ([inc.id] if inc else [])
    for vid in ids:
      if self.result(vid) is not None:
        v = probe(self.evidence(vid))
        if not v.passed:
          gaps.append(f"signal ambiguous on {vid}: {v.reason}")
          break
    return gaps

  def _train_metrics(self, diags: Sequence, vid: str) -> dict:
    """The diagnostics' metrics over version `vid`'s stored training episodes ({}: none)."""
    from evotrainer.harness.diagnostics import run_diagnostics
    r = self.result(vid)
    eps = self._episodes(vid, r, "train")
    if not eps:
      return {}
    metrics, _ = run_diagnostics(list(diags), eps, {"heldout": r.final, "series": r.series})
    return {k: v for k, v in metrics.items() if not math.isnan(v)}

  def _moved(self, diags: Sequence, vid: str, parent: str) -> Optional[list]:
    """The metrics of `diags` that moved from `parent` to `vid` by more than
    `explain_tol` (relative to the larger magnitude); None when either has no episodes."""
    a, b = self._train_metrics(diags, vid), self._train_metrics(diags, parent)
    if not a or not b:
      return None
    return sorted(k for k in a.keys() & b.keys()
                  if abs(a[k] - b[k]) > self.explain_tol * max(abs(a[k]), abs(b[k]), 1e-9))

  def _separates(self, diag, kept: list, rejected: list) -> Optional[float]:
    """Standardized |mean(kept) - mean(rejected)| of a diagnostic's metric (None: no data)."""
    from evotrainer.harness.diagnostics import run_diagnostics
    vals = {}
    for vid in kept + rejected:
      r = self.result(vid)
      eps = self._episodes(vid, r, "train")
      if not eps:
        continue
      metrics, _ = run_diagnostics([diag], eps, {"heldout": r.final, "series": r.series})
      if diag.name in metrics and not math.isnan(metrics[diag.name]):
        vals[vid] = metrics[diag.name]
    a = [vals[v] for v in kept if v in vals]
    b = [vals[v] for v in rejected if v in vals]
    if not a or not b:
      return None
    allv = a + b
    mean = sum(allv) / len(allv)
    sd = math.sqrt(sum((x - mean) ** 2 for x in allv) / len(allv)) or 1e-12
    return abs(sum(a) / len(a) - sum(b) / len(b)) / sd

  def _evolve_harness(self, gen: int, plan: Mapping) -> None:
    from evotrainer.harness.diagnostics import DIAGNOSTICS
    from evotrainer.harness.validators import VALIDATORS, run_validators
    gaps = self._gaps(gen, plan)
    added_d, added_v, notes = [], [], []
    if gaps:
      active_d = {d.name for d in self._diagnostics}
      active_v = {v.name for v in self._validators}
      decided = [v for v in self.ledger.versions() if v.id != ROOT]
      kept = [v.id for v in decided if v.status in GOOD]
      rejected = [v.id for v in decided if v.status == "rejected"]
      for name, cls in DIAGNOSTICS.items():
        if name in active_d or name == "domain":
          continue
        sep = self._separates(cls(), kept, rejected)
        if sep is not None and sep > self.separation:
          added_d.append(cls())
          notes.append(f"diagnostic {name} separates kept from rejected (d={sep:.2f})")
      for g in gaps:  # diagnostics that explain a score change the active ones miss
        m = re.match(r"score change unexplained on (\S+):", g)
        if not m:
          continue
        for name, cls in DIAGNOSTICS.items():
          if name in active_d or name == "domain" or any(d.name == name for d in added_d):
            continue
          if self._moved([cls()], m.group(1), plan["parent"]):
            added_d.append(cls())
            notes.append(f"diagnostic {name} moved with the unexplained score change of "
                         f"{m.group(1)}")
      if any(g.startswith("signal ambiguous") for g in gaps) and \
          "proxy_true_disagreement" not in active_v:
        added_v.append(VALIDATORS["proxy_true_disagreement"]())
        notes.append("validator proxy_true_disagreement: a proxy rises while BC does not")
    with self.ledger.transaction():
      if added_d or added_v:
        cur = self.ledger.get_meta("controller/harness")
        hid = f"h{len(self.ledger.harness_versions())}"
        self._diagnostics += added_d
        self._validators += added_v
        self.ledger.add_harness_version(
            hid, {d.name: _config(d) for d in self._diagnostics},
            {v.name: _config(v) for v in self._validators}, parent=cur,
            reason="; ".join(gaps + notes))
        self.ledger.set_meta("controller/harness", hid)
        self.ledger.set_meta("controller/harness_changed_gen", gen)
        if added_v:
          self._recheck(hid, added_v, run_validators)
      elif gaps:
        self.ledger.set_meta("controller/harness_changed_gen", gen)  # looked; nothing new
      self.ledger.set_meta(f"controller/harness_done/{gen}", {"gaps": gaps, "notes": notes})

  def _recheck(self, hid: str, validators: list, run_validators: Callable) -> None:
    """Re-checks every kept version (the root aside) under new validators; demotes the
    ones that fail and prunes their kept descendants; the incumbent rolls back."""
    demoted = []
    for v in self.ledger.versions():
      if v.id == ROOT or v.status not in GOOD:
        continue
      parent = self.evidence(v.parent) if v.parent else None
      failed = [x for x in run_validators(validators, self.evidence(v.id, parent))
                if not x.passed]
      if failed:
        self.ledger.set_status(v.id, "rejected",
                               f"demoted under harness {hid}: validator "
                               f"{failed[0].validator}: {failed[0].reason}")
        demoted.append(v.id)
    for v in self.ledger.versions():
      if v.status in GOOD and any(a.id in demoted for a in self.ledger.lineage(v.id)[1:]):
        self.ledger.set_status(v.id, "pruned", f"descends from demoted "
                               f"{next(a.id for a in self.ledger.lineage(v.id) if a.id in demoted)}")
    inc = self.ledger.incumbent()
    if inc is None or inc.status not in GOOD:
      back = next((a.id for a in (self.ledger.lineage(inc.id) if inc else [])
                   if a.status in GOOD), ROOT)
      self.ledger.set_incumbent(back)

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
                       "proxy_reward": v.metrics.get("proxy_reward"), "reason": v.reason})
    wall = self.ledger.get_meta("controller/wall_s", 0.0) + time.time() - self._t0
    return {"mode": "evolve", "wall_s": round(wall, 3), "incumbent": inc and inc.id,
            "generations": self.ledger.get_meta("controller/generation", 0),
            "harness": self.ledger.get_meta("controller/harness"), "versions": versions}

  def write_summary(self, extra: Optional[Mapping] = None) -> pathlib.Path:
    """summary.json (`summary()` updated with `extra`), and report.html regenerated beside
    it (a report that fails to render is logged, never the end of the run)."""
    path = self.workdir / "summary.json"
    _write_json(path, {**self.summary(), **(extra or {})})
    try:
      from evotrainer.report import render_report
      render_report(self.workdir, ledger=self.ledger)
    except Exception as e:  # pylint: disable=broad-except
      log.warning("report.html not rendered: %s: %s", type(e).__name__, e)
    return path


__all__ = ["Controller", "DEFAULT_DIAGNOSTICS", "DEFAULT_VALIDATORS", "EvaluationPipelineError",
           "GATES", "GateError", "GateTimeout", "approve_gate", "harness_backtester",
           "is_harness_side", "no_eval_check"]
