"""Property tests: answer extraction, number parsing, verification and MathTask scoring are
total and bounded on any completion (issue 17). Budget: tests/fuzz_text.py."""

import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evotrainer.tasks.base import Problem
from evotrainer.tasks.math import MathTask
from evotrainer.tasks.verify import (MAX_ANSWER_CHARS, MAX_ANSWER_DEPTH, MAX_TEXT_CHARS,
                                     METHODS, VerifierPool, VerifyResult, answer_tag,
                                     boxed_contents, candidate_answers, count_candidates,
                                     extract_answer, fast_verdict, malformed,
                                     nesting_depth, normalize_answer, numbers_in,
                                     parse_number)
from tests.fuzz_text import FUZZ, model_text, within
from tests.tasks.test_verify import FLAKY

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


def test_long_number_scores_as_malformed_by_hand():
  """The issue's reproducer, scored without a worker: wrong, malformed, in format."""
  with MathTask() as task:
    p = Problem("t", "q", "7", "<answer>7</answer>", "tiny_arithmetic", 1)
    assert task.score_many([p], [LONG_NUMBER]) == [{
        "correct": 0.0, "format": 1.0, "partial": 0.0, "contains": 0.0,
        "n_candidates": 1.0, "malformed": 1.0}]
    assert task.score(p, "x" * (MAX_TEXT_CHARS + 1))["malformed"] == 1.0
    assert task.score(p, "<answer>7</answer>")["malformed"] == 0.0
    assert task.verifier.live_workers == 0  # refused before any worker


@pytest.fixture(scope="module")
def task():
  with MathTask(verify_workers=1, verify_timeout_s=2.0) as t:
    yield t


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(GOLDS), model_text()), min_size=1, max_size=3))
@example([("7", LONG_NUMBER), ("10", OPEN_BOXES), ("10", "<answer>10</answer>")])
def test_math_scores_are_total_and_in_range(task, rows):
  problems = [Problem(f"p{i}", "q", g, answer_tag(g), "fuzz", 0) for i, (g, _) in
              enumerate(rows)]
  completions = [c for _, c in rows]
  # Each item may cost the worker its whole timeout plus a replacement's start (~1 s).
  with within(len(rows) * (task.verifier.timeout_s + 10.0), what="score_many"):
    scores = task.score_many(problems, completions)
  assert len(scores) == len(rows)
  for s in scores:
    assert set(s) == {"correct", "format", "partial", "contains", "n_candidates",
                      "malformed"}
    assert all(math.isfinite(v) for v in s.values())
    assert {s["correct"], s["format"], s["contains"], s["malformed"]} <= {0.0, 1.0}
    assert 0.0 <= s["partial"] <= 1.0 and s["n_candidates"] >= 0
    assert s["n_candidates"] == int(s["n_candidates"])
    if s["correct"]:
      assert s["partial"] == 1.0 and not s["malformed"]
  started = task.verifier.live_workers
  assert started in (0, task.verifier.num_workers)  # lazily started, never fewer


# ------------------------------------------------------------------ pool health

# Each hang or crash costs a worker its timeout and a replacement's start (~0.5 s): a
# smaller budget than the in-process properties.
POOL_FUZZ = settings(FUZZ, max_examples=max(8, FUZZ.max_examples // 5))


@pytest.fixture(scope="module")
def flaky_pool():
  with VerifierPool(num_workers=2, timeout_s=0.5, verify_fn=FLAKY) as p:
    yield p


@POOL_FUZZ
@given(st.lists(st.sampled_from(("HANG", "CRASH", "RAISE", "a", "A", "b", "", " $a$")),
                min_size=1, max_size=4))
@example(["HANG", "CRASH", "RAISE", "A"])
def test_pool_stays_healthy(flaky_pool, preds):
  pairs = [("a", p) for p in preds]
  with within(len(pairs) * (flaky_pool.timeout_s + 10.0), what="verify_many"):
    results = flaky_pool.verify_many(pairs)
  if flaky_pool.live_workers:  # started by a first item that needed one
    assert flaky_pool.live_workers == flaky_pool.num_workers  # replaced, count constant
  expected = {"HANG": (False, "timeout"), "CRASH": (False, "error: worker died"),
              "RAISE": (False, "error: ValueError: boom"), "a": (True, "exact match"),
              " $a$": (True, "exact match"), "A": (True, "match"), "b": (False, "mismatch"),
              "": (False, "no answer")}
  for pred, r in zip(preds, results):
    correct, reason = expected[pred]
    assert r.correct == correct and r.reason.startswith(reason), (pred, r)
