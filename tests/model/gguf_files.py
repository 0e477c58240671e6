"""Tiny Llama / Qwen2 / Qwen3 GGUF files written the way llama.cpp's converter writes them.

Used by tests/model/test_gguf.py and bench/gguf_parity.py. The q/k row permutation and
the metadata keys are spelled out here from llama.cpp's `convert_hf_to_gguf.py`
(LlamaModel, Qwen2Model, Qwen3Model), independently of evotrainer/model/gguf.py; the
tensor names are the importer's (`gguf_name`), which transformers' own GGUF import, the
reference, checks. 1-D tensors (norms, biases) stay F32, as the converter keeps them;
every matrix is stored in the type under test.

The tokenizer metadata is a placeholder token list (`tokenizer.ggml.tokens`, which gives
transformers and our importer the vocabulary size): the tiny files are compared through
their weights and logits only; the real tokenizer is tested on the SmolLM2 file.
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import torch
import transformers

from evotrainer.model.gguf import gguf_name

# Every type of the importer that `gguf.quants.quantize` can also write.
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
VOCAB = 256


# architecture -> (config class, its own options): Qwen2 has q/k/v biases; Qwen3 has q/k
# norms and a head_dim that is not hidden / heads (the value transformers' GGUF import
# assumes, as it does not read `attention.key_length`).
_CONFIGS = {"llama": (transformers.LlamaConfig, {}),
            "qwen2": (transformers.Qwen2Config, {}),
            "qwen3": (transformers.Qwen3Config, {"head_dim": 128})}


def tiny_model(arch: str = "llama", tied: bool = False,
               seed: int = 0) -> transformers.PreTrainedModel:
  """2 layers, d=64, 4 heads / 2 KV heads, vocabulary 256; norms and biases moved off
  their init."""
  config_cls, extra = _CONFIGS[arch]
  config = config_cls(
      vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
      tie_word_embeddings=tied, initializer_range=0.1, attn_implementation="eager", **extra)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "bias" in name:
        p.add_(0.3 * torch.randn_like(p))
  return model.eval()


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """`LlamaModel.permute` of convert_hf_to_gguf.py (q: all heads, k: the KV heads)."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: str, model: transformers.PreTrainedModel, qtype: str, *,
               permute: bool = True, f64: str = "") -> None:
  """Writes `model` (Llama, Qwen2 or Qwen3) to `path` with every matrix in `qtype`.

  `permute=False` leaves out llama.cpp's Llama q/k permutation (a file a correct importer must
  misread); `f64` names one GGUF tensor stored as F64, a type the importer refuses.
  """
  c = model.config
  head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
  permute = permute and c.model_type == "llama"  # llama.cpp permutes Llama q/k only
  w = gguf.GGUFWriter(path, c.model_type)
  w.add_name("tiny-llama")
  w.add_block_count(c.num_hidden_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_rope_freq_base(c.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_rope_dimension_count(head_dim)
  w.add_key_length(head_dim)
  w.add_value_length(head_dim)
  w.add_tokenizer_model("gpt2")
  w.add_token_list([f"<t{i}>" for i in range(c.vocab_size)])
  kind = gguf.GGMLQuantizationType[qtype]
  for name, p in model.state_dict().items():
    if name == "lm_head.weight" and c.tie_word_embeddings:
      continue  # tied: the file has no output matrix
    data = p.detach().float().numpy()
    if permute and name.endswith("q_proj.weight"):
      data = llama_cpp_permute(data, c.num_attention_heads)
    elif permute and name.endswith("k_proj.weight"):
      data = llama_cpp_permute(data, c.num_key_value_heads)
    target = gguf_name(name)
    if data.ndim == 1 or target == f64:
      w.add_tensor(target, data.astype(np.float64) if target == f64 else data)
    else:
      w.add_tensor(target, gguf.quants.quantize(data, kind), raw_dtype=kind)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def transformers_gguf(path: str) -> transformers.PreTrainedModel:
  """transformers' own GGUF import of `path` (float32, eager attention): the reference."""
  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
      attn_implementation="eager", local_files_only=True).eval()
