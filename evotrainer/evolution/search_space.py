"""The search space: the action boundary of the evolution (METHOD.md steps 3-4).

A *knob* is one gin binding the controller may change, with a typed domain; a
`SearchSpace` is the list of knobs. Every change the controller makes is an
`Intervention` on exactly one knob (|ΔX| = 1), and nothing outside the space changes.
An intervention is a gin binding, so a person can replay any version with
`--gin_bindings="$(intervention.to_gin())"`.

Knobs:
  FloatKnob(binding, low, high, log=False)          a float in [low, high]
  IntKnob(binding, low, high, log=False)            an int in [low, high]
  ChoiceKnob(binding, choices)                      one of a list of values
  ComponentListKnob(binding, library, max_size)     add / remove one component of a list
  DictWeightKnob(binding, key, low, high)           one entry of a {name: weight} dict

Values are plain Python (numbers, strings, lists, dicts). A string that starts with '@'
or '%' is a gin reference or macro and is written to gin unquoted: a component library
maps a short name to a reference string, e.g. {'drop_dead': '@DropZeroVarianceGroups()'}.

Declaring a space in gin (a scope per knob):

    SearchSpace.knobs = [@lr/FloatKnob(), @clip_high/FloatKnob(), @estimator/ChoiceKnob(),
                         @group_filters/ComponentListKnob(), @partial/DictWeightKnob()]
    lr/FloatKnob.binding = 'Learner.learning_rate'
    lr/FloatKnob.low = 1e-5
    lr/FloatKnob.high = 1e-3
    lr/FloatKnob.log = True
    clip_high/FloatKnob.binding = 'Learner.clip_high'
    clip_high/FloatKnob.low = 0.2
    clip_high/FloatKnob.high = 0.4
    clip_high/FloatKnob.step = 0.04
    estimator/ChoiceKnob.binding = 'Harness.estimator'
    estimator/ChoiceKnob.choices = ['grpo', 'dr_grpo', 'rloo']
    group_filters/ComponentListKnob.binding = 'Harness.group_filters'
    group_filters/ComponentListKnob.library = {
        'drop_dead': '@DropZeroVarianceGroups()', 'std': '@StdGroupFilter()'}
    group_filters/ComponentListKnob.max_size = 1
    group_filters/ComponentListKnob.group = 'filter'
    partial/DictWeightKnob.binding = 'RewardComposer.parts'
    partial/DictWeightKnob.key = 'partial'
    partial/DictWeightKnob.low = 0.05
    partial/DictWeightKnob.high = 1.0
    partial/DictWeightKnob.group = 'reward'

Each knob's `group` (free text: 'hyper', 'reward', 'filter', 'data', ...) lets a proposer
restrict itself, e.g. the recipe-search baseline to `space.restrict(groups=['hyper'])`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import random
import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import gin

KINDS = ("set", "add", "remove")
_REF = re.compile(r"^[@%]")


class SearchSpaceError(ValueError):
  """An intervention or a knob is outside the search space; the message names the binding."""


# ------------------------------------------------------------------ values and gin text


def normalize(value: Any) -> Any:
  """A JSON-able copy of a binding value: gin references become their '@name()' text,
  tuples become lists, numpy scalars become Python numbers."""
  if isinstance(value, gin.config.ConfigurableReference):
    return repr(value)
  if isinstance(value, Mapping):
    return {str(k): normalize(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [normalize(v) for v in value]
  if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
    return value.item()
  return value


def format_value(value: Any) -> str:
  """Gin text of a value; strings starting with '@' or '%' are references (unquoted)."""
  value = normalize(value)
  if isinstance(value, str):
    return value.strip() if _REF.match(value) else repr(value)
  if value is None or isinstance(value, (bool, int)):
    return repr(value)
  if isinstance(value, float):
    if not math.isfinite(value):
      raise SearchSpaceError(f"non-finite value {value} cannot be written to gin")
    return repr(value)
  if isinstance(value, list):
    return "[" + ", ".join(format_value(v) for v in value) + "]"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{k!r}: {format_value(v)}" for k, v in value.items()) + "}"
  raise SearchSpaceError(f"value {value!r} of type {type(value).__name__} has no gin form")


def canonical(value: Any) -> str:
  """Canonical JSON of a value (sorted keys): equality and hashing of binding values."""
  return json.dumps(normalize(value), sort_keys=True)


def _short(value: Any) -> str:
  text = format_value(value) if _is_formattable(value) else repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _is_formattable(value: Any) -> bool:
  try:
    format_value(value)
    return True
  except SearchSpaceError:
    return False


def _round(x: float) -> float:
  """6 significant digits: proposals like 3e-4 / 2 stay readable in gin and the ledger."""
  return float(f"{x:.6g}")


# ------------------------------------------------------------------ the intervention


@dataclasses.dataclass(frozen=True)
class Intervention:
  """One single-factor change: `binding` goes from `old` to `new`.

  `kind` is 'set' (a value, or one dict entry's weight), 'add' or 'remove' (one
  component of a list, or one entry of a dict); `key` names the dict entry or the
  library name of the component. `old` and `new` are whole binding values, so
  `to_gin()` needs nothing else.
  """

  binding: str
  old: Any
  new: Any
  kind: str = "set"
  key: Optional[str] = None
  description: str = ""

  def __post_init__(self):
    if self.kind not in KINDS:
      raise SearchSpaceError(f"Intervention on {self.binding}: kind={self.kind!r}; "
                             f"expected one of {KINDS}")
    object.__setattr__(self, "old", normalize(self.old))
    object.__setattr__(self, "new", normalize(self.new))
    if not self.description:
      object.__setattr__(self, "description", describe(self))

  @property
  def id(self) -> str:
    """A stable short hash of the change (binding, kind, key, old, new)."""
    text = canonical([self.binding, self.kind, self.key, self.old, self.new])
    return hashlib.sha1(text.encode()).hexdigest()[:12]

  def to_gin(self) -> str:
    """The gin binding that makes the change, e.g. "Learner.clip_high = 0.32"."""
    return f"{self.binding} = {format_value(self.new)}"

  def to_dict(self) -> dict:
    return {"id": self.id, "binding": self.binding, "kind": self.kind, "key": self.key,
            "old": self.old, "new": self.new, "description": self.description,
            "gin": self.to_gin()}

  @classmethod
  def from_dict(cls, d: Mapping) -> "Intervention":
    return cls(binding=d["binding"], old=d.get("old"), new=d.get("new"),
               kind=d.get("kind", "set"), key=d.get("key"),
               description=d.get("description", ""))

  def __hash__(self) -> int:
    return hash(self.id)


def describe(iv: Intervention) -> str:
  """One line: 'Learner.clip_high: 0.28 -> 0.32', "RewardComposer.parts: add 'partial' = 0.5"."""
  if isinstance(iv.old, dict) or isinstance(iv.new, dict):
    old, new = iv.old or {}, iv.new or {}
    if iv.kind == "add":
      return f"{iv.binding}: add {iv.key!r} = {_short(new.get(iv.key))}"
    if iv.kind == "remove":
      return f"{iv.binding}: remove {iv.key!r} (was {_short(old.get(iv.key))})"
    if iv.key is not None:
      return (f"{iv.binding}[{iv.key!r}]: {_short(old.get(iv.key))} -> "
              f"{_short(new.get(iv.key))}")
  if iv.kind in ("add", "remove"):
    return f"{iv.binding}: {iv.kind} {iv.key}"
  return f"{iv.binding}: {_short(iv.old)} -> {_short(iv.new)}"


def make_intervention(binding: str, old: Any, new: Any, key: Optional[str] = None,
                      description: str = "") -> Intervention:
  """An Intervention whose `kind` (and dict `key`) is read off the difference old -> new.

  A dict that gains one entry is an 'add', one that loses one a 'remove', one whose
  single entry changes a 'set' of that key; a list that gains / loses one element is an
  'add' / 'remove' (pass `key` to name the component, else the element's text is used).
  """
  old, new = normalize(old), normalize(new)
  kind = "set"
  if isinstance(old, dict) and isinstance(new, dict):
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    changed = [k for k in new if k in old and canonical(new[k]) != canonical(old[k])]
    if len(added) + len(removed) + len(changed) == 1:
      kind = "add" if added else "remove" if removed else "set"
      key = key or (added + removed + changed)[0]
  elif isinstance(old, list) and isinstance(new, list):
    if len(new) == len(old) + 1 and extra_item(new, old) is not None:
      kind, key = "add", key or str(extra_item(new, old))
    elif len(old) == len(new) + 1 and extra_item(old, new) is not None:
      kind, key = "remove", key or str(extra_item(old, new))
  return Intervention(binding, old, new, kind, key, description)


def extra_item(longer: list, shorter: list) -> Optional[Any]:
  """The element whose removal from `longer` gives `shorter` (order kept), else None."""
  keys = [_ref_key(x) for x in shorter]
  for i, x in enumerate(longer):
    if [_ref_key(y) for y in longer[:i] + longer[i + 1:]] == keys:
      return x
  return None


# ------------------------------------------------------------------ gin introspection


def _parse_binding(binding: str):
  """gin's own parse of 'Configurable.param' (raises ValueError when either is unknown)."""
  # ParsedBindingKey.parse is how gin itself validates a binding key; there is no public
  # equivalent in gin-config 0.5.
  return gin.config.ParsedBindingKey.parse(binding)


_REF_PARTS = re.compile(r"@((?:[\w.]+/)*)([\w.]+)(\(\))?")  # @scope/name()


def _lookup(selector: str):
  """gin's Configurable for a (partial) selector; None when unknown or ambiguous."""
  try:
    return gin.config._REGISTRY.get_match(selector)  # noqa: SLF001 (no public lookup)
  except KeyError:  # several configurables match
    return None


def _ref_key(value: Any) -> str:
  """Comparable text of a component: '@harness.DropZeroVarianceGroups()' and
  '@DropZeroVarianceGroups()' name the same configurable, so both map to its complete
  selector (when gin knows it); scopes and the call parentheses are kept."""
  text = re.sub(r"\s+", "", value) if isinstance(value, str) else canonical(value)
  m = _REF_PARTS.fullmatch(text)
  match = _lookup(m.group(2)) if m else None
  if match is not None:
    return f"@{m.group(1)}{match.selector}{m.group(3) or ''}"
  return text


def same_value(a: Any, b: Any) -> bool:
  if isinstance(a, str) and isinstance(b, str):
    return _ref_key(a) == _ref_key(b)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
  return canonical(a) == canonical(b)


def _default_of(binding: str) -> Any:
  """The default of a configurable's parameter (when gin has no value bound for it)."""
  pbk = _parse_binding(binding)
  fn = _lookup(pbk.complete_selector).wrapped
  if inspect.isclass(fn):
    fn = fn.__init__
  while hasattr(fn, "__wrapped__"):
    fn = fn.__wrapped__
  param = inspect.signature(fn).parameters.get(pbk.arg_name)
  if param is None or param.default is inspect.Parameter.empty:
    raise SearchSpaceError(f"{binding} is not bound in gin and has no default; bind it")
  return param.default


# ------------------------------------------------------------------ knobs


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


# ------------------------------------------------------------------ the space


@gin.configurable(module="evolution")
class SearchSpace:
  """The knobs the controller may turn; every intervention goes through `validate`.

  Args:
    knobs: FloatKnob / IntKnob / ChoiceKnob / ComponentListKnob / DictWeightKnob. Knob
      names must be unique; several DictWeightKnobs may share a dict binding (one per
      key), any other knob owns its binding alone.
  """

  def __init__(self, knobs: Sequence[Knob] = ()):
    self.knobs = list(knobs)
    names = [k.name for k in self.knobs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
      raise SearchSpaceError(f"SearchSpace: knobs repeated: {dup}")
    by_binding: dict = {}
    for k in self.knobs:
      by_binding.setdefault(k.binding, []).append(k)
    for b, ks in by_binding.items():
      if len(ks) > 1 and not all(isinstance(k, DictWeightKnob) for k in ks):
        raise SearchSpaceError(f"SearchSpace: binding {b} has several knobs "
                               f"({[k.name for k in ks]}); only DictWeightKnobs may share one")
    self._by_binding = by_binding

  @property
  def bindings(self) -> list:
    """The distinct bindings of the space, in knob order."""
    return list(self._by_binding)

  def __contains__(self, binding: str) -> bool:
    return binding in self._by_binding

  def __len__(self) -> int:
    return len(self.knobs)

  def restrict(self, groups: Optional[Iterable[str]] = None,
               bindings: Optional[Iterable[str]] = None) -> "SearchSpace":
    """The sub-space of knobs in `groups` (and/or on `bindings`)."""
    groups = None if groups is None else set(groups)
    bindings = None if bindings is None else set(bindings)
    return SearchSpace([k for k in self.knobs
                        if (groups is None or k.group in groups)
                        and (bindings is None or k.binding in bindings)])

  def knob_for(self, iv: Intervention) -> Knob:
    """The knob that owns `iv` (for a dict binding, the one for `iv.key`)."""
    ks = self._by_binding.get(iv.binding)
    if not ks:
      raise SearchSpaceError(f"binding {iv.binding} is outside the search space (knobs: "
                             f"{', '.join(k.name for k in self.knobs) or 'none'})")
    if isinstance(ks[0], DictWeightKnob):
      match = [k for k in ks if k.key == iv.key]
      if not match:
        raise SearchSpaceError(f"{iv.binding}[{iv.key!r}] is outside the search space "
                               f"(keys with a knob: {[k.key for k in ks]})")
      return match[0]
    return ks[0]

  def validate(self, iv: Intervention) -> Intervention:
    """Returns `iv` when it is inside the space; raises SearchSpaceError naming the binding."""
    self.knob_for(iv).check(iv)
    return iv

  def neighbours(self, current_values: Mapping[str, Any], rng: Union[random.Random, int],
                 k: int) -> list:
    """Up to `k` distinct single-factor interventions from `current_values`.

    Knobs take turns (in a random order) so that a knob with many choices does not
    crowd out the others; each knob's candidates are shuffled. Deterministic for a
    given `rng` seed.
    """
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    pools = []
    for knob in self.knobs:
      cands = [self.validate(iv) for iv in knob.candidates(current_values)]
      rng.shuffle(cands)
      if cands:
        pools.append(cands)
    rng.shuffle(pools)
    out, seen = [], set()
    while len(out) < k and any(pools):
      for pool in pools:
        while pool and len(out) < k:
          iv = pool.pop()
          if iv.id not in seen:
            seen.add(iv.id)
            out.append(iv)
            break
    return out

  def apply(self, bindings: Mapping[str, Any], iv: Intervention) -> dict:
    """A copy of `bindings` ({binding: value}) with `iv` applied (validated first).

    Raises when `bindings` holds a value for the binding other than `iv.old`: the
    intervention was designed for another parent.
    """
    self.validate(iv)
    if iv.binding in bindings and not same_value(normalize(bindings[iv.binding]), iv.old):
      raise SearchSpaceError(f"{iv.description}: designed for {iv.binding} = "
                             f"{_short(iv.old)}, but the bindings hold "
                             f"{_short(bindings[iv.binding])}")
    out = {b: normalize(v) for b, v in bindings.items()}
    out[iv.binding] = iv.new
    return out

  def check_bindings_exist(self, register: bool = True) -> None:
    """Raises SearchSpaceError naming every knob binding (or component reference) that
    is no gin configurable parameter. `register` imports the built-in configurables
    first (`config.register_builtins()`)."""
    if register:
      from evotrainer import config  # imports the JAX modules; only when asked
      config.register_builtins()
    errors = []
    for knob in self.knobs:
      try:
        _parse_binding(knob.binding)
      except ValueError as e:
        errors.append(f"{knob.name}: binding {knob.binding!r} is no gin parameter ({e})")
      refs = list(getattr(knob, "library", {}).values()) + [
          c for c in getattr(knob, "choices", ()) if isinstance(c, str) and _REF.match(c)]
      for ref in refs:
        m = _REF_PARTS.fullmatch(re.sub(r"\s+", "", ref))
        if m and _lookup(m.group(2)) is None:
          errors.append(f"{knob.name}: component {ref!r} names no (unique) gin configurable")
    if errors:
      raise SearchSpaceError("search space: unknown bindings:\n  " + "\n  ".join(errors))

  def current_values(self) -> dict:
    """{binding: value} read from the parsed gin config; a binding gin has no value for
    takes its configurable's default. Call after parsing the run's gin files."""
    return {b: current_value(b) for b in self.bindings}


def current_value(binding: str) -> Any:
  """The value of a gin binding in the parsed config, else its configurable's default
  (normalized); SearchSpaceError when it has neither."""
  try:
    return normalize(gin.query_parameter(binding))
  except ValueError:
    try:
      return normalize(_default_of(binding))
    except ValueError as e:
      raise SearchSpaceError(f"binding {binding}: {e}") from None


__all__ = ["ChoiceKnob", "ComponentListKnob", "DictWeightKnob", "FloatKnob", "IntKnob",
           "Intervention", "KINDS", "Knob", "SearchSpace", "SearchSpaceError", "canonical",
           "current_value", "describe", "format_value", "make_intervention", "normalize"]
