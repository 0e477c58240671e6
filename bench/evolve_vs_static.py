r"""The paper's comparison: evolution against a static harness and the other arms, at
equal total RL steps, scored on the test split.

  python -m bench.evolve_vs_static --json out.json [--seeds 0,1,2,3,4] [--workdir DIR]
  python -m bench.evolve_vs_static --domain code --json out.json
  python -m bench.evolve_vs_static --domain code_smol --seeds 0,1,2 --json out.json
  python -m bench.evolve_vs_static --arms static,evotrainer,static_lineage --json out.json
  python -m bench.evolve_vs_static --domain code_smol --arms static,evotrainer \
      --evolve_gin_bindings "VerifyConfig.keep_on = 'not_worse'" --json out.json
  python -m bench.evolve_vs_static --domain code_smol --arms static,evotrainer \
      --skills_pool runs/skills_pool --json out.json

Domains: `math` and `code` (the tiny from-scratch model, gin/math*.gin, gin/code*.gin),
`code_smol` and `math_smol` (the pretrained SmolLM2-135M-Instruct: gin/code_smol_train.gin
and gin/code_smol.gin; gin/math_smol_train.gin and gin/math_smol.gin, warm-started). The
evolution's shape (generations, branches, branch steps, control, continuation) defaults to
the domain's gin file.

Arms per seed, all from the same starting policy (the warm-start cache is shared), each
defined exactly in bench/evolve_arms.py: `base` (no RL: the static run's test evaluation
before training), `static` (the shipped fixed harness), `clip_higher` (the static harness
at clip 0.2/0.28; the shipped static harnesses already clip so, and then it is the static
run read back, `same_run_as: static`), `recipe_search` (hyper-parameters only),
`best_static_filter` (the group filter of bench/evolve_arms.FILTERS whose selection run
scored best on validation, trained at equal steps), `evotrainer`, `static_lineage`
(the static harness trained as many steps as the evotrainer run of the same seed kept on
its final lineage, launched once that run is known; a lineage that kept every step makes
it the static run, read back with `same_run_as: static`) and `static_adopted` (the static
harness with the settings the evotrainer run of the same seed adopted at its root,
`evolve.adopt_skills`, at equal steps: the carried-over skills without the run's own
search; a root that adopted nothing makes it the static run). Every arm but base and
static_lineage trains as many RL steps as an evolution run trains in all: the root and
every branch, control and continuation.

Each arm is the real command in a child process (`python -m evotrainer.launch`). The
score is the test-split Avg@8 of the final incumbent (fixed harnesses: of the last step),
on the same test problems with the same sampling keys; every choice (the evolution's
promotions, the best filter) reads the validation split only. Differences are mean paired
differences arm - static with a 95% interval from a two-level bootstrap (seeds with
replacement, then test problems inside each seed).

JSON keys: `split` ('test'), `seeds` (those finished), `seeds_pending` (those of `--seeds`
not yet finished: the JSON is rewritten as each seed finishes, so an interrupted benchmark
leaves the report of the seeds it did), `model`, `means` {arm: test Avg@8},
`validation_means`, `lineage_steps` {arm: mean RL steps on the kept lineage},
`diff_vs_static` (evotrainer - static at equal total steps), `diff_vs_static_equal_lineage`
(evotrainer - static_lineage), `diff_vs_static_adopted` (evotrainer - static_adopted),
`diffs_vs_static` {arm: ...} and `diff_recipe_vs_static`
(each {mean, lo, hi}), `selection_gap` (mean over seeds of the evotrainer incumbent's
validation gain over its root minus its test gain), `retained` {layer: [{seed, version,
change}]} (what the evolution kept on its final lineage, by layer: reward, filter, data,
optimisation, diagnostics; bench/evolve_arms.LAYERS), `arms.<arm>.<seed>.curves` (test
Avg@8 against cumulative RL steps: the kept lineage, and the evolution's other
versions), `best_static_filter_selection` (the
candidates' validation scores, the choice and the selection runs' steps), `steps`,
`wall_s_per_arm` {arm: {seed: seconds}}, `arms` (per seed, with the test split's
`per_problem` scores), `carried_seeds`, `config`, `packages` (the
versions of jax, flax, optax, numpy, ... found by this process: runs on another install
are not comparable step for step), `wall_s`. Beside `--json out.json`, `out.html` draws
the curves, one chart per seed (`plot_page`). An arm not run has null means and
differences.

`--skills_pool DIR`: the evotrainer runs share one skills directory, in seed order: each
starts from it (`evolve.skills_dir`) and is merged into it once finished
(`SkillLibrary.merge`), so a later seed proposes from the outcomes, and the pooled
effects, of the earlier ones; `arms.evotrainer.<seed>.skills_pool_runs` is how many runs
the pool held at that seed's first launch. Each seed is then no longer independent of the
seeds before it: what the pool measures is the evolution with a memory of earlier runs.

Resumable per (arm, seed): a finished run in `--workdir` (its `bench_done` marker) is read
back, not relaunched, so seeds accumulate over several invocations; its command is kept in
`bench_launch.json` and a run directory that holds another command is refused. `--arms`
runs a subset (static always runs; static_lineage and static_adopted bring evotrainer).
A seed that the existing `--json` already holds with every arm asked for (its per-problem
scores are kept in `arms`), written by the same configuration on the same package
versions, is carried from it and not run (`carried_seeds`; `--no_carry` turns this off):
seeds accumulate across machines that do not keep the workdir, as long as the JSON (and
a `--skills_pool` directory) is kept. An existing `--json` is never silently thinned: a
run that would drop seeds it holds (not in `--seeds`) or rerun them (not carried: another
configuration or install, or a JSON from before per-problem scores were kept) is refused
before anything launches, naming them, unless `--overwrite_json` (`--no_carry` consents
to the rerun only).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from evotrainer import atomic

from bench.common import load_json, packages, paired_interval, run_or_read, save_json
from bench.evolve_arms import (ARMS, DOMAINS, FILTERS, arm_launches, base_arm, choose_filter,
                               clip_higher_is_static, evolve_arm, filter_binding, pool_runs,
                               pool_skills, static_arm)

# The order arms run in for one seed: static_lineage and static_adopted need the evotrainer
# run (its lineage, its adopted settings).
ORDER = ("evotrainer", "recipe_search", "static", "base", "clip_higher",
         "best_static_filter", "static_lineage", "static_adopted")


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated run seeds")
  ap.add_argument("--workdir", default="runs/bench_evolve_vs_static",
                  help="where the arms' run directories go (reused: a finished arm is "
                       "read back, not rerun)")
  ap.add_argument("--domain", choices=sorted(DOMAINS), default="math")
  ap.add_argument("--generations", type=int, default=None,
                  help="default: the domain's gin file")
  ap.add_argument("--branches", type=int, default=None, help="default: the domain's")
  ap.add_argument("--branch_steps", type=int, default=None,
                  help="default: the domain's gin file")
  ap.add_argument("--continue_steps", type=int, default=None,
                  help="steps of each generation's continuation (default: the domain's "
                       "gin file)")
  ap.add_argument("--control", dest="control", action="store_const", const=True,
                  default=None, help="control branches (default: the domain's gin file)")
  ap.add_argument("--no_control", dest="control", action="store_const", const=False,
                  help="evolution arms without control branches (evolve.control = False)")
  ap.add_argument("--filter_selection_seed", type=int, default=1000,
                  help="the seed of best_static_filter's selection runs (not a benchmark "
                       "seed)")
  ap.add_argument("--gin_bindings", action="append", default=[],
                  help="extra bindings for every arm (e.g. a smaller eval for a smoke run)")
  ap.add_argument("--evolve_gin_bindings", action="append", default=[],
                  help="extra bindings for the evolution arms only (evotrainer, "
                       "recipe_search), e.g. a controller knob such as "
                       "\"VerifyConfig.keep_on = 'not_worse'\"; the fixed-harness arms' "
                       "commands are unchanged, so their finished runs are read back")
  ap.add_argument("--skills_pool", default=None,
                  help="a skills directory shared by the evotrainer runs: each starts from "
                       "it (evolve.skills_dir) and its skills are merged back once it "
                       "finishes, in seed order, so later seeds propose from the "
                       "validated outcomes of earlier ones (`skills_pool_runs` per seed: "
                       "how many runs the pool held at its first launch)")
  ap.add_argument("--arms", default=",".join(ARMS),
                  help=f"comma-separated subset of {','.join(ARMS)} (static always runs; "
                       f"static_lineage and static_adopted bring evotrainer)")
  ap.add_argument("--json", default=None, help="write the result here too")
  ap.add_argument("--no_carry", dest="carry", action="store_false",
                  help="rerun (or read back from --workdir) every seed, even one the "
                       "existing --json already holds (carried_seeds)")
  ap.add_argument("--overwrite_json", action="store_true",
                  help="rewrite --json even where it holds seeds this run would drop (not "
                       "in --seeds) or rerun (not carried); without it such a run is "
                       "refused before anything is launched")
  args = ap.parse_args(argv)
  d = DOMAINS[args.domain]
  for name in ("generations", "branches", "branch_steps", "continue_steps", "control"):
    if getattr(args, name) is None:
      setattr(args, name, getattr(d, name))
  args.seeds = [int(s) for s in args.seeds.split(",")]
  wanted = set(args.arms.split(","))
  unknown = wanted - set(ARMS)
  if unknown:
    ap.error(f"--arms: unknown {sorted(unknown)}; expected a subset of {list(ARMS)}")
  wanted |= {"static"} | ({"evotrainer"} if wanted & {"static_lineage", "static_adopted"}
                           else set())
  args.arms = [a for a in ARMS if a in wanted]
  if "best_static_filter" in args.arms and args.filter_selection_seed in args.seeds:
    ap.error(f"--filter_selection_seed {args.filter_selection_seed} is a benchmark seed; "
             f"the filter is chosen on a seed apart")
  return args


class Bench:
  """The runs of one invocation: each (arm, seed) launched or read back under `root`."""

  def __init__(self, args, root: pathlib.Path):
    self.args, self.root = args, root

  def launches(self, seed: int, **kw) -> dict:
    a = self.args
    return arm_launches(a.domain, seed, a.generations, a.branches, a.branch_steps,
                        a.control, a.gin_bindings, a.continue_steps,
                        evolve_extra=a.evolve_gin_bindings,
                        skills_dir=a.skills_pool and str(pathlib.Path(a.skills_pool).resolve()),
                        **kw)

  def run(self, name: str, launch: tuple) -> dict:
    """The summary of the run `name` (`<root>/<name>`), timed and announced."""
    t = time.time()
    print(f"[bench] {name} ...", flush=True)
    summary = run_or_read(*launch, self.root / name, self.root / f"{name}.log")
    print(f"[bench] {name}: done ({time.time() - t:.0f}s here)", flush=True)
    return summary

  def select_filter(self) -> dict:
    """best_static_filter's choice: one run per FILTERS candidate on the selection seed at
    the arm's total steps, chosen on the validation split only."""
    seed = self.args.filter_selection_seed
    summaries = {name: self.run(f"filter_{name}-s{seed}",
                                self.launches(seed, group_filter=name)["best_static_filter"])
                 for name in FILTERS}
    chosen = choose_filter(summaries)
    runs = {n: {"binding": filter_binding(n),
                "validation": static_arm(s)["validation"], "wall_s": s["wall_s"]}
            for n, s in summaries.items()}
    steps = sum(int(s["steps"]) for s in summaries.values())
    print(f"[bench] best static filter on validation: {chosen}", flush=True)
    return {"seed": seed, "chosen": chosen, "runs": runs, "selection_steps": steps,
            "steps_per_run": self.launches(seed)["total_steps"]}

  def seed_arms(self, seed: int, chosen_filter) -> dict:
    """{arm: figures} of one seed, in ORDER."""
    out: dict = {}
    for arm in (a for a in ORDER if a in self.args.arms):
      out[arm] = self.arm(arm, seed, out, chosen_filter)
      print(f"[bench] seed {seed} {arm}: test Avg@8 {out[arm]['test']:.4f} (validation "
            f"{out[arm]['validation']:.4f}, lineage {out[arm]['lineage_steps']} steps)",
            flush=True)
    return out

  def arm(self, arm: str, seed: int, done: dict, chosen_filter) -> dict:
    """One arm's figures for `seed` (`done`: the arms of this seed so far)."""
    name = f"{arm}-s{seed}"
    if arm == "base":  # the static run's evaluations before RL
      return base_arm(json.loads((self.root / f"static-s{seed}" / "summary.json").read_text()))
    if arm == "clip_higher" and clip_higher_is_static(self.args.domain):
      return {**done["static"], "same_run_as": "static"}
    if arm == "evotrainer" and self.args.skills_pool:
      return self.pooled_evolution(name, seed)
    if arm in ("recipe_search", "evotrainer"):
      return evolve_arm(self.run(name, self.launches(seed)[arm]), self.root / name)
    kw = ({"group_filter": chosen_filter} if arm == "best_static_filter" else
          {"lineage_steps": done["evotrainer"]["lineage_steps"]}
          if arm == "static_lineage" else
          {"adopted": done["evotrainer"]["adopted"]} if arm == "static_adopted" else {})
    launches = self.launches(seed, **kw)
    if arm in ("static_lineage", "static_adopted") and launches[arm] == launches["static"]:
      # The lineage kept every step, or the root adopted nothing.
      return {**done["static"], "same_run_as": "static"}
    return static_arm(self.run(name, launches[arm]))

  def pooled_evolution(self, name: str, seed: int) -> dict:
    """The evotrainer arm started from `--skills_pool`, merged back into it once done.
    How many runs the pool held at its first launch is kept beside the run
    (`<name>.pool.json`), so a run read back or resumed reports what it started from, not
    the pool that later seeds have grown."""
    pool = pathlib.Path(self.args.skills_pool).resolve()
    pool.mkdir(parents=True, exist_ok=True)
    note = self.root / f"{name}.pool.json"
    if not note.exists() or not (self.root / name).exists():
      note.write_text(json.dumps({"runs_before": pool_runs(pool)}) + "\n")
    out = evolve_arm(self.run(name, self.launches(seed)["evotrainer"]), self.root / name)
    merged = pool_skills(pool, self.root / name / "skills")
    print(f"[bench] {name}: {len(merged)} skills pooled into {pool}", flush=True)
    return {**out, "skills_pool_runs": json.loads(note.read_text())["runs_before"]}


def summarize(arms: dict, seeds: list) -> dict:
  """Means, lineage depths, differences and wall times over seeds ({arm: {seed: ...}})."""
  def mean(key):
    return {a: statistics.mean(arms[a][s][key] for s in seeds) if a in arms else None
            for a in ARMS}

  def diff(a, b="static"):
    if a not in arms or b not in arms:
      return {"mean": None, "lo": None, "hi": None}
    return paired_interval([(arms[a][s]["per_problem"], arms[b][s]["per_problem"])
                            for s in seeds])

  gaps = [arms["evotrainer"][s]["selection_gap"] for s in seeds
          if "evotrainer" in arms and arms["evotrainer"][s]["selection_gap"] is not None]
  return {"means": mean("test"), "validation_means": mean("validation"),
          "lineage_steps": mean("lineage_steps"),
          "diff_vs_static": diff("evotrainer"),
          "diff_vs_static_equal_lineage": diff("evotrainer", "static_lineage"),
          "diff_vs_static_adopted": diff("evotrainer", "static_adopted"),
          "diffs_vs_static": {a: diff(a) for a in ARMS if a != "static"},
          "diff_recipe_vs_static": diff("recipe_search"),
          "selection_gap": statistics.mean(gaps) if gaps else None,
          "retained": retained_by_layer(arms.get("evotrainer", {}), seeds),
          "wall_s_per_arm": {a: {str(s): arms[a][s]["wall_s"] for s in seeds} for a in arms}}


def retained_by_layer(evolutions: dict, seeds: list) -> dict:
  """{layer: [{'seed', 'version', 'change'}]}: what the evolution kept, over seeds."""
  out: dict = {}
  for s in seeds:
    for r in evolutions[s].get("retained", []) if s in evolutions else []:
      out.setdefault(r["layer"], []).append(
          {"seed": s, "version": r["version"], "change": r["change"]})
  return dict(sorted(out.items()))


def plot_page(arms: dict, seeds: list) -> str:
  """An HTML page, one chart per seed: test Avg@8 against cumulative RL steps of the
  evolution's kept lineage (its other versions, rejected branches and controls, as
  points) beside the fixed-harness arms' runs of the same seed; every curve starts at the
  base policy's test score (step 0) when the base arm is there."""
  from evotrainer.report.html import svg_chart
  names = {"evotrainer": "evotrainer lineage", "static": "static",
           "static_lineage": "static, lineage steps", "recipe_search": "recipe search",
           "static_adopted": "static, adopted skills"}
  charts = []
  for s in seeds:
    start = [(0, arms["base"][s]["test"])] if "base" in arms else []  # the same policy
    series = {label: ([] if a == "static" else start) + arms[a][s]["curves"]["lineage"]
              for a, label in names.items() if a in arms and "curves" in arms[a][s]}
    if "evotrainer" in arms:
      series["evotrainer, other versions"] = arms["evotrainer"][s]["curves"]["others"]
    charts.append(svg_chart(series, f"seed {s}: test Avg@8 vs cumulative RL steps",
                            width=720, height=260, points={"evotrainer, other versions"}))
  return ("<!doctype html><meta charset='utf-8'><title>evolve_vs_static</title>"
          + "".join(f"<p>{c}</p>" for c in charts) + "\n")


def main(argv=None) -> dict:
  args = _args(argv)
  root = pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  bench, t0 = Bench(args, root), time.time()
  carried = carried_seeds(args) if args.json and args.carry else {}
  check_overwrite(args, carried, root)  # before any launch, the filter selection's too
  selection = bench.select_filter() if "best_static_filter" in args.arms else None
  per_seed: dict = {}
  for s in args.seeds:  # the JSON is rewritten as each seed finishes
    if s in carried:
      print(f"[bench] seed {s}: every arm read from {args.json}", flush=True)
    per_seed[s] = carried.get(s) or bench.seed_arms(s, selection and selection["chosen"])
    out, arms = report(args, bench, per_seed, selection, sorted(carried),
                       time.time() - t0)
    if args.json:
      _write(args.json, out, arms)
  _print_table(arms, out["seeds"], out["means"])
  print(json.dumps(out, indent=2))
  return out


# What must match for a seed in an earlier --json to stand for a run of this invocation.
CARRY_KEYS = ("domain", "generations", "branches", "branch_steps", "continue_steps",
              "control", "extra_bindings", "evolve_bindings")


def carried_seeds(args) -> dict:
  """{seed: {arm: figures}} of the seeds of `--seeds` that the existing `--json` already
  holds with every arm asked for, its per-problem scores included, written by the same
  configuration (CARRY_KEYS) on the same package versions: a benchmark whose workdir is
  gone (another machine) goes on from its committed JSON. `best_static_filter` carries
  nothing (its selection runs are not in the JSON)."""
  return _carry(args, load_json(args.json))[0]


def _carry(args, old: dict) -> tuple[dict, str]:
  """(the seeds of `--seeds` carried from `old`, why a seed of `old` is not: the whole
  file's reason, or, past those, a missing arm or missing per-problem scores)."""
  if not old:
    return {}, ""
  if "best_static_filter" in args.arms:
    return {}, "best_static_filter carries nothing (its selection runs are not in the JSON)"
  now = {k: v for k, v in _config(args).items() if k in CARRY_KEYS}
  was = {k: old.get("config", {}).get(k) for k in CARRY_KEYS}
  if was != now:
    return {}, "written by another configuration"
  if old.get("packages") != packages(DOMAINS[args.domain].packages):
    return {}, "written on other package versions"
  arms = old.get("arms", {})
  out = {}
  for s in args.seeds:
    figures = {a: arms.get(a, {}).get(str(s)) for a in args.arms}
    if all(f and "per_problem" in f for f in figures.values()):
      out[s] = figures
  return out, "an arm asked for is missing, or its per-problem scores are not kept"


def check_overwrite(args, carried: dict, root: pathlib.Path) -> None:
  """Refuses (SystemExit) to rewrite an existing `--json` that holds seeds this
  invocation would drop (not in `--seeds`) or rerun (neither carried, for another
  configuration, another install or no per-problem scores, nor read back from the
  workdir `root`), unless `--overwrite_json`; `--no_carry` consents to the rerun, not to
  dropping."""
  old = load_json(args.json) if args.json else {}
  held = [int(s) for s in old.get("seeds", [])]
  dropped = [s for s in held if s not in args.seeds]
  replaced = [s for s in held if s in args.seeds and s not in carried
              and not (root / f"static-s{s}" / "bench_done").exists()] if args.carry else []
  if not (dropped or replaced):
    return
  why = ([f"drop seeds {dropped} (not in --seeds)"] if dropped else []) + (
      [f"rerun seeds {replaced} ({_carry(args, old)[1]})"] if replaced else [])
  what = f"--json {args.json} holds seeds {held}; this run would {' and '.join(why)}"
  if args.overwrite_json:
    print(f"[bench] {what}: rewriting it (--overwrite_json)", flush=True)
    return
  raise SystemExit(f"error: {what} and lose their figures. Write to another --json, or "
                   f"pass --overwrite_json")


def report(args, bench: Bench, per_seed: dict, selection, carried: list,
           wall_s: float) -> tuple:
  """(the JSON, {arm: {seed: figures}}) over the seeds finished so far (`per_seed`);
  `seeds_pending` lists the ones of `--seeds` still to run, `carried_seeds` those read
  from the earlier JSON."""
  seeds = list(per_seed)
  arms = {a: {s: per_seed[s][a] for s in seeds} for a in args.arms}
  d = DOMAINS[args.domain]
  out = {"benchmark": "evolve_vs_static", "split": "test", "seeds": seeds,
         "seeds_pending": [s for s in args.seeds if s not in per_seed],
         "carried_seeds": carried, "model": d.model,
         "config": _config(args),
         "steps": {"total_per_arm": bench.launches(seeds[0])["total_steps"],
                   "static_lineage": {str(s): arms["static_lineage"][s]["rl_steps"]
                                      for s in seeds} if "static_lineage" in arms else None},
         **summarize(arms, seeds), "best_static_filter_selection": selection,
         "arms": {a: {str(s): arms[a][s] for s in seeds} for a in arms},
         "packages": packages(d.packages), "wall_s": round(wall_s, 1)}
  return out, arms


def _config(args) -> dict:
  """The invocation's settings, as the JSON's `config` records them."""
  return {"domain": args.domain, "generations": args.generations, "branches": args.branches,
          "branch_steps": args.branch_steps, "continue_steps": args.continue_steps,
          "control": args.control, "arms": args.arms,
          "clip_higher_is_static": clip_higher_is_static(args.domain), "filters": FILTERS,
          "extra_bindings": args.gin_bindings, "evolve_bindings": args.evolve_gin_bindings,
          "skills_pool": args.skills_pool}


def _write(path: str, out: dict, arms: dict) -> None:
  """`out` to `path` and its curves beside it (`.html`), each written whole, so an
  interrupted benchmark leaves the report of the seeds it finished."""
  save_json(path, out)
  atomic.write_text(pathlib.Path(path).with_suffix(".html"), plot_page(arms, out["seeds"]))


def _print_table(arms: dict, seeds: list, means: dict) -> None:
  print("\narm (test Avg@8)     " + "  ".join(f"seed {s}" for s in seeds) + "   mean")
  for a in arms:
    print(f"{a:20s} " + "  ".join(f"{arms[a][s]['test']:.4f}" for s in seeds)
          + f"   {means[a]:.4f}")


if __name__ == "__main__":
  main()
