"""KV-cache continuation (`Sampler(..., prefix=Prefix(...))`): sampling on from a previous
call's cache, with new tokens appended to each row, equals sampling from a fresh prefill
of the whole context."""

import jax
import numpy as np
import pytest
from flax import nnx

from bench.multiturn import tiny_model
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sampling.sampler import Prefix
from evotrainer.types import PromptBatch

PAD = 0


@pytest.fixture(scope="module")
def model():
  return tiny_model(max_positions=128)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.slow
def test_continuing_from_the_cache_equals_a_fresh_prefill(model, greedy):
  rng = np.random.default_rng(0)
  v = model.config.vocab_size
  prompts = [list(rng.integers(3, v, n)) for n in (5, 11, 8)]
  sampler = Sampler(model, pad_id=PAD)
  params = nnx.state(model)
  first = SamplingParams(max_new_tokens=6, greedy=greedy)
  batch = left_pad(prompts, PAD)  # width 16
  out, cache = sampler(params, batch, jax.random.key(1), stop_ids=[2], sampling=first,
                       return_cache=True)
  k = np.asarray(out.lengths)
  # Each row's context grows by its sampled ids and an observation of its own length.
  contexts = [prompts[i] + list(np.asarray(out.tokens)[i, :k[i]])
              + list(rng.integers(3, v, 2 + 3 * i)) for i in range(3)]
  lengths = np.array([len(c) for c in contexts])
  width = 32
  cached = np.array([len(prompts[i]) + k[i] - 1 for i in range(3)])  # fed to the model
  m = 16
  assert (lengths - cached).max() <= m
  chunk = left_pad([c[-m:] for c in contexts], PAD, (m,))
  old_pad = batch.tokens.shape[1] - np.array([len(p) for p in prompts])
  shift = (width - lengths) - old_pad
  second = SamplingParams(max_new_tokens=8, greedy=greedy)
  key = jax.random.key(2)
  cont = sampler(params, PromptBatch(tokens=chunk.tokens, lengths=lengths.astype(np.int32)),
                 key, stop_ids=[2], sampling=second, prefix=Prefix(cache, shift, width))
  fresh = sampler(params, left_pad(contexts, PAD, (width,)), key, stop_ids=[2],
                  sampling=second)
  np.testing.assert_array_equal(np.asarray(cont.tokens), np.asarray(fresh.tokens))
  np.testing.assert_array_equal(np.asarray(cont.lengths), np.asarray(fresh.lengths))
  np.testing.assert_allclose(np.asarray(cont.logprobs), np.asarray(fresh.logprobs),
                             atol=1e-5)


def test_a_continuation_chunk_wider_than_the_context_is_refused(model):
  sampler = Sampler(model, pad_id=PAD)
  params = nnx.state(model)
  batch = left_pad([[5, 6, 7]], PAD, (16,))
  _, cache = sampler(params, batch, jax.random.key(0), sampling=SamplingParams(
      max_new_tokens=4), return_cache=True)
  with pytest.raises(ValueError, match="exceeds the context width"):
    sampler(params, left_pad([[5, 6, 7]], PAD, (32,)), jax.random.key(0),
            sampling=SamplingParams(max_new_tokens=4),
            prefix=Prefix(cache, np.zeros(1, np.int32), 16))
