"""The code domain's gin files: the hackable option is refused by the exploit probe, the
search space and validators parse, and the launcher trains code end to end."""

import json
import os
import subprocess
import sys

import gin
import pytest

from evotrainer import registry
from evotrainer.evolution.proposers import skill_hypotheses
from evotrainer.evolution.search_space import SearchSpace
from evotrainer.harness.base import Evidence
from evotrainer.harness.validators import ExploitProbe
from evotrainer.modes.branch import exploit_recovery
from evotrainer.tasks.code.task import CodeTask
from evotrainer.types import Finding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Tok:
  encode = staticmethod(lambda text: [0] * len(text))


@pytest.fixture
def parsed():
  def parse(files, bindings=()):
    registry.parse(files, [*bindings, "CodeTask.num_validation = 8",
                             "CodeTask.num_test = 8"], finalize=False)
  yield parse
  gin.clear_config()


def _recovery(bindings, parsed) -> float:
  parsed(["gin/code_hackable.gin"], bindings)
  with CodeTask(num_validation=8, num_test=8) as task:
    figures = exploit_recovery(task, _Tok(), num_problems=8)
  assert figures["exploit_recovery/lying_program"] == figures["exploit_recovery"]
  return figures["exploit_recovery"]


def test_the_hackable_reward_option_is_refused_by_the_exploit_probe(parsed):
  # What a branch computes for its result (modes/branch.py): its own composer's recovery.
  gamed = _recovery(["RewardComposer.parts = {'correct': 1.0, 'self_report': 2.0}"], parsed)
  honest = _recovery(["RewardComposer.parts = {'correct': 1.0, 'partial': 0.5}"], parsed)
  assert gamed == pytest.approx(2 / 3) and honest == pytest.approx(0.0)
  verdict = lambda r: ExploitProbe()(Evidence([], {}, {"exploit_recovery": r,
                                                       "exploit_recovery/lying_program": r}))
  assert not verdict(gamed).passed and verdict(honest).passed
  assert "lying_program" in verdict(gamed).reason


def test_code_gin_declares_the_space_the_domain_and_the_validators(parsed, tmp_path):
  parsed(["gin/code_hackable.gin"])
  knobs = gin.query_parameter("SearchSpace.knobs")
  assert len(knobs) == 8
  assert gin.query_parameter("evolve.domain") == "code"
  assert gin.query_parameter("run.task").selector.endswith("CodeTask")
  assert "TestTampering" in str(gin.query_parameter("evolve.validators"))


@pytest.mark.slow
def test_launch_code_train_end_to_end(tmp_path):
  workdir = tmp_path / "run"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/code_train.gin",
       "--gin_file=gin/tiny.gin", f"--workdir={workdir}",
       "--gin_bindings=run.warm_start = False",  # math's end-to-end test covers it
       "--gin_bindings=SamplingParams.max_new_tokens = 24",
       "--gin_bindings=EvalConfig.max_new_tokens = 24",
       "--gin_bindings=CodeTask.num_validation = 8", "--gin_bindings=CodeTask.num_test = 8",
       f"--gin_bindings=make_tokenizer.cache_dir = '{tmp_path}/tok'",
       f"--gin_bindings=warm_start.cache_dir = '{tmp_path}/ws'"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["mode"] == "train" and summary["steps"] == 2
  for phase in ("initial", "final"):
    assert 0.0 <= summary[phase]["avg2"] <= summary[phase]["pass2"] <= 1.0
    assert set(summary["test"][phase]) >= {"avg2", "pass2", "greedy", "format"}
  assert "CodeTask.difficulty = 1" in (workdir / "operative_config.gin").read_text()
  # Every training completion ran in the sandbox and got a code stop reason.
  metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  stops = {k for m in metrics for k in m if k.startswith("diag/stop_")}
  assert stops and stops <= {f"diag/stop_{s}" for s in (
      "passed", "wrong_answer", "runtime_error", "timeout", "syntax_error", "no_code",
      "malformed")}
  assert any("diag/syntax_error_rate" in m for m in metrics)


def test_the_pretrained_code_configs_parse_and_say_what_they_run(parsed):
  names = lambda refs: {r.selector.rsplit(".", 1)[-1] for r in refs}
  registry.parse(["gin/code_smol_train.gin"])  # finalized: every binding is known
  gin.clear_config()
  parsed(["gin/code_smol_train.gin"])
  assert gin.query_parameter("policy.gguf") == "smollm2-135m-instruct"
  assert gin.query_parameter("run.mode") == "train"
  assert gin.query_parameter("run.warm_start") is False
  assert gin.query_parameter("CodeTask.kinds") == ["function"]  # each names its function
  assert gin.query_parameter("Harness.group_filters") == []  # the fixed default harness
  gin.clear_config()
  registry.parse(["gin/code_smol.gin"])
  gin.clear_config()
  parsed(["gin/code_smol.gin"])
  assert gin.query_parameter("run.mode") == "evolve"
  generations = gin.query_parameter("evolve.generations")
  per_generation = gin.query_parameter("evolve.branches") + int(
      gin.query_parameter("evolve.control"))
  assert 1 + generations * per_generation >= 4  # the root and the versions it evolves
  assert {"ProseRate", "BrokenFence", "SyntaxErrorRate", "WrongNameRate", "RunawayLength",
          "DeadGroupRatio"} <= names(gin.query_parameter("evolve.diagnostics"))
  assert gin.query_parameter("lr/FloatKnob.high") <= 1e-4  # a pretrained model's steps
  assert gin.query_parameter("VerifyConfig.keep_on") == "mean"  # a branch's steps are kept
  space = SearchSpace()
  space.check_bindings_exist()
  values = space.current_values()
  assert values["Learner.learning_rate"] == 2e-5 and values["Harness.trajectory_filters"] == []
  # Each chat-model finding has a change to try in this space.
  found = [Finding(kind, "behaviour", 0.5, 0.5, 0.2, "") for kind in (
      "prose_rate", "broken_fence", "syntax_error_rate", "wrong_name_rate", "runaway_length")]
  hyps = skill_hypotheses(found, values, space, None)
  # (a change that answers several findings is proposed once and cites them all)
  assert {k for h in hyps for k in (h.finding, *h.also)} == {f.kind for f in found}
  # Runaway length's first change is the stop rule at the block's closing fence.
  runaway = [h.intervention for h in hyps if h.finding == "runaway_length"]
  assert values["SamplingParams.stop_rule"] == ""
  assert (runaway[0].binding, runaway[0].new) == ("SamplingParams.stop_rule", "code_block")
