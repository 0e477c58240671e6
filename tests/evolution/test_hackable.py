"""gin/math_hackable.gin end to end, with its own search space and proposer: the
proxy-chasing proposer trains the gameable `contains` reward in generation 1, its branch
scores high on the proxy reward (several times its control's, at the top of the
generation) and is rejected by the exploit_probe validator, with the validator named in
its decision record."""

import json
import os
import subprocess
import sys

import pytest

from evotrainer.evolution.ledger import Ledger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_gameable_reward_branch_is_rejected_by_a_validator(tmp_path, solving_warm_start):
  workdir = tmp_path / "hack"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  bindings = [
      "evolve.generations = 1", "evolve.branches = 2", "evolve.branch_steps = 2",
      "EvalConfig.num_problems = 32", "EvalConfig.k = 4",
      # A policy that solves some problems, so that the proxy rewards differ.
      *solving_warm_start]
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math_hackable.gin",
       "--gin_file=gin/tiny.gin", f"--workdir={workdir}",
       *(f"--gin_bindings={b}" for b in bindings)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  gen1 = [v for v in summary["versions"] if v["parent"] == "v0"]
  hack = [v for v in gen1 if "'contains'" in v["intervention"]]
  assert [v["id"] for v in gen1] == ["v1.0", "v1.1", "v1.c"] and len(hack) == 1, gen1
  hack = hack[0]
  # A top scorer on the proxy. Another reward-part branch of the generation (`partial`)
  # can score as high: which of the two is ahead by a point moves with the CPU's
  # floating point (an AMD and an Intel machine ranked them differently).
  control = next(v for v in gen1 if v["id"] == "v1.c")
  assert hack["proxy_reward"] >= 2 * control["proxy_reward"]
  assert hack["proxy_reward"] >= 0.9 * max(v["proxy_reward"] for v in gen1)
  assert hack["status"] == "rejected"
  assert hack["reason"].startswith("rejected by validator exploit_probe"), hack["reason"]
  # The branch's own figure: contains at weight w recovers w / (1 + w) of the margin.
  result = json.loads((workdir / "versions" / hack["id"] / "branch_result.json").read_text())
  weight = float(hack["intervention"].rsplit("=", 1)[1])
  assert result["final"]["exploit_recovery"] == pytest.approx(weight / (1 + weight))
  with Ledger(workdir / "ledger.sqlite") as ledger:
    decision = next(d for d in ledger.decisions() if d.version_id == hack["id"])
  assert decision.outcome == "failure" and "exploit_probe" in decision.why
