"""Running a repository's pytest suite in the sandbox, and reading back per-test outcomes.

The repository's text files travel into a cell as the run's files (read-only there; the
run may create new files, e.g. pytest's `tmp_path` under its `TMPDIR`). `main.py` is our
driver (`DRIVER`): it runs `pytest.main` with a plugin that records each test's outcome
and crash message, then writes one line `@@<nonce> {json}` to the stdout it saved before
any repository code ran. pytest and its dependencies are the host's, bound read-only into
the cell (`Cell(modules=...)`); nothing else of the host is visible, and no bytecode or
cache is written.

Repository code is hostile once a model has edited it: it only ever runs here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
from typing import Iterable, Sequence

from evotrainer import sandbox

PREFIX = "@@"
PYTEST_MODULES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "pygments")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".tox", ".eggs", "build", "dist"}
MAX_FILE_BYTES = 1 << 20      # larger files stay out of the cell (none of a test suite)
MESSAGE_CHARS = 500

DRIVER = r'''
import json, os, sys
sys.dont_write_bytecode = True
_req = json.loads(sys.stdin.read())
# Taken before any repository code runs: patching `json.dumps` or `sys.stdout` later
# does not reach the verdict line. (Code that digs into this module, its frames or the
# garbage collector still can: `repo.reaches_for_harness` flags such changes.)
_dumps, _fd = json.dumps, os.dup(1)
import pytest

class _Collect:
  def __init__(self):
    self.results = {}

  def pytest_runtest_logreport(self, report):
    r = self.results.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if report.failed:
      if r["outcome"] in ("passed", "skipped"):
        r["outcome"] = "failed" if report.when == "call" else "error"
        crash = getattr(report.longrepr, "reprcrash", None)
        r["message"] = (crash.message if crash is not None else str(report.longrepr))[:%(chars)d]
    elif report.skipped and r["outcome"] == "passed":
      r["outcome"] = "skipped"

  def pytest_collectreport(self, report):
    if report.failed:
      self.results[report.nodeid or "<collection>"] = {
          "outcome": "error", "message": str(report.longrepr)[-%(chars)d:]}

_c = _Collect()
_code = pytest.main(_req["args"], plugins=[_c])
sys.stdout.flush()
_line = "\n%(prefix)s" + _req["nonce"] + " " + _dumps({"exit": int(_code), "tests": _c.results}) + "\n"
_data = _line.encode()
while _data:
  _data = _data[os.write(_fd, _data):]
''' % {"prefix": PREFIX, "chars": MESSAGE_CHARS}

PYTEST_ARGS = ("-q", "--tb=line", "-p", "no:cacheprovider", "-o", "addopts=", "--color=no")


@dataclasses.dataclass(frozen=True)
class SuiteResult:
  """One run of a suite.

  Attributes:
    outcomes: test node id -> "passed" | "failed" | "error" | "skipped"; a requested test
      that reported nothing (not collected, or the run died) is absent.
    messages: test node id -> the crash message of a failed test (e.g. "assert 3 == 4").
    status: the sandbox run's status; a run that did not end normally reports what it got.
    wall_s: seconds the run took.
    log: the tail of the run's output, for a person reading why a run broke.
  """
  outcomes: dict[str, str]
  messages: dict[str, str]
  status: sandbox.Status
  wall_s: float
  log: str = ""

  def passed(self) -> set[str]:
    return {t for t, o in self.outcomes.items() if o == "passed"}


def repo_files(root: os.PathLike | str) -> dict[str, str]:
  """{relative path: text} of a repository's text files (what a run needs of it)."""
  root = pathlib.Path(root)
  files = {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and
                         not d.endswith(".egg-info"))
    for name in sorted(filenames):
      path = pathlib.Path(dirpath) / name
      if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
        continue
      try:
        files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
      except (UnicodeDecodeError, OSError):
        continue  # binary files: pure-Python suites here need none
  return files


def parse_output(stdout: str, nonce: str) -> dict | None:
  """The driver's record from a run's stdout; None when it did not get that far."""
  tag = PREFIX + nonce + " "
  for line in reversed(stdout.splitlines()):
    if line.startswith(tag):
      try:
        return json.loads(line[len(tag):])
      except ValueError:
        return None
  return None


class SuiteRunner:
  """Runs pytest suites of repository trees in a pool of sandbox cells.

  Args:
    workers: cells run in parallel (at most the cores: EvalPlus's rule).
    timeout_s: wall-clock limit of one suite run.
    limits: per-run rlimits (see `sandbox.Limits`).
  """

  def __init__(self, workers: int | None = None, timeout_s: float = 60.0,
               limits: sandbox.Limits = sandbox.Limits(memory_mb=1024, processes=64),
               cell_limits: sandbox.CellLimits = sandbox.CellLimits(tmp_mb=256)):
    self.timeout_s = timeout_s
    self.limits = limits
    self.pool = sandbox.CellPool(workers or min(2, os.cpu_count() or 1), cell_limits,
                                 modules=PYTEST_MODULES)

  def job(self, files: dict[str, str], tests: Sequence[str],
          timeout_s: float | None = None) -> tuple[dict, str]:
    nonce = secrets.token_hex(8)
    request = {"nonce": nonce, "args": [*PYTEST_ARGS, *tests]}
    return ({"source": DRIVER, "files": files, "stdin": json.dumps(request),
             "timeout_s": timeout_s or self.timeout_s, "limits": self.limits}, nonce)

  def run_many(self, jobs: Iterable[tuple[dict[str, str], Sequence[str]]],
               timeout_s: float | None = None) -> list[SuiteResult]:
    """Runs each (files, test ids or paths) and returns results in order. A run that
    timed out is run once more alone before it counts (EvalPlus's rule: a busy machine
    must not fail a right fix)."""
    prepared = [self.job(files, tests, timeout_s) for files, tests in jobs]
    records = self.pool.map([job for job, _ in prepared])
    for i, record in enumerate(records):
      if record.status is sandbox.Status.TIMEOUT:
        records[i] = self.pool.run(**prepared[i][0])
    return [_result(record, nonce) for record, (_, nonce) in zip(records, prepared)]

  def run(self, files: dict[str, str], tests: Sequence[str],
          timeout_s: float | None = None) -> SuiteResult:
    return self.run_many([(files, tests)], timeout_s)[0]

  def run_program(self, source: str, **kwargs) -> sandbox.RunResult:
    """Runs another program of ours on one of the cells (e.g. the git tool's driver);
    `kwargs` are `sandbox.run_python`'s (stdin, files, timeout_s, limits)."""
    return self.pool.run(source, **kwargs)

  def close(self) -> None:
    self.pool.close()

  def __enter__(self) -> SuiteRunner:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _result(record: sandbox.RunResult, nonce: str) -> SuiteResult:
  parsed = parse_output(record.stdout, nonce) or {"tests": {}}
  tests = parsed["tests"]
  return SuiteResult({t: r["outcome"] for t, r in tests.items()},
                     {t: r["message"] for t, r in tests.items() if r["message"]},
                     record.status, record.wall_s,
                     (record.stdout[-1500:] + record.stderr[-1500:]))
