"""One single-factor change to a gin binding, and the binding values it is made of.

An `Intervention` moves one gin binding from `old` to `new` ('set' a value or a dict
entry, 'add' / 'remove' one component or entry); it renders as the gin binding that makes
the change (`to_gin`), so any version can be replayed with `--gin_bindings`. Its values
are plain Python (`normalize`): numbers, strings, lists, dicts, and '@Ref()' / '%MACRO'
strings for gin references, written unquoted (`format_value`). Two references to the same
configurable compare equal however they are spelled (`same_value`), through gin's own
registry (the gin look-ups at the end; `current_value` reads a binding from the parsed
config). The knobs (knobs.py) and the SearchSpace (search_space.py) are built on these.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import re
from typing import Any, Mapping, Optional

import gin

from evotrainer import gin_api

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
  return gin_api.find_configurable(selector)


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


__all__ = ["Intervention", "KINDS", "SearchSpaceError", "canonical", "current_value",
           "describe", "extra_item", "format_value", "make_intervention", "normalize",
           "same_value"]
