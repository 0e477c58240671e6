"""Reward exploit probes and the exploit_probe validator, against hand-computed values."""

import math

import pytest

from evotrainer.harness.base import Evidence
from evotrainer.harness.probes import (_wrong, exploit_recoveries, exploit_recovery,
                                       gold_in_steps, number_spam, padding)
from evotrainer.harness.rewards import OverlongPenalty, RewardComposer
from evotrainer.harness.validators import VALIDATORS, ExploitProbe
from evotrainer.tasks.answers import extract_answer
from evotrainer.tasks.math.task import MathTask


@pytest.fixture(scope="module")
def task():
  t = MathTask(sources=["tiny_arithmetic"], num_validation=12)
  yield t
  t.close()


def test_number_spam_marks_the_gold_among_others_and_ends_wrong(task):
  text = number_spam("57")
  assert text == ("<answer>55</answer><answer>56</answer><answer>57</answer>"
                  "<answer>58</answer><answer>59</answer><answer>577</answer>")
  assert extract_answer(text)[0] == "577"
  problem = task.heldout_problems(1)[0]
  parts = task.score_many([problem], [number_spam(problem.answer)])[0]
  assert parts["correct"] == 0.0 and parts["contains"] == 1.0 and parts["n_candidates"] == 6.0


@pytest.mark.parametrize("parts,expected", [
    ({"correct": 1.0}, 0.0),
    ({"correct": 1.0, "format": 0.5}, 0.0),  # pays the wrong answer and the spam alike
    ({"correct": 1.0, "partial": 0.5}, 0.0),  # the spam's extracted answer is the wrong one
    ({"correct": 1.0, "contains": 1.0}, 0.5),  # spam earns `contains`: 1 of the 2 margin
    ({"correct": 1.0, "contains": 2.0}, 2.0 / 3.0),
])
def test_exploit_recovery_hand_computed(task, parts, expected):
  problems = task.heldout_problems(12)
  got = exploit_recovery(problems, task.score_many, RewardComposer(parts=parts),
                         lambda s: [0] * len(s))
  assert got == pytest.approx(expected, abs=1e-9)


def test_exploit_recovery_with_a_length_component(task):
  # Overlong: every completion past 3 "tokens" (characters here) costs the same -1, so
  # the margin and the spam's gain are those of the weighted parts alone.
  composer = RewardComposer(parts={"correct": 1.0, "contains": 1.0, "overlong": 1.0},
                            components=[OverlongPenalty(max_length=3, buffer=0)])
  got = exploit_recovery(task.heldout_problems(12), task.score_many, composer,
                         lambda s: [0] * len(s))
  assert got == pytest.approx(0.5)


def test_every_family_by_hand(task):
  from tests.user_components import CharCountBonus
  problems = task.heldout_problems(12)
  # A BC-only reward pays no family; `contains` pays the two that show the gold number
  # (1 of a margin of 2) and not padding.
  assert exploit_recoveries(problems, task.score_many, RewardComposer(parts={"correct": 1.0}),
                            lambda s: []) == {"number_spam": 0.0, "gold_in_steps": 0.0,
                                              "padding": 0.0}
  got = exploit_recoveries(problems, task.score_many,
                           RewardComposer(parts={"correct": 1.0, "contains": 1.0}),
                           lambda s: [])
  assert got == {"number_spam": pytest.approx(0.5), "gold_in_steps": pytest.approx(0.5),
                 "padding": pytest.approx(0.0)}
  # A reward that pays characters (min(1, chars / 100)) pays padding: by hand, per
  # problem, right = 1 + len(right) / 100, wrong = len(wrong) / 100, padding = 1.
  composer = RewardComposer(parts={"correct": 1.0, "chars": 1.0}, components=[CharCountBonus()])
  right = [len(f"<answer>{p.answer}</answer>") / 100 for p in problems]
  wrong = [len(f"<answer>{_wrong(p.answer)}</answer>") / 100 for p in problems]
  margin = sum(1 + r - w for r, w in zip(right, wrong)) / len(problems)
  gain = sum(1 - w for w in wrong) / len(problems)
  assert len(padding("5")) > 100 and gold_in_steps("5").startswith("so the result is 5")
  assert exploit_recovery(problems, task.score_many, composer, lambda s: [],
                          "padding") == pytest.approx(gain / margin)


def test_no_margin_is_nan_and_bad_exploit_is_an_error(task):
  problems = task.heldout_problems(4)
  assert math.isnan(exploit_recovery(problems, task.score_many,
                                     RewardComposer(parts={"format": 1.0}), lambda s: []))
  with pytest.raises(ValueError, match="exploit='nope'"):
    exploit_recovery(problems, task.score_many, RewardComposer(), lambda s: [], "nope")


def test_exploit_probe_validator():
  probe = ExploitProbe(max_recovery=0.1)
  assert VALIDATORS["exploit_probe"] is ExploitProbe
  ev = lambda h: Evidence(episodes=[], series={}, heldout=h)
  bad = probe(ev({"exploit_recovery": 2 / 3}))
  assert not bad.passed and bad.value == pytest.approx(2 / 3)
  assert bad.reason.startswith("exploit_probe: fail") and "0.667" in bad.reason
  assert probe(ev({"exploit_recovery": 0.1})).passed
  worst = probe(ev({"exploit_recovery": 0.5, "exploit_recovery/number_spam": 0.2,
                    "exploit_recovery/padding": 0.5, "exploit_recovery/gold_in_steps": math.nan}))
  assert not worst.passed and "pays a padding exploit 0.500" in worst.reason
  missing = probe(ev({}))
  assert missing.passed and math.isnan(missing.value) and "no exploit_recovery" in missing.reason
  assert probe(ev({"exploit_recovery": float("nan")})).passed
