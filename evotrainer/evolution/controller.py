"""The evolution controller: the EvoTrainer loop over versions (docs/method.md, docs/design.md).

Per generation (`Controller.run`):
  escalate    after `escalate_after` consecutive rejections: re-validate the evaluation
              pipeline (`eval_check`), switch layer, prefer a subtraction; a second
              escalation on the same incumbent also rolls back to its last good ancestor
  diagnose    the incumbent: active diagnostics over its stored training episodes (or its
              training series when no rollouts are stored) -> findings in the ledger
  propose     hypotheses ("change X, expect Y because Z"), see proposers.py; never a
              change already tried from the incumbent, nor one refuted on an ancestor
              whose value the incumbent still holds (`Proposal.excluded`: negative evidence)
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
              branches mostly failed badly (its subtraction): learning.py
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

This module holds the loop itself (plan, train, summary) and composes the parts
that do the steps, each a class that takes what it needs as arguments:
  results.py            ledger I/O of trained versions: results, values, evidence
  proposal.py           diagnose, propose, backtest, rank (backtest.py: the backtester)
  promotion.py          verify: verdicts, promotion, the continuation's verdict
  learning.py           learned skills
  escalation.py         escalate
  harness_evolution.py  the active harness and its evolution
  gates.py              human gates
Each part's knobs are a frozen dataclass registered with gin (`VerifyConfig.alpha`,
`EscalationConfig.escalate_after`, `HarnessEvolutionConfig.separation`,
`GateConfig.poll_s`, ...); the loop's own (`LoopConfig`) are `evolve.*` knobs (modes/evolve.py).
Their public names are re-exported here.

Resume: everything is in the ledger (plans, results, gate approvals, escalations under
`controller/*` meta keys), so a relaunch with the same ledger continues where it stopped,
never retrains a branch whose attempt finished, and with a fixed seed ends with the same
lineage as an uninterrupted run. The harness components import the records module
(and so JAX) lazily; this module itself does not.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import pathlib
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from evotrainer import infra
from evotrainer.evolution.backtest import harness_backtester, is_harness_side
from evotrainer.evolution.branch_result import BranchResult
from evotrainer.evolution.escalation import (Escalation, EscalationConfig,
                                             EvaluationPipelineError, no_eval_check)
from evotrainer.evolution.gates import (GATES, GateConfig, GateError, GateTimeout, HumanGates,
                                        approve_gate, write_json)
from evotrainer.evolution.harness_evolution import (DEFAULT_DIAGNOSTICS, DEFAULT_VALIDATORS,
                                                    HarnessEvolution, HarnessEvolutionConfig)
from evotrainer.evolution.learning import SkillLearner
from evotrainer.evolution.ledger import ROOT, Ledger, VersionRecord
from evotrainer.evolution.progress import Progress
from evotrainer.evolution.promotion import CONTINUE, CONTROL, Promotion, VerifyConfig
from evotrainer.evolution.proposal import Proposal
from evotrainer.evolution.proposers import Hypothesis
from evotrainer.evolution.results import Results, avg8
from evotrainer.evolution.search_space import SearchSpace, SearchSpaceError
from evotrainer.evolution.skills import AGAINST, SkillError, SkillLibrary
from evotrainer.evolution.stats import score_label
from evotrainer.evolution.trainer import Trainer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Knobs of the loop itself; in a run they are `evolve.*` gin knobs (modes/evolve.py).

  Attributes:
    domain: the domain skill outcomes are recorded under.
    branches: K, branches per generation.
    generations: generations to run (in total, across relaunches).
    seed: the run's seed (proposal order; the branches' common training seed).
    proposer: 'skills' | 'recipe' | 'random' | 'proxy' (proposers.py).
    control: train a control branch per generation (the parent continued unchanged with
      the generation's seed and steps) and credit each change against it.
    continue_steps: RL steps of each generation's continuation (0: none), passed to the
      trainer as `train.steps`.
    continue_keeps_best: the continuation ends on its best validated state, not its last
      (`train.keep_best`): one noisy end point no longer decides what the lineage carries.
    progress: a bar over the trainings and one line per event on the terminal.
    adopt_skills: 0 (off), or N: a new run's root starts from the skills whose effect in
      this domain, pooled over at least N measurements (earlier runs' branches), is
      better beyond noise (`SkillLibrary.proven`), one per binding, largest effect first;
      their trigger findings are not required. What was adopted is recorded in the
      ledger (`controller/adopted`) and carried by every version of the run.
    adopt_against: which measurements `adopt_skills` counts: 'control' (default: effects
      measured against a control branch only) or 'parent' (also those measured against
      the branch's parent, which hold the gain of the branch's steps too).
    adopt_step_gain: with adopt_against='parent', taken off each effect measured against
      the parent before pooling: what the branch's steps gain with the harness unchanged,
      measured on fixed-harness runs of the domain (`bench/step_gain.py`); 0: nothing.
    adopt_discoveries: whether `adopt_skills` also counts the keeps that learned a skill
      (`Skill.selected`: recorded because they were good, so biased upward); False
      (default): only measurements recorded whatever their outcome count.
  """
  domain: str = "math"
  branches: int = 3
  generations: int = 4
  seed: int = 0
  proposer: str = "skills"
  control: bool = True
  continue_steps: int = 0
  continue_keeps_best: bool = False
  progress: bool = False
  adopt_skills: int = 0
  adopt_against: str = "control"
  adopt_step_gain: float = 0.0
  adopt_discoveries: bool = False

  def __post_init__(self):
    gain = self.adopt_step_gain
    if not (isinstance(gain, (int, float)) and math.isfinite(gain) and gain >= 0):
      raise ValueError(f"adopt_step_gain={gain!r}; expected a finite gain "
                       f">= 0 (0: none taken off)")
    if not isinstance(self.adopt_discoveries, bool):
      raise ValueError(f"adopt_discoveries={self.adopt_discoveries!r}; expected True or "
                       f"False")
    if self.adopt_against not in AGAINST:
      raise ValueError(f"adopt_against={self.adopt_against!r}; expected 'control' (effects "
                       f"measured against a control only) or 'parent' (those too)")
    if (self.continue_steps < 0 or self.branches < 1 or self.generations < 0
        or self.adopt_skills < 0):
      raise ValueError(f"continue_steps={self.continue_steps}, branches={self.branches}, "
                       f"generations={self.generations}, adopt_skills={self.adopt_skills}; "
                       f"expected continue_steps >= 0 (0: no continuation), branches >= 1, "
                       f"generations >= 0, adopt_skills >= 0 (0: off)")


def with_knobs(configs: Sequence[Any], knobs: Mapping[str, Any]) -> list:
  """`configs` (frozen dataclasses) with each of `knobs` set in the one that has it."""
  out = list(configs)
  for name, value in knobs.items():
    i = next((i for i, c in enumerate(out)
              if name in {f.name for f in dataclasses.fields(c)}), None)
    if i is None:
      raise TypeError(f"Controller: unknown knob {name}={value!r}; expected a field of "
                      f"{', '.join(type(c).__name__ for c in out)}")
    out[i] = dataclasses.replace(out[i], **{name: value})
  return out


class Controller:
  """Runs the evolution over `ledger` (see the module docstring).

  Args:
    ledger: the run's ledger (all state lives there; a relaunch resumes from it).
    trainer: trains a branch (`Trainer` protocol); idempotent per branch workdir.
    space: the search space (the action boundary).
    skills: the run's skill library (None: no skills; catalog and exploration only).
    workdir: run directory: `versions/<id>/` branch workdirs, `summary.json`, gates.
    values: initial {binding: value} of the space (default: `space.current_values()`).
    validators / diagnostics: active components, instances (default: DEFAULT_VALIDATORS
      / DEFAULT_DIAGNOSTICS from the harness libraries).
    backtester: `(store_root, version, values_before, values_after, iv) -> dict | None`
      with 'passed' (and 'why'); None to skip. Default: `harness_backtester` when
      `harness_builder` is given, else no backtests.
    eval_check: `() -> (ok, why)`, run before training and on escalation (default
      `no_eval_check`; the launcher passes `eval_check.task_eval_check(task)`).
    approve: `(gate: dict) -> bool`, polled at a human gate.
    strict_verify: `(gold, completion) -> bool`, the domain's strict verifier, given to
      validators in the evidence (`strict_verifier_agreement`); None: that validator is
      not applicable.
    loop_config, verify_config, escalation_config, harness_config, gate_config: the
      knobs of the loop and of each part (None: the dataclass's defaults, gin-bound ones
      included).
    **knobs: any field of those dataclasses by name (e.g. `bootstrap_n=500`,
      `branches=2`), set over them.
  """

  def __init__(self, ledger: Ledger, trainer: Trainer, space: SearchSpace,
               skills: Optional[SkillLibrary] = None, *, workdir: str | os.PathLike,
               values: Optional[Mapping] = None, validators: Optional[Sequence] = None,
               diagnostics: Optional[Sequence] = None,
               backtester: Optional[Callable] = None,
               harness_builder: Optional[Callable] = None,
               eval_check: Callable[[], tuple] = no_eval_check,
               approve: Optional[Callable[[dict], bool]] = None,
               strict_verify: Optional[Callable[[str, str], bool]] = None,
               loop_config: Optional[LoopConfig] = None,
               verify_config: Optional[VerifyConfig] = None,
               escalation_config: Optional[EscalationConfig] = None,
               harness_config: Optional[HarnessEvolutionConfig] = None,
               gate_config: Optional[GateConfig] = None, **knobs):
    cfg, verify, esc, harness, gates = with_knobs(
        [loop_config or LoopConfig(), verify_config or VerifyConfig(),
         escalation_config or EscalationConfig(), harness_config or HarnessEvolutionConfig(),
         gate_config or GateConfig()], knobs)
    self.config, self.ledger, self.trainer, self.space = cfg, ledger, trainer, space
    self.skills = skills
    self.workdir = pathlib.Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._initial_values = None if values is None else dict(values)
    self.backtester = backtester or (harness_backtester(harness_builder)
                                     if harness_builder else None)
    self.eval_check = eval_check
    self.progress = Progress(0, enabled=False)
    self.results = Results(ledger, strict_verify)
    self.gates = HumanGates(gates, ledger, self.workdir, approve)
    self.escalation = Escalation(esc, ledger, space, self.results, eval_check)
    self.harness = HarnessEvolution(harness, ledger, self.results, self.progress,
                                    diagnostics, validators)
    self.promotion = Promotion(verify, ledger, self.results, self.harness,
                               SkillLearner(skills, cfg.domain, ledger, verify.learn_skills),
                               self.gates.gate, self.progress, cfg.seed)
    self.proposal = Proposal(ledger, space, skills, self.results, self.backtester,
                             proposer=cfg.proposer, branches=cfg.branches, seed=cfg.seed)
    self._t0 = time.time()
    self._infra_failed: dict = {}  # {version: InfraFailure} of this launch (infra.py)

  # ---------------------------------------------------------------- the loop

  def run(self) -> Optional[VersionRecord]:
    """Runs (or resumes) up to `generations` generations; returns the incumbent."""
    cfg = self.config
    self._t0 = time.time()
    done = sum(1 for v in self.ledger.versions() if "result" in v.metrics
               or v.status != "running")
    per_gen = cfg.branches + (1 if cfg.control else 0) + (1 if cfg.continue_steps else 0)
    self.progress.restart(1 + cfg.generations * per_gen, done, cfg.progress)
    self.harness.ensure()
    self._check_before_training()
    self.ensure_root()
    while True:
      done = self.ledger.get_meta("controller/generation", 0)
      if done >= cfg.generations:
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
    return self._done()

  def _done(self) -> Optional[VersionRecord]:
    """The incumbent, announced."""
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
      self.progress.say(f"generation {gen}/{self.config.generations}: diagnosing incumbent "
                        f"{inc.id} (held-out {score_label(inc.heldout)} "
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
      self.promotion.evaluate(gen, plan, results)
    if not self.ledger.get_meta(f"controller/harness_done/{gen}"):
      self.harness.evolve(gen, plan)
    if self.config.continue_steps and not self.ledger.get_meta(f"controller/continued/{gen}"):
      self._continue(gen)

  def _plan(self, gen: int) -> dict:
    """Generation `gen`'s plan (escalation, diagnosis, hypotheses, backtests), through
    the diagnosis, design and backtest gates."""
    esc = self.escalation.escalate(gen) or {}
    inc = self.ledger.incumbent()
    r = self.results.result(inc.id)
    findings = self.proposal.diagnose(inc, r, self.harness.diagnostics)
    self.ledger.add_findings(inc.id, findings, stage=f"g{gen}")
    self.gates.gate("diagnosis", gen, {"incumbent": inc.id, "findings": [
        {"kind": f.kind, "severity": f.severity, "message": f.message} for f in findings]})
    hyps = self.proposal.hypotheses(gen, inc.id, findings, esc)
    self.gates.gate("design", gen, {"incumbent": inc.id, "hypotheses": [
        h.statement for h in hyps[:2 * self.config.branches]]})
    backtests = {}
    if self.config.proposer == "proxy":
      hyps, backtests = self.proposal.rank_by_proxy(hyps, r, inc.id)
    branches, dropped = self.proposal.select(gen, hyps, r, inc.id, backtests)
    self.gates.gate("backtest", gen, {"branches": [b["hypothesis"]["statement"]
                                                   for b in branches], "dropped": dropped})
    control = ({"version": f"v{gen}.c", "decision": f"g{gen}-control"}
               if self.config.control and branches else None)
    return {"parent": inc.id, "seed": self.train_seed(gen), "branches": branches,
            "control": control, "dropped": dropped, "escalation": esc or None,
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
        self.ledger.add_skill_use(vid, h.skill, did, self.config.domain)
    return self.train_version(vid, parent, did, aid, plan["seed"],
                              lambda: self.space.apply(self.results.values(parent), iv),
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
    return self.train_version(vid, parent, did, aid, plan["seed"],
                              lambda: self.results.values(parent), what="control")

  def _continue(self, gen: int) -> None:
    """Trains the generation's continuation `v<gen>.x` (the incumbent after verification,
    unchanged, `continue_steps` steps, its own seed) and settles it: promoted unless it is
    worse than its parent beyond noise or a validator fails (`Promotion.settle_continuation`)."""
    vid, did = f"v{gen}.x", f"g{gen}-continue"
    aid, steps = f"{vid}/train", self.config.continue_steps
    if not self.ledger.has_version(vid):
      self._record_continuation(vid, did, aid)
    parent = self.ledger.version(vid).parent
    r = self.train_version(vid, parent, did, aid, self.train_seed(gen) + 500,
                           lambda: self.results.values(parent), what="continuation",
                           extra=[f"train.steps = {steps}",
                                  *(["train.keep_best = True"]
                                    if self.config.continue_keeps_best else [])])
    infra.settle_generation(self.ledger, gen, [{"version": vid}], {vid: r},
                            self._infra_failed)
    if r is not None and self.ledger.version(vid).status == "running":
      self.promotion.settle_continuation(gen, vid, did, parent, r)
    self.ledger.set_meta(f"controller/continued/{gen}", {
        "version": vid, "status": self.ledger.version(vid).status})

  def _record_continuation(self, vid: str, did: str, aid: str) -> None:
    """Records the continuation `vid` of the incumbent (version, decision, attempt)."""
    inc = self.ledger.incumbent()
    with self.ledger.transaction():
      self.ledger.add_version(vid, inc.id, bindings={},
                              harness_version=self.ledger.get_meta("controller/harness"))
      self.ledger.add_decision(did, inc.id, intervention=dict(CONTINUE), version_id=vid,
                               hypothesis=f"training {inc.id} unchanged for "
                                          f"{self.config.continue_steps} more steps keeps "
                                          f"improving it",
                               criterion="not worse than the parent beyond noise; "
                                         "validators pass")
      self.ledger.add_attempt(aid, vid, inc.id, CONTINUE["id"])

  def train_version(self, vid: str, parent: str, did: str, aid: str, seed: int,
                    values: Callable[[], Mapping], what: str = "",
                    extra: Sequence[str] = ()) -> Optional[BranchResult]:
    """Trains the recorded version `vid` from `parent` under `values()` ({binding: value})
    and the `extra` bindings (e.g. its own `train.steps`) unless it finished before (its
    stored result) or failed before (None); a training error rejects the version and
    fails its attempt and decision."""
    v = self.ledger.version(vid)
    if "result" in v.metrics:
      return self.results.result(vid)
    if v.status != "running":
      return None  # failed earlier and was rejected
    self.progress.training(vid, f"{what or 'branch'} (from {parent})")
    start = time.time()
    try:
      r = infra.train_with_retry(lambda: self.trainer.train(
          version=vid, parent_checkpoint=self.ledger.version(parent).checkpoint,
          bindings=[*self.results.gin(values()), *extra], seed=seed,
          workdir=str(self._vdir(vid))),
          on_retry=lambda f: self._infra_retry(vid, f))
    except infra.InfraFailure as f:  # not evidence: the version stays untried (infra.py)
      self._infra_failure(vid, did, aid, f)
      return None
    except Exception as e:  # pylint: disable=broad-except  (one branch, not the run)
      self._training_failure(vid, did, aid, e)
      return None
    self.results.store(vid, r, aid)
    self.progress.trained(vid, f"trained in {time.time() - start:.0f}s: held-out "
                               f"{score_label(r.final)} {avg8(r):.4f}")
    return r

  def _infra_failure(self, vid: str, did: str, aid: str, f: "infra.InfraFailure") -> None:
    with self.ledger.transaction():
      self.ledger.finish_attempt(aid, "failed")
      infra.record(self.ledger, vid, f)
      self.ledger.update_decision(did, why=f"not trained: infrastructure failure ({f.kind})")
    self._infra_failed[vid] = f
    self.progress.trained(vid, f"could not train (infrastructure, {f.kind}): "
                               f"{f.message.splitlines()[0][:200]}")

  def _training_failure(self, vid: str, did: str, aid: str, e: Exception) -> None:
    reason = f"training failed: {type(e).__name__}: {str(e)[:300]}"
    with self.ledger.transaction():
      self.ledger.finish_attempt(aid, "failed")
      self.ledger.reject(vid, reason)
      self.ledger.update_decision(did, outcome="failure", why="training failed")
    self.progress.trained(vid, reason.splitlines()[0])

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

  def root_values(self) -> dict:
    """The root's {binding: value}: the given `values`, else the space's current ones."""
    return dict(self._initial_values if self._initial_values is not None
                else self.space.current_values())

  def ensure_root(self, checkpoint: Optional[str] = None, bindings: Sequence[str] = (),
                  reason: str = "root version (the base training)") -> None:
    """Records and trains the root (from the warm start; from `checkpoint` under
    `bindings` when given) and makes it the incumbent when there is none."""
    if not self.ledger.has_version(ROOT):
      values = self.root_values()
      if self.config.adopt_skills and checkpoint is None and not bindings:
        values = self._adopt(values)
      self.ledger.add_version(ROOT, None, bindings=values,
                              harness_version=self.ledger.get_meta("controller/harness"))
    root = self.ledger.version(ROOT)
    adopted = self.ledger.get_meta("controller/adopted") or {}
    if adopted.get("skills"):
      bindings = [*self.results.gin(root.bindings), *bindings]
      reason += f"; adopted skills: {', '.join(adopted['skills'])}"
    if "result" not in root.metrics:
      self._train_root(checkpoint, bindings)
    if self.ledger.get_meta("incumbent") is None and root.status == "running":
      self.ledger.promote(ROOT, reason=reason)

  def _adopt(self, values: dict) -> dict:
    """`values` with the proven skills applied (LoopConfig.adopt_skills), one per
    binding; records what was adopted, and the values it replaced, in the ledger."""
    base, names = {}, []
    for s in self._proven():
      try:
        iv = s.instantiate(values, None, self.space)
      except (SkillError, SearchSpaceError):
        continue  # outside this space
      if iv is None or iv.binding in base:
        continue
      base[iv.binding] = values[iv.binding]
      values = self.space.apply(values, iv)
      names.append(s.name)
      self.progress.say(f"adopting skill {s.name}: {iv.description}")
    self.ledger.set_meta("controller/adopted", {"skills": names, "base": base})
    return values

  def _proven(self) -> list:
    """The skills `_adopt` applies (LoopConfig.adopt_skills, adopt_against,
    adopt_step_gain, adopt_discoveries); says when the pool holds none proven so, but
    some once the measurements against their parent or the discoveries count."""
    if self.skills is None:
      return []
    cfg = self.config
    against = ("control",) if cfg.adopt_against == "control" else AGAINST
    proven = functools.partial(self.skills.proven, cfg.domain, cfg.adopt_skills)
    chosen = proven(against, cfg.adopt_step_gain, cfg.adopt_discoveries)
    if not chosen and against != AGAINST and proven(AGAINST, 0.0, cfg.adopt_discoveries):
      self.progress.say("adopting no skill: none is proven against a control; some are "
                        "against their parent only (evolve.adopt_against = 'parent' "
                        "counts those)")
    if not chosen and not cfg.adopt_discoveries and proven(against, cfg.adopt_step_gain,
                                                           True):
      self.progress.say("adopting no skill: none is proven by measurements recorded "
                        "whatever their outcome; some are once the keeps that learned them "
                        "count (evolve.adopt_discoveries = True counts those, biased up)")
    return chosen

  def _train_root(self, checkpoint: Optional[str], bindings: Sequence[str]) -> None:
    self.progress.training(ROOT, "the root" + (f" from {checkpoint}" if checkpoint else ""))
    start = time.time()
    try:
      r = infra.train_with_retry(lambda: self.trainer.train(
          version=ROOT, parent_checkpoint=checkpoint, bindings=list(bindings),
          seed=self.train_seed(0), workdir=str(self._vdir(ROOT))),
          on_retry=lambda f: self._infra_retry(ROOT, f))
    except infra.InfraFailure as f:
      infra.record(self.ledger, ROOT, f)
      raise infra.InfrastructureError(f"the root version could not train: {f}; fix the "
                                      f"cause and relaunch the same command") from f
    self.results.store(ROOT, r)
    self.progress.trained(ROOT, f"trained in {time.time() - start:.0f}s: held-out "
                                f"{score_label(r.final)} {avg8(r):.4f}")

  # ---------------------------------------------------------------- helpers

  def _infra_retry(self, vid: str, f: "infra.InfraFailure") -> None:
    infra.record(self.ledger, vid, f)
    self.progress.say(f"{vid}: infrastructure failure ({f.kind}), retrying once: "
                      f"{f.message.splitlines()[0][:200]}")

  def _vdir(self, vid: str) -> pathlib.Path:
    return self.workdir / "versions" / vid

  def train_seed(self, gen: int) -> int:
    """The training seed of generation `gen`: the same for each of its branches (CRN)."""
    return self.config.seed * 1000 + gen

  # ---------------------------------------------------------------- summary

  def summary(self) -> dict:
    """The run's summary: every version with its change, score, verdict and reason."""
    changes = {d.version_id: d.intervention.get("description", "")
               for d in self.ledger.decisions() if d.version_id}
    inc = self.ledger.incumbent()
    versions = [_summary_version(v, changes) for v in self.ledger.versions()]
    wall = self.ledger.get_meta("controller/wall_s", 0.0) + time.time() - self._t0
    return {"mode": "evolve", "wall_s": round(wall, 3), "incumbent": inc and inc.id,
            "generations": self.ledger.get_meta("controller/generation", 0),
            "harness": self.ledger.get_meta("controller/harness"), "versions": versions,
            # Apart from the verdicts: attempts that could not train say nothing (infra.py).
            "infrastructure_failures": infra.failures(self.ledger)}

  def write_summary(self, extra: Optional[Mapping] = None) -> pathlib.Path:
    """summary.json (`summary()` updated with `extra`), and report.html regenerated beside
    it (a report that fails to render is logged, never the end of the run)."""
    from evotrainer.eval.test_scores import attach_test, gate_power
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


def _summary_version(v: VersionRecord, changes: Mapping) -> dict:
  """One version's row of summary.json."""
  a = v.heldout.get("avg8")
  return {"id": v.id, "parent": v.parent, "status": v.status,
          "intervention": changes.get(v.id, "(root)" if v.parent is None else ""),
          "heldout_avg8": None if a is None or (isinstance(a, float) and math.isnan(a)) else a,
          "proxy_reward": v.metrics.get("proxy_reward"),
          "steps": v.metrics.get("steps"), "reason": v.reason,
          "verdict": v.heldout.get("verdict"),
          "validators": v.heldout.get("validators", {})}


__all__ = ["Controller", "DEFAULT_DIAGNOSTICS", "DEFAULT_VALIDATORS", "EscalationConfig",
           "EvaluationPipelineError", "GATES", "GateConfig", "GateError", "GateTimeout",
           "HarnessEvolutionConfig", "LoopConfig", "VerifyConfig", "approve_gate",
           "harness_backtester", "is_harness_side", "no_eval_check", "with_knobs"]
