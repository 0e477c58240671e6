"""A child started by the controller (or a benchmark) ends when its parent is killed."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from evotrainer import lifetime

REPO = pathlib.Path(__file__).resolve().parents[1]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")

# The child: what `evotrainer.launch` does first, then a long sleep; its pid to a file.
CHILD = textwrap.dedent("""
    import os, pathlib, sys, time
    from evotrainer import lifetime
    if sys.argv[2] == "with_launcher":
      lifetime.die_with_launcher()
      assert lifetime.PARENT_ENV not in os.environ  # not passed on to grandchildren
    pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
    time.sleep(120)
""")

# The parent: the controller's way of running a branch (`run_child`).
PARENT = textwrap.dedent("""
    import os, sys
    from evotrainer.evolution.trainer import run_child
    run_child([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]], sys.argv[4],
              env=dict(os.environ), timeout_s=300)
""")


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
  except FileNotFoundError:
    return False


def _child_after_parent_killed(tmp_path, mode: str) -> int:
  """Starts PARENT -> run_child -> CHILD, SIGKILLs the parent once the child runs, and
  returns the child's pid."""
  pid_file = tmp_path / f"child_{mode}.pid"
  env = dict(os.environ, PYTHONPATH=str(REPO))
  parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(pid_file), mode,
                             str(tmp_path / "child.log")], env=env)
  deadline = time.time() + 60
  while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
    time.sleep(0.1)
  child = int(pid_file.read_text())
  parent.kill()
  parent.wait()
  return child


def _gone_within(pid: int, seconds: float) -> bool:
  deadline = time.time() + seconds
  while _alive(pid) and time.time() < deadline:
    time.sleep(0.1)
  return not _alive(pid)


@linux_only
def test_a_branch_child_ends_when_the_controller_is_killed(tmp_path):
  child = _child_after_parent_killed(tmp_path, "with_launcher")
  try:
    assert _gone_within(child, 10), "the child outlived its killed parent"
  finally:
    if _alive(child):
      os.kill(child, signal.SIGKILL)


@linux_only
def test_without_the_request_the_child_outlives_its_parent(tmp_path):
  # The control: the check above can see a survivor.
  child = _child_after_parent_killed(tmp_path, "plain")
  try:
    assert not _gone_within(child, 2)
  finally:
    os.kill(child, signal.SIGKILL)


def test_launch_exits_when_its_named_parent_is_already_gone():
  env = dict(os.environ, PYTHONPATH=str(REPO), **{lifetime.PARENT_ENV: "1"})
  out = subprocess.run([sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  assert "the process that started this one (1) has already ended" in out.stderr


def test_child_env_names_this_process():
  env = lifetime.child_env({"A": "b"})
  assert env == {"A": "b", lifetime.PARENT_ENV: str(os.getpid())}


def test_a_benchmark_child_is_told_its_parent(tmp_path):
  from bench import common
  log = tmp_path / "run.log"
  rc = common.run_logged([sys.executable, "-c", f"import os; print(os.environ["
                          f"{lifetime.PARENT_ENV!r}])"], log, env=dict(os.environ),
                         label="x")
  assert rc == 0 and log.read_text().splitlines()[-1] == str(os.getpid())
