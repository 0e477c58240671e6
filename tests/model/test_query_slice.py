"""`Transformer(..., query_slice=(start, stop))` equals the full forward's slice, with and
without a cache, with and without remat (the last layer computes fewer positions)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer.model import Transformer
from evotrainer.model.transformer import init_cache
from tests.tiny_models import tiny_config

CFG = tiny_config(num_layers=3, architecture="qwen3", qk_norm=True)
B, T = 2, 10


def inputs():
  tokens = jax.random.randint(jax.random.key(0), (B, T), 0, CFG.vocab_size)
  pad = jnp.array([0, 3])  # row 1 is left-padded by 3 slots
  slots = jnp.arange(T)
  valid = slots[None, :] >= pad[:, None]
  positions = jnp.maximum(slots[None, :] - pad[:, None], 0)
  mask = (slots[None, None, :] <= slots[None, :, None]) & valid[:, None, :]
  return tokens, positions, mask


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("start,stop", [(0, T), (T - 1, T), (4, 8)])
@pytest.mark.slow
def test_query_slice_equals_the_full_forward_slice(remat, start, stop):
  model = Transformer(dataclasses.replace(CFG, remat=remat), rngs=nnx.Rngs(1))
  tokens, positions, mask = inputs()
  full, _ = model(tokens, positions, mask)
  part, _ = model(tokens, positions, mask, query_slice=(start, stop))
  assert part.shape == (B, stop - start, CFG.hidden_size)
  np.testing.assert_allclose(np.asarray(part), np.asarray(full[:, start:stop]), atol=1e-5)


def test_query_slice_with_a_cache_fills_the_same_cache():
  model = Transformer(CFG, rngs=nnx.Rngs(1))
  tokens, positions, mask = inputs()
  full, cache_full = model(tokens, positions, mask, cache=init_cache(CFG, B, T),
                           cache_index=0)
  last, cache_last = model(tokens, positions, mask, cache=init_cache(CFG, B, T),
                           cache_index=0, query_slice=(T - 1, T))
  np.testing.assert_allclose(np.asarray(last), np.asarray(full[:, -1:]), atol=1e-5)
  for a, b in zip(jax.tree.leaves(cache_full), jax.tree.leaves(cache_last)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
