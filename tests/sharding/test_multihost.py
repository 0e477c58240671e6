"""Two local processes × 4 CPU devices form one 8-device mesh and agree with one process.

This is how multi-host code is tested without a pod: `jax.distributed.initialize` with a
localhost coordinator, gloo CPU collectives between the processes.
"""

import sys

import numpy as np
import pytest

from evotrainer.sharding.mesh import make_mesh
from tests.sharding import multihost_worker
from tests.sharding.spawn import format_logs, free_port, process_env, run_processes

NUM_PROCESSES = 2
TIMEOUT_S = 600  # generous for 2 shared cores and 2 test workers; a hang fails instead of blocking CI


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, devices):
  out = tmp_path / "logits.npy"
  port = free_port()
  envs = [process_env(4, port=port, process_id=i, num_processes=NUM_PROCESSES)
          for i in range(NUM_PROCESSES)]
  codes, logs = run_processes([sys.executable, "-m", "tests.sharding.multihost_worker",
                               str(out)], envs, tmp_path, TIMEOUT_S)
  assert codes == [0] * NUM_PROCESSES, format_logs(codes, logs)
  assert out.exists(), f"process 0 wrote no logits\n{format_logs(codes, logs)}"
  multi = np.load(out)

  tokens = multihost_worker.fixed_tokens()
  single = np.asarray(multihost_worker.sharded_logits(make_mesh(2, 2, 2), tokens))
  cfg = multihost_worker.tiny_config()
  assert multi.shape == single.shape == (*tokens.shape, cfg.vocab_size)
  diff = float(np.max(np.abs(multi - single)))
  print(f"multi-host vs single-process logits: max abs diff {diff:.3g}")
  assert diff <= 1e-5
  assert np.std(single) > 1e-3  # real logits, not zeros on both sides
