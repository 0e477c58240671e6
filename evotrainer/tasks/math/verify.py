"""The math verifier: math-verify run safely in worker processes.

Equivalence is decided by math-verify (`verify(parse(gold), parse(pred))`), which can
hang on adversarial input and arms `signal.alarm` for its own timeouts (main thread
only). `VerifierPool` therefore runs it in worker processes with its timeouts off and
enforces a per-item wall-clock timeout from the parent: a worker that hangs is killed
and replaced, one that crashes is replaced, and the item is scored as a failure with a
reason. Plain numbers never reach a worker: `answers.fast_verdict` compares them exactly
in-process (answer extraction and the cost bounds on model text live in
tasks/answers.py).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import logging
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from typing import Callable, Optional, Sequence

from evotrainer import lifetime
from evotrainer.tasks.answers import VerifyResult, fast_verdict

log = logging.getLogger(__name__)


def _latex(s: str) -> str:
  """math-verify reads LaTeX only inside `$...$` or a box; plain `x^2+1` needs wrapping."""
  return s if ("$" in s or "\\boxed" in s) else f"${s}$"


def math_verify(gold: str, pred: str) -> tuple[bool, str]:
  """The default verify function (runs in a worker): math-verify with its timeouts off."""
  from math_verify import parse, verify  # pylint: disable=import-outside-toplevel
  g = parse(_latex(gold), parsing_timeout=None)
  if not g:
    return False, "unparsable gold"
  p = parse(_latex(pred), parsing_timeout=None)
  if not p:
    return False, "unparsable answer"
  ok = bool(verify(g, p, timeout_seconds=None))
  return ok, "match" if ok else "mismatch"


def _resolve(path: str) -> Callable[[str, str], object]:
  """`"package.module:function"` → the function."""
  module, _, name = path.partition(":")
  return getattr(importlib.import_module(module), name)


def _worker_main(fd: int, verify_fn: str, parent_pid: int) -> None:
  """Worker loop on socket `fd`: says "ready", then answers `(gold, pred)` pairs.

  Started as `python -c` by `VerifierPool`; replies `(correct, reason)` per pair.
  """
  # Die with the parent even while hung inside verify_fn.
  if not lifetime.die_with_parent(parent_pid, signal.SIGKILL):
    return
  logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" noise
  conn = mp_connection.Connection(fd)
  try:
    fn = _resolve(verify_fn)
  except Exception as e:  # pylint: disable=broad-except
    conn.send(("fatal", f"{type(e).__name__}: {e}"))
    return
  conn.send(("ready", ""))
  while True:
    try:
      msg = conn.recv()
    except (EOFError, OSError):
      return
    if msg is None:
      return
    gold, pred = msg
    try:
      out = fn(gold, pred)
      if isinstance(out, tuple):
        correct, reason = bool(out[0]), str(out[1])
      else:
        correct, reason = bool(out), "match" if out else "mismatch"
    except Exception as e:  # pylint: disable=broad-except
      correct, reason = False, f"error: {type(e).__name__}: {e}"[:300]
    conn.send((correct, reason))


@dataclasses.dataclass
class _Worker:
  proc: subprocess.Popen
  conn: mp_connection.Connection
  state: str  # "starting" | "idle" | "busy"
  deadline: float  # start-up deadline while starting, item deadline while busy
  item: int = -1


def _stop(workers: list[_Worker]) -> None:
  """Ends worker processes: a polite `None`, then kill. Also runs at interpreter exit."""
  for w in workers:
    try:
      w.conn.send(None)
    except (OSError, ValueError):
      pass
  for w in workers:
    try:
      w.proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
      w.proc.kill()
      w.proc.wait()
    w.conn.close()
  workers.clear()


class VerifierPool:
  """Worker processes that run a verify function with a per-item timeout.

  Usage:
    with VerifierPool(num_workers=2, timeout_s=5.0) as pool:
      results = pool.verify_many([("0.5", "1/2"), ("19", "19.0")])

  Workers are fresh `python -c` interpreters that import only this module and
  `verify_fn` (about 0.5 s to start), talking over a socket pair. Not
  `multiprocessing` spawn/forkserver: those re-import the parent's `__main__` in every
  worker, i.e. the whole trainer with JAX, and fail outright for a script read from
  stdin. Workers start lazily, when the first item needs one (plain numbers never do).

  An item whose worker runs past `timeout_s` is scored `VerifyResult(False, "timeout")`;
  the worker is killed and a replacement started, and the pool keeps serving. A worker
  that dies on an item scores it `"error: worker died ..."`. Workers die with the thread
  that created the pool (PR_SET_PDEATHSIG) and at interpreter exit. Calls are
  serialized by a lock.

  Args:
    num_workers: worker processes.
    timeout_s: wall-clock limit per item, counted from when a worker receives it.
    verify_fn: `"module:function"` taking `(gold, pred)` and returning a bool or
      `(bool, reason)`; imported inside the worker (the parent's `sys.path` is passed
      on). Tests inject a hanging one here.
    startup_timeout_s: limit for a worker to import `verify_fn` and report ready.
  """

  def __init__(self, num_workers: int = 1, timeout_s: float = 5.0,
               verify_fn: str = "evotrainer.tasks.math.verify:math_verify",
               startup_timeout_s: float = 60.0):
    if num_workers < 1:
      raise ValueError(f"VerifierPool.num_workers must be >= 1, got {num_workers}")
    if timeout_s <= 0:
      raise ValueError(f"VerifierPool.timeout_s must be > 0, got {timeout_s}")
    module, _, name = verify_fn.partition(":")
    if not module or not name:
      raise ValueError(f"VerifierPool.verify_fn must look like 'package.module:function', "
                       f"got {verify_fn!r}")
    self.num_workers = num_workers
    self.timeout_s = timeout_s
    self.verify_fn = verify_fn
    self.startup_timeout_s = startup_timeout_s
    self.stats = collections.Counter()  # reasons seen, for logging and diagnostics
    self._workers: list[_Worker] = []
    self._lock = threading.Lock()
    self._closed = False
    self._finalizer = weakref.finalize(self, _stop, self._workers)

  # ------------------------------------------------------------------ public API

  def verify(self, gold: str, pred: Optional[str]) -> VerifyResult:
    """One pair; see `verify_many`."""
    return self.verify_many([(gold, pred)])[0]

  def verify_many(self, pairs: Sequence[tuple[str, Optional[str]]]) -> list[VerifyResult]:
    """Verdicts for `(gold, pred)` pairs, in order; `pred=None` means no answer."""
    results: list[Optional[VerifyResult]] = [fast_verdict(g, p) for g, p in pairs]
    todo = collections.deque(i for i, r in enumerate(results) if r is None)
    if todo:
      with self._lock:
        if self._closed:
          raise RuntimeError("VerifierPool is closed")
        try:
          self._run(pairs, todo, results)
        except BaseException:
          # A busy worker would answer an item of this call during the next one.
          for w in list(self._workers):
            self._kill(w)
          raise
    with self._lock:
      self.stats.update(r.reason for r in results)
    return results  # type: ignore[return-value]

  @property
  def live_workers(self) -> int:
    """Worker processes running now (0 until an item first needs one); a healthy pool
    that has started keeps exactly `num_workers` between calls."""
    with self._lock:
      return sum(w.proc.poll() is None for w in self._workers)

  def close(self) -> None:
    """Stops every worker; the pool cannot be used afterwards."""
    with self._lock:
      self._closed = True
      self._finalizer()

  def __enter__(self) -> "VerifierPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ------------------------------------------------------------------ internals

  def _start_worker(self) -> _Worker:
    parent, child = socket.socketpair()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path
                                        if isinstance(p, str))
    code = (f"from {__name__} import _worker_main; "
            f"_worker_main({child.fileno()}, {self.verify_fn!r}, {os.getpid()})")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child.fileno(),),
                            env=env, stdin=subprocess.DEVNULL)
    child.close()
    return _Worker(proc, mp_connection.Connection(parent.detach()), "starting",
                   time.monotonic() + self.startup_timeout_s)

  def _kill(self, w: _Worker) -> None:
    """Kills a worker and forgets it."""
    w.proc.kill()
    w.proc.wait()
    w.conn.close()
    self._workers.remove(w)

  def _retire(self, w: _Worker) -> None:
    """Kills a worker (hung, crashed or broken) and starts its replacement."""
    slot = self._workers.index(w)
    self._kill(w)
    self._workers.insert(slot, self._start_worker())

  def _run(self, pairs, todo: collections.deque, results: list) -> None:
    while len(self._workers) < self.num_workers:
      self._workers.append(self._start_worker())
    while todo or any(w.state == "busy" for w in self._workers):
      for w in list(self._workers):
        if w.state == "idle" and todo:
          i = todo.popleft()
          try:
            w.conn.send(tuple(pairs[i]))
          except (OSError, ValueError):  # died while idle: not the item's fault
            todo.appendleft(i)
            self._retire(w)
            continue
          w.state, w.item = "busy", i
          w.deadline = time.monotonic() + self.timeout_s
      waiting = [w for w in self._workers if w.state in ("starting", "busy")]
      wait_s = max(0.0, min(w.deadline for w in waiting) - time.monotonic())
      ready = set(mp_connection.wait([w.conn for w in waiting], timeout=wait_s))
      for w in waiting:
        if w.conn in ready:
          self._receive(w, results)
      now = time.monotonic()
      for w in list(self._workers):
        if w.state == "busy" and now > w.deadline:
          results[w.item] = VerifyResult(False, "timeout")
          log.warning("verifier: item timed out after %.1fs (gold=%r); worker replaced",
                      self.timeout_s, pairs[w.item][0])
          self._retire(w)
        elif w.state == "starting" and now > w.deadline:
          self._kill(w)
          raise RuntimeError(f"verifier worker did not start within "
                             f"{self.startup_timeout_s}s (verify_fn={self.verify_fn!r})")

  def _receive(self, w: _Worker, results: list) -> None:
    try:
      tag, detail = w.conn.recv()
    except (EOFError, OSError):
      code = w.proc.wait()
      if w.state == "busy":
        results[w.item] = VerifyResult(False, f"error: worker died (exit code {code})")
        self._retire(w)
        return
      self._kill(w)
      raise RuntimeError(f"verifier worker died while starting (exit code {code}); "
                         f"verify_fn={self.verify_fn!r}")
    if w.state == "starting":
      if tag == "fatal":
        self._kill(w)
        raise ValueError(f"VerifierPool.verify_fn={self.verify_fn!r} cannot be loaded "
                         f"in a worker: {detail}")
      w.state = "idle"
      return
    results[w.item] = VerifyResult(bool(tag), str(detail))
    w.state, w.item = "idle", -1
