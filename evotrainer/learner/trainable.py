"""Which parameters the learner trains: all of them, or the top K transformer blocks.

Training only the top K blocks (ULMFiT-style partial fine-tuning) with the embeddings
frozen is what makes RL on a pretrained model practical on a CPU: the gradient is taken
with respect to the trainable subset only, so the backward pass stops at block L - K
(no activation gradients below it, no `[V, E]` embedding gradient), and the optimizer
holds Adam moments for the subset only. bench/real_step.py measures the saving.

`split` and `merge` are pure: the learner keeps the *whole* parameter tree in its
`TrainState` (checkpoints and the sampler see every parameter), splits it into
(trainable, frozen) inside the jitted step, and merges the updated part back.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from flax import nnx

from evotrainer.model.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class TrainableSet:
  """The trainable parameters of a `Transformer` with `num_layers` blocks.

  Attributes:
    num_layers: the model's block count L.
    top_layers: train blocks L - K .. L - 1 (K = `top_layers`) and freeze the
      embeddings and every block below; None trains every parameter.
    head: with `top_layers`, also train the final norm and an untied LM head (a tied
      head is the embedding, which stays frozen).
  """

  num_layers: int
  top_layers: Optional[int] = None
  head: bool = True

  def __post_init__(self):
    k = self.top_layers
    if k is None:
      return
    if not 0 <= k <= self.num_layers:
      raise ValueError(f"Learner.trainable_layers must be in [0, {self.num_layers}] "
                       f"(the model's num_layers) or None, got {k}")
    if k == 0 and not self.head:
      raise ValueError("Learner.trainable_layers=0 with Learner.train_head=False leaves "
                       "no parameter to train")

  @classmethod
  def for_config(cls, config: ModelConfig, top_layers: Optional[int],
                 head: bool = True) -> "TrainableSet":
    return cls(num_layers=config.num_layers, top_layers=top_layers, head=head)

  @property
  def everything(self) -> bool:
    return self.top_layers is None

  def is_trainable(self, path: Tuple) -> bool:
    """Whether the parameter at an `nnx.State` path (e.g. `('layers', 3, 'mlp', 'up')`)
    is trained."""
    if self.everything:
      return True
    if path[0] == "layers":
      return int(path[1]) >= self.num_layers - self.top_layers
    if path[0] in ("final_norm", "lm_head"):
      return self.head
    return False  # the embedding (and with it a tied LM head)

  def split(self, params: nnx.State) -> Tuple[nnx.State, nnx.State]:
    """`params` -> (trainable, frozen) States of the same paths, disjoint."""
    return nnx.split_state(params, lambda path, _: self.is_trainable(path), ...)


def merge(trainable: nnx.State, frozen: nnx.State) -> nnx.State:
  """Inverse of `TrainableSet.split`."""
  return nnx.merge_state(trainable, frozen)
