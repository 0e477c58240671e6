"""The learner step's compiled memory with a 151,936-token vocabulary and 8k completion
tokens per micro-batch (XLA's memory analysis; nothing is allocated)."""

import pytest

from evotrainer.learner.memory import step_memory

QWEN_VOCAB = 151_936
GIB = 2**30


@pytest.mark.slow
def test_chunked_logprobs_bound_the_step_memory():
  kw = dict(vocab=QWEN_VOCAB, rows=8, completion=1024)
  whole = step_memory(**kw)
  chunked = step_memory(**kw, chunk=128)
  logits = whole["logits_bytes"]  # [8, 1024, V] float32: 4.6 GiB
  # One block: the step holds (several copies of) the full logits; measured 14.2 GiB.
  assert whole["temp_bytes"] > 2 * logits
  # 128 slots a block: no full-logits buffer survives; the stated bound is 3 GiB
  # (measured 2.6 GiB), a function of the block, not of the completion length.
  assert chunked["temp_bytes"] < 3 * GIB < logits
  longer = step_memory(vocab=QWEN_VOCAB, rows=8, completion=2048, chunk=128)
  assert longer["temp_bytes"] < 1.5 * chunked["temp_bytes"]
