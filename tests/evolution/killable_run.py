"""A whole evolution run on the scripted trainer, in its own process, for kill -9 tests:
`python -m tests.evolution.killable_run WORKDIR`. Each training sleeps a little, writes a
checkpoint file and its result file, and is idempotent like a real branch (a finished
branch's result is read back); `calls.log` records every training that ran to its end."""

import dataclasses
import json
import os
import pathlib
import sys
import time

from evotrainer.evolution.controller import Controller
from evotrainer.evolution.ledger import Ledger
from evotrainer.evolution.skills import SkillLibrary
from evotrainer.evolution.branch_result import BranchResult
from tests.evolution.test_controller import RESUME_EFFECTS, VALUES, ScriptedTrainer, space


class SlowTrainer(ScriptedTrainer):

  def __init__(self, log: pathlib.Path):
    super().__init__(RESUME_EFFECTS)
    self.log = log

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    done = pathlib.Path(workdir) / "result.json"
    if done.exists():
      return BranchResult.from_json(json.loads(done.read_text()), str(workdir))
    time.sleep(0.05)
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(workdir) / "ckpt").write_bytes(b"x" * 100_000)
    result = super().train(version=version, parent_checkpoint=parent_checkpoint,
                           bindings=bindings, seed=seed, workdir=workdir)
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in dataclasses.asdict(result).items()
                               if k != "workdir"}))
    os.replace(tmp, done)
    with open(self.log, "a") as f:
      f.write(version + "\n")
    return result


def main(workdir: str) -> None:
  wd = pathlib.Path(workdir)
  wd.mkdir(parents=True, exist_ok=True)
  with Ledger(wd / "ledger.sqlite") as ledger:
    print("START", flush=True)
    Controller(ledger, SlowTrainer(wd / "calls.log"), space(),
               SkillLibrary.seeded(wd / "skills"), workdir=wd, values=VALUES, seed=3,
               bootstrap_n=1000, branches=3, generations=3).run()
  print("DONE", flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
