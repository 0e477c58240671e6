"""Model-state and efficiency diagnostics (__init__.py holds the library and runner).

  model       entropy (EntropyCollapse), kl (KLDrift), clip_fraction (ClipFraction),
              grad_norm (GradNormSpike): the learner's step metrics in `context`
  efficiency  length (LengthPercentiles), truncation (TruncationRate), turns
              (TurnCount), stop_reasons (StopReasons): what the completions cost, and
              why they ended
"""

from __future__ import annotations

import collections
import re
from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report
from evotrainer.harness.diagnostics.base import (EPS, ThresholdDiagnostic, evidence_of,
                                                 learner_metric, lengths_of)
from evotrainer.types import Episode


# ------------------------------------------------------------------ model state


@gin.configurable(module="harness")
class EntropyCollapse(ThresholdDiagnostic):
  """Policy entropy and mean token log-prob; finding when entropy is below threshold.

  `entropy` comes from the learner (`context['learner']`); `mean_logprob` is the
  token-weighted mean of the sampler's `Episode.logprobs`, and `-mean_logprob` is a
  Monte-Carlo estimate of the per-token entropy, used when the learner reports none.
  Evidence: the most deterministic episodes (highest mean log-prob).
  """

  name, layer = "entropy", "model"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "below", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    metrics = {}
    ent = learner_metric(context, "entropy")
    if ent is not None:
      metrics["entropy"] = ent
    lps = [np.asarray(ep.logprobs, np.float64) for ep in episodes if ep.logprobs is not None]
    per_ep = np.array([lp.mean() if lp.size else np.nan for lp in lps])
    if lps and sum(lp.size for lp in lps):
      metrics["mean_logprob"] = float(np.concatenate(lps).mean())
      if ent is None:
        ent = metrics["entropy_estimate"] = -metrics["mean_logprob"]
    with_lp = [ep for ep in episodes if ep.logprobs is not None]
    order = np.argsort(-np.nan_to_num(per_ep, nan=-np.inf), kind="stable")
    return self.report(metrics, ent,
                       lambda: f"entropy {ent:.4f} < {self.threshold}: exploration collapses",
                       lambda: evidence_of(with_lp, order,
                                           lambda e: f"mean logprob {np.mean(e.logprobs):.3f}"))


def _largest_advantage(episodes: Sequence[Episode], context: dict):
  """Episodes with the largest |advantage|: the ones that drive an update."""
  adv = context.get("advantages")
  if adv is None or not episodes:
    return ()
  adv = np.abs(np.asarray(adv, np.float64).reshape(len(episodes), -1)).max(axis=1)
  return evidence_of(episodes, np.argsort(-adv, kind="stable"), lambda e: "large |advantage|")


@gin.configurable(module="harness")
class KLDrift(ThresholdDiagnostic):
  """`approx_kl` (k3 of KL(old || new)) and `kl` to the reference; finding above threshold."""

  name, layer = "kl", "model"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    metrics = {k: v for k in ("approx_kl", "kl")
               if (v := learner_metric(context, k)) is not None}
    value = metrics.get("approx_kl")
    return self.report(metrics, value,
                       lambda: f"approx KL {value:.4f} > {self.threshold}: the update moves "
                       f"the policy far from the sampler",
                       lambda: _largest_advantage(episodes, context))


@gin.configurable(module="harness")
class ClipFraction(ThresholdDiagnostic):
  """PPO clip fractions; finding when `clip_frac_low + clip_frac_high` is above threshold."""

  name, layer = "clip_fraction", "model"

  def __init__(self, threshold: Optional[float] = 0.2, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    metrics = {k: v for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac")
               if (v := learner_metric(context, k)) is not None}
    if "clip_frac_low" not in metrics or "clip_frac_high" not in metrics:
      return Report(metrics)
    value = metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    return self.report(metrics, value, f"{value:.3f} of tokens are clipped (> "
                       f"{self.threshold}): updates are too large or too stale",
                       lambda: _largest_advantage(episodes, context))


@gin.configurable(module="harness")
class GradNormSpike(ThresholdDiagnostic):
  """Grad norm, and its ratio to the median of earlier steps; finding above threshold.

  Earlier values come from `context['series']['grad_norm']` (or `'learner/grad_norm'`);
  with fewer than `min_history` of them only `grad_norm` is reported.
  """

  name, layer = "grad_norm", "model"

  def __init__(self, threshold: Optional[float] = 3.0, direction: str = "above",
               min_history: int = 3, **kw):
    super().__init__(threshold, direction, **kw)
    self.min_history = min_history

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    gn = learner_metric(context, "grad_norm")
    if gn is None:
      return Report({})
    series = context.get("series") or {}
    past = series.get("grad_norm", series.get("learner/grad_norm", ()))
    metrics = {"grad_norm": gn}
    if len(past) < self.min_history:
      return Report(metrics)
    med = float(np.median(np.asarray(past, np.float64)))
    ratio = metrics["grad_norm_ratio"] = gn / max(med, EPS)
    return self.report(metrics, ratio, f"grad norm {gn:.3g} is {ratio:.1f}x the median "
                       f"{med:.3g} of earlier steps",
                       lambda: _largest_advantage(episodes, context))


# ------------------------------------------------------------------ efficiency


@gin.configurable(module="harness")
class LengthPercentiles(ThresholdDiagnostic):
  """Length P50/P90 (numpy linear percentiles), mean, max; finding when P90 > threshold.

  Lengths are tokens (words when an episode has no `completion_ids`); threshold default
  None: metrics only. Evidence: the longest episodes.
  """

  name, layer = "length", "efficiency"

  def __init__(self, threshold: Optional[float] = None, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if not episodes:
      return Report({})
    lengths = lengths_of(episodes)
    p50, p90 = np.percentile(lengths, [50, 90])
    metrics = {"length_p50": float(p50), "length_p90": float(p90),
               "length_mean": float(lengths.mean()), "length_max": float(lengths.max())}
    return self.report(metrics, float(p90), f"length P90 {p90:.0f} > {self.threshold}",
                       lambda: evidence_of(episodes, np.argsort(-lengths, kind="stable"),
                                           lambda e: f"len {e.length}", tail=True))


@gin.configurable(module="harness")
class TruncationRate(ThresholdDiagnostic):
  """Share of episodes that hit max_new_tokens (`Episode.truncated`); finding above."""

  name, layer = "truncation", "efficiency"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if not episodes:
      return Report({})
    cut = np.array([ep.truncated for ep in episodes])
    value = float(cut.mean())
    return self.report({"truncation_rate": value}, value,
                       f"{value:.3f} of completions are truncated (> {self.threshold})",
                       lambda: evidence_of(episodes, np.flatnonzero(cut), tail=True))


@gin.configurable(module="harness")
class TurnCount(ThresholdDiagnostic):
  """Turns per episode (`info['turns']`, multi-turn only): mean, P90, max.

  Finding when the mean is above threshold (default None: metrics only).
  """

  name, layer = "turns", "efficiency"

  def __init__(self, threshold: Optional[float] = None, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = [ep for ep in episodes if "turns" in ep.info]
    if not have:
      return Report({})
    turns = np.array([float(ep.info["turns"]) for ep in have])
    value = float(turns.mean())
    metrics = {"turns_mean": value, "turns_p90": float(np.percentile(turns, 90)),
               "turns_max": float(turns.max())}
    return self.report(metrics, value, f"mean turns {value:.2f} > {self.threshold}",
                       lambda: evidence_of(have, np.argsort(-turns, kind="stable"),
                                           lambda e: f"{e.info['turns']} turns", tail=True))


@gin.configurable(module="harness")
class StopReasons(ThresholdDiagnostic):
  """Why completions ended (`info['stop']`, set by `rollouts.Generation.episodes`): the
  share of each reason.

  Metrics `stop_<reason>` (non-word characters of the reason as '_') for every reason
  seen, and always `stop_malformed`: the share the task refused to read (too long, an
  answer too long or nested too deep; see `filters.StopReasonFilter`). Finding when
  `stop_malformed` is above threshold; evidence: the malformed completions' ends. Reports
  nothing when no episode has a stop reason.
  """

  name, layer = "stop_reasons", "efficiency"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    stops = [(ep.info or {}).get("stop") for ep in episodes]
    counts = collections.Counter(str(s) for s in stops if s is not None)
    if not counts:
      return Report({})
    metrics = {"stop_malformed": 0.0}
    for reason, c in sorted(counts.items()):
      key = "stop_" + re.sub(r"\W", "_", reason)
      metrics[key] = metrics.get(key, 0.0) + c / len(episodes)
    value = metrics["stop_malformed"]
    return self.report(metrics, value,
                       f"{value:.3f} of completions are malformed (> {self.threshold}): "
                       f"refused unread as too long or too deeply nested",
                       lambda: evidence_of(episodes, [i for i, s in enumerate(stops)
                                                      if s == "malformed"], tail=True))


__all__ = ["ClipFraction", "EntropyCollapse", "GradNormSpike", "KLDrift",
           "LengthPercentiles", "StopReasons", "TruncationRate", "TurnCount"]
