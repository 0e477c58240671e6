"""Workdir paths: a local directory or a `gs://` URL, through one layer.

Remote paths are etils `epath.Path`s (the path type Orbax itself uses; fsspec underneath,
so `gs://` needs gcsfs: `pip install -e .[gcs]`); local paths stay `pathlib.Path`s and
behave exactly as before. An object store lacks three things a local disk has, and each
has a stand-in here:

* Append. Append-only files (metrics.jsonl, findings.jsonl, TensorBoard event files) and
  the SQLite ledger are written in a local *mirror* directory and uploaded whole to the
  workdir (`Mirror.push`): by `train` at most every `workdir_mirror.sync_every_s` seconds,
  before every checkpoint and at the end, so the workdir always holds every line up to
  the latest checkpoint (all a resume keeps: it truncates the logs to that step). On a
  restart the mirror is first made equal to the workdir (`Mirror.fetch`).
* Atomic rename. One object write is atomic (a reader sees the old object or the new one,
  never a part), so `write_atomic` is one write there, and `atomic.write_bytes` locally.
* `flock`. The lock of a remote workdir is taken in its mirror directory
  (evotrainer/workdir.py): it excludes a second launch on the same host, not on another.

A local workdir is its own mirror: `Mirror(workdir).local(name)` is `workdir/name` and
`push` does nothing.

A whole run directory (an evolution's or a sweep's: evolution/ledger/mirror.py) is
mirrored with a *state file*: `Mirror(workdir, state=NAME)` records in the mirror what it
uploaded or fetched, so that a relaunch uploads only what changed since, and `pull`
copies down what the mirror lacks (on another host: everything).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import time
from typing import Callable, Optional, Union

import gin

from evotrainer import atomic

PathLike = Union[str, os.PathLike]

# Schemes a workdir may use. epath (and Orbax's TensorStore driver) also know s3://, but
# only gs:// has been exercised here (with a local stand-in for GCS: tests/fake_gcs.py).
SCHEMES = ("gs",)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
DEFAULT_MIRROR_ROOT = os.path.join("~", ".cache", "evotrainer", "mirrors")


class RemotePathError(ValueError):
  """A URL this layer cannot use (unknown scheme, or its client library missing)."""


def scheme(path: PathLike) -> Optional[str]:
  """The URL scheme of `path` ('gs' for gs://b/x), None for a local path."""
  m = _SCHEME.match(os.fspath(path))
  return m.group(1).lower() if m else None


def is_remote(path: PathLike) -> bool:
  """Whether `path` is a URL (an object store), not a local path."""
  return scheme(path) is not None


def check(path: PathLike) -> None:
  """Raises RemotePathError for a URL of an unsupported scheme, or one whose fsspec
  implementation is not installed; local paths always pass."""
  s = scheme(path)
  if s is None:
    return
  if s not in SCHEMES:
    raise RemotePathError(
        f"{os.fspath(path)}: the scheme {s}:// is not supported for a workdir; use a local "
        f"path (a shared file system or a gcsfuse mount) or {', '.join(x + '://' for x in SCHEMES)}")
  import fsspec  # pylint: disable=g-import-not-at-top
  try:
    fsspec.get_filesystem_class("gcs")
  except (ImportError, ValueError) as e:
    raise RemotePathError(f"{os.fspath(path)}: gs:// needs gcsfs (pip install -e .[gcs]): "
                          f"{e}") from None


def as_path(path: PathLike):
  """`path` as a path object: an `epath.Path` for a URL, else a `pathlib.Path`."""
  if isinstance(path, pathlib.Path):
    return path
  if is_remote(path):
    check(path)
    from etils import epath  # pylint: disable=g-import-not-at-top
    return epath.Path(os.fspath(path))
  return pathlib.Path(os.path.expanduser(os.fspath(path)))


def resolve(path: PathLike) -> str:
  """`path` as a string: a URL unchanged, a local path made absolute."""
  if is_remote(path):
    check(path)
    return os.fspath(path)
  return os.path.abspath(os.path.expanduser(os.fspath(path)))


def makedirs(path: PathLike) -> None:
  """Creates a local directory (and its parents); nothing for a URL (an object store
  has no directories, and creating one might create a bucket)."""
  if not is_remote(path):
    pathlib.Path(os.path.expanduser(os.fspath(path))).mkdir(parents=True, exist_ok=True)


def write_atomic(path: PathLike, data: Union[str, bytes]) -> None:
  """Writes the whole file so that a reader sees the old content or the new, never a
  part: one object write for a URL; `atomic.write_bytes` (fsynced) locally."""
  raw = data.encode() if isinstance(data, str) else data
  if is_remote(path):
    as_path(path).write_bytes(raw)
    return
  atomic.write_bytes(os.path.expanduser(os.fspath(path)), raw)


@gin.configurable(module="paths")
def workdir_mirror(directory: Optional[str] = None, sync_every_s: float = 30.0) -> dict:
  """gin knobs of the local mirror of a remote workdir (see the module docstring).

  Args:
    directory: where the mirror of a `gs://` workdir lives (the ledger, metrics,
      findings, TensorBoard files, the lock, error.log); None: under
      ~/.cache/evotrainer/mirrors/, one directory per workdir URL.
    sync_every_s: the longest time between two uploads of the mirrored logs during a
      run (they are uploaded before every checkpoint and at the end regardless).
  """
  if sync_every_s < 0:
    raise ValueError(f"workdir_mirror.sync_every_s must be >= 0, got {sync_every_s}")
  return {"directory": directory, "sync_every_s": float(sync_every_s)}


def mirror_dir(workdir: PathLike) -> pathlib.Path:
  """The local directory standing in for `workdir`: the workdir itself when it is local;
  `workdir_mirror.directory`, else a cache directory keyed by the URL, when remote."""
  if not is_remote(workdir):
    return pathlib.Path(os.path.expanduser(os.fspath(workdir)))
  url = os.fspath(workdir).rstrip("/")
  given = workdir_mirror()["directory"]
  if given:
    return pathlib.Path(os.path.expanduser(given))
  key = hashlib.sha256(url.encode()).hexdigest()[:16]
  name = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rsplit("/", 1)[-1])[:40]
  return pathlib.Path(os.path.expanduser(DEFAULT_MIRROR_ROOT)) / f"{name}-{key}"


class Mirror:
  """Files of a workdir written locally and uploaded whole (see the module docstring).

  Usage:
    mirror = Mirror(workdir)
    mirror.fetch("metrics.jsonl")             # on start: the local copy = the workdir's
    with open(mirror.local("metrics.jsonl"), "a") as f: ...
    mirror.push("metrics.jsonl", "tensorboard")  # upload what changed
  """

  def __init__(self, workdir: PathLike, state: Optional[str] = None):
    """`state`: a file name in the mirror where the signatures of the files uploaded or
    fetched are kept across launches (None: this object's lifetime only)."""
    self.workdir = os.fspath(workdir)
    self.remote = is_remote(workdir)
    self.dir = mirror_dir(workdir)
    self.sync_every_s = workdir_mirror()["sync_every_s"]
    self._pushed: dict = {}  # local file -> (size, mtime_ns) at its last upload
    self._last_push = time.monotonic()
    self._state = self.dir / state if state and self.remote else None
    if self.remote:
      check(workdir)
      self.dir.mkdir(parents=True, exist_ok=True)
    if self._state is not None and self._state.exists():
      self._pushed = {str(self.dir / k): tuple(v)
                      for k, v in json.loads(self._state.read_text()).items()}

  def local(self, name: str) -> pathlib.Path:
    """Where `name` (a file or directory of the workdir) is written locally."""
    return self.dir / name

  def target(self, name: str):
    """`name` in the workdir itself."""
    return as_path(self.workdir) / name

  def fetch(self, name: str) -> bool:
    """Makes the local `name` (a file) equal to the workdir's: copied down, or removed
    when the workdir has none (a stale copy would be appended to). Returns whether the
    workdir has it. A local workdir: whether the file exists."""
    local = self.local(name)
    if not self.remote:
      return local.exists()
    if not self.target(name).exists():
      local.unlink(missing_ok=True)
      return False
    self._download(name)
    return True

  def _download(self, name: str) -> None:
    """Copies the workdir's `name` over the local one (whole, or not at all)."""
    local = self.local(name)
    local.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(local, self.target(name).read_bytes())
    self._pushed[str(local)] = _signature(local)

  def pull(self, skip: Callable[[str], bool], replace: bool = False) -> int:
    """Copies down every file of the workdir that the mirror lacks, except those whose
    name (relative to the workdir) `skip` accepts; records them as fetched. `replace`:
    the mirror is stale (another host ran on since): its files are removed first, so that
    it ends equal to the workdir, as on a new host. Nothing for a local workdir. Returns
    the number of files copied."""
    if not self.remote:
      return 0
    import fsspec  # pylint: disable=g-import-not-at-top
    fs, root = fsspec.core.url_to_fs(self.workdir)
    names = {f[len(root.rstrip("/")) + 1:] for f in fs.find(root)}
    if replace:
      for f in sorted(self.dir.rglob("*"), key=lambda p: -len(p.parts)):  # files first
        if skip(f.relative_to(self.dir).as_posix()):
          continue
        if f.is_file():
          f.unlink()
          self._pushed.pop(str(f), None)
        elif f.is_dir() and not any(f.iterdir()):
          f.rmdir()
    missing = sorted(n for n in names if n and not n.endswith("/") and not skip(n)
                     and not self.local(n).exists())
    for name in missing:
      self._download(name)
    self._save_state()
    return len(missing)

  def _save_state(self) -> None:
    if self._state is not None:
      state = {os.path.relpath(k, self.dir): v for k, v in self._pushed.items()}
      atomic.write_json(self._state, state, sort_keys=True)

  def clear(self, name: str) -> None:
    """Removes the local directory `name` of a remote workdir (files only ever uploaded,
    like TensorBoard event files, start afresh); nothing for a local workdir."""
    if self.remote:
      shutil.rmtree(self.local(name), ignore_errors=True)

  def push(self, *names: str, throttle: bool = False,
           skip: Optional[Callable[[str], bool]] = None) -> None:
    """Uploads every local file under `names` that changed since its last upload.

    Args:
      names: files or directories of the workdir.
      throttle: upload only when `sync_every_s` passed since the last upload.
      skip: files not to upload, by their name relative to the workdir.
    """
    if not self.remote:
      return
    if throttle and time.monotonic() - self._last_push < self.sync_every_s:
      return
    for name in names:
      root = self.local(name)
      files = ([root] if root.is_file() else
               sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [])
      for f in files:
        sig, rel = _signature(f), f.relative_to(self.dir).as_posix()
        if self._pushed.get(str(f)) == sig or (skip is not None and skip(rel)):
          continue
        write_atomic(self.target(rel), f.read_bytes())
        self._pushed[str(f)] = sig
    self._last_push = time.monotonic()
    self._save_state()


def _signature(path: pathlib.Path) -> tuple:
  st = path.stat()
  return st.st_size, st.st_mtime_ns


__all__ = ["DEFAULT_MIRROR_ROOT", "Mirror", "RemotePathError", "SCHEMES", "as_path", "check",
           "is_remote", "makedirs", "mirror_dir", "resolve", "scheme", "workdir_mirror",
           "write_atomic"]
