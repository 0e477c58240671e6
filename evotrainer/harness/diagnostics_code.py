"""Code-domain diagnostics over tasks/code.py's reward parts (registered in
`diagnostics.DIAGNOSTICS` like every library diagnostic):
  syntax_error_rate     share of programs that do not compile (stop 'syntax_error')
  timeout_rate          share of programs that ran out of time (stop 'timeout', after the
                        re-run alone)
  pass_fraction_spread  mean standard deviation of the share of tests passed inside a
                        group; low means GRPO sees no partial signal
  hardcoded_outputs     share of programs that special-case inputs or hold hidden expected
                        outputs as literals (`reward_parts['hardcoded']`)
Format failures and dead groups are the library's `format_failure` and
`dead_group_ratio`, which read the same parts. Each reports nothing on episodes without
the code parts (math), so the library stays usable everywhere.

The integrity checks are validators (validators.py): `test_tampering`, and
`exploit_probe`, which for a `CodeTask` scores a lying program (prints "all tests
passed", exits 0 before any test) against a right and a wrong one
(`CodeTask.exploit_completions`, harness/probes.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report, groups_of
from evotrainer.harness.diagnostics_base import (EPS, ThresholdDiagnostic, evidence_of,
                                                 rewards_of)
from evotrainer.types import Episode


def with_part(episodes: Sequence[Episode], part: str) -> list:
  """The episodes that have reward part `part` (code episodes, for the code parts)."""
  return [ep for ep in episodes if part in ep.reward_parts]


class _PartRate(ThresholdDiagnostic):
  """Share of episodes whose 0/1 part `part` is set; a finding above the threshold."""

  part = ""
  what = ""

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = with_part(episodes, self.part)
    if not have:
      return Report({})
    flags = rewards_of(have, self.part) > 0.5
    value = float(flags.mean())
    return self.report({self.name: value}, value,
                       lambda: f"{value:.3f} of programs {self.what} (> {self.threshold})",
                       lambda: evidence_of(have, np.flatnonzero(flags)))


@gin.configurable(module="harness")
class SyntaxErrorRate(_PartRate):
  """Share of programs that do not compile; finding above `threshold` (0.2)."""

  name, layer, part, what = "syntax_error_rate", "behaviour", "stop_syntax_error", \
      "do not compile"

  def __init__(self, threshold: Optional[float] = 0.2, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)


@gin.configurable(module="harness")
class TimeoutRate(_PartRate):
  """Share of programs that timed out (after the re-run); finding above 0.05."""

  name, layer, part, what = "timeout_rate", "efficiency", "stop_timeout", "time out"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)


@gin.configurable(module="harness")
class HardcodedOutputs(_PartRate):
  """Share of programs that special-case inputs or write hidden outputs in; finding
  above 0.05 (a policy learning to answer the tests, not the problem)."""

  name, layer, part, what = "hardcoded_outputs", "behaviour", "hardcoded", \
      "hard-code outputs or special-case inputs"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)


@gin.configurable(module="harness")
class PassFractionSpread(ThresholdDiagnostic):
  """Mean over groups of the standard deviation of `reward_parts['partial']` (the share
  of tests passed); finding when *below* `threshold` (0.05): the groups' programs pass
  the same share of tests, so even a fraction-passed reward would give no signal.

  Metrics: `pass_fraction_spread` and `pass_fraction_flat_groups` (share of groups with
  zero spread). Evidence: the first episode of each flat group.
  """

  name, layer = "pass_fraction_spread", "signal"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "below", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    groups = [g for g in groups_of(with_part(episodes, "partial")) if len(g) > 1]
    if not groups:
      return Report({})
    spreads = np.array([rewards_of(g, "partial").std() for g in groups])
    value = float(spreads.mean())
    flat = [g[0] for g, s in zip(groups, spreads) if s <= EPS]
    metrics = {"pass_fraction_spread": value,
               "pass_fraction_flat_groups": len(flat) / len(groups)}
    return self.report(metrics, value,
                       lambda: f"pass-fraction spread inside groups {value:.3f} < "
                               f"{self.threshold}: {len(flat)} of {len(groups)} groups flat",
                       lambda: evidence_of(flat, range(len(flat))))


__all__ = ["HardcodedOutputs", "PassFractionSpread", "SyntaxErrorRate", "TimeoutRate"]
