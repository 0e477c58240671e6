"""The benchmark's paired interval, by hand (the arms themselves are whole runs)."""

import pytest

from bench.evolve_vs_static import paired_interval


def test_a_constant_shift_is_its_own_interval():
  a = {f"p{i}": 0.5 + 0.1 for i in range(20)}
  b = {f"p{i}": 0.5 for i in range(20)}
  out = paired_interval([(a, b), (a, b)], n=200)
  assert out["mean"] == pytest.approx(0.1)
  assert out["lo"] == pytest.approx(0.1) and out["hi"] == pytest.approx(0.1)


def test_seed_to_seed_variation_widens_the_interval():
  b = {f"p{i}": 0.5 for i in range(50)}
  up = {k: v + 0.2 for k, v in b.items()}
  down = {k: v - 0.1 for k, v in b.items()}
  # Inside each seed every problem moves alike: only the seeds disagree.
  out = paired_interval([(up, b), (down, b)], n=2000, seed=1)
  assert out["mean"] == pytest.approx(0.05)
  assert out["lo"] == pytest.approx(-0.1) and out["hi"] == pytest.approx(0.2)


def test_only_shared_problems_are_paired():
  a = {"p0": 1.0, "p1": 0.0, "extra": 1.0}
  b = {"p0": 0.0, "p1": 0.0}
  assert paired_interval([(a, b)], n=100)["mean"] == pytest.approx(0.5)
  assert paired_interval([({"x": 1.0}, {"y": 0.0})])["mean"] is None
