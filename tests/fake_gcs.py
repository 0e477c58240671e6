"""A stand-in for Google Cloud Storage: `gs://bucket/key` is the local file `<root>/bucket/key`.

No network and no credentials in tests, so the two clients that talk to GCS are pointed
at one local directory, and everything above them (epath, Orbax, our path layer) runs
unchanged:

* fsspec's `gcs` / `gs` protocols (what `epath.Path('gs://...')` uses; gcsfs in
  production) become a `DirFileSystem` rooted at `<root>`;
* Orbax's calls into the GCS client library (`gcs_utils`: the TensorStore kvstore spec,
  the hierarchical-namespace probe, the recursive delete) map to the same directory.

What this does not exercise: gcsfs and the GCS service themselves, GCS-only Orbax paths
behind a hierarchical-namespace bucket, and latency or eventual listing.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Iterator

import fsspec
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import _registry


@contextlib.contextmanager
def fake_gcs(root: pathlib.Path) -> Iterator[pathlib.Path]:
  """Within the block `gs://b/k` reads and writes `root/b/k`; yields `root`."""
  from orbax.checkpoint._src.path import gcs_utils
  root = pathlib.Path(root)
  root.mkdir(parents=True, exist_ok=True)

  class FakeGCSFileSystem(DirFileSystem):
    protocol = ("gs", "gcs")

    def __init__(self, *args, **kwargs):
      del args, kwargs  # gcsfs options (finalize_on_close, project, ...)
      super().__init__(path=str(root), fs=LocalFileSystem(auto_mkdir=True))  # no dirs in GCS

  def local(path) -> str:
    text = str(path)
    assert text.startswith("gs://"), text
    return str(root / text[len("gs://"):])

  saved = {p: fsspec.registry.get(p) for p in ("gs", "gcs")}
  patched = {"get_kvstore_for_gcs": lambda path: {"driver": "file", "path": local(path)},
             "is_hierarchical_namespace_enabled": lambda path: False,
             "rmtree": lambda path, missing_ok=False: LocalFileSystem().rm(
                 local(path), recursive=True) if pathlib.Path(local(path)).exists() else None}
  originals = {k: getattr(gcs_utils, k) for k in patched}
  for p in ("gs", "gcs"):
    fsspec.register_implementation(p, FakeGCSFileSystem, clobber=True)
  for k, v in patched.items():
    setattr(gcs_utils, k, v)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
  try:
    yield root
  finally:
    for k, v in originals.items():
      setattr(gcs_utils, k, v)
    for p, cls in saved.items():
      if cls is None:
        _registry.pop(p, None)  # back to gcsfs, imported on first use
      else:
        fsspec.register_implementation(p, cls, clobber=True)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access
