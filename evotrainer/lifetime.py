"""Child processes that end when the process that started them ends.

A branch training is a child process of the evolution controller, and the controller is
a child of whatever launched it (a benchmark, a scheduler). When a parent is killed
(`kill`, a scheduler's preemption, an out-of-memory kill), Python runs no `finally` and
the child would go on: it keeps the CPU, keeps writing into a run directory that a
relaunch then finds locked or half rewritten. So a parent that starts an EvoTrainer
process names itself in the child's environment (`child_env`), and the child, first
thing (`die_with_launcher`, called by `evotrainer.launch`), asks the kernel to send it
SIGTERM when that parent ends (Linux `PR_SET_PDEATHSIG`; elsewhere nothing happens).
Checkpoints and the ledger are written atomically, so a child ended this way loses only
its unfinished step, as after any crash.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Mapping, Optional

PARENT_ENV = "EVOTRAINER_PARENT_PID"  # the pid of the process a child should die with
_PR_SET_PDEATHSIG = 1


def child_env(env: Optional[Mapping[str, str]] = None) -> dict:
  """`env` (default: this process's environment) naming this process as the parent a
  child started with it dies with."""
  return {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
  """Asks for `sig` when the parent ends (the kernel watches the thread that started
  this process). Returns False when the parent `parent_pid` is already gone (the caller
  should exit), True otherwise, also where the kernel offers no such request."""
  if sys.platform.startswith("linux"):
    try:
      ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
      pass
  return os.getppid() == parent_pid  # checked after the request: no window is missed


def die_with_launcher() -> None:
  """In a process started with `child_env`: end with that parent, and exit now if it
  has already ended. A process started any other way is left alone. The variable is
  taken out of this process's environment, so what it starts in turn is not bound to
  a grandparent (unless started with `child_env` again)."""
  pid = os.environ.pop(PARENT_ENV, None)
  if pid and pid.isdigit() and not die_with_parent(int(pid)):
    sys.exit(f"error: the process that started this one ({pid}) has already ended")
