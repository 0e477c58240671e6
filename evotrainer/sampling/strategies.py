"""Pure next-token selection: greedy, temperature, top-k, top-p.

`select(logits, rng, temperature, top_k, top_p, greedy)` takes the last-position
logits [B, V] and returns the chosen ids [B] and their log-probs under the *sampling
policy before truncation*: log_softmax(logits / temperature) (temperature 1 for greedy).
With temperature 1 that is the model's own log-prob, which is what a PPO/GRPO learner
recomputes with teacher forcing. `temperature` is traced (changing it does not
recompile); `top_k`, `top_p` and `greedy` are static.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG = jnp.finfo(jnp.float32).min


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
  """Keeps the k largest logits per row. logits: [B, V] -> [B, V] (others set to NEG)."""
  return jnp.where(logits >= kth_largest(logits, k), logits, NEG)


def kth_largest(logits: jax.Array, k: int) -> jax.Array:
  """The k-th largest logit per row: [B, V] -> [B, 1].

  The minimum of `lax.top_k`'s values rather than its last column: XLA rewrites a
  TopK whose output is only sliced into a full sort of the row, and XLA:CPU's sort
  (a comparator call per comparison) cost 60 ms per decode step at [16, 8192] and
  240 ms at [64, 8192]; the TopK custom call costs ~0.7 / ~2 ms.
  """
  return jnp.min(jax.lax.top_k(logits, k)[0], axis=-1, keepdims=True)


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
  """Nucleus filter: the smallest set of top tokens whose probability reaches p. [B, V]."""
  weights = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
  return jnp.where(logits >= nucleus_threshold(logits, weights, p), logits, NEG)


def nucleus_threshold(logits: jax.Array, weights: jax.Array, p: float) -> jax.Array:
  """Smallest logit kept by top-p: [B, V] logits and their unnormalized probabilities
  `weights` (0 for excluded tokens) -> [B, 1].

  The nucleus (Holtzman et al. 2019) keeps, in descending order, every token whose
  probability mass strictly above it is < p; the threshold is the smallest logit v with
  mass(logits > v) < p, equivalently the one with mass(logits >= v) >= p >
  mass(logits > v). Found without a sort (XLA:CPU's sort cost 50-300 ms per decode
  step at [16-64, 8192]) by a bitwise binary search over the logits' order-preserving
  uint32 keys: 32 masked sums over the row, each setting one bit of the threshold's key.
  Masses are float32 sums, so a token whose mass above lies within rounding of p may
  fall either side, as with the sorted cumulative sum this replaces (on near-uniform
  rows of 8192 tokens each disagrees with a float64 nucleus on ~1% of rows).
  """
  key = _order_key(logits)
  target = p * jnp.sum(weights, axis=-1, keepdims=True)  # [B, 1]

  def bit(i, t):
    candidate = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
    mass = jnp.sum(jnp.where(key >= candidate, weights, 0.0), axis=-1, keepdims=True)
    return jnp.where(mass >= target, candidate, t)

  t = jax.lax.fori_loop(0, 32, bit, jnp.zeros(target.shape, jnp.uint32))
  return _from_order_key(t)


def _order_key(x: jax.Array) -> jax.Array:
  """float32 -> uint32 with the same order (-0.0 taken as +0.0; no NaNs expected)."""
  bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x).astype(jnp.float32),
                                      jnp.int32)
  signed = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
  return jax.lax.bitcast_convert_type(signed ^ jnp.int32(-2**31), jnp.uint32)


def _from_order_key(key: jax.Array) -> jax.Array:
  """Inverse of `_order_key`."""
  signed = jax.lax.bitcast_convert_type(key, jnp.int32) ^ jnp.int32(-2**31)
  bits = jnp.where(signed < 0, signed ^ jnp.int32(0x7FFFFFFF), signed)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def inverse_cdf_sample(rng: jax.Array, logits: jax.Array) -> jax.Array:
  """One draw per row from softmax(logits) [B, V] -> [B] int32.

  Inverse-CDF with one uniform per row, instead of `jax.random.categorical`'s Gumbel
  noise over the whole vocabulary: one random number per row rather than V (the random
  bits dominated a CPU decode step). A token of probability 0 is never returned: the
  chosen index is the first whose cumulative mass exceeds u * total, and the mass
  strictly grows there.
  """
  return _sample_from_weights(rng, jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True)))


def _sample_from_weights(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """Inverse-CDF draw from unnormalized non-negative weights [B, V] -> [B] int32."""
  b, v = probs.shape
  u = jax.random.uniform(rng, (b, 1), jnp.float32)
  blocks = _blocks(probs)
  block = blocks.shape[-1]
  if block == v:
    return _first_exceeding(jnp.cumsum(probs, axis=-1), u * jnp.sum(probs, -1, keepdims=True))
  # Two levels (a long cumsum is slow on the CPU): pick the block, then the token in it.
  block_cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [B, V / block]
  target = u * block_cdf[:, -1:]
  j = _first_exceeding(block_cdf, target)  # [B]
  before = jnp.where(j > 0, jnp.take_along_axis(block_cdf, (j - 1)[:, None], -1)[:, 0], 0.0)
  inner = jnp.take_along_axis(blocks, j[:, None, None], axis=1)[:, 0]  # [B, block]
  inner_cdf = jnp.cumsum(inner, axis=-1)
  # Rounding can make the block's own sum differ from the block-level difference; keep
  # the target strictly below the block's mass so a zero-probability tail is never hit.
  rest = jnp.minimum(target[:, 0] - before, inner_cdf[:, -1] * (1 - 2.0**-20))
  within = _first_exceeding(inner_cdf, rest[:, None])
  return j * block + within


_CDF_BLOCK = 128


def _first_exceeding(cdf: jax.Array, target: jax.Array) -> jax.Array:
  """First index whose cumulative value exceeds target, clipped to the row. [B, K] -> [B]."""
  ids = jnp.sum((cdf <= target).astype(jnp.int32), axis=-1)
  return jnp.minimum(ids, cdf.shape[-1] - 1).astype(jnp.int32)


def select(logits: jax.Array, rng: jax.Array, temperature: jax.Array, *, top_k: int = 0,
           top_p: float = 1.0, greedy: bool = False):
  """Chooses one token per row.

  Args:
    logits: [B, V] float32.
    rng: PRNG key.
    temperature: scalar (traced).
    top_k: keep the k most likely tokens (0 = off). Static.
    top_p: nucleus mass (1.0 = off). Static.
    greedy: argmax instead of sampling. Static.

  Returns:
    ids [B] int32 and logprobs [B] float32.
  """
  logits = logits.astype(jnp.float32)
  scaled = logits if greedy else logits / temperature
  if greedy:
    # The max from per-block maxima, which also locate the first maximal index.
    block_max = _block_max(scaled)  # [B, V / block]
    m = jnp.max(block_max, axis=-1, keepdims=True)
  else:
    m = jnp.max(scaled, axis=-1, keepdims=True)
  # One pass of exp over the vocabulary serves both the log-prob (log-sum-exp) and the
  # draw itself (zeroed outside top-k / top-p); the full log_softmax is never materialized.
  weights = jnp.exp(scaled - m)  # [B, V]
  log_z = jnp.log(jnp.sum(weights, axis=-1))  # [B]
  if greedy:
    ids = _first_argmax(scaled, block_max, m)
    # scaled[ids] == m exactly, so the log-prob is -log_z.
    return ids, -log_z
  if top_k:
    weights = jnp.where(scaled >= kth_largest(scaled, top_k), weights, 0.0)
  if top_p < 1.0:
    weights = jnp.where(scaled >= nucleus_threshold(scaled, weights, top_p), weights, 0.0)
  ids = _sample_from_weights(rng, weights)
  chosen = jnp.take_along_axis(scaled, ids[:, None], axis=-1)[:, 0] - m[:, 0] - log_z
  return ids, chosen


def _blocks(x: jax.Array) -> jax.Array:
  """[B, V] -> [B, V / block, block] (one block when V is not a multiple of it)."""
  b, v = x.shape
  block = _CDF_BLOCK if v % _CDF_BLOCK == 0 and v > _CDF_BLOCK else v
  return x.reshape(b, v // block, block)


def _block_max(x: jax.Array) -> jax.Array:
  """Per-block maxima [B, V] -> [B, V / block]."""
  return jnp.max(_blocks(x), axis=-1)


def _first_argmax(x: jax.Array, block_max: jax.Array, m: jax.Array) -> jax.Array:
  """First index of the row maximum `m` [B, 1] of x [B, V], given `_block_max(x)`.

  Two levels over small arrays (the first block holding the max, then the first index
  in it) instead of a full-width index reduction: XLA:CPU lowers an int32 min-of-iota
  over [B, V] into a materialized [B, V] select plus a tree of reduce-windows, and its
  argmax into a variadic reduce, each 1-5 ms per decode step at [64, 8192] against
  ~0.3 ms for a float max.
  """
  blocks = _blocks(x)
  j = jnp.argmax(block_max == m, axis=-1).astype(jnp.int32)  # [B] first block with max
  inner = jnp.take_along_axis(blocks, j[:, None, None], axis=1)[:, 0]  # [B, block]
  within = jnp.argmax(inner == m, axis=-1).astype(jnp.int32)
  return j * blocks.shape[-1] + within
