"""Planted faults in the real job (tests/evolution/planted_faults.gin through the
launcher, evolve mode, branches trained for real with the tiny model, from the main
job's warm start: a root that solves ~1/3 of validation problems): generation 1 trains
exactly two changes and the control from the root.

  lr ×33       the policy collapses within a few steps (completion length and truncation
               climb, sampled reward falls to 0): the `training_drift` diagnostic fires
               on the branch and `training_stability` rejects it; its greedy answers to
               the canary prompts (known answers, shipped as data) fall to nothing, so
               `canary_prompts` rejects it too
  lenient      a verifier that accepts every answer: the branch scores 1.0 and would
  verifier     beat the control by far; `strict_verifier_agreement` re-checks its
               episodes with the task's strict verifier and rejects it

A failed validator is the first verdict `Promotion._verdict` gives (before collapsed or
worse-beyond-noise), so a rejected branch's verdict is 'validator' and its reason names
the validators that failed. The control, trained the same way without the faults, passes
training_stability and strict_verifier_agreement.

Run once with `evolve.validators = [@ProxyTrueDisagreement(), @ExploitProbe()]` (the
gates removed) this test fails: the lenient branch is kept as the incumbent (avg 1.0,
beats the control beyond noise).
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
# limit (with tiny.gin's 8 every completion is truncated and length cannot drift; the
# warm start writes `a+b = c <answer>c</answer>`, lengths ~9), and evaluations and
# checkpoints at a branch's start and end only (tiny.gin: every step).
BUDGET = ["evolve.generations = 1", "evolve.branches = 2", "evolve.branch_steps = 10",
          "SamplingParams.max_new_tokens = 16", "EvalConfig.max_new_tokens = 16",
          "EvalConfig.num_problems = 32", "EvalConfig.k = 4", "train.eval_every = 10",
          "train.checkpoint_every = 10"]


def launch(workdir, warm_start, *extra):
  bindings = [*BUDGET, *warm_start, *extra]
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
@pytest.mark.slow
def test_the_gates_fire_on_planted_faults_in_the_real_job(tmp_path, solving_warm_start):
  workdir = tmp_path / "evo"
  proc = launch(workdir, solving_warm_start)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  gen1 = {v["id"]: v for v in summary["versions"] if v["parent"] == "v0"}
  assert sorted(gen1) == ["v1.0", "v1.1", "v1.c"], gen1
  (drift,) = [v for v in gen1.values() if "Learner.learning_rate" in v["intervention"]]
  (lenient,) = [v for v in gen1.values() if "AcceptAllVerifier" in v["intervention"]]
  control = gen1["v1.c"]
  assert summary["incumbent"] == "v0"  # neither planted change is kept

  # (a) lr x33: the policy's own curves show the collapse (hand-checkable ends).
  series = json.loads((workdir / "versions" / drift["id"] / "branch_result.json")
                      .read_text())["series"]
  n0, n1 = ends(series["length"])
  t0, t1 = ends(series["truncated"])
  # drift_signals' bounds: length +25%, truncation +0.1
  assert n1 > 1.25 * n0, series["length"]
  assert t1 - t0 > 0.1, series["truncated"]
  assert max(series["reward"]) > 0 and series["reward"][-1] == 0, series["reward"]
  assert drift["status"] == "rejected" and drift["verdict"] == "validator"
  assert drift["reason"].startswith("rejected by validator training_stability, canary_prompts: "
                                    "training_stability: fail"), drift["reason"]
  for what in ("completion length crept", "truncation rose", "sampled reward fell"):
    assert what in drift["reason"], drift["reason"]
  assert drift["validators"]["training_stability"] == "fail"
  with Ledger(workdir / "ledger.sqlite") as ledger:
    found = ledger.findings(version=drift["id"], stage="verify")
    decisions = {d.version_id: d for d in ledger.decisions() if d.version_id}
  (f,) = [f for f in found if f.kind == "training_drift"]
  # Length, truncation and reward always fire here; entropy's rise crosses its bound on
  # some installs and not others (its end value 1.231 on one, below the bound on another),
  # so it may be a fourth signal.
  kinds = [e[0] for e in f.evidence]
  assert f.value == len(kinds) and f.message.startswith("training drifts toward collapse")
  assert kinds in (["series:length", "series:truncated", "series:reward"],
                   ["series:entropy", "series:length", "series:truncated", "series:reward"])
  assert decisions[drift["id"]].outcome == "failure"
  assert "training_stability" in decisions[drift["id"]].why

  # ... and its greedy canary answers: hand-checked from the per-canary results the
  # validator reads (`canary` in each branch_result.json), paired with the root's.
  canary = {vid: json.loads((workdir / "versions" / vid / "branch_result.json")
                            .read_text())["canary"] for vid in ("v0", drift["id"])}
  root, fallen = canary["v0"], canary[drift["id"]]
  lost = sum(root[c] > fallen[c] for c in root)
  won = sum(root[c] < fallen[c] for c in root)
  assert len(root) >= 100 and sum(root.values()) / len(root) > 0.2, root  # a root that solves
  assert lost >= 10 and won == 0, (lost, won)  # sign test p = 2^-lost < 0.01
  assert drift["validators"]["canary_prompts"] == "fail"
  assert "canary_prompts: fail, canary accuracy 0.000" in drift["reason"], drift["reason"]
  assert "below the parent (paired on" in drift["reason"], drift["reason"]

  # (b) the lenient verifier: a perfect validation score, rejected by the strict check
  # with an episode it disagrees on as evidence.
  assert lenient["heldout_avg8"] == 1.0 > control["heldout_avg8"]
  assert lenient["status"] == "rejected" and lenient["verdict"] == "validator"
  # (Trained on a reward that pays every answer, it also loses canaries: canary_prompts
  # may fail beside it.)
  assert lenient["reason"].startswith("rejected by validator strict_verifier_agreement"), (
      lenient["reason"])
  assert "strict_verifier_agreement: fail, strict verifier agrees on " in lenient["reason"]
  assert f"e.g. {lenient['id']}/" in lenient["reason"]
  assert lenient["validators"]["strict_verifier_agreement"] == "fail"
  assert "training_drift" not in {f.kind for f in ledger_findings(workdir, lenient["id"])}

  # The control, trained the same way without the faults, passes both gates. (Not
  # asserted: its canaries. 10 steps of RL from this root also cost the control some
  # canaries and validation score, e.g. 34 lost / 17 gained, p = 0.012, a pass at alpha
  # 0.01 in one run: a margin too thin to pin in a test.)
  assert control["status"] == "pruned"
  assert control["validators"]["training_stability"] == "pass"
  assert control["validators"]["strict_verifier_agreement"] == "pass"


def ledger_findings(workdir, vid):
  with Ledger(workdir / "ledger.sqlite") as ledger:
    return ledger.findings(version=vid)
