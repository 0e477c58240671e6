"""Behaviour-layer diagnostics, and the per-domain hook (__init__.py: the library).

  length_reward_corr (LengthRewardCorrelation), format_failure (FormatFailureRate),
  answer_spamming (AnswerSpammingRate), repetition (RepetitionRate): what the policy's
  completions do; domain (DomainDiagnostic): a function of your own, by import path.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional, Sequence, Union

import gin
import numpy as np

from evotrainer.harness.base import Report, groups_of
from evotrainer.harness.diagnostics.base import (EPS, ThresholdDiagnostic, evidence_of,
                                                 has_loop, lengths_of, pearson, rewards_of)
from evotrainer.tasks.answers import count_candidates
from evotrainer.types import LAYERS, Episode


# ------------------------------------------------------------------ behaviour layer


def within_correctness(lengths: np.ndarray, rewards: np.ndarray,
                       correct: np.ndarray) -> float:
  """Pearson correlation of length and reward inside each correctness class (both
  centred on their class means, then pooled): what length buys beyond being right. NaN
  when the reward does not vary inside a class (e.g. a BC-only reward)."""
  dl, dr = [], []
  for cls in (True, False):
    m = correct == cls
    if m.sum() >= 2:
      dl.append(lengths[m] - lengths[m].mean())
      dr.append(rewards[m] - rewards[m].mean())
  return pearson(np.concatenate(dl), np.concatenate(dr)) if dl else float("nan")


@gin.configurable(module="harness")
class LengthRewardCorrelation(ThresholdDiagnostic):
  """Length gaming: the reward pays length beyond correctness (finding when > 0.3).

  The judged value, `length_reward_corr_given_correct`, is the correlation of length and
  reward inside each correctness class (`within_correctness`, on the 'correct' part):
  right answers that are simply longer than truncated wrong ones do not count, and a
  BC-only reward can never fire it. Without a 'correct' part the plain correlation is
  judged. Metrics also: `length_reward_corr` (plain Pearson; fired on 13 of 450 steps
  of a healthy main-job run, 2.9%, where the conditional one fired on none) and
  `length_reward_corr_within` (the mean per-group correlation). Evidence: the longest
  episodes with reward >= the mean.
  """

  name, layer = "length_reward_corr", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.3, direction: str = "above",
               reward_key: Optional[str] = None, **kw):
    super().__init__(threshold, direction, **kw)
    self.reward_key = reward_key

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if len(episodes) < 2:
      return Report({})
    lengths, r = lengths_of(episodes), rewards_of(episodes, self.reward_key)
    corr = pearson(lengths, r)
    within = [pearson(lengths_of(g), rewards_of(g, self.reward_key))
              for g in groups_of(episodes)]
    within = [c for c in within if not np.isnan(c)]
    metrics = {"length_reward_corr": corr}
    if within:
      metrics["length_reward_corr_within"] = float(np.mean(within))
    correct = rewards_of(episodes, "correct")
    judged, what = corr, "length and reward correlate"
    if not np.isnan(correct).any():
      judged = metrics["length_reward_corr_given_correct"] = within_correctness(
          lengths, r, correct >= 0.5)
      what = "length and reward correlate among equally correct completions"
    high = np.flatnonzero(r >= r.mean() - EPS)
    order = high[np.argsort(-lengths[high], kind="stable")]
    return self.report(metrics, judged,
                       f"{what} ({judged:.3f} > {self.threshold}): possible length gaming",
                       lambda: evidence_of(episodes, order, lambda e: f"len {e.length or '?'}, r "
                                   f"{e.reward:.2f}"))


@gin.configurable(module="harness")
class FormatFailureRate(ThresholdDiagnostic):
  """1 - mean of `reward_parts['format']`; finding when strictly above threshold (0.3).

  Evidence: the episodes with the lowest format score.
  """

  name, layer = "format_failure", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.3, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    fmt = rewards_of(episodes, "format")
    if not len(fmt) or np.isnan(fmt).all():
      return Report({})
    value = float(np.nanmean(1.0 - fmt))
    order = [i for i in np.argsort(fmt, kind="stable") if fmt[i] < 1.0]
    return self.report({"format_failure": value}, value,
                       f"format gate fails on {value:.3f} of completions (> "
                       f"{self.threshold})", lambda: evidence_of(episodes, order, tail=True))


@gin.configurable(module="harness")
class AnswerSpammingRate(ThresholdDiagnostic):
  """Share of completions marking >= 2 distinct answers (`tasks.answers.count_candidates`).

  Evidence: the completions with the most candidates.
  """

  name, layer = "answer_spamming", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if not episodes:
      return Report({})
    counts = np.array([count_candidates(ep.completion) for ep in episodes])
    value = float((counts >= 2).mean())
    order = [i for i in np.argsort(-counts, kind="stable") if counts[i] >= 2]
    return self.report({"answer_spamming": value, "candidates_mean": float(counts.mean())},
                       value, f"{value:.3f} of completions mark several answers",
                       lambda: evidence_of(episodes, order,
                                           lambda e: f"{count_candidates(e.completion)} answers"))


@gin.configurable(module="harness")
class RepetitionRate(ThresholdDiagnostic):
  """Share of episodes with a repeated word n-gram loop (see `has_loop`)."""

  name, layer = "repetition", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "above",
               n: int = 8, min_repeats: int = 4, **kw):
    super().__init__(threshold, direction, **kw)
    self.n, self.min_repeats = n, min_repeats

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if not episodes:
      return Report({})
    loops = np.array([has_loop(ep.completion, self.n, self.min_repeats) for ep in episodes])
    value = float(loops.mean())
    return self.report({"repetition_rate": value}, value,
                       f"{value:.3f} of completions loop on a repeated {self.n}-gram",
                       lambda: evidence_of(episodes, np.flatnonzero(loops), tail=True))


@gin.configurable(module="harness")
class DomainDiagnostic(ThresholdDiagnostic):
  """A per-domain hook: `fn(episodes, context)` returns `{metric: value}` or a `Report`.

  Args:
    fn: the function, or its path `"package.module:function"`.
    name: the diagnostic's name (findings' kind); must be unique in a run.
    layer: one of `types.LAYERS`.
    metric: the returned metric the threshold applies to (when `fn` returns a dict).
  """

  def __init__(self, fn: Union[str, Callable], name: str = "domain",
               layer: str = "behaviour", metric: Optional[str] = None,
               threshold: Optional[float] = None, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)
    if layer not in LAYERS:
      raise ValueError(f"DomainDiagnostic.layer={layer!r}; expected one of {LAYERS}")
    if threshold is not None and metric is None:
      raise ValueError("DomainDiagnostic: a threshold needs `metric`, the returned metric "
                       "it applies to")
    self.name, self.layer, self.metric = name, layer, metric
    self.fn = _load(fn) if isinstance(fn, str) else fn

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    out = self.fn(episodes, context)
    if isinstance(out, Report):
      return out
    metrics = {k: float(v) for k, v in out.items()}
    value = metrics.get(self.metric) if self.metric else None
    return self.report(metrics, value, f"{self.metric} = {value} is {self.direction} "
                       f"{self.threshold}")


def _load(path: str) -> Callable:
  module, _, attr = path.partition(":")
  if not module or not attr:
    raise ValueError(f"DomainDiagnostic.fn={path!r}; expected 'package.module:function'")
  try:
    return getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ValueError(f"DomainDiagnostic.fn={path!r} cannot be loaded: {e}") from None


__all__ = ["AnswerSpammingRate", "DomainDiagnostic", "FormatFailureRate",
           "LengthRewardCorrelation", "RepetitionRate"]
