"""Human gates of the evolution loop (`evolve.human_gated = True`).

In human-gated mode the controller stops at each of GATES in a generation: it writes
`<workdir>/gate.json` (what it is about to do) and waits until the `approve` file appears
(`python -m evotrainer.launch --approve=<stage>`, i.e. `approve_gate`; an approval
naming another gate is ignored) or its `approve` callable
says yes. An approval is stored in the ledger (`controller/gate/<gen>/<stage>`), so a
relaunch never asks twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any, Callable, Mapping, Optional

import gin

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


@gin.configurable(module="evolution", denylist=["human_gated"])
@dataclasses.dataclass(frozen=True)
class GateConfig:
  """Knobs of the human gates (gin: `GateConfig.poll_s`, ...; `evolve.human_gated`).

  Attributes:
    human_gated: stop at GATES for approval (set by `evolve.human_gated`).
    poll_s: seconds between two looks for an approval.
    gate_timeout_s: how long a gate waits (None: forever); then `GateTimeout`.
  """
  human_gated: bool = False
  poll_s: float = 2.0
  gate_timeout_s: Optional[float] = None

  def __post_init__(self):
    if not self.poll_s > 0:
      raise ValueError(f"GateConfig.poll_s={self.poll_s}; expected > 0 seconds")
    if self.gate_timeout_s is not None and self.gate_timeout_s < 0:
      raise ValueError(f"GateConfig.gate_timeout_s={self.gate_timeout_s}; expected >= 0 "
                       f"seconds or None (wait forever)")


class HumanGates:
  """The controller's human gates over `ledger` in run directory `workdir`.

  Args:
    config: the gate knobs (`human_gated` False: every gate passes at once).
    ledger: the run's ledger (approvals are stored there).
    workdir: where gate.json is written and the `approve` file is polled for.
    approve: `(gate: dict) -> bool`, polled at a gate beside the file (None: file only).
  """

  def __init__(self, config: GateConfig, ledger: Any, workdir: pathlib.Path,
               approve: Optional[Callable[[dict], bool]] = None):
    self.config, self.ledger, self.workdir, self.approve = config, ledger, workdir, approve

  def gate(self, stage: str, gen: int, payload: Mapping) -> None:
    """Human-gated mode: write gate.json and wait for approval (file or callable)."""
    key = f"controller/gate/{gen}/{stage}"
    if not self.config.human_gated or self.ledger.get_meta(key):
      return
    gate = {"stage": stage, "generation": gen, "awaiting": payload,
            "approve": f"python -m evotrainer.launch --workdir={self.workdir} "
                       f"--approve={stage} (or create {self.workdir / 'approve'})"}
    path = self.workdir / "gate.json"
    write_json(path, gate)
    print(f"[evotrainer] human gate '{stage}' (generation {gen}) waits; see {path}; "
          f"approve: {gate['approve']}", flush=True)
    self._wait(gate, path)
    self.ledger.set_meta(key, {"approved": True})
    path.unlink(missing_ok=True)

  def _wait(self, gate: Mapping, path: pathlib.Path) -> None:
    """Polls until the `approve` file approves `gate` or the callable says yes."""
    stage, gen, flag = gate["stage"], gate["generation"], self.workdir / "approve"
    start, timeout = time.time(), self.config.gate_timeout_s
    while True:
      if flag.exists():
        ok = _approval_matches(flag, stage, gen)
        flag.unlink()
        if ok:
          return
        print(f"[evotrainer] ignored an approval given for another gate; '{stage}' "
              f"(generation {gen}) still waits", flush=True)
      if self.approve is not None and self.approve(gate):
        return
      if timeout is not None and time.time() - start > timeout:
        raise GateTimeout(f"gate {stage} of generation {gen} not approved within "
                          f"{timeout}s (see {path})")
      time.sleep(self.config.poll_s)


__all__ = ["GATES", "GateConfig", "GateError", "GateTimeout", "HumanGates", "approve_gate",
           "write_json"]
