"""One prefill per prompt group: group detection by hand, shared vs per-row prefill on
the same key (same tokens, log-probs equal), and proof that the rows of a group really
share their first row's prefill."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer.model import Transformer
from evotrainer.model.transformer import init_cache
from evotrainer.sampling import Sampler, SamplingParams, left_pad, sample
from evotrainer.sampling.sampler import prompt_groups
from tests.tiny_models import small_config

CFG = small_config(vocab_size=96, max_position_embeddings=128)
PAD, G, N = 0, 4, 10
PROMPTS = [[5, 9, 11], [7, 3, 2, 8, 1, 4, 6, 30, 2], [40, 41]]


@pytest.fixture(scope="module")
def model():
  return Transformer(CFG, rngs=nnx.Rngs(2))


def grouped(prompts, g=G):
  return left_pad([p for p in prompts for _ in range(g)], PAD)


def groups(batch) -> int:
  return prompt_groups(batch.tokens, batch.lengths)


def test_prompt_groups_by_hand():
  assert groups(grouped(PROMPTS)) == 4
  assert groups(grouped(PROMPTS, 1)) == 1
  assert groups(left_pad([[1], [1], [2], [2], [2], [3]], PAD)) == 1  # uneven runs
  assert groups(left_pad([[1], [1], [2], [2], [2], [2]], PAD)) == 2  # runs 2, 4: gcd 2
  assert groups(left_pad([[1], [1], [1], [2], [2], [2], [3], [3], [3], [3], [3], [3]],
                         PAD)) == 3  # runs 3, 3, 6
  assert groups(left_pad([[1], [1], [1], [1], [2], [2]], PAD)) == 2  # runs 4, 2
  assert groups(left_pad([[1], [1], [2], [2], [1], [1]], PAD)) == 2  # runs, not sets
  assert groups(left_pad([[1], [1], [1], [1]], PAD)) == 4
  # same tokens, different lengths (a pad-id token that is real) are different prompts
  assert prompt_groups(np.zeros((2, 4), np.int32), np.array([2, 3])) == 1


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.slow
def test_shared_prefill_equals_per_row_prefill(model, greedy):
  batch = grouped(PROMPTS)
  sp = SamplingParams(max_new_tokens=N, temperature=1.0, greedy=greedy)
  run = lambda share: Sampler(model, pad_id=PAD, share_prefill=share)(
      nnx.state(model), batch, jax.random.key(7), stop_ids=[3], sampling=sp)
  shared, per_row = run(True), run(False)
  np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(per_row.tokens))
  np.testing.assert_array_equal(np.asarray(shared.lengths), np.asarray(per_row.lengths))
  np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(per_row.logprobs),
                             atol=1e-5)
  if not greedy:  # the rows of a group decode apart
    assert len({tuple(r) for r in np.asarray(shared.tokens)[:G]}) > 1


def test_rows_of_a_group_read_the_first_rows_prefill(model):
  """Given rows that differ inside a 'group', `sample(group=G)` prefills the first row of
  each run only: every row then decodes what its run's first prompt would (greedy)."""
  rng = np.random.default_rng(0)
  b = len(PROMPTS) * G
  firsts = [list(map(int, rng.integers(1, 96, 6))) for _ in PROMPTS]
  rows = [f if j == 0 else list(map(int, rng.integers(1, 96, 6))) for f in firsts
          for j in range(G)]
  graphdef, params = nnx.split(model)
  fn = jax.jit(functools.partial(sample, graphdef), static_argnames=(
      "max_new_tokens", "top_k", "top_p", "greedy", "pad_id", "group"))
  run = lambda toks, group: fn(
      params, init_cache(CFG, b, 16 + N), jnp.asarray(left_pad(toks, PAD).tokens),
      jnp.full((b,), 6, jnp.int32), jnp.full((b, 1), -1, jnp.int32), jax.random.key(0),
      jnp.float32(1.0), max_new_tokens=N, top_k=0, top_p=1.0, greedy=True, pad_id=PAD,
      group=group)[0].tokens
  got = np.asarray(run(rows, G))
  want = np.asarray(run([f for f in firsts for _ in range(G)], 1))
  np.testing.assert_array_equal(got, want)
  assert not np.array_equal(np.asarray(run(rows, 1)), want)  # the rows do differ
