"""Reward parts and the composer: episodes -> named parts -> one composed reward per row.

A *reward part* is a `RewardPart` (harness/base.py): an object with a `name` and
`__call__(episodes) -> np.ndarray [n] float`. Task parts (BC `correct`, CR `partial`,
`format`, ...) are computed by the task's verifier and already sit in
`episode.reward_parts`; harness parts (overlong / length / repetition penalties,
behaviour bonuses, judge scores) are computed here. `RewardComposer` computes every
component, writes its values back into `episode.reward_parts[name]` (so the rollout store
keeps them and diagnostics and replays can read them), and sets `episode.reward` to the
clipped weighted sum (docs/method.md#reward-composition).

Adding a part = one class (or function) + naming it in gin (the components list, and a
weight in `parts`). In your own module (loaded with `--import=my_module`):

    @gin.configurable(module="harness")
    class ShortAnswerBonus:
      def __init__(self, name: str = "short_answer", max_chars: int = 20):
        self.name, self.max_chars = name, max_chars

      def __call__(self, episodes):  # -> [n] float
        return np.array([float(len(e.parsed_answer or "") <= self.max_chars)
                         for e in episodes])

and in gin:

    RewardComposer.components = [@OverlongPenalty(), @ShortAnswerBonus()]
    RewardComposer.parts = {'correct': 1.0, 'overlong': 1.0, 'short_answer': 0.1}

A plain function registered with `@gin.configurable` and listed as `@my_fn` (no
parentheses) works too; its name is the function's name. A component without a weight is
still computed and stored (weight 0: a diagnostic-only part). A weight naming no component
is read from the task's parts (`TaskPart`).

Non-finite values. A part with a non-zero weight that returns NaN / inf for some episode
quarantines that episode: its composed reward is 0, and it comes back cut with the reason
`reward part NAME returned nan` (the pipeline masks it out of the advantages), while the
raw value stays in `reward_parts` as evidence. One bad episode must not stop a run; a
part that returns the wrong shape or non-numbers is a bug in the part, and raises.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import FilterResult
from evotrainer.tasks.answers import MAX_TEXT_CHARS
from evotrainer.types import Episode

UNITS = ("tokens", "words")


def part_name(component) -> str:
  """The name a component is known by: its `name`, else its `__name__` (a function)."""
  name = getattr(component, "name", None) or getattr(component, "__name__", None)
  if not isinstance(name, str) or not name:
    raise ValueError(f"harness component {component!r} has no `name`; give the class a "
                     f"`name` attribute (or register a named function)")
  return name


def _token_lengths(episodes: Sequence[Episode], who: str) -> np.ndarray:
  """[n] completion lengths in tokens; an episode without token ids is an error."""
  for ep in episodes:
    if ep.completion_ids is None:
      raise ValueError(f"{who} is token based but episode {ep.episode_id!r} has no "
                       f"completion_ids")
  return np.array([ep.length for ep in episodes], np.float64)


def completion_units(ep: Episode, unit: str) -> np.ndarray:
  """[L] int ids of the completion's units: its token ids, or its whitespace words.

  Words are numbered in order of first appearance, so equal words get equal ids; only
  the last `MAX_TEXT_CHARS` characters of a longer completion are read.
  """
  if unit == "tokens":
    if ep.completion_ids is None:
      raise ValueError(f"unit='tokens' but episode {ep.episode_id!r} has no completion_ids "
                       f"(use unit='words' for text-only episodes)")
    return np.asarray(ep.completion_ids, np.int64).reshape(-1)
  if unit == "words":
    ids: dict = {}
    text = ep.completion[-MAX_TEXT_CHARS:]  # a cost bound on untrusted text: its end
    return np.array([ids.setdefault(w, len(ids)) for w in text.split()], np.int64)
  raise ValueError(f"unit={unit!r}; expected one of {UNITS}")


def repeated_ngram_share(units: np.ndarray, n: int) -> float:
  """Share of the n-grams of `units` that repeat an earlier one: 1 - distinct / total.

  0 when there are fewer than `n` units. E.g. [1, 2, 3, 1, 2, 3] with n = 2 has 5 bigrams,
  3 distinct: share 2/5.
  """
  seq = units.tolist()
  total = len(seq) - n + 1
  if total <= 0:
    return 0.0
  distinct = len(set(zip(*(seq[i:] for i in range(n)))))
  return 1.0 - distinct / total


@gin.configurable(module="harness")
class TaskPart:
  """A part the task's verifier put in `episode.reward_parts` (e.g. BC = 'correct').

  Args:
    part: the key in `reward_parts`: 'correct' (binary correctness), 'partial'
      (continuous correctness, CR), 'format', ...
    name: the name in the composer (default: `part`); lets one task part appear under
      another name.
  """

  def __init__(self, part: str = "correct", name: Optional[str] = None):
    self.part = part
    self.name = name or part

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:  # [n]
    out = np.empty(len(episodes), np.float64)
    for i, ep in enumerate(episodes):
      if self.part not in ep.reward_parts:
        raise KeyError(f"reward part {self.part!r} is missing from episode "
                       f"{ep.episode_id!r}; it has {sorted(ep.reward_parts)} (is '{self.part}' "
                       f"produced by the task, or a harness component that is not listed in "
                       f"RewardComposer.components?)")
      out[i] = float(ep.reward_parts[self.part])
    return out


@gin.configurable(module="harness")
class OverlongPenalty:
  """DAPO soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), in tokens.

  With L = `max_length` and B = `buffer`, for a completion of `len` tokens:
  0 if len <= L - B; (L - B - len) / B if L - B < len <= L (linear from 0 to -1);
  -1 if len > L. Lengths count the stop token (`Episode.length`).

  Args:
    max_length: L, usually the sampler's max_new_tokens.
    buffer: B, the soft band (0 = a hard -1 beyond L).
    name: the part's name.
  """

  def __init__(self, max_length: int, buffer: int, name: str = "overlong"):
    if not 0 <= buffer <= max_length:
      raise ValueError(f"OverlongPenalty: need 0 <= buffer <= max_length, got "
                       f"buffer={buffer}, max_length={max_length}")
    self.max_length, self.buffer, self.name = int(max_length), int(buffer), name

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:  # [n]
    length = _token_lengths(episodes, "OverlongPenalty")
    start = self.max_length - self.buffer
    band = (start - length) / max(self.buffer, 1)
    return np.where(length <= start, 0.0, np.where(length <= self.max_length, band, -1.0))


@gin.configurable(module="harness")
class LengthPenalty:
  """A linear penalty on tokens beyond a target: -max(0, len - target) / scale."""

  def __init__(self, target: int, scale: float, name: str = "length"):
    if scale <= 0:
      raise ValueError(f"LengthPenalty.scale must be > 0, got {scale}")
    self.target, self.scale, self.name = int(target), float(scale), name

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:  # [n]
    length = _token_lengths(episodes, "LengthPenalty")
    return -np.maximum(0.0, length - self.target) / self.scale


@gin.configurable(module="harness")
class RepetitionPenalty:
  """Minus the share of repeated n-grams in the completion (`repeated_ngram_share`).

  Args:
    n: n-gram size.
    unit: 'tokens' (completion ids) or 'words' (whitespace split of the text).
    name: the part's name.
  """

  def __init__(self, n: int = 4, unit: str = "tokens", name: str = "repetition"):
    if n < 1 or unit not in UNITS:
      raise ValueError(f"RepetitionPenalty: need n >= 1 and unit in {UNITS}, got n={n}, "
                       f"unit={unit!r}")
    self.n, self.unit, self.name = int(n), unit, name

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:  # [n]
    return np.array([-repeated_ngram_share(completion_units(ep, self.unit), self.n)
                     for ep in episodes], np.float64)


@gin.configurable(module="harness")
class BehaviourBonus:
  """A hook: reads a float from `episode.info[key]` (SWE behaviour bonuses, judge scores).

  Whatever produced the number (a behaviour analyzer, an instruction-following judge)
  writes it into `info` before the harness runs; this part only weighs it in.

  Args:
    key: the `info` key.
    default: value when the key is absent; None makes an absent key an error.
    scale: multiplies the value.
    name: the part's name (default: `key`).
  """

  def __init__(self, key: str, default: Optional[float] = 0.0, scale: float = 1.0,
               name: Optional[str] = None):
    self.key, self.default, self.scale = key, default, float(scale)
    self.name = name or key

  def __call__(self, episodes: Sequence[Episode]) -> np.ndarray:  # [n]
    out = np.empty(len(episodes), np.float64)
    for i, ep in enumerate(episodes):
      value = ep.info.get(self.key, self.default)
      if value is None:
        raise KeyError(f"BehaviourBonus: episode {ep.episode_id!r} has no info[{self.key!r}] "
                       f"and default=None; info has {sorted(ep.info)}")
      try:
        out[i] = self.scale * float(value)
      except (TypeError, ValueError):
        raise ValueError(f"BehaviourBonus: info[{self.key!r}] of episode {ep.episode_id!r} "
                         f"is {value!r}, not a number") from None
    return out


@dataclasses.dataclass(frozen=True)
class Composed:
  """What the composer returns."""

  rewards: np.ndarray  # [n] float32 composed reward (0 where quarantined)
  parts: dict  # {name: [n] float64}: every component and weighted task part
  quarantine: FilterResult  # keep=False where a weighted part was not finite


@gin.configurable(module="harness")
class RewardComposer:
  """Composed reward = clip(sum_k w_k * part_k) over named parts.

  Args:
    parts: {name: weight}. A name is a component's name or a task part in
      `episode.reward_parts` (default {'correct': 1.0}: binary correctness).
    components: harness parts to compute (see the module docstring); each one's values
      are written into `episode.reward_parts[name]`.
    clip: (lo, hi) bounds of the composed reward, or None.
  """

  def __init__(self, parts: Optional[dict] = None, components: Sequence[Callable] = (),
               clip: Optional[Sequence[float]] = None):
    self.parts = {str(k): float(v) for k, v in (parts or {"correct": 1.0}).items()}
    for k, w in self.parts.items():
      if not math.isfinite(w):
        raise ValueError(f"RewardComposer.parts[{k!r}] = {w}; weights must be finite")
    self.components = list(components)
    names = [part_name(c) for c in self.components]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
      raise ValueError(f"RewardComposer.components: duplicate part names {dupes}")
    self.clip = None if clip is None else (float(clip[0]), float(clip[1]))
    if self.clip is not None and not self.clip[0] < self.clip[1]:
      raise ValueError(f"RewardComposer.clip = {clip}; expected (lo, hi) with lo < hi")

  @property
  def names(self) -> list:
    """Every part this composer computes: components, then weighted task parts."""
    comp = [part_name(c) for c in self.components]
    return comp + [k for k in self.parts if k not in comp]

  def __call__(self, episodes: Sequence[Episode]) -> Composed:
    n = len(episodes)
    values = {}
    for comp in self.components:
      name = part_name(comp)
      out = comp(episodes)
      try:
        v = np.asarray(out, np.float64)
      except (TypeError, ValueError) as e:
        raise ValueError(f"reward part {name!r} ({type(comp).__name__}) returned "
                         f"non-numbers: {e}") from None
      if v.shape != (n,):
        raise ValueError(f"reward part {name!r} ({type(comp).__name__}) returned shape "
                         f"{v.shape} for {n} episodes; expected ({n},)")
      values[name] = v
      for ep, x in zip(episodes, v):
        ep.reward_parts[name] = float(x)
    for name in self.parts:
      if name not in values:
        values[name] = TaskPart(name)(episodes)

    keep = np.ones(n, bool)
    reasons: list = [None] * n
    total = np.zeros(n, np.float64)
    for name, w in self.parts.items():
      if w == 0.0:  # listed for the record only: cannot poison the sum
        continue
      v = values[name]
      bad = ~np.isfinite(v)
      for i in np.flatnonzero(bad & keep):
        reasons[i] = f"reward part {name} returned {v[i]}"
      keep &= ~bad
      total += w * np.where(bad, 0.0, v)
    total = np.where(keep, total, 0.0)
    if self.clip is not None:
      total = np.clip(total, *self.clip)
    # episode.reward holds exactly the float32 value the advantages are computed from.
    rewards = total.astype(np.float32)
    for ep, r in zip(episodes, rewards):
      ep.reward = float(r)
    return Composed(rewards=rewards, parts=values,
                    quarantine=FilterResult(keep=keep, reasons=tuple(reasons)))
