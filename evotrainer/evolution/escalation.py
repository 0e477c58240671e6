"""Escalation of the evolution loop after repeated rejections (docs/method.md#escalation).

After `escalate_after` consecutive rejections the controller re-validates the evaluation
pipeline (`eval_check`, the domain's verifier and splits, and the repeatability of every
stored re-evaluation: eval_check.py; a failure stops the run with
`EvaluationPipelineError`), puts the
groups that just failed last, and prefers a subtraction; a second escalation on the same
incumbent also rolls back to its last good ancestor. Each escalation is a decision in the
ledger and is stored per generation (`controller/escalation/<gen>`), so a relaunch
replays it instead of escalating again.
"""

from __future__ import annotations

from typing import Optional

from evotrainer.evolution.eval_check import repeatability
from evotrainer.evolution.ledger import GOOD
from evotrainer.evolution.search_space import Intervention


class EvaluationPipelineError(RuntimeError):
  """The evaluation pipeline failed its re-validation during an escalation."""


def no_eval_check() -> tuple[bool, str]:
  """The `eval_check` of a controller without a task: checks nothing of the domain (the
  run's own check is `eval_check.task_eval_check(task)`; the controller adds the
  repeatability of stored re-evaluations either way)."""
  return True, "no evaluation check configured (default no-op)"


class Escalation:
  """The Controller's escalation step (a mixin). Uses the host's `ledger`, `space`,
  `eval_check` and `escalate_after`."""

  def _group(self, iv: Intervention) -> str:
    try:
      return self.space.knob_for(iv).group
    except Exception:  # pylint: disable=broad-except  (a decision from an older space)
      return ""

  def _pipeline_check(self) -> tuple[bool, str]:
    """`eval_check` (the domain's verifier and splits) and the repeatability of every
    stored re-evaluation of a parent (eval_check.py)."""
    ok, why = self.eval_check()
    pairs = []
    for v in self.ledger.versions():
      r, p = self.result(v.id), v.parent and self.result(v.parent)
      if r is not None and p:
        pairs.append((v.id, r.initial, p.final))
    rok, rwhy = repeatability(pairs)
    return ok and rok, f"{why}; {rwhy}"

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
    ok, why = self._pipeline_check()
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


__all__ = ["Escalation", "EvaluationPipelineError", "no_eval_check"]
