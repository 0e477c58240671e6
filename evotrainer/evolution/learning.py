"""The learn step of the evolution loop: skills written from the verdicts.

Two kinds of learned skill (skills.py), each one JSON file in the run's skill library:
  a kept change   a non-skill intervention that was kept becomes a skill: it triggers on
                  the finding that motivated it (if any) in the binding state the change
                  started from, and makes the same change (`learn_change`)
  a subtraction   when most branches of an incumbent fail badly, the change that made
                  the incumbent is learned as "subtract it" (`learn_subtraction`)
One skill per (trigger, change): the same change learned again adds evidence to it.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

from evotrainer.evolution.proposers import Hypothesis
from evotrainer.evolution.search_space import Intervention, make_intervention
from evotrainer.evolution.skills import Skill, SkillError, SkillLibrary, state_of, template_of

_CATEGORY = {"reward": "reward design", "filter": "filter mechanism",
             "harness": "filter mechanism"}


def own_change(ledger: Any, vid: str) -> list:
  """The decisions that trained `vid` as a change (empty for the root, a control or a
  continuation)."""
  return [d for d in ledger.decisions(version=vid) if "binding" in d.intervention]


class SkillLearner:
  """Writes learned skills into `skills` (outcomes recorded under `domain`).

  Args:
    skills: the run's skill library (None: nothing is learned).
    domain: the domain a learned skill's first success is recorded under.
    ledger: the run's ledger (the change that made a version).
    enabled: False learns nothing (`VerifyConfig.learn_skills`).
  """

  def __init__(self, skills: Optional[SkillLibrary], domain: str, ledger: Any,
               enabled: bool = True):
    self.skills, self.domain, self.ledger, self.enabled = skills, domain, ledger, enabled

  def learn_subtraction(self, vid: str) -> Optional[str]:
    """Writes (or adds evidence to) the skill "when most branches of an incumbent that
    carries this change fail badly, subtract the change" for the change that made `vid`:
    trigger, an `unstable_incumbent` finding in the binding state the change left
    (`state_of` its inverse); intervention, the inverse change (`template_of`). The
    same change found unstable again (another version, another run) adds a success to
    the same skill. The root and a control carry no change: None. Returns the name."""
    if not self.enabled or self.skills is None:
      return None
    made = own_change(self.ledger, vid)
    if not made:
      return None
    iv = Intervention.from_dict(made[0].intervention)
    undo = make_intervention(iv.binding, iv.new, iv.old, key=iv.key)
    trigger = {"finding": "unstable_incumbent", "and": [state_of(undo)]}
    return self._add(
        f"learned-unstable-{iv.binding}-{iv.kind}-{iv.key or ''}", trigger, undo, vid,
        category="training stability",
        description=f"learned on {vid}: most branches of an incumbent that made the "
                    f"change {iv.description} failed badly; subtract it "
                    f"({undo.description})",
        expected_outcome="branches from the incumbent stop collapsing once its "
                         "unstable change is undone",
        validation_criterion="the subtraction's branch is not collapsed or worse "
                             "beyond noise, and beats the control")

  def learn_change(self, h: Hypothesis, vid: str, success: Optional[bool] = True,
                   effect: Optional[dict] = None) -> None:
    """Writes (or adds evidence to) a skill for a kept change that no skill proposed: it
    triggers on the finding that motivated the change, if any, in the binding state the
    change started from (`state_of`), and makes the same change. `success` None: a keep
    inside the noise, which records its measured `effect` ({diff, lo, hi}) only."""
    if not self.enabled or self.skills is None:
      return
    iv = h.intervention
    state = state_of(iv)
    trigger = {"finding": h.finding, "and": [state]} if h.finding else state
    when = f"{h.finding} fired" if h.finding else f"{state['binding']} {state['op']} " \
                                                  f"{state['value']!r}"
    self._add(
        f"learned-{h.finding or 'state'}-{iv.binding}-{iv.kind}-{iv.key or ''}", trigger, iv,
        vid, category=_CATEGORY.get(h.group, "training stability"),
        description=f"learned on {vid}: {iv.description} when {when}",
        expected_outcome=h.statement, validation_criterion=h.criterion,
        success=success, effect=effect)

  def _add(self, label: str, trigger: dict, iv: Intervention, vid: str,
           success: Optional[bool] = True, effect: Optional[dict] = None,
           **fields) -> Optional[str]:
    """Adds the learned skill (`trigger`, the change `iv`) unless the library has it, and
    records the outcome of `vid` (a success by default), under this run's identity, as
    `selected`: only a good outcome is learned. One skill per (trigger, change): its
    name is `label` made a slug plus a digest of both, so the same change from the same
    state adds evidence, in this run or a later one.
    Returns the name; None when the skill language cannot express the template (e.g. a
    whole-list value)."""
    digest = hashlib.sha256(json.dumps([trigger, template_of(iv)], sort_keys=True,
                                       default=str).encode()).hexdigest()[:6]
    name = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") + f"-{digest}"
    try:
      if name not in self.skills:
        self.skills.add(Skill(name=name, trigger=trigger, intervention=template_of(iv),
                              source="learned", **fields))
      self.skills.record_outcome(name, self.domain, success, version=vid,
                                 run=self.ledger.run_uid, effect=effect, selected=True)
    except SkillError:
      return None
    return name


__all__ = ["SkillLearner", "own_change"]
