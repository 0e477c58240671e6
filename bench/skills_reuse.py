r"""Skills shape later search: a second evolution run seeded with the first run's skills
reaches the first run's final held-out score with fewer branch trainings.

  python bench/skills_reuse.py --json out.json [--first runs/evo] [--seed 0]

The first run is `gin/math.gin` (or an existing workdir given with --first); the second
is the same command and seed with `evolve.skills_dir = <first>/skills`, so it differs
only in the skills it starts from (the seed skills plus what the first run learned and
the outcomes it recorded). A branch training is any trained version other than the root,
counted in the order the ledger created them.

Reported per run: the branch trainings until a kept version first reached the target
(the first run's final incumbent's held-out Avg@8; None when never), the total branch
trainings, and the final incumbent's score.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import launch_run  # noqa: E402  (run as a script: the repo on the path)

GOOD = ("kept", "merged")


def trainings_to_reach(summary: dict, target: float) -> dict:
  """Branch trainings (creation order) until a kept version's held-out Avg@8 >= target."""
  trained = [v for v in summary["versions"]
             if v["parent"] is not None and v["heldout_avg8"] is not None]
  reached = next((i + 1 for i, v in enumerate(trained)
                  if v["status"] in GOOD and v["heldout_avg8"] >= target - 1e-12), None)
  inc = next(v for v in summary["versions"] if v["id"] == summary["incumbent"])
  return {"trainings_to_target": reached, "trainings": len(trained),
          "incumbent": inc["id"], "incumbent_avg8": inc["heldout_avg8"],
          "kept": [v["id"] for v in summary["versions"] if v["status"] in GOOD]}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--first", default=None, help="workdir of a finished first run (else run)")
  ap.add_argument("--workdir", default="runs/bench_skills_reuse")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--gin_bindings", action="append", default=[])
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  root = pathlib.Path(args.workdir).resolve()
  root.mkdir(parents=True, exist_ok=True)
  bindings = [f"run.seed = {args.seed}", *args.gin_bindings]
  first = pathlib.Path(args.first).resolve() if args.first else root / "first"
  if not (first / "summary.json").exists() or \
      json.loads((first / "summary.json").read_text()).get("mode") != "evolve":
    launch_run(["gin/math.gin"], bindings, first, root / "first.log")
  s1 = json.loads((first / "summary.json").read_text())
  one = trainings_to_reach(s1, float("inf"))
  target = one["incumbent_avg8"]
  one = trainings_to_reach(s1, target)
  second = root / "second"
  s2 = launch_run(["gin/math.gin"], [*bindings, f"evolve.skills_dir = '{first / 'skills'}'"],
               second, root / "second.log")
  two = trainings_to_reach(s2, target)
  skills = sorted(p.stem for p in (first / "skills").glob("*.json"))
  out = {"benchmark": "skills_reuse", "seed": args.seed, "target_avg8": target,
         "first": {"workdir": str(first), **one}, "second": {"workdir": str(second), **two},
         "skills_from_first": skills,
         "fewer_trainings": two["trainings_to_target"] is not None
                            and two["trainings_to_target"] < one["trainings_to_target"]}
  text = json.dumps(out, indent=2)
  print(text)
  if args.json:
    pathlib.Path(args.json).write_text(text + "\n")
  return out


if __name__ == "__main__":
  main()
