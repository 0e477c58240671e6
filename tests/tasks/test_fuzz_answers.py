"""Property tests: answer extraction, number parsing and the exact verdict
(tasks/answers.py) are total and bounded on any completion. Budget: tests/fuzz_text.py."""

from fractions import Fraction

from hypothesis import example, given
from hypothesis import strategies as st

from evotrainer.tasks.answers import (MAX_ANSWER_CHARS, MAX_ANSWER_DEPTH, MAX_TEXT_CHARS,
                                      METHODS, VerifyResult, boxed_contents,
                                      candidate_answers, count_candidates, extract_answer,
                                      fast_verdict, malformed, nesting_depth,
                                      normalize_answer, numbers_in, parse_number)
from tests.fuzz_text import FUZZ, model_text, within

GOLDS = ("10", "-0.5", "1,000", "\\frac{1}{2}", "x^2+1", "7" * 50)
# The reproducer: a 5000-digit answer raised ValueError from int-string conversion.
LONG_NUMBER = "<answer>" + "7" * 5000 + "</answer>"
# Quadratic before the fix: 33 s and 219 s in the training process, with no timeout.
OPEN_TAGS = "<answer>" * 20_000
OPEN_BOXES = "\\boxed{" * 20_000


@FUZZ
@given(model_text())
@example(LONG_NUMBER)
@example(OPEN_TAGS)
@example(OPEN_BOXES)
@example("\\boxed " * 20_000)
@example("x" * (MAX_TEXT_CHARS + 1))
def test_extraction_is_total_and_bounded(text):
  with within(what="extraction"):
    answer, how = extract_answer(text)
    candidates = candidate_answers(text)
    n = count_candidates(text)
    boxes = boxed_contents(text)
    numbers = numbers_in(text)
  assert how in METHODS + ("none",)
  assert (answer is None) == (how == "none")
  assert answer is None or (isinstance(answer, str) and answer)
  assert n == len(candidates) and all(isinstance(c, str) and c for c in candidates)
  assert all(isinstance(b, str) for b in boxes) and all(isinstance(x, str) for x in numbers)
  if len(text) > MAX_TEXT_CHARS:  # a completion over the bound is not read
    assert (answer, how, candidates, numbers) == (None, "none", [], [])


@FUZZ
@given(model_text())
@example("7" * 5000)
@example("1," + ",".join(["000"] * 2000))
@example("." + "1" * 5000)
def test_number_parsing_is_total(text):
  with within(what="parse_number"):
    value = parse_number(text)
    canonical = normalize_answer(text)
  assert value is None or isinstance(value, Fraction)
  assert isinstance(canonical, str)
  if value is not None:
    assert len(text) <= MAX_ANSWER_CHARS


@FUZZ
@given(st.integers(-10**1200, 10**1200))
def test_parse_number_reads_integers_exactly_up_to_the_bound(n):
  text = str(n)
  assert parse_number(text) == (n if len(text) <= MAX_ANSWER_CHARS else None)


@FUZZ
@given(st.sampled_from(GOLDS), model_text())
@example("7", "7" * 5000)
@example("1", "\\frac{1}{" * 40 + "2" + "}" * 40)
def test_fast_verdict_is_total(gold, pred):
  with within(what="fast_verdict"):
    verdict = fast_verdict(gold, pred)
  assert verdict is None or isinstance(verdict, VerifyResult)
  refused = pred.strip() and (len(pred) > MAX_ANSWER_CHARS
                              or nesting_depth(pred) > MAX_ANSWER_DEPTH)
  if refused:  # wrong unread, never sent to a parser
    assert not verdict.correct and verdict.reason.startswith("malformed")


def test_malformed_by_hand():
  assert malformed("\\frac{1}{2}") is None
  assert malformed("7" * MAX_ANSWER_CHARS) is None
  assert malformed("7" * (MAX_ANSWER_CHARS + 1)) == (
      f"malformed: answer of {MAX_ANSWER_CHARS + 1} characters (> {MAX_ANSWER_CHARS})")
  assert nesting_depth("(a[b]{c{d}})") == 3 and nesting_depth("}}}{") == 1
  deep = "{" * (MAX_ANSWER_DEPTH + 1) + "}" * (MAX_ANSWER_DEPTH + 1)
  assert malformed(deep) == (f"malformed: answer nested {MAX_ANSWER_DEPTH + 1} deep "
                             f"(> {MAX_ANSWER_DEPTH})")
