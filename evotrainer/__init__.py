"""EvoTrainer: co-evolve an LLM policy and its training harness, in JAX."""

__version__ = "0.1.0"
