r"""Evolution against a static harness and against recipe search, at equal total RL steps,
scored on the test split.

  python -m bench.evolve_vs_static --json out.json [--seeds 0,1,2,3,4] [--workdir DIR]
  python -m bench.evolve_vs_static --domain code --json out.json

Three arms per seed, all from the same warm start (the cache is shared); for `--domain
code` read code_train.gin / code.gin for math_train.gin / math.gin:
  static         gin/math_train.gin (the fixed default harness) for as many RL steps as an
                 evolution run trains in all: the root's steps plus every branch's, control
                 branches and rejected branches included
  recipe_search  gin/math.gin with `evolve.proposer = 'recipe'`: hyper-parameters only,
                 no diagnostics
  evotrainer     gin/math.gin as shipped (skill-guided proposer, diagnostics, validators)
The evolution's shape (generations, branches, steps) defaults to the domain's gin file.

Each arm is the real command in a child process (`python -m evotrainer.launch`). The
score is the test-split Avg@8 of the final incumbent (static: of the last step), on the
same test problems with the same sampling keys; the arms selected on the validation split
only. `diff_vs_static` is the mean paired difference evotrainer - static with a 95%
interval from a two-level bootstrap (seeds with replacement, then test problems with
replacement inside each seed), so seed-to-seed variation is in the interval.

JSON keys: `split` ('test'), `seeds`, `means` {static, recipe_search, evotrainer} on
test, `validation_means` (the same on validation), `diff_vs_static` and
`diff_recipe_vs_static` {mean, lo, hi}, `selection_gap` (mean over seeds of the
evotrainer incumbent's validation gain over its root minus its test gain), `steps`,
`arms` (per seed), `config`, `packages` (the versions of jax, flax, optax, numpy, ...
found by this process: runs on another install are not comparable step for step),
`wall_s`. A finished arm in `--workdir` is read back, not rerun. `--arms
static,evotrainer` runs a subset (static is always needed); an arm not run has no mean
and no difference (null).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import time
from typing import Sequence

from bench.common import launch_run, packages, paired_interval

ARMS = ("static", "recipe_search", "evotrainer")


@dataclasses.dataclass(frozen=True)
class Domain:
  """What the arms run for one domain: the fixed-harness and the evolution gin files, the
  static arm's evaluation bindings (its validation set as the evolution's), and the
  evolution's shipped shape (generations, branches, branch steps)."""

  static_gin: str
  evolve_gin: str
  static_eval: tuple
  generations: int
  branches: int
  branch_steps: int
  continue_steps: int = 0


DOMAINS = {
    "math": Domain("gin/math_train.gin", "gin/math.gin",
                   ("MathTask.num_validation = 500", "EvalConfig.num_problems = 500"),
                   generations=3, branches=1, branch_steps=25, continue_steps=150),
    "code": Domain("gin/code_train.gin", "gin/code.gin",
                   ("CodeTask.num_validation = 200", "EvalConfig.num_problems = 200",
                    "EvalConfig.num_test = 300"),
                   generations=3, branches=2, branch_steps=30),
}


def arm_launches(domain: str, seed: int, generations: int, branches: int, branch_steps: int,
                 control: bool, extra: Sequence[str] = (), continue_steps: int = 0) -> dict:
  """arm -> (gin files, bindings) of its `evotrainer.launch` command, and the RL steps
  every arm trains (the static arm as many as an evolution run trains in all: the root,
  every branch, control and continuation)."""
  d = DOMAINS[domain]
  total = ((1 + generations * (branches + control)) * branch_steps
           + generations * continue_steps)
  common = [f"run.seed = {seed}", *extra]
  evo = [f"evolve.generations = {generations}", f"evolve.branches = {branches}",
         f"evolve.branch_steps = {branch_steps}", f"evolve.control = {control}",
         f"evolve.continue_steps = {continue_steps}"]
  return {"static": ([d.static_gin], [f"train.steps = {total}",
                                      f"train.eval_every = "
                                      f"{max(branch_steps, continue_steps)}",
                                      *d.static_eval, *common]),
          "recipe_search": ([d.evolve_gin], [*common, *evo, "evolve.proposer = 'recipe'"]),
          "evotrainer": ([d.evolve_gin], [*common, *evo, "evolve.proposer = 'skills'"]),
          "total_steps": total}


def _evolve_arm(summary: dict, wd: pathlib.Path) -> dict:
  versions = {v["id"]: v for v in summary["versions"]}
  inc = versions[summary["incumbent"]]
  test = json.loads((wd / "versions" / inc["id"] / "test_eval.json").read_text())
  trained = [v for v in versions.values() if v.get("heldout_avg8") is not None]
  return {"test": inc["test_avg8"], "validation": inc["validation_avg8"],
          "per_problem": test["per_problem"], "incumbent": inc["id"],
          "kept": [v["id"] for v in versions.values() if v["status"] in ("kept", "merged")],
          "rl_steps": sum(int(v.get("steps") or 0) for v in trained),
          "selection_gap": (summary.get("selection") or {}).get("selection_gap"),
          "wall_s": summary["wall_s"]}


def _static_arm(summary: dict) -> dict:
  avg = next(k for k in summary["final"] if k.startswith("avg"))  # avg8 unless k is set
  return {"test": summary["test"]["final"][avg], "validation": summary["final"][avg],
          "per_problem": summary["test"]["per_problem"], "rl_steps": summary["steps"],
          "wall_s": summary["wall_s"]}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated run seeds")
  ap.add_argument("--workdir", default="runs/bench_evolve_vs_static",
                  help="where the arms' run directories go (reused: a finished arm is "
                       "read back, not rerun)")
  ap.add_argument("--domain", choices=sorted(DOMAINS), default="math")
  ap.add_argument("--generations", type=int, default=None,
                  help="default: the domain's gin file (3)")
  ap.add_argument("--branches", type=int, default=None,
                  help="default: the domain's (math 1, code 2)")
  ap.add_argument("--branch_steps", type=int, default=None,
                  help="default: the domain's gin file (math 25, code 30)")
  ap.add_argument("--continue_steps", type=int, default=None,
                  help="steps of each generation's continuation (default: the domain's "
                       "gin file)")
  ap.add_argument("--no_control", action="store_true",
                  help="evolution arms without control branches (evolve.control = False)")
  ap.add_argument("--gin_bindings", action="append", default=[],
                  help="extra bindings for every arm (e.g. a smaller eval for a smoke run)")
  ap.add_argument("--arms", default=",".join(ARMS),
                  help=f"comma-separated subset of {','.join(ARMS)} (static always runs)")
  ap.add_argument("--json", default=None, help="write the result here too")
  args = ap.parse_args(argv)
  d = DOMAINS[args.domain]
  generations = d.generations if args.generations is None else args.generations
  branches = d.branches if args.branches is None else args.branches
  branch_steps = d.branch_steps if args.branch_steps is None else args.branch_steps
  continue_steps = d.continue_steps if args.continue_steps is None else args.continue_steps
  root = pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(",")]
  control = not args.no_control
  wanted = set(args.arms.split(","))
  unknown = wanted - set(ARMS)
  if unknown:
    ap.error(f"--arms: unknown {sorted(unknown)}; expected a subset of {list(ARMS)}")
  run_arms = [a for a in ARMS if a in wanted | {"static"}]
  arms: dict = {a: {} for a in run_arms}
  t0 = time.time()
  for seed in seeds:
    for arm in sorted(run_arms, key=("evotrainer", "recipe_search", "static").index):
      wd = root / f"{arm}-s{seed}"
      launches = arm_launches(args.domain, seed, generations, branches, branch_steps,
                              control, args.gin_bindings, continue_steps)
      print(f"[bench] seed {seed} {arm} ... ({time.time() - t0:.0f}s so far)", flush=True)
      t = time.time()
      if (wd / "bench_done").exists():
        summary = json.loads((wd / "summary.json").read_text())
      else:
        summary = launch_run(*launches[arm], wd, root / f"{arm}-s{seed}.log")
      (wd / "bench_done").touch()
      arms[arm][seed] = (_static_arm(summary) if arm == "static"
                         else _evolve_arm(summary, wd))
      print(f"[bench] seed {seed} {arm}: test Avg@8 {arms[arm][seed]['test']:.4f} "
            f"(validation {arms[arm][seed]['validation']:.4f}; {time.time() - t:.0f}s)",
            flush=True)
  means = {a: statistics.mean(arms[a][s]["test"] for s in seeds) if a in arms else None
           for a in ARMS}
  vmeans = {a: statistics.mean(arms[a][s]["validation"] for s in seeds) if a in arms
            else None for a in ARMS}
  none = {"mean": None, "lo": None, "hi": None}
  diff = lambda a: none if a not in arms else paired_interval(  # noqa: E731
      [(arms[a][s]["per_problem"], arms["static"][s]["per_problem"]) for s in seeds])
  gaps = [arms["evotrainer"][s]["selection_gap"] for s in seeds
          if "evotrainer" in arms and arms["evotrainer"][s]["selection_gap"] is not None]
  out = {"benchmark": "evolve_vs_static", "split": "test", "seeds": seeds,
         "config": {"domain": args.domain, "generations": generations, "branches": branches,
                    "branch_steps": branch_steps, "continue_steps": continue_steps,
                    "control": control,
                    "extra_bindings": args.gin_bindings},
         "steps": {"total_per_arm": launches["total_steps"]},
         "means": means, "validation_means": vmeans,
         "diff_vs_static": diff("evotrainer"),
         "diff_recipe_vs_static": diff("recipe_search"),
         "selection_gap": statistics.mean(gaps) if gaps else None,
         "arms": {a: {str(s): {k: v for k, v in arms[a][s].items() if k != "per_problem"}
                      for s in seeds} for a in arms},
         "packages": packages(), "wall_s": round(time.time() - t0, 1)}
  print("\narm (test Avg@8)  " + "  ".join(f"seed {s}" for s in seeds) + "   mean")
  for a in arms:
    print(f"{a:17s} " + "  ".join(f"{arms[a][s]['test']:.4f}" for s in seeds)
          + f"   {means[a]:.4f}")
  text = json.dumps(out, indent=2)
  if args.json:
    pathlib.Path(args.json).write_text(text + "\n")
  print(text)
  return out


if __name__ == "__main__":
  main()
