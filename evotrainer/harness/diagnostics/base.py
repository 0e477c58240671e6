"""The shared parts of the diagnostic library (__init__.py): metric functions and wiring.

Pure metric functions over episodes (`rewards_of`, `lengths_of`, `pearson`, `is_dead`,
`has_loop`, `learner_metric`), reused by the validators; `ThresholdDiagnostic`, the base
of every library diagnostic (threshold, direction, severity, and a Finding when a value
crosses); and `evidence_of`, which picks the `(episode_id, snippet)` pairs a Finding
carries.
"""

from __future__ import annotations

import collections
import itertools
from typing import Callable, Optional, Sequence, Union

import numpy as np

from evotrainer.harness.base import Report, snippet
from evotrainer.tasks.answers import MAX_TEXT_CHARS
from evotrainer.types import Episode, Finding

DIRECTIONS = ("above", "below")
EPS = 1e-9  # slack for float round-off in threshold comparisons and zero tests

# ------------------------------------------------------------------ pure metric functions


def rewards_of(episodes: Sequence[Episode], key: Optional[str] = None) -> np.ndarray:
  """[n] the composed reward (`key=None`) or the reward part `key` of each episode."""
  if key is None:
    return np.array([ep.reward for ep in episodes], np.float64)
  return np.array([float(ep.reward_parts.get(key, np.nan)) for ep in episodes], np.float64)


def lengths_of(episodes: Sequence[Episode]) -> np.ndarray:
  """[n] completion lengths: tokens when every episode has `completion_ids`, else words."""
  if all(ep.completion_ids is not None for ep in episodes):
    return np.array([ep.length for ep in episodes], np.float64)
  return np.array([len(ep.completion.split()) for ep in episodes], np.float64)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
  """Pearson correlation of two [n] arrays; NaN when either does not vary."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  dx, dy = x - x.mean(), y - y.mean()
  den = np.sqrt((dx * dx).sum() * (dy * dy).sum())
  return float((dx * dy).sum() / den) if den > EPS else float("nan")


def is_dead(rewards: np.ndarray, atol: float = EPS) -> bool:
  """A group is dead when its rewards have zero variance (GRPO advantages all zero)."""
  return bool(np.ptp(rewards) <= atol)


def has_loop(text: str, n: int = 8, min_repeats: int = 4) -> bool:
  """Whether some word n-gram occurs `min_repeats` times or more (an echo-trap loop).

  Words are whitespace-separated; independent of the tokenizer and of the filters. Only
  the last `MAX_TEXT_CHARS` characters of a longer text are read (a cost bound).
  """
  words = text[-MAX_TEXT_CHARS:].split()
  counts = collections.Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
  return bool(counts) and max(counts.values()) >= min_repeats


def learner_metric(context: dict, key: str) -> Optional[float]:
  """A learner metric from `context['learner'][key]` or `context['learner/' + key]`."""
  value = (context.get("learner") or {}).get(key, context.get(f"learner/{key}"))
  return None if value is None else float(np.asarray(value))


class ThresholdDiagnostic:
  """Threshold, direction, evidence size and severity shared by every diagnostic (the
  `base.Diagnostic` protocol: subclasses set `name`, `layer` and `__call__`)."""

  name = ""
  layer = ""

  def __init__(self, threshold: Optional[float], direction: str = "above",
               max_evidence: int = 5, severity: float = 0.5):
    if direction not in DIRECTIONS:
      raise ValueError(f"{type(self).__name__}.direction={direction!r}; "
                       f"expected one of {DIRECTIONS}")
    if not 0.0 <= severity <= 1.0:
      raise ValueError(f"{type(self).__name__}.severity={severity}; expected 0..1")
    self.threshold = threshold
    self.direction = direction
    self.max_evidence = max_evidence
    self.severity = severity

  def crossed(self, value: Optional[float]) -> bool:
    """Strictly beyond the threshold in `direction` (NaN and None never cross)."""
    if self.threshold is None or value is None or np.isnan(value):
      return False
    if self.direction == "above":
      return value > self.threshold + EPS
    return value < self.threshold - EPS

  def finding(self, value: float, message: str, evidence=(), severity=None) -> Finding:
    return Finding(kind=self.name, layer=self.layer,
                   severity=self.severity if severity is None else severity,
                   value=float(value), threshold=float(self.threshold), message=message,
                   evidence=tuple(itertools.islice(evidence, self.max_evidence)))

  def report(self, metrics: dict, value: Optional[float],
             message: Union[str, Callable[[], str]],
             evidence: Callable[[], Sequence] = tuple) -> Report:
    """`metrics`, plus a finding when `value` crosses; a callable message and the
    evidence are built only then (a message may format a value that can be None)."""
    if not self.crossed(value):
      return Report(metrics)
    text = message() if callable(message) else message
    return Report(metrics, (self.finding(value, text, evidence()),))

  def __repr__(self) -> str:
    return f"{type(self).__name__}(threshold={self.threshold}, direction={self.direction!r})"


def evidence_of(episodes: Sequence[Episode], order: Sequence[int], note=None,
                tail=False):
  """Yields (episode_id, snippet) for episodes[i], i in order; `note(ep)` prefixes the
  text, `tail` shows the end (loops and truncations show there). Snippets are short and
  `printable` whatever the completion. Lazy: `finding` takes only the first
  `max_evidence`."""
  for i in order:
    ep = episodes[int(i)]
    text = snippet(ep.completion, tail=tail)
    yield ep.episode_id, (f"[{note(ep)}] {text}" if note else text)


__all__ = ["DIRECTIONS", "EPS", "ThresholdDiagnostic", "evidence_of", "has_loop", "is_dead",
           "learner_metric", "lengths_of", "pearson", "rewards_of"]
