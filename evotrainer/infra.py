"""Infrastructure failures of a branch training, kept apart from scientific rejections.

A branch that could not train says nothing about its hypothesis: a child process that
crashed (a signal, an unexplained traceback), a missing or unreadable parent checkpoint,
a configuration or model mismatch, out of memory, a full disk, a workdir locked by
another process. Such a failure is retried once (`train_with_retry`); if it fails again
it is recorded under the ledger meta key `controller/infra/<version>` and the version is
set aside (`pruned`, "not evidence") instead of rejected, so it never counts as a
rejection, as a skill's failure, or towards an escalation. When no branch of a
generation could train, the run stops (`InfrastructureError`, exit code 2) with the
cause and leaves those versions untried, so a relaunch after the fix trains them.

Only a branch that ran out of its wall-clock budget (`evolve.branch_timeout_s`) is still a
rejection: its change made training too slow, which is evidence.

The child's one-line error (`error (<kind>): ...`, launch.py) names the kind; a child
killed by a signal is a crash.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Mapping, Optional, Sequence, TypeVar

T = TypeVar("T")

META = "controller/infra/"  # + version id: [{kind, message, time}, ...]

# Kinds of the child's one-line error (errors.py) that are infrastructure.
_CHILD_KINDS = {"lock": "workdir locked", "workdir": "config mismatch",
                "checkpoint": "missing or corrupt checkpoint", "disk": "disk full",
                "permissions": "permissions", "memory": "out of memory",
                "config": "config error", "data": "data error", "sweep": "config error",
                "infrastructure": "infrastructure"}
_PATTERNS = (
    ("out of memory", re.compile(r"MemoryError|RESOURCE_EXHAUSTED|[Oo]ut of memory")),
    ("disk full", re.compile(r"No space left on device|ENOSPC|[Dd]isk quota exceeded")),
    ("missing or corrupt checkpoint",
     re.compile(r"CheckpointError|no complete checkpoint|checkpoint .*(not found|does not "
                r"exist)|FileNotFoundError: .*(model|checkpoint)")),
    ("config mismatch", re.compile(r"shape mismatch|another configuration|trained with "
                                   r"another tokenizer")),
)


class InfrastructureError(RuntimeError):
  """The run cannot go on: no branch of a generation (or the root) could train."""


class InfraFailure(Exception):
  """A training attempt failed for a reason that is not evidence about its change."""

  def __init__(self, kind: str, message: str):
    super().__init__(kind, message)
    self.kind, self.message = kind, message

  def __str__(self) -> str:
    return f"{self.kind}: {self.message}"


def classify(rc, log_tail: str) -> Optional[str]:
  """The infrastructure kind of a failed child (`rc`: its exit code or 'timeout'), or
  None for a failure that is evidence (a timeout)."""
  if rc == "timeout":
    return None
  m = re.findall(r"^error \((\w+)\):", log_tail, flags=re.M)
  if m and m[-1] in _CHILD_KINDS:
    return _CHILD_KINDS[m[-1]]
  for kind, pattern in _PATTERNS:
    if pattern.search(log_tail):
      return kind
  if isinstance(rc, int) and (rc < 0 or rc >= 128):
    return f"crash (signal {-rc if rc < 0 else rc - 128})"
  return "crash"


def as_failure(e: BaseException) -> Optional[InfraFailure]:
  """An InfraFailure for an exception a trainer raised, None when it is evidence."""
  from evotrainer.evolution.trainer import BranchFailed
  if isinstance(e, InfraFailure):
    return e
  if isinstance(e, BranchFailed):
    kind = classify(e.rc, e.log_tail)
    return None if kind is None else InfraFailure(kind, str(e).splitlines()[0][:400])
  if isinstance(e, TimeoutError):
    return None
  kind = classify(None, f"{type(e).__name__}: {e}")
  return InfraFailure(kind, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                            [:400])


def train_with_retry(train: Callable[[], T], *, retries: int = 1,
                     on_retry: Optional[Callable[[InfraFailure], None]] = None) -> T:
  """`train()`, retried `retries` times after an infrastructure failure. Raises the last
  InfraFailure, or the exception itself when it is evidence (a timeout)."""
  for attempt in range(retries + 1):
    try:
      return train()
    except Exception as e:  # pylint: disable=broad-except
      failure = as_failure(e)
      if failure is None:
        raise
      if attempt == retries:
        raise failure from e
      if on_retry is not None:
        on_retry(failure)
  raise AssertionError("unreachable")


def record(ledger, vid: str, failure: InfraFailure) -> None:
  """Appends `failure` to the version's infrastructure record in the ledger."""
  key = META + vid
  ledger.set_meta(key, [*ledger.get_meta(key, []),
                        {"kind": failure.kind, "message": failure.message,
                         "time": time.time()}])


def failures(ledger) -> dict:
  """{version: [failure records]} of the run (for the summary and the report)."""
  return {k[len(META):]: v for k, v in ledger.meta_items(META).items()}


def settle_generation(ledger, gen: int, branches: Sequence[Mapping],
                      results: Mapping[str, object], failed: Mapping[str, InfraFailure]) -> None:
  """After a generation's trainings: stops the run when no branch trained and every one
  failed for infrastructure reasons (they stay untried: a relaunch retries them); else
  sets the infrastructure-failed ones aside as `pruned` (not evidence)."""
  ids = [b["version"] for b in branches]
  if ids and all(results.get(v) is None for v in ids) and all(v in failed for v in ids):
    causes = "; ".join(f"{v}: {failed[v]}" for v in ids)
    raise InfrastructureError(
        f"no branch of generation {gen} could train (infrastructure, not evidence): {causes}; "
        f"fix the cause (see versions/<id>/branch.log) and relaunch the same command: those "
        f"branches are retried")
  for v, f in failed.items():
    if ledger.version(v).status == "running":
      ledger.set_status(v, "pruned", f"infrastructure failure ({f.kind}), not evidence: "
                                     f"{f.message[:300]}")


__all__ = ["InfraFailure", "InfrastructureError", "META", "as_failure", "classify",
           "failures", "record", "settle_generation", "train_with_retry"]
