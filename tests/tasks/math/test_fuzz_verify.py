"""Property tests: MathTask scoring and the verifier pool are total and bounded on any
completion (extraction and parsing: tests/tasks/test_fuzz_answers.py). Budget:
tests/fuzz_text.py."""

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evotrainer.tasks.answers import MAX_TEXT_CHARS, answer_tag
from evotrainer.tasks.base import Problem
from evotrainer.tasks.math.task import MathTask
from evotrainer.tasks.math.verify import VerifierPool
from tests.fuzz_text import FUZZ, model_text, within
from tests.tasks.math.test_verify import FLAKY
from tests.tasks.test_fuzz_answers import GOLDS, LONG_NUMBER, OPEN_BOXES


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
