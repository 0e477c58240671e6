"""Diagnostics: metrics per layer (METHOD.md, step 2) with thresholds that emit Findings.

Each diagnostic is a gin-configurable class (`module="harness"`) with a `name`, a `layer`
(one of `types.LAYERS`), a `threshold` and a `direction` ('above': a finding when the
value is strictly above the threshold; 'below': strictly below; `threshold=None`: metrics
only). `__call__(episodes, context) -> Report(metrics, findings)`; each Finding carries
up to `max_evidence` `(episode_id, snippet)` pairs chosen to illustrate it. Diagnostics
are pure functions of their inputs, so any of them can be replayed on stored rollouts.

Layers and the library names (`DIAGNOSTICS`):
  score       bc, reward, score_trend
  signal      dead_group_ratio, reward_spread, advantage_health
  behaviour   length_reward_corr, format_failure, answer_spamming, repetition, domain
  model       entropy, kl, clip_fraction, grad_norm
  efficiency  length, truncation, turns

`context` keys read (all optional; a diagnostic whose input is missing reports nothing):
  'heldout':    {name: value} held-out figures, e.g. {'avg8': .4, 'pass8': .7, 'greedy': .5}.
  'incumbent':  {name: value} the incumbent version's figures, same names ('avg8', 'bc').
  'advantages': [n] or [n, T] advantages aligned with `episodes`.
  'learner':    the learner's step metrics {'entropy', 'approx_kl', 'kl', 'clip_frac_low',
                'clip_frac_high', 'grad_norm', ...}; flat 'learner/<k>' keys (as train.py
                writes them) are read too.
  'series':     {name: [earlier values]}, e.g. 'grad_norm', for spike detection.

A per-domain analyzer is either `DomainDiagnostic(fn="my.module:fn", ...)`, or a class of
your own: give it `name`, `layer` and `__call__(episodes, context) -> Report`, decorate
it with `@gin.configurable(module="harness")` and `@register`, load its module with
`--import=my.module`, and name it in gin like a built-in one.
"""

from __future__ import annotations

import collections
import importlib
import itertools
from typing import Callable, Optional, Sequence, Union

import gin
import numpy as np

from evotrainer.harness.base import Report, groups_of, registrar, snippet
from evotrainer.tasks.verify import count_candidates
from evotrainer.types import LAYERS, Episode, Finding

DIRECTIONS = ("above", "below")
_EPS = 1e-9  # slack for float round-off in threshold comparisons and zero tests

# ------------------------------------------------------------------ pure metric functions


def rewards_of(episodes: Sequence[Episode], key: Optional[str] = None) -> np.ndarray:
  """[n] the composed reward (`key=None`) or the reward part `key` of each episode."""
  if key is None:
    return np.array([ep.reward for ep in episodes], np.float64)
  return np.array([float(ep.reward_parts.get(key, np.nan)) for ep in episodes], np.float64)


def lengths_of(episodes: Sequence[Episode]) -> np.ndarray:
  """[n] completion lengths: tokens when every episode has `completion_ids`, else words."""
  if all(ep.completion_ids is not None for ep in episodes):
    return np.array([ep.length for ep in episodes], np.float64)
  return np.array([len(ep.completion.split()) for ep in episodes], np.float64)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation of two [n] arrays; NaN when either does not vary."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  dx, dy = x - x.mean(), y - y.mean()
  den = np.sqrt((dx * dx).sum() * (dy * dy).sum())
  return float((dx * dy).sum() / den) if den > _EPS else float("nan")


def is_dead(rewards: np.ndarray, atol: float = _EPS) -> bool:
  """A group is dead when its rewards have zero variance (GRPO advantages all zero)."""
  return bool(np.ptp(rewards) <= atol)


def has_loop(text: str, n: int = 8, min_repeats: int = 4) -> bool:
  """Whether some word n-gram occurs `min_repeats` times or more (an echo-trap loop).

  Words are whitespace-separated; independent of the tokenizer and of the filters.
  """
  words = text.split()
  counts = collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
  return bool(counts) and max(counts.values()) >= min_repeats


def learner_metric(context: dict, key: str) -> Optional[float]:
  """A learner metric from `context['learner'][key]` or `context['learner/' + key]`."""
  value = (context.get("learner") or {}).get(key, context.get(f"learner/{key}"))
  return None if value is None else float(np.asarray(value))


def _tail(text: str, width: int = 80) -> str:
  """The end of a text as a one-line excerpt (loops and truncations show at the end)."""
  text = " ".join(text.split())
  return text if len(text) <= width else "..." + text[-(width - 3):]


# ------------------------------------------------------------------ the shared wiring


class _Diagnostic:
  """Threshold, direction, evidence size and severity shared by every diagnostic."""

  name = ""
  layer = ""

  def __init__(self, threshold: Optional[float], direction: str = "above",
               max_evidence: int = 5, severity: float = 0.5):
    if direction not in DIRECTIONS:
      raise ValueError(f"{type(self).__name__}.direction={direction!r}; "
                       f"expected one of {DIRECTIONS}")
    if not 0.0 <= severity <= 1.0:
      raise ValueError(f"{type(self).__name__}.severity={severity}; expected 0..1")
    self.threshold = threshold
    self.direction = direction
    self.max_evidence = max_evidence
    self.severity = severity

  def crossed(self, value: Optional[float]) -> bool:
    """Strictly beyond the threshold in `direction` (NaN and None never cross)."""
    if self.threshold is None or value is None or np.isnan(value):
      return False
    if self.direction == "above":
      return value > self.threshold + _EPS
    return value < self.threshold - _EPS

  def finding(self, value: float, message: str, evidence=(), severity=None) -> Finding:
    return Finding(kind=self.name, layer=self.layer,
                   severity=self.severity if severity is None else severity,
                   value=float(value), threshold=float(self.threshold), message=message,
                   evidence=tuple(itertools.islice(evidence, self.max_evidence)))

  def report(self, metrics: dict, value: Optional[float],
             message: Union[str, Callable[[], str]],
             evidence: Callable[[], Sequence] = tuple) -> Report:
    """`metrics`, plus a finding when `value` crosses; a callable message and the
    evidence are built only then (a message may format a value that can be None)."""
    if not self.crossed(value):
      return Report(metrics)
    text = message() if callable(message) else message
    return Report(metrics, (self.finding(value, text, evidence()),))

  def __repr__(self) -> str:
    return f"{type(self).__name__}(threshold={self.threshold}, direction={self.direction!r})"


def _ev(episodes: Sequence[Episode], order: Sequence[int], note=None, tail=False):
  """Yields (episode_id, snippet) for episodes[i], i in order; `note(ep)` prefixes the
  text. Lazy: `finding` takes only the first `max_evidence`."""
  for i in order:
    ep = episodes[int(i)]
    text = _tail(ep.completion) if tail else snippet(ep.completion)
    yield ep.episode_id, (f"[{note(ep)}] {text}" if note else text)


# ------------------------------------------------------------------ score layer


@gin.configurable(module="harness")
class CorrectnessRate(_Diagnostic):
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
                       lambda: _ev(episodes, wrong))


@gin.configurable(module="harness")
class RewardMean(_Diagnostic):
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
                       lambda: _ev(episodes, order, lambda e: f"r {e.reward:.2f}"))


@gin.configurable(module="harness")
class ScoreTrend(_Diagnostic):
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
    trend = 0 if abs(delta) <= self.threshold + _EPS else int(np.sign(delta))
    metrics.update(trend_delta=delta, trend=float(trend))
    word = {1: "improving", 0: "flat", -1: "regressing"}[trend]
    # Illustrate an improvement with successes, flat and regressing with failures.
    order = [i for i, c in enumerate(bc) if (c >= 0.5) == (trend > 0)]
    message = (f"{word}: {self.metric} {current[self.metric]:.4f} vs incumbent "
               f"{float(incumbent[self.metric]):.4f} ({delta:+.4f}, flat band "
               f"{self.threshold})")
    return Report(metrics, (self.finding(delta, message, _ev(episodes, order),
                                         severity={1: 0.0, 0: 0.3, -1: 0.7}[trend]),))


# ------------------------------------------------------------------ signal layer


@gin.configurable(module="harness")
class DeadGroupRatio(_Diagnostic):
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
                       lambda: _ev(firsts, range(len(firsts)),
                                   lambda e: f"group {e.group_id}, r {e.reward:.2f}"))


@gin.configurable(module="harness")
class RewardSpread(_Diagnostic):
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
                       lambda: _ev(firsts, range(len(firsts)),
                                   lambda e: f"group {e.group_id}"))


@gin.configurable(module="harness")
class AdvantageHealth(_Diagnostic):
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
    nonzero = (np.abs(adv) > _EPS).any(axis=1)
    value = float(nonzero.mean())
    metrics = {"nonzero_advantage": value, "advantage_abs_mean": float(np.abs(adv).mean()),
               "advantage_std": float(adv.std())}
    return self.report(metrics, value,
                       f"only {value:.3f} of episodes have a non-zero advantage",
                       lambda: _ev(episodes, np.flatnonzero(~nonzero)))


# ------------------------------------------------------------------ behaviour layer


@gin.configurable(module="harness")
class LengthRewardCorrelation(_Diagnostic):
  """Pearson correlation of completion length and reward (length gaming when > 0.3).

  Also `length_reward_corr_within`: the mean of per-group correlations (groups whose
  length and reward both vary), free of the problem-difficulty confound. The finding
  needs rewards that vary; evidence: the longest episodes with reward >= the mean.
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
    high = np.flatnonzero(r >= r.mean() - _EPS)
    order = high[np.argsort(-lengths[high], kind="stable")]
    return self.report(metrics, corr,
                       f"length and reward correlate ({corr:.3f} > {self.threshold}): "
                       f"possible length gaming",
                       lambda: _ev(episodes, order, lambda e: f"len {e.length or '?'}, r "
                                   f"{e.reward:.2f}"))


@gin.configurable(module="harness")
class FormatFailureRate(_Diagnostic):
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
                       f"{self.threshold})", lambda: _ev(episodes, order, tail=True))


@gin.configurable(module="harness")
class AnswerSpammingRate(_Diagnostic):
  """Share of completions marking >= 2 distinct answers (`tasks.verify.count_candidates`).

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
                       lambda: _ev(episodes, order,
                                   lambda e: f"{count_candidates(e.completion)} answers"))


@gin.configurable(module="harness")
class RepetitionRate(_Diagnostic):
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
                       lambda: _ev(episodes, np.flatnonzero(loops), tail=True))


@gin.configurable(module="harness")
class DomainDiagnostic(_Diagnostic):
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


# ------------------------------------------------------------------ model state


@gin.configurable(module="harness")
class EntropyCollapse(_Diagnostic):
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
                       lambda: _ev(with_lp, order,
                                   lambda e: f"mean logprob {np.mean(e.logprobs):.3f}"))


def _largest_advantage(episodes: Sequence[Episode], context: dict):
  """Episodes with the largest |advantage|: the ones that drive an update."""
  adv = context.get("advantages")
  if adv is None or not episodes:
    return ()
  adv = np.abs(np.asarray(adv, np.float64).reshape(len(episodes), -1)).max(axis=1)
  return _ev(episodes, np.argsort(-adv, kind="stable"), lambda e: "large |advantage|")


@gin.configurable(module="harness")
class KLDrift(_Diagnostic):
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
class ClipFraction(_Diagnostic):
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
class GradNormSpike(_Diagnostic):
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
    ratio = metrics["grad_norm_ratio"] = gn / max(med, _EPS)
    return self.report(metrics, ratio, f"grad norm {gn:.3g} is {ratio:.1f}x the median "
                       f"{med:.3g} of earlier steps",
                       lambda: _largest_advantage(episodes, context))


# ------------------------------------------------------------------ efficiency


@gin.configurable(module="harness")
class LengthPercentiles(_Diagnostic):
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
                       lambda: _ev(episodes, np.argsort(-lengths, kind="stable"),
                                   lambda e: f"len {e.length}", tail=True))


@gin.configurable(module="harness")
class TruncationRate(_Diagnostic):
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
                       lambda: _ev(episodes, np.flatnonzero(cut), tail=True))


@gin.configurable(module="harness")
class TurnCount(_Diagnostic):
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
                       lambda: _ev(have, np.argsort(-turns, kind="stable"),
                                   lambda e: f"{e.info['turns']} turns", tail=True))


# ------------------------------------------------------------------ library and runner

DIAGNOSTICS: dict = {}


register = registrar(DIAGNOSTICS, "diagnostic")


for _cls in (CorrectnessRate, RewardMean, ScoreTrend, DeadGroupRatio, RewardSpread,
             AdvantageHealth, LengthRewardCorrelation, FormatFailureRate,
             AnswerSpammingRate, RepetitionRate, EntropyCollapse, KLDrift, ClipFraction,
             GradNormSpike, LengthPercentiles, TruncationRate, TurnCount):
  register(_cls)
DIAGNOSTICS["domain"] = DomainDiagnostic  # needs `fn`; not in `default_diagnostics`


@gin.configurable(module="harness")
def default_diagnostics() -> list:
  """One instance, default knobs, of every library diagnostic except `domain`."""
  return [cls() for name, cls in DIAGNOSTICS.items() if name != "domain"]


def run_diagnostics(diags: Sequence, episodes: Sequence[Episode],
                    context: Optional[dict] = None) -> tuple[dict, list]:
  """Runs diagnostics and merges their reports.

  A metric keeps its own name (`dead_group_ratio`, `length_p90`) unless several
  diagnostics report the same name; then each of them is prefixed with its diagnostic's
  name (`"<diagnostic>/<metric>"`). Findings keep the order of `diags`.

  Returns:
    `(metrics, findings)`: {name: float} and a list of `Finding`.
  """
  context = context or {}
  names = [d.name for d in diags]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"run_diagnostics: diagnostic names must be unique, repeated: {dup}")
  reports = []
  for d in diags:
    try:
      reports.append(d(episodes, context))
    except Exception as e:
      raise RuntimeError(f"diagnostic {d.name!r} ({type(d).__name__}) failed: "
                         f"{type(e).__name__}: {e}") from e
  seen = collections.Counter(m for r in reports for m in r.metrics)
  metrics, findings = {}, []
  for d, r in zip(diags, reports):
    for m, v in r.metrics.items():
      metrics[f"{d.name}/{m}" if seen[m] > 1 else m] = float(v)
    findings.extend(r.findings)
  return metrics, findings


__all__ = ["DIAGNOSTICS", "DIRECTIONS", "AdvantageHealth", "AnswerSpammingRate",
           "ClipFraction", "CorrectnessRate", "DeadGroupRatio", "DomainDiagnostic",
           "EntropyCollapse", "FormatFailureRate", "GradNormSpike", "KLDrift",
           "LengthPercentiles", "LengthRewardCorrelation", "RepetitionRate", "RewardMean",
           "RewardSpread", "ScoreTrend", "TruncationRate", "TurnCount", "default_diagnostics",
           "has_loop", "is_dead", "learner_metric", "lengths_of", "pearson", "register",
           "rewards_of", "run_diagnostics"]
