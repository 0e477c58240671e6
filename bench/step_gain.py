"""What unchanged RL steps gain on validation, and the skills' credit net of it.

A branch measured against its parent (a run with `evolve.control = False`) trained the
branch's steps more than the parent did, so its effect holds what those steps gain with
the harness unchanged. This reads finished fixed-harness runs (their `metrics.jsonl`,
whose `eval/avg8` rows are validation evaluations every `train.eval_every` steps on the
problems and keys every version of an evolution is evaluated on; it trains nothing) and
measures that gain per window of `--window` steps from `--from_step` on (where the
evolution's branches start: after the root's steps). Then, for each skill of `--pool`,
its effect in `--domain` measured against the parent, pooled (`stats.pooled_effect`),
minus that gain: the part of the credit the steps alone do not explain.

  python -m bench.step_gain --run /path/to/static-s11 --run /path/to/static-s12 \\
      --pool bench/results/skills_pool_code_smol --domain code \\
      --json bench/results/step_gain_code_real.json

JSON keys: `window`, `from_step`, `pool`, `domain`, `runs` {name: [{from, to, gain}]}, `step_gain` {mean,
lo, hi, n_windows, n_runs} (95% interval by a bootstrap over runs), `skills` {name:
{`against_parent` {mean, lo, hi, n}, `net_of_steps` {mean, lo, hi}, `beyond_steps`,
`replications` {the same three without the keeps that learned the skill}}}.
The gain is measured under the runs' harnesses, not each branch's parent's: an estimate.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
from typing import Mapping, Sequence

import numpy as np

from bench.common import write_json
from evotrainer.evolution.skills import SkillLibrary

Z = 1.96


def _parse(argv) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--run", action="append", default=[], required=True,
                  help="a finished fixed-harness run directory holding metrics.jsonl "
                       "(repeat it); named by the directory's name")
  ap.add_argument("--pool", default=None, help="a skills directory to credit net of steps")
  ap.add_argument("--domain", default="code", help="the domain of the pool's effects")
  ap.add_argument("--window", type=int, default=8, help="steps per window (a branch's)")
  ap.add_argument("--from_step", type=int, default=8,
                  help="the first window's start (the root's steps)")
  ap.add_argument("--bootstrap_n", type=int, default=10000)
  ap.add_argument("--json", default=None, help="write the result here")
  args = ap.parse_args(argv)
  for path in args.run:
    if not (pathlib.Path(path) / "metrics.jsonl").is_file():
      ap.error(f"--run {path!r}: expected a run directory holding metrics.jsonl")
  names = [pathlib.Path(p).name for p in args.run]
  if len(set(names)) != len(names):
    ap.error(f"--run: two runs share a directory name: {sorted(names)}")
  if args.window < 1 or args.from_step < 0 or args.bootstrap_n < 1:
    ap.error("--window >= 1, --from_step >= 0 and --bootstrap_n >= 1 expected")
  return args


def evaluations(metrics: pathlib.Path) -> dict:
  """{step: validation avg8} from a run's metrics.jsonl (its `eval/avg8` rows)."""
  out = {}
  for n, line in enumerate(metrics.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{metrics}:{n}: not JSON ({e})") from None
    if "eval/avg8" in row:
      out[int(row["step"])] = float(row["eval/avg8"])
  return out


def windows(evals: Mapping[int, float], window: int, from_step: int) -> list:
  """[{from, to, gain}] for each pair of evaluations `window` steps apart, from
  `from_step` on."""
  return [{"from": s, "to": s + window, "gain": evals[s + window] - evals[s]}
          for s in sorted(evals) if s >= from_step and s + window in evals]


def step_gain(runs: Mapping[str, Sequence[Mapping]], n: int, seed: int = 0) -> dict:
  """The mean gain over every window, with a 95% percentile interval from resampling
  whole runs (a run's windows share its lineage)."""
  gains = [[w["gain"] for w in ws] for ws in runs.values() if ws]
  if not gains:
    raise ValueError("no run has two evaluations a window apart")
  flat = [g for gs in gains for g in gs]
  rng = np.random.default_rng(seed)
  means = []
  for _ in range(n):
    pick = rng.integers(len(gains), size=len(gains))
    means.append(np.mean([g for i in pick for g in gains[i]]))
  lo, hi = np.percentile(means, [2.5, 97.5])
  return {"mean": float(np.mean(flat)), "lo": float(lo), "hi": float(hi),
          "n_windows": len(flat), "n_runs": len(gains)}


def net_of_steps(effect: Mapping, gain: Mapping) -> dict:
  """A pooled effect minus the step gain; the two standard errors add in quadrature."""
  se = math.hypot((effect["hi"] - effect["lo"]) / (2 * Z), (gain["hi"] - gain["lo"]) / (2 * Z))
  mean = effect["mean"] - gain["mean"]
  return {"mean": mean, "lo": mean - Z * se, "hi": mean + Z * se}


def credit(pool: pathlib.Path, domain: str, gain: Mapping) -> dict:
  """Each skill with effects in `domain` measured against the parent: their pooled
  effect and that effect net of the step gain, all of them and (`replications`) without
  the keeps that learned the skill (`Skill.selected`: recorded because they were good)."""
  out = {}
  for skill in SkillLibrary(pool):
    effect = skill.effect_in(domain, ("parent",))
    if effect["n"]:
      out[skill.name] = _credited(effect, gain)
      replicated = skill.effect_in(domain, ("parent",), discoveries=False)
      out[skill.name]["replications"] = (_credited(replicated, gain) if replicated["n"]
                                         else {"against_parent": replicated})
  return out


def _credited(effect: Mapping, gain: Mapping) -> dict:
  net = net_of_steps(effect, gain)
  return {"against_parent": effect, "net_of_steps": net, "beyond_steps": net["lo"] > 0}


def main(argv=None) -> dict:
  args = _parse(argv)
  runs = {pathlib.Path(p).name: windows(evaluations(pathlib.Path(p) / "metrics.jsonl"),
                                        args.window, args.from_step) for p in args.run}
  gain = step_gain(runs, args.bootstrap_n)
  print(f"[step_gain] {gain['n_windows']} windows of {args.window} steps over "
        f"{gain['n_runs']} runs: {gain['mean']:+.4f} [{gain['lo']:+.4f}, {gain['hi']:+.4f}]")
  out = {"benchmark": "step_gain", "window": args.window, "from_step": args.from_step,
         "runs": runs, "step_gain": gain}
  if args.pool:
    out["pool"], out["domain"] = args.pool, args.domain
    out["skills"] = credit(pathlib.Path(args.pool), args.domain, gain)
  write_json(args.json, out)
  return out


if __name__ == "__main__":
  main()
