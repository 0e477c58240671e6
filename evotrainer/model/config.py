"""`ModelConfig`: the frozen description of a decoder of the Llama / Qwen2 / Qwen3 family."""

from __future__ import annotations

import dataclasses
from typing import Optional

import gin
import jax.numpy as jnp

ARCHITECTURES = ("llama", "qwen2", "qwen3")
# 'dense': the masked einsum in `Attention.__call__`; 'xla' / 'cudnn': the `implementation`
# argument of `jax.nn.dot_product_attention` (cuDNN fused attention on NVIDIA GPUs).
ATTENTION_IMPLS = ("dense", "xla", "cudnn")
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 style frequency-dependent RoPE scaling (`rope_type: llama3` in HF configs)."""

  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of one decoder; everything needed to build, import and export it.

  `architecture` decides only the Hugging Face class used on export and what the
  defaults mean; the layer options (`qkv_bias`, `qk_norm`, `tie_embeddings`) are
  independent so that any of the three families is one config.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  architecture: str = "llama"
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: Optional[RopeScaling] = None
  max_position_embeddings: int = 4096
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: bool = False
  attention_impl: str = "dense"  # ATTENTION_IMPLS; a run choice, not part of the weights
  # Cache-free forwards (learner, forward_logits) run the layers as one lax.scan: compile
  # time flat in depth. Calls with a KV cache (the sampler) stay unrolled.
  scan_layers: bool = False

  def __post_init__(self):
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
          f"ModelConfig.architecture={self.architecture!r}; expected one of {ARCHITECTURES}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
          f"num_kv_heads={self.num_kv_heads} (grouped-query attention needs it)")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl={self.attention_impl!r}; expected one of "
                       f"{ATTENTION_IMPLS}")
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(
            f"ModelConfig.{name}={getattr(self, name)!r}; expected one of {tuple(_DTYPES)}")

  @property
  def jnp_param_dtype(self):
    return _DTYPES[self.param_dtype]

  @property
  def jnp_dtype(self):
    return _DTYPES[self.dtype]

  def num_params(self) -> int:
    """Parameter count (embeddings included)."""
    e, m, d = self.hidden_size, self.intermediate_size, self.head_dim
    attn = e * d * (2 * self.num_heads + 2 * self.num_kv_heads)
    if self.qkv_bias:
      attn += d * (self.num_heads + 2 * self.num_kv_heads)
    if self.qk_norm:
      attn += 2 * d
    layer = attn + 3 * e * m + 2 * e
    head = 0 if self.tie_embeddings else e * self.vocab_size
    return self.vocab_size * e + self.num_layers * layer + e + head

  def flops_per_token(self, context: int) -> float:
    """Forward FLOPs per token: 2 x matmul params (no embedding lookup) + attention over `context`."""
    e, m, d = self.hidden_size, self.intermediate_size, self.head_dim
    proj = e * d * (2 * self.num_heads + 2 * self.num_kv_heads) + 3 * e * m
    attn = 2 * self.num_heads * d * context
    return 2.0 * (self.num_layers * (proj + attn) + e * self.vocab_size)


# gin: `ModelConfig.hidden_size = 256` etc. (gin/model/*.gin); a local Hugging Face
# checkpoint is named with `model_source.hf_dir` (evotrainer/model/hf.py).
gin.external_configurable(ModelConfig, module="model")
gin.external_configurable(RopeScaling, module="model")
