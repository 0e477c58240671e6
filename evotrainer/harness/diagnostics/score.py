"""Score- and signal-layer diagnostics (__init__.py holds the library and runner).

  score    bc (CorrectnessRate), reward (RewardMean), score_trend (ScoreTrend): how
           good the policy is, on the training batch and held out
  signal   dead_group_ratio (DeadGroupRatio), reward_spread (RewardSpread),
           advantage_health (AdvantageHealth): whether the batch carries learning signal
"""

from __future__ import annotations

from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report, groups_of
from evotrainer.harness.diagnostics.base import (EPS, ThresholdDiagnostic, evidence_of,
                                                 is_dead, rewards_of)
from evotrainer.types import Episode


# ------------------------------------------------------------------ score layer


@gin.configurable(module="harness")
class CorrectnessRate(ThresholdDiagnostic):
  """BC: mean of `reward_parts['correct']`; finding when below `threshold` (sparse reward)."""

  name, layer = "bc", "score"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "below", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    bc = rewards_of(episodes, "correct")
    if not len(bc) or np.isnan(bc).all():
      return Report({})
    value = float(np.nanmean(bc))
    wrong = [i for i, c in enumerate(bc) if c < 0.5]
    return self.report({"bc": value}, value,
                       f"BC {value:.3f} {self.direction} {self.threshold}: "
                       f"the reward is sparse, few groups carry signal",
                       lambda: evidence_of(episodes, wrong))


@gin.configurable(module="harness")
class RewardMean(ThresholdDiagnostic):
  """Composed (shaped) reward mean/std, each part's mean (`part/<name>`), reward - BC.

  `threshold` (default None: metrics only) flags `reward_minus_bc` above it: most of
  the reward comes from parts other than correctness.
  """

  name, layer = "reward", "score"

  def __init__(self, threshold: Optional[float] = None, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    if not episodes:
      return Report({})
    r = rewards_of(episodes)
    metrics = {"reward_mean": float(r.mean()), "reward_std": float(r.std())}
    for part in sorted({k for ep in episodes for k in ep.reward_parts}):
      metrics[f"part/{part}"] = float(np.nanmean(rewards_of(episodes, part)))
    gap = None
    if "part/correct" in metrics:
      gap = metrics["reward_minus_bc"] = metrics["reward_mean"] - metrics["part/correct"]
    bc = rewards_of(episodes, "correct")
    order = np.argsort(-(r - np.nan_to_num(bc)), kind="stable")
    return self.report(metrics, gap,
                       lambda: f"shaped reward exceeds BC by {gap:.4f}: the reward comes from "
                       f"non-correctness parts",
                       lambda: evidence_of(episodes, order, lambda e: f"r {e.reward:.2f}"))


@gin.configurable(module="harness")
class ScoreTrend(ThresholdDiagnostic):
  """Held-out figures as metrics, and the trend of `metric` against the incumbent.

  Metrics: every numeric entry of `context['heldout']` under its own name (`avg8`,
  `pass8`, `greedy`, ...). With `context['incumbent']`, `metric` is looked up in the
  held-out figures (then in this batch's `bc`) and in the incumbent's; the finding is
  always emitted and says improving / flat / regressing: `|delta| <= flat_band` is flat.
  Metrics `trend_delta` and `trend` (+1, 0, -1). Severity 0 / 0.3 / 0.7.
  """

  name, layer = "score_trend", "score"

  def __init__(self, metric: str = "avg8", flat_band: float = 0.01, **kw):
    super().__init__(flat_band, "above", **kw)
    self.metric = metric

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    metrics = {k: float(v) for k, v in (context.get("heldout") or {}).items()
               if isinstance(v, (int, float, np.number))}
    current = dict(metrics)
    bc = rewards_of(episodes, "correct")
    if len(bc) and not np.isnan(bc).all():
      current.setdefault("bc", float(np.nanmean(bc)))
    incumbent = context.get("incumbent") or {}
    if self.metric not in current or self.metric not in incumbent:
      return Report(metrics)
    delta = current[self.metric] - float(incumbent[self.metric])
    trend = 0 if abs(delta) <= self.threshold + EPS else int(np.sign(delta))
    metrics.update(trend_delta=delta, trend=float(trend))
    word = {1: "improving", 0: "flat", -1: "regressing"}[trend]
    # Illustrate an improvement with successes, flat and regressing with failures.
    order = [i for i, c in enumerate(bc) if (c >= 0.5) == (trend > 0)]
    message = (f"{word}: {self.metric} {current[self.metric]:.4f} vs incumbent "
               f"{float(incumbent[self.metric]):.4f} ({delta:+.4f}, flat band "
               f"{self.threshold})")
    return Report(metrics, (self.finding(delta, message, evidence_of(episodes, order),
                                         severity={1: 0.0, 0: 0.3, -1: 0.7}[trend]),))


# ------------------------------------------------------------------ signal layer


@gin.configurable(module="harness")
class DeadGroupRatio(ThresholdDiagnostic):
  """DGR: share of groups whose rewards have zero variance; finding when above threshold.

  Evidence: one episode of each dead group. Also `dead_all_correct` / `dead_all_wrong`:
  shares of groups dead because every row was solved / none was (by `correct`).
  `reward_key` None uses the composed reward, else that reward part.
  """

  name, layer = "dead_group_ratio", "signal"

  def __init__(self, threshold: Optional[float] = 0.5, direction: str = "above",
               reward_key: Optional[str] = None, **kw):
    super().__init__(threshold, direction, **kw)
    self.reward_key = reward_key

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    groups = groups_of(episodes)
    if not groups:
      return Report({})
    dead = [is_dead(rewards_of(g, self.reward_key)) for g in groups]
    bc = [rewards_of(g, "correct") for g in groups]
    dgr = float(np.mean(dead))
    metrics = {"dead_group_ratio": dgr, "dead_groups": float(sum(dead)),
               "num_groups": float(len(groups)),
               "dead_all_correct": float(np.mean([d and bool((c >= 0.5).all())
                                                  for d, c in zip(dead, bc)])),
               "dead_all_wrong": float(np.mean([d and bool((c < 0.5).all())
                                                for d, c in zip(dead, bc)]))}
    firsts = [g[0] for g, d in zip(groups, dead) if d]
    return self.report(metrics, dgr,
                       f"{sum(dead)} of {len(groups)} groups are dead (DGR {dgr:.3f} > "
                       f"{self.threshold}): their advantages are zero",
                       lambda: evidence_of(firsts, range(len(firsts)),
                                           lambda e: f"group {e.group_id}, r {e.reward:.2f}"))


@gin.configurable(module="harness")
class RewardSpread(ThresholdDiagnostic):
  """Mean within-group reward std (`reward_spread`); finding when below threshold.

  Evidence: the first episode of the groups with the smallest spread.
  """

  name, layer = "reward_spread", "signal"

  def __init__(self, threshold: Optional[float] = 0.05, direction: str = "below",
               reward_key: Optional[str] = None, **kw):
    super().__init__(threshold, direction, **kw)
    self.reward_key = reward_key

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    groups = groups_of(episodes)
    if not groups:
      return Report({})
    stds = np.array([rewards_of(g, self.reward_key).std() for g in groups])
    value = float(stds.mean())
    firsts = [groups[i][0] for i in np.argsort(stds, kind="stable")]
    return self.report({"reward_spread": value, "reward_spread_min": float(stds.min())},
                       value, f"within-group reward std {value:.4f} < {self.threshold}: "
                       f"groups barely rank their rows",
                       lambda: evidence_of(firsts, range(len(firsts)),
                                           lambda e: f"group {e.group_id}"))


@gin.configurable(module="harness")
class AdvantageHealth(ThresholdDiagnostic):
  """Share of episodes with a non-zero advantage (`context['advantages']`, [n] or [n, T]).

  Finding when the share is below threshold; evidence: episodes whose advantage is zero.
  Reports nothing when the context has no advantages.
  """

  name, layer = "advantage_health", "signal"

  def __init__(self, threshold: Optional[float] = 0.5, direction: str = "below", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    adv = context.get("advantages")
    if adv is None or not episodes:
      return Report({})
    adv = np.asarray(adv, np.float64).reshape(len(episodes), -1)  # [n, 1] or [n, T]
    nonzero = (np.abs(adv) > EPS).any(axis=1)
    value = float(nonzero.mean())
    metrics = {"nonzero_advantage": value, "advantage_abs_mean": float(np.abs(adv).mean()),
               "advantage_std": float(adv.std())}
    return self.report(metrics, value,
                       f"only {value:.3f} of episodes have a non-zero advantage",
                       lambda: evidence_of(episodes, np.flatnonzero(~nonzero)))


__all__ = ["AdvantageHealth", "CorrectnessRate", "DeadGroupRatio", "RewardMean",
           "RewardSpread", "ScoreTrend"]
