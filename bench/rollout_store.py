r"""Rollout store throughput: episodes/s to write and read back a 10k-episode store.

  python bench/rollout_store.py --json out.json

Store: `--episodes` (10,000) math-like episodes in steps of `--per_step` (1,000; one
Parquet file per step, as a run writes them): ~32-token completions (uniform 16..48) with
float32 log-probs, a ~60-character prompt, ~100-character completion text, three reward
parts, a small info dict (stop reason, a tool call on every 4th), per-row advantage and
kept. Measured (median of `--repeats`, fresh store directory per write, page cache warm
for reads):

  write          `RolloutStore.write` for every step: table build + zstd Parquet + fsync
                 + atomic publish
  read_episodes  `RolloutStore.read()`: every file read, checked, decoded to `Episode`s
  read_columns   `RolloutStore.read_columns()`: numpy columns (padded ids / log-probs,
                 one float column per reward part), the replay path
  read_table     `RolloutStore.read_table()`: Arrow only
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.common import machine, median_time, write_json  # noqa: E402
from evotrainer.rollouts import RolloutStore  # noqa: E402
from evotrainer.types import Episode  # noqa: E402


def make_steps(n: int, per_step: int, seed: int = 0) -> list[list[Episode]]:
  rng = np.random.default_rng(seed)
  steps = []
  for step in range(0, n // per_step):
    eps = []
    for i in range(per_step):
      length = int(rng.integers(16, 49))
      a, b = rng.integers(0, 1000, 2)
      correct = float(rng.random() < 0.4)
      eps.append(Episode(
          episode_id=f"v0/{step}/{i}", group_id=i // 8, task_id=f"arith-{step}-{i // 8}",
          prompt=f"What is {a} + {b}? Think step by step, then answer in \\boxed{{}}.",
          completion=f"We add {a} and {b}. The ones digits first, then carry. "
                     f"So the result is \\boxed{{{a + b}}}.",
          answer=str(a + b),
          reward_parts={"correct": correct, "format": 1.0, "overlong": -0.01 * (length > 40)},
          reward=correct, parsed_answer=str(a + b),
          info={"stop_reason": "eos"} if i % 4 else
          {"stop_reason": "eos", "tool_calls": [{"name": "python", "ok": True}]},
          version="v0", step=step, split="train",
          completion_ids=rng.integers(0, 32_000, length).astype(np.int32),
          logprobs=(-rng.exponential(1.0, length)).astype(np.float32), truncated=False))
    steps.append(eps)
  return steps


def bench_roundtrip(n: int = 10_000, per_step: int = 1_000, repeats: int = 3,
                    root: str | None = None) -> dict:
  """Times write / read of an n-episode store; returns episodes/s and sizes."""
  steps = make_steps(n, per_step)
  rng = np.random.default_rng(1)
  extras = [dict(advantages=rng.normal(size=len(s)).astype(np.float32),
                 kept=rng.random(len(s)) < 0.8, harness_state={"ema": 0.1, "step": k})
            for k, s in enumerate(steps)]
  base = tempfile.mkdtemp(dir=root)
  count = iter(range(10**6))
  try:
    def write():
      store = RolloutStore(os.path.join(base, f"w{next(count)}"))
      for k, (eps, extra) in enumerate(zip(steps, extras)):
        store.write("v0", k, "train", eps, **extra)
      return store

    t_write = median_time(write, repeats)
    store = write()
    size = sum(os.path.getsize(store.path("v0", k, "train")) for k in range(len(steps)))
    t_episodes = median_time(store.read, repeats)
    t_columns = median_time(store.read_columns, repeats)
    t_table = median_time(store.read_table, repeats)
    assert len(store.read()) == n and not store.problems
  finally:
    shutil.rmtree(base, ignore_errors=True)
  tokens = sum(len(e.completion_ids) for s in steps for e in s)
  return {"episodes": n, "files": len(steps), "completion_tokens": tokens,
          "store_bytes": size, "bytes_per_episode": round(size / n, 1),
          "write_episodes_per_s": round(n / t_write),
          "read_episodes_per_s": round(n / t_episodes),
          "read_columns_episodes_per_s": round(n / t_columns),
          "read_table_episodes_per_s": round(n / t_table),
          "seconds": {"write": round(t_write, 4), "read_episodes": round(t_episodes, 4),
                      "read_columns": round(t_columns, 4), "read_table": round(t_table, 4)}}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--episodes", type=int, default=10_000)
  ap.add_argument("--per_step", type=int, default=1_000)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--dir", help="where to build the store (default: the system temp dir)")
  args = ap.parse_args()
  t = time.perf_counter()
  result = bench_roundtrip(args.episodes, args.per_step, args.repeats, args.dir)
  write_json(args.json, {"benchmark": "rollout_store", **result,
                         "wall_s": round(time.perf_counter() - t, 1),
                         "load_avg_1m_end": round(os.getloadavg()[0], 2),
                         "machine": machine()})


if __name__ == "__main__":
  main()
