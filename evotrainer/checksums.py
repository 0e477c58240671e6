"""Array checksums computed where the arrays live (checkpoint integrity, fingerprints).

A checksum is two position-weighted sums mod 2^32 of an array's raw bits: integer
arithmetic, so the same value under any sharding, and any change of a single element is
caught. Device arrays are reduced on their devices in one jitted call per set of devices
(no host copy); host arrays by numpy, to the same numbers. checkpoint.py records them at
save and compares them at restore, since a flipped byte in an OCDBT data file restores
silently wrong.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Odd multipliers: a change of one element by d changes its term by d * odd, which is
# never 0 mod 2^32 for d != 0, so any change of a single element is always caught.
_M1 = np.uint32(0x9E3779B1)
_M2 = np.uint32(0x85EBCA77)


def _bits(x: jax.Array) -> jax.Array:
  """The raw bits of any array as uint32 [N] (64-bit elements give two words each)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)


def checksum(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Two position-weighted sums mod 2^32 of the bits of `x` (order-independent integer
  arithmetic: the same value under any sharding)."""
  b = _bits(x)
  i = jnp.arange(b.size, dtype=jnp.uint32)
  s1 = jnp.sum(b * (i * _M1 | 1), dtype=jnp.uint32)
  s2 = jnp.sum((b ^ (b >> 15)) * ((i ^ 0x5BD1E995) * _M2 | 1), dtype=jnp.uint32)
  return s1, s2


device_checksums = jax.jit(lambda leaves: [checksum(x) for x in leaves])


def checksum_host(x: np.ndarray) -> list[int]:
  """`checksum` of a host array, computed by numpy (uint64 products wrap mod 2^64,
  which keeps them exact mod 2^32)."""
  x = np.ascontiguousarray(x)
  if x.dtype == np.bool_:
    x = x.astype(np.uint8)
  unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[x.dtype.itemsize]
  b = x.view(unsigned).reshape(-1).astype(np.uint64)
  i = np.arange(b.size, dtype=np.uint64)
  mask = np.uint64(0xFFFFFFFF)
  w1 = ((i * np.uint64(_M1)) & mask) | np.uint64(1)
  w2 = (((i ^ np.uint64(0x5BD1E995)) * np.uint64(_M2)) & mask) | np.uint64(1)
  s1 = np.sum(b * w1, dtype=np.uint64) & mask
  s2 = np.sum((b ^ (b >> np.uint64(15))) * w2, dtype=np.uint64) & mask
  return [int(s1), int(s2)]



def array_checksums(leaves: list) -> list[list[int]]:
  """Checksums of `leaves`: host arrays by numpy, device arrays on their devices, one
  jitted call per set of devices (a call cannot mix arrays committed to different ones)."""
  out: list = [None] * len(leaves)
  groups: dict = {}
  for i, leaf in enumerate(leaves):
    if isinstance(leaf, jax.Array):
      devices = frozenset(leaf.sharding.device_set) if leaf.committed else None
      groups.setdefault(devices, []).append(i)
    else:
      out[i] = checksum_host(np.asarray(leaf))
  for idx in groups.values():
    for i, sums in zip(idx, device_checksums([leaves[i] for i in idx])):
      # Scalar reductions are replicated; shard 0 holds the value on every process.
      out[i] = [int(np.asarray(s.addressable_data(0))) for s in sums]
  return out


__all__ = ["array_checksums", "checksum", "checksum_host", "device_checksums"]
