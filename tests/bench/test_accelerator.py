"""The accelerator check script on the CPU at its tiny size (what CI can run)."""

import json

import pytest

from bench import accelerator


@pytest.mark.slow
def test_accelerator_script_runs_tiny_on_the_cpu(tmp_path):
  out = tmp_path / "acc.json"
  result = accelerator.main(["--size", "tiny", "--json", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  assert result["size"] == "tiny" and result["dtype"] == "bfloat16"
  assert result["peak_source"].startswith("measured")  # a CPU has no datasheet entry
  learner, sampler = result["learner"], result["sampler"]
  assert learner["compiled_programs"] == 1  # timed steps did not recompile
  # tokens/s and MFU follow from the step time by the documented formulas
  t = learner["prompt_len"] + learner["completion_len"]
  assert learner["tokens_per_s"] == pytest.approx(learner["batch"] * t / learner["step_s"],
                                                  rel=1e-3)
  assert 0 < learner["mfu"] < 1 and 0 < sampler["decode_fraction_of_peak"] < 1
  assert sampler["tokens_per_s"] == pytest.approx(
      sampler["batch"] * sampler["new_tokens"] / sampler["run_s"], rel=1e-3)


def test_datasheet_peak_by_device_kind(monkeypatch):
  class Dev:
    device_kind = "NVIDIA H200"
  monkeypatch.setattr(accelerator.jax, "devices", lambda: [Dev()])
  peak, source = accelerator.device_peak(None)
  assert peak == 989e12 and "H200" in source
  Dev.device_kind = "TPU v5 lite"
  assert accelerator.device_peak(None)[0] == 197e12
