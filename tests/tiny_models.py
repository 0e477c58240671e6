"""The tests' small model configurations, in one place.

Two presets, both GQA (4 query heads over 2 KV heads) and small enough for the CPU:
`tiny_config` (hidden 32, head dim 8) and `small_config` (hidden 64, head dim 16, every
sharded axis divides a (2, 2, 2) mesh). A test that needs another size passes it as an
override, so that its exact shape stays visible where it is used.
"""

from __future__ import annotations

from evotrainer.model.config import ModelConfig

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=8)
SMALL = {**TINY, "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
         "head_dim": 16}


def tiny_config(**overrides) -> ModelConfig:
  """`TINY` (2 layers, hidden 32, vocabulary 64) with `overrides` (ModelConfig fields)."""
  return ModelConfig(**{**TINY, **overrides})


def small_config(**overrides) -> ModelConfig:
  """`SMALL` (2 layers, hidden 64, vocabulary 128) with `overrides` (ModelConfig fields)."""
  return ModelConfig(**{**SMALL, **overrides})
