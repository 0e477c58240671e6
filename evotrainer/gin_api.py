"""The gin look-ups gin-config 0.5 has no public function for, in one place.

gin-config 0.5.0 answers one binding (`gin.query_parameter`) or one configurable's
bindings (`gin.get_bindings`), and `gin.get_configurable` returns a scope-decorated
wrapper that raises on an unknown or ambiguous selector. Two questions have no public
answer:

- which configurable a (partial) selector names, as gin registered it (its `selector`
  and the undecorated function or class, whose signature holds the defaults);
- every binding parsed so far, to check them all at once (config.check_value_types);
- every configurable registered (tests/test_docs_knobs.py: each is documented).

`parameters` reads a configurable's signature, including that of a class registered with
`gin.external_configurable`, whose wrapper's own `__init__` is `(*args, **kwargs)`.

These functions answer them by reading gin's private registry and config. No other module
of the package reads a private gin attribute (tests/test_gin_api.py checks it); a gin
upgrade that moves them breaks here and nowhere else.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator, Optional

import gin


def find_configurable(selector: str) -> Optional[gin.config.Configurable]:
  """The configurable a (partial) selector names (`'DropZeroVarianceGroups'` or
  `'evotrainer.harness.filters.DropZeroVarianceGroups'`), with its complete `selector` and
  the undecorated function or class (`wrapped`); None when none or several match."""
  try:
    return gin.config._REGISTRY.get_match(selector)  # pylint: disable=protected-access
  except KeyError:  # several configurables match
    return None


def bound_parameters() -> Iterator[tuple[str, str, dict[str, Any]]]:
  """Every configurable with bindings parsed so far: (scope, complete selector,
  {parameter: value}); scope is '' outside any scope. Values are as parsed (references
  and macros unevaluated)."""
  for (scope, selector), params in list(gin.config._CONFIG.items()):  # pylint: disable=protected-access
    yield scope, selector, dict(params)


def registered() -> Iterator[gin.config.Configurable]:
  """Every configurable registered so far, gin's own (`macro`, `singleton`) included."""
  for _, configurable in list(gin.config._REGISTRY.items()):  # pylint: disable=protected-access
    yield configurable


def parameters(fn) -> dict[str, inspect.Parameter]:
  """{name: inspect.Parameter} of a configurable's function or class (`wrapped`): for a
  class, the first in its MRO whose signature is not `(*args, **kwargs)` (an external
  configurable's wrapper subclass has that one); {} when none has another."""
  for c in fn.__mro__ if inspect.isclass(fn) else (fn,):
    try:
      params = inspect.signature(c).parameters
    except (TypeError, ValueError):
      return {}
    if [p.kind for p in params.values()] != [inspect.Parameter.VAR_POSITIONAL,
                                             inspect.Parameter.VAR_KEYWORD]:
      return dict(params)
  return {}
