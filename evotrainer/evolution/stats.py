"""The noise estimate behind promotion: a paired bootstrap over held-out problems.

A branch and its parent are evaluated on the same held-out problems (common random
numbers: same prompts, same seeds), so the per-problem differences are paired; resampling
the problems with replacement gives a confidence interval of the mean difference
(Efron & Tibshirani, "An Introduction to the Bootstrap", ch. 13, percentile interval).
A branch is better *beyond noise* only when the whole interval lies above zero.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np


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
  common = sorted(set(child) & set(parent))
  if not common:
    return (math.nan, math.nan, math.nan)
  d = np.array([float(child[k]) - float(parent[k]) for k in common], np.float64)  # [P]
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(d), size=(n, len(d)))  # [n, P]
  means = d[idx].mean(axis=1)  # [n]
  lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
  return float(d.mean()), float(lo), float(hi)


def beats(child: Mapping[str, float], parent: Mapping[str, float], alpha: float = 0.05,
          n: int = 2000, seed: int = 0) -> bool:
  """True when child - parent is positive beyond noise: the interval's lower bound > 0."""
  _, lo, _ = paired_bootstrap(child, parent, n=n, seed=seed, alpha=alpha)
  return bool(lo > 0)


__all__ = ["beats", "paired_bootstrap"]
