"""Hugging Face import / export against the transformers (torch) implementation.

Tiny random Llama / Qwen2 / Qwen3 models are built from configs (no download) with
every norm weight and bias moved away from its init, so a parameter that is not mapped
(or mapped to the wrong place) changes the logits.
"""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from evotrainer.model import hf
from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.model.transformer import Transformer
from evotrainer.sharding.mesh import make_mesh
from evotrainer.sharding.rules import LEARNER_RULES, use_rules

TOL = 1e-4
T = 32
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# name -> (HF config class, kwargs). Together: RoPE theta 5e5 / 12345 / 1e6, Llama 3
# scaling that matters at T=32 (original context 16), tied and untied heads, GQA, and a
# Qwen3 head_dim that is not hidden / heads.
CASES = {
    "llama_llama3_rope": (transformers.LlamaConfig,
                          dict(rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False)),
    "llama_tied": (transformers.LlamaConfig,
                   dict(rope_parameters={"rope_type": "default", "rope_theta": 12345.0},
                        tie_word_embeddings=True, num_hidden_layers=3)),
    "qwen2": (transformers.Qwen2Config,
              dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                   tie_word_embeddings=False)),
    "qwen3_tied": (transformers.Qwen3Config,
                   dict(rope_parameters={"rope_type": "default", "rope_theta": 12345.0},
                        tie_word_embeddings=True, head_dim=32)),
}


def _tiny_hf_model(name: str, seed: int = 0):
  config_cls, kwargs = CASES[name]
  base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5, initializer_range=0.1, attn_implementation="eager")
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config_cls(**{**base, **kwargs}))
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if "norm" in pname or "bias" in pname:
        p.add_(0.3 * torch.randn_like(p))
  return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  """name -> (torch model, directory it was saved to)."""
  out = {}
  for name in CASES:
    model = _tiny_hf_model(name)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    out[name] = (model, str(path))
  return out


def _batch():
  """tokens [2, T]; row 1 is left-padded by 5."""
  tokens = np.random.RandomState(0).randint(0, 256, (2, T))
  valid = np.ones((2, T), bool)
  valid[1, :5] = False
  return tokens, valid


def _hf_logits(model, tokens, valid) -> np.ndarray:
  positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(valid.astype(np.int64)),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


def _our_logits(model, tokens, valid) -> np.ndarray:
  return np.asarray(model.forward_logits(jnp.asarray(tokens), jnp.asarray(valid)))


def _max_err(a, b, valid) -> float:
  return float(np.abs(a - b)[valid].max())


@pytest.mark.parametrize("name", list(CASES))
def test_import_matches_transformers(checkpoints, name):
  torch_model, path = checkpoints[name]
  model = hf.load_hf_checkpoint(path)
  tokens, valid = _batch()
  ref = _hf_logits(torch_model, tokens, valid)
  got = _our_logits(model, tokens, valid)
  assert np.abs(ref).max() > 1.0  # logits large enough for TOL to mean something
  err = _max_err(ref, got, valid)
  print(f"{name}: import max |logits - HF| = {err:.2e}")
  assert err <= TOL


def test_import_reads_config(checkpoints):
  c = hf.load_hf_checkpoint(checkpoints["llama_llama3_rope"][1]).config
  assert (c.architecture, c.rope_theta, c.tie_embeddings, c.rms_norm_eps) == (
      "llama", 5e5, False, 1e-5)
  assert c.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 16)
  q3 = hf.load_hf_checkpoint(checkpoints["qwen3_tied"][1]).config
  assert (q3.qk_norm, q3.qkv_bias, q3.head_dim, q3.tie_embeddings) == (True, False, 32, True)
  assert hf.load_hf_checkpoint(checkpoints["qwen2"][1]).config.qkv_bias


def _perturbed_model(config: ModelConfig, seed: int) -> Transformer:
  """A random model with norms != 1 and biases != 0 (our init leaves them at 1 / 0)."""
  model = Transformer(config, rngs=nnx.Rngs(seed))
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten_with_path(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  new = []
  for (path, leaf), key in zip(leaves, keys):
    noise = jax.random.normal(key, leaf.shape, leaf.dtype)
    is_norm = "scale" in jax.tree_util.keystr(path)
    new.append(1.0 + 0.3 * noise if is_norm else 0.1 * noise)
  nnx.update(model, jax.tree.unflatten(treedef, new))
  return model


EXPORT_CONFIGS = {
    "llama": ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16, architecture="llama",
                         rope_theta=5e5, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16)),
    "qwen2": ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=16, architecture="qwen2",
                         rope_theta=1e6, qkv_bias=True, tie_embeddings=True),
    "qwen3": ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=32, architecture="qwen3",
                         rope_theta=12345.0, qk_norm=True, rms_norm_eps=1e-5),
}


@pytest.mark.parametrize("arch", list(EXPORT_CONFIGS))
@pytest.mark.slow
def test_export_loads_in_transformers(tmp_path, arch):
  config = EXPORT_CONFIGS[arch]
  model = _perturbed_model(config, seed=1)
  hf.save_hf_checkpoint(model, tmp_path)

  torch_model, info = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, output_loading_info=True, attn_implementation="eager")
  assert type(torch_model).__name__ == hf._HF_CLASSES[arch]
  assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
  tokens, valid = _batch()
  ours = _our_logits(model, tokens, valid)
  ref = _hf_logits(torch_model.eval(), tokens, valid)
  assert np.abs(ref).max() > 1.0
  err = _max_err(ref, ours, valid)
  print(f"{arch}: export max |logits - HF| = {err:.2e}")
  assert err <= TOL

  # And back: the same config and bit-identical parameters.
  back = hf.load_hf_checkpoint(tmp_path)
  assert back.config == config
  jax.tree.map(np.testing.assert_array_equal, nnx.state(back, nnx.Param),
               nnx.state(model, nnx.Param))


def test_export_bf16(tmp_path):
  config = dataclasses.replace(EXPORT_CONFIGS["qwen3"], param_dtype="bfloat16")
  model = _perturbed_model(config, seed=2)
  hf.save_hf_checkpoint(model, tmp_path)
  torch_model, info = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, output_loading_info=True)
  assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
  assert torch_model.dtype == torch.bfloat16
  np.testing.assert_array_equal(  # [E, KV, D] -> [KV*D, E]
      torch_model.model.layers[1].self_attn.k_proj.weight.detach().float().numpy(),
      np.asarray(model.layers[1].attn.k[...]).astype(np.float32).transpose(1, 2, 0)
      .reshape(64, 64))
  back = hf.load_hf_checkpoint(tmp_path, param_dtype="bfloat16")
  jax.tree.map(np.testing.assert_array_equal, nnx.state(back, nnx.Param),
               nnx.state(model, nnx.Param))


def test_export_rejects_config_the_hf_class_cannot_express(tmp_path):
  config = dataclasses.replace(EXPORT_CONFIGS["llama"], qk_norm=True)
  with pytest.raises(ValueError, match="LlamaForCausalLM.*qk_norm=False"):
    hf.save_hf_checkpoint(Transformer(config, rngs=nnx.Rngs(0)), tmp_path)


def test_sharded_index_checkpoint(checkpoints, tmp_path):
  torch_model, single = checkpoints["llama_llama3_rope"]
  torch_model.save_pretrained(tmp_path, max_shard_size="40KB")
  assert not os.path.exists(tmp_path / "model.safetensors")
  with open(tmp_path / "model.safetensors.index.json") as f:
    assert len(set(json.load(f)["weight_map"].values())) > 1
  tokens, valid = _batch()
  sharded = _our_logits(hf.load_hf_checkpoint(tmp_path), tokens, valid)
  np.testing.assert_array_equal(sharded, _our_logits(hf.load_hf_checkpoint(single), tokens, valid))


def test_load_onto_mesh(checkpoints, devices):
  _, path = checkpoints["llama_llama3_rope"]
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  model = hf.load_hf_checkpoint(path, mesh=mesh, rules=LEARNER_RULES)
  gate = model.layers[0].mlp.gate[...]  # [E=64, M=128], ('embed', 'mlp')
  assert gate.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert {s.data.shape for s in gate.addressable_shards} == {(32, 64)}
  q = model.layers[1].attn.q[...]  # [E, H, D], ('embed', 'heads', 'head_dim')
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  assert model.embed[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")

  plain = hf.load_hf_checkpoint(path)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               nnx.state(model, nnx.Param), nnx.state(plain, nnx.Param))
  tokens, valid = _batch()
  with jax.set_mesh(mesh), use_rules(LEARNER_RULES):
    sharded = nnx.jit(lambda m, t, v: m.forward_logits(t, v))(
        model, jnp.asarray(tokens), jnp.asarray(valid))
  np.testing.assert_allclose(np.asarray(sharded), _our_logits(plain, tokens, valid),
                             atol=1e-5, rtol=0)


def test_bf16_checkpoint(tmp_path):
  torch_model = _tiny_hf_model("qwen2").to(torch.bfloat16)
  torch_model.save_pretrained(tmp_path)
  want = {n: p.detach().float().numpy() for n, p in torch_model.named_parameters()}

  model = hf.load_hf_checkpoint(tmp_path)  # float32 parameters by default
  q = model.layers[0].attn.q[...]
  assert q.dtype == jnp.float32
  np.testing.assert_array_equal(  # exact: bf16 -> f32 is lossless
      np.asarray(q), want["model.layers.0.self_attn.q_proj.weight"].reshape(4, 16, 64)
      .transpose(2, 0, 1))
  np.testing.assert_array_equal(np.asarray(model.layers[1].attn.k_bias[...]),
                                want["model.layers.1.self_attn.k_proj.bias"].reshape(2, 16))

  bf = hf.load_hf_checkpoint(tmp_path, param_dtype="bfloat16")
  assert bf.config.param_dtype == "bfloat16"
  assert bf.layers[0].mlp.down[...].dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      np.asarray(bf.layers[0].mlp.down[...]).astype(np.float32),
      want["model.layers.0.mlp.down_proj.weight"].T)


# ----------------------------------------------------------------------------- errors


def _rewrite(src: str, dst, edit) -> None:
  """Copies checkpoint `src` to `dst` with `edit(tensors)` applied to model.safetensors."""
  shutil.copy(os.path.join(src, "config.json"), dst / "config.json")
  tensors = load_file(os.path.join(src, "model.safetensors"))
  edit(tensors)
  save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_is_named(checkpoints, tmp_path):
  name = "model.layers.1.mlp.up_proj.weight"
  _rewrite(checkpoints["llama_llama3_rope"][1], tmp_path, lambda t: t.pop(name))
  with pytest.raises(ValueError, match=rf"{name}.*missing from .*model\.safetensors"):
    hf.load_hf_checkpoint(tmp_path)


def test_missing_tensor_in_index_is_named(checkpoints, tmp_path):
  torch_model, _ = checkpoints["qwen3_tied"]
  torch_model.save_pretrained(tmp_path, max_shard_size="40KB")
  index_file = tmp_path / "model.safetensors.index.json"
  index = json.loads(index_file.read_text())
  name = "model.layers.0.self_attn.k_norm.weight"
  del index["weight_map"][name]
  index_file.write_text(json.dumps(index))
  with pytest.raises(ValueError, match=rf"{name}.*missing from .*index\.json"):
    hf.load_hf_checkpoint(tmp_path)


def test_shape_mismatch_is_named(checkpoints, tmp_path):
  name = "model.layers.0.self_attn.k_proj.weight"  # [KV*D, E] = [32, 64]

  def shrink(tensors):
    tensors[name] = tensors[name][:16]
  _rewrite(checkpoints["llama_llama3_rope"][1], tmp_path, shrink)
  with pytest.raises(ValueError, match=rf"{name}.*\(16, 64\).*\(32, 64\)"):
    hf.load_hf_checkpoint(tmp_path)


def test_extra_tensors_are_ignored(checkpoints, tmp_path, caplog):
  _, src = checkpoints["llama_tied"]

  def add(tensors):
    tensors["model.rotary_emb.inv_freq"] = np.ones(8, np.float32)
  _rewrite(src, tmp_path, add)
  with caplog.at_level("INFO"):
    model = hf.load_hf_checkpoint(tmp_path)
  assert "model.rotary_emb.inv_freq" in caplog.text
  tokens, valid = _batch()
  np.testing.assert_array_equal(_our_logits(model, tokens, valid),
                                _our_logits(hf.load_hf_checkpoint(src), tokens, valid))


def test_no_safetensors(tmp_path, checkpoints):
  shutil.copy(os.path.join(checkpoints["qwen2"][1], "config.json"), tmp_path / "config.json")
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf.load_hf_checkpoint(tmp_path)


# ----------------------------------------------------------------------------- config

_LLAMA = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def test_config_both_rope_layouts():
  new = hf.config_from_hf({**_LLAMA, "rope_parameters": LLAMA3_ROPE})
  old = hf.config_from_hf({**_LLAMA, "rope_theta": 5e5, "rope_scaling": {
      "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16}})
  assert new == old
  assert (new.rope_theta, new.rope_scaling) == (5e5, RopeScaling(8.0, 1.0, 4.0, 16))
  assert new.head_dim == 16  # absent: hidden / heads
  plain = hf.config_from_hf({**_LLAMA, "rope_theta": 12345.0, "rope_scaling": None})
  assert (plain.rope_theta, plain.rope_scaling) == (12345.0, None)
  assert hf.config_from_hf(_LLAMA).rope_theta == 10000.0


def test_config_families_and_overrides():
  q2 = hf.config_from_hf({**_LLAMA, "model_type": "qwen2", "use_sliding_window": False,
                          "sliding_window": 4096})
  assert (q2.architecture, q2.qkv_bias, q2.qk_norm) == ("qwen2", True, False)
  q3 = hf.config_from_hf({**_LLAMA, "model_type": "qwen3", "head_dim": 8,
                          "tie_word_embeddings": True},
                         param_dtype="bfloat16", dtype="bfloat16", remat=True,
                         attention_impl="cudnn", scan_layers=True)
  assert (q3.qk_norm, q3.qkv_bias, q3.head_dim, q3.tie_embeddings) == (True, False, 8, True)
  assert (q3.param_dtype, q3.dtype, q3.remat, q3.attention_impl, q3.scan_layers) == (
      "bfloat16", "bfloat16", True, "cudnn", True)


@pytest.mark.parametrize("config", list(EXPORT_CONFIGS.values()), ids=list(EXPORT_CONFIGS))
def test_config_round_trip(config):
  assert hf.config_from_hf(hf.config_to_hf(config)) == config


@pytest.mark.parametrize("extra, match", [
    ({"model_type": "mistral"}, r"'mistral'.*supported.*'llama', 'qwen2', 'qwen3'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"attention_bias": True}, "attention_bias.*o_proj"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "sliding-window"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_config_unsupported(extra, match):
  with pytest.raises(ValueError, match=match):
    hf.config_from_hf({**_LLAMA, **extra})
