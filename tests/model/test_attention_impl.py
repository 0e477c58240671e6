"""`ModelConfig.attention_impl='xla'` (`jax.nn.dot_product_attention`) equals the dense
einsum path: forward logits, KV-cache decoding in the sampler and the learner's
log-probs, with grouped-query attention and left-padded rows (whose fully masked query
rows get the same uniform attention in both)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer.learner.step import completion_logprobs
from evotrainer.model import ModelConfig, Transformer
from evotrainer.model.transformer import init_cache
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.types import TrainBatch

# 8 query heads over 2 kv heads (G = 4), Qwen3 layer options.
CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=8, num_kv_heads=2, head_dim=16, architecture="qwen3",
                  qk_norm=True, rope_theta=5e5)
# float32 on the CPU: the two paths differ only in summation order and in scaling the
# scores by multiplying with 1/sqrt(D) instead of dividing by sqrt(D).
TOL = 2e-5
PAD = 0


def pair(**overrides):
  """The same parameters (same init seed) under 'dense' and 'xla' attention."""
  cfg = dataclasses.replace(CFG, **overrides)
  dense = Transformer(cfg, rngs=nnx.Rngs(1))
  xla = Transformer(dataclasses.replace(cfg, attention_impl="xla"), rngs=nnx.Rngs(1))
  for a, b in zip(jax.tree.leaves(nnx.state(dense)), jax.tree.leaves(nnx.state(xla))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  return dense, xla


def left_padded_tokens():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, CFG.vocab_size, (3, 11)).astype(np.int32)
  valid = np.arange(11)[None, :] >= np.array([0, 4, 9])[:, None]
  return jnp.asarray(np.where(valid, tokens, PAD)), jnp.asarray(valid)


def forward(model):
  """Jitted `forward_logits` of `model` (parameters passed in: nnx.remat under jax.jit
  cannot close over a module)."""
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, tokens, valid: nnx.merge(graphdef, s).forward_logits(tokens, valid))
  return lambda tokens, valid=None: fn(state, tokens,
                                       jnp.ones(tokens.shape, bool) if valid is None else valid)


def max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def test_unknown_attention_impl_is_rejected():
  with pytest.raises(ValueError, match="attention_impl='flash'"):
    dataclasses.replace(CFG, attention_impl="flash")


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.slow
def test_forward_logits_equal_dense_with_left_padding(remat, monkeypatch):
  dense, xla = pair(remat=remat)
  tokens, valid = left_padded_tokens()
  want = forward(dense)(tokens, valid)
  calls = []
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda *a, **k: calls.append(k["implementation"]) or fused(*a, **k))
  got = forward(xla)(tokens, valid)
  assert calls == ["xla"] * CFG.num_layers
  diff = max_diff(got, want)
  print(f"forward logits, xla vs dense: max abs diff {diff:.3g}")
  # Every position, the padded ones included: their fully masked query rows attend
  # uniformly over all keys in both paths (not zeroed), so they agree too.
  assert diff <= TOL
  # And both are right: the left-padded row's real positions equal its unpadded forward.
  assert max_diff(want[1, 4:], forward(dense)(tokens[1:2, 4:])[0]) <= TOL


def test_prefill_and_decode_against_the_cache_equal_dense():
  dense, xla = pair()
  tokens, valid = left_padded_tokens()
  b, t = tokens.shape
  length = t + 3
  slots = jnp.arange(length)
  positions = jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
  mask = (slots[None, None, :t] <= slots[None, :t, None]) & valid[:, None, :]

  def run(model):
    # Prefill (mask as wide as the new tokens) with the last-position query slice,
    # then three single-token decode steps against the whole cache.
    h, cache = model(tokens, positions, mask, init_cache(model.config, b, length), 0,
                     query_slice=(t - 1, t))
    outs = [model.logits(h)]
    key_valid = jnp.concatenate([valid, jnp.zeros((b, 3), bool)], axis=1)
    pos = positions[:, -1:]
    tok = jnp.argmax(outs[-1], axis=-1).astype(jnp.int32)
    for i in range(3):
      key_valid = key_valid.at[:, t + i].set(True)
      pos = pos + 1
      step_mask = (slots[None, None, :] <= t + i) & key_valid[:, None, :]
      h, cache = model(tok, pos, step_mask, cache, t + i)
      outs.append(model.logits(h))
      tok = jnp.argmax(outs[-1], axis=-1).astype(jnp.int32)
    return outs, cache

  want, want_cache = jax.jit(lambda: run(dense))()
  got, got_cache = jax.jit(lambda: run(xla))()
  for step, (g, w) in enumerate(zip(got, want)):
    diff = max_diff(g, w)
    print(f"step {step}: xla vs dense logits max abs diff {diff:.3g}")
    assert diff <= TOL
  assert max_diff(jax.tree.leaves(got_cache)[0], jax.tree.leaves(want_cache)[0]) <= TOL


def test_sampler_outputs_equal_dense():
  dense, xla = pair()
  rng = np.random.default_rng(3)
  prompts = [list(map(int, rng.integers(1, CFG.vocab_size, n))) for n in (3, 9, 5, 12)]
  batch = left_pad(prompts, PAD)
  outs = {}
  for name, model in (("dense", dense), ("xla", xla)):
    sampler = Sampler(model, pad_id=PAD)
    outs[name] = sampler(nnx.state(model), batch, jax.random.key(0), stop_ids=[],
                         sampling=SamplingParams(max_new_tokens=8, temperature=1.0))
  np.testing.assert_array_equal(np.asarray(outs["xla"].tokens), np.asarray(outs["dense"].tokens))
  diff = max_diff(outs["xla"].logprobs, outs["dense"].logprobs)
  print(f"sampler log-probs (8 decode steps), xla vs dense: max abs diff {diff:.3g}")
  assert diff <= TOL


def test_learner_logprobs_equal_dense():
  dense, xla = pair()
  rng = np.random.default_rng(4)
  b, p, n = 4, 7, 5
  prompt_lengths = np.array([7, 2, 4, 1], np.int32)
  completion_lengths = np.array([5, 3, 1, 4], np.int32)
  prompt = np.where(np.arange(p)[None, :] >= (p - prompt_lengths)[:, None],
                    rng.integers(1, CFG.vocab_size, (b, p)), PAD).astype(np.int32)
  completion = rng.integers(1, CFG.vocab_size, (b, n)).astype(np.int32)
  zeros = np.zeros((b, n), np.float32)
  batch = TrainBatch(prompt_tokens=prompt, prompt_lengths=prompt_lengths,
                     completion_tokens=completion, loss_mask=zeros > 0,
                     advantages=np.zeros(b, np.float32), old_logprobs=zeros,
                     completion_lengths=completion_lengths)
  fn = lambda model: jax.jit(lambda bt: completion_logprobs(model, bt, with_entropy=True))(
      jax.tree.map(jnp.asarray, batch))
  (want, want_ent), (got, got_ent) = fn(dense), fn(xla)
  diff = max(max_diff(got, want), max_diff(got_ent, want_ent))
  print(f"learner log-probs and entropies, xla vs dense: max abs diff {diff:.3g}")
  assert diff <= TOL
  assert np.all(np.asarray(want)[:, :1] < 0)


def test_bfloat16_forward_close_to_dense():
  # bf16 compute: both paths accumulate scores in float32 and round the probabilities to
  # bf16 before p.V; the remaining differences are bf16 rounding of different orders.
  dense, xla = pair(dtype="bfloat16")
  tokens, valid = left_padded_tokens()
  want, got = forward(dense)(tokens, valid), forward(xla)(tokens, valid)
  diff = max_diff(got, want)
  print(f"bf16 forward logits, xla vs dense: max abs diff {diff:.3g} "
        f"(logits max abs {float(jnp.max(jnp.abs(want))):.3g})")
  assert diff <= 2e-2
