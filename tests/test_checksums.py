"""Array checksums: a one-bit change is caught, sharding and host/device do not matter."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from evotrainer import checksums
from evotrainer.sharding.mesh import make_mesh


def test_checksum_sees_one_bit_and_ignores_sharding(devices):
  x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 16)), jnp.float32)
  base = [int(s) for s in checksums.checksum(x)]
  bits = np.asarray(x).view(np.uint32).copy()
  bits[3, 5] ^= 1 << 31
  flipped = jnp.asarray(bits.view(np.float32))
  assert [int(s) for s in checksums.checksum(flipped)] != base
  swapped = x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])  # same values, other places
  assert [int(s) for s in checksums.checksum(swapped)] != base
  mesh = make_mesh(2, 2, 2)
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, P(("data", "fsdp"), "tensor")))
  assert [int(s) for s in checksums.device_checksums([sharded])[0]] == base
  # numpy computes the same sums on the host, for every element width.
  for dtype in (jnp.float32, jnp.bfloat16, jnp.int8, jnp.bool_):
    y = x.astype(dtype)
    assert checksums.checksum_host(np.asarray(y)) == [int(s) for s in checksums.checksum(y)]
