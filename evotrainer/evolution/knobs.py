"""Knobs: the typed domains of the gin bindings the evolution may change.

A knob owns one binding (a DictWeightKnob one entry of a dict binding) and answers two
questions: which single-factor Interventions it proposes from the current values
(`candidates`), and whether a given Intervention stays inside its domain (`check`,
raising SearchSpaceError naming the binding). The SearchSpace (search_space.py) is the
list of knobs; its module docstring shows how a space is declared in gin.

  FloatKnob(binding, low, high, log=False)          a float in [low, high]
  IntKnob(binding, low, high, log=False)            an int in [low, high]
  ChoiceKnob(binding, choices)                      one of a list of values
  ComponentListKnob(binding, library, max_size)     add / remove one component of a list
  DictWeightKnob(binding, key, low, high)           one entry of a {name: weight} dict

Each is a gin configurable under the `evolution` module (`@FloatKnob()` or
`@evolution.FloatKnob()` in gin).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence, Union

import gin

from evotrainer.evolution.intervention import (Intervention, SearchSpaceError, _ref_key,
                                               _round, canonical, extra_item, normalize,
                                               same_value)


def _num(value: Any, integer: bool = False) -> bool:
  """A finite number (an int when `integer`), not a bool."""
  ok = isinstance(value, int) if integer else isinstance(value, (int, float))
  return ok and not isinstance(value, bool) and math.isfinite(value)


class _Knob:
  """Shared parts: `name` (unique in a space), `binding`, `group`, and the proposal API."""

  binding: str
  group: str

  @property
  def name(self) -> str:
    return self.binding

  def current(self, values: Mapping[str, Any]) -> Any:
    """This knob's value inside `values` ({binding: value})."""
    if self.binding not in values:
      raise SearchSpaceError(f"no current value for {self.binding} (knob {self.name}); "
                             f"give every knob's binding in the current values")
    return normalize(values[self.binding])

  def candidates(self, values: Mapping[str, Any]) -> list:
    """Every single-factor intervention this knob proposes from `values`."""
    raise NotImplementedError

  def check(self, iv: Intervention) -> None:
    """Raises SearchSpaceError when `iv` leaves this knob's domain."""
    raise NotImplementedError

  def _fail(self, iv: Intervention, why: str) -> None:
    raise SearchSpaceError(f"{self.name}: {iv.description}: {why}")


def _float_steps(cur: Optional[float], low: float, high: float, log: bool,
                 step: Optional[float]) -> list:
  """Up and down one step from `cur`, clipped into [low, high]; the middle when None."""
  if cur is None or not _num(cur):
    return [math.sqrt(low * high) if log and low > 0 else (low + high) / 2]
  if log:
    f = step or 2.0
    raw = [cur * f, cur / f]
  else:
    s = step or (high - low) / 4
    raw = [cur + s, cur - s]
  return [_round(min(high, max(low, x))) for x in raw]


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class FloatKnob(_Knob):
  """A float binding in [low, high]; proposals move one `step` (log: multiply by `step`,
  default 2; linear: add `step`, default a quarter of the range) up or down."""

  binding: str
  low: float
  high: float
  log: bool = False
  step: Optional[float] = None
  group: str = "hyper"

  def __post_init__(self):
    if not self.low <= self.high or (self.log and self.low <= 0):
      raise SearchSpaceError(f"FloatKnob {self.binding}: need low <= high (and low > 0 "
                             f"with log=True), got [{self.low}, {self.high}]")

  def candidates(self, values):
    cur = self.current(values)
    news = _float_steps(cur, self.low, self.high, self.log, self.step)
    return [Intervention(self.binding, cur, x) for x in dict.fromkeys(news)
            if not (_num(cur) and math.isclose(x, cur, rel_tol=1e-9, abs_tol=1e-15))]

  def check(self, iv):
    if iv.kind != "set":
      self._fail(iv, f"a float knob only takes 'set', not {iv.kind!r}")
    if not _num(iv.new) or not self.low <= iv.new <= self.high:
      self._fail(iv, f"value {iv.new!r} is outside [{self.low}, {self.high}]")


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class IntKnob(_Knob):
  """An int binding in [low, high]; proposals add `step` (log: multiply by `step`, 2)."""

  binding: str
  low: int
  high: int
  log: bool = False
  step: Optional[int] = None
  group: str = "hyper"

  def __post_init__(self):
    if not self.low <= self.high or (self.log and self.low <= 0):
      raise SearchSpaceError(f"IntKnob {self.binding}: need low <= high (and low > 0 with "
                             f"log=True), got [{self.low}, {self.high}]")

  def candidates(self, values):
    cur = self.current(values)
    if not _num(cur, integer=True):
      news = [(self.low + self.high) // 2]
    elif self.log:
      f = self.step or 2
      news = [cur * f, max(1, cur // f)]
    else:
      news = [cur + (self.step or 1), cur - (self.step or 1)]
    news = [min(self.high, max(self.low, int(x))) for x in news]
    return [Intervention(self.binding, cur, x) for x in dict.fromkeys(news) if x != cur]

  def check(self, iv):
    if iv.kind != "set":
      self._fail(iv, f"an int knob only takes 'set', not {iv.kind!r}")
    if not _num(iv.new, integer=True) or not self.low <= iv.new <= self.high:
      self._fail(iv, f"value {iv.new!r} is not an int in [{self.low}, {self.high}]")


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class ChoiceKnob(_Knob):
  """A binding that takes one of `choices` (literals, or '@Ref()' strings)."""

  binding: str
  choices: Sequence[Any]
  group: str = "hyper"

  def __post_init__(self):
    object.__setattr__(self, "choices", tuple(normalize(list(self.choices))))
    if len(self.choices) < 2:
      raise SearchSpaceError(f"ChoiceKnob {self.binding}: needs at least 2 choices")

  def candidates(self, values):
    cur = self.current(values)
    return [Intervention(self.binding, cur, c) for c in self.choices if not same_value(c, cur)]

  def check(self, iv):
    if iv.kind != "set":
      self._fail(iv, f"a choice knob only takes 'set', not {iv.kind!r}")
    if not any(same_value(iv.new, c) for c in self.choices):
      self._fail(iv, f"value {iv.new!r} is not one of {list(self.choices)}")


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class ComponentListKnob(_Knob):
  """A list of gin components (filters, reward components): add or remove one of
  `library` ({short name: '@Ref()'}) per intervention, keeping min_size..max_size items.
  Items of the current list that are not in the library stay as they are."""

  binding: str
  library: Mapping[str, str]
  max_size: Optional[int] = None
  min_size: int = 0
  group: str = "harness"

  def __post_init__(self):
    lib = dict(self.library)
    bad = [k for k, v in lib.items() if not (isinstance(v, str) and v.strip().startswith("@"))]
    if not lib or bad:
      raise SearchSpaceError(f"ComponentListKnob {self.binding}: library must map names to "
                             f"gin references like '@DropZeroVarianceGroups()'; bad: {bad}")
    object.__setattr__(self, "library", lib)

  def name_of(self, ref: Any) -> Optional[str]:
    """The library name of a component reference, or None when it is not in the library."""
    key = _ref_key(ref)
    return next((k for k, v in self.library.items() if _ref_key(v) == key), None)

  def current(self, values):
    cur = super().current(values)
    if cur is None:
      return []
    if not isinstance(cur, list):
      raise SearchSpaceError(f"{self.binding} is {cur!r}; ComponentListKnob needs a list")
    return cur

  def candidates(self, values):
    cur = self.current(values)
    present = {self.name_of(c) for c in cur} - {None}
    out = []
    if self.max_size is None or len(cur) < self.max_size:
      out += [Intervention(self.binding, cur, cur + [ref], "add", name)
              for name, ref in self.library.items() if name not in present]
    if len(cur) > self.min_size:
      out += [Intervention(self.binding, cur, [c for c in cur if self.name_of(c) != name],
                           "remove", name) for name in self.library if name in present]
    return out

  def check(self, iv):
    old, new = iv.old if iv.old is not None else [], iv.new
    if not isinstance(old, list) or not isinstance(new, list):
      self._fail(iv, "old and new values must be lists of components")
    if iv.kind == "add":
      item = extra_item(new, old)
      if len(new) != len(old) + 1 or item is None:
        self._fail(iv, "an 'add' must append exactly one component")
      if self.name_of(item) is None:
        self._fail(iv, f"component {item!r} is not in the library {sorted(self.library)}")
      if any(same_value(item, c) for c in old):
        self._fail(iv, f"component {item!r} is already in the list")
      if self.max_size is not None and len(new) > self.max_size:
        self._fail(iv, f"the list would hold {len(new)} > max_size={self.max_size}")
    elif iv.kind == "remove":
      item = extra_item(old, new)
      if len(old) != len(new) + 1 or item is None:
        self._fail(iv, "a 'remove' must drop exactly one component")
      if self.name_of(item) is None:
        self._fail(iv, f"component {item!r} is not in the library {sorted(self.library)}")
      if len(new) < self.min_size:
        self._fail(iv, f"the list would hold {len(new)} < min_size={self.min_size}")
    else:
      self._fail(iv, "a component list changes by 'add' or 'remove' only")


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class DictWeightKnob(_Knob):
  """One entry `key` of a {name: weight} binding (e.g. a reward part's weight in
  `RewardComposer.parts`) in [low, high]. When absent, proposals add it at `initial`
  (default: the middle of the range); when present, they move it one step (as
  FloatKnob) or, if `removable`, remove it (a subtraction)."""

  binding: str
  key: str
  low: float
  high: float
  log: bool = False
  step: Optional[float] = None
  removable: bool = True
  initial: Optional[float] = None
  group: str = "reward"

  def __post_init__(self):
    if not self.low <= self.high or (self.log and self.low <= 0):
      raise SearchSpaceError(f"DictWeightKnob {self.name}: need low <= high (and low > 0 "
                             f"with log=True), got [{self.low}, {self.high}]")

  @property
  def name(self) -> str:
    return f"{self.binding}[{self.key!r}]"

  def current(self, values):
    cur = super().current(values)
    if cur is None:
      return {}
    if not isinstance(cur, dict):
      raise SearchSpaceError(f"{self.binding} is {cur!r}; DictWeightKnob needs a dict")
    return cur

  def candidates(self, values):
    cur = self.current(values)
    if self.key not in cur:
      w = self.initial if self.initial is not None else _float_steps(
          None, self.low, self.high, self.log, None)[0]
      return [Intervention(self.binding, cur, {**cur, self.key: _round(w)}, "add", self.key)]
    w = cur[self.key]
    out = [Intervention(self.binding, cur, {**cur, self.key: x}, "set", self.key)
           for x in dict.fromkeys(_float_steps(w, self.low, self.high, self.log, self.step))
           if not (_num(w) and math.isclose(x, w, rel_tol=1e-9, abs_tol=1e-15))]
    if self.removable:
      out.append(Intervention(self.binding, cur,
                              {k: v for k, v in cur.items() if k != self.key}, "remove",
                              self.key))
    return out

  def check(self, iv):
    old, new = iv.old if iv.old is not None else {}, iv.new
    if not isinstance(old, dict) or not isinstance(new, dict):
      self._fail(iv, "old and new values must be dicts")
    rest_old = {k: v for k, v in old.items() if k != self.key}
    rest_new = {k: v for k, v in new.items() if k != self.key}
    if canonical(rest_old) != canonical(rest_new):
      self._fail(iv, f"entries other than {self.key!r} changed")
    if iv.kind == "remove":
      if not self.removable:
        self._fail(iv, f"{self.key!r} may not be removed (removable=False)")
      if self.key not in old or self.key in new:
        self._fail(iv, f"a 'remove' must drop the present entry {self.key!r}")
      return
    if iv.kind == "add" and self.key in old:
      self._fail(iv, f"{self.key!r} is already present; use 'set'")
    if iv.kind == "set" and self.key not in old:
      self._fail(iv, f"{self.key!r} is absent; use 'add'")
    w = new.get(self.key)
    if not _num(w) or not self.low <= w <= self.high:
      self._fail(iv, f"weight {w!r} is outside [{self.low}, {self.high}]")


Knob = Union[FloatKnob, IntKnob, ChoiceKnob, ComponentListKnob, DictWeightKnob]


__all__ = ["ChoiceKnob", "ComponentListKnob", "DictWeightKnob", "FloatKnob", "IntKnob",
           "Knob"]
