"""Stability: drift toward collapse over a training segment, read from its per-step series.

A version can drift while its held-out score still rises: entropy climbing, completions
creeping to the token limit, the clip fraction growing, the sampled reward falling from
its best. Its children then collapse whatever they change. `drift_signals` compares the
mean of the segment's last `window` steps with its first `window` steps (the reward: with
its best window) for each series a branch records (modes/branch.py `branch_result`):

  entropy     relative rise > `entropy_rise` (and by more than `min_entropy_rise` nats)
  length      mean completion length, relative rise > `length_rise`
  truncated   share of completions cut at the token limit, rise > `truncation_rise`
  clip_frac   PPO clip fraction (low + high), rise > `clip_rise`
  reward      sampled reward below `reward_fall` x its best window

On the main job's healthy versions none fires (entropy within -15%..+0%, length within
+-2%, truncation < 0.02); on the drifting version of a collapse (entropy 0.13 -> 0.22,
length 9.9 -> 14.4 of 16) entropy and length both do. `TrainingDrift` is the diagnostic
(a finding per drifting segment, the curves as evidence); validators.TrainingStability
is the gate (fails on `min_signals` signals, or on a reward collapse alone).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report
from evotrainer.harness.diagnostics.base import ThresholdDiagnostic
from evotrainer.types import Episode


def _ends(values: Sequence[float], window: int) -> Optional[tuple[float, float]]:
  v = np.asarray([x for x in values if x is not None and np.isfinite(x)], np.float64)
  if len(v) < 2 * window:
    return None
  return float(v[:window].mean()), float(v[-window:].mean())


def drift_signals(series: Mapping[str, Sequence[float]], window: int = 5,
                  entropy_rise: float = 0.5, min_entropy_rise: float = 0.05,
                  length_rise: float = 0.25, truncation_rise: float = 0.1,
                  clip_rise: float = 0.05, reward_fall: float = 0.5) -> list[dict]:
  """The drift signals of a segment: [{'series', 'first', 'last', 'why'}] (see the module
  docstring); a series shorter than 2 x `window` steps gives none."""
  out = []

  def add(name: str, first: float, last: float, why: str) -> None:
    out.append({"series": name, "first": first, "last": last, "why": why})

  e = _ends(series.get("entropy", ()), window)
  if e and e[1] - e[0] > min_entropy_rise and e[1] > (1 + entropy_rise) * e[0]:
    add("entropy", *e, f"entropy rose {e[0]:.3f} -> {e[1]:.3f}")
  n = _ends(series.get("length", ()), window)
  if n and n[1] > (1 + length_rise) * n[0]:
    add("length", *n, f"completion length crept {n[0]:.1f} -> {n[1]:.1f}")
  t = _ends(series.get("truncated", ()), window)
  if t and t[1] - t[0] > truncation_rise:
    add("truncated", *t, f"truncation rose {t[0]:.3f} -> {t[1]:.3f}")
  c = _ends(series.get("clip_frac", ()), window)
  if c and c[1] - c[0] > clip_rise:
    add("clip_frac", *c, f"clip fraction grew {c[0]:.3f} -> {c[1]:.3f}")
  r = np.asarray(series.get("reward", ()), np.float64)
  if len(r) >= 2 * window:
    windows = np.convolve(r, np.ones(window) / window, mode="valid")  # [len - window + 1]
    best, last = float(windows.max()), float(windows[-1])
    if best > 0.05 and last < reward_fall * best:
      add("reward", best, last, f"sampled reward fell {best:.3f} -> {last:.3f} from its best")
  return out


@gin.configurable(module="harness")
class TrainingDrift(ThresholdDiagnostic):
  """Drift toward collapse over the training segment in `context['series']`: the number
  of `drift_signals` (a finding from one; evidence: each drifting curve's two ends).

  Args:
    window: steps averaged at each end of the segment.
    signal_kw: thresholds of `drift_signals` (`entropy_rise`, `length_rise`, ...).
  """

  name, layer = "training_drift", "model"

  def __init__(self, threshold: Optional[float] = 0.5, direction: str = "above",
               window: int = 5, signal_kw: Optional[dict] = None, **kw):
    super().__init__(threshold, direction, **kw)
    self.window, self.signal_kw = window, dict(signal_kw or {})

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    series = (context or {}).get("series") or {}
    if not series:
      return Report({})
    signals = drift_signals(series, self.window, **self.signal_kw)
    return self.report({"drift_signals": float(len(signals))}, float(len(signals)),
                       lambda: "training drifts toward collapse: " + "; ".join(
                           s["why"] for s in signals),
                       lambda: [(f"series:{s['series']}", f"{s['first']:.4g} -> {s['last']:.4g}")
                                for s in signals])


__all__ = ["TrainingDrift", "drift_signals"]
