r"""Replay throughput: episodes/s of `backtest` over a 10k-episode rollout store.

  python bench/replay.py --json out.json

Store (built in a temp dir, as train.py writes it): `--steps` (80) steps of `--groups`
(16) groups x `--group_size` (8) math-like episodes = 10,240 episodes; 10..32-token
completions with float32 log-probs, ~90-character completion text ending in an answer,
task parts `correct` (BC, ~35% of rows, the rate drawn per group so about half the groups
are dead), `format` and `partial` (closeness of a wrong answer, in tenths); per-row
advantages, kept, harness state and meta from the default harness (reward = BC).

Timed (median of `--repeats`): `backtest(store, candidate, baseline)` over every step,
candidate = reward 'correct' + 0.5 * 'partial' with `DropZeroVarianceGroups` and dynamic
sampling, baseline = the default harness. Both harnesses run on every episode, so
`episodes_per_s` counts each stored episode once (the work is two harness passes, the
Parquet read, one episode copy and the comparisons). Also reported: the split of the time
(read + decode, episode copies, the harness passes, of which the JAX advantage estimator)
from one cProfile'd pass, which is slower than the timed ones.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.common import machine, median_time, write_json  # noqa: E402
from evotrainer.harness.filters import DropZeroVarianceGroups, DynamicSampling  # noqa: E402
from evotrainer.harness.pipeline import Harness  # noqa: E402
from evotrainer.harness.replay import backtest  # noqa: E402
from evotrainer.harness.rewards import RewardComposer  # noqa: E402
from evotrainer.rollouts import RolloutStore  # noqa: E402
from evotrainer.types import Episode  # noqa: E402


def make_step(rng: np.random.Generator, version: str, step: int, groups: int,
              group_size: int) -> list[Episode]:
  """One step of math-like episodes, groups contiguous."""
  eps = []
  for g in range(groups):
    a, b = (int(x) for x in rng.integers(0, 1000, 2))
    p = float(rng.choice([0.0, 0.0, 0.2, 0.5, 0.8, 1.0]))  # ~half the groups dead under BC
    for j in range(group_size):
      row = len(eps)
      correct = float(rng.random() < p)
      guess = a + b if correct else a + b + int(rng.integers(-50, 51))
      length = int(rng.integers(10, 33))
      partial = 1.0 if correct else round(float(max(0.0, 1 - abs(guess - a - b) / 50)), 1)
      eps.append(Episode(
          episode_id=f"{version}/{step}/{row}", group_id=g, task_id=f"arith-{a}-{b}",
          prompt=f"What is {a} + {b}?", answer=str(a + b),
          completion=f"Add the ones, carry, then the tens and hundreds: {a} + {b} = "
                     f"{guess}. #### {guess}",
          reward_parts={"correct": correct, "format": 1.0, "partial": partial},
          parsed_answer=str(guess), info={"stop_reason": "eos", "max_new_tokens": 32},
          version=version, step=step, split="train",
          completion_ids=rng.integers(0, 32_000, length).astype(np.int32),
          logprobs=(-rng.exponential(1.0, length)).astype(np.float32)))
  return eps


def build_store(root: str, steps: int, groups: int, group_size: int,
                seed: int = 0) -> RolloutStore:
  """Writes `steps` steps as train.py does: the default harness's outputs and state."""
  rng = np.random.default_rng(seed)
  store = RolloutStore(root)
  harness = Harness()
  for step in range(1, steps + 1):
    eps = make_step(rng, "v0", step, groups, group_size)
    out = harness.process(eps, group_size)
    store.write("v0", step, "train", eps, advantages=out.advantages, kept=out.keep,
                harness_state=out.state,
                meta={"group_size": group_size, "target_groups": groups,
                      "harness": harness.describe()})
  return store


def candidate_harness() -> Harness:
  return Harness(composer=RewardComposer(parts={"correct": 1.0, "partial": 0.5}),
                 group_filters=[DropZeroVarianceGroups()],
                 dynamic_sampling=DynamicSampling())


def profile_split(store: RolloutStore, candidate: Harness, baseline: Harness) -> dict:
  """Seconds per phase of one backtest (cProfile cumulative times; profiling slows it)."""
  prof = cProfile.Profile()
  prof.enable()
  backtest(store, candidate, baseline)
  prof.disable()
  stats = pstats.Stats(prof).stats
  cum = {}
  for (path, _, fn), (_, _, _, ct, _) in stats.items():
    cum[(os.path.basename(path), fn)] = max(cum.get((os.path.basename(path), fn), 0.0), ct)
  pick = {"total": ("replay.py", "backtest"), "read_step": ("store.py", "read_step"),
          "copy_episodes": ("replay.py", "copy_episode"),
          "harness_process": ("pipeline.py", "process"),
          "advantages_jax": ("pipeline.py", "_advantages")}
  return {k: round(cum.get(v, 0.0), 4) for k, v in pick.items()}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--steps", type=int, default=80)
  ap.add_argument("--groups", type=int, default=16)
  ap.add_argument("--group_size", type=int, default=8)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--dir", help="where to build the store (default: the system temp dir)")
  args = ap.parse_args()
  t = time.perf_counter()
  base = tempfile.mkdtemp(dir=args.dir)
  try:
    store = build_store(os.path.join(base, "rollouts"), args.steps, args.groups,
                        args.group_size)
    build_s = time.perf_counter() - t
    candidate, baseline = candidate_harness(), Harness()
    report = backtest(store, candidate, baseline)  # warm-up (jax dispatch caches)
    seconds = median_time(lambda: backtest(store, candidate, baseline), args.repeats)
    split = profile_split(store, candidate, baseline)
  finally:
    shutil.rmtree(base, ignore_errors=True)
  n = args.steps * args.groups * args.group_size
  totals = report.totals
  write_json(args.json, {
      "benchmark": "replay", "episodes": n, "seconds": round(seconds, 4),
      "episodes_per_s": round(n / seconds), "steps": args.steps,
      "group_size": args.group_size, "repeats": args.repeats,
      "backtest": {k: totals[k] for k in ("groups", "dead_before", "dead_after", "rescued",
                                          "pairs", "violations", "ties", "not_trained")},
      "profiled_seconds": split, "build_store_s": round(build_s, 2),
      "wall_s": round(time.perf_counter() - t, 1),
      "load_avg_1m_end": round(os.getloadavg()[0], 2), "machine": machine()})


if __name__ == "__main__":
  main()
