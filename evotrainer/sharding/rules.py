"""Logical axis names used by the layers, and the tables that map them onto the mesh.

Layers speak only of logical axes (`('embed', 'mlp')`); this module is the one place
that says what those mean on the `('data', 'fsdp', 'tensor')` mesh, in one table,
`LEARNER_RULES`: the learner shards parameters over `fsdp` (ZeRO-3 style: parameters and
optimizer state are split, all-gathered per layer). The sampler's `SAMPLER_RULES` differ
in one entry: parameters stay whole on each data/fsdp replica (`embed` unsplit) so that
a decode step does no parameter all-gather; they split only over `tensor`.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Iterator, Optional, Sequence, Tuple, Union

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axes that appear in the model and in batches.
# `embed_vocab` is the vocabulary axis of the embedding table: kept whole, since a row
# lookup (gather) along a split vocabulary forces XLA to rebuild the full table.
LOGICAL_AXES = ("batch", "length", "cache_length", "embed", "heads", "kv_heads",
                "head_dim", "mlp", "vocab", "embed_vocab", "norm", "layers")

MeshAxes = Union[None, str, Tuple[str, ...]]
Rules = Tuple[Tuple[str, MeshAxes], ...]

LEARNER_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("cache_length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("embed_vocab", None),
    ("norm", None),
    ("layers", None),
)


def _with_axes(rules: Rules, **axes: MeshAxes) -> Rules:
  """`rules` with the mesh axes of some logical axes replaced: `_with_axes(r, embed=None)`."""
  unknown = set(axes) - {name for name, _ in rules}
  if unknown:
    raise ValueError(f"_with_axes: no rule for logical axes {sorted(unknown)}")
  return tuple((name, axes.get(name, mesh)) for name, mesh in rules)


# The sampler: the learner's table with parameters whole over fsdp (no gather per step).
SAMPLER_RULES: Rules = _with_axes(LEARNER_RULES, embed=None)

_ACTIVE_RULES: contextvars.ContextVar[Optional[Rules]] = contextvars.ContextVar(
    "evotrainer_rules", default=None)
_warned: set = set()


@contextlib.contextmanager
def use_rules(rules: Rules) -> Iterator[None]:
  """Makes `rules` the table that `constrain` uses while tracing the enclosed code."""
  token = _ACTIVE_RULES.set(rules)
  try:
    yield
  finally:
    _ACTIVE_RULES.reset(token)


def _mesh_size(mesh, axes: MeshAxes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  return size


def logical_to_spec(logical: Sequence[Optional[str]], rules: Rules,
                    mesh=None, shape: Optional[Sequence[int]] = None) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec.

  With `mesh` and `shape`, a dimension that the mapped mesh axes do not divide is
  replicated instead (logged once), and a mesh axis is used at most once per array.
  """
  table = dict(rules)
  used: set = set()
  out = []
  for i, name in enumerate(logical):
    if name is None:
      out.append(None)
      continue
    if name not in table:
      raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(table)}")
    axes = table[name]
    flat = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    if mesh is not None:
      flat = tuple(a for a in flat if a not in used and mesh.shape.get(a, 1) > 1)
    if mesh is not None and shape is not None and flat and shape[i] % _mesh_size(mesh, flat):
      key = (name, shape[i], flat)
      if key not in _warned:
        _warned.add(key)
        logging.info("axis %s of size %d not divisible by mesh axes %s: replicated",
                     name, shape[i], flat)
      flat = ()
    used.update(flat)
    out.append(None if not flat else (flat[0] if len(flat) == 1 else flat))
  return PartitionSpec(*out)


def named_sharding(mesh: Mesh, logical: Sequence[Optional[str]], rules: Rules,
                   shape: Optional[Sequence[int]] = None) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical, rules, mesh, shape))


def constrain(x: jax.Array, logical: Sequence[Optional[str]]) -> jax.Array:
  """Sharding constraint on an activation by logical names; a no-op without rules or mesh."""
  rules = _ACTIVE_RULES.get()
  if rules is None:
    return x
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return x
  spec = logical_to_spec(logical, rules, mesh, x.shape)
  return jax.lax.with_sharding_constraint(x, spec)


def tree_shardings(mesh: Mesh, logical_tree, abstract_tree, rules: Rules):
  """NamedShardings for a pytree, given a matching tree of logical names (tuples) and shapes."""
  return jax.tree.map(
      lambda names, a: named_sharding(mesh, names, rules, a.shape),
      logical_tree, abstract_tree,
      is_leaf=lambda n: isinstance(n, tuple) and all(isinstance(e, (str, type(None))) for e in n))
