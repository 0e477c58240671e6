"""The verify and learn steps of the evolution loop (a Controller mixin, controller.py).

Each branch of a generation is compared with its parent on the same validation problems
under the same sampling keys (a paired bootstrap, stats.py), and with the generation's
control branch (the parent continued unchanged, same seed and steps) when there is one:
a change is credited against continuing, not against standing still. A branch is kept
when it beats its reference (the control, else the parent) beyond noise after Holm's
correction over the generation's branches, is not below the parent, and passes every
active validator; the best such branch becomes the incumbent. A branch whose per-problem
results equal the control's is inert: its knob never acted. When no change is kept and
the control beats the parent beyond noise, the control (continued training) is promoted;
otherwise it is pruned. Each outcome is one verdict (`Promotion._verdict`) with its
reason; a collapsed branch and a branch whose training drifted (the active
`training_drift` diagnostic over its own series) get their findings at stage 'verify'.
Kept changes that no skill proposed become skills (`_learn_skill`). With
`relative_health` the health validators stop vetoing what the change did not cause
(`_waive_health`): a failure its control shares, or any failure of a version that
changed nothing (control, continuation); integrity validators always veto.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Mapping, Optional, Sequence

from evotrainer.evolution.proposers import Hypothesis
from evotrainer.evolution.search_space import Intervention, make_intervention
from evotrainer.evolution.skills import Skill, SkillError, state_of, template_of
from evotrainer.evolution.stats import holm, paired_test, score_label
from evotrainer.evolution.trainer import BranchResult

# The decision record's intervention of a generation's control branch.
CONTROL = {"id": "control", "control": True,
           "description": "control: the parent continued unchanged"}

# The decision record's intervention of a generation's continuation (controller.py).
CONTINUE = {"id": "continue", "continuation": True,
            "description": "continuation: the incumbent trained further unchanged"}

# Verdicts that refute a change (`_verdict`): the controller never proposes it again
# from a descendant that still holds the value it changed (controller._excluded).
REFUTED = ("validator", "collapsed", "worse_beyond_noise")

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


class Promotion:
  """The Controller's verify and learn steps (a mixin). Uses the host's `ledger`,
  `skills`, `alpha`, `bootstrap_n`, `collapse_fraction`, `seed`, `domain`,
  `learn_skills`, `progress`, `_validators`, `_diagnostics`, `_gate`, `result` and
  `evidence`."""

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
    drift = self._drift_findings(r)
    self.ledger.update_version(vid, heldout={
        **self.ledger.version(vid).heldout, "noise": (hi - lo) / 2, "diff": diff,
        "lo": lo, "hi": hi, "p": t["p"], "validators": {v.validator: v.state for v in verdicts}})
    return {"version": vid, "avg8": _avg8(r), "parent_avg8": _avg8(pres), "proxy": _proxy(r),
            "diff": diff, "lo": lo, "hi": hi, "p": t["p"], "verdicts": verdicts,
            "failed": [v for v in verdicts if not v.passed], "label": score_label(r.final),
            "drift": drift}

  def _drift_findings(self, r: BranchResult) -> list:
    """The active `training_drift` diagnostic over a branch's own training series. The
    incumbent's diagnosis runs it on the incumbent only; a branch that drifted is
    rejected, so without this its drift finding (the curves' two ends as evidence) would
    never be written. Stored on the branch at verification, beside its verdict."""
    from evotrainer.harness.diagnostics import run_diagnostics
    diags = [d for d in self._diagnostics if d.name == "training_drift"]
    if not diags or not r.series:
      return []
    return run_diagnostics(diags, [], {"series": dict(r.series)})[1]

  def _ci(self, x: Mapping, parent: str) -> str:
    return (f"{x.get('label', 'avg8')} {x['diff']:+.4f}, {100 * (1 - self.alpha):.0f}% CI [{x['lo']:+.4f}, "
            f"{x['hi']:+.4f}] vs {parent}")

  @staticmethod
  def _validator_rejection(x: Mapping, ci: str) -> str:
    """'rejected by validator A, B: <A's reason>; <B's reason> (ci)': every failed
    validator is named, each with its own evidence."""
    names = ", ".join(v.validator for v in x["failed"])
    reasons = "; ".join(v.reason for v in x["failed"])
    return f"rejected by validator {names}: {reasons} ({ci})"

  def _against_control(self, x: dict, r: BranchResult, control: BranchResult, cid: str,
                       seed: int) -> None:
    """Adds the branch's paired comparison with the control (`x['vs_control']`) and
    whether it is inert (per-problem results equal to the control's), and stores both on
    the version."""
    t = paired_test(r.per_problem, control.per_problem, n=self.bootstrap_n, seed=seed,
                    alpha=self.alpha)
    x["vs_control"] = {"version": cid, **{k: t[k] for k in ("diff", "lo", "hi", "p")}}
    x["inert"] = bool(r.per_problem) and dict(r.per_problem) == dict(control.per_problem)
    self.ledger.update_version(x["version"], heldout={
        **self.ledger.version(x["version"]).heldout, "inert": x["inert"],
        **{f"control_{k}": t[k] for k in ("diff", "lo", "hi", "p")}})

  def _waive_health(self, x: dict, control: Optional[Mapping] = None) -> None:
    """With `relative_health`, the health validators (`kind = "health"`: the policy's
    training state, e.g. training_stability, canary_prompts) that failed on `x` stop
    vetoing it when it changed nothing (`x['changeless']`: a control or continuation
    trains the incumbent's already validated harness on, as a static run would) or when
    the generation's `control` row failed them too (the change did not cause it). They
    move from `x['failed']` to `x['waived']`, stay in the version's validator states,
    and are named in its reason. Integrity validators always veto."""
    x["waived"] = []
    if not self.relative_health:
      return
    health = {v.name for v in self._validators if getattr(v, "kind", None) == "health"}
    shared = {v.validator for v in control["verdicts"] if not v.passed} if control else set()
    x["waived"] = [v for v in x["failed"] if v.validator in health
                   and (x.get("changeless") or v.validator in shared)]
    x["failed"] = [v for v in x["failed"] if v not in x["waived"]]
    if x["waived"]:
      self.ledger.update_version(x["version"], heldout={
          **self.ledger.version(x["version"]).heldout,
          "waived": [v.validator for v in x["waived"]]})

  @staticmethod
  def _waived_note(x: Mapping) -> str:
    """'; health validator A failed, not a veto (changed nothing | its control failed
    it too): <A's reason>' for each waived verdict, '' when none."""
    if not x.get("waived"):
      return ""
    why = "changed nothing" if x.get("changeless") else "its control failed it too"
    return "".join(f"; health validator {v.validator} failed, not a veto ({why}): "
                   f"{v.reason}" for v in x["waived"])

  def _passes(self, x: Mapping) -> bool:
    """The promotion gate of a branch (the control's own gate is in `_evaluate`)."""
    if x["failed"] or x.get("inert"):
      return False
    if "vs_control" in x:  # credited against continuing; never below the incumbent
      return x["vs_control"]["lo"] > 0 and x["holm"] and x["diff"] > 0
    return x["lo"] > 0 and x["holm"]

  def _evaluate(self, gen: int, plan: Mapping, results: Mapping) -> None:
    parent, seed = plan["parent"], self._bootstrap_seed(gen)
    pev = self.evidence(parent)
    ctrl = plan.get("control")
    cres = results.get(ctrl["version"]) if ctrl else None
    crow = None
    if cres is not None:
      crow = {**self._judge(ctrl["version"], cres, parent, seed, pev), "branch": ctrl,
              "order": len(plan["branches"]), "control": True, "changeless": True}
    rows = []
    for i, b in enumerate(plan["branches"]):
      vid, r = b["version"], results.get(b["version"])
      if r is None:
        continue
      x = {**self._judge(vid, r, parent, seed, pev), "branch": b, "order": i}
      if cres is not None:
        self._against_control(x, r, cres, ctrl["version"], seed)
      self._waive_health(x, control=crow)
      rows.append(x)
    if crow is not None:
      self._waive_health(crow)
    # Family-wise correction over the generation's K branches (Holm), at the one-sided
    # level of the interval's lower bound: a branch is kept only if it survives both.
    ps = [x["vs_control"]["p"] if "vs_control" in x else x["p"] for x in rows]
    for x, ok in zip(rows, holm(ps, self.alpha / 2)):
      x["holm"] = ok
    best = max((x for x in rows if self._passes(x)),
               key=lambda x: (x["avg8"], x["diff"], -x["order"]), default=None)
    if (best is None and crow is not None and not crow["failed"] and crow["lo"] > 0
        and crow["p"] <= self.alpha / 2):
      best = crow  # no change beats continuing, and continuing beats standing still
    everything = rows + ([crow] if crow else [])
    self._gate("verification", gen, {"parent": parent, "promote": best and best["version"],
                                     "branches": [{k: x[k] for k in ("version", "avg8", "diff",
                                                                     "lo", "hi")}
                                                  | {"failed": [v.validator for v in x["failed"]],
                                                     "control": bool(x.get("control"))}
                                                  for x in everything]})
    outcomes = {}
    for x in everything:
      x["verdict"] = self._verdict(x, best)
      outcomes[x["version"]] = self._reason(x, best, parent, len(rows))
    # Skill files first (idempotent per version), then the ledger in one transaction.
    for x in rows:
      if x["verdict"] == "inert":
        continue  # the knob never acted: no evidence for or against a skill
      h = Hypothesis.from_dict(x["branch"]["hypothesis"])
      success = outcomes[x["version"]][1] == "success"
      if h.skill and self.skills is not None and h.skill in self.skills:
        self.skills.record_outcome(h.skill, self.domain, success, version=x["version"])
      elif success and self.learn_skills and self.skills is not None:
        self._learn_skill(h, x["version"])
    with self.ledger.transaction():
      for x in sorted(everything, key=lambda x: x is best):  # rejections before promotion
        reason, outcome = outcomes[x["version"]]
        self.ledger.update_decision(x["branch"]["decision"], outcome=outcome, why=reason)
        skill = None if x.get("control") else x["branch"]["hypothesis"].get("skill")
        if skill and x["verdict"] != "inert":
          self.ledger.set_skill_outcome(x["version"], skill, outcome)
        self.ledger.update_version(x["version"], heldout={
            **self.ledger.version(x["version"]).heldout, "verdict": x["verdict"]})
        found = ([self._collapse_finding(x)] if x["verdict"] == "collapsed" else []) \
            + x["drift"]
        if found:
          self.ledger.add_findings(x["version"], found, stage="verify")
        if x is best:
          self.ledger.promote(x["version"], reason)
        elif x.get("control"):
          self.ledger.set_status(x["version"], "pruned", reason)
        else:
          self.ledger.reject(x["version"], reason)
      suspect = None if best else self._suspect_incumbent(gen, parent, everything)
      self.ledger.set_meta(f"controller/evaluated/{gen}",
                           {"promoted": best and best["version"], "suspected": suspect})
    for x in everything:
      what = "PROMOTED" if x is best else ("pruned" if x.get("control") else "rejected")
      self.progress.say(f"{x['version']}{' (control)' if x.get('control') else ''} "
                        f"{'KEPT' if x is best and not x.get('control') else what}: "
                        f"{outcomes[x['version']][0]}")
    if suspect:
      self.progress.say(suspect)

  def _bootstrap_seed(self, gen: int) -> int:
    """The paired bootstrap's seed for generation `gen`'s verdicts."""
    return self.seed * 7919 + gen

  def _collapsed(self, x: Mapping) -> bool:
    """Worse than the parent beyond noise and below `collapse_fraction` of its score."""
    return x["hi"] < 0 and x["avg8"] < self.collapse_fraction * x["parent_avg8"]

  def _settle_continuation(self, gen: int, vid: str, did: str, parent: str,
                           r: BranchResult) -> None:
    """The verdict on a generation's continuation `vid` (its parent trained further
    unchanged): promoted (verdict 'continued') unless a validator fails ('validator') or
    it is worse than the parent beyond noise ('collapsed' / 'worse_beyond_noise'), which
    rejects it. More training of the kept lineage is the default action, as in a static
    run, so it needs no gain beyond noise; only a regression beyond noise stops it."""
    x = {**self._judge(vid, r, parent, self._bootstrap_seed(gen)), "changeless": True}
    self._waive_health(x)
    ci = self._ci(x, parent)
    if x["failed"]:
      verdict, why = "validator", self._validator_rejection(x, ci)
    elif x["hi"] < 0:
      verdict = "collapsed" if self._collapsed(x) else "worse_beyond_noise"
      why = f"continuation {verdict.replace('_', ' ')}: {ci}"
    else:
      verdict, why = "continued", f"continued training, not worse beyond noise: {ci}"
    why += self._waived_note(x)
    found = ([self._collapse_finding(x)] if verdict == "collapsed" else []) + x["drift"]
    with self.ledger.transaction():
      self.ledger.update_decision(did, outcome="success" if verdict == "continued"
                                  else "failure", why=why)
      self.ledger.update_version(vid, heldout={**self.ledger.version(vid).heldout,
                                               "verdict": verdict})
      if found:
        self.ledger.add_findings(vid, found, stage="verify")
      if verdict == "continued":
        self.ledger.promote(vid, why)
      else:
        self.ledger.reject(vid, why)
    what = "PROMOTED" if verdict == "continued" else "rejected"
    self.progress.say(f"{vid} (continuation) {what}: {why}")

  def _collapse_finding(self, x: Mapping):
    """A 'collapse' finding for a collapsed branch, with its evidence: the two ends of its
    entropy, length and reward curves, and completions of its last training step."""
    from evotrainer.harness.base import snippet
    from evotrainer.types import Finding
    r = self.result(x["version"])
    evidence = []
    for name in ("entropy", "length", "reward"):
      v = [a for a in (r.series.get(name) or []) if a is not None]
      if v:
        evidence.append((f"series:{name}", f"{v[0]:.4g} -> {v[-1]:.4g} over {len(v)} steps"))
    episodes = self._episodes(x["version"], r, "train")
    last = [e for e in episodes if e.step == max((e.step for e in episodes), default=0)]
    evidence += [(e.episode_id, snippet(e.completion, 120)) for e in last[:3]]
    return Finding(kind="collapse", layer="model", severity=1.0, value=float(x["avg8"]),
                   threshold=float(self.collapse_fraction * x["parent_avg8"]),
                   message=f"collapsed: validation {x.get('label', 'avg8')} "
                           f"{x['avg8']:.4f}, below "
                           f"{self.collapse_fraction:.0%} of its parent's "
                           f"{x['parent_avg8']:.4f}",
                   evidence=tuple(evidence))

  def _reason(self, x: Mapping, best: Optional[Mapping], parent: str, k: int) -> tuple:
    """(why, decision outcome) of a verdict."""
    ci, verdict = self._ci(x, parent), x["verdict"]
    vc = x.get("vs_control")
    cci = "" if vc is None else f"; {self._ci(vc, vc['version'])}"
    ref = f"{vc['version']} beyond noise ({cci[2:]}" if vc else f"{parent} beyond noise ({ci}"
    p = vc["p"] if vc else x["p"]
    why = {
        "validator": lambda: self._validator_rejection(x, ci),
        "inert": lambda: (f"inert: per-problem validation results equal those of the "
                          f"control {vc['version']} (the change never acted)"),
        "kept": lambda: (f"kept: beats {ref}; Holm-corrected over {k} branches)"
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
        "below_parent": lambda: f"beats the control beyond noise but not {parent}: {ci}{cci}",
        "not_beyond_noise_corrected": lambda: (
            f"not beyond noise after the Holm correction over {k} branches (p={p:.4f}): "
            f"{ci}{cci}"),
    }.get(verdict, lambda: f"not beyond noise: {ci}{cci}")() + self._waived_note(x)
    return why, {"kept": "success", "continued": "success",
                 "better_not_best": "partial"}.get(verdict, "failure")

  def _verdict(self, x: Mapping, best: Optional[Mapping]) -> str:
    """One of kept, continued, control, better_not_best, validator, inert, collapsed,
    worse_beyond_noise, below_parent, not_beyond_noise_corrected, not_beyond_noise. The
    reference of a branch is the control when there is one, else the parent."""
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
    if self._passes(x):
      return "better_not_best"
    ref = x.get("vs_control", x)
    if ref["hi"] < 0:
      return "worse_beyond_noise"
    if ref["lo"] > 0 and x["holm"]:
      return "below_parent"
    return "not_beyond_noise_corrected" if ref["lo"] > 0 else "not_beyond_noise"

  def _suspect_incumbent(self, gen: int, parent: str, rows: Sequence[Mapping]) -> Optional[str]:
    """When most branches of the incumbent (its control included) regress beyond noise
    from it, the incumbent itself is suspect: an `unstable_incumbent` finding is recorded
    on it (evidence: the failed branches), its change is learned as a subtraction skill
    (`_learn_subtraction`), and, if it was kept for a change of its own, it is demoted
    as unstable (negative evidence for its change) and the incumbent rolls back to its
    last good ancestor. The root has nothing to roll back to, and a control or a
    continuation carries no change that a rollback would remove (it would only discard
    its training): they stay, and the finding goes into the next generation's diagnosis
    (where a learned skill can propose the subtraction). Runs inside the caller's
    transaction; returns what was done, or None."""
    from evotrainer.types import Finding
    bad = [x for x in rows if not x.get("inert") and x["hi"] < 0]
    if len(bad) < 2 or 2 * len(bad) <= len(rows):
      return None
    names = [x["version"] for x in bad]
    why = (f"unstable: {len(bad)} of {len(rows)} branches from {parent} collapsed or "
           f"regressed beyond noise ({', '.join(names)})")
    self.ledger.add_findings(parent, [Finding(
        kind="unstable_incumbent", layer="model", severity=1.0,
        value=len(bad) / len(rows), threshold=0.5, message=why,
        evidence=tuple((x["version"], f"{x['verdict']}: {x.get('label', 'avg8')} "
                                      f"{x['diff']:+.4f} [{x['lo']:+.4f}, {x['hi']:+.4f}]")
                       for x in bad))], stage=f"g{gen}-suspect")
    learned = self._learn_subtraction(parent)
    also = f"; skill {learned} learned its subtraction" if learned else ""
    inc = self.ledger.version(parent)
    if inc.parent is None:
      return f"{why}: {parent} is the root, nothing to roll back to{also}"
    if not self._own_change(parent):
      # A control or continuation changed nothing: rolling it back would remove no change,
      # only its training (and its validated score). It stays, with its finding.
      return f"{why}: {parent} carries no change of its own (continued training), kept"
    did = f"g{gen}-suspect"
    self.ledger.add_decision(did, parent, intervention={"demote": parent},
                             hypothesis=f"{parent}'s own change made it unstable: its "
                                        f"children fail whatever they change",
                             criterion="branches from the rolled-back incumbent do not "
                                       "collapse")
    self.ledger.update_decision(did, outcome="failure", why=why)
    self.ledger.reject(parent, why)
    back = self.ledger.incumbent()
    return f"{why}: {parent} demoted, incumbent rolled back to {back and back.id}{also}"

  def _own_change(self, vid: str) -> list:
    """The decisions that trained `vid` as a change (empty for the root, a control or a
    continuation)."""
    return [d for d in self.ledger.decisions(version=vid) if "binding" in d.intervention]

  def _learn_subtraction(self, vid: str) -> Optional[str]:
    """Writes (or adds evidence to) the skill "when most branches of an incumbent that
    carries this change fail badly, subtract the change" for the change that made `vid`
    (issue 16): trigger, an `unstable_incumbent` finding in the binding state the change
    left (`state_of` its inverse); intervention, the inverse change (`template_of`). The
    same change found unstable again (another version, another run) adds a success to
    the same skill. The root and a control carry no change: None. Returns the name."""
    if not self.learn_skills or self.skills is None:
      return None
    made = self._own_change(vid)
    if not made:
      return None
    iv = Intervention.from_dict(made[0].intervention)
    undo = make_intervention(iv.binding, iv.new, iv.old, key=iv.key)
    trigger = {"finding": "unstable_incumbent", "and": [state_of(undo)]}
    return self._add_learned(
        f"learned-unstable-{iv.binding}-{iv.kind}-{iv.key or ''}", trigger, undo, vid,
        category="training stability",
        description=f"learned on {vid}: most branches of an incumbent that made the "
                    f"change {iv.description} failed badly; subtract it "
                    f"({undo.description})",
        expected_outcome="branches from the incumbent stop collapsing once its "
                         "unstable change is undone",
        validation_criterion="the subtraction's branch is not collapsed or worse "
                             "beyond noise, and beats the control")

  def _learn_skill(self, h: Hypothesis, vid: str) -> None:
    """Writes (or adds evidence to) a skill for a kept change that no skill proposed: it
    triggers on the finding that motivated the change, if any, in the binding state the
    change started from (`state_of`), and makes the same change."""
    iv = h.intervention
    state = state_of(iv)
    trigger = {"finding": h.finding, "and": [state]} if h.finding else state
    when = f"{h.finding} fired" if h.finding else f"{state['binding']} {state['op']} " \
                                                  f"{state['value']!r}"
    self._add_learned(
        f"learned-{h.finding or 'state'}-{iv.binding}-{iv.kind}-{iv.key or ''}", trigger, iv,
        vid, category=_CATEGORY.get(h.group, "training stability"),
        description=f"learned on {vid}: {iv.description} when {when}",
        expected_outcome=h.statement, validation_criterion=h.criterion)

  def _add_learned(self, label: str, trigger: dict, iv: Intervention, vid: str,
                   **fields) -> Optional[str]:
    """Adds the learned skill (`trigger`, the change `iv`) unless the library has it, and
    records a success for `vid`. One skill per (trigger, change): its name is `label`
    made a slug plus a digest of both, so the same change from the same state adds
    evidence. Returns the name; None when the skill language cannot express the
    template (e.g. a whole-list value)."""
    digest = hashlib.sha256(json.dumps([trigger, template_of(iv)], sort_keys=True,
                                       default=str).encode()).hexdigest()[:6]
    name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") + f"-{digest}"
    try:
      if name not in self.skills:
        self.skills.add(Skill(name=name, trigger=trigger, intervention=template_of(iv),
                              source="learned", **fields))
      self.skills.record_outcome(name, self.domain, True, version=vid)
    except SkillError:
      return None
    return name


__all__ = ["CONTINUE", "CONTROL", "Promotion", "REFUTED"]
