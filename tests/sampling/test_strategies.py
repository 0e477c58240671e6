"""Token selection against numpy references (sorts, first-index argmax, float64 softmax)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evotrainer.learner import warmstart
from evotrainer.sampling import SamplingParams, strategies
from evotrainer.sampling.strategies import NEG, select, top_k_mask, top_p_mask


def _logits(rows, v, seed, ties=False, masked=0):
  """Random logits; with `ties`, rounded to integers so maxima and thresholds repeat
  (within a block and across blocks); the last `masked` columns set to NEG."""
  x = np.random.default_rng(seed).standard_normal((rows, v)) * 3
  if ties:
    x = np.round(x)
  if masked:
    x[:, -masked:] = NEG
  return x.astype(np.float32)


def _np_log_softmax(x):
  x = x.astype(np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("v", [96, 1024, 8192])  # one block; 8 and 64 blocks of 128
@pytest.mark.parametrize("ties", [False, True])
def test_greedy_is_the_first_argmax_with_its_log_prob(v, ties):
  x = _logits(64, v, seed=v, ties=ties, masked=v // 8)
  if ties:  # the max repeated in a later block and later in the same block
    x[:, v - v // 8 - 1] = x.max(-1)
    x[:3, 5] = x[:3].max(-1)
  ids, logp = select(jnp.asarray(x), jax.random.key(0), jnp.float32(1.0), greedy=True)
  want = np.argmax(x, axis=-1)  # numpy returns the first maximal index
  np.testing.assert_array_equal(np.asarray(ids), want)
  np.testing.assert_allclose(np.asarray(logp),
                             _np_log_softmax(x)[np.arange(len(x)), want], atol=1e-5)


@pytest.mark.parametrize("k", [1, 5, 50])
def test_top_k_mask_keeps_every_logit_at_least_the_kth(k):
  x = _logits(16, 1024, seed=k, ties=True, masked=100)
  kth = np.sort(x, axis=-1)[:, -k][:, None]
  want = np.where(x >= kth, x, NEG)
  np.testing.assert_array_equal(np.asarray(top_k_mask(jnp.asarray(x), k)), want)


def _np_top_p(x, p):
  """The sort-based nucleus in float64: keep tokens whose mass strictly above < p."""
  order = np.argsort(-x, axis=-1, kind="stable")
  srt = np.take_along_axis(x, order, -1).astype(np.float64)
  probs = np.exp(srt - srt[:, :1])
  probs /= probs.sum(-1, keepdims=True)
  before = np.cumsum(probs, -1) - probs
  threshold = np.where(before < p, srt, np.inf).min(-1, keepdims=True)
  return np.where(x >= threshold, x, NEG).astype(np.float32), before


@pytest.mark.parametrize("p", [0.05, 0.3, 0.9])
@pytest.mark.parametrize("ties", [False, True])
def test_top_p_mask_equals_the_sorted_cumulative_sum(p, ties):
  x = _logits(32, 1024, seed=int(p * 1000) + 1, ties=ties, masked=64)
  x[0, :] = -1.5  # a flat row: every token ties
  x[1, 10], x[1, 11] = 0.0, -0.0  # signed zeros compare equal
  want, before = _np_top_p(x, p)
  # No token's mass above sits within rounding of p (else float32 may decide it either way).
  assert np.min(np.abs(before - p)) > 1e-5
  np.testing.assert_array_equal(np.asarray(top_p_mask(jnp.asarray(x), p)), want)


def test_top_k_then_top_p_renormalizes_within_the_top_k():
  # Logits [4, 3, 2, 1, 0, ...]. Over the whole vocabulary the mass above token 2 is
  # 0.632 + 0.233 = 0.865 < 0.88, so top_p=0.88 keeps {0, 1, 2}; renormalized over the
  # top 3 it is 0.665 + 0.245 = 0.910 >= 0.88, so top_k=3 then top_p=0.88 keeps {0, 1}.
  x = jnp.tile(jnp.arange(32, 0, -1, dtype=jnp.float32)[None, :] - 28, (4096, 1))
  ids, _ = select(x, jax.random.key(0), jnp.float32(1.0), top_p=0.88)
  assert set(np.asarray(ids).tolist()) == {0, 1, 2}
  ids, _ = select(x, jax.random.key(1), jnp.float32(1.0), top_k=3, top_p=0.88)
  assert set(np.asarray(ids).tolist()) == {0, 1}


def test_order_key_preserves_float_order():
  # (No denormals: XLA:CPU flushes them to zero.)
  vals = np.array([NEG, -np.inf, -1e30, -2.5, -1e-30, -0.0, 0.0, 1e-30, 1.0, 3e38, np.inf],
                  np.float32)
  keys = np.asarray(strategies._order_key(jnp.asarray(vals))).astype(np.int64)
  order = np.argsort(vals, kind="stable")
  assert np.all(np.diff(keys[order]) >= 0)
  assert keys[5] == keys[6]  # -0.0 and +0.0 share a key
  back = np.asarray(strategies._from_order_key(jnp.asarray(keys.astype(np.uint32))))
  np.testing.assert_array_equal(back[vals != 0], vals[vals != 0])


@pytest.mark.parametrize("params, want", [
    (SamplingParams(), 1.0),
    (SamplingParams(temperature=0.7), 0.7),
    (SamplingParams(temperature=1.3, top_k=5, top_p=0.9), 1.3),
    (SamplingParams(temperature=0.7, greedy=True), 1.0),
    (SamplingParams(temperature=0.0, greedy=True), 1.0),
])
def test_logprob_temperature_by_hand(params, want):
  """The temperature a learner recomputes the sampler's log-probs at: the sampling
  temperature, or 1 when greedy (whatever `temperature` says)."""
  assert params.logprob_temperature == want


@pytest.mark.parametrize("greedy", [False, True])
def test_select_reports_log_probs_at_the_logprob_temperature(greedy):
  """What `select` returns is log_softmax(logits / logprob_temperature) of the chosen id
  (numpy, float64), for a sampled and a greedy choice at temperature 0.5."""
  params = SamplingParams(temperature=0.5, greedy=greedy)
  x = _logits(16, 96, seed=3)
  ids, logp = select(jnp.asarray(x), jax.random.key(1), jnp.float32(params.temperature),
                     greedy=params.greedy)
  want = _np_log_softmax(x / params.logprob_temperature)[np.arange(len(x)), np.asarray(ids)]
  np.testing.assert_allclose(np.asarray(logp), want, atol=1e-5)


def test_warm_start_checks_sample_at_the_rl_default_temperature():
  assert warmstart.CHECK_TEMPERATURE == SamplingParams().temperature == 1.0
