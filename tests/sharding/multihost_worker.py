"""One process of a multi-host run on the CPU, for `test_multihost.py`.

Run (one per process, all with the same coordinator):

  XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
  EVO_COORDINATOR=localhost:12345 EVO_NUM_PROCESSES=2 EVO_PROCESS_ID=0 \\
  python -m tests.sharding.multihost_worker /tmp/logits.npy

Every process joins the run (`initialize_distributed`), forms one `(2, 2, 2)` mesh over
all processes' devices, builds the tiny model sharded by the learner rules, runs one
forward pass on a fixed batch, and gathers the logits; process 0 writes them to the
given `.npy` path. The tiny model and the batch are defined here, so that the test
process computes the single-process reference from the same definitions.
"""

from __future__ import annotations

import sys

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from evotrainer.model.config import ModelConfig
from evotrainer.sharding.mesh import (create_model, initialize_distributed, make_mesh,
                                      shard_batch)
from evotrainer.sharding.rules import LEARNER_RULES, use_rules
from tests.tiny_models import small_config


def tiny_config() -> ModelConfig:
  """A two-layer GQA decoder whose every sharded axis divides the (2, 2, 2) mesh."""
  return small_config()


def fixed_tokens(batch: int = 8, length: int = 16) -> np.ndarray:
  """The same token batch in every process. Returns [B, T] int32."""
  return np.random.default_rng(1234).integers(
      0, tiny_config().vocab_size, size=(batch, length), dtype=np.int32)


def sharded_logits(mesh: Mesh, tokens: np.ndarray, seed: int = 0) -> jax.Array:
  """Forward pass of the seed-`seed` tiny model, sharded by the learner rules.

  Args:
    mesh: a `('data', 'fsdp', 'tensor')` mesh (one process or several).
    tokens: [B, T] int, the global batch.

  Returns:
    logits: [B, T, V] float32, a global array sharded over the mesh.
  """
  model = create_model(tiny_config(), mesh, LEARNER_RULES, seed=seed)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, tokens):
    with use_rules(LEARNER_RULES):
      return nnx.merge(graphdef, state).forward_logits(tokens)

  with jax.set_mesh(mesh):
    return forward(state, shard_batch(tokens, mesh, LEARNER_RULES))


def main(argv) -> int:
  if len(argv) != 2:
    print(f"usage: {argv[0]} OUT.npy  (with EVO_COORDINATOR, EVO_NUM_PROCESSES, "
          "EVO_PROCESS_ID set)", file=sys.stderr)
    return 2
  if not initialize_distributed():
    print("EVO_COORDINATOR / EVO_NUM_PROCESSES / EVO_PROCESS_ID are not set",
          file=sys.stderr)
    return 2
  print(f"process {jax.process_index()}/{jax.process_count()}: "
        f"{jax.local_device_count()} local, {jax.device_count()} global devices",
        file=sys.stderr)
  logits = sharded_logits(make_mesh(data=2, fsdp=2, tensor=2), fixed_tokens())
  # Each process holds only its shards; the gather is itself a collective, so every
  # process takes part even though only process 0 writes.
  full = multihost_utils.process_allgather(logits, tiled=True)
  if jax.process_index() == 0:
    np.save(argv[1], np.asarray(full))
  multihost_utils.sync_global_devices("multihost_worker done")
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
