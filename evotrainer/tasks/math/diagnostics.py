"""Math-domain diagnostics (registered in the harness's `diagnostics.DIAGNOSTICS` when this
module is imported, as the code domain's are):
  arithmetic_slip   share of completions that write `expression = value` with a wrong
                    value: the model sets the sum up right and gets it wrong. The
                    calculator tool (`MathTask.calculator`, tasks/math/calculator.py)
                    answers it: the evolution's catalog turns the tool on for it.
It reads math episodes only (those with the math task's `contains` part), so the library
stays usable in every domain.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report
from evotrainer.harness.diagnostics import register
from evotrainer.harness.diagnostics.base import ThresholdDiagnostic, evidence_of
from evotrainer.tasks.answers import parse_number
from evotrainer.tasks.math.calculator import value_before_equals
from evotrainer.types import Episode

_WRITTEN = re.compile(r"[ \t]*(-?\d+(?:\.\d+)?(?:/\d+)?)(?![\d.])")  # the value after "="


def equations(text: str) -> list:
  """[(written value, true value)] for every "=" of `text` that follows arithmetic with a
  value (`calculator.value_before_equals`) and precedes a number on the same line."""
  out = []
  for m in re.finditer("=", text):
    if text[m.end():m.end() + 1] == "=" or text[m.start() - 1:m.start()] in "=<>!":
      continue  # "==", "<=", ">=", "!=": comparisons, not results
    written = _WRITTEN.match(text, m.end())
    true = value_before_equals(text[:m.end()]) if written else None
    if true is not None:
      out.append((written.group(1), true))
  return out


def slipped(text: str) -> Optional[bool]:
  """Whether some equation of `text` has a wrong value; None when it has none."""
  found = equations(text)
  if not found:
    return None
  return any(parse_number(w) != parse_number(t) for w, t in found)


@gin.configurable(module="harness")
class ArithmeticSlipRate(ThresholdDiagnostic):
  """Share of math completions with an equation (`expression = value`) whose value is
  wrong, among those that write one; finding above `threshold` (0.1).

  Metrics: `arithmetic_slip` (that share), `equation_rate` (the share of math
  completions that write an equation at all).
  """

  name, layer = "arithmetic_slip", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = [ep for ep in episodes if "contains" in ep.reward_parts]
    verdicts = [slipped(ep.completion) for ep in have]
    checked = [i for i, v in enumerate(verdicts) if v is not None]
    if not checked:
      return Report({})
    flags = np.array([verdicts[i] for i in checked], bool)
    value = float(flags.mean())
    metrics = {self.name: value, "equation_rate": len(checked) / len(have)}
    return self.report(metrics, value,
                       lambda: f"{value:.3f} of the {len(checked)} completions that write "
                               f"an equation get its value wrong (> {self.threshold})",
                       lambda: evidence_of(have, [checked[i] for i in np.flatnonzero(flags)]))


register(ArithmeticSlipRate)


__all__ = ["ArithmeticSlipRate", "equations", "slipped"]
