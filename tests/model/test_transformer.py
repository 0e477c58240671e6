"""model/transformer.py piece by piece against a numpy decoder written out here with
explicit loops (RMSNorm, RoPE with Llama 3 scaling, grouped-query attention under causal
and padding masks, the SwiGLU MLP), a whole forward of tiny random models through the
same weights, and KV-cache decoding (prefill + one token) against the full forward.
test_hf.py checks the same model against transformers; this file needs no torch model."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.model.transformer import (RMSNorm, Transformer, apply_rope, attention_mask,
                                          cache_dtype, dense, init_cache, low_precision_matmul,
                                          rope_frequencies, rope_table, scale_rows)

TOL = 2e-5  # float32 model against a float64 reference
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5)
# Original context 64 with head_dim 16: wavelengths 6.3 (kept), 19.9 and 62.8 (the
# interpolated band), 199 and up (divided by the factor). Every branch of the scaling.
SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=64)
CONFIGS = {
    "llama_scaled_rope": ModelConfig(**BASE, rope_theta=500.0, rope_scaling=SCALING),
    "qwen2_bias_tied": ModelConfig(**BASE, architecture="qwen2", qkv_bias=True,
                                   tie_embeddings=True, rope_theta=1e4),
    "qwen3_qk_norm_gqa4": ModelConfig(**{**BASE, "num_heads": 8}, architecture="qwen3",
                                      qk_norm=True, rope_theta=1e6),
}
B, T = 3, 9
PAD = np.array([0, 3, 8])  # left padding per row; row 2 has a single valid token


def _np(x) -> np.ndarray:
  return np.asarray(x, np.float64)


def _inputs(config: ModelConfig, seed: int = 0):
  """tokens [B, T], valid [B, T] (left padded by PAD), RoPE positions counting valid tokens."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, config.vocab_size, (B, T)).astype(np.int32)
  valid = np.arange(T)[None, :] >= PAD[:, None]
  positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
  return np.where(valid, tokens, 0), valid, positions


def _random_model(config: ModelConfig, seed: int) -> Transformer:
  """The model's structure (abstract: JAX's op-by-op init would compile every shape)
  with numpy weights: norm scales 1 + 0.3 N(0, 1), everything else (biases included,
  zero at init) 0.1 N(0, 1), so that a misplaced weight changes the output above TOL."""
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  for path, param in nnx.iter_graph(model):
    if isinstance(param, nnx.Param):
      noise = rng.normal(size=param.shape)
      param.set_value(jnp.asarray(1 + 0.3 * noise if path[-1] == "scale" else 0.1 * noise,
                                  param.dtype))
  return model


# ------------------------------------------------------------------ numpy reference


def np_rmsnorm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
  return scale * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def np_inv_freq(config: ModelConfig) -> np.ndarray:
  """Llama 3.1's scaling one frequency at a time (transformers' llama3 rope init)."""
  d, s = config.head_dim, config.rope_scaling
  out = []
  for i in range(d // 2):
    f = config.rope_theta ** (-2 * i / d)
    if s is not None:
      wavelen = 2 * math.pi / f
      if wavelen > s.original_max_position_embeddings / s.low_freq_factor:
        f = f / s.factor
      elif wavelen >= s.original_max_position_embeddings / s.high_freq_factor:
        smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                  / (s.high_freq_factor - s.low_freq_factor))
        f = (1 - smooth) * f / s.factor + smooth * f
    out.append(f)
  return np.array(out)


def np_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
  """x [T, D]: rotates each pair (x[i], x[i + D/2]) by the angle position * inv_freq[i]."""
  half = x.shape[-1] // 2
  out = np.empty_like(x)
  for t, pos in enumerate(positions):
    for i in range(half):
      c, s = math.cos(pos * inv_freq[i]), math.sin(pos * inv_freq[i])
      out[t, i] = x[t, i] * c - x[t, i + half] * s
      out[t, i + half] = x[t, i + half] * c + x[t, i] * s
  return out


def _weights(attn) -> dict:
  w = {name: _np(getattr(attn, name)[...]) for name in ("q", "k", "v", "o")}
  for name in ("q_bias", "k_bias", "v_bias"):
    w[name] = _np(getattr(attn, name)[...]) if hasattr(attn, name) else 0.0
  for name in ("q_norm", "k_norm"):
    w[name] = _np(getattr(attn, name).scale[...]) if hasattr(attn, name) else None
  return w


def np_attention(x: np.ndarray, w: dict, config: ModelConfig, positions: np.ndarray,
                 mask: np.ndarray):
  """One row: x [T, E], mask [T, T]. Query head h reads kv head h // G. Returns the
  output [T, E] (zero on fully masked queries) and the rotated keys and the values
  [KV, T, D] that a cache holds."""
  c = config
  g = c.num_heads // c.num_kv_heads
  inv = np_inv_freq(c)
  keys, values = [], []
  for j in range(c.num_kv_heads):
    k = x @ w["k"][:, j] + (w["k_bias"][j] if c.qkv_bias else 0.0)
    if c.qk_norm:
      k = np_rmsnorm(k, w["k_norm"], c.rms_norm_eps)
    keys.append(np_rope(k, positions, inv))
    values.append(x @ w["v"][:, j] + (w["v_bias"][j] if c.qkv_bias else 0.0))
  out = np.zeros_like(x)
  for h in range(c.num_heads):
    q = x @ w["q"][:, h] + (w["q_bias"][h] if c.qkv_bias else 0.0)
    if c.qk_norm:
      q = np_rmsnorm(q, w["q_norm"], c.rms_norm_eps)
    q = np_rope(q, positions, inv)
    for t in range(len(x)):
      seen = [s for s in range(len(x)) if mask[t, s]]
      if not seen:
        continue
      scores = np.array([q[t] @ keys[h // g][s] for s in seen]) / math.sqrt(c.head_dim)
      p = np.exp(scores - scores.max())
      p /= p.sum()
      head_out = sum(pi * values[h // g][s] for pi, s in zip(p, seen))
      out[t] += head_out @ w["o"][h]
  return out, np.stack(keys), np.stack(values)


def np_mlp(x: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
  a = x @ gate
  return (a / (1 + np.exp(-a)) * (x @ up)) @ down  # SwiGLU: silu(x W_gate) * x W_up


def np_forward(model: Transformer, tokens, valid, positions):
  """Logits [B, T, V] and per layer the cached keys and values [B, KV, T, D]."""
  c = model.config
  logits, caches = [], [([], []) for _ in model.layers]
  n = tokens.shape[1]
  for b in range(tokens.shape[0]):
    mask = np.tril(np.ones((n, n), bool)) & valid[b][None, :] & valid[b][:, None]
    x = _np(model.embed[...])[tokens[b]]
    for layer, (ks, vs) in zip(model.layers, caches):
      h = np_rmsnorm(x, _np(layer.attn_norm.scale[...]), c.rms_norm_eps)
      a, k, v = np_attention(h, _weights(layer.attn), c, positions[b], mask)
      x = x + a
      h = np_rmsnorm(x, _np(layer.mlp_norm.scale[...]), c.rms_norm_eps)
      x = x + np_mlp(h, _np(layer.mlp.gate[...]), _np(layer.mlp.up[...]),
                     _np(layer.mlp.down[...]))
      ks.append(k)
      vs.append(v)
    x = np_rmsnorm(x, _np(model.final_norm.scale[...]), c.rms_norm_eps)
    head = _np(model.embed[...]).T if c.tie_embeddings else _np(model.lm_head[...])
    logits.append(x @ head)
  return np.stack(logits), [(np.stack(ks), np.stack(vs)) for ks, vs in caches]


# ------------------------------------------------------------------ pieces


def test_rmsnorm_by_hand_and_against_numpy():
  cfg = CONFIGS["llama_scaled_rope"]
  norm = RMSNorm(2, 0.0, cfg, nnx.Rngs(0))
  # [3, 4]: mean square 12.5, so x / sqrt(12.5) = [0.8485..., 1.1313...].
  np.testing.assert_allclose(np.asarray(norm(jnp.array([[3.0, 4.0]]))),
                             [[3 / math.sqrt(12.5), 4 / math.sqrt(12.5)]], rtol=1e-6)
  norm = RMSNorm(16, 0.5, cfg, nnx.Rngs(0))
  scale = np.random.default_rng(1).normal(1.0, 0.3, 16)
  norm.scale[...] = jnp.asarray(scale, jnp.float32)
  x = np.random.default_rng(2).normal(0, 0.4, (3, 5, 16))  # eps 0.5 matters at this size
  np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x, jnp.float32))),
                             np_rmsnorm(x, scale, 0.5), atol=1e-6)


@pytest.mark.parametrize("name", ["llama_scaled_rope", "qwen2_bias_tied"])
def test_rope_frequencies_against_a_loop(name):
  cfg = CONFIGS[name]
  got, want = _np(rope_frequencies(cfg)), np_inv_freq(cfg)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  if cfg.rope_scaling is not None:
    plain = np_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
    ratio = plain / got  # 1 (kept), in (1, 8) (interpolated), 8 (divided)
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 8).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


def test_rope_rotates_pairs_and_depends_on_relative_position_only():
  cfg = CONFIGS["llama_scaled_rope"]
  inv = np_inv_freq(cfg)
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2, 3, 5, 16))  # [B, H, T, D]
  positions = np.array([[0, 1, 2, 7, 40], [3, 3, 9, 100, 2000]])
  cos, sin = rope_table(jnp.asarray(positions), jnp.asarray(inv, jnp.float32))
  got = np.asarray(apply_rope(jnp.asarray(x, jnp.float32), cos, sin))
  for b in range(2):
    for h in range(3):
      # float32 angles: ~1e-4 rad of rounding at position 2000.
      np.testing.assert_allclose(got[b, h], np_rope(x[b, h], positions[b], inv), atol=2e-4)
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1),
                             rtol=1e-5)
  # q at m and k at n: the score depends on m - n alone.
  q, k = x[0, 0, 0], x[0, 0, 1]

  def score(m, n):
    c, s = rope_table(jnp.array([[m, n]]), jnp.asarray(inv, jnp.float32))
    r = np.asarray(apply_rope(jnp.asarray(np.stack([q, k])[None], jnp.float32), c, s))[0]
    return float(r[0] @ r[1])

  assert score(5, 2) == pytest.approx(score(33, 30), abs=1e-4)
  assert score(5, 2) != pytest.approx(score(6, 2), abs=1e-3)


def test_attention_mask_against_loops():
  query_valid = np.array([[True, True, True], [False, True, True]])
  key_valid = np.array([[True, True, True, False], [False, True, True, True]])
  query_pos = np.array([[0, 1, 2], [1, 2, 3]])
  got = np.asarray(attention_mask(*map(jnp.asarray, (query_valid, key_valid, query_pos)),
                                  jnp.arange(4)))
  for b in range(2):
    for t in range(3):
      for s in range(4):
        assert got[b, t, s] == (s <= query_pos[b, t] and key_valid[b, s]
                                and query_valid[b, t]), (b, t, s)


def test_dense_contracts_the_last_axes():
  rng = np.random.default_rng(4)
  x, w = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(4, 5, 6))
  got = np.asarray(dense(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32), n_in=2))
  np.testing.assert_allclose(got, np.einsum("btkd,kde->bte", x, w), atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_attention_and_mlp_of_one_block_against_numpy(name):
  cfg = CONFIGS[name]
  model = _random_model(cfg, seed=5)
  layer = model.layers[1]
  _, valid, positions = _inputs(cfg)
  x = np.random.default_rng(6).normal(size=(B, T, cfg.hidden_size))
  slots = jnp.broadcast_to(jnp.arange(T), (B, T))
  mask = attention_mask(jnp.asarray(valid), jnp.asarray(valid), slots, slots)
  rope = rope_table(jnp.asarray(positions), rope_frequencies(cfg))
  got, cache = nnx.jit(lambda a, x, rope, mask: a(x, rope, mask, None, 0))(
      layer.attn, jnp.asarray(x, jnp.float32), rope, mask)
  assert cache is None
  w = _weights(layer.attn)
  for b in range(B):
    want, _, _ = np_attention(x[b], w, cfg, positions[b], np.asarray(mask[b]))
    rows = valid[b]  # fully masked (padding) queries: no caller reads them
    np.testing.assert_allclose(np.asarray(got[b])[rows], want[rows], atol=TOL)
  mlp = layer.mlp
  np.testing.assert_allclose(
      np.asarray(nnx.jit(lambda m, x: m(x))(mlp, jnp.asarray(x, jnp.float32))),
      np_mlp(x, _np(mlp.gate[...]), _np(mlp.up[...]), _np(mlp.down[...])), atol=TOL)


# ------------------------------------------------------------------ whole model

# Compiled once per shape: op-by-op, every primitive would compile on its own.
_forward_logits = nnx.jit(lambda model, tokens, valid: model.forward_logits(tokens, valid))


@nnx.jit
def _cached_logits(model, tokens, positions, mask, cache, cache_index):
  hidden, cache = model(tokens, positions, mask, cache, cache_index)
  return model.logits(hidden), cache


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_logits_against_numpy(name):
  cfg = CONFIGS[name]
  model = _random_model(cfg, seed=7)
  tokens, valid, positions = _inputs(cfg)
  got = np.asarray(_forward_logits(model, jnp.asarray(tokens), jnp.asarray(valid)))
  want, _ = np_forward(model, tokens, valid, positions)
  assert got.shape == (B, T, cfg.vocab_size) and got.dtype == np.float32
  assert np.abs(want[valid]).max() > 0.5  # large enough for TOL to mean something
  np.testing.assert_allclose(got[valid], want[valid], atol=TOL)


def test_prefill_then_one_decode_step_equals_the_full_forward():
  # Every layer option at once (one compile): GQA with G = 4, q/k norms, biases, scaling.
  cfg = dataclasses.replace(CONFIGS["qwen3_qk_norm_gqa4"], qkv_bias=True,
                            rope_scaling=SCALING)
  model = _random_model(cfg, seed=8)
  tokens, valid, positions = _inputs(cfg, seed=1)
  length = T + 3  # two cache slots stay empty
  # Full forward over T + 1 tokens: the reference for the decoded position.
  nxt = np.array([[5], [17], [33]], np.int32)
  full_tokens = np.concatenate([tokens, nxt], axis=1)
  full_valid = np.concatenate([valid, np.ones((B, 1), bool)], axis=1)
  full = np.asarray(_forward_logits(model, jnp.asarray(full_tokens), jnp.asarray(full_valid)))
  # Prefill: the mask is as wide as the new tokens; keys and values land in slots [0, T).
  slots = jnp.broadcast_to(jnp.arange(T), (B, T))
  mask = attention_mask(jnp.asarray(valid), jnp.asarray(valid), slots, slots)
  logits, cache = _cached_logits(model, jnp.asarray(tokens), jnp.asarray(positions), mask,
                                 init_cache(cfg, B, length), 0)
  np.testing.assert_allclose(np.asarray(logits)[valid], full[:, :T][valid], atol=TOL)
  # Decode slot T at RoPE position (last valid position + 1), the mask spanning the cache.
  key_valid = np.concatenate([valid, np.ones((B, 1), bool), np.zeros((B, 2), bool)], axis=1)
  step_mask = attention_mask(jnp.ones((B, 1), bool), jnp.asarray(key_valid),
                             jnp.full((B, 1), T), jnp.arange(length))
  logits, cache = _cached_logits(model, jnp.asarray(nxt), jnp.asarray(positions[:, -1:] + 1),
                                 step_mask, cache, T)
  np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, T], atol=TOL)
  # The cache holds every layer's rotated keys (transposed) and values at their slots.
  _, want = np_forward(model, full_tokens, full_valid,
                       np.maximum(np.cumsum(full_valid, axis=1) - 1, 0))
  for layer, (k, v) in enumerate(want):  # [B, KV, T + 1, D]
    ck, cv = np.asarray(cache.k[layer]), np.asarray(cache.v[layer])
    assert ck.shape == (B, cfg.num_kv_heads, cfg.head_dim, length)
    for b in range(B):
      on = full_valid[b]
      np.testing.assert_allclose(ck[b, :, :, :T + 1].swapaxes(1, 2)[:, on], k[b][:, on],
                                 atol=TOL)
      np.testing.assert_allclose(cv[b, :, :T + 1][:, on], v[b][:, on], atol=TOL)
    assert not ck[..., T + 1:].any() and not cv[:, :, T + 1:].any()  # empty slots


def test_a_bf16_model_decodes_through_a_float32_cache_on_the_cpu():
  # bf16 compute: the cache is float32 on the CPU (`cache_dtype`), holds the bf16 keys
  # exactly, and decode through it gives the logits of the bf16 full forward; both stay
  # within bf16 rounding of the float32 model.
  cfg32 = CONFIGS["llama_scaled_rope"]
  cfg = dataclasses.replace(cfg32, dtype="bfloat16")
  assert cache_dtype(cfg) == jnp.float32 and cache_dtype(cfg32) == jnp.float32
  model, model32 = _random_model(cfg, seed=3), _random_model(cfg32, seed=3)
  tokens, valid, positions = _inputs(cfg, seed=2)
  nxt = np.array([[5], [17], [33]], np.int32)
  full_tokens = jnp.asarray(np.concatenate([tokens, nxt], axis=1))
  full_valid = jnp.asarray(np.concatenate([valid, np.ones((B, 1), bool)], axis=1))
  full = np.asarray(_forward_logits(model, full_tokens, full_valid), np.float64)
  full32 = np.asarray(_forward_logits(model32, full_tokens, full_valid), np.float64)
  slots = jnp.broadcast_to(jnp.arange(T), (B, T))
  mask = attention_mask(jnp.asarray(valid), jnp.asarray(valid), slots, slots)
  _, cache = _cached_logits(model, jnp.asarray(tokens), jnp.asarray(positions), mask,
                            init_cache(cfg, B, T + 1), 0)
  key_valid = jnp.asarray(np.concatenate([valid, np.ones((B, 1), bool)], axis=1))
  step_mask = attention_mask(jnp.ones((B, 1), bool), key_valid, jnp.full((B, 1), T),
                             jnp.arange(T + 1))
  logits, cache = _cached_logits(model, jnp.asarray(nxt), jnp.asarray(positions[:, -1:] + 1),
                                 step_mask, cache, T)
  assert cache.k[0].dtype == jnp.float32 and cache.v[1].dtype == jnp.float32
  k = np.asarray(cache.k[0])
  np.testing.assert_array_equal(k, np.asarray(jnp.asarray(k, jnp.bfloat16), np.float32))
  assert np.abs(k).max() > 0  # written
  got = np.asarray(logits, np.float64)[:, 0]
  scale = np.abs(full32[:, T]).max()
  assert scale > 0.5
  np.testing.assert_allclose(got, full[:, T], atol=0.02 * scale)
  np.testing.assert_allclose(got, full32[:, T], atol=0.03 * scale)


def test_low_precision_matmul_keeps_the_dtype_and_accumulates_in_float32():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(4, 256)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(256, 8)), jnp.bfloat16)
  got = low_precision_matmul(x, w)
  assert got.dtype == jnp.bfloat16
  want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)  # exact products of bf16s
  # One rounding to bf16 at the end: within half a bf16 ulp (2^-8 relative) of the exact
  # sum, plus float32 accumulation error.
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2 ** -8, atol=1e-4)
  f32 = low_precision_matmul(x, w, preferred_element_type=jnp.float32)
  assert f32.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(f32, np.float64), want, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("w_transposed", [False, True])
def test_low_precision_matmul_gradients_against_numpy(w_transposed):
  # The custom backward: d/dx and d/dw of sum(c * (x @ w)) are c @ w.T and x.T @ c, both
  # in bf16, within bf16 rounding of the exact values.
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(6, 64)), jnp.bfloat16)
  w64 = rng.normal(size=(64, 5))
  w = jnp.asarray(w64.T if w_transposed else w64, jnp.bfloat16)
  c = rng.normal(size=(6, 5))
  loss = lambda x, w: (low_precision_matmul(x, w, jnp.float32, w_transposed=w_transposed)
                       * c).sum()
  gx, gw = jax.grad(loss, (0, 1))(x, w)
  assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
  wm = np.asarray(w, np.float64).T if w_transposed else np.asarray(w, np.float64)
  want_x = c @ wm.T
  want_w = np.asarray(x, np.float64).T @ c
  # The cotangent c is rounded to bf16 first (as a bf16 dot's backward does): 2 roundings.
  np.testing.assert_allclose(np.asarray(gx, np.float64), want_x, rtol=2 ** -7, atol=0.05)
  np.testing.assert_allclose(np.asarray(gw, np.float64).T if w_transposed else
                             np.asarray(gw, np.float64), want_w, rtol=2 ** -7, atol=0.05)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_scale_rows_gradients_against_numpy(dtype):
  # d/d scale of sum(c * scale * x) over 16 x 96 rows is sum_rows(c * x), accumulated in
  # float32 whatever the dtype; d/dx is c * scale in the dtype.
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(16, 96, 8)), dtype)
  scale = jnp.asarray(rng.normal(size=8), jnp.float32)
  c = jnp.asarray(rng.normal(size=(16, 96, 8)), dtype)
  loss = lambda s, x: (scale_rows(s, x).astype(jnp.float32) * c.astype(jnp.float32)).sum()
  gs, gx = jax.grad(loss, (0, 1))(scale, x)
  assert gs.dtype == jnp.float32 and gx.dtype == jnp.dtype(dtype)
  x64, c64 = np.asarray(x, np.float64), np.asarray(c, np.float64)
  s64 = np.asarray(scale.astype(dtype), np.float64)
  # float32 accumulation of 1,536 exact products: far inside bf16's 2^-8 (a bf16 sum of
  # them is off by about 1e-2 relative).
  np.testing.assert_allclose(np.asarray(gs), (c64 * x64).sum((0, 1)), rtol=1e-5, atol=1e-4)
  tol = 2 ** -8 if dtype == "bfloat16" else 1e-6
  np.testing.assert_allclose(np.asarray(gx, np.float64), c64 * s64, rtol=tol, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(scale_rows(scale, x)),
                                np.asarray(scale.astype(dtype) * x))


def test_a_mask_of_another_width_against_a_cache_is_an_error():
  cfg = CONFIGS["qwen2_bias_tied"]
  model = _random_model(cfg, seed=0)
  tokens = jnp.ones((1, 4), jnp.int32)
  with pytest.raises(ValueError, match="mask has 5 keys; expected the cache length 8 or "
                     "the number of new tokens 4"):
    _cached_logits(model, tokens, jnp.arange(4)[None], jnp.ones((1, 4, 5), bool),
                   init_cache(cfg, 1, 8), 0)
