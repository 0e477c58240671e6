"""The math calculator tool (tasks/math/calculator.py): what it reads before an "=", the
values it writes (checked against hand-computed sums and against Python's own Fraction
arithmetic), hostile text, and one episode's turns."""

import random
from fractions import Fraction

import pytest

from evotrainer.tasks.math.calculator import (MAX_EXPRESSION_CHARS, CalculatorEnv,
                                              exact_value, format_value,
                                              value_before_equals)


@pytest.mark.parametrize("text, value", [
    ("-9 - 5 =", "-14"),  # the warm-started model's form
    ("0 + -8 = ", "-8"),  # a trailing space after the "="
    ("So 3 + 4 =", "7"),  # words before the sum
    ("Calculate -5 + 3 =", "-2"),  # a leading unary minus after a word
    ("(8 + 5) =", "13"),
    ("(3 + 4 =", "7"),  # an unclosed parenthesis: the sum after it
    ("1. 3 + 4 =", "7"),  # a list marker
    ("a - b = 8 - 5 =", "3"),  # the last "=" of the line
    ("6 * 7 =", "42"),
    ("7 / 2 =", "3.5"),
    ("1 / 3 =", "1/3"),
    ("0.1 + 0.2 =", "0.3"),  # exact, not binary floating point
    ("first line 2 + 2 =\n10 - 1 =", "9"),  # the last line only
])
def test_the_value_of_the_sum_before_the_equals_sign(text, value):
  assert value_before_equals(text) == value


@pytest.mark.parametrize("text", [
    "x - 1 =",  # goes on from a name: not a sum the tool can read
    "2 ** 10 =",  # a power is no sum we compute, and "10" alone is not what was written
    "1 / 0 =", "abc =", "=", "3 + 4 ==", "3 + 4", "3 + 4 = 7",
    "9" * (MAX_EXPRESSION_CHARS + 5) + " =",  # longer than the tool reads
    "(" * 300 + "1" + ")" * 300 + " =",  # nesting past the parser
    "__import__('os').system('true') =", "٣ + ٤ =",
])
def test_text_without_a_readable_sum_gets_no_value(text):
  assert value_before_equals(text) is None


def test_exact_value_agrees_with_fraction_arithmetic():
  rng = random.Random(0)
  for _ in range(300):
    terms = [rng.randint(-50, 50) for _ in range(rng.randint(2, 5))]
    ops = [rng.choice("+-*/") for _ in terms[1:]]
    if any(o == "/" and t == 0 for o, t in zip(ops, terms[1:])):
      continue
    text = str(terms[0]) + "".join(f" {o} ({t})" for o, t in zip(ops, terms[1:]))
    # The reference: Python's own precedence over Fractions (our generated text only).
    ref = eval(f"Fraction({terms[0]})" + "".join(  # noqa: S307
        f" {o} Fraction({t})" for o, t in zip(ops, terms[1:])), {"Fraction": Fraction})
    assert exact_value(text) == ref, text
    assert value_before_equals(f"so {text} =") == format_value(ref), text


def test_format_value():
  assert format_value(Fraction(-14)) == "-14"
  assert format_value(Fraction(7, 4)) == "1.75"
  assert format_value(Fraction(-1, 8)) == "-0.125"
  assert format_value(Fraction(2, 3)) == "2/3"


def test_an_episode_alternates_model_turns_and_tool_values():
  env = CalculatorEnv()
  assert env.step("-9 - 5 =") == " -14" and env.stop is None and not env.done
  assert env.step("x =") == "" and env.stop is None  # a miss: the model writes on
  assert env.step(" 3\n<answer>-14</answer>") == "" and env.stop == "submitted"
  assert env.done
  assert env.transcript == "-9 - 5 = -14x = 3\n<answer>-14</answer>"
  assert env.info() == {"calculator_calls": 1, "calculator_misses": 1}


def test_a_value_the_model_never_went_on_from_is_not_graded():
  """A budget stop right after an "=" (the engine appends no observation): the transcript
  ends at the "=", so the tool's number cannot pass for the answer."""
  env = CalculatorEnv()
  assert env.step("-9 - 5 =") == " -14"
  assert env.transcript == "-9 - 5 =" and env.info()["calculator_calls"] == 0


def test_a_first_turn_without_an_equals_sign_submits():
  env = CalculatorEnv()
  assert env.step("<answer>4</answer>") == "" and env.stop == "submitted"
  assert env.info() == {"calculator_calls": 0, "calculator_misses": 0}
