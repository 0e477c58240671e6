"""Where the policy comes from: a local Hugging Face checkpoint, a GGUF file, or a tiny
model from gin.

gin:
  policy.hf_dir = '/path/to/Qwen3-0.6B'   # config.json + safetensors + tokenizer files
or
  policy.gguf = 'smollm2-135m-instruct'   # a packaged GGUF (gguf.PACKAGED) or a .gguf path
or (the CPU default, gin/model/tiny.gin):
  policy.config = @ModelConfig()           # with ModelConfig.* bindings
  make_tokenizer.vocab_size = 512          # sentencepiece trained on the task's text
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

import gin
from flax import nnx

from evotrainer.model import gguf as gguf_file
from evotrainer.model.config import ModelConfig
from evotrainer.model.hf import config_from_hf, load_hf_checkpoint
from evotrainer.model.transformer import Transformer
from evotrainer.sharding.mesh import create_model
from evotrainer.sharding.rules import LEARNER_RULES, Rules
from evotrainer.tokenizers import HFTokenizer, Tokenizer, make_tokenizer


@gin.configurable(module="model", denylist=["texts", "mesh", "rules"])
def policy(texts: Optional[Iterable[str]] = None, mesh=None, rules: Rules = LEARNER_RULES, *,
           hf_dir: Optional[str] = None, gguf: Optional[str] = None,
           config: Optional[ModelConfig] = None,
           seed: int = 0, param_dtype: Optional[str] = None, dtype: Optional[str] = None,
           remat: Optional[bool] = None,
           attention_impl: Optional[str] = None,
           scan_layers: Optional[bool] = None) -> tuple[Transformer, Tokenizer]:
  """Builds (model, tokenizer), parameters placed on `mesh` by `rules`.

  Args:
    texts: task text for training a sentencepiece tokenizer (ignored with `hf_dir`).
    mesh, rules: where the parameters go.
    hf_dir: a local Hugging Face checkpoint directory; weights and tokenizer come from it.
    gguf: a GGUF model, packaged (a key of `gguf.PACKAGED`, e.g.
      'smollm2-135m-instruct') or a path; weights, tokenizer and chat template come
      from the file.
    config: the ModelConfig of a model trained from scratch (random initialization);
      with `hf_dir` or `gguf`, the architecture the checkpoint must have
      (gin/model/<name>.gin): the checkpoint's config is checked against it before any
      weight is read.
    seed: initialization seed for a model built from `config`.
    param_dtype, dtype, remat, attention_impl, scan_layers: overrides for a
      checkpoint's ModelConfig.
  """
  overrides = {k: v for k, v in dict(param_dtype=param_dtype, dtype=dtype, remat=remat,
                                     attention_impl=attention_impl,
                                     scan_layers=scan_layers).items() if v is not None}
  if hf_dir and gguf:
    from evotrainer.config import ConfigError
    raise ConfigError(f"policy.hf_dir = {hf_dir!r} and policy.gguf = {gguf!r} both name "
                      "the model: set one of them")
  if gguf:
    path = gguf_file.resolve(gguf)
    if config is not None:
      check_matches(config, gguf_file.config_from_gguf(path), path)
    tokenizer = gguf_file.gguf_tokenizer(path)
    model = gguf_file.load_gguf(path, mesh=mesh, rules=rules, **overrides)
    logging.info("loaded %s (%d parameters)", path, model.config.num_params())
  elif hf_dir:
    if config is not None:
      check_matches(config, config_from_hf(hf_dir), f"{hf_dir}/config.json")
    tokenizer = HFTokenizer.from_dir(hf_dir)
    model = load_hf_checkpoint(hf_dir, mesh=mesh, rules=rules, **overrides)
    logging.info("loaded %s (%d parameters)", hf_dir, model.config.num_params())
  else:
    if config is None:
      raise ValueError("no model: set policy.hf_dir (a local HF checkpoint), policy.gguf "
                       "(a GGUF model) or "
                       "policy.config = @ModelConfig() (see gin/model/tiny.gin)")
    if texts is None:
      raise ValueError("a model trained from scratch needs task text for its tokenizer")
    tokenizer = make_tokenizer(texts=texts)
    model = (create_model(config, mesh, rules, seed) if mesh is not None
             else Transformer(config, rngs=nnx.Rngs(seed)))
  if tokenizer.vocab_size > model.config.vocab_size:
    raise ValueError(
        f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
        f"{model.config.vocab_size}: raise ModelConfig.vocab_size or lower "
        f"make_tokenizer.vocab_size")
  return model, tokenizer


# What a checkpoint may differ in from the gin config: precision, remat, the attention
# kernel and layer scanning are choices of the run (policy.param_dtype / dtype / remat /
# attention_impl / scan_layers), not of the weights.
_RUN_CHOICES = ("param_dtype", "dtype", "remat", "attention_impl", "scan_layers")


def check_matches(expected: ModelConfig, found: ModelConfig, where: str) -> None:
  """Raises ConfigError naming every field where the checkpoint's config differs from
  the one gin describes (e.g. `policy.hf_dir` points at another model)."""
  from evotrainer.config import ConfigError
  diff = [f"{k}: gin {getattr(expected, k)!r}, checkpoint {getattr(found, k)!r}"
          for k in expected.__dataclass_fields__
          if k not in _RUN_CHOICES and getattr(expected, k) != getattr(found, k)]
  if diff:
    raise ConfigError(f"{where} is not the model policy.config describes ("
                      + "; ".join(diff) + "): point policy.hf_dir at the checkpoint of "
                      "that model, or use its own gin/model/*.gin (or gin/model/hf.gin)")
