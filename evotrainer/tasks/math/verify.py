"""Answer extraction from completions, and math-verify run safely in worker processes.

Extraction tries, in order: `<answer>...</answer>` tags (what our prompts ask for),
`\\boxed{...}` (balanced braces, the last one), GSM8K's `#### N`, then the last number
in the text. `candidate_answers` lists every distinct answer a completion *marks*
(tags, boxes, `####`), so a diagnostic can catch a policy that spams several answers
hoping one is graded.

Equivalence is decided by math-verify (`verify(parse(gold), parse(pred))`), which can
hang on adversarial input and arms `signal.alarm` for its own timeouts (main thread
only). `VerifierPool` therefore runs it in worker processes with its timeouts off and
enforces a per-item wall-clock timeout from the parent: a worker that hangs is killed
and replaced, one that crashes is replaced, and the item is scored as a failure with a
reason. Plain numbers never reach a worker: they are compared exactly in-process.

Completions are untrusted input. Every function here takes any string (any length, lone
surrogates, NUL, unbalanced markup) without raising, and its cost is linear in the text:
a completion over `MAX_TEXT_CHARS` is not read at all (no answer, no candidates, no
numbers), and an extracted answer over `MAX_ANSWER_CHARS` characters or nested deeper
than `MAX_ANSWER_DEPTH` brackets is refused before any parse (`malformed`), so neither
Python's 4300-digit int conversion limit nor a nested `\\frac` reaches a parser.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import logging
import multiprocessing.connection as mp_connection
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from fractions import Fraction
from typing import Callable, Optional, Sequence

log = logging.getLogger(__name__)

# Extraction methods, in the order they are tried.
METHODS = ("answer_tag", "boxed", "hashes", "last_number")

# Cost bounds on model text, checked before any parse (see the module docstring). A
# completion of MAX_TEXT_CHARS is ~100k tokens, beyond any sampler budget here; answers
# are short (MATH golds are under 200 characters), and numbers stay far below 4300 digits.
MAX_TEXT_CHARS = 400_000
MAX_ANSWER_CHARS = 1_000
MAX_ANSWER_DEPTH = 16

_OPEN_TAG = re.compile(r"<answer>", re.I)
_CLOSE_TAG = re.compile(r"</answer>", re.I)
_BRACES = re.compile(r"[{}]")
_BRACKETS = re.compile(r"[(){}\[\]]")
_TOKEN = re.compile(r"[^\s$]+")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# A number not glued to a preceding word/digit (so "7-3" yields "3", not "-3").
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[+-]?\.\d+")


def answer_tag(answer: str) -> str:
  """The answer in the format our prompts ask for: `<answer>{answer}</answer>`."""
  return f"<answer>{answer}</answer>"


def too_long(text: str) -> bool:
  """Whether a completion is over `MAX_TEXT_CHARS` and so is not read (a cost bound)."""
  return len(text) > MAX_TEXT_CHARS


def _closing_braces(text: str) -> dict[int, int]:
  """{index of a `{`: index of its matching `}`} for every balanced pair, in one pass."""
  pairs, opened = {}, []
  for m in _BRACES.finditer(text):
    if m.group() == "{":
      opened.append(m.start())
    elif opened:
      pairs[opened.pop()] = m.start()
  return pairs


def boxed_contents(text: str) -> list[str]:
  """Contents of every `\\boxed{...}` / `\\fbox{...}` in order, braces balanced.

  `\\boxed 5` (no braces) yields `5`; an unclosed box (a truncated completion) is skipped.
  Linear in the text: the braces are matched once, not rescanned per box.
  """
  out, pairs = [], None
  for m in _BOXED.finditer(text):
    i = m.end()
    if i < len(text) and text[i] == "{":
      pairs = _closing_braces(text) if pairs is None else pairs
      if i in pairs:
        out.append(text[i + 1:pairs[i]])
    else:
      token = _TOKEN.match(text, i)
      if token:
        out.append(token.group(0))
  return out


def _tagged(text: str) -> list[str]:
  """Contents of every `<answer>...</answer>` (case-insensitive, shortest), in one pass.

  What `re.findall(r"<answer>(.*?)</answer>", text, re.S | re.I)` returns, without its
  quadratic cost when many tags are left open.
  """
  out, pos = [], 0
  while (opened := _OPEN_TAG.search(text, pos)) is not None:
    closed = _CLOSE_TAG.search(text, opened.end())
    if closed is None:  # no closing tag after this one, so none after a later one either
      break
    out.append(text[opened.end():closed.start()])
    pos = closed.end()
  return out


def _clean(candidate: str) -> Optional[str]:
  """Strips what surrounds an answer: spaces, `$...$`, an inner box, a final period."""
  s = candidate.strip()
  inner = boxed_contents(s)
  if inner:
    s = inner[-1].strip()
  s = s.strip("$").strip()
  if s.endswith(".") and not _PLAIN_NUMBER.fullmatch(s):
    s = s[:-1].rstrip()
  return s or None


def _marked(text: str, method: str) -> list[str]:
  """All cleaned answers the given marker method finds, in text order."""
  if method == "answer_tag":
    raw = _tagged(text)
  elif method == "boxed":
    raw = boxed_contents(text)
  elif method == "hashes":
    raw = _HASHES.findall(text)
  elif method == "last_number":
    raw = _NUMBER.findall(text)
  else:
    raise ValueError(f"unknown extraction method {method!r}; expected one of {METHODS}")
  return [c for c in (_clean(r) for r in raw) if c is not None]


def extract_answer(text: str,
                   methods: Sequence[str] = METHODS) -> tuple[Optional[str], str]:
  """The final answer of a completion and how it was found.

  Args:
    text: the completion.
    methods: extraction methods to try, in order (a subset of `METHODS`).

  Returns:
    `(answer, how)`: the last answer found by the first method that finds any, and that
    method's name; `(None, "none")` if nothing is found or the text is `too_long`.
  """
  if too_long(text):
    return None, "none"
  for method in methods:
    found = _marked(text, method)
    if found:
      return found[-1], method
  return None, "none"


def _squash(answer: str) -> str:
  """The answer without spaces and surrounding `$`."""
  return re.sub(r"\s+", "", answer.strip().strip("$"))


def normalize_answer(answer: str) -> str:
  """A canonical form for telling candidates apart: plain numbers by value, else squashed."""
  number = parse_number(answer)
  return str(number) if number is not None else _squash(answer)


def candidate_answers(text: str) -> list[str]:
  """Distinct answers the completion marks (tags, boxes, `####`), in first-seen order.

  A box inside answer tags is one candidate, not two. Unmarked text contributes its last
  number only when nothing is marked (so plain reasoning numbers are not candidates).
  A `too_long` text has none.
  """
  if too_long(text):
    return []
  seen: dict[str, str] = {}
  for method in ("answer_tag", "boxed", "hashes"):
    for c in _marked(text, method):
      seen.setdefault(normalize_answer(c), c)
  if not seen:
    last, _ = extract_answer(text, ("last_number",))
    if last is not None:
      seen[normalize_answer(last)] = last
  return list(seen.values())


def numbers_in(text: str) -> list[str]:
  """Every number written in the text, in order (marked as an answer or not); none in a
  `too_long` text."""
  return [] if too_long(text) else _NUMBER.findall(text)


def count_candidates(text: str) -> int:
  """How many distinct answers a completion marks (see `candidate_answers`)."""
  return len(candidate_answers(text))


def parse_number(text: Optional[str]) -> Optional[Fraction]:
  """The exact value of a plain decimal number (`"19"`, `"-0.5"`, `"1,000"`), else None.

  None as well for a text over `MAX_ANSWER_CHARS` (a cost bound that also keeps Python's
  4300-digit int conversion limit out of reach).
  """
  if text is None or len(text) > MAX_ANSWER_CHARS:
    return None
  s = text.strip().replace(" ", "")
  if not _PLAIN_NUMBER.fullmatch(s):
    return None
  return Fraction(s.replace(",", ""))


# --------------------------------------------------------------------------- verifying


@dataclasses.dataclass(frozen=True)
class VerifyResult:
  """Whether a predicted answer equals the gold one, and why that verdict.

  `reason` is one of "numeric match", "numeric mismatch", "exact match", "match",
  "mismatch", "no answer", "timeout", "malformed: ..." (refused unread, see `malformed`),
  or "error: ..." (exception or dead worker), or a reason the verify function returned.
  """

  correct: bool
  reason: str


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


def nesting_depth(text: str) -> int:
  """The deepest nesting of brackets `()[]{}` in the text (unbalanced closers ignored)."""
  depth = deepest = 0
  for m in _BRACKETS.finditer(text):
    if m.group() in "([{":
      depth += 1
      deepest = max(deepest, depth)
    elif depth:
      depth -= 1
  return deepest


def malformed(answer: str) -> Optional[str]:
  """Why an extracted answer is refused before any parse, or None when it may be read.

  Refused: over `MAX_ANSWER_CHARS` characters, or nested deeper than `MAX_ANSWER_DEPTH`
  (a `\\frac` inside a `\\frac` ... that would cost math-verify its whole timeout).
  """
  if len(answer) > MAX_ANSWER_CHARS:
    return f"malformed: answer of {len(answer)} characters (> {MAX_ANSWER_CHARS})"
  depth = nesting_depth(answer)
  if depth > MAX_ANSWER_DEPTH:
    return f"malformed: answer nested {depth} deep (> {MAX_ANSWER_DEPTH})"
  return None


def fast_verdict(gold: str, pred: Optional[str]) -> Optional[VerifyResult]:
  """A verdict without math-verify when one is certain, else None.

  Plain numbers are compared exactly (`"19"` == `"19.0"`); identical strings (spacing
  and `$` aside) match; a `malformed` answer is wrong unread.
  """
  if pred is None or not pred.strip():
    return VerifyResult(False, "no answer")
  refused = malformed(pred)
  if refused is not None:
    return VerifyResult(False, refused)
  g, p = parse_number(gold), parse_number(pred)
  if g is not None and p is not None:
    return VerifyResult(g == p, "numeric match" if g == p else "numeric mismatch")
  if _squash(gold) == _squash(pred):
    return VerifyResult(True, "exact match")
  return None


def _resolve(path: str) -> Callable[[str, str], object]:
  """`"package.module:function"` → the function."""
  module, _, name = path.partition(":")
  return getattr(importlib.import_module(module), name)


def _worker_main(fd: int, verify_fn: str, parent_pid: int) -> None:
  """Worker loop on socket `fd`: says "ready", then answers `(gold, pred)` pairs.

  Started as `python -c` by `VerifierPool`; replies `(correct, reason)` per pair.
  """
  try:  # Linux: die with the parent even while hung inside verify_fn.
    import ctypes  # pylint: disable=import-outside-toplevel
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except Exception:  # pylint: disable=broad-except
    pass
  if os.getppid() != parent_pid:  # the parent died before prctl took effect
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
               verify_fn: str = "evotrainer.tasks.verify:math_verify",
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
