"""Hugging Face import / export for the Llama / Qwen2 / Qwen3 decoder.

A local Hugging Face directory (`config.json` + `model.safetensors`, or
`model.safetensors.index.json` + shards) becomes a `Transformer` whose parameters are
placed straight onto the mesh: the model is built abstractly (`nnx.eval_shape`), each
parameter's `NamedSharding` comes from the sharding rules, and each tensor is read on
the host once and handed to `jax.make_array_from_callback`, so a device only receives
its own shard and the host holds one tensor at a time. Export goes the other way, one
parameter at a time, into a file that `transformers.AutoModelForCausalLM` loads.

One table (`_tensor_table`) names every parameter on both sides and the layout change
between them, so import and export cannot disagree; the GGUF import (gguf.py) reads
through the same table and `place_parameters`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors can read BF16)
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open

from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.model.transformer import Transformer
from evotrainer.sharding.mesh import state_shardings
from evotrainer.sharding.multihost import is_primary, to_host
from evotrainer.sharding.rules import LEARNER_RULES, Rules

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM"}
# Defaults of the transformers config classes for keys a config.json may leave out.
_HF_DEFAULT_MAX_POSITIONS = {"llama": 2048, "qwen2": 32768, "qwen3": 32768}
_HF_DEFAULT_ROPE_THETA = 10000.0
_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16",
                       np.dtype(np.float16): "F16"}

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


# --------------------------------------------------------------------------- config


def _read_hf_config(source: Union[str, os.PathLike, Mapping[str, Any]]) -> Tuple[dict, str]:
  """The config dict and a name for it in error messages."""
  if isinstance(source, Mapping):
    return dict(source), "config dict"
  path = os.fspath(source)
  if os.path.isdir(path):
    path = os.path.join(path, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no Hugging Face config.json there")
  with open(path) as f:
    return json.load(f), path


def _rope_settings(hf: dict, where: str) -> Tuple[float, Optional[RopeScaling]]:
  """(rope_theta, rope_scaling) from either config layout.

  transformers >= 5 keeps everything in `rope_parameters` (`rope_type`, `rope_theta`,
  scaling keys); older files have a top-level `rope_theta` and a `rope_scaling` dict
  (with `type` or `rope_type`). Like transformers, a `rope_scaling` dict wins and a
  missing theta falls back to the top-level value, then to 10000.
  """
  params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
  if params and all(isinstance(v, dict) for v in params.values()):
    raise ValueError(f"{where}: per-layer-type rope_parameters {sorted(params)} are not "
                     "supported (one RoPE setting for all layers is)")
  theta = float(params.get("rope_theta", hf.get("rope_theta", _HF_DEFAULT_ROPE_THETA)))
  partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
  if partial != 1.0:
    raise ValueError(f"{where}: partial_rotary_factor={partial} is not supported (only 1.0)")
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type == "default":
    return theta, None
  if rope_type == "llama3":
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
    if missing:
      raise ValueError(f"{where}: rope_type 'llama3' is missing {missing}")
    original = params.get("original_max_position_embeddings",
                          hf.get("original_max_position_embeddings",
                                 hf.get("max_position_embeddings")))
    return theta, RopeScaling(
        factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(original))
  raise ValueError(f"{where}: rope_type {rope_type!r} is not supported; supported: "
                   "'default', 'llama3'")


def config_from_hf(source: Union[str, os.PathLike, Mapping[str, Any]], *,
                   param_dtype: Optional[str] = None, dtype: Optional[str] = None,
                   remat: Optional[bool] = None,
                   attention_impl: Optional[str] = None,
                   scan_layers: Optional[bool] = None) -> ModelConfig:
  """The `ModelConfig` of a Hugging Face Llama / Qwen2 / Qwen3 config.

  Args:
    source: a checkpoint directory, a config.json path, or the parsed dict.
    param_dtype, dtype, remat, attention_impl, scan_layers: override the `ModelConfig`
      defaults (float32 parameters and compute, no remat, 'dense' attention, unrolled
      layers); the checkpoint's own dtype does not change them.

  Raises:
    ValueError: for an unsupported model_type or a feature our decoder lacks
      (MLP / output-projection biases, sliding-window attention, other RoPE types).
  """
  hf, where = _read_hf_config(source)
  arch = hf.get("model_type")
  if arch not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"{where}: model_type {arch!r} is not supported; supported: "
                     f"{SUPPORTED_MODEL_TYPES}")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
  if hf.get("mlp_bias"):
    raise ValueError(f"{where}: mlp_bias=true is not supported (our MLP has no biases)")
  if arch in ("llama", "qwen3") and hf.get("attention_bias"):
    # In the HF Llama / Qwen3 classes attention_bias also adds an o_proj bias, which
    # our attention does not have (Qwen2's q/k/v-only biases are supported).
    raise ValueError(f"{where}: attention_bias=true is not supported for {arch} "
                     "(it adds an o_proj bias, which this decoder does not have)")
  sliding = hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or ())
  if sliding:
    raise ValueError(f"{where}: sliding-window attention is not supported "
                     "(use_sliding_window / layer_types)")

  heads = int(hf["num_attention_heads"])
  head_dim = hf.get("head_dim")
  if head_dim is None:
    # The Qwen3 config class defaults head_dim to 128; the others derive it.
    head_dim = 128 if arch == "qwen3" else int(hf["hidden_size"]) // heads
  theta, scaling = _rope_settings(hf, where)
  overrides = {k: v for k, v in (("param_dtype", param_dtype), ("dtype", dtype),
                                 ("remat", remat), ("attention_impl", attention_impl),
                                 ("scan_layers", scan_layers)) if v is not None}
  return ModelConfig(
      vocab_size=int(hf["vocab_size"]),
      hidden_size=int(hf["hidden_size"]),
      intermediate_size=int(hf["intermediate_size"]),
      num_layers=int(hf["num_hidden_layers"]),
      num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=int(head_dim),
      architecture=arch,
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      rope_theta=theta,
      rope_scaling=scaling,
      max_position_embeddings=int(
          hf.get("max_position_embeddings", _HF_DEFAULT_MAX_POSITIONS[arch])),
      qkv_bias=arch == "qwen2",
      qk_norm=arch == "qwen3",
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      **overrides)


def config_to_hf(config: ModelConfig) -> dict:
  """The config.json dict (transformers 5 layout) for `config.architecture`'s HF class.

  Raises:
    ValueError: when the layer options cannot be expressed by that class (Llama has
      neither q/k/v biases nor q/k norms, Qwen2 always has the biases and no norms,
      Qwen3 always has the norms and no biases).
  """
  c = config
  wanted = {"llama": (False, False), "qwen2": (True, False), "qwen3": (False, True)}
  if (c.qkv_bias, c.qk_norm) != wanted[c.architecture]:
    bias, norm = wanted[c.architecture]
    raise ValueError(
        f"ModelConfig(architecture={c.architecture!r}) exports to {_HF_CLASSES[c.architecture]}, "
        f"which needs qkv_bias={bias}, qk_norm={norm}; got qkv_bias={c.qkv_bias}, "
        f"qk_norm={c.qk_norm}")
  rope = {"rope_type": "default", "rope_theta": c.rope_theta}
  if c.rope_scaling is not None:
    rope.update(rope_type="llama3", **dataclasses.asdict(c.rope_scaling))
  hf = {
      "architectures": [_HF_CLASSES[c.architecture]],
      "model_type": c.architecture,
      "vocab_size": c.vocab_size,
      "hidden_size": c.hidden_size,
      "intermediate_size": c.intermediate_size,
      "num_hidden_layers": c.num_layers,
      "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.num_kv_heads,
      "head_dim": c.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": c.max_position_embeddings,
      "rms_norm_eps": c.rms_norm_eps,
      "rope_parameters": rope,
      # Read by transformers < 5 (ignored when rope_parameters carries the theta).
      "rope_theta": c.rope_theta,
      "tie_word_embeddings": c.tie_embeddings,
      "attention_bias": c.qkv_bias if c.architecture == "qwen2" else False,
      "dtype": c.param_dtype,
  }
  if c.architecture == "llama":
    hf["mlp_bias"] = False
  else:
    hf["use_sliding_window"] = False
  return hf


# --------------------------------------------------------------------------- tensor table


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """One parameter on both sides: our state path, its HF name, and the layout change.

  `to_ours` returns a view (reshape / transpose), so reading never copies a tensor.
  """

  path: Tuple[Any, ...]  # e.g. ('layers', 0, 'attn', 'q')
  name: str  # e.g. 'model.layers.0.self_attn.q_proj.weight'
  hf_shape: Tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _same(path, name, shape) -> _Tensor:
  return _Tensor(path, name, tuple(shape), lambda w: w, lambda w: w)


def _linear(path, name, out_dim: int, in_dim: int) -> _Tensor:
  """torch Linear weight [out, in] <-> our kernel [in, out]."""
  return _Tensor(path, name, (out_dim, in_dim), lambda w: w.T, lambda w: w.T)


def _heads_in(path, name, heads: int, d: int, e: int) -> _Tensor:
  """q/k/v_proj weight [N*D, E] <-> our [E, N, D]."""
  return _Tensor(path, name, (heads * d, e),
                 lambda w: w.reshape(heads, d, e).transpose(2, 0, 1),
                 lambda w: w.transpose(1, 2, 0).reshape(heads * d, e))


def _heads_out(path, name, heads: int, d: int, e: int) -> _Tensor:
  """o_proj weight [E, H*D] <-> our [H, D, E]."""
  return _Tensor(path, name, (e, heads * d),
                 lambda w: w.T.reshape(heads, d, e),
                 lambda w: w.reshape(heads * d, e).T)


def _head_bias(path, name, heads: int, d: int) -> _Tensor:
  """q/k/v_proj bias [N*D] <-> our [N, D]."""
  return _Tensor(path, name, (heads * d,), lambda b: b.reshape(heads, d),
                 lambda b: b.reshape(heads * d))


def _tensor_table(c: ModelConfig) -> List[_Tensor]:
  """Every parameter of `Transformer(c)` with its Hugging Face counterpart."""
  e, m, d = c.hidden_size, c.intermediate_size, c.head_dim
  h, kv = c.num_heads, c.num_kv_heads
  table = [_same(("embed",), "model.embed_tokens.weight", (c.vocab_size, e))]
  for i in range(c.num_layers):
    ours, hf = ("layers", i), f"model.layers.{i}."
    attn, mlp = ours + ("attn",), ours + ("mlp",)
    table += [
        _same(ours + ("attn_norm", "scale"), hf + "input_layernorm.weight", (e,)),
        _heads_in(attn + ("q",), hf + "self_attn.q_proj.weight", h, d, e),
        _heads_in(attn + ("k",), hf + "self_attn.k_proj.weight", kv, d, e),
        _heads_in(attn + ("v",), hf + "self_attn.v_proj.weight", kv, d, e),
        _heads_out(attn + ("o",), hf + "self_attn.o_proj.weight", h, d, e),
        _same(ours + ("mlp_norm", "scale"), hf + "post_attention_layernorm.weight", (e,)),
        _linear(mlp + ("gate",), hf + "mlp.gate_proj.weight", m, e),
        _linear(mlp + ("up",), hf + "mlp.up_proj.weight", m, e),
        _linear(mlp + ("down",), hf + "mlp.down_proj.weight", e, m),
    ]
    if c.qkv_bias:
      table += [_head_bias(attn + (f"{p}_bias",), hf + f"self_attn.{p}_proj.bias", n, d)
                for p, n in (("q", h), ("k", kv), ("v", kv))]
    if c.qk_norm:
      table += [_same(attn + (f"{p}_norm", "scale"), hf + f"self_attn.{p}_norm.weight", (d,))
                for p in ("q", "k")]
  table.append(_same(("final_norm", "scale"), "model.norm.weight", (e,)))
  if not c.tie_embeddings:
    table.append(_linear(("lm_head",), "lm_head.weight", c.vocab_size, e))
  return table


def _state_by_path(state: nnx.State, table: List[_Tensor]) -> Dict[Tuple[Any, ...], Any]:
  """Flat {path: Variable}; checks that the table covers the model exactly."""
  flat = dict(nnx.to_flat_state(state))
  expected = {t.path for t in table}
  if set(flat) != expected:
    raise AssertionError(  # a programming error: the table and Transformer disagree
        f"HF tensor table out of sync with Transformer: model-only {set(flat) - expected}, "
        f"table-only {expected - set(flat)}")
  return flat


# --------------------------------------------------------------------------- import


class _CheckpointTensors:
  """Read access to the tensors of a checkpoint directory, one tensor at a time."""

  def __init__(self, directory: str, stack: contextlib.ExitStack):
    self._dir = directory
    self._stack = stack
    self._handles: Dict[str, Any] = {}
    index, single = os.path.join(directory, INDEX_FILE), os.path.join(directory, SINGLE_FILE)
    # The single file wins when both exist, as in transformers' `from_pretrained`.
    if os.path.exists(single):
      self.weight_map: Dict[str, str] = {k: SINGLE_FILE for k in self._open(SINGLE_FILE).keys()}
      self.source = single
    elif os.path.exists(index):
      with open(index) as f:
        self.weight_map = json.load(f)["weight_map"]
      self.source = index
    else:
      found = sorted(os.listdir(directory)) if os.path.isdir(directory) else "not a directory"
      raise FileNotFoundError(
          f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found (only safetensors "
          f"checkpoints are supported); contents: {found}")

  def _open(self, file: str):
    if file not in self._handles:
      self._handles[file] = self._stack.enter_context(
          safe_open(os.path.join(self._dir, file), framework="np"))
    return self._handles[file]

  def _handle(self, name: str, path) -> Any:
    if name not in self.weight_map:
      raise ValueError(f"tensor {name!r} (for our parameter {'.'.join(map(str, path))}) is "
                     f"missing from {self.source}")
    handle = self._open(self.weight_map[name])
    if name not in handle.keys():
      raise ValueError(f"tensor {name!r} is listed in {self.source} but missing from shard "
                     f"{os.path.join(self._dir, self.weight_map[name])}")
    return handle

  def read(self, t: _Tensor) -> np.ndarray:
    """The HF tensor `t.name` as numpy, after checking its shape against the config."""
    handle = self._handle(t.name, t.path)
    shape = tuple(handle.get_slice(t.name).get_shape())
    if shape != t.hf_shape:
      raise ValueError(f"tensor {t.name!r} in {os.path.join(self._dir, self.weight_map[t.name])}"
                       f" has shape {shape}, but config.json implies {t.hf_shape}")
    return handle.get_tensor(t.name)


def _place(host: np.ndarray, dtype, sharding) -> jax.Array:
  """One host tensor onto the devices: each device receives only its own shard."""
  if sharding is None:
    return jax.device_put(np.array(host, dtype=dtype))
  # np.array copies the shard, so the device buffer (zero-copy on the CPU backend) does
  # not keep the whole host tensor alive.
  return jax.make_array_from_callback(host.shape, sharding,
                                      lambda idx: np.array(host[idx], dtype=dtype))


def place_parameters(config: ModelConfig, read: Callable[[_Tensor], np.ndarray],
                     mesh: Optional[Mesh] = None, rules: Rules = LEARNER_RULES) -> Transformer:
  """A `Transformer(config)` whose parameters are read one at a time and placed on `mesh`.

  Args:
    config: the model's config; `_tensor_table(config)` lists what is read.
    read: returns the tensor `t.name` in the Hugging Face layout `t.hf_shape` (it checks
      the shape and raises, naming the tensor, when the file disagrees).
    mesh: when given, every parameter is created sharded by `rules`; otherwise each is
      a single-device array on the default device.
    rules: logical-to-mesh table (LEARNER_RULES or SAMPLER_RULES).
  """
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  table = _tensor_table(config)
  variables = _state_by_path(state, table)
  shardings = None if mesh is None else dict(
      nnx.to_flat_state(state_shardings(state, mesh, rules)))
  dtype = config.jnp_param_dtype
  placed = []
  for t in table:
    host = t.to_ours(read(t))
    array = _place(host, dtype, None if shardings is None else shardings[t.path])
    del host  # one tensor on the host at a time
    placed.append((t.path, variables[t.path].replace(value=array)))
  return nnx.merge(graphdef, nnx.from_flat_state(placed))


def load_hf_checkpoint(path: Union[str, os.PathLike], mesh: Optional[Mesh] = None,
                       rules: Rules = LEARNER_RULES, **config_overrides) -> Transformer:
  """Loads a local Hugging Face Llama / Qwen2 / Qwen3 checkpoint into a `Transformer`.

  Args:
    path: directory with config.json and model.safetensors (or an index + shards).
    mesh: when given, every parameter is created sharded by `rules`; otherwise each is
      a single-device array on the default device.
    rules: logical-to-mesh table (LEARNER_RULES or SAMPLER_RULES).
    **config_overrides: `param_dtype`, `dtype`, `remat`, `attention_impl`, `scan_layers`
      (see `config_from_hf`).

  Raises:
    FileNotFoundError: no config.json / safetensors in `path`.
    ValueError: unsupported config, a tensor the config implies that is missing from the
      checkpoint, or one whose shape disagrees with config.json (the message names it).
  """
  path = os.fspath(path)
  config = config_from_hf(path, **config_overrides)
  with contextlib.ExitStack() as stack:
    files = _CheckpointTensors(path, stack)
    model = place_parameters(config, files.read, mesh, rules)
    used = {t.name for t in _tensor_table(config)}
    extra = sorted(n for n in files.weight_map if n not in used)
    if extra:
      logging.warning("%s: ignoring %d tensors the model does not use: %s", files.source,
                      len(extra), extra[:8])
  return model


# --------------------------------------------------------------------------- export


def _safetensors_header(entries: List[Tuple[str, np.dtype, Tuple[int, ...]]]) -> bytes:
  """Length-prefixed JSON header of a safetensors file whose tensors follow in order."""
  header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, dtype, shape in entries:
    if dtype not in _SAFETENSORS_DTYPES:
      raise ValueError(f"cannot export {name!r}: dtype {dtype} has no safetensors code")
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                    "data_offsets": [offset, offset + size]}
    offset += size
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # the format pads the header to 8-byte alignment
  return len(raw).to_bytes(8, "little") + raw


def save_hf_checkpoint(model: Transformer, path: Union[str, os.PathLike]) -> None:
  """Writes `model` as a Hugging Face checkpoint (config.json + model.safetensors).

  Parameters are gathered to the host one at a time and streamed into the file, so the
  host never holds the whole model. On a multi-host run every process must call this
  (the gathers are collective); only process 0 writes.
  """
  path = os.fspath(path)
  config = model.config
  hf_config = config_to_hf(config)
  table = _tensor_table(config)
  variables = _state_by_path(nnx.state(model, nnx.Param), table)
  entries = [(t.name, np.dtype(variables[t.path].get_value().dtype), t.hf_shape)
             for t in table]
  writer = is_primary()
  if writer:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
      json.dump(hf_config, f, indent=2, sort_keys=True)
  with open(os.path.join(path, SINGLE_FILE), "wb") if writer else contextlib.nullcontext() as f:
    if writer:
      f.write(_safetensors_header(entries))
    for t in table:
      host = np.ascontiguousarray(t.to_hf(to_host(variables[t.path].get_value())))
      if writer:
        f.write(host.tobytes())
      del host
  logging.info("wrote %s checkpoint (%d tensors) to %s", _HF_CLASSES[config.architecture],
               len(table), path)
