"""Code-domain diagnostics over task.py's reward parts (registered in the harness's
`diagnostics.DIAGNOSTICS` when this module is imported, like every library diagnostic):
  syntax_error_rate     share of programs that do not compile (stop 'syntax_error')
  timeout_rate          share of programs that ran out of time (stop 'timeout', after the
                        re-run alone)
  pass_fraction_spread  mean standard deviation of the share of tests passed inside a
                        group; low means GRPO sees no partial signal
  hardcoded_outputs     share of programs that special-case inputs or hold hidden expected
                        outputs as literals (`reward_parts['hardcoded']`)
What a pretrained chat model gets wrong before its code ever runs (`CodeTask.read_code`'s
parts):
  prose_rate            share of completions with no fence that are not Python either
  broken_fence          share whose program came from a fence never closed or from
                        unfenced text (metrics unclosed_fence_rate, bare_code_rate)
  wrong_name_rate       share whose program does not define the entry point asked for
  runaway_length        share cut at the token limit (metrics runaway_in_code: cut
                        inside the code block; runaway_after_code: the block had closed
                        and the words after it used up the budget)
Format failures and dead groups are the library's `format_failure` and
`dead_group_ratio`, which read the same parts. Each reports nothing on episodes without
the code parts (math), so the library stays usable everywhere.

The integrity checks are validators (harness/validators.py): `test_tampering`, and
`exploit_probe`, which for a `CodeTask` scores a lying program (prints "all tests
passed", exits 0 before any test) against a right and a wrong one
(`CodeTask.exploit_completions`, harness/probes.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report, groups_of
from evotrainer.harness.diagnostics import register
from evotrainer.harness.diagnostics.base import (EPS, ThresholdDiagnostic, evidence_of,
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
class ProseRate(_PartRate):
  """Share of completions that hold no code: no fence, and the text does not parse as
  Python (`reward_parts['prose']`); finding above 0.2."""

  name, layer, part, what = "prose_rate", "behaviour", "prose", \
      "are prose: no fence and no Python"

  def __init__(self, threshold: Optional[float] = 0.2, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)


@gin.configurable(module="harness")
class WrongNameRate(_PartRate):
  """Share of completions whose program does not define the entry point the problem
  names (`reward_parts['wrong_name']`): the tests cannot call it; finding above 0.1."""

  name, layer, part, what = "wrong_name_rate", "behaviour", "wrong_name", \
      "do not define the function asked for"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)


@gin.configurable(module="harness")
class BrokenFence(ThresholdDiagnostic):
  """Share of completions whose program was read from a fence never closed or from
  unfenced text (`reward_parts['unclosed_fence']`, `['bare_code']`); finding above 0.2.

  Metrics: `broken_fence` (their sum), `unclosed_fence_rate`, `bare_code_rate`.
  """

  name, layer = "broken_fence", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.2, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = with_part(with_part(episodes, "unclosed_fence"), "bare_code")
    if not have:
      return Report({})
    unclosed = rewards_of(have, "unclosed_fence") > 0.5
    bare = rewards_of(have, "bare_code") > 0.5
    value = float((unclosed | bare).mean())
    metrics = {"broken_fence": value, "unclosed_fence_rate": float(unclosed.mean()),
               "bare_code_rate": float(bare.mean())}
    return self.report(metrics, value,
                       lambda: f"{value:.3f} of programs come from an unclosed fence "
                               f"({unclosed.mean():.3f}) or no fence ({bare.mean():.3f}) "
                               f"(> {self.threshold})",
                       lambda: evidence_of(have, np.flatnonzero(unclosed | bare), tail=True))


@gin.configurable(module="harness")
class RunawayLength(ThresholdDiagnostic):
  """Share of code completions cut at the token limit (`Episode.truncated`); finding
  above 0.25. Unlike the library's `truncation`, it says where the budget went:
  `runaway_in_code` (cut inside a fence never closed: the program itself is too long or
  loops) and `runaway_after_code` (a complete block, then words until the limit: a stop
  at the end of the block would have saved them).
  """

  name, layer = "runaway_length", "efficiency"

  def __init__(self, threshold: Optional[float] = 0.25, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = with_part(with_part(episodes, "unclosed_fence"), "format")
    if not have:
      return Report({})
    cut = np.array([ep.truncated for ep in have], bool)
    value = float(cut.mean())
    metrics = {"runaway_length": value,
               "runaway_in_code": float((cut & (rewards_of(have, "unclosed_fence") > 0.5))
                                        .mean()),
               "runaway_after_code": float((cut & (rewards_of(have, "format") > 0.5))
                                           .mean())}
    return self.report(metrics, value,
                       lambda: f"{value:.3f} of completions run into the token limit "
                               f"({metrics['runaway_in_code']:.3f} inside the code, "
                               f"{metrics['runaway_after_code']:.3f} after it) "
                               f"(> {self.threshold})",
                       lambda: evidence_of(have, np.flatnonzero(cut), tail=True))


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


for _cls in (SyntaxErrorRate, TimeoutRate, PassFractionSpread, HardcodedOutputs, ProseRate,
             BrokenFence, WrongNameRate, RunawayLength):
  register(_cls)


__all__ = ["BrokenFence", "HardcodedOutputs", "PassFractionSpread", "ProseRate",
           "RunawayLength", "SyntaxErrorRate", "TimeoutRate", "WrongNameRate"]
