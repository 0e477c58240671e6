"""Shared benchmark helpers: the machine's f32 matmul peak, timing, JSON output."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from evotrainer.evolution.trainer import run_child

REPO = pathlib.Path(__file__).resolve().parents[1]


def matmul_peak_gflops(n: int = 1024, repeats: int = 10, dtype: str = "float32") -> float:
  """Best GFLOP/s of a jitted n x n x n matmul of `dtype` operands (f32 by default) on the
  default device; for a 16-bit dtype, the better of a 16-bit and a float32 result (the
  model's dots accumulate 16-bit operands in float32: `low_precision_matmul`, which on an
  AVX-512-bf16 CPU runs at twice the rate of a bf16 result)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(dtype))
  results = [None] if jnp.dtype(dtype).itemsize > 2 else [None, jnp.float32]
  best = min(best_seconds(jax.jit(functools.partial(jnp.matmul, preferred_element_type=r)),
                          a, b, repeats=repeats) for r in results)
  return 2 * n**3 / best / 1e9


def best_seconds(f, *args, repeats: int = 10) -> float:
  """The best time of `repeats` calls of `f(*args)` after a first, untimed one."""
  jax.block_until_ready(f(*args))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    best = min(best, time.perf_counter() - t)
  return best


def median_time(fn: Callable[[], object], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return _median(times)


def _median(times: Sequence[float]) -> float:
  """The middle of `times` (the upper of the two middles of an even count)."""
  return sorted(times)[len(times) // 2]


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float, object]:
  """`timed_each` of one function: (median seconds of `repeats` calls after the first, the
  first call's seconds, the first call's result)."""
  return timed_each({"fn": fn}, repeats)["fn"]


def timed_each(fns: Mapping[str, Callable[[], object]], repeats: int) -> dict:
  """{name: (median seconds of `repeats` calls after the first, the first call's seconds,
  the first call's result)}: a steady state apart from compilation and warm-up. Every
  function's first call comes before any timed one, and the timed
  calls go round by round, each round starting one function later: a function timed
  first in its process no longer carries the process's warm-up alone (on the sampler
  the first mode timed ran slower than the same mode timed second)."""
  names = list(fns)
  firsts, outs = {}, {}
  for name in names:
    t = time.perf_counter()
    outs[name] = fns[name]()
    firsts[name] = time.perf_counter() - t
  times: dict = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      t = time.perf_counter()
      fns[name]()
      times[name].append(time.perf_counter() - t)
  return {name: (_median(times[name]), firsts[name], outs[name]) for name in names}


# The packages whose versions change the numbers: a fresh install can move an RL run's
# trajectory (the code benchmark's static arm moved by up to 0.36 test Avg@8 per seed
# between two installs), so every benchmark JSON says which it ran on.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "orbax-checkpoint")


def packages(extra: Sequence[str] = ()) -> dict:
  """{package: installed version, or None} for PACKAGES and `extra` (e.g. the package that
  holds a pretrained model's file), and the Python version."""
  out = {"python": platform.python_version()}
  for name in (*PACKAGES, *extra):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def machine(extra: Sequence[str] = ()) -> dict:
  """The platform, the CPU's model and count, jax and its devices, and `packages(extra)`.
  Timings of two machines with the same platform string can differ threefold: the CPU's
  model tells them apart."""
  return {"platform": platform.platform(), "cpu": cpu_model(), "cpus": os.cpu_count(),
          "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
          "packages": packages(extra)}


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
  """The first 'model name' of `cpuinfo` (Linux), else `platform.processor()` or None."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or None


def uptime() -> str:
  """`uptime`'s line: the clock and the load averages, for a log or a result."""
  return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def load_json(path) -> dict:
  """The JSON object in `path`, or {} when there is no such file."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def save_json(path, payload: dict) -> None:
  """Writes the whole file through a temporary one (an interrupted run loses nothing)."""
  os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
  tmp = os.fspath(path) + ".tmp"
  with open(tmp, "w") as f:
    f.write(json.dumps(payload, indent=2) + "\n")
  os.replace(tmp, path)


def merge_json(path, keys: dict) -> None:
  """Sets `keys` in the JSON object in `path` (created when absent), keeping its other
  keys: how a benchmark files its summary figures into a shared results file."""
  payload = load_json(path)
  payload.update(keys)
  save_json(path, payload)


def write_json(path: str | None, payload: dict) -> None:
  text = json.dumps(payload, indent=2)
  print(text)
  if path:
    with open(path, "w") as f:
      f.write(text + "\n")


def launch_run(gin_files: list, bindings: list, workdir: pathlib.Path,
               log: pathlib.Path) -> dict:
  """`python -m evotrainer.launch` in a child process (its output to `log`, its progress
  line echoed every `HEARTBEAT_S`); the run's summary.json. Raises with the log's path
  when the run fails. The child ends with this process (`lifetime`): a killed benchmark
  leaves no run going on in its workdir."""
  cmd = [sys.executable, "-m", "evotrainer.launch", f"--workdir={workdir}",
         *(f"--gin_file={g}" for g in gin_files), *(f"--gin_bindings={b}" for b in bindings)]
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", ""))
  rc = run_logged(cmd, log, env=env, label=workdir.name)
  if rc != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({rc}); see {log}")
  return json.loads((workdir / "summary.json").read_text())


HEARTBEAT_S = 300.0  # how often a benchmark says what its running child is doing


def run_logged(cmd: Sequence[str], log: pathlib.Path, *, env: Mapping[str, str],
               label: str, heartbeat_s: float = HEARTBEAT_S) -> int:
  """Runs `cmd` in the repository as the controller runs a branch (`run_child`: the
  command line and output appended to `log`, the child ended with this process) and
  every `heartbeat_s` prints `[bench] <label>: <minutes> min, <the log's last line>`, so a
  child that runs for an hour shows where it is. Returns its exit code."""
  start = time.time()

  def beat() -> bool:
    print(f"[bench] {label}: {(time.time() - start) / 60:.0f} min, {last_line(log)}",
          flush=True)
    return False  # never stops the child

  return run_child(cmd, log, env=dict(env), timeout_s=math.inf, stop=beat,
                   poll_s=heartbeat_s, cwd=REPO)


def last_line(path: pathlib.Path, tail_bytes: int = 4096) -> str:
  """The last non-blank line of a log, a progress bar's latest redraw (after its last
  carriage return) included; '' for an empty or missing log."""
  try:
    with open(path, "rb") as f:
      f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
      text = f.read().decode(errors="replace")
  except FileNotFoundError:
    return ""
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  return lines[-1] if lines else ""


LAUNCH_FILE = "bench_launch.json"  # a benchmark run directory's command (`run_or_read`)
INCLUDE = re.compile(r"^include\s+['\"]([^'\"]+)['\"]", re.M)


def gin_digest(gin_files: Sequence[str]) -> dict:
  """{gin file: sha256 of its bindings} for `gin_files` and every file they include
  (found next to the including file, else under the repository's gin/): what a run's
  command means beyond its file names. Comments and blank lines are left out, so
  rewording a comment does not invalidate a stored run."""
  out: dict = {}
  todo = [(REPO / g, g) for g in gin_files]
  while todo:
    path, name = todo.pop()
    if name in out:
      continue
    if not path.is_file():
      raise FileNotFoundError(f"gin file {name} (looked for {path})")
    text = path.read_text()
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and
             not ln.lstrip().startswith("#")]
    out[name] = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    for inc in INCLUDE.findall(text):
      near = path.parent / inc
      todo.append((near, str(near.relative_to(REPO))) if near.is_file()
                  else (REPO / "gin" / inc, f"gin/{inc}"))
  return dict(sorted(out.items()))


def run_or_read(gin_files: list, bindings: list, wd: pathlib.Path,
                log: pathlib.Path) -> dict:
  """The summary.json of the finished run in `wd` (its `bench_done` marker), else the
  run's, launched now (`launch_run`). The command is kept in `wd/bench_launch.json`, with
  the `gin_digest` of its gin files; a run directory that holds another command, or the
  same files with other bindings in them, is refused (its result would not be this
  one's). A record written before digests were kept is compared on the command alone."""
  record = {"gin_files": list(gin_files), "bindings": list(bindings),
            "gin_sha256": gin_digest(gin_files)}
  kept = wd / LAUNCH_FILE
  if kept.exists():
    stored = json.loads(kept.read_text())
    mine = {k: v for k, v in record.items() if k in stored}
    if stored != mine:
      changed = sorted(f for f, h in record["gin_sha256"].items()
                       if stored.get("gin_sha256", {}).get(f) != h)
      what = (f"gin files changed since: {', '.join(changed)}" if "gin_sha256" in stored
              and stored["gin_files"] == mine["gin_files"] and
              stored["bindings"] == mine["bindings"] else "another command")
      raise RuntimeError(f"{wd} holds a run of {what} ({kept}); use another --workdir, "
                         f"or remove that run directory to rerun it")
  if (wd / "bench_done").exists():
    return json.loads((wd / "summary.json").read_text())
  wd.mkdir(parents=True, exist_ok=True)
  kept.write_text(json.dumps(record, indent=2) + "\n")
  summary = launch_run(gin_files, bindings, wd, log)
  (wd / "bench_done").touch()
  return summary


def paired_interval(per_seed: Sequence[tuple[Mapping, Mapping]], n: int = 2000, seed: int = 0,
                    alpha: float = 0.05) -> dict:
  """{mean, lo, hi} of mean(a - b) over (a, b) = ({problem: score}, ...) pairs, one per
  seed: the mean over seeds of each seed's mean paired difference, and a two-level
  bootstrap interval (seeds, then problems inside each seed, with replacement)."""
  diffs = [np.array([a[k] - b[k] for k in sorted(set(a) & set(b))], np.float64)
           for a, b in per_seed]
  diffs = [d for d in diffs if len(d)]
  if not diffs:
    return {"mean": None, "lo": None, "hi": None}
  rng = np.random.default_rng(seed)
  means = np.empty(n)
  for i in range(n):
    picked = rng.integers(0, len(diffs), len(diffs))
    means[i] = np.mean([diffs[s][rng.integers(0, len(diffs[s]), len(diffs[s]))].mean()
                        for s in picked])
  lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
  return {"mean": float(np.mean([d.mean() for d in diffs])), "lo": float(lo), "hi": float(hi)}
