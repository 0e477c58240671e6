"""Two local processes × 4 CPU devices form one 8-device mesh and agree with one process.

This is how multi-host code is tested without a pod: `jax.distributed.initialize` with a
localhost coordinator, gloo CPU collectives between the processes.
"""

import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from evotrainer.sharding.mesh import make_mesh
from tests.sharding import multihost_worker

REPO = pathlib.Path(__file__).resolve().parents[2]
NUM_PROCESSES = 2
TIMEOUT_S = 300  # generous for 2 shared cores; a hang fails instead of blocking CI


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _worker_env(port: int, process_id: int) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith("EVO_")}
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env.update(
      XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=4"]),
      JAX_PLATFORMS="cpu",
      EVO_COORDINATOR=f"localhost:{port}",
      EVO_NUM_PROCESSES=str(NUM_PROCESSES),
      EVO_PROCESS_ID=str(process_id),
      PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p]),
  )
  return env


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, devices):
  out = tmp_path / "logits.npy"
  port = _free_port()
  procs, logs = [], []
  for i in range(NUM_PROCESSES):
    log = open(tmp_path / f"worker{i}.log", "w+")
    logs.append(log)
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "tests.sharding.multihost_worker", str(out)],
        cwd=REPO, env=_worker_env(port, i), stdout=log, stderr=subprocess.STDOUT))

  def worker_logs() -> str:
    text = []
    for i, log in enumerate(logs):
      log.flush()
      log.seek(0)
      text.append(f"--- worker {i} (rc={procs[i].returncode}) ---\n{log.read()[-6000:]}")
    return "\n".join(text)

  try:
    for p in procs:
      p.wait(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    for p in procs:
      p.wait()
    pytest.fail(f"multi-host workers did not finish in {TIMEOUT_S}s\n{worker_logs()}")
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()

  try:
    assert all(p.returncode == 0 for p in procs), worker_logs()
    assert out.exists(), f"process 0 wrote no logits\n{worker_logs()}"
  finally:
    for log in logs:
      log.close()
  multi = np.load(out)

  tokens = multihost_worker.fixed_tokens()
  single = np.asarray(multihost_worker.sharded_logits(make_mesh(2, 2, 2), tokens))
  cfg = multihost_worker.tiny_config()
  assert multi.shape == single.shape == (*tokens.shape, cfg.vocab_size)
  diff = float(np.max(np.abs(multi - single)))
  print(f"multi-host vs single-process logits: max abs diff {diff:.3g}")
  assert diff <= 1e-5
  assert np.std(single) > 1e-3  # real logits, not zeros on both sides
