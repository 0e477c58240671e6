"""`Problem`, the record every task hands out, and the `Task` protocol.

A problem crosses from the task (host) into prompt building and back into scoring, so it
is a frozen record, not a dict. Reward *parts* are returned by the task; composing them
into one reward is the harness's job (a reward shaper), not the task's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable


class DataError(ValueError):
  """A task's data cannot be used as configured; the message names the file:line or the
  knob, and what to do."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem of a task.

  Attributes:
    id: stable identifier, unique within a task, e.g. `chain_sum/d2/1000123` or
      `gsm8k_test.jsonl:17` (file name and line).
    prompt: the question text alone; `Task.format_prompt` adds the instructions.
    answer: the gold answer as a string (`"19"`, `"\\frac{1}{2}"`).
    solution: a worked solution that ends with the answer in the format the prompt asks
      for; used for a supervised warm start. May be just the formatted answer.
    source: which generator or file the problem came from (`"basic_arithmetic"`,
      `"gsm8k"`, `"math"`, ...).
    difficulty: the difficulty level it was generated at (1..3 for procedural sources,
      the MATH level 1..5 for MATH JSONL, 0 when unknown).
    meta: anything else the source knows (expression, file and line, template id).
  """

  id: str
  prompt: str
  answer: str
  solution: str
  source: str
  difficulty: int = 0
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
  """What the trainer needs from a domain.

  `score` returns reward parts, each a float: at least `"correct"` (0/1) and `"format"`
  (0/1); optionally `"partial"` in [0, 1] and diagnostics such as `"n_candidates"`.
  Every call returns the same keys for a given task, so parts stack into arrays.
  """

  def train_problems(self, n: int, seed: int) -> list[Problem]:
    """`n` training problems, a deterministic function of `seed`; never held-out ones."""
    ...

  def heldout_problems(self, n: Optional[int] = None,
                       split: str = "validation") -> list[Problem]:
    """The first `n` (all when None) problems of a fixed held-out split: 'validation'
    (what training, the controller and every gate read) or 'test' (reported only)."""
    ...

  def score(self, problem: Problem, completion: str) -> dict[str, float]:
    """Reward parts of one completion (the model's text after the prompt)."""
    ...

  def score_many(self, problems: Sequence[Problem],
                 completions: Sequence[str]) -> list[dict[str, float]]:
    """`score` over a batch; tasks batch their verifier calls here."""
    ...

  def format_prompt(self, problem: Problem) -> str:
    """The text the policy sees: the question plus the answer-format instruction."""
    ...


_SPACE = re.compile(r"\s+")

SPLITS = ("train", "validation", "test")
HELDOUT_SPLITS = ("validation", "test")


def normalize_prompt(text: str) -> str:
  """The form prompts are compared in for de-duplication: case and spacing ignored."""
  return _SPACE.sub(" ", text).strip().lower()


def _hash_unit(text: str) -> float:
  """A stable value in [0, 1) from text (not Python's salted `hash`)."""
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def split_of(prompt: str, validation_fraction: float, test_fraction: float) -> str:
  """The split a prompt belongs to, by a stable hash of its normalized text.

  Train, validation and test are disjoint by construction for every source, procedural
  ones included: a prompt that hashes to validation or test is never trained on, however
  it was generated, and duplicates (up to case and spacing) always land together.
  """
  u = _hash_unit(normalize_prompt(prompt))
  if u < test_fraction:
    return "test"
  if u < test_fraction + validation_fraction:
    return "validation"
  return "train"


def check_fractions(validation_fraction: float, test_fraction: float, who: str) -> None:
  """Raises ValueError unless both are in (0, 1) and leave room for training."""
  for name, f in (("validation_fraction", validation_fraction),
                  ("test_fraction", test_fraction)):
    if not 0.0 < f < 1.0:
      raise ValueError(f"{who}.{name} must be in (0, 1), got {f}")
  if validation_fraction + test_fraction >= 0.9:
    raise ValueError(f"{who}: validation_fraction + test_fraction = "
                     f"{validation_fraction + test_fraction} leaves under 10% of the "
                     f"prompts for training")


def check_disjoint(train: Sequence[Problem], heldout: Sequence[Problem]) -> None:
  """Raises ValueError if any training prompt equals a held-out prompt (normalized).

  Held-out scores are only meaningful if the policy never trained on those questions;
  this is the check a run makes before trusting its eval numbers.
  """
  held = {normalize_prompt(p.prompt): p for p in heldout}
  overlap = [(p, held[normalize_prompt(p.prompt)]) for p in train
             if normalize_prompt(p.prompt) in held]
  if overlap:
    shown = "; ".join(f"train {a.id!r} == held-out {b.id!r}: {a.prompt[:60]!r}"
                      for a, b in overlap[:3])
    raise ValueError(f"{len(overlap)} training problem(s) also appear in the held-out "
                     f"split: {shown}")
