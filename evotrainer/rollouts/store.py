"""Rollout store: every episode of every step, as Parquet, for backtests, replay and reports.

Layout. One file per (version, step, split):

    <root>/<version>/<split>/step-<step:08d>.parquet     published steps
    <root>/<version>/<split>/.step-<...>.parquet.<id>.tmp  a write in progress (or a crash's
                                                          leftover; readers ignore it)
    <root>/_quarantine/<version>/<split>/step-<...>.parquet[.N]   unreadable files, moved
    <root>/_quarantine/.../step-<...>.parquet[.N].reason.json     ... and why

Atomicity (docs/design.md#run-directories: nothing is lost on a crash). A step is written to a
temporary name in its final directory, fsynced, then published with `os.link(tmp, final)`
(which fails if `final` exists, so two writers can never replace each other's file), the
temporary name is removed and the directory fsynced. A reader therefore sees a step
either complete or not at all. Without hard links (some network file systems) the store
falls back to an existence check + `os.replace`. Under a `gs://` root
(evotrainer/paths.py) a step is one object write of the whole file (atomic: readers see
all of it or nothing), after the same existence check; only process 0 writes.

Never overwritten. Writing a (version, step, split) that already exists raises
`RolloutExistsError`; there is no overwrite switch. A resumed run that may redo a step
calls `exists()` first and skips (or writes under a new version) when the step is there.
A step whose file was quarantined no longer `exists()` and may be written again.

Schema: one column per `Episode` field plus the harness's optional per-row `advantage`
and `kept`; schema.py holds it (`SCHEMA`) and the exact episodes <-> Arrow table round
trip, re-exported here.

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

from evotrainer import atomic, paths
from evotrainer.rollouts.schema import (SCHEMA, episodes_to_table, read_column,
                                        table_to_columns, table_to_episodes, to_json)
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


class RolloutStore:
  """Reads and writes rollouts under `root` (see the module docstring for the layout)."""

  def __init__(self, root: str | os.PathLike):
    self.root = paths.as_path(root)  # pathlib.Path, or an epath.Path for gs://
    self._remote = paths.is_remote(root)
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
    return sorted(int(m.group(1)) for m in map(_STEP_FILE.match, (p.name for p in d.iterdir()))
                  if m)

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
          _HARNESS_STATE: to_json(harness_state, "harness_state").encode(),
          _META: to_json(meta, "meta").encode()}
    kv[_FOOTER_SHA] = _footer_sha(kv).encode()
    table = table.replace_schema_metadata(kv)
    if self._remote:
      sink = pa.BufferOutputStream()
      pq.write_table(table, sink, row_group_size=max(len(episodes), 1), **_WRITE_OPTIONS)
      final.write_bytes(sink.getvalue().to_pybytes())
      return final
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
      atomic.fsync_dir(d)
    return final

  # --- reading

  def _quarantine(self, path: pathlib.Path, reason: str) -> Optional[QuarantinedFile]:
    """Moves `path` under `<root>/_quarantine/` (never replacing anything there)."""
    qdir = self.root / QUARANTINE / path.relative_to(self.root).parent
    if self._remote:
      return self._quarantine_remote(path, qdir, reason)
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
      atomic.fsync_dir(d)
    return self._quarantined(path, dst, reason)

  def _quarantine_remote(self, path, qdir, reason: str) -> Optional[QuarantinedFile]:
    """`_quarantine` on an object store: the bytes copied under a free name, then the
    original deleted (no links, no atomic rename there)."""
    try:
      data = path.read_bytes()
    except FileNotFoundError:
      return None  # another reader moved it already
    for i in itertools.count():
      dst = qdir / (path.name if i == 0 else f"{path.name}.{i}")
      if not dst.exists():
        break
    dst.write_bytes(data)
    path.unlink()
    record = {"original_path": str(path), "reason": reason, "size_bytes": len(data),
              "quarantined_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    dst.with_name(dst.name + ".reason.json").write_text(json.dumps(record, indent=2) + "\n")
    return self._quarantined(path, dst, reason)

  def _quarantined(self, path, dst, reason: str) -> QuarantinedFile:
    problem = QuarantinedFile(str(path), str(dst), reason)
    self.problems.append(problem)
    logger.warning("rollout store: %s is unreadable (%s); moved to %s", path, reason, dst)
    return problem

  def _load(self, path: pathlib.Path, footer_only: bool = False,
            ) -> Optional[tuple[Optional[pa.Table], StepMetadata]]:
    """Reads and checks one file; None if it vanished or was quarantined."""
    try:  # a full read takes the bytes at once; the footer alone needs only a seek
      source = (str(path) if footer_only and not self._remote
                else pa.BufferReader(path.read_bytes()))
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
    adv, kept = read_column(table, "advantage"), read_column(table, "kept")
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
