"""The shared signatures of harness components (what the evolution controller mutates).

Every component is a small class registered with gin (`@gin.configurable(module=
"harness")`), constructed with its knobs, with a stable `name`, and called on host-side
`Episode`s (evotrainer/types.py). Kinds:

  RewardPart        episodes -> [n] float          one named reward term
  TrajectoryFilter  episodes -> FilterResult        keep mask + a reason per cut episode
  GroupFilter       groups -> [num_groups] bool     keep mask over GRPO groups
  Diagnostic        episodes, context -> Report     metrics + Findings with evidence
  Validator         Evidence -> Verdict             a promotion gate, never a reward

A batch of episodes is always ordered by group: `group_size` consecutive rows share a
prompt. Components are pure functions of their inputs and knobs, except where a class
documents state (e.g. an EMA threshold), which it exposes through `state()` /
`load_state()` so a replay can restore it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from evotrainer.types import Episode, Finding


@dataclasses.dataclass(frozen=True)
class FilterResult:
  keep: np.ndarray  # [n] bool
  reasons: tuple  # [n] Optional[str]: why each cut episode was cut (None when kept)


@dataclasses.dataclass(frozen=True)
class Report:
  metrics: dict  # {metric name: float}
  findings: tuple = ()  # Finding, ...


@dataclasses.dataclass(frozen=True)
class Verdict:
  validator: str  # the validator's name
  passed: bool
  value: float  # the statistic the decision was made on
  threshold: float
  reason: str  # one line: why it passed or failed
  applicable: bool = True  # False: the evidence it needs was absent (it passed unjudged)

  @property
  def state(self) -> str:
    """'pass', 'fail' or 'n/a' (passed without the evidence it needs)."""
    return "fail" if not self.passed else ("pass" if self.applicable else "n/a")


@dataclasses.dataclass
class Evidence:
  """What a validator judges a branch (version) on.

  Attributes:
    episodes: the branch's training and evaluation episodes (most recent last).
    series: {metric name: [value per step]}, e.g. 'correct' (BC), 'reward' (proxy).
    heldout: held-out figures, e.g. {'avg8': 0.4}.
    parent: the same fields of the parent version, when known.
    strict_verify: optional callable (gold, completion) -> bool: a stricter verifier.
  """

  episodes: Sequence[Episode]
  series: dict
  heldout: dict
  parent: Optional["Evidence"] = None
  strict_verify: Optional[Any] = None


@runtime_checkable
class RewardPart(Protocol):
  name: str

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:
    ...


@runtime_checkable
class TrajectoryFilter(Protocol):
  name: str

  def __call__(self, episodes: Sequence[Episode]) -> FilterResult:
    ...


@runtime_checkable
class GroupFilter(Protocol):
  name: str

  def __call__(self, groups: Sequence[Sequence[Episode]]) -> np.ndarray:
    ...


@runtime_checkable
class Diagnostic(Protocol):
  name: str
  layer: str

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    ...


@runtime_checkable
class Validator(Protocol):
  name: str

  def __call__(self, evidence: Evidence) -> Verdict:
    ...


def registrar(library: dict, kind: str):
  """A class decorator adding a component class to `library` under its `name`."""

  def register(cls: type) -> type:
    if not getattr(cls, "name", ""):
      raise ValueError(f"{cls.__name__} has no `name`; {kind}s register by name")
    if library.get(cls.name, cls) is not cls:
      raise ValueError(f"{kind} name {cls.name!r} is taken by {library[cls.name]}")
    library[cls.name] = cls
    return cls

  register.__doc__ = f"Adds a {kind} class to the library under its `name` (a decorator)."
  return register


def groups_of(episodes: Sequence[Episode]) -> list:
  """Consecutive runs of equal `group_id` -> list of lists of episodes."""
  out: list = []
  for ep in episodes:
    if out and out[-1][0].group_id == ep.group_id:
      out[-1].append(ep)
    else:
      out.append([ep])
  return out


# Control characters (but tab and newlines) and lone surrogates: not storable as UTF-8
# (surrogates) or not displayable (NUL, ESC, ...), so shown as escapes.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
  """`text` with control characters and lone surrogates written as escapes (`\\x00`,
  `\\ud800`): valid UTF-8 that stores (sqlite, JSON, Parquet) and renders anywhere."""
  return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def snippet(text: str, width: int = 80, tail: bool = False) -> str:
  """A short, one-line, `printable` excerpt for evidence: the head (or the `tail`).

  Whitespace runs become one space; the result has at most `width` characters. The cost
  does not grow with the text beyond one split: at most `width` words are kept.
  """
  words = text.rsplit(None, width)[-width:] if tail else text.split(None, width)[:width]
  joined = " ".join(words)
  whole = len(words) < width and len(joined) <= width  # nothing left out yet
  shown = printable(joined[-width:] if tail else joined[:width])
  if whole and len(shown) <= width:
    return shown
  return "..." + shown[-(width - 3):] if tail else shown[:width - 3] + "..."


__all__ = ["Diagnostic", "Episode", "Evidence", "FilterResult", "Finding", "GroupFilter",
           "Report", "RewardPart", "TrajectoryFilter", "Validator", "Verdict", "groups_of", "registrar",
           "printable", "snippet"]
