"""arithmetic_slip (tasks/math/diagnostics.py) on hand-written completions, and the
catalog's answer to it: the calculator tool turned on, never off."""

import pytest

from evotrainer.evolution.proposers import skill_hypotheses
from evotrainer.evolution.search_space import ChoiceKnob, FloatKnob, SearchSpace
from evotrainer.tasks.math.diagnostics import ArithmeticSlipRate, equations, slipped
from evotrainer.types import Episode

MATH = {"correct": 0.0, "contains": 0.0}  # the math task's parts: `contains` marks math


def _ep(i: int, completion: str, parts=MATH) -> Episode:
  return Episode(episode_id=f"v0/0/{i}", group_id=0, task_id="t", prompt="p",
                 completion=completion, answer="-9", reward_parts=dict(parts))


def test_equations_pair_the_written_value_with_the_true_one():
  assert equations("-5 - 4 = -10\n<answer>-10</answer>") == [("-10", "-9")]
  assert equations("3 + 4 = 7, so 7 * 2 = 15") == [("7", "7"), ("15", "14")]
  assert equations("if a == 3 and 2 <= 5: 4 >= 1") == []  # comparisons, not results
  assert equations("x = 3") == [] and equations("3 + 4 = seven") == []
  assert slipped("-5 - 4 = -9") is False and slipped("no sums here") is None
  assert slipped("3 + 4 = 7, so 7 * 2 = 15") is True


def test_the_share_of_completions_that_get_a_written_sum_wrong():
  eps = [_ep(0, "-5 - 4 = -10\n<answer>-10</answer>"),  # slip
         _ep(1, "-5 - 4 = -9\n<answer>-9</answer>"),  # right
         _ep(2, "-5 - 4 = 1\n<answer>1</answer>"),  # slip
         _ep(3, "<answer>-9</answer>"),  # no equation: not counted in the share
         _ep(4, "x = 1 + 1 = 3", parts={"correct": 0.0})]  # not math: ignored
  report = ArithmeticSlipRate()(eps, {})
  assert report.metrics["arithmetic_slip"] == pytest.approx(2 / 3)
  assert report.metrics["equation_rate"] == pytest.approx(3 / 4)
  (finding,) = report.findings
  assert finding.kind == "arithmetic_slip" and finding.value == pytest.approx(2 / 3)
  assert [e[0] for e in finding.evidence] == ["v0/0/0", "v0/0/2"]
  assert ArithmeticSlipRate(threshold=0.7)(eps, {}).findings == ()
  assert ArithmeticSlipRate()([eps[3], eps[4]], {}).metrics == {}


def test_the_catalog_turns_the_calculator_on_for_slips_and_never_off():
  space = SearchSpace([ChoiceKnob("MathTask.calculator", [False, True], "tools"),
                       FloatKnob("Learner.learning_rate", 1e-5, 1e-4, log=True)])
  eps = [_ep(0, "-5 - 4 = -10"), _ep(1, "-5 - 4 = -3")]
  findings = list(ArithmeticSlipRate()(eps, {}).findings)
  off = {"MathTask.calculator": False, "Learner.learning_rate": 2e-5}
  (hyp,) = skill_hypotheses(findings, off, space, None)
  iv = hyp.intervention
  assert (iv.binding, iv.old, iv.new) == ("MathTask.calculator", False, True)
  assert hyp.finding == "arithmetic_slip" and hyp.group == "tools"
  assert skill_hypotheses(findings, {**off, "MathTask.calculator": True}, space, None) == []
