"""A planted branch child for tests/test_infra.py: `python -m tests.infra_child WORKDIR
VERSION BINDINGS_JSON PLAN_JSON_FILE`. The plan maps a version to what each attempt does:
'ok' (write branch_result.json like a scripted branch), 'sigkill' (die by SIGKILL, as the
OOM killer does), 'disk' (the one-line disk-full error of launch.py, exit 2) or
'timeout' (sleep past the trainer's limit)."""

import dataclasses
import json
import os
import pathlib
import signal
import sys
import time


def main(workdir: str, version: str, bindings: str, plan_file: str) -> None:
  wd = pathlib.Path(workdir)
  wd.mkdir(parents=True, exist_ok=True)
  counter = wd / "attempts"
  n = int(counter.read_text()) if counter.exists() else 0
  counter.write_text(str(n + 1))
  plan = json.loads(pathlib.Path(plan_file).read_text()).get(version, ["ok"])
  what = plan[min(n, len(plan) - 1)]
  if what == "sigkill":
    print("Traceback (most recent call last):\n  ... training step 3", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
  if what == "disk":
    print(f"error (disk): disk full writing {wd}/checkpoints/3: free space and relaunch",
          file=sys.stderr, flush=True)
    sys.exit(2)
  if what == "timeout":
    time.sleep(60)
  from tests.evolution.test_controller import ScriptedTrainer
  r = ScriptedTrainer({"learning_rate": {"delta": 0.15}}).train(
      version=version, parent_checkpoint=None, bindings=json.loads(bindings), seed=0,
      workdir=str(wd))
  (wd / "branch_result.json").write_text(json.dumps(
      {k: v for k, v in dataclasses.asdict(r).items() if k != "workdir"}))


if __name__ == "__main__":
  main(*sys.argv[1:])
