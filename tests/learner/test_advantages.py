"""Advantage estimators against hand-computed values and a plain-Python GAE loop."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from evotrainer.learner import advantages as adv_lib

# Two groups of 4 contiguous completions with binary rewards:
#   group A = [1, 0, 0, 0]: mean 1/4, population std sqrt(1/4 * 3/4) = sqrt(3)/4
#   group B = [1, 1, 0, 0]: mean 1/2, population std 1/2
REWARDS = jnp.array([1., 0., 0., 0., 1., 1., 0., 0.])
S3 = math.sqrt(3.0)


def test_grpo_two_groups():
  got = adv_lib.grpo_advantages(REWARDS, group_size=4, eps=0.0)
  # A: (1 - 1/4) / (sqrt3/4) = sqrt3, (0 - 1/4) / (sqrt3/4) = -1/sqrt3.  B: +-1.
  want = [S3, -1 / S3, -1 / S3, -1 / S3, 1., 1., -1., -1.]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_grpo_unbiased_std():
  # ddof=1 (TRL / verl): A: var = (9/16 + 3/16) / 3 = 1/4, std 1/2 -> [3/2, -1/2, ...].
  # B: var = 4 * 1/4 / 3 = 1/3, std 1/sqrt3 -> +-sqrt3/2.
  got = adv_lib.grpo_advantages(REWARDS, group_size=4, eps=0.0, ddof=1)
  want = [1.5, -0.5, -0.5, -0.5, S3 / 2, S3 / 2, -S3 / 2, -S3 / 2]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_grpo_eps_is_added_to_std():
  got = adv_lib.grpo_advantages(REWARDS, group_size=4, eps=0.5)
  np.testing.assert_allclose(got[4], 0.5 / (0.5 + 0.5), rtol=1e-6)


def test_dr_grpo_two_groups():
  got = adv_lib.dr_grpo_advantages(REWARDS, group_size=4)
  want = [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_rloo_two_groups():
  got = adv_lib.rloo_advantages(REWARDS, group_size=4)
  # A: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3.
  # B: 1 - mean(1,0,0) = 2/3; 0 - mean(1,1,0) = -2/3.
  want = [1., -1 / 3, -1 / 3, -1 / 3, 2 / 3, 2 / 3, -2 / 3, -2 / 3]
  np.testing.assert_allclose(got, want, rtol=1e-6)


# Row 3 of group A and rows 5..7 of group B were dropped by a filter; their rewards
# are garbage and must not leak into the statistics.
MASKED_REWARDS = jnp.array([1., 0., 0., 100., 1., -50., 7., 7.])
ROW_MASK = jnp.array([True, True, True, False, True, False, False, False])


def test_grpo_masked_rows():
  got = adv_lib.grpo_advantages(MASKED_REWARDS, 4, mask=ROW_MASK, eps=0.0)
  # A valid = [1, 0, 0]: mean 1/3, std sqrt(2)/3 -> [sqrt2, -1/sqrt2, -1/sqrt2].
  # B has a single valid row -> no relative signal -> 0.
  r2 = math.sqrt(2.0)
  want = [r2, -1 / r2, -1 / r2, 0., 0., 0., 0., 0.]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_dr_grpo_masked_rows():
  got = adv_lib.dr_grpo_advantages(MASKED_REWARDS, 4, mask=ROW_MASK)
  np.testing.assert_allclose(got, [2 / 3, -1 / 3, -1 / 3, 0., 0., 0., 0., 0.], rtol=1e-6)


def test_rloo_masked_rows():
  got = adv_lib.rloo_advantages(MASKED_REWARDS, 4, mask=ROW_MASK)
  np.testing.assert_allclose(got, [1., -0.5, -0.5, 0., 0., 0., 0., 0.], rtol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_dead_group_is_zero_not_nan(name):
  got = adv_lib.ESTIMATORS[name](jnp.array([1., 1., 1., 0., 0., 0.]), 3)
  np.testing.assert_array_equal(got, np.zeros(6))


def test_bad_group_size_raises():
  with pytest.raises(ValueError, match="multiple of group_size"):
    adv_lib.grpo_advantages(jnp.zeros(7), group_size=4)


# ----------------------------------------------------------------------------- GAE


def test_gae_hand_example():
  # gamma = 0.5, lam = 1, values 0: returns are discounted reward-to-go [0.25, 0.5, 1];
  # the padded 4th step (reward 7) must not contribute.
  rewards = jnp.array([[0., 0., 1., 7.]])
  values = jnp.zeros((1, 4))
  mask = jnp.array([[True, True, True, False]])
  adv, ret = adv_lib.gae(rewards, values, mask, gamma=0.5, lam=1.0)
  np.testing.assert_allclose(adv, [[0.25, 0.5, 1.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(ret, [[0.25, 0.5, 1.0, 0.0]], rtol=1e-6)


def test_gae_hand_example_with_values_and_bootstrap():
  # gamma = lam = 1, V = 0.5 everywhere, bootstrap V_T = 2:
  # delta = [0, 0, 1 + 2 - 0.5] = [0, 0, 2.5]; A = [2.5, 2.5, 2.5]; returns = A + V = 3.
  rewards = jnp.array([[0., 0., 1.]])
  values = jnp.array([[0.5, 0.5, 0.5, 2.0]])
  mask = jnp.ones((1, 3), bool)
  adv, ret = adv_lib.gae(rewards, values, mask, gamma=1.0, lam=1.0)
  np.testing.assert_allclose(adv, [[2.5, 2.5, 2.5]], rtol=1e-6)
  np.testing.assert_allclose(ret, [[3.0, 3.0, 3.0]], rtol=1e-6)


def _gae_reference(rewards, values, mask, bootstrap, gamma, lam):
  """Plain Python GAE: drop masked steps, then the textbook backward loop per row."""
  b, t = rewards.shape
  adv = np.zeros((b, t))
  for i in range(b):
    idx = [j for j in range(t) if mask[i, j]]
    next_value, next_adv = bootstrap[i], 0.0
    for j in reversed(idx):
      delta = rewards[i, j] + gamma * next_value - values[i, j]
      next_adv = delta + gamma * lam * next_adv
      next_value = values[i, j]
      adv[i, j] = next_adv
  returns = np.where(mask, adv + values, 0.0)
  return adv, returns


@pytest.mark.parametrize("with_bootstrap", [False, True])
def test_gae_matches_python_loop(with_bootstrap):
  rng = np.random.default_rng(0)
  b, t = 5, 9
  rewards = rng.normal(size=(b, t))
  values = rng.normal(size=(b, t + 1))
  mask = rng.random((b, t)) < 0.7  # holes in the middle (tool output) ...
  mask[1, 6:] = False  # ... and trailing padding
  mask[2] = False  # and a fully masked row
  gamma, lam = 0.9, 0.8
  bootstrap = values[:, t] if with_bootstrap else np.zeros(b)
  v_in = values if with_bootstrap else values[:, :t]
  want_adv, want_ret = _gae_reference(rewards, values[:, :t], mask, bootstrap, gamma, lam)
  adv, ret = adv_lib.gae(jnp.asarray(rewards), jnp.asarray(v_in), jnp.asarray(mask),
                         gamma=gamma, lam=lam)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-6)


def test_gae_bad_values_shape_raises():
  with pytest.raises(ValueError, match="values must be"):
    adv_lib.gae(jnp.zeros((2, 3)), jnp.zeros((2, 5)), jnp.ones((2, 3), bool))


# -------------------------------------------------------------------------- whiten


def test_whiten_masked():
  x = jnp.array([1., 2., 3., 100.])
  mask = jnp.array([True, True, True, False])
  # valid: mean 2, population var 2/3 -> (x - 2) * sqrt(3/2)
  s = math.sqrt(1.5)
  np.testing.assert_allclose(adv_lib.whiten(x, mask), [-s, 0., s, 0.], rtol=1e-6)
  np.testing.assert_allclose(adv_lib.whiten(x, mask, shift_mean=False),
                             [2 - s, 2., 2 + s, 0.], rtol=1e-6)


def test_whiten_token_level_unit_moments():
  rng = np.random.default_rng(1)
  x = rng.normal(3.0, 5.0, size=(4, 6))
  mask = rng.random((4, 6)) < 0.6
  out = np.asarray(adv_lib.whiten(jnp.asarray(x), jnp.asarray(mask)))
  np.testing.assert_allclose(out[mask].mean(), 0.0, atol=1e-5)
  np.testing.assert_allclose(out[mask].std(), 1.0, rtol=1e-4)
  assert np.all(out[~mask] == 0.0)
