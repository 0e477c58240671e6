"""A user's own harness components, outside the package (issue 4, item 8).

Loaded with `--import=tests.user_components` (or `config.import_modules`) and named in gin
like the built-in ones:

    RewardComposer.components = [@CharCountBonus()]
    RewardComposer.parts = {'correct': 1.0, 'chars': 0.1}
    train.diagnostics = [@MeanCompletionChars()]

They follow the signatures in evotrainer/harness/base.py: a RewardPart is `name` +
`__call__(episodes) -> [n] float`; a Diagnostic is `name`, `layer` +
`__call__(episodes, context) -> Report`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report
from evotrainer.harness.diagnostics import register
from evotrainer.types import Episode, Finding


@gin.configurable(module="my_components")
class CharCountBonus:
  """min(1, characters in the completion / `per_chars`) * `scale`: rewards saying more."""

  def __init__(self, per_chars: int = 100, scale: float = 1.0, name: str = "chars"):
    self.per_chars, self.scale, self.name = int(per_chars), float(scale), name

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:  # [n]
    chars = np.array([len(ep.completion) for ep in episodes], np.float64)
    return self.scale * np.minimum(1.0, chars / self.per_chars)


@register
@gin.configurable(module="my_components")
class MeanCompletionChars:
  """Mean completion length in characters; a finding when below `threshold`."""

  name, layer = "mean_completion_chars", "efficiency"

  def __init__(self, threshold: Optional[float] = None):
    self.threshold = threshold

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if not episodes:
      return Report({})
    value = float(np.mean([len(ep.completion) for ep in episodes]))
    findings = ()
    if self.threshold is not None and value < self.threshold:
      shortest = min(episodes, key=lambda e: len(e.completion))
      findings = (Finding(kind=self.name, layer=self.layer, severity=0.3, value=value,
                          threshold=float(self.threshold),
                          message=f"completions average {value:.1f} characters",
                          evidence=((shortest.episode_id, shortest.completion[:80]),)),)
    return Report({"mean_completion_chars": value}, findings)


@gin.configurable(module="my_components")
class AcceptAllVerifier:
  """A planted fault: a verifier (the `VerifierPool` interface) that calls every answer
  right. The evaluation pipeline check must stop a run that uses it."""

  def verify_many(self, pairs):
    from evotrainer.tasks.answers import VerifyResult
    return [VerifyResult(True, "match") for _ in pairs]

  def close(self) -> None:
    pass
