"""The bookkeeping thread: work runs in order, off the caller's thread; a failure
surfaces at the next flush, and nothing queued after it runs."""

import threading

import pytest

from evotrainer.background import Background


def test_work_runs_in_order_on_another_thread():
  bg, seen = Background(), []
  for i in range(5):
    bg.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
  bg.flush()
  assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
  assert {name for _, name in seen} == {"train-background"}


def test_a_failure_is_raised_by_flush_and_stops_later_work():
  bg, seen = Background(), []
  bg.submit(lambda: seen.append(1))
  bg.submit(lambda: 1 / 0)
  bg.submit(lambda: seen.append(3))  # queued after the failure: skipped
  with pytest.raises(RuntimeError, match="background bookkeeping failed") as err:
    bg.flush()
  assert isinstance(err.value.__cause__, ZeroDivisionError)
  assert seen == [1]
  bg.submit(lambda: seen.append(4))  # the error was reported: work runs again
  bg.flush()
  assert seen == [1, 4]
