"""Pinned source distributions: the manifest, the fetch, the hash check, the extraction.

The manifest (`data/swe_sources.json`, package data) names each library by version,
sdist file name and sha256. `fetch` downloads the sdist with pip from the package
registry into the cache (`~/.cache/evotrainer/swe` unless told otherwise), refuses a file
whose hash is not the manifest's, and extracts it once; later calls reuse the extracted
tree. No library code is vendored in the repository.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

# Package data (setup.py), so a non-editable install finds it too.
MANIFEST = pathlib.Path(
    str(importlib.resources.files(__package__).joinpath("data", "swe_sources.json")))
DEFAULT_CACHE = pathlib.Path(os.path.expanduser("~/.cache/evotrainer/swe"))
PIP_TIMEOUT_S = 600


class SourceError(RuntimeError):
  """A source cannot be fetched or does not match its pin; the message says which."""


@dataclasses.dataclass(frozen=True)
class Source:
  """One pinned library.

  Attributes:
    name, version: the distribution on the package registry.
    sdist: the source distribution's file name.
    sha256: its hash; a download with another hash is refused.
    package: paths (files or folders, relative to the sdist's root) whose Python code
      may be mutated.
    tests: folders holding the library's own tests (never mutated; pristine at grading).
  """
  name: str
  version: str
  sdist: str
  sha256: str
  package: tuple[str, ...]
  tests: tuple[str, ...] = ("tests",)

  @property
  def repo(self) -> str:
    """`name==version`: the `repo` field of its tasks."""
    return f"{self.name}=={self.version}"


def load_manifest(path: os.PathLike | str = MANIFEST) -> list[Source]:
  """Reads the manifest; a missing or malformed entry names the file and the field."""
  path = pathlib.Path(path)
  try:
    rows = json.loads(path.read_text())["sources"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise SourceError(f"{path}: not a manifest with a 'sources' list ({e})") from None
  sources = []
  for i, row in enumerate(rows):
    missing = [k for k in ("name", "version", "sdist", "sha256", "package") if k not in row]
    if missing:
      raise SourceError(f"{path}: sources[{i}] lacks {missing}")
    if len(row["sha256"]) != 64:
      raise SourceError(f"{path}: sources[{i}].sha256 must be 64 hex digits")
    sources.append(Source(row["name"], row["version"], row["sdist"], row["sha256"].lower(),
                          tuple(row["package"]), tuple(row.get("tests", ("tests",)))))
  return sources


def find_source(name: str, path: os.PathLike | str = MANIFEST) -> Source:
  for source in load_manifest(path):
    if source.name == name:
      return source
  raise SourceError(f"{path}: no source named {name!r}")


def sha256_of(path: os.PathLike | str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def fetch(source: Source, cache_dir: os.PathLike | str | None = None) -> pathlib.Path:
  """The extracted tree of `source` (its sdist's top folder), fetched and checked if new.

  Raises:
    SourceError: pip failed (the registry unreachable, the version gone) or the sdist's
      sha256 is not the manifest's.
  """
  cache = pathlib.Path(cache_dir or DEFAULT_CACHE)
  tree = cache / "src" / f"{source.name}-{source.version}"
  if (tree / ".evotrainer-ok").exists():
    return tree
  sdist = cache / "sdists" / source.sdist
  if not sdist.exists():
    _download(source, sdist.parent)
  got = sha256_of(sdist)
  if got != source.sha256:
    raise SourceError(f"{sdist}: sha256 {got} is not the pinned {source.sha256} of "
                      f"{source.repo} ({MANIFEST}); delete the file to fetch it again, or "
                      "fix the pin")
  shutil.rmtree(tree, ignore_errors=True)
  staging = cache / "src" / f".{source.name}-{source.version}.tmp"
  shutil.rmtree(staging, ignore_errors=True)
  with tarfile.open(sdist) as tar:
    tar.extractall(staging, filter="data")  # no links out, no absolute paths
  tops = list(staging.iterdir())
  if len(tops) != 1 or not tops[0].is_dir():
    raise SourceError(f"{sdist}: expected one top folder, found {[p.name for p in tops]}")
  tops[0].rename(tree)
  staging.rmdir()
  (tree / ".evotrainer-ok").write_text(source.sha256)
  return tree


def _download(source: Source, dest: pathlib.Path) -> None:
  dest.mkdir(parents=True, exist_ok=True)
  base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          "--disable-pip-version-check", "-d", str(dest), f"{source.name}=={source.version}"]
  # Without build isolation pip reads the metadata with the setuptools at hand (seconds);
  # a backend that is not installed (hatchling, poetry) needs the isolated build (minutes).
  for cmd in (base + ["--no-build-isolation"], base):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if done.returncode == 0 and (dest / source.sdist).exists():
      return
  raise SourceError(f"pip could not fetch {source.repo} as {source.sdist}: "
                    f"{done.stderr.strip()[-1500:] or done.stdout.strip()[-1500:]}")
