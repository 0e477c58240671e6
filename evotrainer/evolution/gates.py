"""Human gates of the evolution loop (`Controller(human_gated=True)`).

In human-gated mode the controller stops at each of GATES in a generation: it writes
`<workdir>/gate.json` (what it is about to do) and waits until the `approve` file appears
(`python -m evotrainer.launch --approve=<stage>`, i.e. `approve_gate`; an approval
naming another gate is ignored) or its `approve` callable
says yes. An approval is stored in the ledger (`controller/gate/<gen>/<stage>`), so a
relaunch never asks twice.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any, Mapping

from evotrainer import atomic

GATES = ("diagnosis", "design", "backtest", "verification")


class GateTimeout(TimeoutError):
  """A human gate was not approved within `gate_timeout_s`."""


class GateError(RuntimeError):
  """No gate is waiting for an approval in the given run directory."""


def approve_gate(workdir: str | os.PathLike, gate: str | None = None) -> str:
  """Approves the gate a human-gated run in `workdir` waits at (`--approve=GATE`): writes
  the `approve` file the controller polls for, naming the gate; returns what was approved.

  `gate`: the waiting gate's stage (e.g. 'design'), optionally `stage@generation`; any
  other gate is refused, so an approval never passes a gate its author did not see.
  None approves whatever waits (library use)."""
  gate_path, flag = pathlib.Path(workdir) / "gate.json", pathlib.Path(workdir) / "approve"
  if not gate_path.exists():
    raise GateError(f"no gate is waiting in {workdir} (no gate.json)")
  try:
    waiting = json.loads(gate_path.read_text())
  except (OSError, ValueError) as e:
    raise GateError(f"{gate_path} is unreadable: {e}") from None
  stage, gen = waiting.get("stage"), waiting.get("generation")
  if gate is not None:
    name, _, want_gen = str(gate).partition("@")
    if name != stage or (want_gen and want_gen != str(gen)):
      raise GateError(f"the gate waiting in {workdir} is '{stage}' of generation {gen}, not "
                      f"'{gate}'; read {gate_path}, then --approve={stage}")
  flag.write_text(json.dumps({"approved_at": time.time(), "stage": stage,
                              "generation": gen}) + "\n")
  return f"approved gate '{stage}' of generation {gen} in {workdir}"


def _approval_matches(flag: pathlib.Path, stage: str, gen: int) -> bool:
  """Whether the `approve` file approves this gate: an empty file (a person's `touch`)
  does; a file naming another gate (an approval given for an earlier one) does not."""
  try:
    data = json.loads(flag.read_text() or "{}")
  except (OSError, ValueError):
    return True
  return data.get("stage", stage) == stage and data.get("generation", gen) == gen


def write_json(path: pathlib.Path, data: Any) -> None:
  """Writes `data` as JSON to `path` atomically (`atomic.write_json`)."""
  atomic.write_json(path, data, indent=2, default=str)


class HumanGates:
  """The Controller's gate step (a mixin). Uses the host's `ledger`, `workdir`,
  `human_gated`, `approve`, `poll_s` and `gate_timeout_s`."""

  def _gate(self, stage: str, gen: int, payload: Mapping) -> None:
    """Human-gated mode: write gate.json and wait for approval (file or callable)."""
    if not self.human_gated:
      return
    key = f"controller/gate/{gen}/{stage}"
    if self.ledger.get_meta(key):
      return
    gate = {"stage": stage, "generation": gen, "awaiting": payload,
            "approve": f"python -m evotrainer.launch --workdir={self.workdir} "
                       f"--approve={stage} (or create {self.workdir / 'approve'})"}
    path, flag = self.workdir / "gate.json", self.workdir / "approve"
    write_json(path, gate)
    print(f"[evotrainer] human gate '{stage}' (generation {gen}) waits; see {path}; "
          f"approve: {gate['approve']}", flush=True)
    start = time.time()
    while True:
      if flag.exists():
        ok = _approval_matches(flag, stage, gen)
        flag.unlink()
        if ok:
          break
        print(f"[evotrainer] ignored an approval given for another gate; '{stage}' "
              f"(generation {gen}) still waits", flush=True)
      if self.approve is not None and self.approve(gate):
        break
      if self.gate_timeout_s is not None and time.time() - start > self.gate_timeout_s:
        raise GateTimeout(f"gate {stage} of generation {gen} not approved within "
                          f"{self.gate_timeout_s}s (see {path})")
      time.sleep(self.poll_s)
    self.ledger.set_meta(key, {"approved": True})
    path.unlink(missing_ok=True)


__all__ = ["GATES", "GateError", "GateTimeout", "HumanGates", "approve_gate", "write_json"]
