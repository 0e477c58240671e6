"""The verify step of the evolution loop (`Promotion`, a part the Controller composes).

Each branch of a generation is compared with its parent on the same validation problems
under the same sampling keys (a paired bootstrap, stats.py), and with the generation's
control branch (the parent continued unchanged, same seed and steps) when there is one:
a change is credited against continuing, not against standing still. A branch is kept
when it beats its reference (the control, else the parent) beyond noise after Holm's
correction over the generation's branches, is not below the parent, and passes every
active validator; the best such branch becomes the incumbent. With
`VerifyConfig.keep_on = 'mean'` a branch needs only a higher validation mean than its
reference (and the parent), and with `'not_worse'` a mean at least as high (a tie too):
its steps already trained the lineage further, so without evidence that it is worse it
is not thrown away; with `'unless_worse'` any branch not worse beyond noise is kept (a
single branch without a control is its parent trained further plus a change: rejecting
it for a loss inside the noise throws away steps the static harness keeps); validators
still veto, and such a keep counts as no skill success (its evidence is within noise):
it records its measured effect, which skills pool across runs (`Skill.effect`). A branch
whose per-problem results equal the control's is inert: its knob never acted. When no
change is kept and the control beats the parent beyond noise, the control (continued
training) is promoted; otherwise it is pruned. Each outcome is one verdict
(`Promotion._verdict`) with its reason; a collapsed branch and a branch whose training
drifted (the active `training_drift` diagnostic over its own series) get their findings
at stage 'verify'.
Kept changes that no skill proposed become skills (learning.py). With
`relative_health` the health validators stop vetoing what the change did not cause
(`_waive_health`): a failure its control shares, or any failure of a version that
changed nothing (control, continuation); integrity validators always veto.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import gin

from evotrainer.evolution.harness_evolution import HarnessEvolution
from evotrainer.evolution.learning import SkillLearner, own_change
from evotrainer.evolution.progress import Progress
from evotrainer.evolution.proposers import Hypothesis
from evotrainer.evolution.results import Results, avg8, proxy_reward
from evotrainer.evolution.stats import holm, paired_test, score_label
from evotrainer.evolution.branch_result import BranchResult

# The decision record's intervention of a generation's control branch.
CONTROL = {"id": "control", "control": True,
           "description": "control: the parent continued unchanged"}

# The decision record's intervention of a generation's continuation (controller.py).
CONTINUE = {"id": "continue", "continuation": True,
            "description": "continuation: the incumbent trained further unchanged"}

# What a branch must beat its reference by to be kept (`VerifyConfig.keep_on`).
KEEP_ON = ("beyond_noise", "mean", "not_worse", "unless_worse")

# Verdicts that refute a change (`_verdict`): the controller never proposes it again
# from a descendant that still holds the value it changed (proposal.excluded).
REFUTED = ("validator", "collapsed", "worse_beyond_noise")


@gin.configurable(module="evolution", denylist=["relative_health"])
@dataclasses.dataclass(frozen=True)
class VerifyConfig:
  """Knobs of verification and learning (gin: `VerifyConfig.alpha = 0.05`, ...).

  Attributes:
    alpha: the paired bootstrap's level (two-sided interval; Holm at `alpha / 2`).
    bootstrap_n: the paired bootstrap's resamples.
    collapse_fraction: a branch worse beyond noise whose validation avg8 is below this
      share of its parent's is reported as collapsed (not just worse).
    learn_skills: write a skill when a non-skill intervention is kept (and a
      subtraction skill for an unstable incumbent's change).
    relative_health: health validators (`kind = "health"`: training_stability,
      canary_prompts) veto a change only when its control did not fail them too, and
      never veto a control or continuation; False: every failed validator vetoes. Set
      by `evolve.relative_health`.
    keep_on: what a branch must beat its reference (the control, else the parent) by:
      'beyond_noise' (the paired interval above 0 after Holm's correction), 'mean'
      (a higher validation mean; for budgets whose validation split cannot separate the
      differences RL steps make, where rejecting a branch discards its steps) or
      'not_worse' (a mean at least as high: a tie keeps the branch's steps too) or
      'unless_worse' (not worse beyond noise: the interval's upper end at least 0). A
      kept branch is never below the parent ('not_worse': never below it either, a tie
      allowed; 'unless_worse': never below it beyond noise) and passes every validator.
  """
  alpha: float = 0.05
  bootstrap_n: int = 2000
  collapse_fraction: float = 0.5
  learn_skills: bool = True
  relative_health: bool = False
  keep_on: str = "beyond_noise"

  def __post_init__(self):
    if self.keep_on not in KEEP_ON:
      raise ValueError(f"VerifyConfig.keep_on={self.keep_on!r}; expected one of {KEEP_ON}")
    if not 0 < self.alpha < 1:
      raise ValueError(f"VerifyConfig.alpha={self.alpha}; expected a level in (0, 1)")
    if self.bootstrap_n < 1:
      raise ValueError(f"VerifyConfig.bootstrap_n={self.bootstrap_n}; expected >= 1")
    if self.collapse_fraction < 0:
      raise ValueError(f"VerifyConfig.collapse_fraction={self.collapse_fraction}; "
                       f"expected >= 0")


def ci_label(x: Mapping, parent: str, alpha: float) -> str:
  """'avg8 +0.1000, 95% CI [+0.0500, +0.1500] vs v0': a comparison and its interval."""
  return (f"{x.get('label', 'avg8')} {x['diff']:+.4f}, {100 * (1 - alpha):.0f}% CI "
          f"[{x['lo']:+.4f}, {x['hi']:+.4f}] vs {parent}")


def validator_rejection(x: Mapping, ci: str) -> str:
  """'rejected by validator A, B: <A's reason>; <B's reason> (ci)': every failed
  validator is named, each with its own evidence."""
  names = ", ".join(v.validator for v in x["failed"])
  reasons = "; ".join(v.reason for v in x["failed"])
  return f"rejected by validator {names}: {reasons} ({ci})"


def waived_note(x: Mapping) -> str:
  """'; health validator A failed, not a veto (changed nothing | its control failed
  it too): <A's reason>' for each waived verdict, '' when none."""
  if not x.get("waived"):
    return ""
  why = "changed nothing" if x.get("changeless") else "its control failed it too"
  return "".join(f"; health validator {v.validator} failed, not a veto ({why}): "
                 f"{v.reason}" for v in x["waived"])


def beyond_noise(x: Mapping) -> bool:
  """A branch row beats its reference (the control, else the parent) beyond noise,
  Holm-corrected over its generation."""
  return x.get("vs_control", x)["lo"] > 0 and x["holm"]


def passes(x: Mapping, keep_on: str = "beyond_noise") -> bool:
  """The promotion gate of a branch row (the control's own gate is in `_best`);
  `keep_on`: see `VerifyConfig`."""
  if x["failed"] or x.get("inert"):
    return False
  if keep_on == "unless_worse":
    return x.get("vs_control", x)["hi"] >= 0 and x["hi"] >= 0
  def ahead(diff: float) -> bool:
    return diff >= 0 if keep_on == "not_worse" else diff > 0
  better = beyond_noise(x) if keep_on == "beyond_noise" else ahead(x.get("vs_control", x)["diff"])
  # Credited against continuing when there is a control; never below the incumbent.
  return better and ("vs_control" not in x or ahead(x["diff"]))


def _weak_keep(x: Mapping) -> bool:
  """A branch kept on its mean alone (`keep_on` 'mean' or 'not_worse') or for not being
  worse ('unless_worse'), not beyond noise."""
  return x.get("verdict") == "kept" and not x.get("control") and not beyond_noise(x)


def _summary_row(x: Mapping) -> dict:
  """A row of the verification gate's payload."""
  return ({k: x[k] for k in ("version", "avg8", "diff", "lo", "hi")}
          | {"failed": [v.validator for v in x["failed"]], "control": bool(x.get("control"))})


class Promotion:
  """The controller's verify step: verdicts on a generation's branches, its control and
  its continuation, written to the ledger; skill outcomes; learned skills.

  Args:
    config: the verification knobs.
    ledger: the run's ledger.
    results: the versions' stored results (results.py).
    harness: the active harness (its `validators` and `diagnostics`).
    learner: writes learned skills (learning.py); its `skills` get the outcomes.
    gate: `(stage, generation, payload) -> None`, the human gate before the verdicts.
    progress: where the verdicts are reported (`say`).
    seed: the run's seed (the paired bootstrap's seed derives from it).
  """

  def __init__(self, config: VerifyConfig, ledger: Any, results: Results,
               harness: HarnessEvolution, learner: SkillLearner,
               gate: Callable[[str, int, Mapping], None], progress: Progress, seed: int):
    self.config, self.ledger, self.results, self.harness = config, ledger, results, harness
    self.learner, self.gate, self.progress, self.seed = learner, gate, progress, seed

  def bootstrap_seed(self, gen: int) -> int:
    """The paired bootstrap's seed for generation `gen`'s verdicts."""
    return self.seed * 7919 + gen

  def ci(self, x: Mapping, parent: str) -> str:
    """`ci_label` at the configured level."""
    return ci_label(x, parent, self.config.alpha)

  def _paired(self, r: BranchResult, ref: BranchResult, seed: int) -> dict:
    return paired_test(r.per_problem, ref.per_problem, n=self.config.bootstrap_n, seed=seed,
                       alpha=self.config.alpha)

  def _set_heldout(self, vid: str, **fields) -> None:
    """Adds `fields` to version `vid`'s held-out record."""
    self.ledger.update_version(vid, heldout={**self.ledger.version(vid).heldout, **fields})

  # ---------------------------------------------------------------- judge

  def judge(self, vid: str, r: BranchResult, parent: str, seed: int,
            parent_evidence: Any = None) -> dict:
    """Verification of `vid` against `parent`: the paired-bootstrap difference of held-out
    scores with its interval (stored on the version: its noise estimate) and every active
    validator's verdict ('failed': those that did not pass)."""
    from evotrainer.harness.validators import run_validators
    pres = self.results.result(parent)
    t = self._paired(r, pres, seed)
    diff, lo, hi = t["diff"], t["lo"], t["hi"]
    pev = parent_evidence if parent_evidence is not None else self.results.evidence(parent)
    verdicts = run_validators(self.harness.validators, self.results.evidence(vid, pev))
    drift = self._drift_findings(r)
    self._set_heldout(vid, noise=(hi - lo) / 2, diff=diff, lo=lo, hi=hi, p=t["p"],
                      validators={v.validator: v.state for v in verdicts})
    return {"version": vid, "avg8": avg8(r), "parent_avg8": avg8(pres),
            "proxy": proxy_reward(r), "diff": diff, "lo": lo, "hi": hi, "p": t["p"],
            "verdicts": verdicts, "failed": [v for v in verdicts if not v.passed],
            "label": score_label(r.final), "drift": drift}

  def _drift_findings(self, r: BranchResult) -> list:
    """The active `training_drift` diagnostic over a branch's own training series. The
    incumbent's diagnosis runs it on the incumbent only; a branch that drifted is
    rejected, so without this its drift finding (the curves' two ends as evidence) would
    never be written. Stored on the branch at verification, beside its verdict."""
    from evotrainer.harness.diagnostics import run_diagnostics
    diags = [d for d in self.harness.diagnostics if d.name == "training_drift"]
    if not diags or not r.series:
      return []
    return run_diagnostics(diags, [], {"series": dict(r.series)})[1]

  def _against_control(self, x: dict, r: BranchResult, control: BranchResult, cid: str,
                       seed: int) -> None:
    """Adds the branch's paired comparison with the control (`x['vs_control']`) and
    whether it is inert (per-problem results equal to the control's), and stores both on
    the version."""
    t = self._paired(r, control, seed)
    x["vs_control"] = {"version": cid, **{k: t[k] for k in ("diff", "lo", "hi", "p")}}
    x["inert"] = bool(r.per_problem) and dict(r.per_problem) == dict(control.per_problem)
    self._set_heldout(x["version"], inert=x["inert"],
                      **{f"control_{k}": t[k] for k in ("diff", "lo", "hi", "p")})

  def _waive_health(self, x: dict, control: Optional[Mapping] = None) -> None:
    """With `relative_health`, the health validators (`kind = "health"`: the policy's
    training state, e.g. training_stability, canary_prompts) that failed on `x` stop
    vetoing it when it changed nothing (`x['changeless']`: a control or continuation
    trains the incumbent's already validated harness on, as a static run would) or when
    the generation's `control` row failed them too (the change did not cause it). They
    move from `x['failed']` to `x['waived']`, stay in the version's validator states,
    and are named in its reason. Integrity validators always veto."""
    x["waived"] = []
    if not self.config.relative_health:
      return
    health = {v.name for v in self.harness.validators if getattr(v, "kind", None) == "health"}
    shared = {v.validator for v in control["verdicts"] if not v.passed} if control else set()
    x["waived"] = [v for v in x["failed"] if v.validator in health
                   and (x.get("changeless") or v.validator in shared)]
    x["failed"] = [v for v in x["failed"] if v not in x["waived"]]
    if x["waived"]:
      self._set_heldout(x["version"], waived=[v.validator for v in x["waived"]])

  # ---------------------------------------------------------------- a generation

  def evaluate(self, gen: int, plan: Mapping, results: Mapping) -> None:
    """The verdicts on generation `gen`'s branches and control (`results`: {version:
    BranchResult or None}), written to the ledger; the best passing one is promoted."""
    parent = plan["parent"]
    rows, crow = self._rows(plan, results, self.bootstrap_seed(gen))
    best = self._best(rows, crow)
    everything = rows + ([crow] if crow else [])
    self.gate("verification", gen, {"parent": parent, "promote": best and best["version"],
                                    "branches": [_summary_row(x) for x in everything]})
    outcomes = {}
    for x in everything:
      x["verdict"] = self._verdict(x, best)
      outcomes[x["version"]] = self._reason(x, best, parent, len(rows))
    self._record_skills(rows, outcomes)  # skill files first (idempotent per version)
    with self.ledger.transaction():
      for x in sorted(everything, key=lambda x: x is best):  # rejections before promotion
        self._record(x, x is best, outcomes[x["version"]])
      suspect = None if best else self._suspect_incumbent(gen, parent, everything)
      self.ledger.set_meta(f"controller/evaluated/{gen}",
                           {"promoted": best and best["version"], "suspected": suspect})
    self._report(everything, best, outcomes, suspect)

  def _rows(self, plan: Mapping, results: Mapping, seed: int) -> tuple[list, Optional[dict]]:
    """(the branches' judged rows, the control's row or None)."""
    parent, ctrl = plan["parent"], plan.get("control")
    pev = self.results.evidence(parent)
    cres = results.get(ctrl["version"]) if ctrl else None
    crow = None
    if cres is not None:
      crow = {**self.judge(ctrl["version"], cres, parent, seed, pev), "branch": ctrl,
              "order": len(plan["branches"]), "control": True, "changeless": True}
    rows = []
    for i, b in enumerate(plan["branches"]):
      vid, r = b["version"], results.get(b["version"])
      if r is None:
        continue
      x = {**self.judge(vid, r, parent, seed, pev), "branch": b, "order": i}
      if cres is not None:
        self._against_control(x, r, cres, ctrl["version"], seed)
      self._waive_health(x, control=crow)
      rows.append(x)
    if crow is not None:
      self._waive_health(crow)
    # Family-wise correction over the generation's K branches (Holm), at the one-sided
    # level of the interval's lower bound: a branch is kept only if it survives both.
    ps = [x["vs_control"]["p"] if "vs_control" in x else x["p"] for x in rows]
    for x, ok in zip(rows, holm(ps, self.config.alpha / 2)):
      x["holm"] = ok
    return rows, crow

  def _best(self, rows: Sequence[dict], crow: Optional[dict]) -> Optional[dict]:
    """The row to promote: the best passing branch, else a control that beats the parent
    beyond noise (no change beats continuing, and continuing beats standing still)."""
    best = max((x for x in rows if passes(x, self.config.keep_on)),
               key=lambda x: (x["avg8"], x["diff"], -x["order"]), default=None)
    if (best is None and crow is not None and not crow["failed"] and crow["lo"] > 0
        and crow["p"] <= self.config.alpha / 2):
      best = crow
    return best

  def _record_skills(self, rows: Sequence[Mapping], outcomes: Mapping) -> None:
    """Skill outcomes of the branches a skill proposed, each with its measured effect
    (against the control, else the parent, said by its `against`: a parent has trained
    the branch's steps fewer, so such an effect holds their gain too); kept other changes
    are learned. A keep inside the noise is no success: it records its effect alone, and
    is learned only when that effect is positive (`Skill.effect` pools such measurements
    across runs)."""
    skills = self.learner.skills
    for x in rows:
      if x["verdict"] == "inert":
        continue  # the knob never acted: no evidence for a skill
      h = Hypothesis.from_dict(x["branch"]["hypothesis"])
      ref = x.get("vs_control", x)
      effect = {**{k: ref[k] for k in ("diff", "lo", "hi")},
                "against": "control" if "vs_control" in x else "parent"}
      success = None if _weak_keep(x) else outcomes[x["version"]][1] == "success"
      if h.skill and skills is not None and h.skill in skills:
        skills.record_outcome(h.skill, self.learner.domain, success, version=x["version"],
                              run=self.ledger.run_uid, effect=effect)
      elif success or (success is None and effect["diff"] > 0):
        self.learner.learn_change(h, x["version"], success, effect)

  def _record(self, x: Mapping, is_best: bool, outcome: tuple) -> None:
    """One row's decision, skill outcome, verdict, findings and status (in the caller's
    transaction)."""
    reason, result = outcome
    vid = x["version"]
    self.ledger.update_decision(x["branch"]["decision"], outcome=result, why=reason)
    skill = None if x.get("control") else x["branch"]["hypothesis"].get("skill")
    if skill and x["verdict"] != "inert" and not _weak_keep(x):
      self.ledger.set_skill_outcome(vid, skill, result)
    self._set_heldout(vid, verdict=x["verdict"])
    found = ([self._collapse_finding(x)] if x["verdict"] == "collapsed" else []) + x["drift"]
    if found:
      self.ledger.add_findings(vid, found, stage="verify")
    if is_best:
      self.ledger.promote(vid, reason)
    elif x.get("control"):
      self.ledger.set_status(vid, "pruned", reason)
    else:
      self.ledger.reject(vid, reason)

  def _report(self, everything: Sequence[Mapping], best: Optional[Mapping],
              outcomes: Mapping, suspect: Optional[str]) -> None:
    for x in everything:
      what = "PROMOTED" if x is best else ("pruned" if x.get("control") else "rejected")
      self.progress.say(f"{x['version']}{' (control)' if x.get('control') else ''} "
                        f"{'KEPT' if x is best and not x.get('control') else what}: "
                        f"{outcomes[x['version']][0]}")
    if suspect:
      self.progress.say(suspect)

  # ---------------------------------------------------------------- continuation

  def _collapsed(self, x: Mapping) -> bool:
    """Worse than the parent beyond noise and below `collapse_fraction` of its score."""
    return x["hi"] < 0 and x["avg8"] < self.config.collapse_fraction * x["parent_avg8"]

  def settle_continuation(self, gen: int, vid: str, did: str, parent: str,
                          r: BranchResult) -> None:
    """The verdict on a generation's continuation `vid` (its parent trained further
    unchanged): promoted (verdict 'continued') unless a validator fails ('validator') or
    it is worse than the parent beyond noise ('collapsed' / 'worse_beyond_noise'), which
    rejects it. More training of the kept lineage is the default action, as in a static
    run, so it needs no gain beyond noise; only a regression beyond noise stops it."""
    x = {**self.judge(vid, r, parent, self.bootstrap_seed(gen)), "changeless": True}
    self._waive_health(x)
    verdict, why = self._continuation_verdict(x, parent)
    found = ([self._collapse_finding(x)] if verdict == "collapsed" else []) + x["drift"]
    with self.ledger.transaction():
      self.ledger.update_decision(did, outcome="success" if verdict == "continued"
                                  else "failure", why=why)
      self._set_heldout(vid, verdict=verdict)
      if found:
        self.ledger.add_findings(vid, found, stage="verify")
      if verdict == "continued":
        self.ledger.promote(vid, why)
      else:
        self.ledger.reject(vid, why)
    what = "PROMOTED" if verdict == "continued" else "rejected"
    self.progress.say(f"{vid} (continuation) {what}: {why}")

  def _continuation_verdict(self, x: Mapping, parent: str) -> tuple[str, str]:
    """(verdict, why) of a continuation's judged row."""
    ci = self.ci(x, parent)
    if x["failed"]:
      verdict, why = "validator", validator_rejection(x, ci)
    elif x["hi"] < 0:
      verdict = "collapsed" if self._collapsed(x) else "worse_beyond_noise"
      why = f"continuation {verdict.replace('_', ' ')}: {ci}"
    else:
      verdict, why = "continued", f"continued training, not worse beyond noise: {ci}"
    return verdict, why + waived_note(x)

  # ---------------------------------------------------------------- verdicts

  def _collapse_finding(self, x: Mapping):
    """A 'collapse' finding for a collapsed branch, with its evidence: the two ends of its
    entropy, length and reward curves, and completions of its last training step."""
    from evotrainer.harness.base import snippet
    from evotrainer.types import Finding
    r = self.results.result(x["version"])
    evidence = []
    for name in ("entropy", "length", "reward"):
      v = [a for a in (r.series.get(name) or []) if a is not None]
      if v:
        evidence.append((f"series:{name}", f"{v[0]:.4g} -> {v[-1]:.4g} over {len(v)} steps"))
    episodes = self.results.episodes(x["version"], r, "train")
    last = [e for e in episodes if e.step == max((e.step for e in episodes), default=0)]
    evidence += [(e.episode_id, snippet(e.completion, 120)) for e in last[:3]]
    share = self.config.collapse_fraction
    return Finding(kind="collapse", layer="model", severity=1.0, value=float(x["avg8"]),
                   threshold=float(share * x["parent_avg8"]),
                   message=f"collapsed: validation {x.get('label', 'avg8')} "
                           f"{x['avg8']:.4f}, below {share:.0%} of its parent's "
                           f"{x['parent_avg8']:.4f}",
                   evidence=tuple(evidence))

  def _reason(self, x: Mapping, best: Optional[Mapping], parent: str, k: int) -> tuple:
    """(why, decision outcome) of a verdict."""
    ci, verdict = self.ci(x, parent), x["verdict"]
    vc = x.get("vs_control")
    cci = "" if vc is None else f"; {self.ci(vc, vc['version'])}"
    ref = f"{vc['version']} beyond noise ({cci[2:]}" if vc else f"{parent} beyond noise ({ci}"
    p = vc["p"] if vc else x["p"]
    why = {
        "validator": lambda: validator_rejection(x, ci),
        "inert": lambda: (f"inert: per-problem validation results equal those of the "
                          f"control {vc['version']} (the change never acted)"),
        "kept": lambda: (f"kept {self._weak_rule()} (keep_on={self.config.keep_on!r}), "
                         f"not beyond noise: "
                         f"{ci}{cci}; validators pass; no skill success" if _weak_keep(x)
                         else f"kept: beats {ref}; Holm-corrected over {k} branches)"
                         f"{'; ' + ci if vc else ''}; validators pass"),
        "continued": lambda: (f"continued training: no change beat the control, and the "
                              f"control beats {parent} beyond noise ({ci})"),
        "control": lambda: f"control, not promoted ({ci})",
        "better_not_best": lambda: (f"beats the reference beyond noise ({ci}{cci}) but "
                                    f"{best['version']} is better"),
        "collapsed": lambda: (f"collapsed: validation {x.get('label', 'avg8')} "
                              f"{x['avg8']:.4f} against "
                              f"{x['parent_avg8']:.4f} of {parent} ({ci})"),
        "worse_beyond_noise": lambda: f"worse beyond noise: {ci}{cci}",
        "behind_on_mean": lambda: (f"not ahead on the validation mean "
                                   f"(keep_on={self.config.keep_on!r}), within noise: "
                                   f"{ci}{cci}"),
        "below_parent": lambda: f"beats the control beyond noise but not {parent}: {ci}{cci}",
        "not_beyond_noise_corrected": lambda: (
            f"not beyond noise after the Holm correction over {k} branches (p={p:.4f}): "
            f"{ci}{cci}"),
    }.get(verdict, lambda: f"not beyond noise: {ci}{cci}")() + waived_note(x)
    return why, {"kept": "success", "continued": "success",
                 "better_not_best": "partial"}.get(verdict, "failure")

  def _weak_rule(self) -> str:
    return ("for not being worse beyond noise" if self.config.keep_on == "unless_worse"
            else "on the mean")

  def _verdict(self, x: Mapping, best: Optional[Mapping]) -> str:
    """One of kept, continued, control, better_not_best, validator, inert, collapsed,
    worse_beyond_noise, below_parent, behind_on_mean (`keep_on` 'mean' / 'not_worse'),
    not_beyond_noise_corrected, not_beyond_noise. The reference of a branch is the control
    when there is one, else the parent."""
    if x["failed"]:
      return "validator"
    if x.get("inert"):
      return "inert"
    if x is best:
      return "continued" if x.get("control") else "kept"
    if self._collapsed(x):
      return "collapsed"
    if x.get("control"):
      return "control"
    if passes(x, self.config.keep_on):
      return "better_not_best"
    ref = x.get("vs_control", x)
    if ref["hi"] < 0:
      return "worse_beyond_noise"
    if ref["lo"] > 0 and x["holm"]:
      return "below_parent"
    if self.config.keep_on in ("mean", "not_worse"):
      return "behind_on_mean"  # the weak rules decide on the mean, not on the interval
    return "not_beyond_noise_corrected" if ref["lo"] > 0 else "not_beyond_noise"

  # ---------------------------------------------------------------- a suspect incumbent

  def _suspect_incumbent(self, gen: int, parent: str, rows: Sequence[Mapping]) -> Optional[str]:
    """When most branches of the incumbent (its control included) regress beyond noise
    from it, the incumbent itself is suspect: an `unstable_incumbent` finding is recorded
    on it (evidence: the failed branches), its change is learned as a subtraction skill
    (learning.py), and, if it was kept for a change of its own, it is demoted
    as unstable (negative evidence for its change) and the incumbent rolls back to its
    last good ancestor. The root has nothing to roll back to, and a control or a
    continuation carries no change that a rollback would remove (it would only discard
    its training): they stay, and the finding goes into the next generation's diagnosis
    (where a learned skill can propose the subtraction). Runs inside the caller's
    transaction; returns what was done, or None."""
    bad = [x for x in rows if not x.get("inert") and x["hi"] < 0]
    if len(bad) < 2 or 2 * len(bad) <= len(rows):
      return None
    why = (f"unstable: {len(bad)} of {len(rows)} branches from {parent} collapsed or "
           f"regressed beyond noise ({', '.join(x['version'] for x in bad)})")
    self._unstable_finding(gen, parent, why, bad, len(rows))
    learned = self.learner.learn_subtraction(parent)
    also = f"; skill {learned} learned its subtraction" if learned else ""
    if self.ledger.version(parent).parent is None:
      return f"{why}: {parent} is the root, nothing to roll back to{also}"
    if not own_change(self.ledger, parent):
      # A control or continuation changed nothing: rolling it back would remove no change,
      # only its training (and its validated score). It stays, with its finding.
      return f"{why}: {parent} carries no change of its own (continued training), kept"
    self._demote(gen, parent, why)
    back = self.ledger.incumbent()
    return f"{why}: {parent} demoted, incumbent rolled back to {back and back.id}{also}"

  def _unstable_finding(self, gen: int, parent: str, why: str, bad: Sequence[Mapping],
                        n: int) -> None:
    from evotrainer.types import Finding
    self.ledger.add_findings(parent, [Finding(
        kind="unstable_incumbent", layer="model", severity=1.0,
        value=len(bad) / n, threshold=0.5, message=why,
        evidence=tuple((x["version"], f"{x['verdict']}: {x.get('label', 'avg8')} "
                                      f"{x['diff']:+.4f} [{x['lo']:+.4f}, {x['hi']:+.4f}]")
                       for x in bad))], stage=f"g{gen}-suspect")

  def _demote(self, gen: int, parent: str, why: str) -> None:
    """Demotes the unstable incumbent `parent` (a decision; the incumbent rolls back)."""
    did = f"g{gen}-suspect"
    self.ledger.add_decision(did, parent, intervention={"demote": parent},
                             hypothesis=f"{parent}'s own change made it unstable: its "
                                        f"children fail whatever they change",
                             criterion="branches from the rolled-back incumbent do not "
                                       "collapse")
    self.ledger.update_decision(did, outcome="failure", why=why)
    self.ledger.reject(parent, why)


__all__ = ["CONTINUE", "CONTROL", "KEEP_ON", "Promotion", "REFUTED", "VerifyConfig",
           "beyond_noise", "ci_label", "passes", "validator_rejection", "waived_note"]
