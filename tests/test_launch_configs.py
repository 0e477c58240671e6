"""Every gin file the launch scripts name exists and parses; the real-size model files
describe the published checkpoints exactly as our importer reads their config.json."""

import pathlib
import re

import gin
import pytest

from evotrainer import config, registry
from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.model.hf import config_from_hf
from evotrainer.model.source import check_matches

REPO = pathlib.Path(__file__).resolve().parents[1]
GIN_PATH = re.compile(r"gin/[A-Za-z0-9_.\-/]+\.gin")


def _named_in_launch() -> list:
  names = set()
  for f in [*REPO.glob("launch/*.sh"), REPO / "launch" / "README.md"]:
    names.update(GIN_PATH.findall(f.read_text()))
  return sorted(names)


LAUNCH_GIN = _named_in_launch()
MODEL_GIN = sorted(str(p.relative_to(REPO)) for p in REPO.glob("gin/model/*.gin"))
# The domain files that run a real-size model (the docs' commands name them).
PRETRAINED_GIN = ["gin/code_smol_train.gin", "gin/code_smol.gin"]

# The published config.json of each checkpoint (the fields our importer reads).
PUBLISHED = {
    "gin/model/qwen3-0.6b.gin": (0.60, {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
        "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "rope_scaling": None, "max_position_embeddings": 40960,
        "attention_bias": False, "tie_word_embeddings": True, "hidden_act": "silu"}),
    "gin/model/qwen2.5-0.5b.gin": (0.49, {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768, "use_sliding_window": False,
        "tie_word_embeddings": True, "hidden_act": "silu"}),
    "gin/model/llama-3.2-1b.gin": (1.24, {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": 131072, "mlp_bias": False,
        "attention_bias": False, "tie_word_embeddings": True, "hidden_act": "silu",
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192,
                         "rope_type": "llama3"}}),
}


def _gin_model_config() -> ModelConfig:
  """The ModelConfig the parsed gin binds (`policy.config = @ModelConfig()`)."""
  kw = dict(gin.get_bindings("model.ModelConfig"))
  if "rope_scaling" in kw:
    kw["rope_scaling"] = RopeScaling(**gin.get_bindings("model.RopeScaling"))
  return ModelConfig(**kw)


def test_the_launch_scripts_name_gin_files():
  # The scan itself works: the scripts' defaults and examples are found.
  assert "gin/mesh/fsdp.gin" in LAUNCH_GIN and "gin/model/qwen3-0.6b.gin" in LAUNCH_GIN


@pytest.mark.parametrize("path", sorted(set(LAUNCH_GIN) | set(MODEL_GIN) | set(PRETRAINED_GIN)))
def test_named_gin_file_exists_and_parses(path):
  assert (REPO / path).is_file(), f"{path} is named in launch/ but does not exist"
  registry.parse([path], finalize=False)


@pytest.mark.parametrize("path", sorted(PUBLISHED))
def test_real_size_model_matches_published_config(path):
  billions, published = PUBLISHED[path]
  # As the launch scripts combine them: domain file, model file, mesh preset.
  registry.parse(["gin/math.gin", path, "gin/mesh/fsdp.gin"], finalize=False)
  ours = _gin_model_config()
  assert gin.query_parameter("policy.config") is not None
  check_matches(ours, config_from_hf(published), path)  # raises naming any field
  assert abs(ours.num_params() / 1e9 - billions) < 0.01, ours.num_params()


def test_a_checkpoint_of_another_model_is_refused():
  registry.parse(["gin/math.gin", "gin/model/qwen3-0.6b.gin"], finalize=False)
  qwen25 = config_from_hf(PUBLISHED["gin/model/qwen2.5-0.5b.gin"][1])
  with pytest.raises(config.ConfigError, match=r"hidden_size: gin 1024, checkpoint 896"):
    check_matches(_gin_model_config(), qwen25, "/ckpt/config.json")


def test_real_size_model_needs_its_checkpoint_directory():
  # Refused at parse time, before anything is built.
  with pytest.raises(config.ConfigError, match=r"policy.hf_dir set to `%gin.REQUIRED`"):
    registry.parse(["gin/math.gin", "gin/model/qwen3-0.6b.gin"])
  registry.parse(["gin/math.gin", "gin/model/qwen3-0.6b.gin"],
               ["policy.hf_dir = '/models/Qwen3-0.6B'"])
