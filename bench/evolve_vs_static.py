r"""Evolution against a static harness and against recipe search, at equal total RL steps.

  python bench/evolve_vs_static.py --json out.json [--seeds 0,1,2] [--workdir runs/bench_evs]

Three arms per seed, all from the same warm start (the cache is shared):
  static         gin/math_train.gin (the fixed default harness) for as many RL steps as an
                 evolution run trains in all: the root's steps plus every branch's,
                 rejected branches included; held-out evaluation every `branch_steps`
  recipe_search  gin/math.gin with `evolve.proposer = 'recipe'`: the same number of
                 branches, hyper-parameters only, no diagnostics
  evotrainer     gin/math.gin as shipped (skill-guided proposer, diagnostics, validators)

Each arm is the real command in a child process (`python -m evotrainer.launch`). The
score is the held-out Avg@8 of the final incumbent (static: of the last step), on the
same held-out problems (EvalConfig of math.gin). The JSON also compares at equal lineage
depth: the static run's held-out score at the step count of the evotrainer incumbent's
lineage (root + kept ancestors, `branch_steps` each).

Output: {"arms": {arm: {seed: {...}}}, "means": {"static", "recipe_search",
"evotrainer"}, "equal_depth": {...}, "steps": {...}} — printed and saved with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
ARMS = ("static", "recipe_search", "evotrainer")


def _launch(gin_files: list, bindings: list, workdir: pathlib.Path, log: pathlib.Path) -> dict:
  cmd = [sys.executable, "-m", "evotrainer.launch", f"--workdir={workdir}",
         *(f"--gin_file={g}" for g in gin_files), *(f"--gin_bindings={b}" for b in bindings)]
  env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", ""))
  with open(log, "w") as f:
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
  return json.loads((workdir / "summary.json").read_text())


def _evolve_steps(summary: dict, branch_steps: int) -> tuple[int, int, float]:
  """(total RL steps, steps along the incumbent's lineage, incumbent held-out Avg@8)."""
  versions = {v["id"]: v for v in summary["versions"]}
  trained = [v for v in versions.values() if v["heldout_avg8"] is not None]
  depth, vid = 0, summary["incumbent"]
  while vid is not None:
    depth += 1
    vid = versions[vid]["parent"]
  return (len(trained) * branch_steps, depth * branch_steps,
          versions[summary["incumbent"]]["heldout_avg8"])


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
  ap.add_argument("--workdir", default="runs/bench_evolve_vs_static",
                  help="where the arms' run directories go (reused: a finished arm is "
                       "read back, not rerun)")
  ap.add_argument("--generations", type=int, default=4)
  ap.add_argument("--branches", type=int, default=2)
  ap.add_argument("--branch_steps", type=int, default=50)
  ap.add_argument("--gin_bindings", action="append", default=[],
                  help="extra bindings for every arm (e.g. a smaller eval for a smoke run)")
  ap.add_argument("--json", default=None, help="write the result here too")
  args = ap.parse_args(argv)
  root = pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(",")]
  evo = [f"evolve.generations = {args.generations}", f"evolve.branches = {args.branches}",
         f"evolve.branch_steps = {args.branch_steps}"]
  total = (1 + args.generations * args.branches) * args.branch_steps
  arms = {a: {} for a in ARMS}
  equal_depth = {}
  t0 = time.time()
  for seed in seeds:
    for arm in ("evotrainer", "recipe_search", "static"):
      wd = root / f"{arm}-s{seed}"
      done = wd / "summary.json"
      extra = [f"run.seed = {seed}", *args.gin_bindings]
      print(f"[bench] seed {seed} {arm} ... ({time.time() - t0:.0f}s so far)", flush=True)
      t = time.time()
      if done.exists() and json.loads(done.read_text()).get("mode") in ("train", "evolve") \
          and (wd / "bench_done").exists():
        summary = json.loads(done.read_text())
      elif arm == "static":
        summary = _launch(["gin/math_train.gin"],
                          [f"train.steps = {total}", f"train.eval_every = {args.branch_steps}",
                           "EvalConfig.num_problems = 200", *extra], wd, root / f"{arm}-s{seed}.log")
      else:
        proposer = "recipe" if arm == "recipe_search" else "skills"
        summary = _launch(["gin/math.gin"], [*extra, *evo, f"evolve.proposer = '{proposer}'"],
                          wd, root / f"{arm}-s{seed}.log")
      (wd / "bench_done").touch()
      if arm == "static":
        avg = next(k for k in summary["final"] if k.startswith("avg"))  # avg8 unless k is set
        curve = {h["step"]: h[avg] for h in summary["history"]}
        arms[arm][seed] = {"heldout_avg8": summary["final"][avg], "rl_steps": summary["steps"],
                           "initial_avg8": summary["initial"][avg], "curve": curve,
                           "wall_s": summary["wall_s"]}
      else:
        steps, depth, score = _evolve_steps(summary, args.branch_steps)
        kept = [v["id"] for v in summary["versions"] if v["status"] in ("kept", "merged")]
        arms[arm][seed] = {"heldout_avg8": score, "rl_steps": steps, "lineage_steps": depth,
                           "incumbent": summary["incumbent"], "kept": kept,
                           "root_avg8": summary["versions"][0]["heldout_avg8"],
                           "wall_s": summary["wall_s"]}
      print(f"[bench] seed {seed} {arm}: held-out Avg@8 {arms[arm][seed]['heldout_avg8']:.4f} "
            f"({time.time() - t:.0f}s)", flush=True)
    depth = arms["evotrainer"][seed]["lineage_steps"]
    curve = arms["static"][seed]["curve"]
    at = max((s for s in curve if s <= depth), default=None)
    equal_depth[seed] = {"steps": depth, "static": curve.get(at),
                         "evotrainer": arms["evotrainer"][seed]["heldout_avg8"]}
  means = {a: statistics.mean(arms[a][s]["heldout_avg8"] for s in seeds) for a in ARMS}
  depth_means = {a: statistics.mean(equal_depth[s][a] for s in seeds
                                    if equal_depth[s][a] is not None)
                 for a in ("static", "evotrainer")}
  out = {"benchmark": "evolve_vs_static", "seeds": seeds,
         "config": {"generations": args.generations, "branches": args.branches,
                    "branch_steps": args.branch_steps, "extra_bindings": args.gin_bindings},
         "steps": {"total_per_arm": total},
         "arms": {a: {str(s): v for s, v in arms[a].items()} for a in ARMS},
         "means": means, "equal_depth": {"per_seed": {str(s): v for s, v in equal_depth.items()},
                                         "means": depth_means},
         "evotrainer_beats_both": means["evotrainer"] > max(means["static"],
                                                             means["recipe_search"]),
         "wall_s": round(time.time() - t0, 1)}
  print("\narm            " + "  ".join(f"seed {s}" for s in seeds) + "   mean")
  for a in ARMS:
    print(f"{a:14s} " + "  ".join(f"{arms[a][s]['heldout_avg8']:.4f}" for s in seeds)
          + f"   {means[a]:.4f}")
  text = json.dumps(out, indent=2)
  if args.json:
    pathlib.Path(args.json).write_text(text + "\n")
  print(text)
  return out


if __name__ == "__main__":
  main()
