r"""Re-scores the arms of a finished `bench/evolve_vs_static.py` benchmark on test problems
it never scored.

  python -m bench.rescore --bench bench/results/evolve_vs_static_code_real_replicated.json \
      --runs /path/to/its/workdir --num_test 64 --workdir runs/rescore \
      --json bench/results/evolve_vs_static_code_real_replicated_rescored.json

A benchmark scores each arm on the first `EvalConfig.num_test` problems of the test split
(16 in gin/code_smol.gin). Once the same problems have served several benchmarks, and a
method was revised after their figures, they are no longer untouched. This scores each
arm's final model again, with the run's own operative config, on the first `--num_test`
problems of the same split (`run.mode = 'test'`, evotrainer/modes/scoring.py): the first
ones are the benchmark's, with the same sampling keys, so they must come out as the
benchmark reported them (`reproduced`), and the ones after them are fresh: no run, rule or
choice has seen them. The comparison is reported on the fresh problems.

The models: an evolution arm's incumbent (`versions/<id>/model` and its
`operative_config.gin`), a fixed-harness arm's last checkpoint (its run directory), and
`base`, the policy before RL, built from the static run's config (scored once: its
figures do not depend on the run seed). An arm that is another arm's run
(`same_run_as`) is that arm's figures.

Resumable per (arm, seed): each re-scoring is a run directory under `--workdir`
(`bench.common.run_or_read`), read back once finished; the JSON is rewritten after each.

JSON keys: `benchmark` ('rescore'), `split` ('test'), `source` (the benchmark JSON),
`seeds`, `model`, `num_test`, `problems` {`benchmark`, `fresh`}, `means_fresh` {arm:
Avg@8 over the fresh problems, mean over seeds}, `means_benchmark` (the same on the
benchmark's problems, re-scored), `diff_vs_static` (evotrainer - static on the fresh
problems, {mean, lo, hi}: two-level paired bootstrap, seeds then problems),
`diff_vs_static_adopted`, `diffs_vs_static` {arm: ...}, `reproduced` {arm: {seed:
{equal, n, max_abs_diff}}} (the benchmark's problems, re-scored against its JSON), `arms`
{arm: {seed: {per_problem (every problem), model, wall_s}}}, `packages`, `wall_s`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from bench.common import load_json, packages, paired_interval, run_or_read, save_json

EVOLUTION_ARMS = ("recipe_search", "evotrainer")


def _args(argv) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--bench", required=True, help="the evolve_vs_static JSON to re-score")
  p.add_argument("--runs", required=True, help="that benchmark's --workdir (its runs)")
  p.add_argument("--num_test", type=int, default=64, help="test problems scored in all")
  p.add_argument("--workdir", default="runs/rescore", help="where the re-scorings run")
  p.add_argument("--json", help="output JSON")
  return p.parse_args(argv)


def model_of(arm: str, seed: str, figures: dict, runs: pathlib.Path) -> tuple:
  """(the run directory whose operative config scores it, the model: None for base) of
  one arm and seed."""
  if arm == "base":
    return runs / f"static-s{seed}", None
  run = runs / f"{arm}-s{seed}"
  if arm in EVOLUTION_ARMS:
    run = run / "versions" / figures["incumbent"]
  return run, run


def launch(run: pathlib.Path, model, num_test: int) -> tuple:
  """(gin files, bindings) of the `test`-mode run that re-scores it."""
  config = run / "operative_config.gin"
  if not config.is_file():
    raise FileNotFoundError(f"{config}: the run to re-score has no operative config")
  bindings = ["run.mode = 'test'", f"EvalConfig.num_test = {num_test}"]
  if model is not None:
    bindings.append(f"test.model = '{model}'")
  return [str(config)], bindings


def reproduced(scored: dict, reported: dict) -> dict:
  """How many of the benchmark's problems came out with the score it reported."""
  diffs = [abs(scored[k] - v) for k, v in reported.items() if k in scored]
  return {"equal": sum(d == 0 for d in diffs), "n": len(reported),
          "max_abs_diff": max(diffs, default=None)}


def summarize(arms: dict, seeds: list, benchmark: set) -> dict:
  """Means and differences over seeds, on the fresh problems and on the benchmark's."""
  def only(pp, fresh):
    return {k: v for k, v in pp.items() if (k not in benchmark) == fresh}

  def mean(arm, fresh):
    return statistics.mean(statistics.mean(only(arms[arm][s]["per_problem"], fresh).values())
                           for s in seeds)

  def diff(a, b="static"):
    if a not in arms or b not in arms:
      return {"mean": None, "lo": None, "hi": None}
    return paired_interval([(only(arms[a][s]["per_problem"], True),
                             only(arms[b][s]["per_problem"], True)) for s in seeds])

  return {"means_fresh": {a: mean(a, True) for a in arms},
          "means_benchmark": {a: mean(a, False) for a in arms},
          "diff_vs_static": diff("evotrainer"),
          "diff_vs_static_adopted": diff("evotrainer", "static_adopted"),
          "diffs_vs_static": {a: diff(a) for a in arms if a != "static"}}


def main(argv=None) -> dict:
  args = _args(argv)
  bench = load_json(args.bench)
  if not bench.get("arms") or not bench.get("seeds"):
    raise SystemExit(f"{args.bench}: not an evolve_vs_static result (no arms or seeds)")
  runs, root = pathlib.Path(args.runs).resolve(), pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  seeds = [str(s) for s in bench["seeds"]]
  benchmark = set(bench["arms"]["static"][seeds[0]]["per_problem"])
  if args.num_test <= len(benchmark):
    raise SystemExit(f"--num_test {args.num_test}: the benchmark scored {len(benchmark)} "
                     f"test problems already; ask for more")
  t0, arms, checks = time.time(), {}, {}
  # base first (the policy before RL), an arm that is another's run last
  order = sorted(bench["arms"], key=lambda a: (a != "base", a != "static", any(
      f.get("same_run_as") for f in bench["arms"][a].values())))
  for arm in order:
    by_seed = bench["arms"][arm]
    arms[arm], checks[arm] = {}, {}
    for seed in seeds:
      arms[arm][seed] = rescored(arm, seed, by_seed[seed], arms, runs, root, args.num_test)
      checks[arm][seed] = reproduced(arms[arm][seed]["per_problem"],
                                     by_seed[seed]["per_problem"])
      print(f"[rescore] {arm} seed {seed}: {checks[arm][seed]['equal']} of "
            f"{checks[arm][seed]['n']} benchmark problems reproduced", flush=True)
    out = {"benchmark": "rescore", "split": "test", "source": args.bench, "seeds": seeds,
           "model": bench.get("model"), "num_test": args.num_test,
           "problems": {"benchmark": len(benchmark),
                        "fresh": args.num_test - len(benchmark)},
           **(summarize(arms, seeds, benchmark) if "static" in arms else {}),
           "reproduced": checks, "arms": arms, "packages": packages(),
           "wall_s": round(time.time() - t0, 1)}
    if args.json:
      save_json(args.json, out)
  print(json.dumps({k: out[k] for k in out if k not in ("arms", "packages")}, indent=2))
  return out


def rescored(arm: str, seed: str, figures: dict, done: dict, runs: pathlib.Path,
             root: pathlib.Path, num_test: int) -> dict:
  """{per_problem, model, wall_s} of one arm and seed: its `test`-mode run, or the arm it
  is the same run as, or (base) the first seed's."""
  if figures.get("same_run_as") and arm != "base":
    return done[figures["same_run_as"]][seed]
  if arm == "base" and done.get("base"):  # the policy before RL: one for every seed
    return next(iter(done["base"].values()))
  run, model = model_of(arm, seed, figures, runs)
  name = f"{arm}-s{seed}"
  summary = run_or_read(*launch(run, model, num_test), root / name, root / f"{name}.log")
  return {"per_problem": summary["test"]["per_problem"], "model": str(model),
          "wall_s": summary["wall_s"]}


if __name__ == "__main__":
  main()
