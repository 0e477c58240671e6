"""Records that cross stage boundaries (docs/design.md#records).

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
class SamplerOutput:
  """What one sampler call returns (device → host): sampled ids, not yet decoded or
  scored (a rollout engine turns them into a `rollouts.Generation`)."""

  tokens: jax.Array  # [B, N] int32 completion ids, pad after the end
  logprobs: jax.Array  # [B, N] float32 log-prob of each sampled token, 0 after the end
  lengths: jax.Array  # [B] int32 completion lengths, stop token included
  truncated: jax.Array  # [B] bool, True when max_new_tokens ran out before a stop token

  @property
  def loss_mask(self) -> jax.Array:
    """[B, N] bool: the sampled tokens, up to each row's length."""
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


@dataclasses.dataclass
class Episode:
  """One scored completion (host side): what the harness, diagnostics and store see.

  Rows of one GRPO group share `group_id` and sit next to each other in a batch.
  """

  episode_id: str  # unique in a run: f"{version}/{step}/{row}"
  group_id: int  # rows with the same prompt in one step
  task_id: str  # the problem's id
  prompt: str
  completion: str  # decoded completion (stop token removed)
  answer: str  # gold answer
  reward_parts: dict  # {name: float}: the task's parts (correct, format, ...) + harness parts
  reward: float = 0.0  # composed reward (set by the harness)
  parsed_answer: Optional[str] = None  # what was extracted from the completion
  info: dict = dataclasses.field(default_factory=dict)  # stop reason, tool calls, errors, ...
  version: str = ""  # lineage version that produced it
  step: int = 0  # training step (or -1 for evaluation)
  split: str = "train"  # 'train' or 'heldout'
  completion_ids: Optional[np.ndarray] = None  # [N_i] int32 completion tokens (stop included)
  logprobs: Optional[np.ndarray] = None  # [N_i] float32 sampler log-probs
  truncated: bool = False  # hit max_new_tokens before a stop token (multi-turn: a budget stop)

  @property
  def length(self) -> int:
    """Completion length in tokens (stop token included)."""
    return 0 if self.completion_ids is None else int(len(self.completion_ids))


LAYERS = ("score", "signal", "behaviour", "model", "efficiency", "integrity")


@dataclasses.dataclass(frozen=True)
class Finding:
  """A diagnostic's verdict on one metric: what was seen, how bad, and the evidence."""

  kind: str  # the diagnostic's name, e.g. 'dead_group_ratio'
  layer: str  # one of LAYERS
  severity: float  # 0 (informational) .. 1 (blocking)
  value: float  # the metric
  threshold: float  # the threshold it was compared with
  message: str  # one line a person can act on
  evidence: tuple = ()  # ((episode_id, short snippet), ...)

  def __post_init__(self):
    if self.layer not in LAYERS:
      raise ValueError(f"Finding.layer={self.layer!r}; expected one of {LAYERS}")
