"""bench/step_gain.py: what unchanged steps gain on validation, and credit net of it."""

import json
import math

import pytest

from evotrainer.evolution.skills import Skill, SkillLibrary


def _run(wd, evals):
  """A run directory whose metrics.jsonl holds training rows and `eval/avg8` rows."""
  wd.mkdir(parents=True)
  rows = []
  for step, avg in sorted(evals.items()):
    rows += [{"step": step, "eval/avg8": avg, "eval/pass8": 1.0}, {"step": step + 1,
                                                                    "correct": 0.5}]
  (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(wd)


def _pool(path):
  lib = SkillLibrary.seeded(path, sources=[])
  for name in ("uncontrolled", "controlled"):
    lib.add(Skill(name=name, category="reward design", description="d",
                  trigger={"finding": "prose_rate", "op": ">", "value": 0.5},
                  intervention={"binding": "Harness.estimator", "kind": "set",
                                "value": "rloo" if name == "controlled" else "grpo"},
                  expected_outcome="e", validation_criterion="v", domains={}))
  effect = {"diff": 0.1, "lo": 0.05, "hi": 0.15}
  lib.record_outcome("uncontrolled", "code", None, version="v1.0", run="a",
                     effect={**effect, "against": "parent"}, selected=True)
  lib.record_outcome("uncontrolled", "code", None, version="v1.0", run="b", effect=effect)
  lib.record_outcome("uncontrolled", "code", None, version="v1.0", run="c",
                     effect={"diff": 0.5, "lo": 0.45, "hi": 0.55, "against": "control"})
  lib.record_outcome("controlled", "code", None, version="v1.0", run="a",
                     effect={"diff": 0.5, "lo": 0.45, "hi": 0.55, "against": "control"})
  return str(path)


def test_step_gain_and_credit_net_of_it_by_hand(tmp_path):
  """Run a gains 0.05, 0.0, 0.05 over its windows from step 8 (0 -> 8 is the root's),
  run b 0.1: the mean over windows 0.05; resampling whole runs gives 0.0333 (a, a), 0.05
  or 0.1 (b, b), so the interval is [0.0333, 0.1]. The uncontrolled skill's two effects
  against the parent (one recorded before `against` existed) pool to 0.1 with se
  0.0255 / sqrt(2) = 0.01804; the step gain's se is 0.0667 / 3.92 = 0.01701: net 0.05,
  se 0.02479, lo 0.0014. Its effect against a control, and the controlled skill, are
  not credited here. Without run a's, the keep that learned it, one effect is left:
  se 0.0255, net 0.05 with se hypot(0.0255, 0.01701)."""
  from bench import step_gain
  a = _run(tmp_path / "static-s1", {0: 0.2, 8: 0.3, 16: 0.35, 24: 0.35, 32: 0.4})
  b = _run(tmp_path / "static-s2", {0: 0.2, 8: 0.3, 16: 0.4})
  out = step_gain.main(["--run", a, "--run", b, "--pool", _pool(tmp_path / "pool"),
                        "--bootstrap_n", "2000", "--json", str(tmp_path / "out.json")])
  assert [w["gain"] for w in out["runs"]["static-s1"]] == pytest.approx([0.05, 0.0, 0.05])
  assert [(w["from"], w["to"]) for w in out["runs"]["static-s2"]] == [(8, 16)]
  gain = out["step_gain"]
  assert gain["mean"] == pytest.approx(0.05)
  assert (gain["lo"], gain["hi"]) == pytest.approx((0.1 / 3, 0.1))
  assert (gain["n_windows"], gain["n_runs"]) == (4, 2)
  assert set(out["skills"]) == {"uncontrolled"}
  skill = out["skills"]["uncontrolled"]
  assert skill["against_parent"]["mean"] == pytest.approx(0.1)
  assert skill["against_parent"]["n"] == 2
  assert skill["net_of_steps"]["mean"] == pytest.approx(0.05)
  se = math.hypot(0.05 / 1.96 / math.sqrt(2), (0.1 - 0.1 / 3) / 3.92)
  assert skill["net_of_steps"]["lo"] == pytest.approx(0.05 - 1.96 * se)
  assert skill["beyond_steps"] is True
  replicated = skill["replications"]
  assert replicated["against_parent"]["n"] == 1
  assert replicated["net_of_steps"]["mean"] == pytest.approx(0.05)
  se = math.hypot(0.05 / 1.96, (0.1 - 0.1 / 3) / 3.92)
  assert replicated["net_of_steps"]["lo"] == pytest.approx(0.05 - 1.96 * se)
  assert replicated["beyond_steps"] is False
  assert json.loads((tmp_path / "out.json").read_text()) == out


def test_bad_runs_are_clear_errors(tmp_path):
  from bench import step_gain
  with pytest.raises(SystemExit):
    step_gain.main(["--run", str(tmp_path / "missing")])
  wd = tmp_path / "static-s1"
  _run(wd, {8: 0.3})
  with pytest.raises(ValueError, match="no run has two evaluations a window apart"):
    step_gain.main(["--run", str(wd)])
  (wd / "metrics.jsonl").write_text('{"step": 8, "eval/avg8": 0.3}\nnot json\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not JSON"):
    step_gain.main(["--run", str(wd)])
