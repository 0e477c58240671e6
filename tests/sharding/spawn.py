"""Start N local processes of one multi-process JAX run and collect their logs.

Shared by the multi-host tests: every process gets `D` fake CPU devices, the coordinator
`localhost:<free port>` and its `EVO_PROCESS_ID` (evotrainer/sharding/mesh.py reads the
`EVO_*` variables), so the processes form one `N * D`-device run over gloo collectives.
`one_and_two` runs one launch command as 1 process x 4 devices and as 2 x 2 at once, the
second with every file each process writes recorded (`writes`, tests/sharding/audit/).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
from typing import Callable, Mapping, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
AUDIT = pathlib.Path(__file__).resolve().parent / "audit"

# Launch bindings for a small RL run that still learns something: a 2-layer model without
# the warm start (saves a minute of CPU), whose reward is a length penalty plus the task's
# partial-credit part, which vary between completions, so the advantages, loss and
# gradients are far from zero; no test split.
TINY_RL_BINDINGS = (
    "run.warm_start = False", "ModelConfig.num_layers = 2",
    "RewardComposer.parts = {'correct': 1.0, 'partial': 1.0, 'length': 1.0}",
    "RewardComposer.components = [@LengthPenalty()]",
    "LengthPenalty.target = 2", "LengthPenalty.scale = 8.0",
    "EvalConfig.max_new_tokens = 8", "EvalConfig.num_test = 0")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def process_env(devices: int, *, port: Optional[int] = None, process_id: int = 0,
                num_processes: int = 1, pythonpath: Sequence[str] = (),
                extra: Optional[Mapping[str, str]] = None) -> dict:
  """The environment of one process with `devices` fake CPU devices; with `port`, one of
  `num_processes` processes of a multi-process run (else a single process)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("EVO_")}
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env.update(
      XLA_FLAGS=" ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]),
      JAX_PLATFORMS="cpu",
      PYTHONPATH=os.pathsep.join([*map(str, pythonpath), str(REPO)] +
                                 [p for p in [env.get("PYTHONPATH")] if p]))
  if port is not None:
    env.update(EVO_COORDINATOR=f"localhost:{port}", EVO_NUM_PROCESSES=str(num_processes),
               EVO_PROCESS_ID=str(process_id))
  env.update(extra or {})
  return env


def run_processes(argv: Sequence[str], envs: Sequence[Mapping[str, str]],
                  log_dir: pathlib.Path, timeout_s: float) -> tuple[list, list]:
  """Runs `argv` once per environment, all at once, from the repository root.

  Returns:
    (return codes, full logs), one per process; a process still running after
    `timeout_s` is killed (return code None), so a hang fails instead of blocking CI.
  """
  return start_processes(argv, envs, log_dir).wait(timeout_s)


class Started:
  """Processes started by `start_processes`, each writing its log file."""

  def __init__(self, procs: list, files: list):
    self.procs, self.files = procs, files

  def wait(self, timeout_s: float) -> tuple[list, list]:
    """(return codes, full logs) as `run_processes` returns them."""
    codes = []
    try:
      for p in self.procs:
        try:
          codes.append(p.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
          codes.append(None)
          timeout_s = 1  # the others have had their time too
    finally:
      for p in self.procs:
        if p.poll() is None:
          p.kill()
          p.wait()
    logs = []
    for f in self.files:
      f.seek(0)
      logs.append(f.read())
      f.close()
    return codes, logs


def start_processes(argv: Sequence[str], envs: Sequence[Mapping[str, str]],
                    log_dir: pathlib.Path) -> Started:
  """Starts `argv` once per environment from the repository root, logging to
  `log_dir/process<i>.log`; `.wait(timeout_s)` collects them."""
  procs, files = [], []
  for i, env in enumerate(envs):
    f = open(log_dir / f"process{i}.log", "w+")
    files.append(f)
    procs.append(subprocess.Popen(list(argv), cwd=REPO, env=dict(env), stdout=f,
                                  stderr=subprocess.STDOUT))
  return Started(procs, files)


def format_logs(codes: Sequence, logs: Sequence[str], tail: int = 6000) -> str:
  return "\n".join(f"--- process {i} (rc={c}) ---\n{log[-tail:]}"
                   for i, (c, log) in enumerate(zip(codes, logs)))


def one_and_two(argv: Callable[[pathlib.Path], Sequence[str]], tmp_path: pathlib.Path,
                timeout_s: float, phase: str = "") -> list:
  """Runs `argv(tmp_path / 'one')` as 1 process x 4 devices and, at the same time (the
  test machine's cores are better used), `argv(tmp_path / 'two')` as 2 processes x 2
  devices whose writes go to `tmp_path / 'writes<i><phase>.txt'`; both must exit 0.
  Returns the 2-process run's logs. A later `phase` (a relaunch on the same workdirs)
  keeps its logs apart."""
  for d in ("logs1", "logs2"):
    (tmp_path / f"{d}{phase}").mkdir()
  one = start_processes(argv(tmp_path / "one"), [process_env(4)], tmp_path / f"logs1{phase}")
  port = free_port()
  envs = [process_env(2, port=port, process_id=i, num_processes=2, pythonpath=[AUDIT],
                      extra={"EVO_AUDIT_LOG": str(tmp_path / f"writes{i}{phase}.txt")})
          for i in range(2)]
  codes, logs = start_processes(argv(tmp_path / "two"), envs,
                                tmp_path / f"logs2{phase}").wait(timeout_s)
  codes1, logs1 = one.wait(timeout_s)
  assert codes1 == [0], format_logs(codes1, logs1)
  assert codes == [0, 0], format_logs(codes, logs)
  return logs


def writes(log: pathlib.Path, workdir: pathlib.Path) -> set:
  """Paths inside `workdir` that one process (and its children) wrote, relative, from its
  audit log."""
  out = set()
  for line in log.read_text().splitlines() if log.exists() else []:
    p = pathlib.Path(line.split("\t", 1)[1])
    if p.is_relative_to(workdir):
      out.add(p.relative_to(workdir))
  return out
