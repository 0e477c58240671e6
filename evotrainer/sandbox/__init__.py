"""Run untrusted Python in an isolated cell.

The one entry point is `run_python`:

    from evotrainer import sandbox
    result = sandbox.run_python("print(input()[::-1])", stdin="abc", timeout_s=5)
    result.status, result.stdout      # Status.OK, 'cba\\n'

For many programs, open a `Cell` once and pass it (`cell=`): the cell's worker is
already running, so a run costs a fork instead of a jail start. `CellPool` spreads runs
over one cell per core. Nothing here imports JAX: sandbox runs happen on the host.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
from typing import Iterable, Sequence

from evotrainer.sandbox.cell import Cell, SandboxError, SandboxUnavailable, check_namespaces
from evotrainer.sandbox.records import CellLimits, Limits, RunResult, Status

__all__ = ["run_python", "Cell", "CellPool", "Limits", "CellLimits", "RunResult", "Status",
           "SandboxError", "SandboxUnavailable", "check_namespaces"]


def run_python(source: str, *, stdin: str = "", argv: Sequence[str] = (),
               files: dict[str, str] | None = None, timeout_s: float = 10.0,
               limits: Limits = Limits(), cell: Cell | None = None,
               rlimits_only: bool = False) -> RunResult:
  """Runs a Python program in a sandbox cell and returns its record.

  The program runs as `python main.py *argv` in a fresh private directory (its cwd,
  `HOME` and `TMPDIR`) holding `main.py` and `files`, all read-only to it; it may create
  new files there. Inside the cell: no network (loopback only), its own PID namespace
  and /proc, no host environment variables, no home, `/usr` and the interpreter
  read-only, an unprivileged uid with no-new-privs, and `limits` as rlimits. When the
  call returns, no process of the run is left.

  Args:
    source: the program's text.
    stdin: its standard input.
    argv: its arguments (`sys.argv[1:]`).
    files: extra files, {relative path: text}, placed next to `main.py`.
    timeout_s: wall-clock limit; past it every process of the run is killed and the
      status is `Status.TIMEOUT`.
    limits: per-run rlimits and the output cap (see `Limits`).
    cell: a cell to run in (fast: reuses its worker); None starts and closes one.
    rlimits_only: with `cell=None`, allow running without namespaces where they are
      unavailable (warns on every run; unsafe for hostile code). Without it, a machine
      without namespaces raises `SandboxUnavailable` naming what is missing.

  Returns:
    A `RunResult`: status, exit code, stdout, stderr, truncation flags, wall and CPU
    seconds.
  """
  if cell is not None:
    return cell.run(source, stdin=stdin, argv=argv, files=files, timeout_s=timeout_s,
                    limits=limits)
  with Cell(rlimits_only=rlimits_only) as own:
    return own.run(source, stdin=stdin, argv=argv, files=files, timeout_s=timeout_s,
                   limits=limits)


class CellPool:
  """`size` cells (default: one per core, EvalPlus's parallelism rule) used by threads.

  `map` runs keyword-argument dicts of `run_python` (less `cell`) and returns records in
  order. `modules`: see `Cell`. Close it (or use `with`) to end the cells.
  """

  def __init__(self, size: int | None = None, cell_limits: CellLimits = CellLimits(), *,
               rlimits_only: bool = False, modules: Sequence[str] = ()):
    self.size = size or os.cpu_count() or 1
    self._cells = [Cell(cell_limits, rlimits_only=rlimits_only, modules=tuple(modules))
                   for _ in range(self.size)]
    self._free: queue.Queue[Cell] = queue.Queue()
    for cell in self._cells:
      self._free.put(cell)
    self._executor = concurrent.futures.ThreadPoolExecutor(self.size)

  def run(self, source: str, **kwargs) -> RunResult:
    cell = self._free.get()
    try:
      return run_python(source, cell=cell, **kwargs)
    finally:
      self._free.put(cell)

  def map(self, jobs: Iterable[dict]) -> list[RunResult]:
    futures = [self._executor.submit(self.run, **job) for job in jobs]
    return [f.result() for f in futures]

  def close(self) -> None:
    self._executor.shutdown()
    for cell in self._cells:
      cell.close()

  def __enter__(self) -> CellPool:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
