"""The evaluation pipeline check: it passes on the real math task, and fails on each
planted fault (a verifier that accepts wrong answers, a training split that leaks
validation prompts, an evaluation that does not repeat), in the controller and through the
launcher before anything trains."""

import dataclasses
import os
import subprocess
import sys

import pytest

from evotrainer.eval.pipeline_check import math_probes, repeatability, task_eval_check
from evotrainer.evolution.controller import EvaluationPipelineError
from evotrainer.tasks.math.task import MathTask
from tests.evolution.test_controller import REPO, ScriptedTrainer, make
from tests.user_components import AcceptAllVerifier


@pytest.fixture(scope="module")
def task():
  with MathTask(num_validation=60, num_test=60) as t:
    yield t


def test_probes_by_hand(task):
  (p,) = task.heldout_problems(1)
  (right, wrong) = math_probes([p])
  assert right == (p, p.solution, True)
  gold = int(p.answer)  # tiny arithmetic: an integer
  assert wrong[2] is False and f"<answer>{gold + 1}</answer>" in wrong[1]
  assert f"<answer>{gold}</answer>" not in wrong[1]


def test_the_real_task_passes(task):
  ok, why = task_eval_check(task, probes=8, train_draws=300)()
  assert ok, why
  assert "train/validation/test disjoint over" in why
  assert why.endswith("/60/60 distinct prompts")


def test_a_verifier_that_accepts_everything_fails():
  with MathTask(num_validation=20, num_test=20, verifier=AcceptAllVerifier()) as t:
    ok, why = task_eval_check(t, probes=8, train_draws=100)()
  assert not ok and "accepts known-wrong answers on 8 of 8 probes" in why


class LeakyTask(MathTask):
  """A planted fault: training draws include validation problems."""

  def train_problems(self, n, seed):
    return super().train_problems(n, seed)[: n - 3] + self.heldout_problems(3)


def test_a_training_split_that_leaks_validation_fails():
  with LeakyTask(num_validation=20, num_test=20) as t:
    ok, why = task_eval_check(t, probes=4, train_draws=100)()
  assert not ok and "3 prompts are in both train and validation" in why


def test_repeatability_by_hand():
  same = [("v1.0", {"avg8": 0.5, "greedy": 0.7, "steps": 3}, {"avg8": 0.5, "greedy": 0.7})]
  assert repeatability(same)[0]
  moved = [("v1.0", {"avg8": 0.5}, {"avg8": 0.5 + 1e-3})]
  ok, why = repeatability(moved)
  assert not ok and "v1.0 re-evaluated its parent's avg8 as 0.500000" in why


def test_a_failing_check_stops_the_run_before_anything_trains(tmp_path):
  c, ledger, trainer = make(tmp_path, {}, eval_check=lambda: (False, "planted"))
  with pytest.raises(EvaluationPipelineError, match="before training: planted"):
    c.run()
  assert trainer.calls == [] and ledger.get_meta("controller/eval_check")["ok"] is False


class DriftingTrainer(ScriptedTrainer):
  """A planted fault: each branch's step-0 evaluation of its parent differs from the
  parent's own (e.g. a nondeterministic evaluation)."""

  def train(self, **kw):
    r = super().train(**kw)
    return dataclasses.replace(r, initial={"avg8": r.final["avg8"] + 0.01})


def test_an_evaluation_that_does_not_repeat_fails_the_escalation(tmp_path):
  c, ledger, trainer = make(tmp_path, {}, trainer=DriftingTrainer({}), branches=2,
                            generations=2, escalate_after=1)
  with pytest.raises(EvaluationPipelineError, match="evaluation not repeatable: v1.0"):
    c.run()
  assert ledger.get_meta("controller/generation") == 1  # stopped at generation 2's start


@pytest.mark.slow
def test_the_launcher_stops_on_a_planted_verifier_fault_before_training(tmp_path):
  workdir = tmp_path / "evo"
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin",
       "--gin_file=gin/tiny.gin", f"--workdir={workdir}", "--import=tests.user_components",
       "--gin_bindings=MathTask.verifier = @AcceptAllVerifier()"],
      cwd=REPO, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=600)
  assert proc.returncode != 0
  assert "accepts known-wrong answers" in proc.stdout + proc.stderr
  assert not (workdir / "versions" / "v0" / "branch_result.json").exists()
