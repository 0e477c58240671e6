"""A worker thread for host-side bookkeeping a training step need not wait for."""

from __future__ import annotations

import queue
import threading
from typing import Callable, Optional


class Background:
  """One worker thread for host-side bookkeeping that the next RL step need not wait for
  (diagnostics, the rollout store): it overlaps with the jitted step, which releases the
  GIL. `flush()` waits for everything queued and re-raises the first error; the trainer
  flushes before every checkpoint, so a checkpointed step always has its rollouts."""

  def __init__(self):
    self._queue = queue.Queue()
    self._error: Optional[BaseException] = None
    self._thread = threading.Thread(target=self._work, daemon=True, name="train-background")
    self._thread.start()

  def _work(self) -> None:
    while True:
      fn = self._queue.get()
      try:
        if self._error is None:
          fn()
      except BaseException as e:  # surfaced by flush()
        self._error = e
      finally:
        self._queue.task_done()

  def submit(self, fn: Callable[[], None]) -> None:
    if self._error is not None:
      self.flush()
    self._queue.put(fn)

  def flush(self) -> None:
    self._queue.join()
    if self._error is not None:
      error, self._error = self._error, None
      raise RuntimeError(f"background bookkeeping failed: {error}") from error


__all__ = ["Background"]
