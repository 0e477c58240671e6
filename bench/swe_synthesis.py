r"""SWE task synthesis on the pinned libraries: tasks, build time, F2P sizes, agent rates.

  python bench/swe_synthesis.py --json swe_synthesis.json [--out_dir tasks/] \
      [--max_tasks 20 --max_candidates 60 --workers 2 --libraries xmltodict,parse]

For each library of `evotrainer/tasks/swe/data/swe_sources.json`: fetch (pip + sha256;
cached after the first time, so `fetch_s` is small on a warm cache), synthesize (`build_s`: the
stability runs and one sandboxed suite run per mutant tried), then check out every task
as its single-commit repository, let the oracle (inverse edit) and the random agent
(3 random line edits, seed 0) act, and grade both with the real grader (non-test changes
over pristine tests, F2P + P2P in the sandbox). `oracle_rate` should be 1.0 and
`random_rate` about 0. Tasks are written as SWE-bench JSONL with splits (disjoint by
function) when `--out_dir` is given. No JAX is imported.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evotrainer.tasks.swe import (agents, records, repo, runner, sources, splits,  # noqa: E402
                                  synth)


def bench_library(source: sources.Source, suite: runner.SuiteRunner,
                  config: synth.SynthConfig, work: str) -> tuple[dict, list]:
  start = time.monotonic()
  tree = sources.fetch(source)
  fetch_s = time.monotonic() - start
  tasks, stats = synth.synthesize(source, tree, suite, config)
  tasks = [synth.with_base(t, tree, os.path.join(work, "base")) for t in tasks]
  rng = random.Random(0)
  dirs = {"oracle": [], "random": []}
  for task in tasks:
    for kind in dirs:
      dest = os.path.join(work, kind, task.instance_id)
      repo.checkout(tree, task, dest)
      agents.oracle(task, dest) if kind == "oracle" else agents.random_agent(dest, rng)
      dirs[kind].append(dest)
  start = time.monotonic()
  n = len(tasks)
  grades = {kind: repo.grade_many(tasks, [tree] * n, d, suite, [source.tests] * n)
            for kind, d in dirs.items()}
  grade_s = time.monotonic() - start
  f2p = [len(t.FAIL_TO_PASS) for t in tasks]
  row = {
      "repo": source.repo, "tasks": n, "fetch_s": round(fetch_s, 2),
      "build_s": round(stats.build_s, 1), "build_s_per_task": round(stats.build_s / max(n, 1), 2),
      "stable_tests": stats.stable_tests, "flaky_tests": stats.flaky_tests,
      "base_suite_s": round(stats.base_suite_s, 2), "sites": stats.sites,
      "mutants_tried": stats.tried, "rejected": stats.rejected,
      "f2p_sizes": {"min": min(f2p, default=0), "median": statistics.median(f2p) if f2p else 0,
                    "max": max(f2p, default=0),
                    "histogram": dict(sorted(collections.Counter(f2p).items()))},
      "p2p_median": statistics.median([len(t.PASS_TO_PASS) for t in tasks]) if tasks else 0,
      "kinds": dict(collections.Counter(t.mutation.kind for t in tasks)),
      "difficulty": dict(collections.Counter(t.difficulty for t in tasks)),
      "functions": len({t.mutation.function for t in tasks}),
      "oracle_rate": sum(g.resolved for g in grades["oracle"]) / max(n, 1),
      "random_rate": sum(g.resolved for g in grades["random"]) / max(n, 1),
      "random_f2p_fraction": round(sum(g.f2p_fraction for g in grades["random"]) / max(n, 1), 3),
      "grade_s_per_episode": round(grade_s / max(2 * n, 1), 2),
  }
  return row, tasks


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
  parser.add_argument("--json", default="swe_synthesis.json")
  parser.add_argument("--out_dir", default="")
  parser.add_argument("--libraries", default="", help="comma-separated names (default all)")
  parser.add_argument("--max_tasks", type=int, default=20)
  parser.add_argument("--max_candidates", type=int, default=60)
  parser.add_argument("--max_f2p", type=int, default=10)
  parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  wanted = set(filter(None, args.libraries.split(",")))
  config = synth.SynthConfig(max_tasks=args.max_tasks, max_candidates=args.max_candidates,
                             max_f2p=args.max_f2p, seed=args.seed)
  rows, all_tasks = [], []
  with runner.SuiteRunner(workers=args.workers) as suite, tempfile.TemporaryDirectory() as work:
    for source in sources.load_manifest():
      if wanted and source.name not in wanted:
        continue
      row, tasks = bench_library(source, suite, config, os.path.join(work, source.name))
      print(json.dumps(row), flush=True)
      rows.append(row)
      all_tasks += tasks
  all_tasks = splits.assign_splits(all_tasks, group_by="function")
  result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "config": vars(args), "libraries": rows,
            "total": {"tasks": len(all_tasks),
                      "oracle_rate": sum(r["oracle_rate"] * r["tasks"] for r in rows) /
                                     max(len(all_tasks), 1),
                      "random_rate": sum(r["random_rate"] * r["tasks"] for r in rows) /
                                     max(len(all_tasks), 1),
                      "splits": dict(collections.Counter(t.split for t in all_tasks))}}
  print(json.dumps(result["total"]))
  with open(args.json, "w") as f:
    json.dump(result, f, indent=2)
  if args.out_dir:
    os.makedirs(args.out_dir, exist_ok=True)
    records.write_jsonl(all_tasks, os.path.join(args.out_dir, "swe_tasks.jsonl"))


if __name__ == "__main__":
  main()
