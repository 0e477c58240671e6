"""evolution/stats.py against a naive loop with the same random draws, Holm's procedure
against hand-worked p-values and adjusted p-values, and the invariants a percentile
bootstrap interval must keep."""

import math

import numpy as np
import pytest

from evotrainer.evolution import stats


def _quantile(sorted_values: list, q: float) -> float:
  """numpy's default ('linear') quantile written out: interpolate at rank (n - 1) * q."""
  h = (len(sorted_values) - 1) * q
  lo = math.floor(h)
  hi = min(lo + 1, len(sorted_values) - 1)
  return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def naive_paired_test(child: dict, parent: dict, n: int, seed: int, alpha: float) -> dict:
  """One resample at a time: P indices drawn with replacement from default_rng(seed) over
  the shared problems in sorted-id order, the resample's mean, then the percentile
  interval and the one-sided p = (1 + #{means <= 0}) / (n + 1)."""
  ids = sorted(set(child) & set(parent))
  d = [child[k] - parent[k] for k in ids]
  rng = np.random.default_rng(seed)
  means = []
  for _ in range(n):
    picks = rng.integers(0, len(d), size=len(d))
    means.append(sum(d[int(i)] for i in picks) / len(d))
  ordered = sorted(means)
  return {"diff": sum(d) / len(d), "lo": _quantile(ordered, alpha / 2),
          "hi": _quantile(ordered, 1 - alpha / 2),
          "p": (1 + sum(m <= 0 for m in means)) / (n + 1), "problems": len(d)}


def _scores(num: int, seed: int, shift: float = 0.0) -> tuple[dict, dict]:
  """(child, parent) over `num` problems; child = parent + shift + noise."""
  rng = np.random.default_rng(seed)
  parent = {f"p{i:03d}": float(v) for i, v in enumerate(rng.uniform(0, 1, num))}
  child = {k: v + shift + float(rng.normal(0, 0.2)) for k, v in parent.items()}
  return child, parent


# ------------------------------------------------------------------ bootstrap


@pytest.mark.parametrize("num, shift, seed, alpha", [(7, 0.05, 0, 0.05), (30, 0.0, 3, 0.1),
                                                     (50, -0.1, 11, 0.05)])
def test_paired_test_equals_a_naive_loop_with_the_same_draws(num, shift, seed, alpha):
  child, parent = _scores(num, seed, shift)
  child["only_child"], parent["only_parent"] = 1.0, 0.0  # not shared: ignored
  got = stats.paired_test(child, parent, n=300, seed=seed, alpha=alpha)
  ref = naive_paired_test(child, parent, n=300, seed=seed, alpha=alpha)
  assert got["problems"] == ref["problems"] == num
  assert got["p"] == ref["p"]
  for k in ("diff", "lo", "hi"):
    assert got[k] == pytest.approx(ref[k], abs=1e-12), k
  assert stats.paired_bootstrap(child, parent, n=300, seed=seed, alpha=alpha) == (
      got["diff"], got["lo"], got["hi"])
  assert stats.beats(child, parent, alpha=alpha, n=300, seed=seed) == (ref["lo"] > 0)


def test_p_value_and_interval_by_hand_on_two_problems():
  # d = [+1, -1]. A resample of two picks has mean +1 (both the first), -1 (both the
  # second) or 0 (one of each), so p counts every resample but the (+1, +1) ones.
  child, parent = {"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}
  idx = np.random.default_rng(5).integers(0, 2, size=(99, 2))  # the module's draw
  both_first = int(((idx[:, 0] == 0) & (idx[:, 1] == 0)).sum())
  t = stats.paired_test(child, parent, n=99, seed=5)
  assert 0 < both_first < 99
  assert t["p"] == (1 + 99 - both_first) / 100
  assert (t["diff"], t["lo"], t["hi"]) == (0.0, -1.0, 1.0)


def test_interval_contains_the_mean_and_narrows_with_more_problems():
  child, parent = _scores(120, seed=1, shift=0.1)
  widths = []
  for num in (8, 30, 120):
    ids = sorted(child)[:num]
    diff, lo, hi = stats.paired_bootstrap({k: child[k] for k in ids},
                                          {k: parent[k] for k in ids}, seed=2)
    assert lo < diff < hi, num
    widths.append(hi - lo)
    # The normal approximation of the same interval: 2 * 1.96 * sd(d) / sqrt(P).
    d = np.array([child[k] - parent[k] for k in ids])
    assert hi - lo == pytest.approx(2 * 1.96 * d.std() / math.sqrt(num), rel=0.2), num
  assert widths[0] > widths[1] > widths[2]


def test_interval_is_nested_in_alpha_and_moves_with_a_constant_shift():
  child, parent = _scores(40, seed=4, shift=0.02)
  _, lo05, hi05 = stats.paired_bootstrap(child, parent, seed=0, alpha=0.05)
  _, lo20, hi20 = stats.paired_bootstrap(child, parent, seed=0, alpha=0.2)
  assert lo05 < lo20 < hi20 < hi05  # same draws: a lower level is a wider interval
  moved = stats.paired_bootstrap({k: v + 0.25 for k, v in child.items()}, parent, seed=0)
  assert moved == pytest.approx((stats.paired_bootstrap(child, parent, seed=0)[0] + 0.25,
                                 lo05 + 0.25, hi05 + 0.25))


def test_swapping_the_arms_mirrors_the_interval():
  child, parent = _scores(25, seed=6, shift=0.05)
  diff, lo, hi = stats.paired_bootstrap(child, parent, seed=9)
  assert stats.paired_bootstrap(parent, child, seed=9) == pytest.approx((-diff, -hi, -lo))


def test_a_pure_function_of_the_scores_and_the_seed():
  child, parent = _scores(20, seed=8)
  shuffled = dict(reversed(list(child.items())))  # insertion order does not matter
  t = stats.paired_test(child, parent, seed=3)
  assert stats.paired_test(shuffled, parent, seed=3) == t
  assert stats.paired_test(child, parent, seed=4)["lo"] != t["lo"]


def test_identical_arms_and_a_single_problem():
  same = {"a": 0.3, "b": 0.9}
  assert stats.paired_test(same, same, n=50) == {"diff": 0.0, "lo": 0.0, "hi": 0.0,
                                                 "p": 1.0, "problems": 2}
  assert not stats.beats(same, same)  # lo == 0 is not above zero
  # One problem: every resample is that problem, so the interval is a point.
  up = stats.paired_test({"a": 0.75}, {"a": 0.5}, n=49)
  assert up == {"diff": 0.25, "lo": 0.25, "hi": 0.25, "p": 1 / 50, "problems": 1}
  assert stats.beats({"a": 0.75}, {"a": 0.5})
  assert stats.paired_test({"a": 0.5}, {"a": 0.75}, n=49)["p"] == 1.0


def test_no_shared_problem_is_not_beyond_noise():
  for child, parent in [({}, {}), ({"a": 1.0}, {}), ({"a": 1.0}, {"b": 0.0})]:
    t = stats.paired_test(child, parent)
    assert (t["p"], t["problems"]) == (1.0, 0)
    assert all(math.isnan(t[k]) for k in ("diff", "lo", "hi"))
    assert not stats.beats(child, parent)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_score_that_is_not_finite_is_an_error_naming_the_problem(bad):
  # Silently, a NaN difference makes every resample mean NaN, and NaN <= 0 is False:
  # the p-value would say "better beyond noise" (1 / (n + 1)) on a broken score.
  with pytest.raises(ValueError, match=r"'p1'"):
    stats.paired_test({"p0": 0.5, "p1": bad}, {"p0": 0.5, "p1": 0.5}, n=99)
  with pytest.raises(ValueError, match=r"'p0'"):
    stats.paired_test({"p0": 0.5}, {"p0": bad}, n=99)


def test_fewer_than_one_resample_is_an_error():
  with pytest.raises(ValueError, match="n=0"):
    stats.paired_test({"a": 1.0}, {"a": 0.0}, n=0)


# ------------------------------------------------------------------ Holm


def naive_holm_adjusted(pvalues: list) -> list:
  """Holm's adjusted p-values: sorted ascending, p_(i) * (m - i) made monotone by a
  running maximum, capped at 1. Hypothesis i is rejected at alpha iff adjusted_i <= alpha."""
  m = len(pvalues)
  order = sorted(range(m), key=lambda i: pvalues[i])
  adjusted, running = [0.0] * m, 0.0
  for rank, i in enumerate(order):
    running = max(running, (m - rank) * pvalues[i])
    adjusted[i] = min(1.0, running)
  return adjusted


def test_holm_by_hand_with_adjusted_p_values():
  p = [0.004, 0.03, 0.012, 0.2, 0.011]
  # m = 5, ascending: 0.004 <= 0.05/5 = 0.01     reject
  #                   0.011 <= 0.05/4 = 0.0125   reject
  #                   0.012 <= 0.05/3 = 0.0167   reject
  #                   0.03  >  0.05/2 = 0.025    stop: 0.03 and 0.2 are kept
  assert stats.holm(p, 0.05) == [True, False, True, False, True]
  # Adjusted: 5*0.004 = 0.02, 4*0.011 = 0.044, max(3*0.012, 0.044) = 0.044,
  # 2*0.03 = 0.06, max(1*0.2, 0.06) = 0.2.
  assert naive_holm_adjusted(p) == pytest.approx([0.02, 0.06, 0.044, 0.2, 0.044])
  # At alpha = 0.03 only the smallest survives (0.011 > 0.03/4 = 0.0075).
  assert stats.holm(p, 0.03) == [True, False, False, False, False]


def test_holm_equals_adjusted_p_values_and_keeps_its_invariants():
  rng = np.random.default_rng(0)
  for trial in range(200):
    m = int(rng.integers(1, 9))
    p = [float(x) for x in rng.uniform(0, 0.08, m) ** (1 + trial % 3)]
    alpha = float(rng.choice([0.01, 0.025, 0.05]))
    got = stats.holm(p, alpha)
    adjusted = naive_holm_adjusted(p)
    assert got == [a <= alpha for a in adjusted], (p, alpha)
    assert all(a >= x for a, x in zip(adjusted, p))  # adjusting never lowers a p-value
    by_p = sorted(range(m), key=lambda i: p[i])
    assert all(adjusted[i] <= adjusted[j] for i, j in zip(by_p, by_p[1:]))  # monotone
    # Between Bonferroni (every p against alpha / m) and no correction at all.
    assert all(g >= (x <= alpha / m) and g <= (x <= alpha) for g, x in zip(got, p))
    perm = rng.permutation(m)
    assert stats.holm([p[i] for i in perm], alpha) == [got[i] for i in perm]


def test_holm_on_one_hypothesis_is_the_plain_test():
  assert stats.holm([0.05], 0.05) == [True]
  assert stats.holm([0.0500001], 0.05) == [False]


@pytest.mark.parametrize("bad", [math.nan, -0.1, 1.5])
def test_holm_refuses_a_p_value_outside_0_1(bad):
  # Silently, NaN > threshold is False: a NaN p-value would be rejected (kept).
  with pytest.raises(ValueError, match="p-value"):
    stats.holm([0.01, bad], 0.05)


# ------------------------------------------------------------------ score label


def test_score_label_names_k_from_the_evaluation_keys():
  assert stats.score_label({"avg8": 0.3, "pass4": 0.5, "avg4": 0.3}) == "avg@4"
  assert stats.score_label({"avg16": 0.3}) == "avg@16"
  # 'avg8' alone is the stored name whatever k is: it says nothing about k.
  assert stats.score_label({"avg8": 0.3, "reward": 1.0}) == "avg8"
  assert stats.score_label({}) == "avg8"
  assert stats.score_label({"avg8x": 0.1, "pass": 1.0}) == "avg8"


def test_pooled_effect_is_the_inverse_variance_mean_worked_by_hand():
  # Standard errors 0.1 and 0.2 (half-widths 0.196 and 0.392): weights 100 and 25.
  a = {"diff": 0.10, "lo": 0.10 - 0.196, "hi": 0.10 + 0.196}
  b = {"diff": 0.00, "lo": -0.392, "hi": 0.392}
  e = stats.pooled_effect([a, b])
  assert e["n"] == 2
  assert e["mean"] == pytest.approx((100 * 0.10 + 25 * 0.0) / 125)  # 0.08
  se = 1 / math.sqrt(125)
  assert (e["lo"], e["hi"]) == (pytest.approx(0.08 - 1.96 * se), pytest.approx(0.08 + 1.96 * se))
  # Two equal measurements: the same mean, the interval narrower by sqrt(2).
  e2 = stats.pooled_effect([a, a])
  assert e2["mean"] == pytest.approx(0.10)
  assert e2["hi"] - e2["lo"] == pytest.approx(2 * 0.196 / math.sqrt(2))


def test_pooled_effect_skips_measurements_that_are_not_finite():
  nan = {"diff": math.nan, "lo": math.nan, "hi": math.nan}
  assert stats.pooled_effect([nan])["n"] == 0 and math.isnan(stats.pooled_effect([])["mean"])
  one = {"diff": 0.05, "lo": 0.0, "hi": 0.1}
  assert stats.pooled_effect([nan, one])["mean"] == pytest.approx(0.05)
  # A zero-width interval is floored, not given infinite weight.
  assert stats.pooled_effect([{"diff": 0.2, "lo": 0.2, "hi": 0.2}, one])["n"] == 2
