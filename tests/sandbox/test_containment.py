"""Benign probes of the cell's containment (run before the hostile corpus), the entry
point's record, and the refusal without namespaces."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from evotrainer import sandbox
from evotrainer.sandbox import Limits, Status
from evotrainer.sandbox import cell as cell_lib
from evotrainer.sandbox.records import status_of
from tests.sandbox.conftest import sandbox_processes

PROBE = """
import os, resource
print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())
print(resource.getrlimit(resource.RLIMIT_NPROC)[0], resource.getrlimit(resource.RLIMIT_AS)[0])
print([l for l in open('/proc/self/status') if l.startswith(('NoNewPrivs', 'CapEff'))])
print(sorted(os.listdir('/')), sorted(p for p in os.listdir('/proc') if p.isdigit()))
print(sorted(os.environ), os.getcwd())
"""


def test_probe_uid_limits_privileges_and_view(cell):
  result = sandbox.run_python(PROBE, cell=cell, limits=Limits(processes=20, memory_mb=100))
  assert result.status is Status.OK, result.stderr
  ids, limits, status, view, env = result.stdout.splitlines()
  uid, euid, gid, groups = ids.split(" ", 3)
  assert int(uid) >= cell_lib.UID_BASE and uid == euid == gid and groups == "[]"
  assert limits == f"20 {100 << 20}"
  assert "NoNewPrivs:\\t1" in status and "CapEff:\\t0000000000000000" in status
  top, pids = view.split("] [")
  assert "'work'" not in top and "'etc'" not in top and "'home'" not in top
  assert len(pids.split(",")) <= 4  # the cell's init, the worker, this program
  assert env.startswith("['HOME', 'LANG', 'PATH', 'PYTHONHASHSEED', 'TMPDIR']")


def test_mount_table_does_not_say_where_the_project_lives(cell):
  # /proc/self/mountinfo names the host path of every bind. The worker enters the cell as
  # a copy, so no line names the project's folder. (The interpreter's prefix is bound at
  # its own path, and a cell with host modules shows their site-packages: left as is.)
  project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
      cell_lib.__file__))))
  result = sandbox.run_python("print(open('/proc/self/mountinfo').read())", cell=cell)
  assert result.status is Status.OK and " /opt/sandbox/worker.py " in result.stdout
  assert project + "/" not in result.stdout, result.stdout


def test_probe_process_limit_stops_children(cell):
  source = """
import os, time
kids = 0
try:
  for _ in range(200):
    if os.fork() == 0:
      time.sleep(30)
      os._exit(0)
    kids += 1
except OSError:
  pass
print(kids)
"""
  result = sandbox.run_python(source, cell=cell, timeout_s=5, limits=Limits(processes=20))
  assert result.status is Status.OK and int(result.stdout) < 20
  assert not sandbox_processes(cell)


def test_probe_memory_limit(cell):
  result = sandbox.run_python("x = bytearray(200 << 20)\nprint('got it')", cell=cell,
                              limits=Limits(memory_mb=100))
  assert result.status is Status.MEMORY and "got it" not in result.stdout
  assert "MemoryError" in result.stderr


def test_probe_network_is_loopback_only(cell):
  source = "print([l.split(':')[0].strip() for l in open('/proc/net/dev')][2:])"
  result = sandbox.run_python(source, cell=cell)
  assert result.stdout.strip() == "['lo']", result.stderr


def test_record_of_a_normal_run(cell):
  source = ("import sys\nprint(sys.argv[1:], input(), open('data/x.txt').read())\n"
            "print('err', file=sys.stderr)\nsys.exit(3)")
  result = sandbox.run_python(source, stdin="hello\n", argv=["a", "b"],
                              files={"data/x.txt": "DATA"}, cell=cell)
  assert (result.status, result.exit_code) == (Status.RUNTIME_ERROR, 3)
  assert result.stdout == "['a', 'b'] hello DATA\n" and result.stderr == "err\n"
  assert not result.stdout_truncated and not result.stderr_truncated
  assert 0 < result.wall_s < 5 and 0 < result.cpu_s < 5 and result.isolated


def test_traceback_starts_in_the_program(cell):
  result = sandbox.run_python("def f():\n  return 1 / 0\nf()", cell=cell)
  assert result.status is Status.RUNTIME_ERROR and result.exit_code == 1
  assert result.stderr.startswith("Traceback (most recent call last):\n  File \"/tmp/run")
  assert "worker" not in result.stderr and "ZeroDivisionError" in result.stderr


def test_cpu_limit_is_a_timeout(cell):
  result = sandbox.run_python("while True: pass", cell=cell, timeout_s=30,
                              limits=Limits(cpu_s=1))
  # Ended by RLIMIT_CPU (SIGXCPU), long before the wall-clock timeout.
  assert result.status is Status.TIMEOUT and result.exit_code == -signal.SIGXCPU
  assert 0.9 < result.cpu_s < 2 and result.wall_s < 20


def test_output_cap_marks_truncation(cell):
  result = sandbox.run_python("import sys\nsys.stderr.write('e' * 5000)", cell=cell,
                              limits=Limits(output_bytes=1000))
  assert result.status is Status.OUTPUT_LIMIT and result.stderr == "e" * 1000
  assert result.stderr_truncated and not result.stdout_truncated


def test_runs_do_not_see_each_other(cell):
  sandbox.run_python("open('left.txt', 'w').write('x')", cell=cell)
  result = sandbox.run_python("import os\nprint(os.listdir('.'), os.listdir('..'))",
                              cell=cell)
  assert "left.txt" not in result.stdout
  assert result.stdout.count("run") == 1  # only its own directory


def test_hung_worker_kills_the_cell(namespaces):
  with sandbox.Cell() as cell:
    cell.run("print(1)")
    first = cell._proc.pid
    tree = cell_lib._tree(first)
    os.kill(tree[-1], signal.SIGSTOP)  # the worker (deepest) stops answering
    result = cell.run("print(2)", timeout_s=0.5)
    assert result.status is Status.TIMEOUT and result.exit_code is None
    assert all(not os.path.exists(f"/proc/{p}") or _zombie(p) for p in tree)
    assert cell.run("print(3)").stdout == "3\n" and cell._proc.pid != first


def test_a_cell_outlives_the_thread_that_started_it(namespaces):
  """`--die-with-parent` fires when the starting *thread* exits: a cell first used from
  a pool's thread must still run programs once that thread is gone (it was killed, and
  its next program reported killed: the SWE tools and graders run on such threads)."""
  with sandbox.Cell() as cell:
    started = threading.Thread(target=lambda: cell.run("print(1)"))
    started.start()
    started.join()
    pid = cell._proc.pid
    time.sleep(0.5)  # PR_SET_PDEATHSIG's kill, if any, lands by then
    assert os.path.exists(f"/proc/{pid}") and not _zombie(pid)
    result = cell.run("print(2)")
    assert (result.status, result.stdout) == (Status.OK, "2\n")
    assert cell.starts == 1


def test_a_cell_found_dead_runs_the_program_in_a_fresh_one(namespaces):
  """A cell whose worker died between programs (killed from outside here): the next
  program never reached it, so a fresh cell runs it, rather than a record saying it was
  killed."""
  with sandbox.Cell() as cell:
    cell.run("print(1)")
    tree = cell_lib._tree(cell._proc.pid)
    for pid in tree:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:  # a short-lived process of the cell already gone
        pass
    cell._proc.wait()
    cell_lib._wait_gone(tree[1:])  # nothing holds the request pipe's reading end
    result = cell.run("print(2)")
    assert (result.status, result.stdout) == (Status.OK, "2\n")
    assert cell.starts == 2


def _zombie(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except FileNotFoundError:
    return True


def test_pool_returns_records_in_order(namespaces):
  with sandbox.CellPool(2) as pool:
    results = pool.map([{"source": f"print({i})"} for i in range(10)])
  assert [r.stdout for r in results] == [f"{i}\n" for i in range(10)]


def test_refuses_without_namespaces(monkeypatch):
  monkeypatch.setattr(cell_lib.shutil, "which", lambda name: None)
  monkeypatch.setattr(cell_lib, "_probe_result", None)
  with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap is not installed"):
    sandbox.run_python("print(1)")


def test_rlimits_only_warns_every_run():
  with sandbox.Cell(rlimits_only=True) as cell:
    for _ in range(2):
      with pytest.warns(RuntimeWarning, match="WITHOUT namespaces"):
        result = cell.run("import os\nprint(os.getuid())")
      assert result.status is Status.OK and not result.isolated
      if os.geteuid() == 0:
        assert int(result.stdout) >= cell_lib.UID_BASE


@pytest.mark.parametrize("raw, expected", [
    ({"wait_status": 0, "reason": None}, (Status.OK, 0)),
    ({"wait_status": 2 << 8, "reason": None}, (Status.RUNTIME_ERROR, 2)),
    ({"wait_status": 1 << 8, "reason": None, "memory_error": True}, (Status.MEMORY, 1)),
    ({"wait_status": signal.SIGSEGV, "reason": None}, (Status.KILLED, -11)),
    ({"wait_status": signal.SIGXCPU, "reason": None}, (Status.TIMEOUT, -24)),
    ({"wait_status": signal.SIGKILL, "reason": None, "cpu_s": 3.0}, (Status.TIMEOUT, -9)),
    ({"wait_status": signal.SIGKILL, "reason": None, "cpu_s": 0.1}, (Status.KILLED, -9)),
    ({"wait_status": signal.SIGKILL, "reason": "timeout"}, (Status.TIMEOUT, -9)),
    ({"wait_status": 0, "reason": "output_limit"}, (Status.OUTPUT_LIMIT, 0)),
])
def test_status_of(raw, expected):
  raw = {"memory_error": False, "cpu_s": 0.0, **raw}
  assert status_of(raw, cpu_limit_s=3) == expected
