"""The hostile corpus (`corpus/*.py`), each program run through the sandbox.

For every attack: the call returns within timeout + 5 s with the expected status, no
process is left (ps), no file appears outside the cell, the planted secret is not in
the output, the listener on the host's loopback received nothing, and the same cell
still runs a benign program afterwards.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time

import pytest

from evotrainer import sandbox
from evotrainer.sandbox import Status
from tests.sandbox.conftest import HOSTILE, sandbox_processes

CORPUS = pathlib.Path(__file__).parent / "corpus"

# The runner of tamper_harness: the harness's tests, run against the candidate module.
TAMPER_RUNNER = "import solution\nexec(open('tests.py').read())\ntest()\nprint('PASSED')\n"
TAMPER_TESTS = "def test():\n  assert solution.add(2, 2) == 4, 'wrong answer'\n"


@dataclasses.dataclass(frozen=True)
class Attack:
  status: Status
  timeout_s: float = 2.0
  argv: str | None = None   # 'outside' | 'secret' | 'port': what argv[1] gets
  limits: sandbox.Limits = HOSTILE


ATTACKS = {
    "fork_bomb": Attack(Status.TIMEOUT),
    # Ends by MemoryError at the 256 MiB address-space limit after writing ~200 MB; on a
    # loaded 2-core CI machine that took longer than a 2 s deadline once (0.6 s of CPU
    # in 2 s of wall time, RSS 149 MB), so its deadline is 10 s: the status must still
    # be MEMORY, never TIMEOUT.
    "memory_bomb": Attack(Status.MEMORY, timeout_s=10),
    "thread_bomb": Attack(Status.TIMEOUT),
    "infinite_loop": Attack(Status.TIMEOUT),
    "sleeper": Attack(Status.TIMEOUT),
    "huge_output": Attack(Status.OUTPUT_LIMIT),
    "write_outside": Attack(Status.OK, argv="outside"),
    "read_secrets": Attack(Status.OK, timeout_s=10, argv="secret"),
    "connect_host": Attack(Status.OK, timeout_s=8, argv="port"),
    "kill_parent": Attack(Status.OK),
    "daemon": Attack(Status.OK, timeout_s=5, argv="outside"),
    "fd_exhaustion": Attack(Status.OK),
    "disk_fill": Attack(Status.RUNTIME_ERROR, timeout_s=10),
    "segfault": Attack(Status.KILLED),
    "ignore_signals": Attack(Status.TIMEOUT),
    "lying_exit": Attack(Status.OK),
    "tamper_harness": Attack(Status.RUNTIME_ERROR),
    "spawn_shell": Attack(Status.TIMEOUT, argv="port"),
    "escape_namespaces": Attack(Status.OK),
}


def test_corpus_is_complete():
  assert sorted(ATTACKS) == sorted(p.stem for p in CORPUS.glob("*.py"))
  assert len(ATTACKS) >= 15


def _run(cell, name, attack, outside, planted, listener):
  argv = {"outside": [outside], "secret": [planted[1][0]], "port": [str(listener.port)],
          None: []}[attack.argv]
  source, files = (CORPUS / f"{name}.py").read_text(), {}
  if name == "tamper_harness":
    source, files = TAMPER_RUNNER, {"solution.py": source, "tests.py": TAMPER_TESTS}
  start = time.monotonic()
  result = sandbox.run_python(source, argv=argv, files=files, timeout_s=attack.timeout_s,
                              limits=attack.limits, cell=cell)
  return result, time.monotonic() - start


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.slow
def test_attack_is_contained(name, cell, outside, planted, listener):
  attack = ATTACKS[name]
  result, wall = _run(cell, name, attack, outside, planted, listener)
  detail = f"{result.status} {result.exit_code}\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
  assert wall <= attack.timeout_s + 5, detail
  assert result.status is attack.status, detail
  assert not sandbox_processes(cell), sandbox_processes(cell)
  token = planted[0]
  assert token not in result.stdout and token not in result.stderr
  assert not listener.received
  _check_specifics(name, result, attack)
  after = sandbox.run_python("print('fine')", cell=cell, timeout_s=5)
  assert (after.status, after.stdout) == (Status.OK, "fine\n")


def _check_specifics(name, result, attack):
  out = result.stdout
  if attack.status is Status.TIMEOUT:
    # Killed at its deadline, not when the program ended by itself; the margin is the
    # issue's (timeout + 5 s): on a loaded 2-core machine, reaping a fork bomb's cell took
    # 2 s past a 2 s deadline once (wall 3.97 s).
    assert attack.timeout_s <= result.wall_s < attack.timeout_s + 5
  if name == "huge_output":
    # The program floods both streams; the run ends on whichever reaches the cap first
    # (stderr is line-buffered, stdout block-buffered, so either can win the race). That
    # stream keeps exactly the cap and is marked; neither keeps more.
    cap = attack.limits.output_bytes
    kept = {"stdout": (result.stdout, result.stdout_truncated),
            "stderr": (result.stderr, result.stderr_truncated)}
    assert any(truncated for _, truncated in kept.values())
    for text, truncated in kept.values():
      assert len(text.encode()) == cap if truncated else len(text.encode()) <= cap
  if name == "write_outside":
    assert "wrote" not in out.replace("wrote /tmp/run", "")
  if name == "connect_host":
    assert "connected" not in out
  if name == "kill_parent":
    assert "alive" in out and "signalled" not in out
  if name == "daemon":
    assert result.wall_s < 1.0  # the run ended when the program did, daemon or not
  if name == "fd_exhaustion":
    assert int(out.split()[2]) <= attack.limits.open_files
  if name == "disk_fill":
    assert "big file refused at 8 MiB" in out  # RLIMIT_FSIZE
    assert ". refused after" in out and "/dev/shm refused after" in out
  if name == "segfault":
    assert result.exit_code == -11
  if name == "lying_exit":
    # The record is what the process did: exit 0 (its atexit hook) with its claims as
    # plain output. A forged protocol frame on stdout is just bytes of stdout.
    assert result.exit_code == 0 and "all tests passed" in out and "forged" in out
  if name == "tamper_harness":
    assert "wrong answer" in result.stderr and "PASSED" not in out
    assert ": DONE" not in out.replace("pycache: DONE", "")
  if name == "spawn_shell":
    assert "uid=0" not in out and "uid=100" in out and "shell-exit=0" not in out
  if name == "escape_namespaces":
    assert " OK" not in out and "uid 0" not in out


def test_one_shot_calls_leave_nothing(namespaces, outside, planted, listener):
  """Without a shared cell, each call starts and ends its own: nothing survives it."""
  for name in ("daemon", "fork_bomb", "kill_parent"):
    attack = ATTACKS[name]
    result, wall = _run(None, name, attack, outside, planted, listener)
    assert result.status is attack.status and wall <= attack.timeout_s + 5
  own = sandbox.Cell()
  own.close()
  assert not sandbox_processes(own)
