"""The worker that lives inside a cell and forks one child per program.

This file is executed, not imported: the cell binds it read-only and runs it with the
interpreter's absolute path (`python -I -S -B worker.py CONFIG`). It may import only the
standard library, because nothing of the host's site-packages is visible in the cell.

The worker runs as root *inside* the cell (its own PID, mount, network, IPC and UTS
namespaces); each program runs in a forked child that, before it touches the source,
drops to a per-run unprivileged uid with no-new-privs and the run's rlimits. Because
every process of a run carries that uid, `kill(-1, SIGKILL)` sent by a helper with the
same uid ends all of them at once, whatever they did (setsid, double fork, ignoring
signals), and the fork-bomb race is closed by the kernel (a fork in progress aborts when
its parent has a fatal signal pending). The worker is a child subreaper, so orphans come
back to it and are reaped: no zombie and no process outlives a run.

Nor does any IPC object: the cell's IPC namespace is the worker's, shared by all its
runs, so once a run's processes are gone the worker removes the System V shared memory,
message queues and semaphore sets and the POSIX message queues (`/dev/mqueue`) it left.
A later run can neither read them nor find the cell's memory held by them. (POSIX shared
memory would live in the cell's /dev/shm, which no run may write.) This costs a few
reads per run; a fresh IPC namespace per run cost ~0.3 ms (unshare) on a 6.x kernel.

Protocol on fds 0/1: 4-byte big-endian length + JSON, one request then one response.
"""

import atexit
import ctypes
import gc
import io
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import threading
import time
import traceback
import types

PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
IPC_RMID = 0
MQUEUE = "/dev/mqueue"   # the cell's POSIX message queues (Cell mounts it)
MEMORY_ERROR_TAIL = b"MemoryError"
READ_CHUNK = 65536


def _read_message(fd):
  header = _read_exact(fd, 4)
  if header is None:
    return None
  (size,) = struct.unpack(">I", header)
  return json.loads(_read_exact(fd, size))


def _read_exact(fd, size):
  chunks, got = [], 0
  while got < size:
    chunk = os.read(fd, size - got)
    if not chunk:
      return None
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def _write_message(fd, payload):
  data = json.dumps(payload).encode()
  data = struct.pack(">I", len(data)) + data
  while data:
    data = data[os.write(fd, data):]


class Worker:
  """Runs requests one at a time; state: the run counter and the uid block."""

  def __init__(self, config):
    self.uid_base = config["uid_base"]
    self.uid_count = config["uid_count"]
    # Where we are not root (rlimits-only fallback run by a normal user) there is no uid
    # to drop to; the run is then ended by killing the worker's descendants instead.
    self.drop_uid = config["drop_uid"]
    self.root = config["root"]
    self.path = list(config.get("path", ()))  # host modules bound for the runs (Cell)
    # Only in a cell's own IPC namespace: the host's objects are not ours to remove.
    self.clean_ipc = config.get("clean_ipc", False)
    self.runs = 0
    self._main = None      # the pid of the running program's main process
    self._reaped = {}
    # What a run sees (plus HOME and TMPDIR, its directory); nothing of the host's.
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"})
    self.libc = libc = ctypes.CDLL(None, use_errno=True)
    # no-new-privs on the worker is inherited by every child: no setuid binary, no file
    # capability can give a program back what the uid drop took.
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
      raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    for name in config.get("preload", ()):
      try:
        __import__(name)
      except Exception:  # A missing optional module only costs speed.
        pass
    _warm_up()
    # Forked runs share the worker's pages copy-on-write; a collection in the child would
    # touch (and copy) them all.
    gc.collect()
    gc.freeze()

  # ---- one run -----------------------------------------------------------------------

  def run(self, request):
    self.runs += 1
    uid = self.uid_base + self.runs % self.uid_count
    workdir = os.path.join(self.root, f"run{self.runs}")
    self._prepare_dir(workdir, request, uid)
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, request["stdin"].encode())
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # The child never returns from here.
      self._child(request, uid, workdir, stdin_fd, out_w, err_w)
    self._main = pid
    for fd in (stdin_fd, out_w, err_w):
      os.close(fd)
    record = self._supervise(pid, uid, request, out_r, err_r, start)
    shutil.rmtree(workdir, ignore_errors=True)
    if self.clean_ipc:
      self._remove_ipc(uid)
    return record

  def _prepare_dir(self, workdir, request, uid):
    # Root-owned, sticky and world-writable: the program may create files but cannot
    # delete, rename or rewrite what the harness put there (its tests, its source).
    os.mkdir(workdir)
    os.chmod(workdir, 0o1777)
    files = dict(request["files"])
    files["main.py"] = request["source"]
    for name, text in files.items():
      path = os.path.normpath(os.path.join(workdir, name))
      if not path.startswith(workdir + os.sep):
        raise ValueError(f"file name {name!r} leaves the run directory")
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        f.write(text)
      os.chmod(path, 0o444)

  def _child(self, request, uid, workdir, stdin_fd, out_w, err_w):
    try:
      os.dup2(stdin_fd, 0)
      os.dup2(out_w, 1)
      os.dup2(err_w, 2)
      os.closerange(3, 1 << 16)
      # Its own process group (the fallback kills by group). Not setsid: a new session
      # costs a scheduler autogroup, ~2 ms a run, and the cell has no terminal anyway.
      os.setpgid(0, 0)
      # Signal dispositions are the worker's, which are a fresh interpreter's (SIGINT
      # raises KeyboardInterrupt; SIGPIPE and SIGXFSZ ignored): nothing to reset.
      # Should the cell's memory cgroup run out, the kernel kills a program, not us.
      fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
      os.write(fd, b"1000")
      os.close(fd)
      limits = request["limits"]
      mib = 1 << 20
      for which, value in ((resource.RLIMIT_CPU, limits["cpu_s"]),
                           (resource.RLIMIT_AS, limits["memory_mb"] * mib),
                           (resource.RLIMIT_FSIZE, limits["file_mb"] * mib),
                           (resource.RLIMIT_NOFILE, limits["open_files"]),
                           (resource.RLIMIT_NPROC, limits["processes"]),
                           (resource.RLIMIT_CORE, 0)):
        # CPU: SIGXCPU at the soft limit, SIGKILL a second later for one that ignores it.
        hard = value + 1 if which == resource.RLIMIT_CPU else value
        resource.setrlimit(which, (value, hard))
      if self.drop_uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
      os.chdir(workdir)
      os.environ["HOME"] = os.environ["TMPDIR"] = workdir
      _exec_main(os.path.join(workdir, "main.py"), request["argv"], self.path)
    except BaseException:
      pass
    os._exit(255)

  def _supervise(self, pid, uid, request, out_r, err_r, start):
    cap = request["limits"]["output_bytes"]
    deadline = start + request["timeout_s"]
    pidfd = os.pidfd_open(pid)
    streams = {out_r: bytearray(), err_r: bytearray()}
    truncated = {out_r: False, err_r: False}
    poller = select.poll()
    for fd in (pidfd, out_r, err_r):
      poller.register(fd, select.POLLIN)
    open_pipes = {out_r, err_r}
    reason = None
    exited = False
    while not exited or open_pipes:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        reason = "timeout"
        break
      for fd, _ in poller.poll(remaining * 1000):
        if fd == pidfd:
          exited = True
          poller.unregister(pidfd)
          continue
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
          poller.unregister(fd)
          open_pipes.discard(fd)
          continue
        buf = streams[fd]
        room = cap - len(buf)
        buf += chunk[:max(room, 0)]
        if len(chunk) > room:
          truncated[fd] = True
          reason = "output_limit"
      if reason:
        break
      if exited and open_pipes:
        # The program is gone but something it started still holds its output open
        # (a daemon). End it now rather than wait for the deadline.
        break
    wall = time.monotonic() - start
    self._kill_run(pid, uid, exited)
    cpu = self._reap_orphans()
    status, usage = self._reaped.pop(pid, None) or os.wait4(pid, 0)[1:]
    cpu += usage.ru_utime + usage.ru_stime
    for fd in open_pipes:
      _drain(fd, streams[fd], cap, truncated, fd)
    for fd in (pidfd, out_r, err_r):
      os.close(fd)
    return {"wait_status": status, "reason": reason, "wall_s": wall, "cpu_s": cpu,
            "max_rss_kb": usage.ru_maxrss,
            "stdout": streams[out_r].decode(errors="replace"),
            "stderr": streams[err_r].decode(errors="replace"),
            "stdout_truncated": truncated[out_r], "stderr_truncated": truncated[err_r],
            "memory_error": streams[err_r].rstrip().endswith(MEMORY_ERROR_TAIL)
            or b"\nMemoryError" in streams[err_r][-4096:]}

  def _kill_run(self, pid, uid, exited):
    """Ends every process of the run; `exited`: the main child is already a zombie."""
    if not self.drop_uid:
      self._kill_descendants(pid)
      return
    if exited and not self._uid_has_processes(uid, exclude=pid):
      return
    # A helper that holds exactly the run's uid: kill(-1) reaches every process of that
    # uid in this PID namespace (and nothing else: the worker and init are root).
    killer = os.fork()
    if killer == 0:
      try:
        os.setresuid(uid, uid, uid)
        os.kill(-1, signal.SIGKILL)
      finally:
        os._exit(0)
    os.waitpid(killer, 0)
    give_up = time.monotonic() + 5.0
    while self._uid_has_processes(uid) and time.monotonic() < give_up:
      self._reap_orphans()
      time.sleep(0.001)

  def _kill_descendants(self, pid):
    # rlimits-only fallback as a normal user: no uid of its own, so walk the tree. The
    # run's main child is killed first; its orphans come back to us (subreaper) and are
    # killed in turn until none is left.
    try:
      os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    give_up = time.monotonic() + 5.0
    me = os.getpid()
    while time.monotonic() < give_up:
      children = [p for p, ppid in _processes() if ppid == me and p != pid]
      if not children:
        break
      for child in children:
        try:
          os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
          pass
      self._reap_orphans()
      time.sleep(0.001)

  def _remove_ipc(self, uid):
    """Removes every System V object and POSIX message queue of the cell (all are the
    run's: the one before cleaned up after itself). Shared memory is freed at once: no
    process of the run is left to have it attached."""
    libc = self.libc
    removers = {"shm": lambda ident: libc.shmctl(ident, IPC_RMID, None),
                "msg": lambda ident: libc.msgctl(ident, IPC_RMID, None),
                "sem": lambda ident: libc.semctl(ident, 0, IPC_RMID)}
    left = {kind: _sysv_ids(kind) for kind in removers}
    if any(left.values()):
      # As the run's uid, their creator: root would need CAP_SYS_ADMIN to remove them.
      if self.drop_uid:
        os.seteuid(uid)
      try:
        for kind, idents in left.items():
          for ident in idents:
            if removers[kind](ident) != 0:
              raise OSError(ctypes.get_errno(), f"removing System V {kind} {ident} "
                            f"left by uid {uid}")
      finally:
        if self.drop_uid:
          os.seteuid(0)
    for name in os.listdir(MQUEUE):
      os.unlink(os.path.join(MQUEUE, name))

  def _uid_has_processes(self, uid, exclude=None):
    # Zombies count: the processes of a run are gone once reaped (by us, the subreaper).
    for name in os.listdir("/proc"):
      if name.isdigit() and int(name) != exclude:
        try:
          if os.stat(f"/proc/{name}").st_uid == uid:
            return True
        except FileNotFoundError:
          pass
    return False

  def _reap_orphans(self):
    """Reaps every exited child; returns the orphans' CPU seconds. The main child of a
    run, if reaped here, is kept in `_reaped` for `_supervise`."""
    cpu = 0.0
    while True:
      try:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
      except ChildProcessError:
        return cpu
      if pid == 0:
        return cpu
      if pid == self._main:
        self._reaped[pid] = (status, usage)
      else:
        cpu += usage.ru_utime + usage.ru_stime


def _sysv_ids(kind):
  """The ids of the namespace's System V objects of `kind` ("shm", "msg" or "sem")."""
  with open(f"/proc/sysvipc/{kind}") as f:
    return [int(line.split()[1]) for line in f.readlines()[1:]]


def _warm_up():
  # The first compile in a process initializes the compiler's state (~4 ms); done once
  # here, before the fork, every run inherits it instead of paying for it.
  sink = io.StringIO()
  for _ in range(3):
    try:
      exec(compile("import sys\nx = [i * 2 for i in range(3)]\nprint(x, file=sink)\n"
                   "def f(a):\n  return {k: a for k in 'ab'}\nf(1)\n1 / 0\n",
                   "warm_up.py", "exec"), {"sink": sink})
    except ZeroDivisionError:
      traceback.print_exc(file=sink)


def _processes():
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat") as f:
          stat = f.read()
      except OSError:
        continue
      yield int(name), int(stat.rsplit(")", 1)[1].split()[1])


def _drain(fd, buf, cap, truncated, key):
  os.set_blocking(fd, False)
  try:
    while True:
      chunk = os.read(fd, READ_CHUNK)
      if not chunk:
        return
      room = cap - len(buf)
      buf += chunk[:max(room, 0)]
      if len(chunk) > room:
        truncated[key] = True
  except BlockingIOError:
    return


def _exec_main(path, argv, extra_path=()):
  """Runs `path` as `__main__` the way `python -I -S path argv...` would, then exits;
  `extra_path` (the cell's bound modules) follows the program's own directory."""
  sys.argv = [path, *argv]
  sys.path[:] = ([os.path.dirname(path)] + list(extra_path) +
                 [p for p in sys.path if p.startswith(sys.prefix)])
  sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                               encoding="utf-8", errors="strict")
  sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                encoding="utf-8", errors="strict")
  sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                encoding="utf-8", errors="backslashreplace",
                                line_buffering=True)
  sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
  main = types.ModuleType("__main__")
  main.__file__ = path
  main.__builtins__ = __builtins__
  sys.modules["__main__"] = main
  code = 0
  try:
    with open(path) as f:
      source = f.read()
    exec(compile(source, path, "exec"), main.__dict__)
  except SystemExit as exit_:
    code = _exit_code(exit_)
  except BaseException:
    kind, value, tb = sys.exc_info()
    value.__traceback__ = tb.tb_next  # The traceback starts in main.py.
    sys.excepthook(kind, value, tb.tb_next)
    code = 1
  try:
    threading._shutdown()  # Non-daemon threads are waited for, as at a real exit.
  except BaseException:
    pass
  try:
    atexit._run_exitfuncs()
  except BaseException:
    pass
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:
      code = code or 120
  os._exit(code)


def _exit_code(exit_):
  if exit_.code is None:
    return 0
  if isinstance(exit_.code, int):
    return exit_.code & 0xFF
  try:
    print(exit_.code, file=sys.stderr)
  except BaseException:
    pass
  return 1


def main():
  config = json.loads(sys.argv[1])
  worker = Worker(config)
  _write_message(1, {"ready": True, "python": sys.version.split()[0]})
  while True:
    request = _read_message(0)
    if request is None:
      return
    try:
      response = worker.run(request)
    except Exception as e:  # A harness error, not the program's: report it.
      response = {"error": f"{type(e).__name__}: {e}"}
    _write_message(1, response)


if __name__ == "__main__":
  main()
