"""How often each library diagnostic fires on a finished run's stored training steps.

On a healthy run (e.g. the main job) every firing is a false alarm: this is the
calibration figure of a domain's diagnostics. Each stored training step of every version
is one observation; a diagnostic fires on a step when it reports a finding there, given
the step's episodes and, as context, that step's learner metrics (`metrics.jsonl`) and
the grad-norm series before it.

  python -m bench.diagnostic_rates --run=runs/math --json=diagnostic_rates.json

JSON: `run`, `steps` (observations), `versions`, and `rates` {diagnostic: {"fired",
"rate"}} for every diagnostic of the library (`harness.diagnostics.DIAGNOSTICS`, with
the code and SWE domains' registered, the `domain` hook aside), plus `default` (the
evolution's default diagnostics).
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib

from evotrainer.evolution.harness_evolution import DEFAULT_DIAGNOSTICS
from evotrainer.harness.diagnostics import DIAGNOSTICS, run_diagnostics
from evotrainer.rollouts.store import RolloutStore
from evotrainer.tasks.code import diagnostics as _code_diagnostics  # noqa: F401 (registers)
from evotrainer.tasks.swe import diagnostics as _swe_diagnostics  # noqa: F401 (registers)


def _metrics_by_step(path: pathlib.Path) -> dict:
  """{step: every metrics.jsonl row of that step merged} ({} without the file)."""
  out: dict = {}
  if path.exists():
    for line in path.read_text().splitlines():
      row = json.loads(line)
      out.setdefault(row.get("step"), {}).update(row)
  return out


def firing_rates(run: pathlib.Path) -> dict:
  """{'steps', 'versions', 'rates'} over every stored training step under `run`."""
  names = [n for n in DIAGNOSTICS if n != "domain"]
  fired: collections.Counter = collections.Counter()
  steps, versions = 0, []
  for root in sorted(run.glob("versions/*/rollouts")):
    vid = root.parent.name
    store = RolloutStore(root)
    if vid not in store.versions():
      continue
    versions.append(vid)
    rows = _metrics_by_step(root.parent / "metrics.jsonl")
    grad_norms = []
    for step in store.steps(vid, "train"):
      episodes = store.read_step(vid, step, "train").episodes
      learner = rows.get(step, {})
      context = {"learner": learner, "series": {"grad_norm": list(grad_norms)}}
      if "learner/grad_norm" in learner:
        grad_norms.append(learner["learner/grad_norm"])
      _, findings = run_diagnostics([DIAGNOSTICS[n]() for n in names], episodes, context)
      steps += 1
      fired.update({f.kind for f in findings})
  rates = {n: {"fired": fired[n], "rate": fired[n] / steps if steps else None}
           for n in names}
  return {"steps": steps, "versions": versions, "rates": rates}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--run", required=True, help="a finished run's workdir")
  ap.add_argument("--json", default=None, help="also write the JSON here")
  args = ap.parse_args()
  run = pathlib.Path(args.run)
  if not (run / "versions").is_dir():
    raise SystemExit(f"--run={run}: no versions/ folder (not a run's workdir)")
  out = {"run": str(run), **firing_rates(run), "default": list(DEFAULT_DIAGNOSTICS)}
  text = json.dumps(out, indent=2)
  print(text)
  if args.json:
    pathlib.Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
  main()
