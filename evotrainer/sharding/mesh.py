"""Device mesh from gin, multi-host start-up, and placing a model's parameters on the mesh."""

from __future__ import annotations

import logging
import os
from typing import Optional

import gin
import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from evotrainer.sharding.rules import MESH_AXES, Rules, named_sharding, tree_shardings


@gin.configurable(module="mesh")
def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1,
              devices: Optional[list] = None) -> Mesh:
  """A `('data', 'fsdp', 'tensor')` mesh over all (or the given) devices.

  One of the sizes may be -1: it takes whatever devices are left. Axes are `Auto` typed
  (jax 0.10 defaults `jax.make_mesh` to Explicit, which our code does not use).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"make_mesh: at most one axis may be -1, got data={data} fsdp={fsdp} "
                     f"tensor={tensor}")
  known = int(np.prod([s for s in sizes if s != -1]))
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"make_mesh: sizes must be positive or -1, got {sizes}")
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"make_mesh: {len(devices)} devices not divisible by {known}")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(
        f"make_mesh: data*fsdp*tensor = {'*'.join(map(str, sizes))} = {int(np.prod(sizes))} "
        f"but {len(devices)} devices are available (see gin/mesh/*.gin)")
  if devices == list(jax.devices()):
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES,
              axis_types=(AxisType.Auto,) * 3)


@gin.configurable(module="mesh")
def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None,
                           local_device_ids: Optional[list] = None) -> bool:
  """Joins a multi-process JAX run; a no-op for a single process.

  Values come from arguments (flags / gin) or the environment variables
  `EVO_COORDINATOR`, `EVO_NUM_PROCESSES`, `EVO_PROCESS_ID`. On a TPU VM pod nothing needs
  to be set: `jax.distributed.initialize()` finds the workers itself (`EVO_TPU_POD=1`).
  On the CPU, processes talk through gloo collectives.

  Returns:
    True when a multi-process run was initialized.
  """
  coordinator_address = coordinator_address or os.environ.get("EVO_COORDINATOR")
  if num_processes is None and os.environ.get("EVO_NUM_PROCESSES"):
    num_processes = int(os.environ["EVO_NUM_PROCESSES"])
  if process_id is None and os.environ.get("EVO_PROCESS_ID"):
    process_id = int(os.environ["EVO_PROCESS_ID"])
  if os.environ.get("EVO_TPU_POD") == "1":
    jax.distributed.initialize()
    return True
  if not coordinator_address and not num_processes:
    return False
  if not (coordinator_address and num_processes is not None and process_id is not None):
    raise ValueError(
        "multi-host needs all of coordinator_address, num_processes and process_id "
        f"(got {coordinator_address!r}, {num_processes!r}, {process_id!r})")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} outside [0, {num_processes})")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             local_device_ids=local_device_ids)
  logging.info("process %d of %d joined %s; %d global devices", process_id, num_processes,
               coordinator_address, jax.device_count())
  return True


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules):
  """NamedSharding per parameter of an (abstract or concrete) NNX state."""
  return jax.tree.map(
      lambda v: named_sharding(mesh, v.get_metadata()["logical_axes"], rules, v.shape),
      state, is_leaf=_is_var)


def opt_state_shardings(tx: optax.GradientTransformation, opt_state, param_shardings,
                        mesh: Mesh):
  """Shardings for an optax state, derived from the parameters' shardings.

  Every copy of the parameter tree inside the state (Adam's `mu` and `nu`, momentum
  traces, ...) is sharded exactly like the parameters, so the optimizer update is local
  to each shard; everything else (step counters, scalars) is replicated.

  Args:
    tx: the optimizer that built (or will build) `opt_state`.
    opt_state: the optimizer state, concrete or abstract (`jax.eval_shape(tx.init, params)`).
    param_shardings: the parameters' shardings, e.g. from `state_shardings`.
    mesh: the mesh the replicated leaves live on.

  Returns:
    A tree of NamedShardings that is a prefix of `opt_state`, usable as `in_shardings`,
    `out_shardings` or with `jax.device_put`.
  """
  replicated = NamedSharding(mesh, PartitionSpec())
  return optax.tree_map_params(tx, lambda _, sharding: sharding, opt_state, param_shardings,
                               transform_non_params=lambda _: replicated, is_leaf=_is_var)


def shard_batch(batch, mesh: Mesh, rules: Rules, logical=None):
  """Places a batch on the mesh, split by logical axis names (rows by the `batch` rule).

  Works on one host and on many: a numpy leaf must hold the *global* batch, the same
  on every process, and each process copies out only the slices its devices own
  (`jax.make_array_from_callback`); a `jax.Array` leaf is resharded with `device_put`.

  Args:
    batch: pytree of arrays, each [B, ...].
    mesh: the device mesh.
    rules: the logical → mesh axis table (e.g. `LEARNER_RULES`).
    logical: optional matching tree of logical axis tuples, e.g.
      `{'tokens': ('batch', 'length')}`; by default the leading axis of every leaf is
      `batch` and the others are replicated.

  Returns:
    The same tree of global `jax.Array`s.
  """
  if logical is None:
    def rows(x):
      return ("batch",) + (None,) * (np.ndim(x) - 1) if np.ndim(x) else ()
    shardings = jax.tree.map(lambda x: named_sharding(mesh, rows(x), rules, np.shape(x)),
                             batch)
  else:
    shardings = tree_shardings(mesh, logical, batch, rules)

  def place(x, sharding):
    if isinstance(x, jax.Array):
      return jax.device_put(x, sharding)
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(place, batch, shardings)


def create_model(config, mesh: Mesh, rules: Rules, seed: int = 0):
  """Builds a randomly initialized model whose parameters are created already sharded.

  Initialization runs under `jit` with `out_shardings`, so each device only ever holds
  its own shard; no full host copy exists.
  """
  from evotrainer.model.transformer import Transformer  # avoid an import cycle

  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(seed)))
  graphdef, abs_state = nnx.split(abstract)
  shardings = state_shardings(abs_state, mesh, rules)

  @jax.jit
  def init():
    return nnx.split(Transformer(config, rngs=nnx.Rngs(seed)))[1]

  init = jax.jit(init, out_shardings=shardings)
  return nnx.merge(graphdef, init())


def reshard(tree, shardings):
  """Moves a (possibly nested) state onto new shardings, e.g. learner → sampler layout."""
  return jax.device_put(tree, shardings)
