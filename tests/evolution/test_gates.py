"""An approval names its gate: one given for another gate never passes this one."""

import json

import pytest

from evotrainer.evolution.gates import GateError, GateTimeout, approve_gate
from tests.evolution.test_controller import EFFECTS, make


def test_an_approval_for_another_gate_does_not_pass(tmp_path):
  c, ledger, trainer = make(tmp_path, EFFECTS, human_gated=True, poll_s=0.01,
                            gate_timeout_s=0.5)
  flag = tmp_path / "run" / "approve"
  flag.parent.mkdir(parents=True, exist_ok=True)
  flag.write_text(json.dumps({"stage": "design", "generation": 1}))  # a stale approval
  with pytest.raises(GateTimeout, match="gate diagnosis of generation 1"):
    c.run()
  assert not flag.exists()  # consumed, not honoured
  assert not ledger.get_meta("controller/gate/1/diagnosis")
  waiting = json.loads((tmp_path / "run" / "gate.json").read_text())
  assert waiting["stage"] == "diagnosis" and "--approve=diagnosis" in waiting["approve"]
  with pytest.raises(GateError, match="is 'diagnosis' of generation 1, not 'design@1'"):
    approve_gate(tmp_path / "run", "design@1")
  assert "approved gate 'diagnosis'" in approve_gate(tmp_path / "run", "diagnosis@1")
  assert json.loads(flag.read_text())["stage"] == "diagnosis"
