"""`SingleTurnEngine`: problems -> one sampled completion per row -> decoded, scored
`Generation`."""

from __future__ import annotations

from typing import Optional, Sequence

import jax
import numpy as np

from evotrainer.rollouts.generation import Generation, cut_at_stop
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sampling.stop_rules import rule_ids
from evotrainer.sharding.multihost import broadcast_json, is_primary, to_host


class SingleTurnEngine:
  """The single-turn rollout engine. Encode prompts, sample, decode, score: the path
  from problems to scored text."""

  def __init__(self, task, tokenizer, sampler: Sampler, sampler_shardings=None):
    self.task = task
    self.tok = tokenizer
    self.sampler = sampler
    self.sampler_shardings = sampler_shardings

  def __call__(self, params, problems: Sequence, group: int, key: jax.Array,
               sampling: SamplingParams, pad_rows_to: Optional[int] = None) -> Generation:
    if self.sampler_shardings is not None:
      params = jax.device_put(params, self.sampler_shardings)
    rows = [p for p in problems for _ in range(group)]
    ids = [self.tok.encode(self.task.format_prompt(p), add_bos=True) for p in rows]
    n = len(ids)
    if pad_rows_to and n < pad_rows_to:  # a fixed batch shape: no recompile
      ids = ids + [ids[-1]] * (pad_rows_to - n)
    batch = left_pad(ids, self.tok.pad_id)
    out = self.sampler(params, batch, key, stop_ids=self.tok.stop_ids, sampling=sampling,
                       rule_ids=rule_ids(self.tok, sampling.stop_rule))
    # Rows are sharded over the mesh, possibly over several processes: every process
    # gathers the whole batch (a collective), so all hold the same host rollouts.
    out = to_host(out)
    tokens, lengths = out.tokens[:n], out.lengths[:n]
    texts = [self.tok.decode(cut_at_stop(tokens[i, :lengths[i]], self.tok.stop_ids))
             for i in range(n)]
    # Scored by process 0 and sent to the others: verifiers run under wall-clock
    # timeouts (math-verify, the sandbox), so two hosts could score one text differently
    # and then build different training batches (multihost.py).
    scores = broadcast_json(self.task.score_many(rows, texts) if is_primary() else None)
    return Generation(problems=rows, prompt_tokens=np.asarray(batch.tokens)[:n],
                      prompt_lengths=np.asarray(batch.lengths)[:n], tokens=tokens,
                      logprobs=out.logprobs[:n], lengths=lengths,
                      truncated=out.truncated[:n], texts=texts, scores=scores)
