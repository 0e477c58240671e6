"""The compiled learner step's memory, from XLA's analysis (no device memory is used).

`step_memory` builds a one-layer model with the given vocabulary, lowers and compiles the
real `Learner` step on abstract inputs, and returns `compiled.memory_analysis()`'s
figures; bench/learner_memory.py prints them for a large vocabulary with and without
`Learner.logprob_chunk`, and tests/learner/test_memory.py bounds them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from evotrainer.learner.step import Learner
from evotrainer.model.config import ModelConfig
from evotrainer.model.transformer import Transformer
from evotrainer.types import TrainBatch


def step_memory(*, vocab: int, rows: int, completion: int, prompt: int = 16,
                hidden: int = 64, chunk: int | None = None, dtype: str = "float32") -> dict:
  """{'temp_bytes', 'argument_bytes', 'output_bytes', 'logits_bytes'} of one compiled
  learner step (one micro-batch of `rows` x `completion` tokens); `logits_bytes` is the
  size of the full `[rows, completion, vocab]` float32 logits, for scale."""
  config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_layers=1, num_heads=2, num_kv_heads=1, head_dim=hidden // 2,
                       param_dtype=dtype, dtype=dtype)
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  learner = Learner(model, logprob_chunk=chunk)
  params = nnx.state(model)
  state = jax.eval_shape(learner.init_state, params)
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
  batch = TrainBatch(prompt_tokens=i32(rows, prompt), prompt_lengths=i32(rows),
                     completion_tokens=i32(rows, completion),
                     loss_mask=jax.ShapeDtypeStruct((rows, completion), jnp.bool_),
                     advantages=f32(rows), old_logprobs=f32(rows, completion),
                     ref_logprobs=None, completion_lengths=i32(rows))
  hparams = jax.eval_shape(learner.hparams)
  mem = learner._step_fn.lower(state, batch, hparams).compile().memory_analysis()  # pylint: disable=protected-access
  return {"temp_bytes": int(mem.temp_size_in_bytes),
          "argument_bytes": int(mem.argument_size_in_bytes),
          "output_bytes": int(mem.output_size_in_bytes),
          "logits_bytes": int(np.prod([rows, completion, vocab])) * 4}
