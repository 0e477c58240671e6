"""Planted faults in the real job (tests/evolution/planted_faults.gin through the
launcher, evolve mode, branches trained for real with the tiny model): generation 1 trains
exactly two changes and the control from the root.

  lr ×33       training drifts toward collapse (entropy, completion length and
               truncation climb in the segment's last steps): the `training_drift`
               diagnostic fires on the branch and `training_stability` rejects it
  lenient      a verifier that accepts every answer: the branch scores 1.0 and would
  verifier     beat the control by far; `strict_verifier_agreement` re-checks its
               episodes with the task's strict verifier and rejects it

A failed validator is the first verdict `Promotion._verdict` gives (before collapsed or
worse-beyond-noise), so a rejected branch's verdict is 'validator' and its reason names
the validator. The control, trained the same way without the faults, passes both.

Run once with `evolve.validators = [@ProxyTrueDisagreement(), @ExploitProbe()]` (the two
gates removed) this test fails: the lenient branch is kept as the incumbent (avg 1.0,
beats the control beyond noise), and the drifting branch is rejected only as
'not_beyond_noise': the root solves ~1% of validation problems, so a fall to 0 is
neither collapsed nor worse beyond noise, and only training_stability sees it.
"""

import json
import os
import subprocess
import sys

import pytest

from evotrainer.evolution.ledger import Ledger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The cheapest budget where the signals are unambiguous: 10 RL steps (two 5-step windows
# of the drift signals), 16 new tokens so a healthy policy ends its answers before the
# limit (with tiny.gin's 8 every completion is truncated and length cannot drift), a
# warm start that writes `a+b = c <answer>c</answer>` (lengths ~9, no truncation), and
# evaluations and checkpoints at a branch's start and end only (tiny.gin: every step).
BUDGET = ["evolve.generations = 1", "evolve.branches = 2", "evolve.branch_steps = 10",
          "warm_start.steps = 300", "warm_start.target_accuracy = None",
          "SamplingParams.max_new_tokens = 16", "EvalConfig.max_new_tokens = 16",
          "EvalConfig.num_problems = 32", "EvalConfig.k = 4", "train.eval_every = 10",
          "train.checkpoint_every = 10"]


def launch(workdir, tmp_path, *extra):
  bindings = [*BUDGET, f"make_tokenizer.cache_dir = '{tmp_path}/tok'",
              f"warm_start.cache_dir = '{tmp_path}/ws'", *extra]
  return subprocess.run(
      [sys.executable, "-m", "evotrainer.launch",
       "--gin_file=tests/evolution/planted_faults.gin", "--gin_file=gin/tiny.gin",
       f"--workdir={workdir}", "--import=tests.user_components",
       *(f"--gin_bindings={b}" for b in bindings)],
      cwd=REPO, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=1200)


def ends(values, window=5):
  return sum(values[:window]) / window, sum(values[-window:]) / window


@pytest.mark.slow
def test_the_gates_fire_on_planted_faults_in_the_real_job(tmp_path):
  workdir = tmp_path / "evo"
  proc = launch(workdir, tmp_path)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  gen1 = {v["id"]: v for v in summary["versions"] if v["parent"] == "v0"}
  assert sorted(gen1) == ["v1.0", "v1.1", "v1.c"], gen1
  (drift,) = [v for v in gen1.values() if "Learner.learning_rate" in v["intervention"]]
  (lenient,) = [v for v in gen1.values() if "AcceptAllVerifier" in v["intervention"]]
  control = gen1["v1.c"]
  assert summary["incumbent"] == "v0"  # neither planted change is kept

  # (a) lr x100: the policy's own curves show the drift (hand-checkable ends).
  series = json.loads((workdir / "versions" / drift["id"] / "branch_result.json")
                      .read_text())["series"]
  e0, e1 = ends(series["entropy"])
  n0, n1 = ends(series["length"])
  t0, t1 = ends(series["truncated"])
  # drift_signals' bounds: entropy +50% (and +0.05 nats), length +25%, truncation +0.1
  assert e1 > 1.5 * e0 and e1 - e0 > 0.05, series["entropy"]
  assert n1 > 1.25 * n0, series["length"]
  assert t1 - t0 > 0.1, series["truncated"]
  assert drift["status"] == "rejected" and drift["verdict"] == "validator"
  assert drift["reason"].startswith("rejected by validator training_stability: "
                                    "training_stability: fail"), drift["reason"]
  for what in ("entropy rose", "completion length crept", "truncation rose"):
    assert what in drift["reason"], drift["reason"]
  assert drift["validators"]["training_stability"] == "fail"
  with Ledger(workdir / "ledger.sqlite") as ledger:
    found = ledger.findings(version=drift["id"], stage="verify")
    decisions = {d.version_id: d for d in ledger.decisions() if d.version_id}
  (f,) = [f for f in found if f.kind == "training_drift"]
  assert f.value == 3 and f.message.startswith("training drifts toward collapse")
  assert [e[0] for e in f.evidence] == ["series:entropy", "series:length",
                                        "series:truncated"]
  assert decisions[drift["id"]].outcome == "failure"
  assert "training_stability" in decisions[drift["id"]].why

  # (b) the lenient verifier: a perfect validation score, rejected by the strict check
  # with an episode it disagrees on as evidence.
  assert lenient["heldout_avg8"] == 1.0 > control["heldout_avg8"]
  assert lenient["status"] == "rejected" and lenient["verdict"] == "validator"
  assert lenient["reason"].startswith("rejected by validator strict_verifier_agreement: "
                                      "strict_verifier_agreement: fail, strict verifier "
                                      "agrees on "), lenient["reason"]
  assert f"e.g. {lenient['id']}/" in lenient["reason"]
  assert lenient["validators"]["strict_verifier_agreement"] == "fail"
  assert "training_drift" not in {f.kind for f in ledger_findings(workdir, lenient["id"])}

  # The control, trained the same way without the faults, passes both gates.
  assert control["status"] == "pruned"
  assert control["validators"]["training_stability"] == "pass"
  assert control["validators"]["strict_verifier_agreement"] == "pass"


def ledger_findings(workdir, vid):
  with Ledger(workdir / "ledger.sqlite") as ledger:
    return ledger.findings(version=vid)
