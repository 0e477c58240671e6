r"""Every harness-side change of a run's search space, backtested on one version's steps.

  python bench/backtest_space.py --run runs/swe_smol --version v0 \
      --gin_file gin/swe_smol_evolve.gin --json out.json

The run's gin files (`--gin_file`, `--gin_bindings`: those it was launched with) give the
harness and the search space (`evolve.space`); the version's values are its lineage's
bindings in the run's ledger. Each candidate of a harness-side knob (reward parts,
filters, the estimator: `backtest.is_harness_side`) is replayed on the version's stored
training steps (`<run>/versions/<version>/rollouts`) against the version's own values, by
the controller's backtester (docs/method.md, step 5), in seconds and without training.
Per change: dead groups before and rescued, newly dead, ranking violations, correct rows
newly cut, rows whose training signal changes (`changed`; 0: inert), the backtester's
verdict, and for a reward part whether it is on target for dead groups
(`backtest.on_target`: at least MIN_RESCUED_SHARE of them rescued).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, write_json  # noqa: E402

KEEP = ("dead_before", "rescued", "newly_dead", "violations", "pairs", "correct",
        "correct_newly_cut", "changed", "reward_before", "reward_after")


def version_values(run: str, version: str) -> dict:
  """{binding: value} of `version`: its lineage's bindings in the run's ledger, as the
  controller reads them (`Results.values`)."""
  from evotrainer.evolution.ledger.mirror import ledger_exists, open_ledger
  from evotrainer.evolution.results import Results
  if not ledger_exists(run):
    raise SystemExit(f"error: no ledger.sqlite in {run}")
  with open_ledger(run) as ledger:
    if not ledger.has_version(version):
      raise SystemExit(f"error: {run} has no version {version!r}")
    return Results(ledger).values(version)


def harness_side(space, values) -> list:
  """The interventions of `space`'s harness-side knobs from `values`."""
  from evotrainer.evolution.backtest import is_harness_side
  from evotrainer.evolution.search_space import SearchSpaceError
  out = []
  for knob in space.knobs:
    try:
      cands = knob.candidates(values)
    except SearchSpaceError:
      continue
    out += [iv for iv in cands if is_harness_side(iv, knob.group)]
  return out


def backtest_all(rollouts: str, version: str, space, values, backtester) -> list:
  """One row per harness-side change: the backtest's figures and verdicts."""
  from evotrainer.evolution.backtest import on_target
  rows = []
  for iv in harness_side(space, values):
    bt = backtester(rollouts, version, values, space.apply(values, iv), iv)
    if bt is None:
      raise SystemExit(f"error: no stored training steps of {version} in {rollouts}")
    part = iv.binding == "RewardComposer.parts"
    rows.append({"change": iv.description, **{k: bt[k] for k in KEEP},
                 "passed": bt["passed"], "why": bt["why"],
                 "on_target_dead_groups": (on_target(bt, "dead_group_ratio", iv)["passed"]
                                           if part else None)})
  return rows


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--run", required=True, help="the run's workdir (its ledger.sqlite)")
  ap.add_argument("--version", default="v0", help="the version whose steps are replayed")
  ap.add_argument("--gin_file", action="append", required=True, help="the run's gin files")
  ap.add_argument("--gin_bindings", action="append", default=[], help="the run's bindings")
  ap.add_argument("--json", help="write results here")
  args = ap.parse_args(argv)
  from evotrainer import registry
  from evotrainer.evolution.backtest import harness_backtester
  from evotrainer.evolution.sweep import gin_harness_builder
  import gin
  t = time.perf_counter()
  values = version_values(args.run, args.version)
  registry.parse(args.gin_file, args.gin_bindings)
  space = gin.query_parameter("evolve.space").scoped_configurable_fn()
  rollouts = os.path.join(args.run, "versions", args.version, "rollouts")
  rows = backtest_all(rollouts, args.version, space, {**space.current_values(), **values},
                      harness_backtester(gin_harness_builder(), drop_inert=gin.get_bindings(
                          "evolve").get("backtest_drops_inert", True)))
  for r in rows:
    print(f"{r['change']:<48} rescued {r['rescued']:>3} of {r['dead_before']:<3} "
          f"{'pass' if r['passed'] else 'FAIL'}  on target: {r['on_target_dead_groups']}",
          file=sys.stderr)
  write_json(args.json, {"benchmark": "backtest_space", "run": os.path.abspath(args.run),
                         "version": args.version, "gin_files": args.gin_file,
                         "bindings": args.gin_bindings, "changes": rows,
                         "wall_s": round(time.perf_counter() - t, 1), "machine": machine()})


if __name__ == "__main__":
  main()
