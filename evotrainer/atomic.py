"""Whole-file writes that a crash or a concurrent reader never sees half done.

The protocol: write a uniquely named temporary file in the destination's directory,
flush and fsync it, `os.replace` it over the destination (atomic on POSIX within one file
system), then fsync the directory so the new name itself survives a power loss. A reader
sees the old content or the new, never a part; an error while writing leaves the old file
as it was and removes the temporary one.

Local paths only: `paths.write_atomic` is the door that also takes a `gs://` URL (one
object write there). Stores that must never replace a file (rollouts/store.py publishes
with `os.link`, which fails instead) keep their own protocol and use `fsync_dir`.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
from typing import Any, Callable, Optional, Union

PathLike = Union[str, os.PathLike]


def fsync_dir(directory: PathLike) -> None:
  """Makes the names in `directory` durable (a rename or link into it survives a crash)."""
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def write_bytes(path: PathLike, data: bytes) -> None:
  """Replaces the file at `path` by `data` atomically and durably (see the module
  docstring). Its directory must exist; the new file gets the mode an ordinary `open`
  gives (0o666 less the umask)."""
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  fsync_dir(path.parent)


def write_text(path: PathLike, text: str) -> None:
  """`write_bytes` of `text` in UTF-8."""
  write_bytes(path, text.encode("utf-8"))


def write_json(path: PathLike, data: Any, *, indent: Optional[int] = None,
               sort_keys: bool = False, default: Optional[Callable] = None) -> None:
  """`write_text` of `json.dumps(data, ...)` and a final newline. The JSON is built before
  anything is written: data that cannot be serialized leaves the old file untouched."""
  write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys, default=default)
             + "\n")


__all__ = ["fsync_dir", "write_bytes", "write_json", "write_text"]
