"""`Problem`, the record every task hands out, and the `Task` protocol.

A problem crosses from the task (host) into prompt building and back into scoring, so it
is a frozen record, not a dict. Reward *parts* are returned by the task; composing them
into one reward is the harness's job (a reward shaper), not the task's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import random
import re
from typing import (Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence,
                    runtime_checkable)

log = logging.getLogger(__name__)


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


class TurnEnv(Protocol):
  """One episode's environment on the host: it reads model turns and answers with
  observations until it stops (`rollouts.multiturn.MultiTurnEngine` drives it).

  Attributes:
    stop: None while the episode runs; else why the environment ended it ('submitted',
      'max_turns', 'tool_error', 'echo_trap', ...). The rollout engine adds its own
      budget stops (`rollouts.multiturn.STOPS`) without setting this field.
  """

  stop: Optional[str]

  @property
  def done(self) -> bool:
    """True once the episode stopped (`stop is not None`)."""
    ...

  def step(self, text: str) -> str:
    """Takes one model turn's text (its stop token cut) and returns the observation
    text. Model text never makes it raise: a bad call is an observation. (A raise is
    still contained by the engine: the episode stops 'tool_error'.)"""
    ...

  def info(self) -> dict:
    """JSON-serializable record of the episode for `Episode.info` (tool calls, turns,
    stop, ...)."""
    ...


@runtime_checkable
class MultiTurnTask(Task, Protocol):
  """A task whose episodes alternate model turns and environment observations.

  The trainer uses `rollouts.multiturn.MultiTurnEngine` for a task whose `multi_turn`
  attribute is True; `score` / `score_many` are then not called by the rollout (grading
  happens in `finish_episodes`).
  """

  multi_turn: bool  # True
  # A task may also carry `max_turns`, its environment's own turn budget (absent or None:
  # none); the engine refuses to run when it differs from `TurnBudget.max_turns`.
  # And `end_of_turn`: the text that closes a model turn cut at the engine's token budget
  # (no stop id sampled) before its observation; absent: "".

  def start_episode(self, problem: Problem) -> TurnEnv:
    """A fresh environment for one episode of `problem`."""
    ...

  def format_observation(self, observation: str) -> str:
    """The text appended after a model turn: the observation in the chat template,
    including the cue that opens the next model turn."""
    ...

  def finish_episodes(self, problems: Sequence[Problem],
                      envs: Sequence[TurnEnv]) -> list[dict]:
    """Reward parts of every finished episode (the grading), one dict per env with the
    same keys for every call; releases the environments' resources."""
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


def check_task_args(who: str, sources: tuple, jsonl_files: Sequence[str], difficulty: int,
                    weights: Optional[Sequence[float]], num_validation: int, num_test: int,
                    prompt_template: str) -> tuple:
  """Checks a task's common constructor arguments (raising ValueError naming the
  binding `who.<arg>`); returns the weights as floats, uniform when None."""
  if ("jsonl" in sources) != bool(jsonl_files):
    raise ValueError(f"{who}: list 'jsonl' in {who}.sources exactly when "
                     f"{who}.jsonl_files is set")
  if difficulty not in (1, 2, 3):
    raise ValueError(f"{who}.difficulty must be 1, 2 or 3, got {difficulty!r}")
  weights = tuple(float(w) for w in (weights or [1.0] * len(sources)))
  if len(weights) != len(sources) or min(weights) < 0 or sum(weights) <= 0:
    raise ValueError(f"{who}.weights={weights} must be {len(sources)} non-negative "
                     f"numbers (one per source in {sources}) with a positive sum")
  for name, n in (("num_validation", num_validation), ("num_test", num_test)):
    if not isinstance(n, int) or n < 1:
      raise ValueError(f"{who}.{name} must be a positive integer, got {n!r}")
  try:
    prompt_template.format(question="")
  except (KeyError, IndexError, ValueError) as e:
    raise ValueError(f"{who}.prompt_template must be a str.format template whose "
                     f"only field is {{question}}: {prompt_template!r} ({e!r})") from None
  return weights


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


# ------------------------------------------------------------------ split sources

# Validation and test problems of a procedural source come from keys [0, HELDOUT_KEYS)
# (those whose prompt hashes to their split); training keys are drawn above.
HELDOUT_KEYS = 1_000_000
MAX_KEY = 2**31 - 1
HELDOUT_SEED = 20240601  # slot → source assignment of a held-out set; never the run seed
MAX_REDRAWS = 1000  # consecutive unusable draws before a source is declared too small


class Source(Protocol):
  """Where a task's problems come from (a generator or files), split by prompt hash."""

  name: str

  def heldout_iter(self, split: str) -> Iterator[Problem]:
    """The problems of a held-out split, in a fixed order."""
    ...

  def sample_train(self, rng: random.Random) -> Optional[Problem]:
    """A candidate training problem (None: unusable; the caller draws again)."""
    ...


class ProceduralSource:
  """Keys [0, HELDOUT_KEYS) in order for held-out; random keys above for training.

  Args:
    name: the source's name.
    make: key -> Problem, or None when the key gives no usable problem.
    fractions: (validation_fraction, test_fraction) of `split_of`.
  """

  def __init__(self, name: str, make: Callable[[int], Optional[Problem]],
               fractions: tuple[float, float]):
    self.name, self.make, self.fractions = name, make, fractions

  def heldout_iter(self, split: str) -> Iterator[Problem]:
    """The problems of keys [0, HELDOUT_KEYS) whose prompt hashes to `split`, in order."""
    for key in range(HELDOUT_KEYS):
      p = self.make(key)
      if p is not None and split_of(p.prompt, *self.fractions) == split:
        yield p

  def sample_train(self, rng: random.Random) -> Optional[Problem]:
    return self.make(rng.randrange(HELDOUT_KEYS, MAX_KEY))


def heldout_set(sources: Sequence[Source], weights: Sequence[float], split: str,
                size: int, who: str) -> list[Problem]:
  """The fixed list of a held-out split: `size` slots assigned to sources by a fixed
  seed, each filled with the source's next prompt of that split not seen yet (fewer
  when the sources run out, logged)."""
  if split not in HELDOUT_SPLITS:
    raise ValueError(f"held-out split must be one of {HELDOUT_SPLITS}, got {split!r}")
  slots = random.Random(f"{HELDOUT_SEED}:{split}").choices(
      range(len(sources)), weights=weights, k=size)
  iters = [s.heldout_iter(split) for s in sources]
  live = [True] * len(iters)
  out, seen = [], set()
  for s in slots:
    misses = 0
    while live[s] and misses < MAX_REDRAWS:
      p = next(iters[s], None)
      if p is None:
        live[s] = False
      elif normalize_prompt(p.prompt) in seen:
        misses += 1
      else:
        seen.add(normalize_prompt(p.prompt))
        out.append(p)
        break
    else:
      live[s] = False
  if len(out) < size:
    # Expected for finite files; for a generator it means a tiny problem space.
    ran_out = [s.name for s, ok in zip(sources, live) if not ok]
    level = logging.INFO if all(n == "jsonl" for n in ran_out) else logging.WARNING
    log.log(level, "%s: %s set has %d problems, fewer than num_%s=%d (%s ran out of "
            "distinct problems)", who, split, len(out), split, size, ran_out)
  return out


def train_draws(sources: Sequence[Source], weights: Sequence[float], n: int, seed: int,
                fractions: tuple[float, float], who: str) -> list[Problem]:
  """`n` training problems drawn by `seed` (deterministic); none is validation or test."""
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    (src,) = rng.choices(sources, weights=weights)
    for _ in range(MAX_REDRAWS):
      p = src.sample_train(rng)
      if p is not None and split_of(p.prompt, *fractions) == "train":
        out.append(p)
        break
    else:
      raise RuntimeError(
          f"{who}: {MAX_REDRAWS} training draws in a row from source {src.name!r} were "
          f"validation, test or invalid problems; its problem space is too small (raise "
          f"difficulty or lower validation_fraction / test_fraction)")
  return out


def take_heldout(held: list[Problem], n: Optional[int], split: str, full: bool,
                 who: str) -> list[Problem]:
  """The first `n` (all when None) of a held-out set; an error naming the fix when the
  set is shorter (`full`: it has its configured size, so raising that size helps)."""
  if n is not None and n > len(held):
    more = (f"raise {who}.num_{split}" if full else
            f"the sources have no more distinct {split} prompts: add data or raise "
            f"{who}.{split}_fraction")
    raise ValueError(f"asked for {n} {split} problems but the {split} split has "
                     f"{len(held)}; {more}")
  return list(held if n is None else held[:n])


# ------------------------------------------------------------------ JSONL files


class BadRow(Exception):
  """A JSONL row that cannot be used; the message says what is wrong with it."""


# Rows longer than this are refused before parsing (a 40 MB line once led to a 143 GiB
# allocation when tokenized and padded): `MathTask.max_row_chars`, `CodeTask`'s likewise.
MAX_ROW_CHARS = 100_000


class JsonlFile:
  """The usable problems of one JSONL file and the rows that were not.

  Attributes:
    path: the file.
    problems: parsed problems, in file order.
    bad_rows: `"file:line: what is wrong"` for every skipped row.
  """

  def __init__(self, path: pathlib.Path, problems: list[Problem], bad_rows: list[str]):
    self.path, self.problems, self.bad_rows = path, problems, bad_rows


def json_object(line: str) -> dict:
  """A JSONL row's object; raises BadRow when it is not valid JSON or not an object."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as e:
    raise BadRow(f"not valid JSON ({e.msg} at column {e.colno})") from None
  if not isinstance(row, dict):
    raise BadRow(f"expected a JSON object, got {type(row).__name__}")
  return row


def check_on_bad_row(on_bad_row: str) -> None:
  if on_bad_row not in ("skip", "error"):
    raise ValueError(f"on_bad_row must be 'skip' or 'error', got {on_bad_row!r}")


def bad_row(where: str, on_bad_row: str, bad: list) -> None:
  """Raises for `where` (`file:line: reason`) under 'error'; logs and records it under
  'skip'."""
  if on_bad_row == "error":
    raise DataError(f"malformed row {where} (on_bad_row='error')") from None
  log.warning("skipping malformed row %s", where)
  bad.append(where)


def read_jsonl(path: str | pathlib.Path,
               parse_row: Callable[[str, pathlib.Path, int], Problem],
               on_bad_row: str = "skip", what: str = "", *,
               max_row_chars: int = MAX_ROW_CHARS, who: str = "the task") -> JsonlFile:
  """Reads a JSONL file of problems, one `parse_row(line, path, lineno)` a row.

  Args:
    path: the file. Blank lines are ignored.
    parse_row: a row's text -> Problem; raises `BadRow` saying what is wrong.
    on_bad_row: "skip" logs each malformed row as `file:line: reason` and counts it in
      `bad_rows`; "error" raises ValueError at the first one.
    what: the domain, for the not-found message ("math", "code").
    max_row_chars: a longer row is malformed (skipped or an error, as above), unparsed.
    who: the task whose `max_row_chars` knob the message names.

  Raises:
    FileNotFoundError: no such file.
    DataError: a malformed row under "error", or no usable row at all.
  """
  check_on_bad_row(on_bad_row)
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{what} JSONL file not found: {path}".lstrip())
  problems, bad = [], []
  with path.open(encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        if len(line) > max_row_chars:
          raise BadRow(f"row of {len(line)} characters, over {who}.max_row_chars="
                       f"{max_row_chars}")
        problems.append(parse_row(line, path, lineno))
      except BadRow as e:
        bad_row(f"{path}:{lineno}: {e}", on_bad_row, bad)
  if not problems:
    raise DataError(f"{path}: no usable problems ({len(bad)} malformed row(s) skipped"
                     f"{', first: ' + bad[0] if bad else '; the file is empty'})")
  if bad:
    log.warning("%s: skipped %d malformed row(s) of %d", path, len(bad),
                len(bad) + len(problems))
  return JsonlFile(path, problems, bad)


class JsonlSource:
  """Problems from files, split by prompt hash; `test_files` rows are all test.

  Args:
    files, test_files: JSONL files; a `files` row whose prompt is in `test_files` is
      dropped.
    fractions: (validation_fraction, test_fraction) of `split_of`.
    on_bad_row: see `read_jsonl`.
    load: (path, on_bad_row) -> JsonlFile, the domain's reader.
    who: the task, for messages.
  """

  name = "jsonl"

  def __init__(self, files: Sequence[str], test_files: Sequence[str],
               fractions: tuple[float, float], on_bad_row: str,
               load: Callable[[str, str], JsonlFile], who: str):
    loaded = [load(f, on_bad_row) for f in files]
    test_loaded = [load(f, on_bad_row) for f in test_files]
    self.bad_rows = [b for f in loaded + test_loaded for b in f.bad_rows]
    rows = [p for f in loaded for p in f.problems]
    extra_test = [p for f in test_loaded for p in f.problems]
    in_test_files = {normalize_prompt(p.prompt) for p in extra_test}
    kept = [p for p in rows if normalize_prompt(p.prompt) not in in_test_files]
    if len(kept) < len(rows):
      log.info("jsonl: dropped %d row(s) whose prompt is in the test files",
               len(rows) - len(kept))
    side = [split_of(p.prompt, *fractions) for p in kept]
    self.splits = {name: [p for p, s in zip(kept, side) if s == name]
                   for name in ("train", "validation")}
    self.splits["test"] = [p for p, s in zip(kept, side) if s == "test"] + extra_test
    self.train = self.splits["train"]
    if not self.train:
      raise DataError(f"{who}: no training problems left in {list(files)} after "
                       f"setting aside {len(self.splits['validation'])} validation and "
                       f"{len(self.splits['test'])} test problem(s)")

  def heldout_iter(self, split: str) -> Iterator[Problem]:
    return iter(self.splits[split])

  def sample_train(self, rng: random.Random) -> Optional[Problem]:
    return self.train[rng.randrange(len(self.train))]
