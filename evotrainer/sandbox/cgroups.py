"""cgroup v1 memory and pids limits for a cell, where the machine lets us write them.

A cell's processes are moved into `<our own cgroup>/evotrainer-sandbox-<name>` of the
`memory` and `pids` hierarchies, so the limits nest under whatever the machine already
imposes on us. Where the hierarchies are missing or read-only, the cell runs on rlimits
alone (`CellCgroup.create` returns None) and says so in `Cell.info`.
"""

from __future__ import annotations

import os
import signal
import time

ROOT = "/sys/fs/cgroup"


def _own_path(controller: str) -> str | None:
  try:
    with open("/proc/self/cgroup") as f:
      for line in f:
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if controller in controllers.split(","):
          return path
  except OSError:
    return None
  return None


def _remove_stale(parent: str) -> None:
  """Removes the cell cgroups of processes that are gone (killed before `close`)."""
  try:
    names = [n for n in os.listdir(parent) if n.startswith("evotrainer-sandbox-")]
  except OSError:
    return
  for name in names:
    owner = name.split("-")[2]  # evotrainer-sandbox-<pid>-<uid block>
    if not owner.isdigit() or os.path.exists(f"/proc/{owner}"):
      continue
    try:
      os.rmdir(os.path.join(parent, name))
    except OSError:
      pass


class CellCgroup:
  """The cgroup directories of one cell; `close` kills what is left and removes them."""

  def __init__(self, dirs: list[str]):
    self.dirs = dirs

  @classmethod
  def create(cls, name: str, memory_bytes: int, pids: int) -> CellCgroup | None:
    settings = {"memory": {"memory.limit_in_bytes": memory_bytes},
                "pids": {"pids.max": pids}}
    dirs = []
    for controller, values in settings.items():
      own = _own_path(controller)
      if own is None:
        continue
      parent = os.path.join(ROOT, controller, own.lstrip("/"))
      path = os.path.join(parent, f"evotrainer-sandbox-{name}")
      _remove_stale(parent)
      try:
        os.makedirs(path, exist_ok=True)
        for key, value in values.items():
          with open(os.path.join(path, key), "w") as f:
            f.write(str(value))
      except OSError:
        continue
      dirs.append(path)
    return cls(dirs) if dirs else None

  @property
  def controllers(self) -> list[str]:
    return [d.split("/")[len(ROOT.split("/"))] for d in self.dirs]

  def add(self, pids: list[int]) -> None:
    for path in self.dirs:
      for pid in pids:
        try:
          with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        except (ProcessLookupError, OSError):
          pass

  def memory_failures(self) -> int:
    """How often the cell hit its memory limit so far (memory.failcnt)."""
    for path in self.dirs:
      if "/memory/" in path:
        try:
          with open(os.path.join(path, "memory.failcnt")) as f:
            return int(f.read())
        except OSError:
          return 0
    return 0

  def close(self) -> None:
    for path in self.dirs:
      give_up = time.monotonic() + 5.0
      while time.monotonic() < give_up:
        try:
          with open(os.path.join(path, "cgroup.procs")) as f:
            left = [int(p) for p in f.read().split()]
        except OSError:
          break
        if not left:
          break
        for pid in left:
          try:
            os.kill(pid, signal.SIGKILL)
          except ProcessLookupError:
            pass
        time.sleep(0.01)
      try:
        os.rmdir(path)
      except OSError:
        pass
