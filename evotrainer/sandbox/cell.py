"""A cell: one bubblewrap jail holding a pre-started worker that forks per program.

Cell lifecycle: `Cell()` starts `bwrap` (new network, PID, mount, IPC and UTS namespaces;
`/usr` and the interpreter read-only; a private tmpfs `/tmp`; an empty environment;
`--die-with-parent`) with the worker (`worker.py`) as its program, and moves it into a
cgroup when the machine allows. `run` sends one program and waits for its record; a
worker that does not answer by the run's timeout + `GRACE_S` has the whole cell killed
(the PID namespace dies with its init, so nothing inside survives) and the next run
starts a fresh cell. A cell found dead before a program reaches it (the request cannot
be written) is started again and the program sent once more: it never ran. `close`
kills and reaps the cell.

`--die-with-parent` is `PR_SET_PDEATHSIG`, which fires when the *thread* that started
the process exits, not the process: a cell started from a pool's worker thread (a
suite run, an episode's tool) died with that thread, and its next program was reported
killed. Every cell is therefore started from one thread that lives as long as the
process (`_popen`).

Each cell holds a block of host uids, locked machine-wide (`flock` on a file per block),
so that two cells, even in different processes, never share a uid: a run's uid is what
its processes are counted (RLIMIT_NPROC) and killed by.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import importlib.util
import json
import logging
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from evotrainer.sandbox import cgroups, seccomp
from evotrainer.sandbox.records import CellLimits, Limits, RunResult, Status, status_of

GRACE_S = 3.0            # past a run's timeout, how long the worker may take to answer
START_TIMEOUT_S = 20.0   # a cell that is not ready by then is an error
UID_BASE = 1_000_000     # far above any account; uids need no passwd entry
UID_BLOCK = 64
UID_BLOCKS = 4096
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
CELL_WORKER = "/opt/sandbox/worker.py"
CELL_LIB = "/opt/sandbox/lib"   # where `Cell(modules=...)` binds host modules, read-only
LOCK_DIR = os.path.join(tempfile.gettempdir(), "evotrainer-sandbox-uids")
# Worth importing once in the worker: the forked runs then find them loaded.
PRELOAD = ("math", "re", "collections", "itertools", "functools", "heapq", "bisect",
           "string", "typing", "fractions", "decimal", "random", "statistics",
           "operator", "copy", "hashlib", "json", "traceback", "linecache", "tokenize")
# The worker is root inside the cell only to set up runs and drop each to its uid.
WORKER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_DAC_OVERRIDE", "CAP_FOWNER")

log = logging.getLogger(__name__)

# The one thread every cell is started from (module docstring): it lives until the
# interpreter exits, so a cell dies with the process and not with a passing thread.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="sandbox-spawn")


def _popen(*args, **kwargs) -> subprocess.Popen:
  """`subprocess.Popen` run on the spawner thread."""
  return _SPAWNER.submit(subprocess.Popen, *args, **kwargs).result()


class SandboxUnavailable(RuntimeError):
  """The machine cannot build a cell; the message names what is missing."""


class SandboxError(RuntimeError):
  """The sandbox itself failed (not the program): a bad request, a broken worker."""


def interpreter() -> tuple[str, str]:
  """The absolute path of a real Python (never a PATH shim) and its install prefix."""
  exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
  return exe, sys.base_prefix


def _bwrap() -> str:
  path = shutil.which("bwrap")
  if path is None:
    raise SandboxUnavailable(
        "bubblewrap is not installed (no `bwrap` on PATH): on Debian/Ubuntu run "
        "`apt-get install bubblewrap`; or pass rlimits_only=True to run without "
        "namespaces (unsafe for untrusted code)")
  return path


_probe_lock = threading.Lock()
_probe_result: str | None = None


def check_namespaces() -> None:
  """Raises SandboxUnavailable unless bwrap can create the namespaces a cell needs."""
  global _probe_result
  with _probe_lock:
    if _probe_result is None:
      cmd = [_bwrap(), *_user_namespace(), "--unshare-net", "--unshare-pid",
             "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--proc", "/proc",
             "--dev", "/dev", *_root_links(), "/usr/bin/true"]
      try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        _probe_result = "" if done.returncode == 0 else (done.stderr.strip() or
                                                         f"exit {done.returncode}")
      except (OSError, subprocess.TimeoutExpired) as e:
        _probe_result = str(e)
    if _probe_result:
      raise SandboxUnavailable(
          "bubblewrap cannot create network/PID/mount/IPC/UTS namespaces here "
          f"({_probe_result}); this needs root or unprivileged user namespaces "
          "(kernel.unprivileged_userns_clone=1); or pass rlimits_only=True to run "
          "without namespaces (unsafe for untrusted code)")


def _user_namespace() -> list[str]:
  # As root the cell needs none (the worker drops each run to a real host uid); a normal
  # user gets the other namespaces only inside a user namespace of its own.
  return [] if os.geteuid() == 0 else ["--unshare-user"]


def _root_links() -> list[str]:
  """/bin, /lib, ... as the host has them: symlinks into /usr, or read-only binds."""
  args = []
  for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
    path = "/" + name
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  return args


class _UidBlock:
  """A machine-wide lock on UID_BLOCK consecutive uids, held while the cell lives."""

  def __init__(self):
    os.makedirs(LOCK_DIR, exist_ok=True)
    for index in range(UID_BLOCKS):
      fd = os.open(os.path.join(LOCK_DIR, f"{index}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        continue
      self.fd, self.index = fd, index
      self.base = UID_BASE + index * UID_BLOCK
      return
    raise SandboxError(f"all {UID_BLOCKS} uid blocks in {LOCK_DIR} are in use")

  def release(self) -> None:
    os.close(self.fd)


def module_paths(names: tuple[str, ...] | list[str]) -> list[str]:
  """Host paths (a package's directory or a module's file) of top-level modules.

  Raises:
    SandboxError: a name is not a top-level module importable here as a plain file or
      package directory (a namespace package or a built-in cannot be bound).
  """
  paths = []
  for name in names:
    if not name.isidentifier():
      raise SandboxError(f"Cell(modules=...): {name!r} is not a top-level module name")
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
      raise SandboxError(f"Cell(modules=...): module {name!r} is not importable from a "
                         "file here (install it, or drop it from the list)")
    if spec.submodule_search_locations:
      paths.append(os.path.dirname(spec.origin))
    else:
      paths.append(spec.origin)
  return paths


class Cell:
  """A sandbox cell; runs programs one at a time (thread-safe, serialized).

  Args:
    cell_limits: limits of the whole cell (tmpfs size, cgroup memory and pids).
    rlimits_only: run without namespaces (no bwrap) when they are unavailable; every run
      then logs a warning and its record has `isolated=False`. Unsafe for hostile code.
    modules: top-level modules of the host's environment that runs may import (e.g.
      `("pytest", "_pytest", "pluggy", "iniconfig", "packaging")` to run a test suite);
      each is bound read-only into the cell and put on the runs' `sys.path` after the
      run's own directory. Nothing else of the host's site-packages is visible.
  """

  def __init__(self, cell_limits: CellLimits = CellLimits(), *, rlimits_only: bool = False,
               modules: tuple[str, ...] | list[str] = ()):
    self.cell_limits = cell_limits
    self.rlimits_only = rlimits_only
    self.module_paths = module_paths(modules)
    if not rlimits_only:
      check_namespaces()
    self._lock = threading.Lock()
    self._proc: subprocess.Popen | None = None
    self._uids: _UidBlock | None = None
    self._cgroup: cgroups.CellCgroup | None = None
    self._host_root: str | None = None
    self.info: dict = {}
    self.starts = 0

  # ---- life cycle ----------------------------------------------------------------------

  def _start(self) -> None:
    # Only root can drop a run to a uid of its own; a normal user's runs keep its uid.
    drop_uid = os.geteuid() == 0
    self._uids = _UidBlock() if drop_uid else None
    uid_base = self._uids.base if drop_uid else os.geteuid()
    exe, prefix = interpreter()
    config = {"uid_base": uid_base, "uid_count": UID_BLOCK, "drop_uid": drop_uid,
              "clean_ipc": not self.rlimits_only, "root": "/tmp", "preload": PRELOAD,
              "path": [CELL_LIB] if self.module_paths else []}
    if self.rlimits_only:
      self._host_root = tempfile.mkdtemp(prefix="evotrainer-cell-")
      os.chmod(self._host_root, 0o755)
      config["root"] = self._host_root
      if self.module_paths:
        # No mount namespace to bind into: a copy stands in for CELL_LIB (a link would
        # not do: the runs' uid may not traverse the host folders above the module).
        lib = os.path.join(self._host_root, "_lib")
        os.mkdir(lib)
        os.chmod(lib, 0o755)
        for path in self.module_paths:
          target = os.path.join(lib, os.path.basename(path))
          if os.path.isdir(path):
            shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
          else:
            shutil.copy(path, target)
        subprocess.run(["chmod", "-R", "a+rX", lib], check=True)
        config["path"] = [lib]
      cmd = [exe, "-I", "-S", "-B", WORKER, json.dumps(config)]
      env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
      cwd = self._host_root
    fds = []  # what bwrap reads at start: the worker's text, the seccomp filter
    bpf = None if self.rlimits_only else seccomp.program()
    try:
      if not self.rlimits_only:
        fds.append(os.open(WORKER, os.O_RDONLY))
        cmd = self._bwrap_command(exe, prefix, config, fds[0])
        env, cwd = {}, "/"
        if bpf is not None:
          fds.append(os.memfd_create("seccomp"))
          os.write(fds[1], bpf)
          os.lseek(fds[1], 0, os.SEEK_SET)
          cmd[1:1] = ["--seccomp", str(fds[1])]
      self._proc = _popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                          pass_fds=tuple(fds))
    finally:
      for fd in fds:
        os.close(fd)
    self.starts += 1
    try:
      ready = self._receive(time.monotonic() + START_TIMEOUT_S)
    except (TimeoutError, SandboxError) as e:
      err = self._kill()
      raise SandboxError(f"the cell did not start: {e}; worker stderr: {err}") from None
    self._cgroup = cgroups.CellCgroup.create(
        f"{os.getpid()}-{self._uids.index if drop_uid else id(self)}",
        self.cell_limits.memory_mb << 20,
        self.cell_limits.pids)
    if self._cgroup is not None:
      self._cgroup.add(_tree(self._proc.pid))
    self.info = {"isolated": not self.rlimits_only, "python": ready.get("python"),
                 "interpreter": exe, "uid_drop": drop_uid, "seccomp": bpf is not None,
                 "cgroups": self._cgroup.controllers if self._cgroup else []}

  def _bwrap_command(self, exe: str, prefix: str, config: dict, worker_fd: int) -> list[str]:
    cmd = [_bwrap(), *_user_namespace(), "--unshare-net", "--unshare-pid",
           "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
           "--hostname", "sandbox", "--ro-bind", "/usr", "/usr", *_root_links()]
    if not (prefix + "/").startswith("/usr/"):
      # The interpreter stays at its own path (its libpython is found by an rpath); the
      # directories above it are created empty and traversable (bwrap makes them 0700).
      parts = prefix.strip("/").split("/")
      for depth in range(1, len(parts)):
        cmd += ["--perms", "0755", "--dir", "/" + "/".join(parts[:depth])]
      cmd += ["--ro-bind", prefix, prefix]
    if self.module_paths:
      for folder in ("/opt", "/opt/sandbox", CELL_LIB):
        cmd += ["--perms", "0755", "--dir", folder]
      for path in self.module_paths:
        cmd += ["--ro-bind", path, f"{CELL_LIB}/{os.path.basename(path)}"]
    # The worker comes in as a copy (read from `worker_fd`), not a bind: a bind's source,
    # the project's folder on the host, would show in the cell's /proc/self/mountinfo.
    cmd += ["--ro-bind-data", str(worker_fd), CELL_WORKER, "--proc", "/proc", "--dev", "/dev",
            "--mqueue", "/dev/mqueue",
            "--size", str(self.cell_limits.tmp_mb << 20), "--tmpfs", "/tmp",
            "--size", str(16 << 20), "--tmpfs", "/dev/shm",
            "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8"]
    if os.geteuid() == 0:
      cmd += ["--cap-drop", "ALL"]
      for cap in WORKER_CAPS:
        cmd += ["--cap-add", cap]
    return cmd + [exe, "-I", "-S", "-B", CELL_WORKER, json.dumps(config)]

  def _kill(self) -> str:
    """Kills the cell (the PID namespace dies with it), reaps it; returns its stderr."""
    err = ""
    proc, self._proc = self._proc, None
    if proc is not None:
      tree = _tree(proc.pid)
      for pid in tree:  # bwrap, the cell's init (whose death ends the namespace), worker
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      proc.wait()
      _wait_gone(tree[1:])
      if proc.stderr is not None:
        os.set_blocking(proc.stderr.fileno(), False)
        try:
          err = (proc.stderr.read() or b"").decode(errors="replace")[-2000:]
        except (BlockingIOError, TypeError):
          pass
      for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
          try:
            stream.close()
          except OSError:  # unflushed bytes to a worker that is gone: nothing to keep
            pass
    if self._cgroup is not None:
      self._cgroup.close()
      self._cgroup = None
    if self._host_root is not None:
      shutil.rmtree(self._host_root, ignore_errors=True)
      self._host_root = None
    if self._uids is not None:
      self._uids.release()
      self._uids = None
    return err

  def close(self) -> None:
    with self._lock:
      self._kill()

  def __enter__(self) -> Cell:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    try:
      self._kill()
    except Exception:
      pass

  # ---- runs ----------------------------------------------------------------------------

  def run(self, source: str, *, stdin: str = "", argv: tuple[str, ...] | list[str] = (),
          files: dict[str, str] | None = None, timeout_s: float = 10.0,
          limits: Limits = Limits()) -> RunResult:
    """Runs one Python program in this cell; see `evotrainer.sandbox.run_python`."""
    if timeout_s <= 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    rlimits = limits.as_request(timeout_s)
    request = {"source": source, "stdin": stdin, "argv": [str(a) for a in argv],
               "files": dict(files or {}), "timeout_s": float(timeout_s),
               "limits": rlimits}
    with self._lock:
      if self.rlimits_only:
        warnings.warn("sandbox: running WITHOUT namespaces (rlimits only): the program "
                      "can see the network, the host's processes and files",
                      RuntimeWarning, stacklevel=2)
        log.warning("sandbox run without namespaces (rlimits only)")
      if self._proc is None:
        self._start()
      failures = self._cgroup.memory_failures() if self._cgroup else 0
      start = time.monotonic()
      try:
        try:
          self._send(request)
        except BrokenPipeError as e:
          # Dead before the program reached it: a fresh cell runs it (it never ran).
          err = self._kill()
          log.warning("sandbox: cell found dead (%s) %s; starting it again", e, err)
          self._start()
          failures = self._cgroup.memory_failures() if self._cgroup else 0
          start = time.monotonic()
          self._send(request)
        raw = self._receive(start + timeout_s + GRACE_S)
      except (TimeoutError, SandboxError, BrokenPipeError) as e:
        # The worker is hung or dead: the cell goes, with everything in it.
        err = self._kill()
        log.warning("sandbox: cell killed (%s) %s", e, err)
        wall = time.monotonic() - start
        status = Status.TIMEOUT if wall >= timeout_s else Status.KILLED
        return RunResult(status, None, "", "", False, False, wall, 0.0,
                         isolated=not self.rlimits_only)
      if "error" in raw:
        raise SandboxError(raw["error"])
      status, code = status_of(raw, rlimits["cpu_s"])
      if (status is Status.KILLED and self._cgroup is not None and
          self._cgroup.memory_failures() > failures):
        status = Status.MEMORY
    return RunResult(status, code, raw["stdout"], raw["stderr"], raw["stdout_truncated"],
                     raw["stderr_truncated"], raw["wall_s"], raw["cpu_s"],
                     raw["max_rss_kb"] / 1024, isolated=not self.rlimits_only)

  def _send(self, payload: dict) -> None:
    data = json.dumps(payload).encode()
    self._proc.stdin.write(struct.pack(">I", len(data)) + data)
    self._proc.stdin.flush()

  def _receive(self, deadline: float) -> dict:
    fd = self._proc.stdout.fileno()
    header = _read_exact(fd, 4, deadline)
    (size,) = struct.unpack(">I", header)
    return json.loads(_read_exact(fd, size, deadline))


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
  chunks, got = [], 0
  while got < size:
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
      raise TimeoutError("no answer from the cell's worker in time")
    chunk = os.read(fd, size - got)
    if not chunk:
      raise SandboxError("the cell's worker exited")
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def _wait_gone(pids: list[int], limit_s: float = 5.0) -> None:
  """Returns once none of `pids` runs any more (exited, or a zombie awaiting reaping)."""
  give_up = time.monotonic() + limit_s
  for pid in pids:
    while time.monotonic() < give_up:
      try:
        with open(f"/proc/{pid}/stat") as f:
          if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            break
      except (FileNotFoundError, ProcessLookupError):
        break
      time.sleep(0.002)


def _tree(root: int) -> list[int]:
  """`root` and its descendants on the host (bwrap, the cell's init, the worker)."""
  children: dict[int, list[int]] = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, ValueError, IndexError):
        continue
      children.setdefault(ppid, []).append(int(name))
  found, todo = [], [root]
  while todo:
    pid = todo.pop()
    found.append(pid)
    todo += children.get(pid, [])
  return found
