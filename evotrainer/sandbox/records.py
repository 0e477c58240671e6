"""What a sandbox run takes (limits) and what it returns (a record), and how a raw wait
status becomes a `Status`."""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import signal


class Status(str, enum.Enum):
  """How a run ended. A str enum, so records serialize as plain JSON strings."""
  OK = "ok"                        # exit code 0
  RUNTIME_ERROR = "runtime_error"  # non-zero exit code (an uncaught exception: 1)
  TIMEOUT = "timeout"              # wall-clock timeout, or the CPU-seconds rlimit
  MEMORY = "memory"                # MemoryError at the address-space limit, or cgroup OOM
  OUTPUT_LIMIT = "output_limit"    # stdout or stderr went past the cap; the run was ended
  KILLED = "killed"                # ended by a signal (segfault, abort, SIGKILL, ...)


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-run limits; every process of the run gets them as rlimits.

  Attributes:
    memory_mb: address space of each process (RLIMIT_AS), MiB.
    processes: processes and threads of the run's own uid (RLIMIT_NPROC).
    file_mb: largest file the run may write (RLIMIT_FSIZE), MiB.
    open_files: open file descriptors per process (RLIMIT_NOFILE).
    output_bytes: cap on each of stdout and stderr; past it the run ends with
      `Status.OUTPUT_LIMIT` and the kept prefix is marked truncated.
    cpu_s: CPU seconds per process (RLIMIT_CPU); None: the timeout rounded up, plus 1.
  """
  memory_mb: int = 512
  processes: int = 64
  file_mb: int = 16
  open_files: int = 256
  output_bytes: int = 1 << 20
  cpu_s: int | None = None

  def as_request(self, timeout_s: float) -> dict:
    cpu = self.cpu_s if self.cpu_s is not None else math.ceil(timeout_s) + 1
    for name in ("memory_mb", "processes", "file_mb", "open_files", "output_bytes"):
      if getattr(self, name) <= 0:
        raise ValueError(f"Limits.{name} must be positive, got {getattr(self, name)}")
    return {"memory_mb": self.memory_mb, "processes": self.processes,
            "file_mb": self.file_mb, "open_files": self.open_files,
            "output_bytes": self.output_bytes, "cpu_s": max(1, int(cpu))}


@dataclasses.dataclass(frozen=True)
class CellLimits:
  """Limits of a whole cell (all the runs it hosts, one at a time).

  Attributes:
    tmp_mb: size of the cell's private tmpfs (the runs' working directories), MiB.
    memory_mb: cgroup memory limit of the cell, MiB, where the machine allows cgroups.
    pids: cgroup pids.max of the cell, where the machine allows cgroups.
  """
  tmp_mb: int = 128
  memory_mb: int = 2048
  pids: int = 256


@dataclasses.dataclass(frozen=True)
class RunResult:
  """The record of one run.

  Attributes:
    status: how it ended (see `Status`).
    exit_code: the exit code; minus the signal number when a signal ended it (as in
      `subprocess`); None when the cell itself had to be killed.
    stdout, stderr: the captured output (UTF-8, undecodable bytes replaced), each at most
      `Limits.output_bytes` long.
    stdout_truncated, stderr_truncated: the program wrote more than the cap.
    wall_s: wall-clock seconds from fork to the end of the run.
    cpu_s: user + system CPU seconds of the run's processes.
    max_rss_mb: peak resident memory of the run's main process, MiB.
    isolated: False when it ran in the rlimits-only fallback (no namespaces).
  """
  status: Status
  exit_code: int | None
  stdout: str
  stderr: str
  stdout_truncated: bool
  stderr_truncated: bool
  wall_s: float
  cpu_s: float
  max_rss_mb: float = 0.0
  isolated: bool = True

  @property
  def ok(self) -> bool:
    return self.status is Status.OK


def status_of(raw: dict, cpu_limit_s: int) -> tuple[Status, int | None]:
  """Status and exit code from the worker's raw record (wait status, end reason)."""
  wait_status = raw["wait_status"]
  if os.WIFSIGNALED(wait_status):
    code = -os.WTERMSIG(wait_status)
  else:
    code = os.WEXITSTATUS(wait_status)
  if raw["reason"] == "timeout":
    return Status.TIMEOUT, code
  if raw["reason"] == "output_limit":
    return Status.OUTPUT_LIMIT, code
  if code < 0:
    signum = -code
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and
                                    raw["cpu_s"] >= cpu_limit_s - 0.05):
      return Status.TIMEOUT, code
    return Status.KILLED, code
  if code == 0:
    return Status.OK, code
  if raw["memory_error"]:
    return Status.MEMORY, code
  return Status.RUNTIME_ERROR, code
