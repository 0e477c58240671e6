"""The policy model: ModelConfig, the NNX decoder, Hugging Face import/export."""

from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.model.transformer import KVCache, Transformer, attention_mask, init_cache
