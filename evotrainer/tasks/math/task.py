"""`MathTask`: math problems from procedural generators and local JSONL, scored by answer.

Sources (named in `MathTask.sources`):
  tiny_arithmetic    built in: `"12+7="` style problems with short integer answers, for
                     tiny models trained from scratch on the CPU.
  basic_arithmetic, chain_sum, simple_equations, gsm_symbolic
                     reasoning-gym generators; `difficulty` 1..3 picks their knobs
                     (`_RG_LEVELS`; gsm_symbolic: templates ranked by solution steps).
  jsonl              local files in GSM8K form (`question`, `answer` ending `#### N`) or
                     MATH form (`problem`, `solution` with `\\boxed{}`, optional `answer`).

Splits: train, validation (what training's periodic evaluation, the evolution's
controller, its diagnostics, validators and sweeps read) and test (reported only). Every
prompt belongs to one split by a stable hash of its normalized text (`base.split_of`,
shares `validation_fraction` / `test_fraction`), for procedural sources as for files, so
a test problem is never trained on however often a small problem space repeats it. The
validation and test sets are the first `num_validation` / `num_test` distinct prompts of
their split (procedural keys below `HELDOUT_KEYS`, in order; training draws keys above
it); rows of `test_jsonl_files` are test problems, and a training-file row with the same
prompt is dropped. The held-out sets depend only on the task config, never on the seed.

Generation cost here (per problem, one CPU core, gold check included): tiny_arithmetic
≈0.02 ms, chain_sum / basic_arithmetic / gsm_symbolic 0.02–0.05 ms, simple_equations
≈0.4–0.55 ms (sympy); the first reasoning-gym use imports the package (≈1 s). Cheap
enough to generate on demand, so nothing is pre-generated; the held-out set is built
once per task and cached.
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
import random
import re
from fractions import Fraction
from typing import Optional, Sequence

import gin

from evotrainer.tasks.answers import (METHODS, answer_tag, boxed_contents, count_candidates,
                                      extract_answer, fast_verdict, numbers_in, parse_number,
                                      too_long)
from evotrainer.tasks.base import (HELDOUT_KEYS, MAX_ROW_CHARS, BadRow, DataError,
                                   JsonlFile, JsonlSource, ProceduralSource, Problem,
                                   check_disjoint, check_fractions, check_task_args,
                                   heldout_set, json_object, read_jsonl, split_of,
                                   train_draws)
from evotrainer.tasks.chat import chat_tokenizer, user_turn
from evotrainer.tasks.math import canaries
from evotrainer.tasks.math.calculator import TURN_END_TEXTS, CalculatorEnv, exact_value
from evotrainer.tasks.math.verify import VerifierPool

log = logging.getLogger(__name__)

__all__ = ["MathTask", "check_disjoint", "load_jsonl", "JsonlFile", "procedural_problem",
           "PROCEDURAL_SOURCES", "HELDOUT_KEYS", "DEFAULT_TEMPLATE"]


DEFAULT_TEMPLATE = "{question}\nGive the final answer inside <answer></answer> tags."

# difficulty → reasoning-gym config knobs. Level 1 is one-step problems with small
# numbers; level 3 is near each generator's defaults.
_RG_LEVELS = {
    "basic_arithmetic": {
        1: dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=("+", "-"),
                allow_negation=False),
        2: dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2,
                operators=("+", "-", "*")),
        3: dict(min_terms=3, max_terms=5, min_digits=1, max_digits=3,
                operators=("+", "-", "*", "/")),
    },
    "chain_sum": {
        1: dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1),
        2: dict(min_terms=3, max_terms=4, min_digits=1, max_digits=2),
        3: dict(min_terms=4, max_terms=6, min_digits=2, max_digits=3, allow_negation=True),
    },
    "simple_equations": {
        1: dict(min_terms=2, max_terms=2, min_value=1, max_value=10, operators=("+", "-"),
                operators_weights=[0.5, 0.5]),
        2: dict(min_terms=2, max_terms=3, min_value=1, max_value=50),
        3: dict(min_terms=3, max_terms=4, min_value=1, max_value=100),
    },
    "gsm_symbolic": {1: {}, 2: {}, 3: {}},  # difficulty picks templates (_gsm_tiers)
}
PROCEDURAL_SOURCES = ("tiny_arithmetic",) + tuple(_RG_LEVELS)
_GSM_SUFFIX = " Give the result as your final answer. Do not include units."


# ------------------------------------------------------------------ procedural problems

def _answer_checks(name: str, item: dict) -> bool:
  """Whether a reasoning-gym item's gold answer is right, checked without its code."""
  meta = item["metadata"]
  try:
    gold = Fraction(item["answer"])
    if name in ("basic_arithmetic", "chain_sum"):
      return exact_value(meta["expression"]) == gold
    if name == "simple_equations":
      lhs, rhs = meta["equation"].split("=")
      var = re.compile(rf"\b{meta['variable']}\b")
      sub = lambda side: exact_value(var.sub(f"({gold})", side))  # noqa: E731
      return sub(lhs) == sub(rhs)
    return parse_number(item["answer"]) is not None
  except (ValueError, ZeroDivisionError, KeyError, SyntaxError):
    return False


@functools.lru_cache(maxsize=None)
def _rg_dataset(name: str, difficulty: int):
  import reasoning_gym  # pylint: disable=import-outside-toplevel  (≈1.2 s import)
  return reasoning_gym.create_dataset(name, seed=0, size=1, **_RG_LEVELS[name][difficulty])


@functools.lru_cache(maxsize=None)
def _gsm_tiers() -> tuple[tuple[int, ...], ...]:
  """gsm_symbolic templates split in three tiers by the steps of their worked solution.

  The generator itself has one difficulty; templates differ a lot (2 to 18 steps).
  """
  # pylint: disable-next=import-outside-toplevel
  from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import tasks_ok
  generators = _rg_dataset("gsm_symbolic", 1).generators

  def cost(t: int) -> tuple[float, float]:
    cots = [generators[t](random.Random(s), 1.0)["metadata"]["answer_cot"] for s in range(4)]
    return sum(c.count("\n") for c in cots) / 4, sum(len(c) for c in cots) / 4

  ranked = sorted(tasks_ok, key=lambda t: (cost(t), t))
  k = len(ranked) // 3
  return tuple(ranked[:k]), tuple(ranked[k:2 * k]), tuple(ranked[2 * k:])


def _tiny_arithmetic(key: int, difficulty: int) -> tuple[str, str, str]:
  """(question, answer, expression): 1: a+b; 2: a+b or a-b ≥ 0; 3: a±b±c; a, b, c < 100."""
  rng = random.Random(f"tiny_arithmetic:{difficulty}:{key}")
  a, b, c = (rng.randint(0, 99) for _ in range(3))
  if difficulty == 1:
    expr = f"{a}+{b}"
  elif difficulty == 2:
    expr = f"{a}+{b}" if rng.random() < 0.5 else f"{max(a, b)}-{min(a, b)}"
  else:
    expr = f"{a}{rng.choice('+-')}{b}{rng.choice('+-')}{c}"
  return f"{expr}=", str(exact_value(expr)), expr


def procedural_problem(name: str, difficulty: int, key: int) -> Optional[Problem]:
  """The problem of a procedural source at `key`, or None if its gold fails our check.

  A pure function of its arguments (reasoning-gym datasets are built with seed 0 and
  item `key` is generated from `Random(key)`).
  """
  pid = f"{name}/d{difficulty}/{key}"
  if name == "tiny_arithmetic":
    question, answer, expr = _tiny_arithmetic(key, difficulty)
    return Problem(pid, question, answer, answer_tag(answer), name, difficulty,
                   {"expression": expr, "key": key})
  if name == "gsm_symbolic":
    template = random.Random(f"gsm:{difficulty}:{key}").choice(_gsm_tiers()[difficulty - 1])
    item = _rg_dataset(name, 1).generators[template](random.Random(key), 1.0)
    item["question"] += _GSM_SUFFIX
  else:
    item = _rg_dataset(name, difficulty)[key]
  if not _answer_checks(name, item):
    return None
  answer, meta = item["answer"], item["metadata"]
  if name == "gsm_symbolic":
    steps = re.sub(r"\n?####[^\n]*$", "", meta["answer_cot"].strip())
    solution = f"{steps}\n{answer_tag(answer)}"
    extra = {"template": template}
  elif name == "simple_equations":
    solution = f"{meta['variable']} = {answer}\n{answer_tag(answer)}"
    extra = {"equation": meta["equation"]}
  else:
    solution = f"{meta['expression']} = {answer}\n{answer_tag(answer)}"
    extra = {"expression": meta["expression"]}
  return Problem(pid, item["question"], answer, solution, name, difficulty,
                 {"key": key, **extra})



# ------------------------------------------------------------------ JSONL files


def _parse_row(line: str, path: pathlib.Path, lineno: int) -> Problem:
  """One JSONL row in GSM8K or MATH form → Problem; raises BadRow saying what is wrong."""
  row = json_object(line)

  def text(field: str) -> str:
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
      raise BadRow(f"field {field!r} must be a non-empty string, got {value!r:.60}")
    return value.strip()

  pid, meta = f"{path.name}:{lineno}", {"file": str(path), "line": lineno}
  if "question" in row:  # GSM8K: answer = worked solution ending in "#### N"
    question, full = text("question"), text("answer")
    if "####" not in full:
      raise BadRow("GSM8K row: 'answer' must end with '#### <final answer>'")
    steps, _, gold = full.rpartition("####")
    gold = gold.strip()
    if not gold:
      raise BadRow("GSM8K row: nothing after '####' in 'answer'")
    if parse_number(gold) is not None:
      gold = gold.replace(",", "")
    steps = re.sub(r"<<[^>]*>>", "", steps).strip()  # calculator annotations
    solution = f"{steps}\n{answer_tag(gold)}" if steps else answer_tag(gold)
    return Problem(pid, question, gold, solution, "gsm8k", 0, meta)
  if "problem" in row:  # MATH: solution with \boxed{answer}; optional explicit answer
    question = text("problem")
    steps = row.get("solution") if isinstance(row.get("solution"), str) else ""
    if row.get("answer") is not None:
      gold = text("answer")
    else:
      boxes = boxed_contents(steps)
      if not boxes or not boxes[-1].strip():
        raise BadRow("MATH row: no \\boxed{...} answer in 'solution' and no 'answer' field")
      gold = boxes[-1].strip()
    level = re.search(r"\d+", str(row.get("level", "")))
    solution = f"{steps.strip()}\n{answer_tag(gold)}" if steps.strip() else answer_tag(gold)
    if row.get("type"):
      meta["type"] = row["type"]
    return Problem(pid, question, gold, solution, "math", int(level.group()) if level else 0,
                   meta)
  raise BadRow(f"expected GSM8K fields ('question', 'answer') or MATH fields ('problem', "
                f"'solution'); got keys {sorted(row)[:8]}")


def load_jsonl(path: str | pathlib.Path, on_bad_row: str = "skip",
               max_row_chars: int = MAX_ROW_CHARS) -> JsonlFile:
  """Reads a GSM8K- or MATH-form JSONL file (the form is detected per row); see
  `base.read_jsonl` for `on_bad_row`, `max_row_chars` (`MathTask.max_row_chars`) and the
  errors."""
  return read_jsonl(path, _parse_row, on_bad_row, "math", max_row_chars=max_row_chars,
                    who="MathTask")


# ------------------------------------------------------------------ the task


def _contains(gold: str, completion: str) -> float:
  """1.0 when the gold number appears anywhere in the completion, among any others.

  A deliberately gameable proxy (a completion listing many numbers earns it): it exists
  so that validators can be tested against a reward that can be hacked
  (gin/math_hackable.gin); no default harness uses it.
  """
  g = parse_number(gold)
  if g is None:
    return 0.0
  return float(any(parse_number(m) == g for m in numbers_in(completion)))


def _closeness(gold: str, pred: Optional[str], correct: bool) -> float:
  """Partial credit 1 / (1 + |pred - gold| / max(1, |gold|)) for numbers; else 0/1."""
  if correct:
    return 1.0
  g, p = parse_number(gold), parse_number(pred)
  if g is None or p is None:
    return 0.0
  return float(1 / (1 + abs(p - g) / max(1, abs(g))))


@gin.configurable(module="tasks")
class MathTask:
  """Math problems with answer-based reward parts.

  Args:
    sources: names from `PROCEDURAL_SOURCES`, and/or "jsonl" for `jsonl_files`.
      Default: ("jsonl",) if `jsonl_files` is set, else ("tiny_arithmetic",).
    weights: sampling weight per source (default uniform).
    difficulty: 1..3, for every procedural source.
    num_validation: size of the fixed validation set (smaller if the sources run out):
      what training's periodic evaluation and every evolution decision read.
    num_test: size of the fixed test set: reported only, never selected on.
    validation_fraction, test_fraction: shares of all prompts (by a stable hash of the
      normalized prompt) that belong to the validation and test splits.
    jsonl_files: GSM8K/MATH-form JSONL files for the "jsonl" source (split by hash).
    test_jsonl_files: JSONL files whose rows are all test problems (e.g. GSM8K's test
      file); a `jsonl_files` row with the same prompt is dropped.
    on_bad_row: "skip" (log with file:line and count in `bad_rows`) or "error" (raise).
    prompt_template: `str.format` template with a `{question}` field. Tiny models want
      just "{question}".
    answer_methods: extraction methods tried in order (see `answers.METHODS`).
    format_methods: extraction methods that count as following the format.
    verifier: a `VerifierPool` to share; by default one is created on first need.
    verify_workers, verify_timeout_s: for the pool created here.
    max_row_chars: a JSONL row longer than this is malformed (`on_bad_row` applies).
    canary_file: canary prompts with known answers (`tasks/math/canaries.py`: JSONL of
      `{"prompt", "answer"}`), scored on every version for the `canary_prompts`
      validator. 'default': the shipped set for `tiny_arithmetic` at this difficulty
      (none for other sources); None or '': no canaries.
    calculator: the calculator tool (tasks/math/calculator.py): episodes become
      multi-turn, a model turn also ends at an equals sign and the tool writes the value
      of the arithmetic before it (not trained on); `TurnBudget` bounds the episode.
      Off by default; gin/evolution/math_space.gin lets the evolution turn it on.
  """

  def __init__(self, sources: Optional[Sequence[str]] = None,
               weights: Optional[Sequence[float]] = None, difficulty: int = 1,
               num_validation: int = 200, num_test: int = 500,
               validation_fraction: float = 0.1, test_fraction: float = 0.1,
               jsonl_files: Sequence[str] = (), test_jsonl_files: Sequence[str] = (),
               on_bad_row: str = "skip", prompt_template: str = DEFAULT_TEMPLATE,
               answer_methods: Sequence[str] = METHODS,
               format_methods: Sequence[str] = ("answer_tag",),
               verifier: Optional[VerifierPool] = None, verify_workers: int = 1,
               verify_timeout_s: float = 5.0, max_row_chars: int = MAX_ROW_CHARS,
               canary_file: Optional[str] = "default", calculator: bool = False):
    if not isinstance(calculator, bool):
      raise ValueError(f"MathTask.calculator must be True or False, got {calculator!r}")
    if sources is None:
      sources = ("jsonl",) if jsonl_files else ("tiny_arithmetic",)
    sources = tuple(sources)
    if not sources:
      raise ValueError("MathTask.sources is empty")
    for s in sources:
      if s != "jsonl" and s not in PROCEDURAL_SOURCES:
        raise ValueError(f"MathTask.sources: unknown source {s!r}; expected 'jsonl' or "
                         f"one of {PROCEDURAL_SOURCES}")
    weights = check_task_args("MathTask", sources, jsonl_files, difficulty, weights,
                              num_validation, num_test, prompt_template)
    check_fractions(validation_fraction, test_fraction, "MathTask")
    for m in tuple(answer_methods) + tuple(format_methods):
      if m not in METHODS:
        raise ValueError(f"MathTask: unknown extraction method {m!r}; expected {METHODS}")
    self.sources = sources
    self.weights = weights
    self.difficulty = difficulty
    self.sizes = {"validation": num_validation, "test": num_test}
    self.fractions = (validation_fraction, test_fraction)
    self.prompt_template = prompt_template
    self._chat = None  # a Hugging Face tokenizer once `use_tokenizer` gives one
    self.answer_methods = tuple(answer_methods)
    self.format_methods = tuple(format_methods)
    self._sources = [
        JsonlSource(jsonl_files, test_jsonl_files, self.fractions, on_bad_row,
                    functools.partial(load_jsonl, max_row_chars=max_row_chars), "MathTask")
        if s == "jsonl" else
        ProceduralSource(s, functools.partial(procedural_problem, s, difficulty), self.fractions)
        for s in sources]
    self.bad_rows = [b for s in self._sources for b in getattr(s, "bad_rows", [])]
    self._heldout: dict[str, list[Problem]] = {}
    self._verifier = verifier
    self._owns_verifier = verifier is None
    self._verify_workers, self._verify_timeout_s = verify_workers, verify_timeout_s
    self.canary_file = (canaries.default_canary_file(sources, difficulty)
                        if canary_file == "default" else canary_file or None)
    self._canaries: Optional[list[Problem]] = None
    self.calculator = calculator

  # ------------------------------------------------------------------ problems

  def _heldout_set(self, split: str) -> list[Problem]:
    """The fixed list of a held-out split (`base.heldout_set`), built once."""
    if split not in self._heldout:
      self._heldout[split] = heldout_set(self._sources, self.weights, split,
                                         self.sizes.get(split, 0), "MathTask")
    return self._heldout[split]

  def heldout_problems(self, n: Optional[int] = None,
                       split: str = "validation") -> list[Problem]:
    """The first `n` (all when None) problems of a fixed held-out split: 'validation'
    (what training and the evolution read) or 'test' (reported only)."""
    held = self._heldout_set(split)
    if n is not None and n > len(held):
      asker = ("EvalConfig.num_problems" if split == "validation" else "EvalConfig.num_test")
      if len(held) < self.sizes[split]:  # the data ran out, not the configured size
        jsonl = [s for s in self._sources if isinstance(s, JsonlSource)]
        rows = sum(len(s.splits[split]) for s in jsonl)
        why = (f"the data has only {len(held)} distinct {split} prompts" +
               (f" ({rows} of the JSONL rows fall in {split} at MathTask.{split}_fraction="
                f"{self.fractions[0 if split == 'validation' else 1]})" if jsonl else ""))
        more = (f"add rows, raise MathTask.{split}_fraction, or lower {asker} to "
                f"{len(held)}")
      else:
        why = f"MathTask.num_{split}={self.sizes[split]}"
        more = f"raise MathTask.num_{split} to {n} or lower {asker}"
      raise DataError(f"asked for {n} {split} problems ({asker}) but {why}; {more}")
    return list(held if n is None else held[:n])

  def data_problems(self) -> list[Problem]:
    """Every problem read from files (JSONL training and test rows), in file order; none
    for procedural sources. What the build-time checks (tasks/checks.py) read."""
    return [p for s in self._sources if isinstance(s, JsonlSource)
            for split in ("train", "validation", "test") for p in s.splits[split]]

  def canary_problems(self) -> list[Problem]:
    """The canaries of `canary_file` (none without one), those whose prompt falls in the
    train split under this task's fractions dropped (logged): a canary is never trained
    on."""
    if self._canaries is None:
      rows = canaries.load_canaries(self.canary_file) if self.canary_file else []
      self._canaries = [p for p in rows if split_of(p.prompt, *self.fractions) != "train"]
      if len(self._canaries) < len(rows):
        log.warning("MathTask: %d of %d canaries of %s fall in the train split at these "
                    "fractions; dropped", len(rows) - len(self._canaries), len(rows),
                    self.canary_file)
    return list(self._canaries)

  def train_problems(self, n: int, seed: int) -> list[Problem]:
    """`n` training problems drawn by `seed` (deterministic); none is validation or test."""
    return train_draws(self._sources, self.weights, n, seed, self.fractions, "MathTask")

  def use_tokenizer(self, tokenizer) -> None:
    """Renders prompts as a user turn of `tokenizer`'s chat template when it is a Hugging
    Face tokenizer (called by the run once the policy's tokenizer exists)."""
    self._chat = chat_tokenizer(tokenizer)

  def format_prompt(self, problem: Problem) -> str:
    """The question wrapped in `prompt_template`; with a chat tokenizer (`use_tokenizer`),
    as a user turn of the model's chat template."""
    return user_turn(self._chat, self.prompt_template.format(question=problem.prompt))

  # ------------------------------------------------------------------ the calculator

  @property
  def multi_turn(self) -> bool:
    """With the calculator, episodes alternate model turns and tool values
    (`tasks.base.MultiTurnTask`; rollouts/multiturn.py runs them)."""
    return self.calculator

  @property
  def turn_end_texts(self) -> tuple:
    """Texts whose tokens end a model turn besides the tokenizer's stop ids."""
    return TURN_END_TEXTS if self.calculator else ()

  def start_episode(self, problem: Problem) -> CalculatorEnv:
    del problem  # the tool reads only what the model writes
    return CalculatorEnv()

  def format_observation(self, observation: str) -> str:
    return observation  # inline: the value goes on the model's own line

  def finish_episodes(self, problems: Sequence[Problem],
                      envs: Sequence[CalculatorEnv]) -> list[dict]:
    """Reward parts of each episode's transcript (`score_many`: the same parts as a
    single-turn completion's); the tool's counts are in each episode's info."""
    return self.score_many(problems, [env.transcript for env in envs])

  # ------------------------------------------------------------------ scoring

  @property
  def verifier(self) -> VerifierPool:
    if self._verifier is None:
      self._verifier = VerifierPool(num_workers=self._verify_workers,
                                    timeout_s=self._verify_timeout_s)
    return self._verifier

  def score(self, problem: Problem, completion: str) -> dict[str, float]:
    """Reward parts of one completion; see `score_many`."""
    return self.score_many([problem], [completion])[0]

  def score_many(self, problems: Sequence[Problem],
                 completions: Sequence[str]) -> list[dict[str, float]]:
    """Reward parts per completion, all answers verified in one pool call.

    Returns, per completion: `correct` (0/1, the extracted answer equals the gold one),
    `format` (0/1, the answer was given in a `format_methods` form), `partial` (numeric
    closeness in [0, 1], 1 when correct, 0 for non-numeric wrong answers), `contains`
    (1 when the gold number appears anywhere in the completion: gameable, see `_contains`),
    `n_candidates` (distinct answers the completion marks; > 1 suggests answer spam) and
    `malformed` (1 when the completion or its answer was refused unread as too long or
    too deeply nested, `answers.too_long` / `answers.malformed`; then `correct` and
    `partial` are 0). Total: any text gives parts in these ranges and never raises.
    """
    if len(problems) != len(completions):
      raise ValueError(f"score_many: {len(problems)} problems but {len(completions)} "
                       f"completions")
    found = [extract_answer(c, self.answer_methods) for c in completions]
    verdicts = self.verifier.verify_many([(p.answer, a) for p, (a, _) in zip(problems, found)])
    return [{"correct": float(v.correct),
             "format": float(how in self.format_methods),
             "partial": _closeness(p.answer, a, v.correct),
             "contains": _contains(p.answer, c),
             "n_candidates": float(count_candidates(c)),
             "malformed": float(too_long(c) or v.reason.startswith("malformed"))}
            for p, c, (a, how), v in zip(problems, completions, found, verdicts)]

  def strict_verify(self, gold: str, completion: str) -> bool:
    """The strict verifier (validator `strict_verifier_agreement`): the answer inside
    `<answer>` tags only, no fallback extraction; numbers compared exactly, anything else
    by the verifier pool."""
    pred, _ = extract_answer(completion, ("answer_tag",))
    v = fast_verdict(gold, pred)
    return bool((v or self.verifier.verify_many([(gold, pred)])[0]).correct)

  def close(self) -> None:
    """Stops the verifier pool if this task created it."""
    if self._owns_verifier and self._verifier is not None:
      self._verifier.close()
      self._verifier = None

  def __enter__(self) -> "MathTask":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def write_default_canaries() -> list[pathlib.Path]:
  """Writes the shipped canary sets of tiny_arithmetic (tasks/math/canaries.py says how they
  are chosen); returns their paths."""
  canaries.DATA.mkdir(parents=True, exist_ok=True)
  out = []
  for difficulty in (1, 2, 3):
    seen, rows, skipped, key = set(), [], 0, 0
    while len(rows) < canaries.SIZE:
      question, answer, _ = _tiny_arithmetic(key, difficulty)
      key += 1
      if question in seen or split_of(question, 0.1, 0.1) != "validation":
        continue
      seen.add(question)
      if skipped < canaries.SKIP_VALIDATION:
        skipped += 1
        continue
      rows.append({"prompt": question, "answer": answer})
    path = canaries.DATA / f"tiny_arithmetic_d{difficulty}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out.append(path)
  return out


if __name__ == "__main__":  # rewrites the shipped canary sets
  for p in write_default_canaries():
    print(p)
