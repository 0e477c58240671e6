"""Partial training (`Learner.trainable_layers`): the trainable set against a hand-written
list, no optimizer state for frozen parameters, frozen parameters bitwise unchanged by a
step, the update of the trainable ones equal to full training's restricted to them, and
the learner's log-probs equal to the sampler's after a partial update; trimming the
prompt padding common to all rows keeps the log-probs."""

import jax
import numpy as np
import pytest
from flax import nnx

from evotrainer.learner.step import Learner, completion_logprobs, trim_prompt_padding
from evotrainer.learner.trainable import TrainableSet
from evotrainer.model.transformer import Transformer
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.types import TrainBatch
from tests.tiny_models import tiny_config

L, V, B, PLEN, N = 4, 64, 4, 6, 5
# With eps >> |g| Adam's first update is lr / eps * g: the update is the gradient.
LINEAR_ADAM = dict(learning_rate=1e3, eps=1e3, max_grad_norm=None)
BLOCK = ["attn/k", "attn/o", "attn/q", "attn/v", "attn_norm/scale", "mlp/down", "mlp/gate",
         "mlp/up", "mlp_norm/scale"]


def flat(state) -> dict:
  """'a/b/c' path string -> leaf array."""
  return {"/".join(map(str, p)): np.asarray(v[...] if hasattr(v, "get_value") else v)
          for p, v in nnx.to_flat_state(state)}


def expected_paths(top: int, head: bool, tied: bool = True) -> set:
  """The trainable paths, written out by hand."""
  paths = {f"layers/{i}/{name}" for i in range(L - top, L) for name in BLOCK}
  if head:
    paths |= {"final_norm/scale"} | (set() if tied else {"lm_head"})
  return paths


def batch(seed: int = 0) -> TrainBatch:
  rng = np.random.default_rng(seed)
  lengths = np.array([6, 2, 4, 5], np.int32)
  prompt = np.zeros((B, PLEN), np.int32)
  for i, n in enumerate(lengths):
    prompt[i, PLEN - n:] = rng.integers(1, V, n)
  clen = np.array([5, 3, 1, 4], np.int32)
  valid = np.arange(N)[None, :] < clen[:, None]
  completion = np.where(valid, rng.integers(1, V, (B, N)), 0).astype(np.int32)
  return TrainBatch(prompt_tokens=prompt, prompt_lengths=lengths,
                    completion_tokens=completion, loss_mask=valid,
                    advantages=rng.normal(size=B).astype(np.float32),
                    old_logprobs=np.zeros((B, N), np.float32), ref_logprobs=None,
                    completion_lengths=clen)


@pytest.fixture(scope="module")
def model():
  return Transformer(tiny_config(vocab_size=V, num_layers=L, tie_embeddings=True),
                     rngs=nnx.Rngs(0))


@pytest.mark.parametrize("top,head,tied", [(2, True, True), (1, False, True), (0, True, False),
                                           (L, False, False)])
def test_trainable_set_is_the_hand_written_list(top, head, tied):
  m = Transformer(tiny_config(vocab_size=V, num_layers=L, tie_embeddings=tied),
                  rngs=nnx.Rngs(0))
  params = nnx.state(m)
  train, frozen = TrainableSet(L, top, head).split(params)
  assert set(flat(train)) == expected_paths(top, head, tied)
  assert set(flat(frozen)) == set(flat(params)) - expected_paths(top, head, tied)
  assert "embed" in flat(frozen)
  everything, none = TrainableSet(L).split(params)
  assert set(flat(everything)) == set(flat(params)) and not flat(none)


def test_bad_trainable_layers_are_refused(model):
  with pytest.raises(ValueError, match=r"trainable_layers must be in \[0, 4\]"):
    Learner(model, trainable_layers=5)
  with pytest.raises(ValueError, match="no parameter to train"):
    Learner(model, trainable_layers=0, train_head=False)


def test_optimizer_state_covers_the_trainable_parameters_only(model):
  learner = Learner(model, trainable_layers=2, **LINEAR_ADAM)
  state = learner.init_state(nnx.state(model))
  adam = state.opt_state[-1][0]  # chain(adamw) -> (ScaleByAdamState, ...)
  for moment in (adam.mu, adam.nu):
    assert set(flat(moment)) == expected_paths(2, True)
  assert set(flat(state.params)) == set(flat(nnx.state(model)))  # the state keeps them all


@pytest.mark.slow
def test_a_step_moves_the_trainable_parameters_only_by_the_full_gradient(model):
  params = nnx.state(model)
  before = flat(params)
  partial = Learner(model, trainable_layers=2, **LINEAR_ADAM)
  full = Learner(model, **LINEAR_ADAM)
  b = batch()
  old = np.asarray(full.reference_logprobs(params, b))
  b = b.replace(old_logprobs=old)
  got, _ = partial.step(partial.init_state(params), b, partial.hparams())
  ref, _ = full.step(full.init_state(params), b, full.hparams())
  got, ref = flat(got.params), flat(ref.params)
  trainable = expected_paths(2, True)
  for path, x in before.items():
    if path in trainable:
      assert not np.array_equal(got[path], x), f"{path} did not move"
      np.testing.assert_allclose(got[path] - x, ref[path] - x, rtol=1e-4, atol=1e-7,
                                 err_msg=path)
    else:
      assert np.array_equal(got[path], x), f"frozen {path} changed"
      assert got[path].dtype == x.dtype


def test_learner_logprobs_equal_the_samplers_after_a_partial_update(model):
  learner = Learner(model, trainable_layers=1, learning_rate=1e-2)
  b = batch(1)
  params = nnx.state(model)
  b = b.replace(old_logprobs=np.asarray(learner.reference_logprobs(params, b)))
  state, _ = learner.step(learner.init_state(params), b, learner.hparams())
  rows = [[int(t) for t in r[PLEN - n:]] for r, n in zip(b.prompt_tokens, b.prompt_lengths)]
  sampler = Sampler(model, pad_id=0)
  out = sampler(state.params, left_pad(rows, 0, buckets=(PLEN,)), jax.random.key(3),
                stop_ids=[7], sampling=SamplingParams(max_new_tokens=N, temperature=0.8))
  sampled = b.replace(completion_tokens=np.asarray(out.tokens),
                      completion_lengths=np.asarray(out.lengths))
  ours = np.asarray(learner.reference_logprobs(state.params, sampled, temperature=0.8))
  np.testing.assert_allclose(ours, np.asarray(out.logprobs), atol=1e-5)
  # the update changed the policy's log-probs (a no-op update would pass the above too)
  assert np.abs(ours - np.asarray(learner.reference_logprobs(params, sampled, 0.8))).max() > 1e-4


@pytest.mark.slow
def test_trimmed_prompt_padding_keeps_the_logprobs(model):
  b = batch(2)
  wide = b.replace(prompt_tokens=np.pad(b.prompt_tokens, [(0, 0), (40, 0)]))  # width 46
  trimmed = trim_prompt_padding(wide)
  assert trimmed.prompt_tokens.shape[1] == 16  # the longest prompt (6) rounded up to 16
  np.testing.assert_array_equal(trimmed.prompt_tokens[:, -PLEN:], b.prompt_tokens)
  assert trim_prompt_padding(b) is b  # width 6 <= 16: nothing to trim
  ref = completion_logprobs(model, wide)[0]
  np.testing.assert_allclose(np.asarray(completion_logprobs(model, trimmed)[0]),
                             np.asarray(ref), atol=1e-6)
