"""Answer extraction, candidates, numbers and the exact verdict (tasks/answers.py), by
hand-worked examples."""

from fractions import Fraction

import pytest

from evotrainer.tasks.answers import (VerifyResult, answer_tag, boxed_contents,
                                      candidate_answers, count_candidates, extract_answer,
                                      fast_verdict, parse_number)


# ------------------------------------------------------------------ extraction


@pytest.mark.parametrize("text, expected", [
    ("so the answer is <answer>42</answer>", ("42", "answer_tag")),
    ("<answer>1</answer> no wait <answer> 2 </answer>", ("2", "answer_tag")),
    ("<ANSWER>$\\boxed{12}$</ANSWER>", ("12", "answer_tag")),
    ("<answer>7</answer> and \\boxed{8}", ("7", "answer_tag")),  # tags beat boxes
    ("thus \\boxed{\\frac{a}{b^{2}}} done", ("\\frac{a}{b^{2}}", "boxed")),
    ("\\boxed{1} or maybe \\boxed{\\sqrt{\\frac{3}{4}}}.", ("\\sqrt{\\frac{3}{4}}", "boxed")),
    ("\\boxed{3} then truncated \\boxed{\\frac{1}{", ("3", "boxed")),
    ("$\\boxed 5$", ("5", "boxed")),
    ("48/2 = 24\n#### 72", ("72", "hashes")),
    ("#### 3\nmore text\n#### 1,234", ("1,234", "hashes")),
    ("12 apples, then 7-3 leaves", ("3", "last_number")),
    ("the balance is -17.5 dollars.", ("-17.5", "last_number")),
    ("no digits here", (None, "none")),
    ("<answer>  </answer>", (None, "none")),
])
def test_extract_answer(text, expected):
  assert extract_answer(text) == expected


def test_extract_answer_methods_subset():
  assert extract_answer("it is 5", ("answer_tag", "boxed")) == (None, "none")
  assert extract_answer("\\boxed{5} <answer>6</answer>", ("boxed",)) == ("5", "boxed")


def test_boxed_contents_nested_and_order():
  text = "\\boxed{a{b}c} x \\fbox{2} \\boxed{\\frac{1}{2}}"
  assert boxed_contents(text) == ["a{b}c", "2", "\\frac{1}{2}"]


@pytest.mark.parametrize("text, candidates", [
    ("<answer>5</answer> \\boxed{6} <answer>5.0</answer>", ["5", "6"]),  # 5 == 5.0
    ("<answer>\\boxed{3}</answer>", ["3"]),  # a box inside tags is one candidate
    ("<answer>1</answer><answer>2</answer><answer>3</answer>#### 4", ["1", "2", "3", "4"]),
    ("I get 3, no, 4", ["4"]),  # unmarked: only the last number
    ("", []),
])
def test_candidate_answers(text, candidates):
  assert candidate_answers(text) == candidates
  assert count_candidates(text) == len(candidates)


def test_parse_number():
  assert parse_number("1,000") == 1000
  assert parse_number(" -0.50 ") == Fraction(-1, 2)
  assert parse_number("19.") == 19
  assert parse_number("1/2") is None
  assert parse_number("1,00") is None
  assert parse_number("x") is None
  assert parse_number(None) is None


def test_fast_verdict_without_workers():
  assert fast_verdict("19", "19.0") == VerifyResult(True, "numeric match")
  assert fast_verdict("1000", "1,000") == VerifyResult(True, "numeric match")
  assert fast_verdict("19", "20") == VerifyResult(False, "numeric mismatch")
  assert fast_verdict("5", None) == VerifyResult(False, "no answer")
  assert fast_verdict("\\frac{1}{2}", "$\\frac{1}{2}$") == VerifyResult(True, "exact match")
  assert fast_verdict("0.5", "1/2") is None  # needs math-verify
  assert answer_tag("7") == "<answer>7</answer>"
