"""The math domain's calculator tool (`MathTask.calculator`) and exact arithmetic.

With the calculator on, a math episode is multi-turn (rollouts/multiturn.py): a model
turn also ends at a token that is an equals sign (`TURN_END_TEXTS`), and the tool writes
the value of the arithmetic the turn ended with, then the model goes on:

  model   "-9 - 5 ="          (the turn ends at " =")
  tool    " -14"              (appended with loss mask 0: not trained on)
  model   "\\n<answer>-14</answer><|im_end|>"   (ends at the stop id: 'submitted')

What the tool reads: the last line of the episode's text before the "=", from the
longest tail made only of digits, spaces, `+ - * /`, parentheses and decimal points
that parses as arithmetic (`value_before_equals`). Nothing is executed: the expression is
walked as an AST of integer and decimal constants and `+ - * /` (`exact_value`), in exact
fractions, at most `MAX_EXPRESSION_CHARS` characters; anything else (a word, a power, a
division by zero, an empty tail) gets no value and an empty observation, and the model
simply writes on. An episode ends 'submitted' at its first turn that does not end at an
equals sign (its stop id or its token budget).

`ArithmeticSlipRate` (tasks/math/diagnostics.py) is the finding this tool answers: the
share of completions that write `expression = value` with the wrong value.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction
from typing import Optional

# A model turn of a calculator episode also ends at a token whose text, stripped, is one
# of these (for SmolLM2: "=" and " =").
TURN_END_TEXTS = ("=",)
MAX_EXPRESSION_CHARS = 120
_ARITHMETIC = frozenset("0123456789 \t+-*/().")
_CONTINUES = re.compile(r"[*/+]|-\s")  # a binary operator: the tail extends what precedes
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}


def exact_value(expression: str) -> Fraction:
  """Exact value of an arithmetic expression of integer or decimal constants (+ - * /,
  unary signs, parentheses); raises ValueError (SyntaxError, ZeroDivisionError) else.

  Also checks the generated gold answers of task.py independently: reasoning-gym
  evaluates `/` as floor division, so a generated "exact" division is occasionally not.
  """
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")

  def ev(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
      return ev(node.body)
    if (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)):
      return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
      return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
      return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
    raise ValueError(f"unsupported syntax in {expression!r}")

  return ev(ast.parse(expression.strip(), mode="eval"))


def format_value(value: Fraction) -> str:
  """An integer as digits, a terminating fraction as a decimal, any other as "p/q"."""
  if value.denominator == 1:
    return str(value.numerator)
  q = value.denominator
  for p in (2, 5):
    while q % p == 0:
      q //= p
  if q != 1:
    return f"{value.numerator}/{value.denominator}"
  return format(value.numerator / value.denominator, ".12g")


def value_before_equals(text: str) -> Optional[str]:
  """The value (`format_value`) of the arithmetic that ends `text`'s last line just
  before its final "=", or None: no "=" there, or no tail of that line parses.

  The tail is the longest run of arithmetic characters before the "=" (None when it is
  longer than `MAX_EXPRESSION_CHARS`); if it does not parse, shorter tails are tried
  that start after a space or "(" and not just after an operator. So "So 3 + 4 ="
  reads "3 + 4", "-5 + 3 =" reads "-5 + 3", "1. 3 + 4 =" reads "3 + 4", and "x - 1 ="
  and "2 ** 10 =" read nothing: "- 1" goes on from a name, "** 10" is no sum we compute
  and "10" alone is not the sum written.
  """
  stripped = text.rstrip(" ")
  if not stripped.endswith("="):
    return None
  end = len(stripped) - 1
  start = end
  while (start > 0 and stripped[start - 1] in _ARITHMETIC and
         end - start <= MAX_EXPRESSION_CHARS):
    start -= 1
  tail = stripped[start:end]
  if len(tail) > MAX_EXPRESSION_CHARS:
    return None
  head = stripped[max(0, start - 1):start]
  if head and (head.isalnum() or head in "_)") and _CONTINUES.match(tail.lstrip()):
    return None  # "x - 1 =": the expression goes on from a name, not a sum written
  for cut in range(len(tail)):
    piece = tail[cut:]
    if not any(c.isdigit() for c in piece):
      break
    if cut and (tail[cut - 1] not in " \t(" or
                tail[:cut].rstrip()[-1:] in ("+", "-", "*", "/")):
      continue  # inside a number, or a piece of a longer expression
    try:
      return format_value(exact_value(piece))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, RecursionError):
      continue
  return None


class CalculatorEnv:
  """One calculator episode's environment (`tasks.base.TurnEnv`).

  A value joins the transcript when the model's next turn arrives: the engine appends an
  observation only to an episode that goes on, so an episode stopped by a budget right
  after an "=" is graded without the value it never saw (a last number the tool wrote
  would otherwise count as the answer).

  Attributes:
    transcript: the episode's text (model turns and the tool values they follow), what
      is graded.
    calls: tool values the model went on from; misses: turns that ended at an "=" the
      tool could not read.
    stop: None while running, 'submitted' once a turn did not end at an equals sign.
  """

  def __init__(self):
    self.transcript = ""
    self.calls = 0
    self.misses = 0
    self.stop: Optional[str] = None
    self._pending = ""  # the last value written, until the model goes on from it

  @property
  def done(self) -> bool:
    return self.stop is not None

  def step(self, text: str) -> str:
    """The observation after model turn `text`: " <value>" when it ended at "=" and the
    arithmetic before it has a value, "" when it ended at "=" without one; otherwise the
    episode is over ('submitted') and the observation is ""."""
    if self._pending:
      self.transcript += self._pending
      self.calls += 1
      self._pending = ""
    self.transcript += text
    if not text.rstrip(" ").endswith("="):
      self.stop = "submitted"
      return ""
    value = value_before_equals(self.transcript)
    if value is None:
      self.misses += 1
      return ""
    self._pending = f" {value}"
    return self._pending

  def info(self) -> dict:
    return {"calculator_calls": self.calls, "calculator_misses": self.misses}


__all__ = ["CalculatorEnv", "MAX_EXPRESSION_CHARS", "TURN_END_TEXTS", "exact_value",
           "format_value", "value_before_equals"]
