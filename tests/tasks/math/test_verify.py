"""The verifier pool: math-verify in killable worker processes."""

import os
import time

import pytest

from evotrainer.tasks.answers import VerifyResult
from evotrainer.tasks.math.verify import VerifierPool

# Imported by the pool's workers as "tests.tasks.math.test_verify:flaky_verify".
FLAKY = "tests.tasks.math.test_verify:flaky_verify"


def flaky_verify(gold: str, pred: str) -> bool:
  """A verify function that hangs, crashes or raises on marked inputs."""
  if pred == "HANG":
    time.sleep(3600)
  if pred == "CRASH":
    os._exit(3)
  if pred == "RAISE":
    raise ValueError("boom")
  return gold.lower() == pred.lower()


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
