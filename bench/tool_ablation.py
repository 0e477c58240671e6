"""Where a kept calculator's gain comes from: the tool, or the policy trained with it.

Reads a finished `bench/evolve_vs_static.py` math run (its `--workdir` and `--json`) and,
for each seed whose evotrainer lineage kept `MathTask.calculator = True`, scores three
more policies on the same test problems with the same keys (`run.mode = 'test'`, the evotrainer
arm's gin file and the lineage's bindings, so sampling is the lineage's):

  root_with_tool          the root version's policy (no RL under the tool) with the tool
                          on: what the tool gives by itself
  incumbent_without_tool  the final incumbent's policy with the tool off: what the
                          evolved policy does on its own
  incumbent_with_tool     the final incumbent as the benchmark scored it, scored again
                          on the current code: `reproduced` counts the test problems
                          whose score equals the benchmark's (a check of this pipeline)

and reports, with the two-level bootstrap interval of bench/evolve_vs_static.py (seeds,
then problems), `tool_alone` (root_with_tool - the root's own test score),
`rl_with_tool` (incumbent_with_tool - root_with_tool: both scored on the current code),
`policy_alone_vs_static` (incumbent_without_tool - static) and `rescored_vs_static`
(incumbent_with_tool - static: the benchmark's comparison with the incumbent scored on the
current code).

  python bench/tool_ablation.py --workdir <the benchmark's workdir> \\
      --from_json bench/results/evolve_vs_static_math_real_calc.json \\
      --json bench/results/tool_ablation_math_real.json

Resumable per (arm, seed): a finished test run in `--workdir`/tool_ablation is read back.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.common import load_json, packages, paired_interval, run_or_read, uptime, write_json
from evotrainer.evolution.intervention import format_value

GIN = "gin/math_smol.gin"  # the evotrainer arm's (bench/evolve_arms.py, math_smol)
TOOL = "MathTask.calculator"
ARMS = ("root_with_tool", "incumbent_without_tool", "incumbent_with_tool")


def lineage(ledger: pathlib.Path, vid: str) -> list:
  """[(version, {binding: value})] from the root to `vid`, each version's own bindings."""
  from evotrainer.evolution.ledger.core import Ledger
  with Ledger(ledger) as db:
    return [(v.id, dict(v.bindings)) for v in reversed(db.lineage(vid))]


def lineage_bindings(chain: list) -> dict:
  """{binding: value} the last version of `chain` runs under (later versions win)."""
  values: dict = {}
  for _, bindings in chain:
    values.update(bindings)
  return values


def test_run(wd: pathlib.Path, seed: int, model: pathlib.Path, values: dict,
             tool: bool) -> dict:
  """{'test', 'per_problem'} of `model` scored on the test split under `values`."""
  bindings = [f"{k} = {format_value(v)}" for k, v in sorted(values.items()) if k != TOOL]
  bindings += [f"{TOOL} = {tool}", "run.mode = 'test'", f"run.seed = {seed}",
               f"test.model = '{model}'"]
  run_or_read([GIN], bindings, wd, wd.with_suffix(".log"))
  scores = json.loads((wd / "test_eval.json").read_text())
  return {"test": scores["final"]["avg8"], "per_problem": scores["per_problem"]}


def seed_figures(root: pathlib.Path, seed: int, arms: dict) -> dict | None:
  """The three ablation runs of one seed (None when its lineage did not keep the tool)."""
  run = root / f"evotrainer-s{seed}"
  if not (run / "summary.json").is_file() or str(seed) not in arms.get("evotrainer", {}):
    raise SystemExit(f"error: seed {seed}: no finished evotrainer run {run} in --workdir, "
                     f"or no evotrainer figures for it in --from_json")
  summary = json.loads((run / "summary.json").read_text())
  chain = lineage(run / "ledger.sqlite", summary["incumbent"])
  values = lineage_bindings(chain)
  if values.get(TOOL) is not True:
    print(f"[tool_ablation] seed {seed}: the lineage did not keep the tool", flush=True)
    return None
  out = {"incumbent": summary["incumbent"],
         "root_test": next(v["test_avg8"] for v in summary["versions"] if v["id"] == "v0"),
         "root_per_problem": json.loads((run / "versions" / "v0" / "test_eval.json")
                                        .read_text())["per_problem"]}
  where = root / "tool_ablation"
  out["root_with_tool"] = test_run(where / f"root_with_tool-s{seed}", seed,
                                   run / "versions" / "v0" / "model",
                                   lineage_bindings(chain[:1]), True)
  out["incumbent_without_tool"] = test_run(
      where / f"incumbent_without_tool-s{seed}", seed,
      run / "versions" / summary["incumbent"] / "model", values, False)
  out["incumbent_with_tool"] = test_run(
      where / f"incumbent_with_tool-s{seed}", seed,
      run / "versions" / summary["incumbent"] / "model", values, True)
  for arm in ("evotrainer", "static"):
    out[arm] = {"test": arms[arm][str(seed)]["test"],
                "per_problem": arms[arm][str(seed)]["per_problem"]}
  print(f"[tool_ablation] seed {seed}: root {out['root_test']:.4f}, root with the tool "
        f"{out['root_with_tool']['test']:.4f}, evotrainer {out['evotrainer']['test']:.4f}, "
        f"incumbent without the tool {out['incumbent_without_tool']['test']:.4f}, static "
        f"{out['static']['test']:.4f}", flush=True)
  return out


def report(per_seed: dict) -> dict:
  def diff(a, b):
    return paired_interval([(f[a]["per_problem"] if a != "root" else f["root_per_problem"],
                             f[b]["per_problem"] if b != "root" else f["root_per_problem"])
                            for f in per_seed.values()])

  def mean(arm):
    vals = [f["root_test"] if arm == "root" else f[arm]["test"] for f in per_seed.values()]
    return sum(vals) / len(vals) if vals else None

  def reproduced(f):
    mine, theirs = f["incumbent_with_tool"]["per_problem"], f["evotrainer"]["per_problem"]
    return {"equal": sum(mine.get(k) == v for k, v in theirs.items()), "n": len(theirs)}

  return {"means": {a: mean(a) for a in ("root", *ARMS, "evotrainer", "static")},
          "reproduced": {str(s): reproduced(f) for s, f in per_seed.items()},
          "tool_alone": diff("root_with_tool", "root"),
          "rl_with_tool": diff("incumbent_with_tool", "root_with_tool"),
          "policy_alone_vs_static": diff("incumbent_without_tool", "static"),
          "rescored_vs_static": diff("incumbent_with_tool", "static")}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True, type=pathlib.Path,
                  help="the evolve_vs_static --workdir of the math run")
  ap.add_argument("--from_json", required=True,
                  help="that run's evolve_vs_static JSON (static and evotrainer scores)")
  ap.add_argument("--seeds", default=None, help="comma list (default: the JSON's seeds)")
  ap.add_argument("--json", default=None, help="write the figures here")
  args = ap.parse_args(argv)
  bench = load_json(args.from_json)
  if not bench:
    raise SystemExit(f"error: --from_json {args.from_json}: no such benchmark JSON")
  seeds = ([int(s) for s in args.seeds.split(",")] if args.seeds else bench["seeds"])
  start = time.time()
  per_seed = {}
  for seed in seeds:
    figures = seed_figures(args.workdir, seed, bench["arms"])
    if figures is not None:
      per_seed[seed] = figures
  out = {"benchmark": "tool_ablation", "split": "test", "from": args.from_json,
         "seeds": list(per_seed), "seeds_without_tool": [s for s in seeds if s not in per_seed],
         **report(per_seed), "per_seed": per_seed, "packages": packages(),
         "load": uptime(), "wall_s": round(time.time() - start, 1)}
  print(json.dumps({k: out[k] for k in ("seeds", "means", "reproduced", "tool_alone",
                                         "rl_with_tool", "policy_alone_vs_static",
                                         "rescored_vs_static")},
                   indent=1))
  write_json(args.json, out)
  return out


if __name__ == "__main__":
  main()
