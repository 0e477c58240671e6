"""The defaults docs/gin_knobs.md states are the code's. In every table row whose binding
cell names N knobs and whose default cell holds N values, each value that is a Python
literal is checked against the signature of the configurable gin registers under that
name, or, in a table whose default column names gin files (`default (math.gin /
math_train.gin)`), against the value each of those files binds (the signature's where it
binds none). Lists and tuples compare alike (a gin file writes a tuple default as a list).

A row is read as `| `a.b`, `.c` | 1, 'x' | meaning |`: `.c` continues `a`'s configurable;
a parenthesised remark after a name or a value is not part of it (`1500 (cap)`). Defaults
that are not literals (`@Harness()`, `one per core`, `500 / 128`: math.gin's, then
math_train.gin's) are not checked.
"""

import ast
import inspect
import pathlib
import re

import gin
import pytest

from evotrainer import gin_api, registry

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "gin_knobs.md"
NOT_LITERAL = object()


def _top_level(text: str, sep: str) -> list:
  """`text` split on `sep` outside brackets, quotes and backticks."""
  parts, depth, quote, start, i = [], 0, None, 0, 0
  while i < len(text):
    ch = text[i]
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"`":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif depth == 0 and text.startswith(sep, i):
      parts.append(text[start:i])
      start = i + len(sep)
      i = start
      continue
    i += 1
  return parts + [text[start:]]


def _without_remarks(text: str) -> str:
  """`text` less its parenthesised remarks at the top level (`1500 (cap)` -> `1500`)."""
  return _top_level(text, " (")[0].strip()


def _names(cell: str) -> list:
  """Full knob names of a binding cell: `a.b`, `.c` -> ['a.b', 'a.c']."""
  out, owner = [], None
  for part in _top_level(cell, ","):
    m = re.fullmatch(r"`([\w.]*)`", _without_remarks(part))
    if not m:
      return []
    name = m.group(1)
    if name.startswith("."):
      if owner is None:
        return []
      name = owner + name
    owner = name.rsplit(".", 1)[0]
    out.append(name)
  return out


def _literal(item: str):
  text = _without_remarks(item).strip("`")
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return NOT_LITERAL


def documented_defaults() -> list:
  """(knob, default, gin files of its table) of every checkable row, in the page's order."""
  rows, files = [], ()
  for line in DOC.read_text().splitlines():
    if line.startswith("| binding |"):
      files = tuple(f"gin/{f}" for f in re.findall(r"[\w.]+\.gin", line))
    if not line.startswith("| `"):
      continue
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
    names, values = _names(cells[0]), [_literal(v) for v in _top_level(cells[1], ", ")]
    if len(names) == len(values):
      rows.extend((n, v, files) for n, v in zip(names, values) if v is not NOT_LITERAL)
  return rows


ROWS = documented_defaults()


def _plain(value):
  """Sequences as lists, recursively, for comparison."""
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return value


def _code_default(knob: str):
  owner, param = knob.rsplit(".", 1)
  params = gin_api.parameters(gin.get_configurable(owner))
  assert param in params, f"{knob}: {owner} has no parameter {param!r}"
  assert params[param].default is not inspect.Parameter.empty, f"{knob}: no default"
  return params[param].default


def _query(knob: str):
  """The value the parsed config binds `knob` to, else the code's default."""
  try:
    return gin.query_parameter(knob)
  except ValueError:  # not bound
    return _code_default(knob)


def _values(knobs: list, gin_file=None) -> dict:
  """{knob: value} as `gin_file` (parsed once) binds them, or the code's defaults (None)."""
  if gin_file is None:
    return {k: _code_default(k) for k in knobs}
  gin.clear_config()
  try:
    registry.parse([gin_file], finalize=False)
    return {k: _query(k) for k in knobs}
  finally:
    gin.clear_config()


def test_the_page_has_checkable_rows():
  """The parser reads the page (a format change must not turn this test into nothing)."""
  assert len(ROWS) >= 60, len(ROWS)
  knobs = {k: (v, f) for k, v, f in ROWS}
  assert knobs["evolve.adopt_step_gain"] == (0.0, ())
  assert knobs["train.checkpoint_every"] == (25, ("gin/math.gin", "gin/math_train.gin"))


@pytest.fixture(scope="module")
def builtins():
  registry.register_builtins()


def _same(value, default) -> bool:
  same_type = (type(value) is type(default) or {type(value), type(default)} <= {int, float}
               or {type(value), type(default)} <= {list, tuple})
  return same_type and _plain(value) == _plain(default)


def _mismatches(rows: list) -> list:
  """Why each (knob, default, files) row is wrong: `default` is not what the code gives
  the knob, or not what one of `files` gives it. Each gin file is parsed once."""
  sources = {f for _, _, files in rows for f in files or (None,)}
  actual = {src: _values([k for k, _, files in rows if src in (files or (None,))], src)
            for src in sources}
  out = []
  for knob, default, files in rows:
    wrong = [src for src in files or (None,) if not _same(actual[src][knob], default)]
    if wrong:
      out.append(f"{knob}: documented {default!r}, {wrong[0] or 'code'} "
                 f"{actual[wrong[0]][knob]!r}")
  return out


def test_documented_defaults_are_the_code_defaults(builtins):
  wrong = _mismatches(ROWS)
  assert wrong == [], "\n".join(wrong)


def test_a_wrong_default_is_caught(builtins):
  """The check itself: a documented value the code does not have is reported."""
  assert _mismatches([("evolve.branch_steps", 30, ())]) == []
  assert "documented 50, code 30" in _mismatches([("evolve.branch_steps", 50, ())])[0]
  assert "documented 50, gin/math.gin 25" in _mismatches([("evolve.branch_steps", 50,
                                                           ("gin/math.gin",))])[0]
  assert _mismatches([("StopReasonFilter.stops", ["malformed"], ())]) == []  # a tuple
  assert _mismatches([("Learner.learning_rate", 1e-5, ())]) == []
  assert "documented 1" in _mismatches([("Learner.learning_rate", 1, ())])[0]  # 1 != 1e-5


def _registered() -> dict:
  """{name: parameter names a gin binding may set} of every configurable the package
  registers (not gin's own, nor those other tests register for themselves)."""
  out = {}
  for c in gin_api.registered():
    if not getattr(c.wrapped, "__module__", "").startswith("evotrainer."):
      continue
    out[c.name] = [p for p, v in gin_api.parameters(c.wrapped).items()
                   if v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)
                   and p not in (c.denylist or ())]
  return out


def test_every_knob_is_documented(builtins):
  """Each parameter a binding may set is on the page: as `Name.param`, or as `.param` in
  a table row whose binding cell names `Name.` (parameters the code always passes are
  on each configurable's gin denylist, so a binding of them is an error, not a no-op)."""
  text = DOC.read_text()
  rows = [_top_level(line, " | ")[0] for line in text.splitlines() if line.startswith("| `")]
  registered = _registered()
  assert len(registered) > 60 and "Learner" in registered and "evolve" in registered
  missing = [f"{name}.{p}" for name, params in registered.items() for p in params
             if f"{name}.{p}" not in text
             and not any(f"`{name}." in r and f"`.{p}`" in r for r in rows)]
  assert missing == [], f"{len(missing)} knobs not in docs/gin_knobs.md: {missing}"


def test_every_launch_flag_is_documented():
  """Each flag `python -m evotrainer.launch` defines is in docs/command_line.md."""
  from absl import flags

  from evotrainer import launch
  page = (DOC.parent / "command_line.md").read_text()
  names = [f.name for f in flags.FLAGS.get_flags_for_module(launch.__name__)]
  assert len(names) >= 10 and "gin_file" in names, names
  missing = [n for n in names if f"--{n}" not in page]
  assert missing == [], f"flags not in docs/command_line.md: {missing}"
