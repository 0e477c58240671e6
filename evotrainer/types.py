"""Records that cross stage boundaries (DESIGN.md section 3).

Device-side records are `flax.struct` dataclasses (pytrees); host-side records are
plain frozen dataclasses. Array fields carry their shape in a comment.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class PromptBatch:
  """Prompts ready for the sampler: left-padded to a bucket length P."""

  tokens: jax.Array | np.ndarray  # [B, P] int32, left-padded
  lengths: jax.Array | np.ndarray  # [B] int32, real prompt lengths
  task_ids: Optional[np.ndarray] = flax.struct.field(pytree_node=False, default=None)  # [B]
  group_ids: Optional[np.ndarray] = flax.struct.field(pytree_node=False, default=None)  # [B]

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]

  @property
  def bucket_length(self) -> int:
    return self.tokens.shape[1]


@flax.struct.dataclass
class Rollouts:
  """What the sampler returns (device → host)."""

  tokens: jax.Array  # [B, N] int32 completion ids, pad after the end
  logprobs: jax.Array  # [B, N] float32 log-prob of each sampled token, 0 after the end
  lengths: jax.Array  # [B] int32 completion lengths, stop token included
  truncated: jax.Array  # [B] bool, True when max_new_tokens ran out before a stop token

  @property
  def loss_mask(self) -> jax.Array:
    """[B, N] bool: the model's own tokens (all of them, for single-turn rollouts)."""
    n = self.tokens.shape[1]
    return np.arange(n)[None, :] < np.asarray(self.lengths)[:, None]


@flax.struct.dataclass
class TrainBatch:
  """What the learner consumes (host → device).

  The sequence is the sampler's layout: the left-padded prompt [B, P] followed by the
  completion [B, N]. The model's prediction of completion token j comes from position
  P - 1 + j, so the LM head runs on N positions per row, never on the prompt.
  """

  prompt_tokens: jax.Array | np.ndarray  # [B, P] int32, left-padded
  prompt_lengths: jax.Array | np.ndarray  # [B] int32
  completion_tokens: jax.Array | np.ndarray  # [B, N] int32
  loss_mask: jax.Array | np.ndarray  # [B, N] bool: tokens the policy is trained on
  advantages: jax.Array | np.ndarray  # [B] or [B, N] float32
  old_logprobs: jax.Array | np.ndarray  # [B, N] float32 (sampler's log-probs)
  ref_logprobs: Optional[jax.Array | np.ndarray] = None  # [B, N] float32, frozen reference
  completion_lengths: Optional[jax.Array | np.ndarray] = None  # [B] int32

  @property
  def batch_size(self) -> int:
    return self.prompt_tokens.shape[0]
