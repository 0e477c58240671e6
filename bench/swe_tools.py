r"""The oracle through the episode's tools on synthesized tasks, graded for real.

  python bench/swe_tools.py --tasks tasks/swe_tasks.jsonl --json swe_tools.json [--limit 20]

`--tasks` is the JSONL `bench/swe_synthesis.py --out_dir` writes. For each task: check out
its single-commit repository, play `agents.oracle_turns` (read around the bug,
`search_replace` the inverse edit, `run_tests` on FAIL_TO_PASS in the sandbox, `submit`)
through `SweEpisode`, and, in a second checkout, an episode that only submits; grade both
with the real grader. `oracle_rate` should be 1.0 and `idle_rate` 0. Also reported: the
seconds of the tools (the sandboxed `run_tests` dominates), observation sizes, stop
reasons. No JAX is imported.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evotrainer.tasks.swe import (agents, episode, records, repo, runner, sources,  # noqa: E402
                                  tools)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
  parser.add_argument("--tasks", required=True)
  parser.add_argument("--json", default="swe_tools.json")
  parser.add_argument("--limit", type=int, default=0, help="first N tasks (0: all)")
  parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
  args = parser.parse_args()
  tasks = [t for t in records.read_jsonl(args.tasks) if t.mutation is not None]
  tasks = tasks[:args.limit] if args.limit else tasks
  by_name = {s.name: s for s in sources.load_manifest()}
  start = time.monotonic()
  with runner.SuiteRunner(workers=args.workers) as suite, tempfile.TemporaryDirectory() as work:
    trees, dirs, idle_dirs, eps, step_s, obs_chars = [], [], [], [], [], []
    for i, task in enumerate(tasks):
      source = by_name[task.repo.split("==")[0]]
      tree = sources.fetch(source)
      trees.append(tree)
      for kind, out in (("oracle", dirs), ("idle", idle_dirs)):
        dest = os.path.join(work, kind, str(i))
        repo.checkout(tree, task, dest)
        out.append(dest)
      ep = episode.SweEpisode(tools.Workspace(dirs[-1], suite, source.tests))
      for turn in agents.oracle_turns(task):
        t0 = time.monotonic()
        obs_chars.append(len(ep.step(turn)))
        step_s.append(time.monotonic() - t0)
      eps.append(ep)
      episode.SweEpisode(tools.Workspace(idle_dirs[-1], suite, source.tests)).step(
          tools.call_text("submit"))
    play_s = time.monotonic() - start
    test_dirs = [by_name[t.repo.split("==")[0]].tests for t in tasks]
    t0 = time.monotonic()
    oracle = repo.grade_many(tasks, trees, dirs, suite, test_dirs)
    idle = repo.grade_many(tasks, trees, idle_dirs, suite, test_dirs)
    grade_s = time.monotonic() - t0
  n = max(len(tasks), 1)
  result = {
      "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                  "load": os.getloadavg()[0]},
      "config": vars(args), "tasks": len(tasks),
      "by_repo": dict(collections.Counter(t.repo for t in tasks)),
      "oracle_rate": sum(g.resolved for g in oracle) / n,
      "idle_rate": sum(g.resolved for g in idle) / n,
      "oracle_tool_validity": statistics.mean(episode.tool_validity(e) for e in eps),
      "stops": dict(collections.Counter(e.stop for e in eps)),
      "unresolved": [t.instance_id for t, g in zip(tasks, oracle) if not g.resolved],
      "step_s": {"mean": round(statistics.mean(step_s), 3), "max": round(max(step_s), 3)},
      "observation_chars": {"median": statistics.median(obs_chars), "max": max(obs_chars)},
      "play_s": round(play_s, 1), "grade_s": round(grade_s, 1),
  }
  print(json.dumps(result, indent=2))
  with open(args.json, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
