"""Escalation of the evolution loop after repeated rejections (docs/method.md#escalation).

After `escalate_after` consecutive rejections the controller re-validates the evaluation
pipeline (`eval_check`, the domain's verifier and splits, and the repeatability of every
stored re-evaluation: eval/pipeline_check.py; a failure stops the run with
`EvaluationPipelineError`), puts the
groups that just failed last, and prefers a subtraction; a second escalation on the same
incumbent also rolls back to its last good ancestor. Each escalation is a decision in the
ledger and is stored per generation (`controller/escalation/<gen>`), so a relaunch
replays it instead of escalating again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import gin

from evotrainer.eval.pipeline_check import repeatability
from evotrainer.evolution.ledger import GOOD
from evotrainer.evolution.results import Results
from evotrainer.evolution.search_space import Intervention


class EvaluationPipelineError(RuntimeError):
  """The evaluation pipeline failed its re-validation during an escalation."""


def no_eval_check() -> tuple[bool, str]:
  """The `eval_check` of a controller without a task: checks nothing of the domain (the
  run's own check is `eval_check.task_eval_check(task)`; the controller adds the
  repeatability of stored re-evaluations either way)."""
  return True, "no evaluation check configured (default no-op)"


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class EscalationConfig:
  """Knobs of the escalation (gin: `EscalationConfig.escalate_after = 3`).

  Attributes:
    escalate_after: consecutive rejections that trigger an escalation (twice as many on
      the same incumbent also roll it back to its last good ancestor).
  """
  escalate_after: int = 3

  def __post_init__(self):
    if self.escalate_after < 1:
      raise ValueError(f"EscalationConfig.escalate_after={self.escalate_after}; expected "
                       f">= 1 rejections")


class Escalation:
  """The controller's escalation step over `ledger`.

  Args:
    config: the escalation knobs.
    ledger: the run's ledger (escalations are decisions there).
    space: the search space (an intervention's group).
    results: the versions' stored results (results.py), for the repeatability check.
    eval_check: `() -> (ok, why)`, the domain's check of its evaluation pipeline.
  """

  def __init__(self, config: EscalationConfig, ledger: Any, space: Any, results: Results,
               eval_check: Callable[[], tuple] = no_eval_check):
    self.config, self.ledger, self.space = config, ledger, space
    self.results, self.eval_check = results, eval_check

  def _group(self, iv: Intervention) -> str:
    try:
      return self.space.knob_for(iv).group
    except Exception:  # pylint: disable=broad-except  (a decision from an older space)
      return ""

  def pipeline_check(self) -> tuple[bool, str]:
    """`eval_check` (the domain's verifier and splits) and the repeatability of every
    stored re-evaluation of a parent (eval/pipeline_check.py)."""
    ok, why = self.eval_check()
    pairs = []
    for v in self.ledger.versions():
      r, p = self.results.result(v.id), v.parent and self.results.result(v.parent)
      if r is not None and p:
        pairs.append((v.id, r.initial, p.final))
    rok, rwhy = repeatability(pairs)
    return ok and rok, f"{why}; {rwhy}"

  def escalate(self, gen: int) -> Optional[dict]:
    """Escalation after `escalate_after` consecutive rejections (stored per generation)."""
    key = f"controller/escalation/{gen}"
    stored = self.ledger.get_meta(key)
    if stored is not None:
      return stored or None
    n = self.ledger.consecutive_rejections()
    if n < self.config.escalate_after:
      self.ledger.set_meta(key, {})
      return None
    inc = self.ledger.incumbent()
    ok, why = self.pipeline_check()
    avoid = self._failed_groups(inc.id)
    actions = [f"re-validated the evaluation pipeline: {'ok' if ok else 'FAILED'}: {why}",
               f"switch layer: interventions on {avoid or 'other groups'} come last",
               "prefer a subtraction (remove / revert) first"]
    rollback = self._rollback(inc.id, n) if ok else None
    if rollback:
      actions.append(f"rolled back from {inc.id} to the last good version {rollback}")
    esc = {"decision": f"g{gen}-escalation", "rejections": n, "avoid_groups": avoid,
           "prefer_subtraction": True, "rollback": rollback, "eval_ok": ok}
    self._record(key, esc, inc.id, actions)
    if not ok:
      raise EvaluationPipelineError(f"escalation at generation {gen}: the evaluation "
                                    f"pipeline failed its re-validation: {why}")
    return esc

  def _failed_groups(self, vid: str) -> list:
    """The groups of the changes from `vid` that failed."""
    failed = [d for d in self.ledger.decisions(parent=vid) if d.outcome == "failure"]
    return sorted({self._group(Intervention.from_dict(d.intervention)) for d in failed
                   if "binding" in d.intervention} - {""})

  def _rollback(self, vid: str, rejections: int) -> Optional[str]:
    """The last good ancestor of `vid` on a second escalation on it (else None)."""
    if rejections < 2 * self.config.escalate_after:
      return None
    back = next((a for a in self.ledger.lineage(vid)[1:] if a.status in GOOD), None)
    return None if back is None else back.id

  def _record(self, key: str, esc: Mapping, vid: str, actions: list) -> None:
    """The escalation's decision (and its rollback) in one transaction."""
    did, n, ok = esc["decision"], esc["rejections"], esc["eval_ok"]
    with self.ledger.transaction():
      self.ledger.add_decision(
          did, vid, intervention={"escalation": actions, "avoid_groups": esc["avoid_groups"]},
          hypothesis=f"escalation: {n} consecutive rejections on {vid}; the bottleneck "
                     f"is elsewhere than the last changes assumed",
          criterion="the next generation keeps a version")
      self.ledger.update_decision(did, outcome="partial" if ok else "failure",
                                  why="; ".join(actions))
      if esc["rollback"]:
        self.ledger.set_incumbent(esc["rollback"])
      self.ledger.set_meta(key, dict(esc))


__all__ = ["Escalation", "EscalationConfig", "EvaluationPipelineError", "no_eval_check"]
