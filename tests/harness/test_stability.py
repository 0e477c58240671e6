"""Drift toward collapse over a training segment: signals by hand, the diagnostic's
finding and the stability validator, on the shapes of a healthy and a drifting version."""

import numpy as np
import pytest

from evotrainer.harness.base import Evidence
from evotrainer.harness.diagnostics.stability import TrainingDrift, drift_signals
from evotrainer.harness.validators import TrainingStability

STEPS = 50


def healthy():
  """A main-job version's shape: entropy ~0.2, length ~9.5, no truncation, reward rising."""
  rng = np.random.default_rng(0)
  return {"entropy": list(0.2 + 0.01 * rng.standard_normal(STEPS)),
          "length": list(9.5 + 0.1 * rng.standard_normal(STEPS)),
          "truncated": [0.0] * STEPS, "clip_frac": [0.0] * STEPS,
          "reward": list(np.linspace(0.3, 0.4, STEPS)),
          "correct": list(np.linspace(0.3, 0.4, STEPS))}


def drifting():
  """The drifting version of a collapse: entropy 0.13 -> 0.22, length 9.9 -> 14.4."""
  return {**healthy(), "entropy": list(np.linspace(0.13, 0.22, STEPS)),
          "length": list(np.linspace(9.9, 14.4, STEPS))}


def test_a_healthy_segment_has_no_signal():
  assert drift_signals(healthy()) == []


def test_a_drifting_segment_by_hand():
  signals = {s["series"]: s for s in drift_signals(drifting())}
  assert set(signals) == {"entropy", "length"}
  e = np.linspace(0.13, 0.22, STEPS)
  assert signals["entropy"]["first"] == pytest.approx(e[:5].mean())
  assert signals["entropy"]["last"] == pytest.approx(e[-5:].mean())  # +64%, +0.08 nats
  n = np.linspace(9.9, 14.4, STEPS)
  assert signals["length"]["last"] / signals["length"]["first"] == pytest.approx(
      n[-5:].mean() / n[:5].mean())


def test_the_reward_falling_from_its_best():
  s = {**healthy(), "reward": [0.4] * 25 + [0.1] * 25}
  (sig,) = drift_signals(s)
  assert sig["series"] == "reward" and sig["first"] == pytest.approx(0.4)
  assert sig["last"] == pytest.approx(0.1)


def test_the_diagnostic_fires_with_the_curves_as_evidence():
  assert TrainingDrift()([], {"series": healthy()}).findings == ()
  rep = TrainingDrift()([], {"series": drifting()})
  (f,) = rep.findings
  assert rep.metrics == {"drift_signals": 2.0} and f.kind == "training_drift"
  # 0.13 + 2 x 0.09 / 49 and 0.22 - 2 x 0.09 / 49: the means of the two 5-step ends
  assert "entropy rose 0.134 -> 0.216" in f.message and "length crept" in f.message
  assert [e[0] for e in f.evidence] == ["series:entropy", "series:length"]
  assert TrainingDrift()([], {}).metrics == {}  # no series: nothing to say


def test_the_validator_blocks_drift_and_collapse_not_health():
  v = TrainingStability()
  ok = v(Evidence(episodes=[], series=healthy(), heldout={}))
  assert ok.passed and ok.applicable and ok.value == 0.0
  bad = v(Evidence(episodes=[], series=drifting(), heldout={}))
  assert not bad.passed and "2 drift signals" in bad.reason
  one = v(Evidence(episodes=[], series={**healthy(), "truncated": [0.0] * 25 + [0.3] * 25},
                   heldout={}))
  assert one.passed and one.value == 1.0  # one signal alone is not enough ...
  fall = v(Evidence(episodes=[], series={**healthy(), "reward": [0.4] * 25 + [0.05] * 25},
                    heldout={}))
  assert not fall.passed  # ... unless it is the reward collapsing
  short = v(Evidence(episodes=[], series={"reward": [0.1] * 4}, heldout={}))
  assert short.passed and not short.applicable
  with_gaps = {**drifting(), "clip_frac": [None] * STEPS}  # a metric a step lacked
  assert not v(Evidence(episodes=[], series=with_gaps, heldout={})).passed
