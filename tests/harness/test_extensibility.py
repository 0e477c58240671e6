"""A reward part and a diagnostic from a user's own module (tests/user_components.py),
loaded with --import and named in gin, work like built-in ones (issue 4, item 8)."""

import json
import os
import subprocess
import sys

import gin
import numpy as np
import pytest

from evotrainer import config, registry
from evotrainer.harness.diagnostics import DIAGNOSTICS, run_diagnostics
from evotrainer.harness.pipeline import Harness
from evotrainer.rollouts import RolloutStore
from tests.harness import make_groups

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BINDINGS = [
    "RewardComposer.components = [@CharCountBonus()]",
    "RewardComposer.parts = {'correct': 1.0, 'chars': 0.5}",
    "CharCountBonus.per_chars = 10",
    "train.diagnostics = [@MeanCompletionChars()]",
]


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_user_components_from_gin_build_a_working_harness(clean_gin):
  config.import_modules(["tests.user_components"])
  registry.parse(["harness/default.gin"], BINDINGS)
  # What train() receives: its gin references, evaluated.
  harness = gin.query_parameter("train.harness").scoped_configurable_fn()
  diags = [ref.scoped_configurable_fn() for ref in gin.query_parameter("train.diagnostics")]
  assert isinstance(harness, Harness)
  assert [type(c).__name__ for c in harness.composer.components] == ["CharCountBonus"]
  assert "mean_completion_chars" in DIAGNOSTICS  # registered like a library diagnostic

  eps = make_groups([[1, 0], [0, 0]])
  for ep, text in zip(eps, ["12345", "1234567890abc", "", "1234"]):
    ep.completion = text
  out = harness.process(eps, group_size=2)
  # chars = min(1, len / 10): .5, 1, 0, .4; reward = correct + .5 * chars.
  assert [ep.reward_parts["chars"] for ep in eps] == [0.5, 1.0, 0.0, 0.4]
  np.testing.assert_array_equal(out.rewards, np.float32([1.25, 0.5, 0.0, 0.2]))
  assert out.metrics["reward_part/chars"] == pytest.approx(0.475)
  # Group 1 [0, .2] is alive now: GRPO gives +-1 (eps 1e-6 aside).
  np.testing.assert_allclose(out.advantages, [1, -1, -1, 1], atol=1e-4)
  assert harness.describe()["composer"]["components"] == [
      {"class": "CharCountBonus", "per_chars": 10, "scale": 1.0, "name": "chars"}]

  metrics, findings = run_diagnostics(diags, eps)
  assert metrics == {"mean_completion_chars": (5 + 13 + 0 + 4) / 4} and findings == []


@pytest.mark.slow
def test_user_components_through_the_command_line(tmp_path, launch_caches):
  workdir = tmp_path / "run"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math_train.gin",
       "--gin_file=gin/tiny.gin", "--import=tests.user_components", f"--workdir={workdir}",
       *(f"--gin_bindings={b}" for b in BINDINGS),
       *(f"--gin_bindings={b}" for b in launch_caches)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  store = RolloutStore(workdir / "rollouts")
  episodes = store.read(split="train")
  assert len(episodes) == 2 * 4 * 4  # tiny.gin: 2 steps x 4 prompts x 4 samples
  for ep in episodes:
    chars = min(1.0, len(ep.completion) / 10)
    assert ep.reward_parts["chars"] == pytest.approx(chars)
    assert ep.reward == pytest.approx(ep.reward_parts["correct"] + 0.5 * chars, abs=1e-6)
  assert any(ep.reward_parts["chars"] > 0 for ep in episodes)
  # The user's diagnostic ran on every step; the operative config names both components.
  diag = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert sum("diag/mean_completion_chars" in m for m in diag) == 2
  operative = (workdir / "operative_config.gin").read_text()
  assert "CharCountBonus" in operative and "MeanCompletionChars" in operative
