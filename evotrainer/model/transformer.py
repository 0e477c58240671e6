"""A Flax NNX decoder of the Llama / Qwen2 / Qwen3 family.

One module serves full-sequence training and KV-cache decoding: the caller passes the
token positions (for RoPE) and a boolean attention mask `[B, T, S]` over the keys
it may see; with a cache the new keys/values are written at `cache_index` first and the
mask spans the whole cache. The mask helpers below build both cases.

Parameters carry logical axis names (`logical_axes` metadata) that
`evotrainer.sharding.rules` maps onto the mesh; activations are constrained by the same
names. Nothing here names a mesh axis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.sharding.rules import constrain

F32 = jnp.float32

Array = jax.Array


def _param(rngs: nnx.Rngs, init, shape: Sequence[int], axes: Tuple[Optional[str], ...],
           dtype) -> nnx.Param:
  # Our own metadata key: flax's `out_sharding` would be read as mesh axes under a mesh.
  return nnx.Param(init(rngs.params(), tuple(shape), dtype), logical_axes=axes)


_normal = nnx.initializers.normal(0.02)
_ones = nnx.initializers.ones
_zeros = nnx.initializers.zeros


@flax.struct.dataclass
class KVCache:
  """Per-layer keys [B, KV, D, S] (transposed) and values [B, KV, S, D]."""

  k: Tuple[Array, ...]
  v: Tuple[Array, ...]

  @property
  def length(self) -> int:
    return self.k[0].shape[3]


# Keys are cached transposed ([B, KV, D, S]) so that decode's q·K is a plain
# [G, D] x [D, S] product per (row, kv head); values stay [B, KV, S, D] for p·V.
K_CACHE_AXES = ("batch", "kv_heads", "head_dim", "cache_length")
V_CACHE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")
Q_AXES = ("batch", "kv_heads", None, "length", "head_dim")


def cache_dtype(config: ModelConfig):
  """The dtype the KV cache keeps keys and values in: the compute dtype, but float32 for a
  16-bit one on the CPU.

  Why: XLA:CPU upcasts a bf16 dynamic-update-slice to float32, converting the whole cache
  there and back on every write (bf16 decode of SmolLM2-135M at batch 16: 9 ms of a
  38 ms step), and its bf16 dots of decode attention are slow; a float32 cache is written
  in place and holds the bf16 keys and values exactly (attention over it then runs in
  float32). On accelerators the cache stays 16-bit: half the memory.
  """
  dt = config.jnp_dtype
  if jnp.dtype(dt).itemsize == 2 and jax.default_backend() == "cpu":
    return jnp.float32
  return dt


def init_cache(config: ModelConfig, batch: int, length: int) -> KVCache:
  """A zeroed cache for `batch` rows and `length` positions, in `cache_dtype(config)`."""
  dtype = cache_dtype(config)
  kv, d, n = config.num_kv_heads, config.head_dim, config.num_layers
  k = tuple(constrain(jnp.zeros((batch, kv, d, length), dtype), K_CACHE_AXES) for _ in range(n))
  v = tuple(constrain(jnp.zeros((batch, kv, length, d), dtype), V_CACHE_AXES) for _ in range(n))
  return KVCache(k=k, v=v)


def attention_mask(query_valid: Array, key_valid: Array, query_pos: Array,
                   key_pos: Array) -> Array:
  """Causal mask `[B, T, S]`: a query sees valid keys at positions <= its own.

  Args:
    query_valid: [B, T] bool.
    key_valid: [B, S] bool.
    query_pos: [B, T] int, index of each query in the key sequence (cache slot).
    key_pos: [B, S] or [S] int, slot index of each key.
  """
  if key_pos.ndim == 1:
    key_pos = key_pos[None, :]
  causal = key_pos[:, None, :] <= query_pos[:, :, None]
  return causal & key_valid[:, None, :] & query_valid[:, :, None]


def rope_frequencies(config: ModelConfig) -> jnp.ndarray:
  """Inverse frequencies [D/2], with Llama 3 scaling applied when configured."""
  d = config.head_dim
  inv = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
  s: Optional[RopeScaling] = config.rope_scaling
  if s is None:
    return inv
  # Llama 3.1 (transformers `_compute_llama3_parameters`): long wavelengths are divided by
  # `factor`, short ones kept, and the band in between interpolated smoothly.
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = jnp.where(wavelen > low_wavelen, inv / s.factor, inv)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return jnp.where(medium, smoothed, scaled)


def dense(x: Array, w: Array, n_in: int = 1, preferred_element_type=None) -> Array:
  """`x [..., *IN] @ w [*IN, *OUT] -> [..., *OUT]`, contracting the last `n_in` axes of x.

  Computed as one 2-D matmul `[rows, prod(IN)] @ [prod(IN), prod(OUT)]` (the reshapes are
  free bitcasts). Why: with the activation kept 3-D, JAX's weight gradient is a dot
  followed by a transpose, which XLA:CPU folds into a transposed copy of the output
  gradient before every weight-gradient dot (measured: MLP forward + backward 25% slower,
  and a full [B*N, V] transposed copy for the LM head); flattened, it is a plain dot.
  """
  lead = x.shape[:x.ndim - n_in]
  k = math.prod(x.shape[x.ndim - n_in:])
  out = w.shape[n_in:]
  y = low_precision_matmul(x.reshape((math.prod(lead), k)), w.reshape((k, math.prod(out))),
                           preferred_element_type)
  return y.reshape(lead + out)


def low_precision_matmul(x: Array, w: Array, preferred_element_type=None,
                         w_transposed: bool = False) -> Array:
  """`x [M, K] @ w [K, N]` (`w` [N, K] when `w_transposed`); under a 16-bit dtype every
  dot of it, forward and backward, multiplies 16-bit operands and accumulates in float32.

  Why: XLA:CPU runs a 16-bit dot with a 16-bit result at a fraction of the rate of the
  same operands accumulated in float32 (this 2-core AVX-512-bf16 CPU: bf16 -> bf16 415
  GFLOP/s at 1024^3 and 21 on decode's 16-row projections, bf16 -> f32 890 and 180), and
  JAX's own backward of a dot with a float32 result mixes a float32 cotangent with a
  16-bit operand, which runs as a float32 dot. So the result is rounded to `x`'s dtype
  (or given `preferred_element_type`) once, and the backward casts the cotangent to
  `x`'s dtype, as a 16-bit dot's backward does anyway. On accelerators this is what the
  matrix units do.
  """
  w = w.astype(x.dtype)
  if jnp.dtype(x.dtype).itemsize > 2:
    return jax.lax.dot_general(x, w, _contract(1, 1 if w_transposed else 0),
                               preferred_element_type=preferred_element_type)
  out_dtype = jnp.dtype(preferred_element_type or x.dtype)
  return _accumulated_matmul(x, w, w_transposed, out_dtype)


def _contract(a_axis: int, b_axis: int):
  """dot_general dimension numbers of two 2-D operands contracting a's `a_axis` with b's
  `b_axis` (no batch axes)."""
  return (((a_axis,), (b_axis,)), ((), ()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _accumulated_matmul(x: Array, w: Array, w_transposed: bool, out_dtype) -> Array:
  return jax.lax.dot_general(x, w, _contract(1, 1 if w_transposed else 0),
                             preferred_element_type=F32).astype(out_dtype)


def _accumulated_matmul_fwd(x, w, w_transposed, out_dtype):
  return _accumulated_matmul(x, w, w_transposed, out_dtype), (x, w)


def _accumulated_matmul_bwd(w_transposed, out_dtype, residuals, g):
  x, w = residuals
  g = g.astype(x.dtype)  # [M, N]
  dot = lambda a, b, dims: jax.lax.dot_general(a, b, dims, preferred_element_type=F32)
  if w_transposed:  # w [N, K]
    dx, dw = dot(g, w, _contract(1, 0)), dot(g, x, _contract(0, 0))
  else:  # w [K, N]
    dx, dw = dot(g, w, _contract(1, 1)), dot(x, g, _contract(0, 0))
  return dx.astype(x.dtype), dw.astype(w.dtype)


_accumulated_matmul.defvjp(_accumulated_matmul_fwd, _accumulated_matmul_bwd)


def head_logits(hidden: Array, w: Array, tied: bool) -> Array:
  """LM head `[B, T, E] -> [B, T, V]` float32, accumulated in float32 whatever the dtype
  of `hidden` (bf16 logits would round log-probs in the policy ratio to ~3 digits).
  `w` is `Transformer.head_weight()`: [V, E] when `tied`, else [E, V]."""
  dt = hidden.dtype
  if tied:
    # Flattened to 2-D for the reason given in `dense` (measured: LM head fwd + bwd
    # 30% less CPU time than the 3-D einsum).
    b, t, e = hidden.shape
    out = low_precision_matmul(hidden.reshape(b * t, e), w.astype(dt), F32,
                               w_transposed=True).reshape(b, t, -1)
  else:
    out = dense(hidden, w.astype(dt), preferred_element_type=F32)
  return constrain(out.astype(F32), ("batch", "length", "vocab"))


def rope_table(positions: Array, inv_freq: Array) -> Tuple[Array, Array]:
  """cos, sin of the rotary angles: [B, T, D/2] each (computed once per forward)."""
  angles = positions[:, :, None].astype(jnp.float32) * inv_freq[None, None, :]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
  """Rotary embedding in the half-split layout of the HF checkpoints.

  x: [B, ..., T, D] (heads between batch and length); cos, sin: [B, T, D/2].
  """
  extra = x.ndim - 3
  cos = cos.reshape(cos.shape[:1] + (1,) * extra + cos.shape[1:])
  sin = sin.reshape(sin.shape[:1] + (1,) * extra + sin.shape[1:])
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, config: ModelConfig, rngs: nnx.Rngs,
               axis_name: str = "norm"):
    self.eps = eps
    self.scale = _param(rngs, _ones, (dim,), (axis_name,), config.jnp_param_dtype)

  def __call__(self, x: Array) -> Array:
    dtype = x.dtype
    x = x.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    # HF multiplies after casting back to the input dtype.
    return scale_rows(self.scale[...], x.astype(dtype))


def scale_rows(scale: Array, x: Array) -> Array:
  """`scale [E]` (cast to x's dtype) times `x [..., E]`; under a 16-bit dtype the scale's
  gradient, a sum over every row, accumulates in float32.

  Why: JAX's own backward sums the rows in the 16-bit dtype, about 1% off over 1,536
  bf16 rows (the test's case), and XLA:CPU runs that sum as a slow reduce-window.
  """
  if jnp.dtype(x.dtype).itemsize > 2:
    return scale.astype(x.dtype) * x
  return _scale_rows16(scale, x)


@jax.custom_vjp
def _scale_rows16(scale: Array, x: Array) -> Array:
  return scale.astype(x.dtype) * x


def _scale_rows_fwd(scale, x):
  return _scale_rows16(scale, x), (scale, x)


def _scale_rows_bwd(residuals, g):
  scale, x = residuals
  rows = (g.astype(F32) * x.astype(F32)).reshape(-1, x.shape[-1])  # [rows, E]
  return rows.sum(0).astype(scale.dtype), (g * scale.astype(g.dtype)).astype(x.dtype)


_scale_rows16.defvjp(_scale_rows_fwd, _scale_rows_bwd)


class Attention(nnx.Module):

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    c = config
    self.config = c
    pd = c.jnp_param_dtype
    e, h, kv, d = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    self.q = _param(rngs, _normal, (e, h, d), ("embed", "heads", "head_dim"), pd)
    self.k = _param(rngs, _normal, (e, kv, d), ("embed", "kv_heads", "head_dim"), pd)
    self.v = _param(rngs, _normal, (e, kv, d), ("embed", "kv_heads", "head_dim"), pd)
    self.o = _param(rngs, _normal, (h, d, e), ("heads", "head_dim", "embed"), pd)
    if c.qkv_bias:
      self.q_bias = _param(rngs, _zeros, (h, d), ("heads", "head_dim"), pd)
      self.k_bias = _param(rngs, _zeros, (kv, d), ("kv_heads", "head_dim"), pd)
      self.v_bias = _param(rngs, _zeros, (kv, d), ("kv_heads", "head_dim"), pd)
    if c.qk_norm:
      self.q_norm = RMSNorm(d, c.rms_norm_eps, c, rngs)
      self.k_norm = RMSNorm(d, c.rms_norm_eps, c, rngs)

  def __call__(self, x: Array, rope: Tuple[Array, Array], mask: Array,
               cache: Optional[Tuple[Array, Array]], cache_index,
               query_slice: Optional[Tuple[int, int]] = None) -> Tuple[Array, Optional[tuple]]:
    # Heads-major layout throughout ([B, KV, G, T, D] for queries, [B, KV, T, D] for keys
    # and values, the cache [B, KV, S, D]): the attention dots then batch over (B, KV)
    # with contiguous [T, D] / [S, D] operands, and decode never transposes the cache
    # (measured: 3.5x faster attention per decode step than [B, S, KV, D] on the CPU).
    c = self.config
    dt = x.dtype
    e, h, d = c.hidden_size, c.num_heads, c.head_dim
    kvh = c.num_kv_heads
    g = h // kvh
    # Project in the weights' own layout, then move heads in front of length on the
    # (small) activations: reshaping the kernels instead makes XLA copy them every step.
    # Keys and values for every position; queries only for `query_slice` when given
    # (then the output, and `mask`'s rows, cover those positions only).
    xq = x
    if query_slice is not None:
      start, stop = query_slice
      xq = x[:, start:stop]
      rope_q = (rope[0][:, start:stop], rope[1][:, start:stop])
      mask = mask[:, start:stop]
    else:
      rope_q = rope
    q = dense(xq, self.q[...].astype(dt))  # [B, Tq, H, D]
    k = dense(x, self.k[...].astype(dt))  # [B, T, KV, D]
    v = dense(x, self.v[...].astype(dt))
    if c.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    b, t = xq.shape[:2]
    q = q.reshape(b, t, kvh, g, d).transpose(0, 2, 3, 1, 4)  # [B, KV, G, Tq, D]
    k = k.transpose(0, 2, 1, 3)  # [B, KV, T, D]
    v = v.transpose(0, 2, 1, 3)
    if c.qk_norm:
      q = self.q_norm(q)
      k = self.k_norm(k)
    q = constrain(apply_rope(q, *rope_q), Q_AXES)
    k = apply_rope(k, *rope)
    keys, values = k, v  # [B, KV, S, D] each: the new tokens' (prefill, no cache)
    keys_transposed = False
    if cache is not None:
      ck, cv = cache
      ck = jax.lax.dynamic_update_slice(ck, k.swapaxes(2, 3).astype(ck.dtype),
                                        (0, 0, 0, cache_index))
      cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, 0, cache_index, 0))
      ck = constrain(ck, K_CACHE_AXES)
      cv = constrain(cv, V_CACHE_AXES)
      cache = (ck, cv)
      # A mask as wide as the cache attends over it (decode); a mask as wide as the new
      # tokens attends over those alone (prefill: no work on empty slots).
      if mask.shape[-1] == ck.shape[3]:
        keys, values, keys_transposed = ck, cv, True
      elif mask.shape[-1] != k.shape[2]:
        raise ValueError(f"mask has {mask.shape[-1]} keys; expected the cache length "
                         f"{ck.shape[3]} or the number of new tokens {k.shape[2]}")
    # Over a cache wider than the compute dtype (`cache_dtype`), attention runs in its dtype.
    wide = jnp.promote_types(dt, keys.dtype)
    out = attend(q.astype(wide), keys.astype(wide), values.astype(wide), mask, keys_transposed,
                 c.attention_impl).astype(dt)
    return dense(out, self.o[...].astype(dt), n_in=2), cache


def attend(q: Array, keys: Array, values: Array, mask: Array, keys_transposed: bool,
           implementation: str = "dense") -> Array:
  """Attention of `q` [B, KV, G, T, D] over `keys` and `values` under `mask` [B, T, S]
  (`_dense_attention` has the layouts), by `ModelConfig.attention_impl`: 'dense' (einsums)
  or 'xla' / 'cudnn' (`jax.nn.dot_product_attention`). Returns [B, T, H, D]."""
  if implementation == "dense":
    return _dense_attention(q, keys, values, mask, keys_transposed)
  return _fused_attention(q, keys, values, mask, keys_transposed, implementation)


def _dense_attention(q: Array, keys: Array, values: Array, mask: Array,
                     keys_transposed: bool) -> Array:
  """Masked softmax attention as einsums in the heads-major layout.

  Args:
    q: [B, KV, G, T, D] queries (RoPE applied).
    keys: [B, KV, S, D], or [B, KV, D, S] when `keys_transposed` (the KV cache layout).
    values: [B, KV, S, D].
    mask: [B, T, S] bool. A fully masked query row (left padding) gets uniform weights
      over all S keys: every score is the same float32 minimum.

  Returns:
    [B, T, H, D] with H = KV * G (head h = kv * G + g).
  """
  b, _, _, t, d = q.shape
  dt = q.dtype
  if keys_transposed:
    scores = jnp.einsum("bkgtd,bkds->bkgts", q, keys, preferred_element_type=F32)
  else:
    scores = jnp.einsum("bkgtd,bksd->bkgts", q, keys, preferred_element_type=F32)
  # Scores are accumulated in float32 whatever the compute dtype (bf16 under hf.gin /
  # small.gin): rounding them to bf16 before the softmax costs ~3 significant digits.
  scores = scores / math.sqrt(d)
  scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(dt)
  out = jnp.einsum("bkgts,bksd->bkgtd", probs, values, preferred_element_type=F32)
  out = constrain(out.astype(dt), Q_AXES)  # f32 accumulation: see `low_precision_matmul`
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, -1, d)


def _fused_attention(q: Array, keys: Array, values: Array, mask: Array,
                     keys_transposed: bool, implementation: str) -> Array:
  """`jax.nn.dot_product_attention` (implementation 'xla' or 'cudnn') on the same inputs
  as `_dense_attention`, moved to its [B, T, N, D] layout; returns [B, T, H, D].

  Grouped-query attention is native there (K/V keep KV heads; query head h uses kv head
  h // G, our `reshape(B, T, KV, G, D)` order). Like the dense path it accumulates scores
  in float32 (bf16 inputs use the BF16_BF16_F32 dot preset) and runs the softmax in
  float32; fully masked rows get uniform weights in 'xla' (every score is the same large
  negative number), which matches the dense path. cuDNN adds the mask as a bias and its
  behaviour on fully masked rows is not checked here (no GPU in the tests); those rows
  are left padding, whose outputs no caller reads.
  """
  b, kvh, g, t, d = q.shape
  q = q.transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g, d)  # [B, T, H, D]
  keys = keys.transpose(0, 3, 1, 2) if keys_transposed else keys.transpose(0, 2, 1, 3)
  values = values.transpose(0, 2, 1, 3)  # [B, S, KV, D]
  out = jax.nn.dot_product_attention(q, keys, values, mask=mask[:, None, :, :],
                                     scale=1.0 / math.sqrt(d), implementation=implementation)
  return constrain(out, ("batch", "length", "heads", "head_dim"))


class MLP(nnx.Module):

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    pd = config.jnp_param_dtype
    e, m = config.hidden_size, config.intermediate_size
    self.gate = _param(rngs, _normal, (e, m), ("embed", "mlp"), pd)
    self.up = _param(rngs, _normal, (e, m), ("embed", "mlp"), pd)
    self.down = _param(rngs, _normal, (m, e), ("mlp", "embed"), pd)

  def __call__(self, x: Array) -> Array:
    dt = x.dtype
    g = dense(x, self.gate[...].astype(dt))
    u = dense(x, self.up[...].astype(dt))
    hmid = constrain(jax.nn.silu(g) * u, ("batch", "length", "mlp"))
    return dense(hmid, self.down[...].astype(dt))


class Block(nnx.Module):

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config, rngs)
    self.attn = Attention(config, rngs)
    self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config, rngs)
    self.mlp = MLP(config, rngs)

  def __call__(self, x, rope, mask, cache, cache_index, query_slice=None):
    h, cache = self.attn(self.attn_norm(x), rope, mask, cache, cache_index, query_slice)
    if query_slice is not None:
      x = x[:, query_slice[0]:query_slice[1]]
    x = constrain(x + h, ("batch", "length", "embed"))
    x = constrain(x + self.mlp(self.mlp_norm(x)), ("batch", "length", "embed"))
    return x, cache


def _block_no_cache(layer: Block, x, rope, mask):
  return layer(x, rope, mask, None, 0)[0]


def _sliced_block_no_cache(query_slice: Tuple[int, int]):
  """`_block_no_cache` with a static query slice (nnx.remat takes positional args only)."""

  def run(layer: Block, x, rope, mask):
    return layer(x, rope, mask, None, 0, query_slice)[0]

  return run


def _scan_blocks(layers: Sequence[Block], x: Array, rope, mask: Array, remat: bool) -> Array:
  """Runs cache-free `layers` in order as one `jax.lax.scan`: the block is traced and
  compiled once whatever the depth (`ModelConfig.scan_layers`).

  The parameters keep their per-layer layout (so HF import/export, checkpoints and the
  sharding rules are unchanged) and are stacked to [L, ...] here, inside the jitted
  program: the price is one copy of the scanned layers' parameters per call (and of
  their gradients in the backward pass).
  """
  if not layers:
    return x
  graphdef = nnx.graphdef(layers[0])
  stacked = jax.tree.map(lambda *ps: jnp.stack(ps), *[nnx.state(l) for l in layers])

  def body(h, layer_state):
    return _block_no_cache(nnx.merge(graphdef, layer_state), h, rope, mask), None

  if remat:
    body = jax.checkpoint(body)
  return jax.lax.scan(body, x, stacked)[0]


class Transformer(nnx.Module):
  """Decoder-only transformer.

  `__call__` returns final hidden states (after the last norm), not logits, so that a
  caller that needs logits at a few positions (sampler prefill) does not pay for the
  LM head everywhere; `logits(hidden)` applies the head.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    self.config = config
    pd = config.jnp_param_dtype
    self.embed = _param(rngs, _normal, (config.vocab_size, config.hidden_size),
                        ("embed_vocab", "embed"), pd)
    self.layers = nnx.List([Block(config, rngs) for _ in range(config.num_layers)])
    self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config, rngs)
    if not config.tie_embeddings:
      self.lm_head = _param(rngs, _normal, (config.hidden_size, config.vocab_size),
                            ("embed", "vocab"), pd)

  def __call__(self, tokens: Array, positions: Array, mask: Array,
               cache: Optional[KVCache] = None, cache_index=0, *,
               query_slice: Optional[Tuple[int, int]] = None
               ) -> Tuple[Array, Optional[KVCache]]:
    """Runs the decoder.

    Args:
      tokens: [B, T] int token ids.
      positions: [B, T] int RoPE positions.
      mask: [B, T, S] bool; S = T without a cache, S = cache length with one.
      cache: optional KVCache; the new keys/values are written at `cache_index`.
      cache_index: scalar int, slot of tokens[:, 0] in the cache.
      query_slice: static `(start, stop)`: return the hidden states of positions
        [start, stop) only. Every layer but the last runs on all T positions (their
        keys and values are needed); the last computes keys and values for all of them
        (and caches them) but queries, attention output and MLP for the slice only --
        the rest of its output would be discarded. Used where only a few positions
        reach the LM head: the learner's N completion predictions, prefill's last
        position (measured: ~10% of a learner forward + backward at P = N = 64).

    Returns:
      hidden: [B, T, E] ([B, stop - start, E] with `query_slice`) in the compute dtype;
      the updated cache (or None).
    """
    c = self.config
    dt = c.jnp_dtype
    x = jnp.take(self.embed[...], tokens, axis=0).astype(dt)
    x = constrain(x, ("batch", "length", "embed"))
    rope = rope_table(positions, rope_frequencies(c))
    new_k, new_v = [], []
    last = len(self.layers) - 1
    first = 0
    if c.scan_layers and cache is None:
      # The last layer stays out of the scan when it runs on a query slice.
      first = last if query_slice is not None else last + 1
      x = _scan_blocks(list(self.layers)[:first], x, rope, mask, c.remat)
    for i in range(first, last + 1):
      layer = self.layers[i]
      layer_cache = None if cache is None else (cache.k[i], cache.v[i])
      qs = query_slice if i == last else None
      if c.remat and cache is None:
        block = _block_no_cache if qs is None else _sliced_block_no_cache(qs)
        x = nnx.remat(block)(layer, x, rope, mask)
      else:
        x, layer_cache = layer(x, rope, mask, layer_cache, cache_index, qs)
      if layer_cache is not None:
        new_k.append(layer_cache[0])
        new_v.append(layer_cache[1])
    x = self.final_norm(x)
    new_cache = None if cache is None else KVCache(k=tuple(new_k), v=tuple(new_v))
    return x, new_cache

  def head_weight(self) -> Array:
    """The LM head's weight: the embedding [V, E] when tied, else the head [E, V]."""
    return self.embed[...] if self.config.tie_embeddings else self.lm_head[...]

  def logits(self, hidden: Array) -> Array:
    """LM head: [B, T, E] -> [B, T, V] float32."""
    return head_logits(hidden, self.head_weight(), self.config.tie_embeddings)

  def forward_logits(self, tokens: Array, valid: Optional[Array] = None) -> Array:
    """Full-sequence logits for right- or left-padded `tokens` [B, T] -> [B, T, V].

    Positions count valid tokens only, so left padding does not shift RoPE.
    """
    if valid is None:
      valid = jnp.ones(tokens.shape, bool)
    positions = jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
    slots = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    mask = attention_mask(valid, valid, slots, slots)
    hidden, _ = self(tokens, positions, mask)
    return self.logits(hidden)


def logical_axes(module_or_state):
  """The tree of logical axis tuples for a model's params (same structure as the state)."""
  state = module_or_state if isinstance(module_or_state, nnx.State) else nnx.state(
      module_or_state, nnx.Param)
  return jax.tree.map(lambda p: p.get_metadata()["logical_axes"], state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))
