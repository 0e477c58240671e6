"""Infrastructure failures of branch children: classified, retried once, recorded apart
from rejections; a generation where nothing could train stops the run (evotrainer/infra.py).
The children are real processes (tests/infra_child.py) that crash as planted."""

import json
import os
import pathlib
import sys

import pytest

from evotrainer import infra
from evotrainer.evolution.trainer import SubprocessTrainer
from tests.evolution.test_controller import make

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PlantedTrainer(SubprocessTrainer):
  """SubprocessTrainer whose child is tests/infra_child.py, failing as `plan` says. A
  child planted to time out gets `timeout_s`; the others get 300 s, so that a loaded
  machine (a child's imports alone can take 10 s) does not turn them into timeouts."""

  def __init__(self, plan_file, timeout_s=30):
    path = os.environ.get("PYTHONPATH", "")
    super().__init__([], timeout_s=timeout_s,
                     env={"PYTHONPATH": REPO + (os.pathsep + path if path else "")})
    self.plan_file, self.planted_timeout_s = str(plan_file), timeout_s

  def train(self, **kw):
    plan = json.loads(pathlib.Path(self.plan_file).read_text()).get(kw["version"], ["ok"])
    self.timeout_s = self.planted_timeout_s if "timeout" in plan else 300
    return super().train(**kw)

  def command(self, *, version, parent_checkpoint, bindings, seed, workdir):
    return [sys.executable, "-m", "tests.infra_child", workdir, version,
            json.dumps(list(bindings)), self.plan_file]


def _attempts(workdir, vid):
  return int((workdir / "versions" / vid / "attempts").read_text())


def test_classify():
  assert infra.classify(-9, "step 3") == "crash (signal 9)"
  assert infra.classify(137, "") == "crash (signal 9)"
  assert infra.classify(2, "x\nerror (disk): disk full writing w") == "disk full"
  assert infra.classify(2, "error (workdir): w holds a run with another configuration") \
      == "config mismatch"
  assert infra.classify(1, "jaxlib.XlaRuntimeError: RESOURCE_EXHAUSTED: 3 GiB") == \
      "out of memory"
  assert infra.classify(1, "CheckpointError: no complete checkpoint in /x") == \
      "missing or corrupt checkpoint"
  assert infra.classify(1, "ValueError: boom") == "crash"
  assert infra.classify("timeout", "error (disk): x") is None  # a too-slow change: evidence


@pytest.mark.slow
def test_failing_children_are_retried_and_kept_apart(tmp_path):
  plan = tmp_path / "plan.json"
  # v1.0 is killed once then trains; v1.1 hits a full disk twice; v1.2 times out.
  plan.write_text(json.dumps({"v1.0": ["sigkill", "ok"], "v1.1": ["disk", "disk"],
                              "v1.2": ["timeout"]}))
  c, ledger, _ = make(tmp_path, {}, trainer=PlantedTrainer(plan, timeout_s=8), branches=3)
  c.run()
  wd = tmp_path / "run"
  assert _attempts(wd, "v1.0") == 2 and _attempts(wd, "v1.1") == 2
  assert _attempts(wd, "v1.2") == 1  # a timeout is not retried
  v10, v11, v12 = (ledger.version(v) for v in ("v1.0", "v1.1", "v1.2"))
  assert "result" in v10.metrics and v10.status in ("kept", "rejected")
  assert v11.status == "pruned" and "infrastructure failure (disk full), not evidence" \
      in v11.reason
  assert v12.status == "rejected" and "training failed" in v12.reason
  d11 = next(d for d in ledger.decisions() if d.version_id == "v1.1")
  assert d11.outcome is None and "infrastructure" in d11.why  # no negative evidence
  assert [a.status for a in ledger.attempts("v1.1")] == ["failed"]
  summary = json.loads((wd / "summary.json").read_text())
  failures = summary["infrastructure_failures"]
  assert [f["kind"] for f in failures["v1.0"]] == ["crash (signal 9)"]
  assert [f["kind"] for f in failures["v1.1"]] == ["disk full", "disk full"]
  assert "v1.2" not in failures
  assert "Infrastructure failures (not evidence)" in (wd / "report.html").read_text()
  # The pruned branch never counts towards an escalation; the rejected ones do.
  rejected = [v.id for v in ledger.children("v0") if v.status == "rejected"]
  assert "v1.2" in rejected and "v1.1" not in rejected
  if ledger.incumbent().id == "v0":
    assert ledger.consecutive_rejections() == len(rejected)


@pytest.mark.slow
def test_no_branch_could_train_stops_the_run_and_a_relaunch_retries(tmp_path):
  plan = tmp_path / "plan.json"
  plan.write_text(json.dumps({"v1.0": ["disk"], "v1.1": ["disk"]}))
  c, ledger, _ = make(tmp_path, {}, trainer=PlantedTrainer(plan), branches=2)
  with pytest.raises(infra.InfrastructureError, match="no branch of generation 1 could "
                                                      "train.*v1.0: disk full"):
    c.run()
  assert [ledger.version(v).status for v in ("v1.0", "v1.1")] == ["running", "running"]
  assert not ledger.get_meta("controller/generation")
  plan.write_text(json.dumps({}))  # the disk was cleaned up
  ledger.close()
  c, ledger, _ = make(tmp_path, {}, trainer=PlantedTrainer(plan), branches=2)
  c.run()
  assert all("result" in ledger.version(v).metrics for v in ("v1.0", "v1.1"))
  assert ledger.get_meta("controller/generation") == 1
