"""gin: search paths, parsing with errors a user can act on, the operative config on disk,
and the record of what the command line said (`CommandLine`).

A leaf: it imports no module that defines configurables (evotrainer/registry.py names them).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import os
import pathlib
from typing import Optional, Sequence

import gin

from evotrainer import gin_api

REPO_GIN_DIR = pathlib.Path(__file__).resolve().parent.parent / "gin"
# Where a non-editable `pip install` puts gin/ (setup.py: package evotrainer._gin).
INSTALLED_GIN_DIR = pathlib.Path(__file__).resolve().parent / "_gin"


@dataclasses.dataclass(frozen=True)
class CommandLine:
  """What the command line said (launch.py): an evolution replays it for every branch.

  Attributes:
    gin_files: `--gin_file`, in order.
    gin_bindings: `--gin_bindings`, in order.
    gin_search_paths: `--gin_search_paths`.
    imports: `--import`, the user modules with gin configurables.
    flags: other flags a branch is launched with (`--new_segment`).
  """
  gin_files: tuple[str, ...] = ()
  gin_bindings: tuple[str, ...] = ()
  gin_search_paths: tuple[str, ...] = ()
  imports: tuple[str, ...] = ()
  flags: tuple[str, ...] = ()


class ConfigError(ValueError):
  """A gin file or binding could not be used; the message names it."""


def gin_search_paths(extra: Sequence[str] = ()) -> list[str]:
  """Directories searched for gin files and `include`s, in order."""
  paths = [os.getcwd(), *extra]
  for d in (REPO_GIN_DIR, INSTALLED_GIN_DIR):
    # Installed, <pkg>/../gin is site-packages/gin (the gin-config library): skip it.
    if (d / "base.gin").is_file():
      paths += [str(d), str(d.parent)]
  out = []
  for p in paths:
    if p not in out:
      out.append(p)
  return out


def import_modules(names: Sequence[str]) -> None:
  """Imports user modules (`--import=my.module`) so their gin configurables exist."""
  for name in names:
    try:
      importlib.import_module(name)
    except ImportError as e:
      raise ConfigError(f"--import={name}: {e}") from None


class _QuietSearch(logging.Filter):
  """gin logs an error for every search path a file is *not* in; only the miss matters."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Path not found")


def parse(gin_files: Sequence[str], bindings: Sequence[str] = (),
          search_paths: Sequence[str] = (), finalize: bool = True) -> None:
  """Parses gin files then bindings; raises ConfigError naming the file or binding.

  The configurables they name must exist first: registry.parse registers the built-in
  ones and calls this, `import_modules` a user's."""
  gin.clear_config()
  for p in gin_search_paths(search_paths):
    gin.add_config_file_search_path(p)
  if not gin_files:
    raise ConfigError("no --gin_file given (try --gin_file=gin/math.gin)")
  quiet = _QuietSearch()
  logging.getLogger().addFilter(quiet)
  try:
    _parse(gin_files, bindings, search_paths)
  finally:
    logging.getLogger().removeFilter(quiet)
  check_value_types()
  if finalize:
    try:
      gin.finalize()
    except ValueError as e:  # e.g. a `%gin.REQUIRED` value nobody bound
      raise ConfigError(f"{e} Bind it with --gin_bindings (e.g. gin/model/*.gin need "
                        f"policy.hf_dir = '/path/to/checkpoint').") from None


def _expected(default) -> tuple | None:
  """The value types a binding may have when its parameter's default is `default`."""
  if isinstance(default, bool):
    return (bool, int)
  if isinstance(default, int):
    return (int,)
  if isinstance(default, float):
    return (int, float)
  if isinstance(default, str):
    return (str,)
  return None  # None, containers, objects: anything goes


def check_value_types() -> None:
  """A binding whose value is a plain literal of another type than its parameter's
  default (`train.steps = 'abc'`) is a ConfigError naming the binding, before any
  object is built. References (`@X()`), macros and unset-default parameters pass."""
  for scope, selector, params in gin_api.bound_parameters():
    configurable = gin_api.find_configurable(selector)
    if configurable is None:
      continue
    signature = gin_api.parameters(configurable.wrapped)
    for name, value in params.items():
      p = signature.get(name)
      want = None if p is None or p.default is inspect.Parameter.empty else _expected(p.default)
      if want is None or not isinstance(value, (str, int, float, bool, list, dict, tuple)):
        continue
      if not isinstance(value, want) or (want[0] is not bool and isinstance(value, bool)):
        where = f"{scope + '/' if scope else ''}{selector.rsplit('.', 1)[-1]}.{name}"
        raise ConfigError(f"{where} = {value!r}: expected {' or '.join(t.__name__ for t in want)}"
                          f" (the default is {p.default!r})")


def _parse(gin_files, bindings, search_paths) -> None:
  for f in gin_files:
    try:
      gin.parse_config_file(f)
    except IOError as e:
      raise ConfigError(f"gin file {f!r} not found (searched: "
                        f"{', '.join(gin_search_paths(search_paths))}): {e}") from None
    except Exception as e:  # gin reports file:line in its message
      raise ConfigError(f"in gin file {f!r}: {e}") from None
  for b in bindings:
    try:
      gin.parse_config(b)
    except Exception as e:
      raise ConfigError(f"in --gin_bindings {b!r}: {e}") from None


DEFAULT_COMPILATION_CACHE = os.path.join("~", ".cache", "evotrainer", "jax")


@gin.configurable
def compilation_cache(directory: Optional[str] = DEFAULT_COMPILATION_CACHE) -> Optional[str]:
  """Turns on JAX's persistent compilation cache in `directory` (`~` expanded); None or
  '' leaves it off. Returns the directory in use.

  Every branch of an evolution is a new process that compiles the same sampler, learner
  and evaluation programs as its parent: with the cache, the root compiles them and the
  branches load them (docs/results.md says what it saves). The environment variable
  `JAX_COMPILATION_CACHE_DIR`, when set, wins. Entries are keyed by the program, the
  backend and the JAX version, so a stale entry is never used for another program.
  """
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or (
      os.path.expanduser(directory) if directory else None)
  if path:
    import jax  # pylint: disable=import-outside-toplevel
    jax.config.update("jax_compilation_cache_dir", path)
  return path


def write_operative_config(directory: str | os.PathLike, name: str = "operative_config.gin") -> str:
  """Writes the bindings actually used so far (call after the run built its objects)."""
  from evotrainer import paths  # pylint: disable=g-import-not-at-top
  paths.makedirs(directory)
  path = paths.as_path(directory) / name  # a local path or a gs:// URL
  paths.write_atomic(path, gin.operative_config_str())
  return str(path)
