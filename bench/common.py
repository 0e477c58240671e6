"""Shared benchmark helpers: the machine's f32 matmul peak, timing, JSON output."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from typing import Callable

import jax
import jax.numpy as jnp


def matmul_peak_gflops(n: int = 1024, repeats: int = 10) -> float:
  """Best f32 GFLOP/s of a jitted n x n x n matmul on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.dot)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best / 1e9


def median_time(fn: Callable[[], object], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  times.sort()
  return times[len(times) // 2]


# The packages whose versions change the numbers: a fresh install can move an RL run's
# trajectory (the code benchmark's static arm moved by up to 0.36 test Avg@8 per seed
# between two installs), so every benchmark JSON says which it ran on.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "orbax-checkpoint")


def packages() -> dict:
  """{package: installed version, or None} for PACKAGES, and the Python version."""
  out = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def machine() -> dict:
  return {"platform": platform.platform(), "cpus": os.cpu_count(),
          "jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
          "packages": packages()}


def write_json(path: str | None, payload: dict) -> None:
  text = json.dumps(payload, indent=2)
  print(text)
  if path:
    with open(path, "w") as f:
      f.write(text + "\n")
