"""Sweep files: named variants of gin bindings, grids of them, and their checks.

Format (`parse_sweep`; example: gin/sweeps/math_example.gin):

  # a comment                        blank lines and lines starting with '#' are skipped
  [variant NAME]                     a variant: the binding lines that follow it
  Configurable.param = VALUE         one gin binding; VALUE in gin syntax (numbers,
                                     'strings', [lists], {dicts}, @References(), None)
  [grid NAME]                        a grid: the product of the value lists below it,
  Configurable.param = [V1, V2]      expanded to variants NAME-1, NAME-2, ... (the first
  Other.param = [W1, W2, W3]         line varies slowest, as itertools.product)

A value may span several lines while a bracket is open. NAME: letters, digits, '_', '-',
'.'. A variant without bindings is a control (the parent's configuration, trained for the
same budget). Variant NAME is recorded in the ledger as version `s-NAME`.

Checked before anything runs or is written (`check_variants`; `SweepError` names the
variant): every binding is a gin parameter and every @reference a configurable; a binding
the search space has a knob for holds a value of the knob's domain; nothing binds the
step budget, the seed or the run's own knobs (`train.steps`, `run.*`, `branch.*`,
`sweep.*`, `evolve.*`); no two variants have the same bindings; a name recorded earlier
in the ledger keeps its bindings.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import re
from typing import Any, Mapping, Optional, Sequence

from evotrainer.evolution.search_space import (ComponentListKnob, DictWeightKnob,
                                               Intervention, SearchSpace, SearchSpaceError,
                                               _parse_binding, canonical, format_value,
                                               normalize, same_value)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_SECTION = re.compile(r"^\[\s*(variant|grid)\s+(.*?)\s*\]$")
_FIXED = ("run", "branch", "sweep", "evolve")  # configurables a variant may not bind


class SweepError(ValueError):
  """A sweep file or one of its variants is invalid; the message names which."""


@dataclasses.dataclass(frozen=True)
class Variant:
  """One variant: `bindings` ({binding: value}, values as `normalize` gives them) applied
  on top of the parent's configuration; `source` says where it was defined."""

  name: str
  bindings: dict
  source: str = ""

  @property
  def version(self) -> str:
    """Its version id in the ledger."""
    return f"s-{self.name}"

  def gin(self) -> list[str]:
    """The bindings as gin lines, e.g. ["StdGroupFilter.top_p = 0.8"]."""
    return [f"{b} = {format_value(v)}" for b, v in self.bindings.items()]

  def where(self) -> str:
    return f"variant {self.name!r}" + (f" ({self.source})" if self.source else "")


# ------------------------------------------------------------------ the file


def _depth(text: str) -> int:
  """Open brackets minus closed ones, outside quoted strings."""
  depth, quote = 0, None
  for i, ch in enumerate(text):
    if quote:
      if ch == quote and text[i - 1] != "\\":
        quote = None
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
  return depth


def parse_sweep(text: str, where: str = "<sweep>") -> list:
  """The variants of a sweep file's text (the module docstring gives the format).

  The configurables its bindings name must be registered first (a launch has parsed the
  run's gin; else registry.register_builtins()).

  Raises SweepError naming the file, line and section of a malformed line, an
  unparseable value, a grid line that is no list, or a repeated name or binding.
  """
  import gin
  sections = _sections(text, where)
  variants = []
  for kind, name, n, bindings in sections:
    parsed = {}
    for b, (value, ln) in bindings.items():
      try:
        parsed[b] = normalize(gin.config.parse_value(value))
      except (ValueError, SyntaxError) as e:
        raise SweepError(f"{where}:{ln}: [{kind} {name}] {b}: cannot parse {value!r}: "
                         f"{str(e).splitlines()[0]}") from None
    if kind == "variant":
      variants.append(Variant(name, parsed, f"{where}:{n}"))
    else:
      variants += expand_grid(name, parsed, f"{where}:{n}")
  names = [v.name for v in variants]
  dup = sorted({x for x in names if names.count(x) > 1})
  if dup:
    raise SweepError(f"{where}: variant names repeated: {dup}")
  if not variants:
    raise SweepError(f"{where}: no [variant NAME] or [grid NAME] section")
  return variants


def _sections(text: str, where: str) -> list:
  """[[kind, name, line, {binding: (value text, line)}]] of a sweep file's text: its
  sections in order, each binding's value text joined over the lines of an open bracket.
  Raises SweepError on a malformed header or line, a binding outside a section, a
  repeated binding or an unclosed bracket."""
  sections: list = []  # [kind, name, line, {binding: (value text, line)}]
  pending: Optional[list] = None  # [binding, text, line] while a bracket is open
  lines = text.splitlines()
  for n, raw in enumerate(lines + [""], 1):
    line = raw.strip()
    if pending is not None:
      if n > len(lines):
        raise SweepError(f"{where}:{pending[2]}: unclosed bracket in the value of "
                         f"{pending[0]}")
      pending[1] += " " + line
      if _depth(pending[1]) <= 0:
        sections[-1][3][pending[0]] = (pending[1], pending[2])
        pending = None
      continue
    if not line or line.startswith("#"):
      continue
    m = _SECTION.match(line)
    if m:
      kind, name = m.groups()
      if not _NAME.match(name):
        raise SweepError(f"{where}:{n}: [{kind} {name}]: a name is letters, digits, '_', "
                         f"'-', '.'")
      sections.append([kind, name, n, {}])
      continue
    if line.startswith("["):
      raise SweepError(f"{where}:{n}: a section header is '[variant NAME]' or "
                       f"'[grid NAME]', got {line!r}")
    if not sections:
      raise SweepError(f"{where}:{n}: binding {line!r} before any [variant NAME] or "
                       f"[grid NAME] section")
    binding, eq, value = (s.strip() for s in line.partition("="))
    if not eq or not binding or not value:
      raise SweepError(f"{where}:{n}: expected 'Configurable.param = value', got {line!r}")
    if binding in sections[-1][3]:
      raise SweepError(f"{where}:{n}: [{sections[-1][0]} {sections[-1][1]}] binds "
                       f"{binding} twice")
    if _depth(value) > 0:
      pending = [binding, value, n]
    else:
      sections[-1][3][binding] = (value, n)
  return sections


def expand_grid(name: str, axes: Mapping[str, Any], source: str = "") -> list:
  """Variants NAME-1, NAME-2, ... of the product of `axes` ({binding: [values]}), the
  first binding varying slowest (itertools.product order)."""
  bad = [b for b, vals in axes.items() if not isinstance(vals, list) or not vals]
  if not axes or bad:
    raise SweepError(f"[grid {name}] ({source}): every line is 'binding = [v1, v2, ...]', "
                     f"a non-empty list; " + (f"not a list: {bad}" if bad else "no line"))
  keys = list(axes)
  return [Variant(f"{name}-{i}", dict(zip(keys, combo)), f"{source}, grid {name}")
          for i, combo in enumerate(itertools.product(*(axes[k] for k in keys)), 1)]


def resolve(path: str | os.PathLike) -> pathlib.Path:
  """A sweep file: `path` as given, else under the gin search paths (gin/, installed)."""
  from evotrainer.config import gin_search_paths
  for base in ["", *gin_search_paths()]:
    p = pathlib.Path(base) / path
    if p.is_file():
      return p
  raise SweepError(f"sweep file {path} not found (searched the cwd and "
                   f"{gin_search_paths()})")


def load_sweep(path: str | os.PathLike) -> list:
  """The variants of the sweep file at `path` (see `parse_sweep`)."""
  p = resolve(path)
  return parse_sweep(p.read_text(encoding="utf-8"), str(path))


# ------------------------------------------------------------------ checks


def _check_knob(knob: Any, old: Any, new: Any) -> None:
  """Raises SearchSpaceError when `new` is outside `knob`'s domain (several changes at
  once are fine in a sweep; each value must still be one the knob allows)."""
  if isinstance(knob, ComponentListKnob):
    items = old if isinstance(old, list) else []
    if not isinstance(new, list):
      raise SearchSpaceError(f"{knob.name}: {new!r} is not a list of components")
    bad = [x for x in new if knob.name_of(x) is None and not any(same_value(x, y)
                                                                 for y in items)]
    if bad:
      raise SearchSpaceError(f"{knob.name}: components {bad} are not in the library "
                             f"{sorted(knob.library)}")
    if len(new) < knob.min_size or (knob.max_size is not None and len(new) > knob.max_size):
      raise SearchSpaceError(f"{knob.name}: {len(new)} components, the knob allows "
                             f"{knob.min_size}..{knob.max_size}")
  elif isinstance(knob, DictWeightKnob):
    if not isinstance(new, dict):
      raise SearchSpaceError(f"{knob.name}: {new!r} is not a dict")
    if knob.key in new:
      rest = {k: v for k, v in new.items() if k != knob.key}
      knob.check(Intervention(knob.binding, rest, new, "add", knob.key))
    elif isinstance(old, dict) and knob.key in old and not knob.removable:
      raise SearchSpaceError(f"{knob.name}: {knob.key!r} may not be removed")
  else:
    knob.check(Intervention(knob.binding, old, new))


def check_variants(variants: Sequence[Variant], space: Optional[SearchSpace] = None,
                   values: Optional[Mapping] = None,
                   recorded: Optional[Mapping] = None) -> None:
  """Raises SweepError (naming the variant) unless every variant can run (module
  docstring); writes nothing. The configurables must be registered (`parse_sweep`).

  Args:
    variants: the sweep's variants.
    space: the search space; a binding it has a knob for must hold a value of its domain.
    values: the parent's {binding: value} (the old values knobs are checked against).
    recorded: {variant name: bindings} recorded in the ledger by an earlier launch.
  """
  if not variants:
    raise SweepError("the sweep lists no variant")
  names = [v.name for v in variants]
  dup = sorted({x for x in names if names.count(x) > 1})
  if dup:
    raise SweepError(f"variant names repeated: {dup}")
  values = values or {}
  for v in variants:
    if not _NAME.match(v.name):
      raise SweepError(f"{v.where()}: a name is letters, digits, '_', '-', '.'")
    for b, new in v.bindings.items():
      try:
        key = _parse_binding(b)
      except ValueError as e:
        raise SweepError(f"{v.where()}: unknown binding {b!r}: {e}") from None
      name = key.complete_selector.rsplit(".", 1)[-1]
      if name in _FIXED or (name == "train" and key.arg_name == "steps"):
        raise SweepError(f"{v.where()}: {b} may not vary within a sweep (every variant "
                         f"runs with the same step budget, seed and run set-up)")
      if space is not None and b in space:
        for knob in [k for k in space.knobs if k.binding == b]:
          try:
            _check_knob(knob, values.get(b), new)
          except SearchSpaceError as e:
            raise SweepError(f"{v.where()}: {b} = {format_value(new)} is outside the "
                             f"search space: {e}") from None
    if recorded and v.name in recorded and canonical(recorded[v.name]) != canonical(
        v.bindings):
      raise SweepError(f"{v.where()}: recorded in this workdir's ledger with other "
                       f"bindings {recorded[v.name]}; rename the variant or use a new workdir")
  for a, b in itertools.combinations(variants, 2):
    if a.bindings.keys() == b.bindings.keys() and all(
        same_value(a.bindings[k], b.bindings[k]) for k in a.bindings):
      raise SweepError(f"{b.where()} has the same bindings as {a.where()}: "
                       f"{'; '.join(a.gin()) or '(none)'}")


__all__ = ["SweepError", "Variant", "check_variants", "expand_grid", "load_sweep",
           "parse_sweep", "resolve"]
