"""Whole-function edits: the `edit_function` tool and the issue's code context.

A small pretrained model writes Python far more readily than a JSON call (SmolLM2-135M
answers an issue with a ```python block and never with a ```tool block). With
`ToolConfig.code_edits`, a turn with no ```tool block whose ```python block defines a
function is read as the call `edit_function(code)` (`python_block`), and the tool
replaces the repository's function of that name with it (`Workspace.edit_function`):

  - the block may hold other statements (imports, example calls); only its one function
    definition is used, and the observation says how many statements were left out;
  - the function it replaces is the one of that name in the repository's non-test
    Python files (or in `path`, when given); where several share the name (methods of
    different classes, nested helpers), the one whose current source is closest to the
    new code (difflib) is replaced, and only if it is clearly closest (`MARGIN`);
  - the new code is re-indented to the old definition's indentation; decorators the
    block leaves out are kept; an edit that would leave the file unparseable is refused.

It is forgiving about where the code goes and exact about what it changes: one
function's lines, reported with their line numbers and a diff.

`SweDomain.show_code` is the matching task side: at levels 0 and 1, where the issue
names the function, the issue also shows its current source (`site_of`, `source`), as
SWE-bench's oracle-retrieval setting shows the files a fix touches.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import re
import textwrap
from typing import Optional, Sequence

PY_FENCE = re.compile(r"```(?:python|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.S)
MARGIN = 0.05  # how much closer the chosen same-name function must be than the next
MAX_DIFF_LINES = 40


@dataclasses.dataclass(frozen=True)
class FunctionSite:
  """One function definition of a file.

  Attributes:
    qualname: its enclosing classes and functions and its name, "." joined
      (`mutate.Site.function`'s convention), e.g. "Table.insert".
    name: the function's own name.
    start: first line, its decorators included (1-based).
    def_line: the `def` line.
    end: last line.
    indent: the `def` line's indentation.
  """
  qualname: str
  name: str
  start: int
  def_line: int
  end: int
  indent: str


@dataclasses.dataclass(frozen=True)
class NewFunction:
  """A model's function, read out of its block (`parse_block`).

  Attributes:
    name: the function's name.
    code: its source, decorators included, dedented to column 0.
    decorated: the block gave decorators (they replace the old ones).
    left_out: the block's other top-level statements, not used.
  """
  name: str
  code: str
  decorated: bool
  left_out: int


def _parse(text: str) -> ast.Module:
  try:
    return ast.parse(text)
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise ValueError(f"{type(e).__name__}: {str(e)[:200]}") from None


def functions(text: str) -> list[FunctionSite]:
  """Every function definition of a Python file's `text`, in source order.

  Raises:
    ValueError: `text` does not parse.
  """
  found, lines = [], text.splitlines()

  def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        inner = scope + (child.name,)
        if not isinstance(child, ast.ClassDef):
          start = min([d.lineno for d in child.decorator_list] + [child.lineno])
          indent = lines[child.lineno - 1][:child.col_offset]
          found.append(FunctionSite(".".join(inner), child.name, start, child.lineno,
                                    child.end_lineno, indent))
        visit(child, inner)
      else:
        visit(child, scope)

  visit(_parse(text), ())
  return sorted(found, key=lambda s: s.start)


def site_of(text: str, qualname: str, line: int) -> Optional[FunctionSite]:
  """The innermost function `qualname` whose lines hold `line` (None: no such one)."""
  inside = [s for s in functions(text) if s.qualname == qualname and s.start <= line <= s.end]
  return max(inside, key=lambda s: s.start) if inside else None


def named_source(text: str, qualname: str, line: int) -> str:
  """The source (`source`) of the innermost function `qualname` around `line`.

  Raises:
    ValueError: there is no such function.
  """
  site = site_of(text, qualname, line)
  if site is None:
    raise ValueError(f"no function {qualname!r} around line {line}")
  return source(text, site)


def source(text: str, site: FunctionSite) -> str:
  """The site's lines, decorators included, dedented to column 0."""
  return textwrap.dedent("\n".join(text.splitlines()[site.start - 1:site.end]))


def python_block(text: str) -> Optional[str]:
  """The code of a turn's first ```python (or ```py) block that defines a function; an
  unclosed block at the turn's end counts (a turn cut at its token budget). None: no
  such block."""
  for body in PY_FENCE.findall(text):
    if re.search(r"^\s*(async\s+)?def\s", body, re.M):
      return body
  return None


def parse_block(code: str) -> NewFunction:
  """The one function definition of `code` (a model's block).

  Raises:
    ValueError: the code does not parse, or holds no top-level function or several;
      the message tells the model what was expected.
  """
  code = textwrap.dedent(code.expandtabs(4)).strip("\n")
  tree = _parse(code)
  defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
  if len(defs) != 1:
    raise ValueError(f"the block defines {len(defs)} top-level functions; write exactly "
                     f"one (the whole fixed function)")
  node = defs[0]
  start = min([d.lineno for d in node.decorator_list] + [node.lineno])
  lines = code.splitlines()[start - 1:node.end_lineno]
  return NewFunction(node.name, "\n".join(lines), bool(node.decorator_list),
                     len(tree.body) - 1)


def closest(candidates: Sequence[tuple[str, FunctionSite, str]], new: NewFunction
            ) -> tuple[str, FunctionSite]:
  """Of (path, site, current source) candidates sharing the new function's name, the
  one whose source is closest to the new code (the only one is taken unscored).

  Raises:
    ValueError: none, or no candidate is closer than the next by `MARGIN`.
  """
  if not candidates:
    raise ValueError(f"no function named {new.name!r}")
  if len(candidates) == 1:
    return candidates[0][:2]
  scored = sorted(((difflib.SequenceMatcher(None, old, new.code, autojunk=False).ratio(),
                    path, site) for path, site, old in candidates), key=lambda c: -c[0])
  if len(scored) > 1 and scored[0][0] - scored[1][0] < MARGIN:
    places = ", ".join(f"{p}:{s.def_line} ({s.qualname})" for _, p, s in scored[:6])
    raise ValueError(f"{len(scored)} functions are named {new.name!r} and the code is "
                     f"about as close to several: {places}; give `path`, or write the "
                     f"function closer to the one meant")
  return scored[0][1], scored[0][2]


def replace(text: str, site: FunctionSite, new: NewFunction) -> str:
  """`text` with the site's function replaced by `new`, indented as the old `def`
  (the old decorators kept when `new` gives none).

  Raises:
    ValueError: the result does not parse.
  """
  lines = text.splitlines(keepends=True)
  first = site.start if new.decorated else site.def_line
  body = "".join(site.indent + ln if ln.strip() else ln
                 for ln in new.code.splitlines(keepends=True))
  ending = lines[site.end - 1][len(lines[site.end - 1].rstrip("\r\n")):] or "\n"
  out = "".join(lines[:first - 1]) + body.rstrip("\n") + ending + "".join(lines[site.end:])
  try:
    _parse(out)
  except ValueError as e:
    raise ValueError(f"the file would not parse after the edit ({e}); nothing was "
                     f"changed") from None
  return out


def diff(old: str, new: str, path: str) -> str:
  """A unified diff of one file's edit, at most `MAX_DIFF_LINES` lines."""
  lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"a/{path}",
                                    f"b/{path}", n=1, lineterm=""))[2:]
  more = len(lines) - MAX_DIFF_LINES
  return "\n".join(lines[:MAX_DIFF_LINES] + ([f"[{more} more diff lines]"] if more > 0 else []))
