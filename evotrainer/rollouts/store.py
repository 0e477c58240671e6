"""Rollout store: every episode of every step, as Parquet, for backtests, replay and reports.

Layout. One file per (version, step, split):

    <root>/<version>/<split>/step-<step:08d>.parquet     published steps
    <root>/<version>/<split>/.step-<...>.parquet.<id>.tmp  a write in progress (or a crash's
                                                          leftover; readers ignore it)
    <root>/_quarantine/<version>/<split>/step-<...>.parquet[.N]   unreadable files, moved
    <root>/_quarantine/.../step-<...>.parquet[.N].reason.json     ... and why

Atomicity (DESIGN.md section 7: nothing is lost on a crash). A step is written to a
temporary name in its final directory, fsynced, then published with `os.link(tmp, final)`
(which fails if `final` exists, so two writers can never replace each other's file), the
temporary name is removed and the directory fsynced. A reader therefore sees a step
either complete or not at all. Without hard links (some network file systems) the store
falls back to an existence check + `os.replace`.

Never overwritten. Writing a (version, step, split) that already exists raises
`RolloutExistsError`; there is no overwrite switch. A resumed run that may redo a step
calls `exists()` first and skips (or writes under a new version) when the step is there.
A step whose file was quarantined no longer `exists()` and may be written again.

Schema (`SCHEMA`): one column per `Episode` field plus two optional per-row columns the
harness produced, `advantage` (float64; float32 advantages are stored exactly) and `kept`
(bool; False = cut by a filter). Choices that make the round trip exact and replay fast:

  reward_parts    map<string, double>: keys in the dict's order, values as float64 (a bool
                  or int part reads back as a float that compares equal; None stays None).
                  A map rather than JSON so a replay pulls one part for a whole step
                  without parsing text: `read_columns` flattens it into one float64 column
                  per part name.
  info            JSON text (varied and nested). Numpy scalars / arrays are written as
                  numbers / lists; tuples read back as lists, non-string keys as strings.
                  Anything else is refused at write time, naming the episode.
  completion_ids  list<int32>; None is stored as null (distinct from an empty array);
                  integer arrays of other dtypes are range-checked and cast.
  logprobs        list<float32> (what the sampler produces; float64 input is rounded).

Per-step data sits in the file's key-value metadata (so `step_metadata` reads only the
footer): `evotrainer.harness_state` and `evotrainer.meta` (JSON written by the caller),
and `evotrainer.key` (version, step, split, episode count, write time, format).

Corruption. Files are written with Parquet page checksums and read with verification;
the footer's `evotrainer.*` values carry a sha256 (`evotrainer.sha256`). A file that
cannot be read completely (truncated by a crash of something other than this writer,
garbage bytes, a flipped byte, a wrong schema, a row count that disagrees with the
footer) is never silently read and never deleted: it is moved to `<root>/_quarantine/`
with a `.reason.json` next to it, a warning is logged, and a `QuarantinedFile` is appended
to `store.problems`. Bulk reads (`read`, `read_table`, `read_columns`) then continue with
the other files; single-step calls (`read_step`, `step_metadata`) raise
`CorruptRolloutError`.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import hashlib
import itertools
import json
import logging
import os
import pathlib
import re
import uuid
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.types import Episode

FORMAT = 1
QUARANTINE = "_quarantine"
_KEY = b"evotrainer.key"
_HARNESS_STATE = b"evotrainer.harness_state"
_META = b"evotrainer.meta"
_FOOTER_SHA = b"evotrainer.sha256"  # of the three values above: the footer has no CRC
_STEP_FILE = re.compile(r"^step-(-?\d+)\.parquet$")
# zstd: on bench/rollout_store.py's store 16% smaller than snappy / lz4 for ~10% more
# write time; page CRCs let a reader detect a damaged data page.
_WRITE_OPTIONS = dict(compression="zstd", write_page_checksum=True)

SCHEMA = pa.schema([
    ("episode_id", pa.string()),
    ("group_id", pa.int64()),
    ("task_id", pa.string()),
    ("prompt", pa.string()),
    ("completion", pa.string()),
    ("answer", pa.string()),
    ("reward_parts", pa.map_(pa.string(), pa.float64())),
    ("reward", pa.float64()),
    ("parsed_answer", pa.string()),
    ("info", pa.string()),  # JSON text
    ("version", pa.string()),
    ("step", pa.int64()),
    ("split", pa.string()),
    ("completion_ids", pa.list_(pa.int32())),  # [N_i] per row
    ("logprobs", pa.list_(pa.float32())),  # [N_i] per row
    ("truncated", pa.bool_()),
    ("advantage", pa.float64()),  # harness output, null when not recorded
    ("kept", pa.bool_()),  # harness output, null when not recorded
])
_STRINGS = ("episode_id", "task_id", "prompt", "completion", "answer", "version", "split")
_EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(Episode))
assert set(_EPISODE_FIELDS) <= set(SCHEMA.names), "every Episode field needs a column"

logger = logging.getLogger(__name__)


class RolloutStoreError(Exception):
  """Base class of the store's errors."""


class RolloutExistsError(RolloutStoreError, FileExistsError):
  """The (version, step, split) is already stored; stored data is never overwritten."""


class CorruptRolloutError(RolloutStoreError):
  """A stored step could not be read; it has been quarantined (see `store.problems`)."""


@dataclasses.dataclass(frozen=True)
class QuarantinedFile:
  """A file the store refused to read: where it was, where it is now, and why."""

  path: str  # where it was found
  moved_to: str  # where it lies now, under <root>/_quarantine/
  reason: str


@dataclasses.dataclass(frozen=True)
class StepMetadata:
  """What a step's file footer says about it."""

  version: str
  step: int
  split: str
  num_episodes: int
  written_at: str  # ISO 8601, UTC
  harness_state: Any  # the JSON value passed to `write`, or None
  meta: Any  # the JSON value passed to `write`, or None
  path: str


@dataclasses.dataclass
class StoredStep:
  """One stored step read back whole."""

  metadata: StepMetadata
  episodes: list[Episode]
  advantages: Optional[np.ndarray]  # [B] float64, None when not recorded
  kept: Optional[np.ndarray]  # [B] bool, None when not recorded


# ----------------------------------------------------------------------------- encoding


def _json_default(x: Any) -> Any:
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f"{type(x).__name__} is not JSON-serializable")


def _to_json(value: Any, what: str) -> str:
  try:
    return json.dumps(value, default=_json_default, ensure_ascii=False)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{what} must be JSON-serializable (str keys; numbers, strings, lists, "
                    f"dicts, numpy scalars/arrays): {e}") from None


def _column(episodes: Sequence[Episode], name: str, values: list, typ: pa.DataType) -> pa.Array:
  try:
    return pa.array(values, typ)
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
    for ep, v in zip(episodes, values):  # find the row to name it
      try:
        pa.array([v], typ)
      except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        raise TypeError(f"episode {ep.episode_id!r}: {name}={v!r} cannot be stored as "
                        f"{typ}") from None
    raise TypeError(f"column {name}: {e}") from None


def _ragged(episodes: Sequence[Episode], name: str, kind: str,
            dtype: np.dtype) -> tuple[pa.Array, np.ndarray]:
  """A list column from per-episode 1-D arrays (None → null). Returns (array, lengths)."""
  parts, lengths, nulls = [], np.zeros(len(episodes), np.int64), np.zeros(len(episodes), bool)
  for i, ep in enumerate(episodes):
    x = getattr(ep, name)
    if x is None:
      nulls[i] = True
      continue
    x = np.asarray(x)
    if x.ndim != 1 or (x.size and x.dtype.kind not in kind):
      raise TypeError(f"episode {ep.episode_id!r}: {name} must be a 1-D array of kind "
                      f"{kind!r}; got shape {x.shape} dtype {x.dtype}")
    parts.append(x)
    lengths[i] = x.size
  if lengths.sum() > np.iinfo(np.int32).max:
    raise ValueError(f"{name}: over 2**31 - 1 values in one step; store it as several steps")
  flat = np.concatenate(parts) if parts else np.zeros(0, dtype)
  if flat.dtype != dtype and flat.size and dtype.kind == "i":
    info = np.iinfo(dtype)
    if flat.min() < info.min or flat.max() > info.max:
      raise ValueError(f"{name}: token ids outside the {dtype} range")
  flat = flat.astype(dtype, copy=False)
  offsets = np.zeros(len(episodes) + 1, np.int32)
  np.cumsum(lengths, out=offsets[1:])
  arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat),
                                 type=pa.list_(pa.from_numpy_dtype(dtype)),
                                 mask=pa.array(nulls) if nulls.any() else None)
  return arr, lengths


def episodes_to_table(episodes: Sequence[Episode], advantages: Optional[np.ndarray] = None,
                      kept: Optional[np.ndarray] = None) -> pa.Table:
  """Episodes (+ optional per-row advantage [B] and kept [B]) → an Arrow table of `SCHEMA`."""
  n = len(episodes)
  ids = [e.episode_id for e in episodes]
  if len(set(ids)) != n:
    dup = next(i for i in ids if ids.count(i) > 1)
    raise ValueError(f"episode_id {dup!r} occurs more than once in one step")
  cols: dict[str, pa.Array] = {}
  for name in _STRINGS:
    cols[name] = _column(episodes, name, [getattr(e, name) for e in episodes], pa.string())
  cols["parsed_answer"] = _column(episodes, "parsed_answer",
                                  [e.parsed_answer for e in episodes], pa.string())
  cols["group_id"] = _column(episodes, "group_id", [e.group_id for e in episodes], pa.int64())
  cols["step"] = _column(episodes, "step", [e.step for e in episodes], pa.int64())
  cols["reward"] = _column(episodes, "reward", [e.reward for e in episodes], pa.float64())
  cols["truncated"] = _column(episodes, "truncated", [e.truncated for e in episodes],
                              pa.bool_())

  keys, vals, offsets = [], [], np.zeros(n + 1, np.int32)
  for i, e in enumerate(episodes):
    if not isinstance(e.reward_parts, dict):
      raise TypeError(f"episode {e.episode_id!r}: reward_parts must be a dict, got "
                      f"{type(e.reward_parts).__name__}")
    keys.extend(e.reward_parts.keys())
    vals.extend(e.reward_parts.values())
    offsets[i + 1] = len(keys)
  try:
    cols["reward_parts"] = pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                                   pa.array(vals, pa.float64()))
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
    raise TypeError(f"reward_parts must map str to float: {e}") from None

  cols["info"] = pa.array(
      [None if e.info is None else "{}" if isinstance(e.info, dict) and not e.info else
       _to_json(e.info, f"episode {e.episode_id!r}: info") for e in episodes], pa.string())

  cols["completion_ids"], n_ids = _ragged(episodes, "completion_ids", "iu", np.dtype(np.int32))
  cols["logprobs"], n_lp = _ragged(episodes, "logprobs", "f", np.dtype(np.float32))
  both = np.array([e.completion_ids is not None and e.logprobs is not None for e in episodes],
                  bool)
  bad = np.flatnonzero(both & (n_ids != n_lp))
  if bad.size:
    e = episodes[bad[0]]
    raise ValueError(f"episode {e.episode_id!r}: {n_ids[bad[0]]} completion_ids but "
                     f"{n_lp[bad[0]]} logprobs")

  for name, x, typ in (("advantage", advantages, pa.float64()), ("kept", kept, pa.bool_())):
    if x is None:
      cols[name] = pa.nulls(n, typ)
      continue
    x = np.asarray(x)
    if x.shape != (n,):
      raise ValueError(f"{name}s must have shape [{n}] (one per episode); got {x.shape}")
    if name == "kept" and x.dtype != bool:
      raise TypeError(f"kept must be a bool array; got {x.dtype}")
    cols[name] = pa.array(x.astype(np.float64) if name == "advantage" else x, typ)
  return pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)


# ----------------------------------------------------------------------------- decoding


def _single(table: pa.Table, name: str) -> pa.Array:
  col = table.column(name)
  if col.num_chunks == 0:
    return pa.array([], col.type)
  return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)


def _ragged_numpy(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A list column → (offsets [B+1] into values, values (private, writable copy), null mask)."""
  offsets = arr.offsets.to_numpy()
  values = np.array(arr.values.to_numpy(zero_copy_only=False))
  return offsets, values, np.asarray(arr.is_null().to_numpy(zero_copy_only=False))


def table_to_episodes(table: pa.Table) -> list[Episode]:
  """The inverse of `episodes_to_table` (episodes only; see `StoredStep` for the rest)."""
  n = table.num_rows
  if n == 0:
    return []
  py = {name: _single(table, name).to_pylist()
        for name in (*_STRINGS, "parsed_answer", "group_id", "step", "reward", "truncated",
                     "info")}
  parts = _single(table, "reward_parts")
  p_off = parts.offsets.to_numpy()
  p_keys, p_vals = parts.keys.to_pylist(), parts.items.to_pylist()
  i_off, i_val, i_null = _ragged_numpy(_single(table, "completion_ids"))
  l_off, l_val, l_null = _ragged_numpy(_single(table, "logprobs"))
  out = []
  for r in range(n):
    a, b = p_off[r], p_off[r + 1]
    info = py["info"][r]
    out.append(Episode(
        episode_id=py["episode_id"][r], group_id=py["group_id"][r], task_id=py["task_id"][r],
        prompt=py["prompt"][r], completion=py["completion"][r], answer=py["answer"][r],
        reward_parts=dict(zip(p_keys[a:b], p_vals[a:b])), reward=py["reward"][r],
        parsed_answer=py["parsed_answer"][r],
        info=None if info is None else {} if info == "{}" else json.loads(info),
        version=py["version"][r], step=py["step"][r], split=py["split"][r],
        completion_ids=None if i_null[r] else i_val[i_off[r]:i_off[r + 1]],
        logprobs=None if l_null[r] else l_val[l_off[r]:l_off[r + 1]],
        truncated=py["truncated"][r]))
  return out


def _padded(arr: pa.Array, width: int, dtype: np.dtype) -> np.ndarray:
  """A list column → [B, width] right-padded with zeros (null rows are all zeros)."""
  offsets, values, _ = _ragged_numpy(arr)
  lengths = np.diff(offsets)
  out = np.zeros((len(lengths), width), dtype)
  rows = np.repeat(np.arange(len(lengths)), lengths)
  cols = np.arange(lengths.sum()) - np.repeat(offsets[:-1] - offsets[0], lengths)
  out[rows, cols] = values[offsets[0]:offsets[-1]]
  return out


def table_to_columns(table: pa.Table) -> dict[str, np.ndarray]:
  """Columns for vectorized replay: no per-row Python objects except the text columns.

  Returns:
    the `Episode` text fields as object arrays [B] (`info` as JSON text), `group_id`,
    `step` int64 [B], `reward` float64 [B], `truncated` bool [B], `length` int32 [B]
    (completion tokens, 0 when None), `completion_ids` int32 [B, N] and `logprobs`
    float32 [B, N] right-padded with 0, `advantage` float64 [B] (NaN where not recorded),
    `kept` int8 [B] (1 kept, 0 cut, -1 not recorded), and `reward_parts/<name>` float64 [B]
    for every part name seen (NaN where a row lacks the part).
  """
  cols: dict[str, np.ndarray] = {}
  for name in (*_STRINGS, "parsed_answer", "info"):
    cols[name] = np.asarray(_single(table, name).to_pylist() if table.num_rows else [],
                            dtype=object)
  for name, dtype in (("group_id", np.int64), ("step", np.int64), ("reward", np.float64),
                      ("truncated", bool)):
    cols[name] = np.asarray(_single(table, name).to_numpy(zero_copy_only=False), dtype)
  adv = _single(table, "advantage").fill_null(np.nan)
  cols["advantage"] = np.asarray(adv.to_numpy(zero_copy_only=False), np.float64)
  kept = _single(table, "kept").cast(pa.int8()).fill_null(-1)
  cols["kept"] = np.asarray(kept.to_numpy(zero_copy_only=False), np.int8)
  ids, lps = _single(table, "completion_ids"), _single(table, "logprobs")
  lengths = np.diff(ids.offsets.to_numpy()).astype(np.int32)
  width = int(max(lengths.max(initial=0), np.diff(lps.offsets.to_numpy()).max(initial=0)))
  cols["length"] = lengths
  cols["completion_ids"] = _padded(ids, width, np.int32)
  cols["logprobs"] = _padded(lps, width, np.float32)
  parts = _single(table, "reward_parts")
  p_off = parts.offsets.to_numpy()
  rows = np.repeat(np.arange(table.num_rows), np.diff(p_off))
  keys = parts.keys.slice(p_off[0], p_off[-1] - p_off[0]).dictionary_encode()
  vals = np.asarray(parts.items.slice(p_off[0], p_off[-1] - p_off[0]).fill_null(np.nan)
                    .to_numpy(zero_copy_only=False), np.float64)
  codes = keys.indices.to_numpy(zero_copy_only=False)
  for k, name in enumerate(keys.dictionary.to_pylist()):
    col = np.full(table.num_rows, np.nan)
    sel = codes == k
    col[rows[sel]] = vals[sel]
    cols[f"reward_parts/{name}"] = col
  return cols


# ----------------------------------------------------------------------------- the store


def _check_name(what: str, name: str) -> None:
  if (not isinstance(name, str) or not name or name in (".", "..") or name[0] in "._"
      or "/" in name or os.sep in name or "\0" in name):
    raise ValueError(f"{what}={name!r}: expected a non-empty name without '/', not "
                     f"starting with '.' or '_'")


def _check_step(step: int) -> int:
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
    raise TypeError(f"step={step!r}: expected an int")
  return int(step)


def _footer_sha(kv: dict) -> str:
  h = hashlib.sha256()
  for k in (_KEY, _HARNESS_STATE, _META):
    v = kv.get(k, b"")
    h.update(len(v).to_bytes(8, "little") + v)
  return h.hexdigest()


def _fsync_dir(path: pathlib.Path) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


class RolloutStore:
  """Reads and writes rollouts under `root` (see the module docstring for the layout)."""

  def __init__(self, root: str | os.PathLike):
    self.root = pathlib.Path(root)
    self.problems: list[QuarantinedFile] = []  # files quarantined by this instance

  # --- paths and listings

  def path(self, version: str, step: int, split: str) -> pathlib.Path:
    _check_name("version", version)
    _check_name("split", split)
    return self.root / version / split / f"step-{_check_step(step):08d}.parquet"

  def exists(self, version: str, step: int, split: str) -> bool:
    """Whether the step is published (its content is checked only when read)."""
    return self.path(version, step, split).is_file()

  def versions(self) -> list[str]:
    """Stored version names, sorted."""
    if not self.root.is_dir():
      return []
    return sorted(p.name for p in self.root.iterdir() if p.is_dir() and p.name[0] not in "._")

  def splits(self, version: str) -> list[str]:
    """Splits stored for `version`, sorted."""
    _check_name("version", version)
    d = self.root / version
    return sorted(p.name for p in d.iterdir() if p.is_dir() and p.name[0] not in "._") \
        if d.is_dir() else []

  def steps(self, version: str, split: str) -> list[int]:
    """Published steps of (version, split), ascending; temporary files are not steps."""
    _check_name("version", version)
    _check_name("split", split)
    d = self.root / version / split
    if not d.is_dir():
      return []
    return sorted(int(m.group(1)) for m in map(_STEP_FILE.match, os.listdir(d)) if m)

  def _keys(self, version: Optional[str], step: Optional[int],
            split: Optional[str]) -> Iterator[tuple[str, int, str]]:
    """Stored keys matching the filter, ordered by version, then step, then split."""
    for v in ([version] if version is not None else self.versions()):
      keys = [(s, sp) for sp in ([split] if split is not None else self.splits(v))
              for s in self.steps(v, sp) if step is None or s == step]
      for s, sp in sorted(keys):
        yield v, s, sp

  # --- writing

  def write(self, version: str, step: int, split: str, episodes: Sequence[Episode], *,
            advantages: Optional[np.ndarray] = None, kept: Optional[np.ndarray] = None,
            harness_state: Any = None, meta: Any = None) -> pathlib.Path:
    """Stores one step atomically; refuses to replace a stored step.

    Args:
      version, step, split: the file's key (each episode keeps its own fields as well).
      episodes: [B] episodes, in batch order.
      advantages: [B] per-row advantages the harness produced (optional).
      kept: [B] bool, False for rows a filter cut (optional).
      harness_state: JSON-serializable harness state after this step (EMA thresholds, ...).
      meta: any other JSON-serializable per-step record.

    Returns:
      The published path.

    Raises:
      RolloutExistsError: the step is already stored (call `exists()` first on resume).
      TypeError / ValueError: an episode or argument cannot be stored; names the episode.
    """
    final = self.path(version, step, split)
    if final.exists():
      raise RolloutExistsError(f"rollouts for version={version!r} step={step} "
                               f"split={split!r} are already stored at {final}; stored "
                               f"data is never overwritten")
    table = episodes_to_table(episodes, advantages, kept)
    key = {"version": version, "step": int(step), "split": split, "num_episodes": len(episodes),
           "format": FORMAT,
           "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    kv = {_KEY: json.dumps(key).encode(),
          _HARNESS_STATE: _to_json(harness_state, "harness_state").encode(),
          _META: _to_json(meta, "meta").encode()}
    kv[_FOOTER_SHA] = _footer_sha(kv).encode()
    table = table.replace_schema_metadata(kv)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
      pq.write_table(table, tmp, row_group_size=max(len(episodes), 1), **_WRITE_OPTIONS)
      fd = os.open(tmp, os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
      try:
        os.link(tmp, final)  # atomic, and fails instead of replacing
      except FileExistsError:
        raise RolloutExistsError(f"{final} appeared while writing it (another writer); "
                                 f"stored data is never overwritten") from None
      except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                           errno.EMLINK):
          raise
        if final.exists():  # no hard links here: check, then rename
          raise RolloutExistsError(f"{final} is already stored") from None
        os.replace(tmp, final)
    finally:
      tmp.unlink(missing_ok=True)
    for d in (final.parent, final.parent.parent, self.root):  # the new names are durable
      _fsync_dir(d)
    return final

  # --- reading

  def _quarantine(self, path: pathlib.Path, reason: str) -> Optional[QuarantinedFile]:
    """Moves `path` under `<root>/_quarantine/` (never replacing anything there)."""
    qdir = self.root / QUARANTINE / path.relative_to(self.root).parent
    qdir.mkdir(parents=True, exist_ok=True)
    for i in itertools.count():
      dst = qdir / (path.name if i == 0 else f"{path.name}.{i}")
      try:
        os.link(path, dst)
      except FileExistsError:
        continue
      except FileNotFoundError:
        return None  # another reader moved it already
      except OSError:
        if dst.exists():
          continue
        os.rename(path, dst)
        break
      try:
        os.unlink(path)
      except FileNotFoundError:  # another reader quarantined it meanwhile: drop our link
        dst.unlink()
        return None
      break
    record = {"original_path": str(path), "reason": reason, "size_bytes": dst.stat().st_size,
              "quarantined_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    reason_path = dst.with_name(dst.name + ".reason.json")
    reason_path.write_text(json.dumps(record, indent=2) + "\n")
    for d in (qdir, path.parent):
      _fsync_dir(d)
    problem = QuarantinedFile(str(path), str(dst), reason)
    self.problems.append(problem)
    logger.warning("rollout store: %s is unreadable (%s); moved to %s", path, reason, dst)
    return problem

  def _load(self, path: pathlib.Path, footer_only: bool = False,
            ) -> Optional[tuple[Optional[pa.Table], StepMetadata]]:
    """Reads and checks one file; None if it vanished or was quarantined."""
    try:  # a full read takes the bytes at once; the footer alone needs only a seek
      source = str(path) if footer_only else pa.BufferReader(path.read_bytes())
    except FileNotFoundError:
      return None
    try:
      pf = pq.ParquetFile(source, page_checksum_verification=True)
      kv = pf.schema_arrow.metadata or {}
      if _KEY not in kv:
        raise ValueError("no evotrainer.key in the file metadata (not a rollout file)")
      if kv.get(_FOOTER_SHA) != _footer_sha(kv).encode():
        raise ValueError("the footer's evotrainer.* metadata fails its sha256 check")
      key = json.loads(kv[_KEY])
      md = StepMetadata(version=key["version"], step=int(key["step"]), split=key["split"],
                        num_episodes=int(key["num_episodes"]), written_at=key["written_at"],
                        harness_state=json.loads(kv[_HARNESS_STATE]),
                        meta=json.loads(kv[_META]), path=str(path))
      for field in SCHEMA:
        idx = pf.schema_arrow.get_field_index(field.name)
        if idx < 0 or pf.schema_arrow.field(idx).type != field.type:
          got = "missing" if idx < 0 else pf.schema_arrow.field(idx).type
          raise ValueError(f"column {field.name} is {got}; expected {field.type}")
      if pf.metadata.num_rows != md.num_episodes:
        raise ValueError(f"{pf.metadata.num_rows} rows but the footer records "
                         f"{md.num_episodes} episodes")
      table = None
      if not footer_only:
        table = pf.read(columns=SCHEMA.names).replace_schema_metadata(None)
        if table.num_rows != md.num_episodes:
          raise ValueError(f"read {table.num_rows} rows; expected {md.num_episodes}")
        table.validate(full=True)
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError,
            UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
      self._quarantine(path, f"{type(e).__name__}: {e}")
      return None
    return table, md

  def _load_step(self, version: str, step: int, split: str, footer_only: bool = False,
                 ) -> tuple[Optional[pa.Table], StepMetadata]:
    path = self.path(version, step, split)
    if not path.is_file():
      raise FileNotFoundError(f"no rollouts stored for version={version!r} step={step} "
                              f"split={split!r} ({path})")
    n = len(self.problems)
    loaded = self._load(path, footer_only)
    if loaded is None:
      why = self.problems[-1].reason if len(self.problems) > n else "quarantined meanwhile"
      raise CorruptRolloutError(f"{path} is unreadable and was quarantined: {why}")
    return loaded

  def step_metadata(self, version: str, step: int, split: str) -> StepMetadata:
    """The step's footer record (harness_state, meta, counts) without reading its rows.

    Raises:
      FileNotFoundError: the step is not stored.
      CorruptRolloutError: the footer is unreadable; the file has been quarantined.
    """
    return self._load_step(version, step, split, footer_only=True)[1]

  def read_step(self, version: str, step: int, split: str) -> StoredStep:
    """One step whole: episodes, stored advantages / kept, and its metadata.

    Raises:
      FileNotFoundError: the step is not stored.
      CorruptRolloutError: the file is unreadable; it has been quarantined.
    """
    table, md = self._load_step(version, step, split)
    adv, kept = _single(table, "advantage"), _single(table, "kept")
    return StoredStep(
        metadata=md, episodes=table_to_episodes(table),
        advantages=None if adv.null_count == len(adv) else
        np.asarray(adv.to_numpy(zero_copy_only=False), np.float64),
        kept=None if kept.null_count == len(kept) else
        np.asarray(kept.to_numpy(zero_copy_only=False), bool))

  def _tables(self, version, step, split) -> Iterator[pa.Table]:
    for v, s, sp in self._keys(version, step, split):
      loaded = self._load(self.path(v, s, sp))
      if loaded is not None:
        yield loaded[0]

  def read(self, version: Optional[str] = None, step: Optional[int] = None,
           split: Optional[str] = None) -> list[Episode]:
    """Episodes of every stored step matching the filter (None = any), in key order.

    Unreadable files are quarantined and skipped (see `problems`).
    """
    return [e for t in self._tables(version, step, split) for e in table_to_episodes(t)]

  def read_table(self, version: Optional[str] = None, step: Optional[int] = None,
                 split: Optional[str] = None) -> pa.Table:
    """Like `read`, as one Arrow table of `SCHEMA` (zero rows when nothing matches)."""
    tables = list(self._tables(version, step, split))
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()

  def read_columns(self, version: Optional[str] = None, step: Optional[int] = None,
                   split: Optional[str] = None) -> dict[str, np.ndarray]:
    """Like `read`, as numpy columns for vectorized replay (see `table_to_columns`)."""
    return table_to_columns(self.read_table(version, step, split))
