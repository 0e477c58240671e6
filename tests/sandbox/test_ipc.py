"""What one run could leave in a reused cell for the next: IPC objects.

Every attack is two programs run one after the other in the same cell, as a reward
batch's or a suite runner's would be: the first stores a secret (or parks memory) in
System V shared memory, a System V message queue or semaphore set, a POSIX message
queue or POSIX shared memory; the second looks for it by the same key or name and by
listing `/proc/sysvipc`. Nothing of the first run may reach the second.
"""

from __future__ import annotations

import secrets

import pytest

from evotrainer import sandbox
from evotrainer.sandbox import Status
from evotrainer.tasks.swe import runner as runner_lib
from tests.sandbox.conftest import HOSTILE, HOSTILE_CELL, sandbox_processes

# argv: write KIND SECRET | read KIND | hog MIB. Plain ctypes calls into libc (x86-64
# Linux constants), as a hostile program would make them; `read` prints what it found.
IPC = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.umask(0)  # objects any later uid may open
KEY, IPC_CREAT, IPC_NOWAIT, GETVAL, SETVAL = 0x5EC7E7, 0o1000, 0o4000, 12, 16
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.msgrcv.restype = ctypes.c_ssize_t
libc.msgrcv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long,
                        ctypes.c_int]
libc.msgsnd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mq_receive.restype = ctypes.c_ssize_t
SIZE = 64

class Msg(ctypes.Structure):
  _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * SIZE)]

def check(value, what):
  if value in (-1, None, 2**64 - 1):  # shmat's (void *) -1 comes back as an address
    print(what, "failed:", os.strerror(ctypes.get_errno()))
    sys.exit(0)
  return value

def ids(kind):  # every object of the namespace, whatever its key
  with open("/proc/sysvipc/" + kind) as f:
    return [int(line.split()[1]) for line in f.readlines()[1:]]

def write(kind, secret):
  data = secret.encode()
  if kind == "shm":
    shm = check(libc.shmget(KEY, SIZE, IPC_CREAT | 0o666), "shmget")
    ctypes.memmove(check(libc.shmat(shm, None, 0), "shmat"), data, len(data))
  elif kind == "msg":
    queue = check(libc.msgget(KEY, IPC_CREAT | 0o666), "msgget")
    check(libc.msgsnd(queue, ctypes.byref(Msg(1, data)), SIZE, IPC_NOWAIT), "msgsnd")
  elif kind == "sem":
    sems = check(libc.semget(KEY, len(data), IPC_CREAT | 0o666), "semget")
    for i, byte in enumerate(data):
      check(libc.semctl(sems, i, SETVAL, ctypes.c_int(byte)), "semctl")
  elif kind == "mq":
    queue = check(libc.mq_open(b"/evo", os.O_CREAT | os.O_RDWR, 0o666, None), "mq_open")
    check(libc.mq_send(queue, data, len(data), 0), "mq_send")
  elif kind == "posix_shm":
    try:  # what shm_open("/evo") does
      fd = os.open("/dev/shm/evo", os.O_CREAT | os.O_RDWR, 0o666)
    except OSError as e:
      print("shm_open failed:", e)
      sys.exit(0)
    os.write(fd, data)
  print("stored")

def read(kind):
  found = []
  if kind == "shm":
    for shm in ids("shm"):
      addr = libc.shmat(shm, None, 0)
      if addr not in (None, 2**64 - 1):
        found.append(ctypes.string_at(addr, SIZE).rstrip(b"\0"))
  elif kind == "msg":
    for queue in ids("msg"):
      msg = Msg()
      if libc.msgrcv(queue, ctypes.byref(msg), SIZE, 0, IPC_NOWAIT) >= 0:
        found.append(msg.mtext)
  elif kind == "sem":
    for sems in ids("sem"):
      values = [libc.semctl(sems, i, GETVAL) for i in range(SIZE)]
      found.append(bytes(v for v in values if 0 < v < 256))
  elif kind == "mq":
    queue = libc.mq_open(b"/evo", os.O_RDONLY | os.O_NONBLOCK)
    buf = ctypes.create_string_buffer(8192)
    if queue >= 0 and libc.mq_receive(queue, buf, 8192, None) >= 0:
      found.append(buf.value)
  elif kind == "posix_shm":
    for name in os.listdir("/dev/shm"):
      with open("/dev/shm/" + name, "rb") as f:
        found.append(f.read(SIZE).rstrip(b"\0"))
  print("found", [f.decode(errors="replace") for f in found])

def hog(mib):
  shm = check(libc.shmget(KEY + 1, mib << 20, IPC_CREAT | 0o600), "shmget")
  ctypes.memset(check(libc.shmat(shm, None, 0), "shmat"), 1, mib << 20)
  print("parked", mib, "MiB")

mode = sys.argv[1]
if mode == "write":
  write(sys.argv[2], sys.argv[3])
elif mode == "read":
  read(sys.argv[2])
else:
  hog(int(sys.argv[2]))
'''

KINDS = ("shm", "msg", "sem", "mq", "posix_shm")
# Needs no IPC: a plain 200 MiB allocation, touched, in a 400 MiB cell.
ALLOCATE = "x = bytearray(b'1') * (200 << 20)\nprint('allocated', len(x) >> 20)\n"


def _run(cell, *argv, limits=HOSTILE):
  result = sandbox.run_python(IPC, argv=argv, cell=cell, timeout_s=10, limits=limits)
  assert result.status is Status.OK, (result.status, result.stdout, result.stderr)
  return result.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_stored_in_ipc_reaches_the_next_run(kind, namespaces):
  secret = "IPC-SECRET-" + secrets.token_hex(8)
  with sandbox.Cell(HOSTILE_CELL) as cell:
    stored = _run(cell, "write", kind, secret)
    assert stored == "stored\n" or "failed" in stored, stored  # refused is fine too
    seen = _run(cell, "read", kind)
    assert seen.startswith("found") and secret not in seen, seen
    assert not sandbox_processes(cell)


def test_shared_memory_parked_by_one_run_does_not_starve_the_next(namespaces):
  # The first run leaves 250 MiB of System V shared memory (no IPC_RMID) in a 400 MiB
  # cell; a later, harmless 200 MiB program must still run. Twice: the hog again, then
  # the program again.
  with sandbox.Cell(sandbox.CellLimits(tmp_mb=32, memory_mb=400, pids=96)) as cell:
    for _ in range(2):
      assert _run(cell, "hog", "250", limits=sandbox.Limits(memory_mb=512)) == \
          "parked 250 MiB\n"
      result = sandbox.run_python(ALLOCATE, cell=cell, timeout_s=10,
                                  limits=sandbox.Limits(memory_mb=512))
      assert (result.status, result.stdout) == (Status.OK, "allocated 200\n"), \
          (result.status, result.stderr[-500:])


# Suite runs of two repositories on one cell: the first's test stores its own file's
# text in shared memory, the second's test fails with whatever shared memory holds as its
# message (which a model reads from `run_tests`).
STORE_TEST = '''
import os, sys
sys.argv = ["ipc", "write", "shm", open(__file__).read().rsplit("#", 1)[1].strip()]
exec(open(os.path.join(os.path.dirname(__file__), "ipc.py")).read())
def test_store():
  pass
#{secret}
'''
READ_TEST = '''
import contextlib, io, os, sys
def test_read():
  out = io.StringIO()
  sys.argv = ["ipc", "read", "shm"]
  with contextlib.redirect_stdout(out):
    exec(open(os.path.join(os.path.dirname(__file__), "ipc.py")).read(), {})
  assert False, out.getvalue()
'''


def test_suite_run_cannot_pass_a_test_file_to_the_next(namespaces):
  secret = "TEST-FILE-" + secrets.token_hex(8)
  with runner_lib.SuiteRunner(workers=1, timeout_s=30) as suite:
    first = suite.run({"tests/ipc.py": IPC,
                       "tests/test_store.py": STORE_TEST.format(secret=secret)},
                      ["tests/test_store.py"])
    assert first.outcomes == {"tests/test_store.py::test_store": "passed"}, first.log
    second = suite.run({"tests/ipc.py": IPC, "tests/test_read.py": READ_TEST},
                       ["tests/test_read.py"])
  message = second.messages["tests/test_read.py::test_read"]
  assert "found" in message and secret not in message, message
  assert secret not in second.log
