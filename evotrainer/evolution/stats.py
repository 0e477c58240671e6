"""The noise estimate behind promotion: a paired bootstrap over held-out problems.

A branch and its parent are evaluated on the same held-out problems (common random
numbers: same prompts, same seeds), so the per-problem differences are paired; resampling
the problems with replacement gives a confidence interval of the mean difference
(Efron & Tibshirani, "An Introduction to the Bootstrap", ch. 13, percentile interval).
A branch is better *beyond noise* only when the whole interval lies above zero.

Several branches of one generation are several tests, and the controller keeps the best
of them: `holm` (Holm 1979, "A simple sequentially rejective multiple test procedure")
corrects their one-sided bootstrap p-values, so the chance of keeping any branch that is
not truly better stays at the level of one test.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

import numpy as np


def paired_test(child: Mapping[str, float], parent: Mapping[str, float], n: int = 2000,
                seed: int = 0, alpha: float = 0.05) -> dict:
  """`paired_bootstrap`'s mean and interval plus the one-sided p-value of "child is no
  better": p = (1 + #{resampled means <= 0}) / (n + 1). Keys diff, lo, hi, p, problems.
  A shared problem whose score is not finite, or n < 1, is a ValueError."""
  if n < 1:
    raise ValueError(f"paired_test: n={n} bootstrap resamples; expected at least 1")
  common = sorted(set(child) & set(parent))
  broken = [k for k in common if not math.isfinite(float(child[k]) - float(parent[k]))]
  if broken:  # a NaN mean is never <= 0: p would read as "better beyond noise"
    raise ValueError(f"paired_test: scores that are not finite for problems {broken[:5]}")
  if not common:
    return {"diff": math.nan, "lo": math.nan, "hi": math.nan, "p": 1.0, "problems": 0}
  d = np.array([float(child[k]) - float(parent[k]) for k in common], np.float64)  # [P]
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(d), size=(n, len(d)))  # [n, P]
  means = d[idx].mean(axis=1)  # [n]
  lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
  p = (1.0 + float((means <= 0).sum())) / (n + 1.0)
  return {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "p": p,
          "problems": len(common)}


def holm(pvalues: Sequence[float], alpha: float) -> list[bool]:
  """Holm's step-down procedure: which hypotheses are rejected at family-wise `alpha`.

  The i-th smallest p-value (i = 0, 1, ...) is compared with alpha / (m - i); rejection
  stops at the first that exceeds it.
  """
  bad = [p for p in pvalues if not 0.0 <= p <= 1.0]
  if bad:  # NaN > threshold is False: a NaN p-value would be rejected
    raise ValueError(f"holm: p-values outside [0, 1]: {bad}")
  order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
  out = [False] * len(pvalues)
  for rank, i in enumerate(order):
    if pvalues[i] > alpha / (len(pvalues) - rank):
      break
    out[i] = True
  return out


def paired_bootstrap(child: Mapping[str, float], parent: Mapping[str, float], n: int = 2000,
                     seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
  """Mean and (1 - alpha) percentile interval of child - parent over shared problems.

  Args:
    child, parent: {task_id: score} (e.g. mean correctness over k samples).
    n: bootstrap resamples.
    seed: resampling seed (the result is a pure function of the inputs and the seed).
    alpha: two-sided level of the interval.

  Returns:
    (mean_diff, lo, hi); all NaN when the two share no problem.
  """
  t = paired_test(child, parent, n=n, seed=seed, alpha=alpha)
  return (t["diff"], t["lo"], t["hi"])


def beats(child: Mapping[str, float], parent: Mapping[str, float], alpha: float = 0.05,
          n: int = 2000, seed: int = 0) -> bool:
  """True when child - parent is positive beyond noise: the interval's lower bound > 0."""
  _, lo, _ = paired_bootstrap(child, parent, n=n, seed=seed, alpha=alpha)
  return bool(lo > 0)


def pooled_effect(effects: Sequence[Mapping[str, float]], z: float = 1.96) -> dict:
  """The fixed-effect (inverse-variance) pooling of several measurements of one change's
  effect, each {diff, lo, hi} with a 95% interval: each interval's half-width / z is its
  standard error (floored at 1e-3, so a zero-width interval cannot take all the weight).
  Returns {mean, lo, hi, n}; n = 0 (and NaN figures) when none is finite."""
  rows = [(float(e["diff"]), max((float(e["hi"]) - float(e["lo"])) / (2 * z), 1e-3))
          for e in effects
          if all(math.isfinite(float(e[k])) for k in ("diff", "lo", "hi"))]
  if not rows:
    return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
  w = np.array([1.0 / se ** 2 for _, se in rows])
  mean = float(np.dot(w, [d for d, _ in rows]) / w.sum())
  se = float(1.0 / math.sqrt(w.sum()))
  return {"mean": mean, "lo": mean - z * se, "hi": mean + z * se, "n": len(rows)}


__all__ = ["beats", "holm", "paired_bootstrap", "paired_test", "pooled_effect"]


def score_label(figures: Mapping) -> str:
  """How to name a version's mean per-problem score (stored under 'avg8' whatever k is):
  'avg@k' with k read from the evaluation's own `pass{k}` / `avg{k}` keys; 'avg8' when
  the figures do not say."""
  for key in figures:
    m = re.fullmatch(r"(?:pass|avg)(\d+)", str(key))
    if m and (key != "avg8" or "pass8" in figures):
      return f"avg@{m.group(1)}"
  return "avg8"
