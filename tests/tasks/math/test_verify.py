"""Answer extraction and the verifier pool (math-verify in killable worker processes)."""

import os
import time
from fractions import Fraction

import pytest

from evotrainer.tasks.verify import (VerifierPool, VerifyResult, answer_tag,
                                     boxed_contents, candidate_answers, count_candidates,
                                     extract_answer, fast_verdict, parse_number)

# Imported by the pool's workers as "tests.tasks.test_verify:flaky_verify".
FLAKY = "tests.tasks.test_verify:flaky_verify"


def flaky_verify(gold: str, pred: str) -> bool:
  """A verify function that hangs, crashes or raises on marked inputs."""
  if pred == "HANG":
    time.sleep(3600)
  if pred == "CRASH":
    os._exit(3)
  if pred == "RAISE":
    raise ValueError("boom")
  return gold.lower() == pred.lower()


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


# ------------------------------------------------------------------ the pool


@pytest.fixture(scope="module")
def pool():
  with VerifierPool(num_workers=1, timeout_s=10.0) as p:
    yield p


def test_math_verify_equivalences(pool):
  results = pool.verify_many([
      ("0.5", "1/2"),
      ("19", "19.0"),
      ("x^2+1", "1+x^2"),
      ("\\frac{1}{2}", "0.6"),
      ("\\dfrac{3}{4}", "0.75"),
      ("5", None),
  ])
  assert [r.correct for r in results] == [True, True, True, False, True, False]
  assert results[0].reason == "match"  # decided by math-verify in a worker
  assert results[1].reason == "numeric match"  # decided in-process
  assert results[3].reason == "mismatch"
  assert results[5].reason == "no answer"


def test_numbers_never_start_a_worker():
  with VerifierPool(num_workers=1) as p:
    assert [r.correct for r in p.verify_many([("3", "3.0"), ("3", "4")])] == [True, False]
    assert not p._workers  # pylint: disable=protected-access


def test_hanging_item_times_out_and_pool_keeps_serving():
  with VerifierPool(num_workers=1, timeout_s=1.0, verify_fn=FLAKY) as p:
    assert p.verify("abc", "ABC") == VerifyResult(True, "match")  # worker warm
    hung_pid = p._workers[0].proc.pid  # pylint: disable=protected-access
    start = time.monotonic()
    results = p.verify_many([("abc", "HANG"), ("abc", "ABC"), ("abc", "xyz")])
    assert time.monotonic() - start < 15.0
    assert results == [VerifyResult(False, "timeout"), VerifyResult(True, "match"),
                       VerifyResult(False, "mismatch")]
    with pytest.raises(ProcessLookupError):  # the hung worker was killed and reaped
      os.kill(hung_pid, 0)
    assert p.verify("Q", "q") == VerifyResult(True, "match")
    assert p.stats["timeout"] == 1


def test_crash_and_exception_are_errors_and_pool_recovers():
  with VerifierPool(num_workers=2, timeout_s=5.0, verify_fn=FLAKY) as p:
    results = p.verify_many([("a", "CRASH"), ("a", "RAISE"), ("a", "A"), ("a", "b")])
    assert results[0].correct is False
    assert results[0].reason.startswith("error: worker died")
    assert results[1] == VerifyResult(False, "error: ValueError: boom")
    assert results[2:] == [VerifyResult(True, "match"), VerifyResult(False, "mismatch")]
    assert p.verify("b", "B").correct


def test_bad_verify_fn_is_a_clear_error():
  with pytest.raises(ValueError, match="module:function"):
    VerifierPool(verify_fn="no_colon_here")
  with VerifierPool(verify_fn="tests.tasks.no_such_module:f") as p:
    with pytest.raises(ValueError, match="no_such_module"):
      p.verify("a", "b")


def test_closed_pool_refuses_work():
  p = VerifierPool()
  p.close()
  with pytest.raises(RuntimeError, match="closed"):
    p.verify("a", "b")
