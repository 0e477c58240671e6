"""Config values of the wrong type are named at parse time, before anything is built."""

import gin
import pytest

from evotrainer import config, registry


@pytest.mark.parametrize("binding,message", [
    ("train.steps = 'abc'", "train.steps = 'abc': expected int (the default is 100)"),
    ("EvalConfig.k = 2.5", "EvalConfig.k = 2.5: expected int"),
    ("train.steps = True", "train.steps = True: expected int"),
    ("MathTask.prompt_template = 3", "MathTask.prompt_template = 3: expected str"),
])
def test_wrong_value_types_are_config_errors(binding, message):
  with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    registry.parse(["gin/math_train.gin", "gin/tiny.gin"], [binding])


@pytest.mark.parametrize("binding,value", [("SamplingParams.temperature = 1", 1),
                                           ("run.warm_start = 0", 0),
                                           ("train.time_limit_s = 30.5", 30.5),
                                           ("Learner.total_steps = 7", 7)])
def test_compatible_values_pass(binding, value):
  registry.parse(["gin/math_train.gin", "gin/tiny.gin"], [binding])
  # Accepted, and bound as written (an int where a float default is, 0 for a bool).
  assert gin.query_parameter(binding.split(" = ")[0]) == value


def test_compilation_cache_knob(tmp_path, monkeypatch):
  import jax
  from evotrainer import config as config_lib
  before = jax.config.jax_compilation_cache_dir
  try:
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert config_lib.compilation_cache(None) is None
    assert jax.config.jax_compilation_cache_dir == before  # off: untouched
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_lib.compilation_cache() == str(tmp_path / ".cache" / "evotrainer" / "jax")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / ".cache/evotrainer/jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))  # env wins
    assert config_lib.compilation_cache(str(tmp_path / "knob")) == str(tmp_path / "env")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


@pytest.mark.parametrize("binding", ["train.seed = 3", "train.model = None",
                                     "warm_start.task = None", "evolve.workdir = '/x'",
                                     "Learner.vocab_limit = 10", "make_tokenizer.texts = []",
                                     "MultiTurnEngine.sampler = None", "run.workdir = '/x'"])
def test_parameters_the_code_passes_are_not_knobs(binding):
  """Binding one would be silently overridden by the caller: it is an error instead."""
  name, param = binding.split(" = ")[0].split(".")
  with pytest.raises(config.ConfigError, match=f"'{name}' has denylisted kwarg '{param}'"):
    registry.parse(["gin/math_train.gin"], [binding])


def test_fields_of_an_external_configurable_are_type_checked_too():
  """`ModelConfig` is registered with `gin.external_configurable` (a frozen dataclass)."""
  with pytest.raises(config.ConfigError, match=r"ModelConfig.rms_norm_eps = 'small': "
                     r"expected int or float"):
    registry.parse(["gin/math_train.gin"], ["ModelConfig.rms_norm_eps = 'small'"])
