"""Checkpoints: the one module that reads and writes them through Orbax (STYLE rule 9).

Two layouts, both written by Orbax's `CompositeCheckpointHandler`:

* Training checkpoints (`Checkpoints`, `save`): a step directory per save,

      <dir>/<step>/<name>/...              one pytree item per entry of the saved state
                                           ("params", "opt_state", ...)
      <dir>/<step>/metadata/metadata       JSON: data position, RNG state, metrics, ...
      <dir>/<step>/integrity/metadata      JSON: shape, dtype and checksum of every array

* A model export (`save_model`), self-describing:

      <dir>/params/...                     the parameters
      <dir>/model_config/metadata          the `ModelConfig` as JSON
      <dir>/integrity/metadata

Atomicity. Orbax writes a checkpoint into `<final>.orbax-checkpoint-tmp...`, writes
`commit_success.txt` once every item is complete, and only then renames the directory to
its final name (`AtomicRenameTemporaryPath.finalize` in orbax-checkpoint 0.12). Orbax's
step listing skips the temporary names, and we additionally require
`commit_success.txt`, so a crash at any point of a save leaves the previous checkpoint the
latest one; the next save of the same step removes the leftover.

Integrity. TensorStore reports a missing or truncated data file, but a flipped byte in
an OCDBT data file restores silently wrong (measured with orbax-checkpoint 0.12.8). Every
save therefore records, per array, a position-weighted 2 x 32-bit checksum of its bits,
computed on the devices that hold it (one reduction; no host copy; see checksums.py),
and every restore recomputes and compares it. A failed read or check raises
`CheckpointError` naming the directory, the item and the array.

Directories may be `gs://` URLs (evotrainer/paths.py): they reach Orbax unchanged (epath
and TensorStore's GCS driver); on GCS Orbax writes in place and commits with
`commit_success.txt` instead of a rename, which `all_steps` already requires.

Restores target abstract arrays that carry their shardings (`jax.ShapeDtypeStruct(shape,
dtype, sharding=...)`; see `abstract_params` and `with_shardings`), so each device reads
only its own shard and a large model is never materialized on the host.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any, Callable, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from evotrainer import paths
from evotrainer.checksums import array_checksums
from evotrainer.model.config import ModelConfig, RopeScaling
from evotrainer.sharding.multihost import is_multiprocess, is_primary
from evotrainer.sharding.rules import LEARNER_RULES, Rules

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

METADATA = "metadata"
INTEGRITY = "integrity"
MODEL_CONFIG = "model_config"
_RESERVED = (METADATA, INTEGRITY, MODEL_CONFIG)
# Bumped when the integrity record changes meaning; older records are then refused.
_FORMAT = 1
_COMMIT_FILE = "commit_success.txt"
# Config fields that change how a model computes, not what its parameters are: a saved
# model may be restored under different values. Everything else must match.
_COMPUTE_ONLY_FIELDS = ("dtype", "param_dtype", "remat")


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be restored as asked: absent, incomplete, corrupted, or of
  another structure than the target."""


class CorruptCheckpointError(CheckpointError):
  """A checkpoint whose files cannot be read or fail their checksums (not a structure
  mismatch: that one would be the same in every step)."""


# ------------------------------------------------------------------ pytrees


def _is_nnx(x) -> bool:
  return isinstance(x, (nnx.State, nnx.Variable))


def _to_pure(tree):
  """The tree with every `nnx.State` replaced by its nested dict of values (Orbax stores
  plain containers; the Variable wrappers and their metadata are code, not data)."""
  if isinstance(tree, nnx.State):
    return nnx.to_pure_dict(tree)
  if isinstance(tree, nnx.Variable):
    return tree.get_value()
  return jax.tree.map(lambda x: _to_pure(x) if _is_nnx(x) else x, tree, is_leaf=_is_nnx)


def _from_pure(template, pure):
  """Puts the restored `pure` tree back into the containers of `template` (which holds
  `nnx.State`s where `_to_pure` flattened them)."""
  leaves, treedef = jax.tree.flatten(template, is_leaf=_is_nnx)
  subtrees = treedef.flatten_up_to(pure)
  out = []
  for t, sub in zip(leaves, subtrees):
    if isinstance(t, nnx.State):
      state = jax.tree.map(lambda x: x, t)  # fresh Variables, same metadata
      nnx.replace_by_pure_dict(state, sub)
      out.append(state)
    elif isinstance(t, nnx.Variable):
      out.append(t.replace(sub))
    else:
      out.append(sub)
  return treedef.unflatten(out)


def _key_name(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def _leaf_paths(tree) -> list[tuple[str, Any]]:
  """(path, leaf) pairs; the path joins key names with "/" ("layers/0/attn/q")."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [("/".join(_key_name(k) for k in path) or "<root>", leaf) for path, leaf in flat]


def with_shardings(abstract_tree, shardings):
  """`jax.ShapeDtypeStruct`s of `abstract_tree` that carry `shardings`: a restore target.

  Args:
    abstract_tree: arrays or ShapeDtypeStructs (e.g. `nnx.state(nnx.eval_shape(...))` or
      `jax.eval_shape(tx.init, params)`); `nnx.State`s keep their Variables.
    shardings: a matching tree of `Sharding`s, or a prefix of it (as returned by
      `state_shardings` and `opt_state_shardings`); a single Sharding applies to all.
  """

  def one(sharding, subtree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                        subtree)

  return jax.tree.map(one, shardings, abstract_tree,
                      is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))


def abstract_params(config: ModelConfig, mesh: Optional[Mesh] = None,
                    rules: Rules = LEARNER_RULES) -> tuple[nnx.GraphDef, nnx.State]:
  """The graph and the abstract, sharded parameters of a `Transformer(config)`.

  Nothing is allocated. On `mesh` the shardings follow `rules`; without one every array
  goes to the first local device. `nnx.merge(graphdef, restored)` rebuilds the model.

  Returns:
    (graphdef, state) with `jax.ShapeDtypeStruct` values carrying shardings.
  """
  from evotrainer.model.transformer import Transformer  # avoid an import cycle
  from evotrainer.sharding.mesh import state_shardings

  graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
  if mesh is None:
    shardings = SingleDeviceSharding(jax.local_devices()[0])
  else:
    shardings = state_shardings(state, mesh, rules)
  return graphdef, with_shardings(state, shardings)


def _abstract(path: str, x) -> jax.ShapeDtypeStruct:
  if isinstance(x, jax.ShapeDtypeStruct):
    if x.sharding is None:
      raise ValueError(
          f"restore target {path} has no sharding; build targets with "
          "checkpoint.abstract_params / with_shardings, or pass concrete arrays")
    return x
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  if isinstance(x, np.ndarray):
    return x  # restored as a host array
  raise TypeError(f"restore target {path} is a {type(x).__name__}; expected a "
                  "jax.ShapeDtypeStruct with a sharding, a jax.Array or a numpy array")


# ------------------------------------------------------------------ integrity records


def _is_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic))

def _describe(trees: Mapping[str, Any]) -> dict:
  """{item: {path: {shape, dtype, checksum}}} for every array leaf of every item."""
  arrays = [(name, path, leaf) for name, tree in trees.items()
            for path, leaf in _leaf_paths(tree) if _is_array(leaf)]
  sums = array_checksums([leaf for _, _, leaf in arrays])
  out: dict = {name: {} for name in trees}
  for (name, path, leaf), sums in zip(arrays, sums):
    out[name][path] = {"shape": list(np.shape(leaf)), "dtype": str(leaf.dtype),
                       "checksum": sums}
  for name, tree in trees.items():
    for path, leaf in _leaf_paths(tree):
      if not _is_array(leaf):
        out[name][path] = {"value": _jsonable(leaf, f"{name}/{path}")}
  return out


def fingerprint(tree) -> str:
  """A sha256 of a pytree's structure, shapes, dtypes and contents (checksums computed
  where the arrays live: no host copy). Equal trees give equal strings."""
  record = _describe({"tree": _to_pure(tree)})
  return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ JSON


def _json_default(x):
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, (np.ndarray, jax.Array)):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      raise TypeError("a PRNG key: store checkpoint.key_to_json(key)")
    return np.asarray(x).tolist()
  raise TypeError(f"{type(x).__name__} is not JSON-serializable")


def _jsonable(value, what: str):
  """`value` as plain JSON types (numpy and small device arrays converted), or an error."""
  try:
    return json.loads(json.dumps(value, default=_json_default))
  except (TypeError, ValueError) as e:
    raise ValueError(f"{what} is not JSON-serializable: {e}") from None


def key_to_json(key: jax.Array) -> dict:
  """A typed PRNG key as JSON ({"impl": ..., "data": [ints]}) for checkpoint metadata."""
  return {"impl": str(jax.random.key_impl(key)),
          "data": np.asarray(jax.random.key_data(key)).tolist()}


def key_from_json(data: Mapping[str, Any]) -> jax.Array:
  """Inverse of `key_to_json`."""
  return jax.random.wrap_key_data(np.asarray(data["data"], np.uint32), impl=data["impl"])


def config_to_json(config: ModelConfig) -> dict:
  return dataclasses.asdict(config)


def config_from_json(data: Mapping[str, Any], where: str = "model config") -> ModelConfig:
  """A `ModelConfig` from `config_to_json` output; unknown or missing fields are errors."""
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(data) - fields)
  if unknown:
    raise CheckpointError(f"{where}: unknown ModelConfig fields {unknown}")
  data = dict(data)
  if data.get("rope_scaling") is not None:
    data["rope_scaling"] = RopeScaling(**data["rope_scaling"])
  try:
    return ModelConfig(**data)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: not a valid ModelConfig: {e}") from None


# ------------------------------------------------------------------ save / restore core


def _save_args(state: Mapping[str, Any], metadata: Optional[Mapping[str, Any]],
               json_items: Mapping[str, Any] = ()) -> ocp.args.Composite:
  if not state:
    raise ValueError("nothing to save: the state dict is empty")
  for name in state:
    if not isinstance(name, str) or not name.isidentifier() or name in _RESERVED:
      raise ValueError(f"state entry {name!r}: names must be identifiers other than "
                       f"{_RESERVED}")
  pure = {name: _to_pure(tree) for name, tree in state.items()}
  integrity = {"format": _FORMAT, "items": _describe(pure)}
  args = {name: ocp.args.StandardSave(tree) for name, tree in pure.items()}
  args[METADATA] = ocp.args.JsonSave(_jsonable(dict(metadata or {}), "checkpoint metadata"))
  args[INTEGRITY] = ocp.args.JsonSave(integrity)
  for name, value in dict(json_items).items():
    args[name] = ocp.args.JsonSave(value)
  return ocp.args.Composite(**args)


def _read_json(read: Callable[[ocp.args.Composite], Any], where: str, name: str) -> Any:
  try:
    return read(ocp.args.Composite(**{name: ocp.args.JsonRestore()}))[name]
  except Exception as e:  # Orbax raises KeyError, FileNotFoundError, ValueError, ...
    raise CorruptCheckpointError(f"{where}: cannot read its {name!r} record ({type(e).__name__}: "
                          f"{e}); incomplete, or not written by evotrainer.checkpoint") from e


def _restore_core(read: Callable[[ocp.args.Composite], Any], where: str,
                  target: Optional[Mapping[str, Any]]) -> tuple[dict, dict]:
  """Restores items (all, or those named by `target`) and checks every array's checksum.

  Args:
    read: `Composite` restore args -> restored `Composite` at the checkpoint location.
    where: the checkpoint directory, for messages.
    target: {item: abstract tree}, or None to restore everything as saved.
  """
  integrity = _read_json(read, where, INTEGRITY)
  if not isinstance(integrity, dict) or integrity.get("format") != _FORMAT:
    raise CheckpointError(f"{where}: integrity record of an unknown format "
                          f"{integrity.get('format') if isinstance(integrity, dict) else '?'}"
                          f" (expected {_FORMAT})")
  saved = integrity["items"]
  names = list(saved) if target is None else list(target)
  missing = [n for n in names if n not in saved]
  if missing:
    raise CheckpointError(f"{where}: no item(s) {missing}; it holds {sorted(saved)}")
  args, casts = {}, {}
  for name in names:
    if target is None:
      args[name] = ocp.args.StandardRestore()
    else:
      args[name], casts[name] = _restore_arg(where, name, target[name], saved[name])
  args[METADATA] = ocp.args.JsonRestore()
  try:
    restored = read(ocp.args.Composite(**args))
  except Exception as e:  # TensorStore / Orbax errors on missing or damaged files
    raise CorruptCheckpointError(f"{where}: cannot read items {names}: {type(e).__name__}: "
                          f"{str(e)[:2000]}") from e
  trees = {name: restored[name] for name in names}
  _verify(where, saved, trees)
  out = {}
  for name, tree in trees.items():
    tree = _cast(tree, casts.get(name, {}))
    out[name] = tree if target is None else _from_pure(target[name], tree)
  return out, restored[METADATA] or {}


def _restore_arg(where: str, name: str, target: Any, saved: Mapping) -> tuple:
  """(the StandardRestore of item `name` into `target`'s shapes, {path: dtype} of the
  arrays to cast once read): every array is read as it was written, so that its checksum
  applies; one whose dtype the target changes is cast afterwards."""
  pure = _to_pure(target)
  paths = _leaf_paths(pure)
  want = {p for p, _ in paths}
  extra, absent = sorted(want - set(saved)), sorted(set(saved) - want)
  if extra or absent:
    raise CheckpointError(f"{where}: item {name!r} does not match the target: arrays only "
                          f"in the target {extra[:5]}, only in the checkpoint {absent[:5]}")
  leaves, casts = [], {}
  for path, leaf in paths:
    rec = saved[path]
    if "value" in rec:
      leaves.append(leaf)
      continue
    a = _abstract(f"{name}/{path}", leaf)
    if list(a.shape) != rec["shape"]:
      raise CheckpointError(f"{where}: {name}/{path} has shape {tuple(rec['shape'])} in "
                            f"the checkpoint but {a.shape} in the target")
    if isinstance(a, jax.ShapeDtypeStruct) and str(a.dtype) != rec["dtype"]:
      casts[path] = a.dtype
      a = jax.ShapeDtypeStruct(a.shape, jnp.dtype(rec["dtype"]), sharding=a.sharding)
    leaves.append(a)
  tree = jax.tree.unflatten(jax.tree.structure(pure), leaves)
  return ocp.args.StandardRestore(tree), casts


def _verify(where: str, saved: Mapping, trees: Mapping) -> None:
  """Every array of `saved` (the integrity record's items) restored in `trees` with its
  value or checksum and dtype: a CorruptCheckpointError names the first that is not."""
  got = _describe(trees)
  for name in trees:
    for path, rec in saved[name].items():
      now = got[name].get(path)
      if now is None:
        raise CorruptCheckpointError(f"{where}: {name}/{path} was saved but not restored")
      if "value" in rec and now.get("value") != rec["value"]:
        raise CorruptCheckpointError(f"{where}: {name}/{path} was saved as {rec['value']!r} but "
                              f"reads {now.get('value')!r}")
      if "checksum" in rec and (now.get("checksum") != rec["checksum"]
                                or now.get("dtype") != rec["dtype"]):
        raise CorruptCheckpointError(
            f"{where}: {name}/{path} fails its checksum (saved {rec.get('checksum')} "
            f"{rec['dtype']}, read {now.get('checksum')} {now.get('dtype')}): the "
            "checkpoint's files are corrupted")


def _cast(tree: Any, casts: Mapping) -> Any:
  """`tree` with the arrays at `casts`' paths cast to their dtype, on device."""
  if not casts:
    return tree
  leaves = [leaf.astype(casts[p]) if p in casts else leaf for p, leaf in _leaf_paths(tree)]
  return jax.tree.unflatten(jax.tree.structure(tree), leaves)


# ------------------------------------------------------------------ training checkpoints


class Checkpoints:
  """Numbered checkpoints of a training run in one directory (an Orbax CheckpointManager).

  Usage:
    ckpts = Checkpoints(workdir / "checkpoints", max_to_keep=3)
    ckpts.save(step, {"params": params, "opt_state": opt_state},
               {"data_position": 1234, "rng": key_to_json(key), "metrics": {...}})
    ...
    step = ckpts.latest_step()                 # None when there is none
    state, meta = ckpts.restore(step, target={"params": abstract_params(...)[1], ...})

  Several processes may open the same directory; listing re-reads it every time.
  """

  def __init__(self, directory: PathLike, max_to_keep: Optional[int] = 3, *,
               async_save: bool = False):
    """Opens (and creates) `directory`.

    Args:
      directory: where step directories go.
      max_to_keep: keep the newest this many steps (None: all).
      async_save: `save` returns once arrays are copied off the devices and writes in
        the background; `wait()` (or the next save, or `close`) waits for it.
    """
    self.directory = paths.resolve(directory)  # a gs:// URL passes through to Orbax
    if max_to_keep is not None and max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
    self._async = async_save
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=async_save))

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(self, step: int, state: Mapping[str, Any],
           metadata: Optional[Mapping[str, Any]] = None) -> str:
    """Saves `state` ({name: pytree}) and JSON `metadata` as `step`; returns its path.

    A step appears to readers only once complete. Pytrees may hold `nnx.State`s.
    Raises ValueError if `step` already exists.
    """
    step = int(step)
    if step in self.all_steps():
      raise ValueError(f"step {step} is already saved in {self.directory}")
    args = _save_args(state, metadata)
    if not self._manager.save(step, args=args):
      on_disk = sorted(ocp.path.step.checkpoint_steps(self.directory))
      raise CheckpointError(
          f"Orbax declined to save step {step} in {self.directory}: it saves only steps "
          f"after the newest step directory ({on_disk[-1] if on_disk else None}); "
          f"incomplete ones {sorted(set(on_disk) - set(self.all_steps()))} can be removed")
    if not self._async:
      self._manager.wait_until_finished()
    return self._step_dir(step)

  def all_steps(self) -> list[int]:
    """Complete steps, ascending, as on disk now (written by any process)."""
    # Read from disk, not from the manager: `CheckpointManager.reload()` while a
    # background save is in flight corrupts the manager's own list (and its GC).
    steps = sorted(ocp.path.step.checkpoint_steps(self.directory))
    complete = [s for s in steps
                if paths.as_path(self._step_dir(s)).joinpath(_COMMIT_FILE).exists()]
    if len(complete) < len(steps):
      log.warning("%s: ignoring incomplete step directories %s (no %s)", self.directory,
                  sorted(set(steps) - set(complete)), _COMMIT_FILE)
    return complete

  def latest_step(self) -> Optional[int]:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def _resolve(self, step: Optional[int]) -> int:
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise CheckpointError(f"no complete checkpoint in {self.directory}")
      return steps[-1]
    if int(step) not in steps:
      raise CheckpointError(f"step {step} is not a complete checkpoint in "
                            f"{self.directory}; complete steps: {steps}")
    return int(step)

  def restore(self, step: Optional[int] = None,
              target: Optional[Mapping[str, Any]] = None) -> tuple[dict, dict]:
    """Restores a step (default: the latest) onto the target shardings.

    Args:
      step: the step; None for the latest complete one.
      target: {name: abstract tree} for the entries wanted (a subset is fine, e.g. only
        "params"). Leaves are `jax.ShapeDtypeStruct`s with shardings (`abstract_params`,
        `with_shardings`) or arrays whose shape and sharding are copied; a dtype unlike
        the saved one is cast after the checksum check. `nnx.State`s come back as
        `nnx.State`s. None restores every entry as saved (same device layout only).

    Returns:
      ({name: restored tree}, metadata dict).

    Raises:
      CheckpointError: no such step, structure mismatch, unreadable or corrupted files.
    """
    step = self._resolve(step)
    where = self._step_dir(step)
    return _restore_core(lambda args: self._manager.restore(step, args=args), where, target)

  def restore_latest_intact(self, target: Optional[Mapping[str, Any]] = None
                            ) -> tuple[int, dict, dict]:
    """(step, state, metadata) of the newest step that restores intact. Newer steps that
    are corrupted (`CorruptCheckpointError`) are moved, never deleted, to
    `<directory>.corrupt/<step>-<time>` with a warning, so training resumes from the
    intact one and can save those steps again. Raises CheckpointError when no step is
    intact (nothing is moved then) or for a structure mismatch."""
    steps, bad = self.all_steps(), []
    if not steps:
      raise CheckpointError(f"no complete checkpoint in {self.directory}")
    for step in reversed(steps):
      try:
        state, meta = self.restore(step, target)
      except CorruptCheckpointError as e:
        bad.append((step, str(e).splitlines()[0][:300]))
        continue
      aside = self.directory + ".corrupt"
      for b, why in bad:
        dst = os.path.join(aside, f"{b}-{int(time.time())}")
        if is_primary():  # one mover: the processes of a run share the directory
          paths.makedirs(aside)
          paths.as_path(self._step_dir(b)).rename(dst)
        log.warning("checkpoint step %d is corrupted (%s); moved to %s; resuming from "
                    "step %d", b, why, dst, step)
        print(f"[checkpoint] WARNING: step {b} in {self.directory} is corrupted; moved to "
              f"{dst}; resuming from the intact step {step}", flush=True)
      if bad:
        if is_multiprocess():  # the others reload once process 0 has moved the steps
          from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
          multihost_utils.sync_global_devices("corrupted checkpoint steps moved aside")
        self._manager.reload()
      return step, state, meta
    raise CheckpointError(
        f"no intact checkpoint in {self.directory}: " +
        "; ".join(f"step {b}: {why}" for b, why in bad) +
        "; remove the directory to start over, or restore it from a copy")

  def metadata(self, step: Optional[int] = None) -> dict:
    """The JSON metadata of a step (default: the latest) without reading any array."""
    step = self._resolve(step)
    return _read_json(lambda args: self._manager.restore(step, args=args),
                      self._step_dir(step), METADATA) or {}

  def wait(self) -> None:
    """Blocks until a background save has finished."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpoints:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def save(directory: PathLike, step: int, params_state, opt_state=None,
         extra: Optional[Mapping[str, Any]] = None) -> str:
  """Saves one training step (params, optionally opt state, JSON `extra`) under
  `directory/<step>`, keeping every earlier step. Returns the step's path."""
  state = {"params": params_state}
  if opt_state is not None:
    state["opt_state"] = opt_state
  with Checkpoints(directory, max_to_keep=None) as ckpts:
    return ckpts.save(step, state, extra)


def restore(directory: PathLike, target: Optional[Mapping[str, Any]] = None,
            step: Optional[int] = None) -> tuple[dict, dict]:
  """`Checkpoints(directory).restore(step, target)` for a one-off read."""
  with Checkpoints(directory, max_to_keep=None) as ckpts:
    return ckpts.restore(step, target)


# ------------------------------------------------------------------ model exports


def _checkpointer() -> ocp.Checkpointer:
  return ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def save_model(directory: PathLike, model, *, overwrite: bool = False,
               metadata: Optional[Mapping[str, Any]] = None) -> str:
  """Writes `model`'s parameters and its `ModelConfig` (JSON) to `directory`, atomically.

  Args:
    directory: must not exist unless `overwrite`.
    model: a `Transformer` (any layout; every process of a multi-host run calls this).
    overwrite: replace an existing export.
    metadata: optional JSON kept with it (e.g. how the model was trained).

  Returns:
    The absolute path.
  """
  path = paths.resolve(directory)
  if paths.as_path(path).exists() and not overwrite:
    raise FileExistsError(f"{path} already exists (save_model(..., overwrite=True) "
                          "replaces it)")
  args = _save_args({"params": nnx.state(model, nnx.Param)}, metadata,
                    {MODEL_CONFIG: config_to_json(model.config)})
  paths.makedirs(os.path.dirname(path))
  _checkpointer().save(path, args=args, force=overwrite)
  return path


def _model_reader(directory: PathLike) -> tuple[str, Callable]:
  path = paths.resolve(directory)
  if not paths.as_path(path).is_dir():
    raise CheckpointError(f"no model checkpoint at {path}")
  if not paths.as_path(path).joinpath(_COMMIT_FILE).exists():
    raise CheckpointError(f"{path} is an incomplete model checkpoint (no {_COMMIT_FILE})")
  checkpointer = _checkpointer()
  return path, lambda args: checkpointer.restore(path, args=args)


def read_model_config(directory: PathLike) -> ModelConfig:
  """The `ModelConfig` stored by `save_model`."""
  path, read = _model_reader(directory)
  return config_from_json(_read_json(read, path, MODEL_CONFIG), f"{path}/{MODEL_CONFIG}")


def read_model_metadata(directory: PathLike) -> dict:
  """The JSON metadata stored by `save_model`."""
  path, read = _model_reader(directory)
  return _read_json(read, path, METADATA) or {}


def _merge_config(given: Optional[ModelConfig], saved: ModelConfig, where: str) -> ModelConfig:
  if given is None:
    return saved
  differ = [f.name for f in dataclasses.fields(ModelConfig)
            if f.name not in _COMPUTE_ONLY_FIELDS
            and getattr(given, f.name) != getattr(saved, f.name)]
  if differ:
    raise CheckpointError(
        f"{where} holds a different model: " + ", ".join(
            f"{n}={getattr(saved, n)!r} (asked {getattr(given, n)!r})" for n in differ))
  return given


def restore_model(directory: PathLike, config: Optional[ModelConfig] = None,
                  mesh: Optional[Mesh] = None, rules: Rules = LEARNER_RULES):
  """Rebuilds the `Transformer` saved by `save_model`, each shard read onto its device.

  Args:
    directory: the export.
    config: expected config (None: the stored one). Fields other than `dtype`,
      `param_dtype` and `remat` must equal the stored ones; a different `param_dtype`
      is cast after the checksum check.
    mesh, rules: where the parameters go (None: the first local device).

  Returns:
    The model.
  """
  path, read = _model_reader(directory)
  saved = config_from_json(_read_json(read, path, MODEL_CONFIG), f"{path}/{MODEL_CONFIG}")
  config = _merge_config(config, saved, path)
  graphdef, target = abstract_params(config, mesh, rules)
  restored, _ = _restore_core(read, path, {"params": target})
  return nnx.merge(graphdef, restored["params"])


def restore_params_into(directory: PathLike, model) -> None:
  """Loads the parameters saved by `save_model` into `model` in place, keeping the
  shardings its parameters have now. The stored config must match `model.config`."""
  path, read = _model_reader(directory)
  saved = config_from_json(_read_json(read, path, MODEL_CONFIG), f"{path}/{MODEL_CONFIG}")
  _merge_config(model.config, saved, path)
  state = nnx.state(model, nnx.Param)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state)
  restored, _ = _restore_core(read, path, {"params": target})
  nnx.update(model, restored["params"])
