"""Answers in completions: extraction, candidates, numbers, and the exact verdict.

Domain-neutral: what the reward parts, filters, validators, probes and diagnostics read
from a completion, whatever the task. A domain's own verifier (math: math-verify in
worker processes, tasks/math/verify.py) decides what this module leaves undecided.

Extraction tries, in order: `<answer>...</answer>` tags (what our prompts ask for),
`\\boxed{...}` (balanced braces, the last one), GSM8K's `#### N`, then the last number
in the text. `candidate_answers` lists every distinct answer a completion *marks*
(tags, boxes, `####`), so a diagnostic can catch a policy that spams several answers
hoping one is graded. `fast_verdict` decides equality where it is certain without a
parser (plain numbers by value, identical strings, a malformed answer).

Completions are untrusted input. Every function here takes any string (any length, lone
surrogates, NUL, unbalanced markup) without raising, and its cost is linear in the text:
a completion over `MAX_TEXT_CHARS` is not read at all (no answer, no candidates, no
numbers), and an extracted answer over `MAX_ANSWER_CHARS` characters or nested deeper
than `MAX_ANSWER_DEPTH` brackets is refused before any parse (`malformed`), so neither
Python's 4300-digit int conversion limit nor a nested `\\frac` reaches a parser.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import Optional, Sequence

# Extraction methods, in the order they are tried.
METHODS = ("answer_tag", "boxed", "hashes", "last_number")

# Cost bounds on model text, checked before any parse (see the module docstring). A
# completion of MAX_TEXT_CHARS is ~100k tokens, beyond any sampler budget here; answers
# are short (MATH golds are under 200 characters), and numbers stay far below 4300 digits.
MAX_TEXT_CHARS = 400_000
MAX_ANSWER_CHARS = 1_000
MAX_ANSWER_DEPTH = 16

_OPEN_TAG = re.compile(r"<answer>", re.I)
_CLOSE_TAG = re.compile(r"</answer>", re.I)
_BRACES = re.compile(r"[{}]")
_BRACKETS = re.compile(r"[(){}\[\]]")
_TOKEN = re.compile(r"[^\s$]+")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# A number not glued to a preceding word/digit (so "7-3" yields "3", not "-3").
_NUMBER = re.compile(r"(?:(?<![\w)\]])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[+-]?\.\d+")


def answer_tag(answer: str) -> str:
  """The answer in the format our prompts ask for: `<answer>{answer}</answer>`."""
  return f"<answer>{answer}</answer>"


def too_long(text: str) -> bool:
  """Whether a completion is over `MAX_TEXT_CHARS` and so is not read (a cost bound)."""
  return len(text) > MAX_TEXT_CHARS


def _closing_braces(text: str) -> dict[int, int]:
  """{index of a `{`: index of its matching `}`} for every balanced pair, in one pass."""
  pairs, opened = {}, []
  for m in _BRACES.finditer(text):
    if m.group() == "{":
      opened.append(m.start())
    elif opened:
      pairs[opened.pop()] = m.start()
  return pairs


def boxed_contents(text: str) -> list[str]:
  """Contents of every `\\boxed{...}` / `\\fbox{...}` in order, braces balanced.

  `\\boxed 5` (no braces) yields `5`; an unclosed box (a truncated completion) is skipped.
  Linear in the text: the braces are matched once, not rescanned per box.
  """
  out, pairs = [], None
  for m in _BOXED.finditer(text):
    i = m.end()
    if i < len(text) and text[i] == "{":
      pairs = _closing_braces(text) if pairs is None else pairs
      if i in pairs:
        out.append(text[i + 1:pairs[i]])
    else:
      token = _TOKEN.match(text, i)
      if token:
        out.append(token.group(0))
  return out


def _tagged(text: str) -> list[str]:
  """Contents of every `<answer>...</answer>` (case-insensitive, shortest), in one pass.

  What `re.findall(r"<answer>(.*?)</answer>", text, re.S | re.I)` returns, without its
  quadratic cost when many tags are left open.
  """
  out, pos = [], 0
  while (opened := _OPEN_TAG.search(text, pos)) is not None:
    closed = _CLOSE_TAG.search(text, opened.end())
    if closed is None:  # no closing tag after this one, so none after a later one either
      break
    out.append(text[opened.end():closed.start()])
    pos = closed.end()
  return out


def _clean(candidate: str) -> Optional[str]:
  """Strips what surrounds an answer: spaces, `$...$`, an inner box, a final period."""
  s = candidate.strip()
  inner = boxed_contents(s)
  if inner:
    s = inner[-1].strip()
  s = s.strip("$").strip()
  if s.endswith(".") and not _PLAIN_NUMBER.fullmatch(s):
    s = s[:-1].rstrip()
  return s or None


def _marked(text: str, method: str) -> list[str]:
  """All cleaned answers the given marker method finds, in text order."""
  if method == "answer_tag":
    raw = _tagged(text)
  elif method == "boxed":
    raw = boxed_contents(text)
  elif method == "hashes":
    raw = _HASHES.findall(text)
  elif method == "last_number":
    raw = _NUMBER.findall(text)
  else:
    raise ValueError(f"unknown extraction method {method!r}; expected one of {METHODS}")
  return [c for c in (_clean(r) for r in raw) if c is not None]


def extract_answer(text: str,
                   methods: Sequence[str] = METHODS) -> tuple[Optional[str], str]:
  """The final answer of a completion and how it was found.

  Args:
    text: the completion.
    methods: extraction methods to try, in order (a subset of `METHODS`).

  Returns:
    `(answer, how)`: the last answer found by the first method that finds any, and that
    method's name; `(None, "none")` if nothing is found or the text is `too_long`.
  """
  if too_long(text):
    return None, "none"
  for method in methods:
    found = _marked(text, method)
    if found:
      return found[-1], method
  return None, "none"


def _squash(answer: str) -> str:
  """The answer without spaces and surrounding `$`."""
  return re.sub(r"\s+", "", answer.strip().strip("$"))


def normalize_answer(answer: str) -> str:
  """A canonical form for telling candidates apart: plain numbers by value, else squashed."""
  number = parse_number(answer)
  return str(number) if number is not None else _squash(answer)


def candidate_answers(text: str) -> list[str]:
  """Distinct answers the completion marks (tags, boxes, `####`), in first-seen order.

  A box inside answer tags is one candidate, not two. Unmarked text contributes its last
  number only when nothing is marked (so plain reasoning numbers are not candidates).
  A `too_long` text has none.
  """
  if too_long(text):
    return []
  seen: dict[str, str] = {}
  for method in ("answer_tag", "boxed", "hashes"):
    for c in _marked(text, method):
      seen.setdefault(normalize_answer(c), c)
  if not seen:
    last, _ = extract_answer(text, ("last_number",))
    if last is not None:
      seen[normalize_answer(last)] = last
  return list(seen.values())


def numbers_in(text: str) -> list[str]:
  """Every number written in the text, in order (marked as an answer or not); none in a
  `too_long` text."""
  return [] if too_long(text) else _NUMBER.findall(text)


def count_candidates(text: str) -> int:
  """How many distinct answers a completion marks (see `candidate_answers`)."""
  return len(candidate_answers(text))


def parse_number(text: Optional[str]) -> Optional[Fraction]:
  """The exact value of a plain decimal number (`"19"`, `"-0.5"`, `"1,000"`), else None.

  None as well for a text over `MAX_ANSWER_CHARS` (a cost bound that also keeps Python's
  4300-digit int conversion limit out of reach).
  """
  if text is None or len(text) > MAX_ANSWER_CHARS:
    return None
  s = text.strip().replace(" ", "")
  if not _PLAIN_NUMBER.fullmatch(s):
    return None
  return Fraction(s.replace(",", ""))


# --------------------------------------------------------------------------- verdicts


@dataclasses.dataclass(frozen=True)
class VerifyResult:
  """Whether a predicted answer equals the gold one, and why that verdict.

  `reason` is one of "numeric match", "numeric mismatch", "exact match", "match",
  "mismatch", "no answer", "timeout", "malformed: ..." (refused unread, see `malformed`),
  or "error: ..." (exception or dead worker), or a reason the verify function returned.
  """

  correct: bool
  reason: str


def nesting_depth(text: str) -> int:
  """The deepest nesting of brackets `()[]{}` in the text (unbalanced closers ignored)."""
  depth = deepest = 0
  for m in _BRACKETS.finditer(text):
    if m.group() in "([{":
      depth += 1
      deepest = max(deepest, depth)
    elif depth:
      depth -= 1
  return deepest


def malformed(answer: str) -> Optional[str]:
  """Why an extracted answer is refused before any parse, or None when it may be read.

  Refused: over `MAX_ANSWER_CHARS` characters, or nested deeper than `MAX_ANSWER_DEPTH`
  (a `\\frac` inside a `\\frac` ... that would cost math-verify its whole timeout).
  """
  if len(answer) > MAX_ANSWER_CHARS:
    return f"malformed: answer of {len(answer)} characters (> {MAX_ANSWER_CHARS})"
  depth = nesting_depth(answer)
  if depth > MAX_ANSWER_DEPTH:
    return f"malformed: answer nested {depth} deep (> {MAX_ANSWER_DEPTH})"
  return None


def fast_verdict(gold: str, pred: Optional[str]) -> Optional[VerifyResult]:
  """A verdict without math-verify when one is certain, else None.

  Plain numbers are compared exactly (`"19"` == `"19.0"`); identical strings (spacing
  and `$` aside) match; a `malformed` answer is wrong unread.
  """
  if pred is None or not pred.strip():
    return VerifyResult(False, "no answer")
  refused = malformed(pred)
  if refused is not None:
    return VerifyResult(False, refused)
  g, p = parse_number(gold), parse_number(pred)
  if g is not None and p is not None:
    return VerifyResult(g == p, "numeric match" if g == p else "numeric mismatch")
  if _squash(gold) == _squash(pred):
    return VerifyResult(True, "exact match")
  return None
