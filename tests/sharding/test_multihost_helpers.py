"""sharding/multihost.py in one process: the helpers are the identity (no collective),
and `to_host` returns the full value of an array sharded over the 8 fake devices."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from evotrainer.sharding import multihost
from evotrainer.sharding.mesh import make_mesh


def test_one_process_is_primary_and_helpers_are_identities(devices):
  assert multihost.is_primary() and not multihost.is_multiprocess()
  value = {"scores": [{"correct": 1.0, "partial": float("nan")}], "stop": True}
  assert multihost.broadcast_json(value) is value
  assert multihost.all_true(True) and not multihost.all_true(False)
  multihost.check_agree({"reward": 0.5, "loss": float("nan")}, "step 1")  # no error


def test_to_host_returns_the_whole_sharded_array(devices):
  mesh = make_mesh(data=8)
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # [B, N]
  sharded = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
  tree = multihost.to_host({"x": sharded, "n": np.int32(4)})
  np.testing.assert_array_equal(tree["x"], x)
  assert isinstance(tree["x"], np.ndarray) and tree["n"] == 4
