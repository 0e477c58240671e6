"""Sampler vs independent references: a naive re-run-everything loop and teacher forcing."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer.model import Transformer
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sampling import sampler as sampler_lib
from evotrainer.sampling.strategies import select
from evotrainer.sharding import rules
from evotrainer.sharding.mesh import make_mesh, state_shardings
from tests.tiny_models import small_config

CFG = small_config(vocab_size=96, qk_norm=True, rope_theta=5e5, max_position_embeddings=256)
PAD = 0


@pytest.fixture(scope="module")
def model():
  return Transformer(CFG, rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(0)
  return [list(map(int, rng.integers(1, CFG.vocab_size, size=n))) for n in (3, 9, 5, 12)]


WIDTH = 32  # every reference sequence (prompt + completion) is right-padded to this
_FORWARDS = {}


def _forward(model):
  """One jitted full forward pass per model, over sequences right-padded to WIDTH (padding
  is causal-masked away), so the references compile once per model, not per prompt."""
  if id(model) not in _FORWARDS:
    _FORWARDS[id(model)] = (model, jax.jit(lambda toks, valid: model.forward_logits(toks, valid)))
  return _FORWARDS[id(model)][1]


def _padded(seq):
  assert len(seq) <= WIDTH, len(seq)
  toks = np.zeros((1, WIDTH), np.int32)
  toks[0, :len(seq)] = seq
  return toks, np.arange(WIDTH)[None, :] < len(seq)


def naive_greedy(model, prompt, n, stop):
  """Re-runs the full forward pass on the whole sequence for every new token."""
  seq = list(prompt)
  for _ in range(n):
    nxt = int(jnp.argmax(_forward(model)(*_padded(seq))[0, len(seq) - 1]))
    seq.append(nxt)
    if nxt in stop:
      break
  return seq[len(prompt):]


def teacher_forced_logprobs(model, prompt, completion):
  seq = list(prompt) + list(completion)
  logp = jax.nn.log_softmax(_forward(model)(*_padded(seq))[0], axis=-1)
  idx = np.arange(len(prompt) - 1, len(seq) - 1)
  return np.asarray(logp[idx, np.asarray(completion)])


def test_greedy_matches_naive_loop_and_stops(model, prompts):
  n = 12
  # Pick as stop id a token that greedy decoding of row 0 produces mid-way, so at least
  # one row stops early and the others keep going.
  free = naive_greedy(model, prompts[0], n, stop=())
  stop = free[4]
  sampler = Sampler(model, pad_id=PAD)
  out = sampler(nnx.state(model), left_pad(prompts, PAD), jax.random.key(0), stop_ids=[stop],
                sampling=SamplingParams(max_new_tokens=n, greedy=True))
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  stopped = 0
  for i, p in enumerate(prompts):
    ref = naive_greedy(model, p, n, stop=(stop,))
    assert lengths[i] == len(ref)
    np.testing.assert_array_equal(tokens[i, :len(ref)], ref)
    np.testing.assert_array_equal(tokens[i, len(ref):], PAD)
    np.testing.assert_array_equal(np.asarray(out.logprobs)[i, len(ref):], 0.0)
    assert bool(out.truncated[i]) == (ref[-1] != stop)
    stopped += ref[-1] == stop
  assert stopped >= 1
  assert lengths[0] == free.index(stop) + 1 <= 5


def test_greedy_matches_naive_loop_over_vocab_blocks(prompts):
  # A vocabulary of three 128-token blocks: greedy's two-level argmax (first block
  # holding the max, then the index in it) against the naive loop's jnp.argmax.
  big = Transformer(dataclasses.replace(CFG, vocab_size=384), rngs=nnx.Rngs(2))
  n = 10
  out = Sampler(big, pad_id=PAD)(nnx.state(big), left_pad(prompts, PAD), jax.random.key(0),
                                 sampling=SamplingParams(max_new_tokens=n, greedy=True))
  for i, p in enumerate(prompts):
    ref = naive_greedy(big, p, n, stop=())
    np.testing.assert_array_equal(np.asarray(out.tokens)[i], ref)
    np.testing.assert_allclose(np.asarray(out.logprobs)[i],
                               teacher_forced_logprobs(big, p, ref), atol=1e-4)
  assert np.asarray(out.tokens).max() >= 128  # ids beyond the first block were chosen


@pytest.mark.parametrize("tied", [False, True])
def test_transposed_decode_head_equals_the_model_head(tied):
  # XLA:CPU decodes up to `_TRANSPOSED_HEAD_ROWS` rows with the head as [V, E] @ [E, B].
  m = Transformer(dataclasses.replace(CFG, tie_embeddings=tied), rngs=nnx.Rngs(3))
  h = jax.random.normal(jax.random.key(0), (5, CFG.hidden_size))
  ours = jax.jit(lambda h: sampler_lib._transposed_head(m)(h))(h)
  np.testing.assert_allclose(np.asarray(ours), np.asarray(m.logits(h[:, None])[:, 0]),
                             rtol=1e-5, atol=1e-5)


def test_greedy_beyond_the_transposed_head_rows_matches_naive_loop(model, prompts):
  # More rows than `_TRANSPOSED_HEAD_ROWS`: the head's [B, E] @ [E, V] form.
  rows = prompts * (sampler_lib._TRANSPOSED_HEAD_ROWS // len(prompts) + 1)
  assert len(rows) > sampler_lib._TRANSPOSED_HEAD_ROWS
  n = 8
  out = Sampler(model, pad_id=PAD)(nnx.state(model), left_pad(rows, PAD), jax.random.key(0),
                                   sampling=SamplingParams(max_new_tokens=n, greedy=True))
  for i, p in enumerate(prompts):
    ref = naive_greedy(model, p, n, stop=())
    for r in range(i, len(rows), len(prompts)):
      np.testing.assert_array_equal(np.asarray(out.tokens)[r], ref)
    np.testing.assert_allclose(np.asarray(out.logprobs)[i],
                               teacher_forced_logprobs(model, p, ref), atol=1e-4)


def test_sampled_logprobs_equal_teacher_forcing(model, prompts):
  sampler = Sampler(model, pad_id=PAD)
  out = sampler(nnx.state(model), left_pad(prompts, PAD), jax.random.key(3),
                sampling=SamplingParams(max_new_tokens=10, temperature=1.0))
  for i, p in enumerate(prompts):
    comp = np.asarray(out.tokens)[i, :int(out.lengths[i])]
    ref = teacher_forced_logprobs(model, p, comp)
    np.testing.assert_allclose(np.asarray(out.logprobs)[i, :len(comp)], ref, atol=1e-4)


def test_same_key_is_deterministic_and_keys_differ(model, prompts):
  sampler = Sampler(model, pad_id=PAD)
  batch = left_pad(prompts, PAD)
  sp = SamplingParams(max_new_tokens=8, temperature=1.0)
  a = sampler(nnx.state(model), batch, jax.random.key(7), sampling=sp)
  b = sampler(nnx.state(model), batch, jax.random.key(7), sampling=sp)
  c = sampler(nnx.state(model), batch, jax.random.key(8), sampling=sp)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert not np.array_equal(a.tokens, c.tokens)


def test_top_k_and_top_p_stay_in_allowed_set():
  # Row logits with known probabilities: softmax([4, 3, 2, 1, 0, -1, ...]).
  v = 32
  logits = jnp.tile(jnp.arange(v, 0, -1, dtype=jnp.float32)[None, :] - v + 4, (64, 1))
  seen_k, seen_p = set(), set()
  for s in range(20):
    ids, _ = select(logits, jax.random.key(s), jnp.float32(1.0), top_k=3)
    seen_k.update(np.asarray(ids).tolist())
    # Probabilities of the top tokens: e^4, e^3, e^2 ... normalized; the top two carry
    # 0.632 + 0.233 = 0.865 of the mass, so top_p=0.8 keeps exactly {0, 1}.
    ids, _ = select(logits, jax.random.key(100 + s), jnp.float32(1.0), top_p=0.8)
    seen_p.update(np.asarray(ids).tolist())
  assert seen_k == {0, 1, 2}
  assert seen_p == {0, 1}
  ids, _ = select(logits, jax.random.key(0), jnp.float32(1.0), top_k=5, top_p=0.5)
  assert set(np.asarray(ids).tolist()) == {0}


def test_sampler_log_probs_ignore_truncation(model, prompts):
  # With top-k the returned log-prob is still the untruncated policy's (what the
  # learner recomputes), so it equals teacher forcing.
  sampler = Sampler(model, pad_id=PAD)
  out = sampler(nnx.state(model), left_pad(prompts[:2], PAD), jax.random.key(5),
                sampling=SamplingParams(max_new_tokens=6, top_k=5))
  comp = np.asarray(out.tokens)[1, :int(out.lengths[1])]
  np.testing.assert_allclose(np.asarray(out.logprobs)[1, :len(comp)],
                             teacher_forced_logprobs(model, prompts[1], comp), atol=1e-4)


def test_same_bucket_does_not_recompile(model, prompts):
  sampler = Sampler(model, pad_id=PAD)
  sp = SamplingParams(max_new_tokens=6, temperature=1.0)
  sampler(nnx.state(model), left_pad(prompts, PAD), jax.random.key(0), sampling=sp)
  other = [p[::-1][:7] for p in prompts]  # new prompts, same bucket (16), same batch
  sampler(nnx.state(model), left_pad(other, PAD), jax.random.key(1), stop_ids=[3, 4],
          sampling=SamplingParams(max_new_tokens=6, temperature=0.7))
  assert sampler.compiled_programs() == 1
  longer = [p * 3 for p in prompts]  # bucket 64: one more program
  sampler(nnx.state(model), left_pad(longer, PAD), jax.random.key(1), sampling=sp)
  assert sampler.compiled_programs() == 2


def test_sharded_sampling_equals_single_device(model, prompts, devices):
  mesh = make_mesh(2, 2, 2)
  params = nnx.state(model)
  sharded = jax.device_put(params, state_shardings(params, mesh, rules.SAMPLER_RULES))
  assert sharded["layers"][0]["mlp"]["gate"][...].sharding.spec == jax.sharding.PartitionSpec(None, "tensor")
  batch = left_pad(prompts * 2, PAD)  # 8 rows: divisible by data*fsdp
  sp = SamplingParams(max_new_tokens=8, temperature=1.0)
  ref = Sampler(model, pad_id=PAD)(params, batch, jax.random.key(2), sampling=sp)
  jax.set_mesh(mesh)
  try:
    out = Sampler(model, pad_id=PAD, mesh=mesh)(sharded, batch, jax.random.key(2), sampling=sp)
  finally:
    jax.set_mesh(None)
  assert out.tokens.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def test_bad_input_is_a_clear_error(model):
  sampler = Sampler(model, pad_id=PAD)
  with pytest.raises(ValueError, match="empty prompt batch"):
    left_pad([], PAD)
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    left_pad([[1] * 5000], PAD)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    sampler(nnx.state(model), left_pad([[1] * 200], PAD), jax.random.key(0),
            sampling=SamplingParams(max_new_tokens=64))
  with pytest.raises(ValueError, match="max_new_tokens"):
    SamplingParams(max_new_tokens=0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingParams(temperature=0.0)


@pytest.mark.slow
def test_vocab_limit_is_never_exceeded(model, prompts):
  limit = 17
  sampler = Sampler(model, pad_id=PAD, vocab_limit=limit)
  out = sampler(nnx.state(model), left_pad(prompts, PAD), jax.random.key(4),
                sampling=SamplingParams(max_new_tokens=12, temperature=2.0))
  assert np.asarray(out.tokens).max() < limit
  # Log-probs are normalized over the allowed ids only.
  comp = np.asarray(out.tokens)[0, :int(out.lengths[0])]
  seq = jnp.array([prompts[0] + list(comp)])
  logits = model.forward_logits(seq)[0, :, :limit] / 2.0
  logp = jax.nn.log_softmax(logits, axis=-1)
  idx = np.arange(len(prompts[0]) - 1, len(prompts[0]) + len(comp) - 1)
  np.testing.assert_allclose(np.asarray(out.logprobs)[0, :len(comp)],
                             np.asarray(logp[idx, comp]), atol=1e-4)


def test_inverse_cdf_sampling_matches_the_distribution():
  # 3 tokens with probabilities 0.5, 0.3, 0.2 and one masked token: frequencies over
  # 20k draws agree within 4 standard errors, and the masked id never appears.
  from evotrainer.sampling.strategies import NEG, inverse_cdf_sample
  p = np.array([0.5, 0.0, 0.3, 0.2])
  logits = jnp.tile(jnp.array([np.log(0.5), NEG, np.log(0.3), np.log(0.2)], jnp.float32),
                    (20000, 1))
  ids = np.asarray(inverse_cdf_sample(jax.random.key(0), logits))
  freq = np.bincount(ids, minlength=4) / ids.size
  assert freq[1] == 0
  se = np.sqrt(p * (1 - p) / ids.size)
  assert np.all(np.abs(freq - p) <= 4 * se + 1e-12), freq
