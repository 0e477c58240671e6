"""Fixtures for the sandbox tests: a cell, a planted secret, a listener on the host's
loopback, and the checks every hostile run must pass (no stray process, no file outside).

The hostile programs are dangerous outside the sandbox: they are only ever run through
it, with small limits (see `HOSTILE`), and only after `test_sandbox.py`'s containment
probes (uid, process and memory limits) have passed.
"""

from __future__ import annotations

import fcntl
import os
import secrets as secrets_lib
import socket
import subprocess
import threading

import pytest

from evotrainer import sandbox
from evotrainer.sandbox import cell as cell_lib

# Small limits for hostile programs: a bomb that got past them would still be small.
HOSTILE = sandbox.Limits(memory_mb=256, processes=32, file_mb=8, open_files=64,
                         output_bytes=64 << 10)
HOSTILE_CELL = sandbox.CellLimits(tmp_mb=32, memory_mb=768, pids=96)


def _skip_without_namespaces() -> None:
  try:
    sandbox.check_namespaces()
  except sandbox.SandboxUnavailable as e:
    pytest.skip(str(e))


@pytest.fixture(scope="session")
def namespaces():
  """Skips where this machine cannot build a cell (the refusal itself is tested)."""
  _skip_without_namespaces()


@pytest.fixture(scope="session")
def planted():
  """A secret in the host's environment, in a world-readable file under /tmp and in a
  file in the home directory; removed afterwards."""
  token = "EVO-SECRET-" + secrets_lib.token_hex(8)
  os.environ["EVO_SANDBOX_SECRET"] = token
  name = secrets_lib.token_hex(4)  # the file names must not carry the token
  paths = [f"/tmp/evo_sandbox_secret_{name}.txt",
           os.path.expanduser(f"~/.evo_sandbox_secret_{name}")]
  for path in paths:
    with open(path, "w") as f:
      f.write(token)
    os.chmod(path, 0o644)
  yield token, paths
  del os.environ["EVO_SANDBOX_SECRET"]
  for path in paths:
    os.unlink(path)


@pytest.fixture(scope="session")
def cell(planted):
  """One cell for the corpus: attacks run one after another in the same worker, as a
  reward batch's programs would. Started after the secret is planted."""
  _skip_without_namespaces()
  with sandbox.Cell(HOSTILE_CELL) as c:
    yield c


class Listener:
  """TCP and UDP on 127.0.0.1:port of the host; records anything that arrives."""

  def __init__(self):
    self.tcp = socket.create_server(("127.0.0.1", 0))
    self.port = self.tcp.getsockname()[1]
    self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    self.udp.bind(("127.0.0.1", self.port))
    self.received: list[str] = []
    self._stop = False
    self._threads = [threading.Thread(target=self._accept, daemon=True),
                     threading.Thread(target=self._datagrams, daemon=True)]
    for t in self._threads:
      t.start()

  def _accept(self):
    self.tcp.settimeout(0.2)
    while not self._stop:
      try:
        conn, addr = self.tcp.accept()
      except OSError:
        continue
      self.received.append(f"tcp connection from {addr}")
      conn.close()

  def _datagrams(self):
    self.udp.settimeout(0.2)
    while not self._stop:
      try:
        data, addr = self.udp.recvfrom(4096)
      except OSError:
        continue
      self.received.append(f"udp {data!r} from {addr}")

  def close(self):
    self._stop = True
    for t in self._threads:
      t.join()
    self.tcp.close()
    self.udp.close()


@pytest.fixture(scope="session")
def listener():
  l = Listener()
  yield l
  l.close()


def _block_held(index: int) -> bool:
  """Whether a live cell of another process holds uid block `index` (its machine-wide
  flock; a cell of this process holds it under another open file, which conflicts too)."""
  try:
    fd = os.open(os.path.join(cell_lib.LOCK_DIR, f"{index}.lock"), os.O_RDWR)
  except FileNotFoundError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return True
  finally:
    os.close(fd)  # releases the lock if it was taken
  return False


def sandbox_processes(the_cell: sandbox.Cell) -> list[str]:
  """`ps` lines of leaked processes: any with a uid of `the_cell`'s block (its runs are
  over when a call returns) or of a block no live cell holds (a closed cell's), and the
  cell's tree beyond bwrap, its init and the worker. Processes with the uids of another
  live cell (another test worker's, running meanwhile) are that cell's, not leaks."""
  ps = subprocess.run(["ps", "-e", "-o", "uid=,pid=,ppid=,stat=,args="],
                      capture_output=True, text=True, check=True).stdout.splitlines()
  low = cell_lib.UID_BASE
  high = cell_lib.UID_BASE + cell_lib.UID_BLOCK * cell_lib.UID_BLOCKS
  own = the_cell._uids.index if the_cell._uids is not None else None
  stray = []
  for line in ps:
    uid = int(line.split()[0])
    if low <= uid < high:
      index = (uid - cell_lib.UID_BASE) // cell_lib.UID_BLOCK
      if index == own or not _block_held(index):
        stray.append(line)
  if the_cell._proc is not None:
    tree = cell_lib._tree(the_cell._proc.pid)
    if len(tree) > 3:  # bwrap, the cell's init, the worker; anything more is a leak
      stray += [line for line in ps if int(line.split()[1]) in tree]
  return stray


# Where a program that escaped the cell would leave a file (on the host).
OUTSIDE = ["/pwned", "/usr/pwned", "/opt/pwned", "/root/pwned", "/tmp/pwned",
           "/dev/shm/pwned", "/work/pwned"]


@pytest.fixture
def outside(tmp_path):
  """A host path a program is told to write to; with OUTSIDE, checked absent after."""
  target = str(tmp_path / "outside" / "pwned")
  yield target
  for path in [target, *OUTSIDE]:
    assert not os.path.exists(path), f"a sandboxed program wrote {path} on the host"
