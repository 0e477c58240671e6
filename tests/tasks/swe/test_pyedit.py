"""Whole-function edits (pyedit.py, `ToolConfig.code_edits`): hand-written files and
their expected text after each edit, the call a ```python block makes, the stop rule
`Budget.submit_after_edit`, and a fix written as a function graded for real."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evotrainer.tasks.swe import episode as episode_lib
from evotrainer.tasks.swe import agents, pyedit, repo, synth, tools

from tests.fuzz_text import FUZZ, model_text, within
from tests.tasks.swe.conftest import ADD_TASK, TOY, TOY_LIB, write_toy
from tests.tasks.swe.test_tools import NoSuite, call

SHAPES = textwrap.dedent('''\
    import functools


    class Square:
        def area(self):
            return self.side * self.side

        @functools.cache
        def name(self):
            def shout(text):
                return text.upper()
            return shout("square")


    class Circle:
        def area(self):
            return 3.14 * self.r ** 2
    ''')


def test_functions_and_their_lines_by_hand():
  sites = pyedit.functions(SHAPES)
  assert [(s.qualname, s.start, s.def_line, s.end, s.indent) for s in sites] == [
      ("Square.area", 5, 5, 6, "    "), ("Square.name", 8, 9, 12, "    "),
      ("Square.name.shout", 10, 10, 11, "        "), ("Circle.area", 16, 16, 17, "    ")]
  # The innermost function named so around a line; None off its lines.
  assert pyedit.site_of(SHAPES, "Square.name.shout", 11).def_line == 10
  assert pyedit.site_of(SHAPES, "Square.name", 12).def_line == 9
  assert pyedit.site_of(SHAPES, "Square.area", 17) is None
  assert pyedit.source(SHAPES, sites[1]) == (
      "@functools.cache\ndef name(self):\n    def shout(text):\n        return text.upper()\n"
      '    return shout("square")')
  with pytest.raises(ValueError, match="SyntaxError"):
    pyedit.functions("def broken(:\n")


def test_a_block_gives_one_function_and_says_what_it_left_out():
  new = pyedit.parse_block("    import math\n    def area(self):\n        return 1\n"
                           "    print(area(None))\n")
  assert new == pyedit.NewFunction("area", "def area(self):\n    return 1", False, 2)
  decorated = pyedit.parse_block("@staticmethod\ndef f():\n\treturn 2\n")
  assert decorated.decorated and decorated.code == "@staticmethod\ndef f():\n    return 2"
  for code, why in (("x = 1\n", "defines 0 top-level"),
                    ("def a():\n  pass\ndef b():\n  pass\n", "defines 2 top-level"),
                    ("def a(:\n", "SyntaxError"), ("(" * 500 + ")" * 500, "Error")):
    with pytest.raises(ValueError, match=why):
      pyedit.parse_block(code)


def test_python_blocks_of_a_turn():
  assert pyedit.python_block("text\n```python\nx = 1\n```\n```py\ndef f():\n  pass\n```"
                             ) == "def f():\n  pass\n"
  # A block cut at the turn's token budget counts.
  assert pyedit.python_block("Fix:\n```python\ndef f(a):\n    return a") == (
      "def f(a):\n    return a")
  assert pyedit.python_block("```python\nprint(1)\n```") is None
  assert pyedit.python_block("def f(): pass") is None  # not in a block


def test_replace_reindents_and_keeps_decorators_it_is_not_given():
  sites = {s.qualname: s for s in pyedit.functions(SHAPES)}
  new = pyedit.parse_block("def area(self):\n    return self.side ** 2\n")
  out = pyedit.replace(SHAPES, sites["Square.area"], new)
  assert out == SHAPES.replace("return self.side * self.side", "return self.side ** 2")
  renamed = pyedit.parse_block('def name(self):\n    return "SQUARE"\n')
  out = pyedit.replace(SHAPES, sites["Square.name"], renamed)
  # The decorator stays; the nested helper went with the old body.
  assert out.splitlines()[7:10] == ["    @functools.cache", "    def name(self):",
                                    '        return "SQUARE"']
  assert "shout" not in out
  bare = pyedit.parse_block("@property\ndef name(self):\n    return 'sq'\n")
  assert pyedit.replace(SHAPES, sites["Square.name"], bare).splitlines()[7:10] == [
      "    @property", "    def name(self):", "        return 'sq'"]
  # Code that would break the file (here an unterminated string): refused.
  broken = pyedit.NewFunction("area", "def area(self):\n    return '''", False, 0)
  with pytest.raises(ValueError, match="would not parse"):
    pyedit.replace(SHAPES, sites["Square.area"], broken)


def test_the_closest_of_same_name_functions_is_chosen_or_the_call_is_refused():
  sites = [s for s in pyedit.functions(SHAPES) if s.name == "area"]
  cands = [("shapes.py", s, pyedit.source(SHAPES, s)) for s in sites]
  circle = pyedit.parse_block("def area(self):\n    return 3.14159 * self.r ** 2\n")
  assert pyedit.closest(cands, circle)[1].qualname == "Circle.area"
  square = pyedit.parse_block("def area(self):\n    return self.side * self.side + 0\n")
  assert pyedit.closest(cands, square)[1].qualname == "Square.area"
  vague = pyedit.parse_block("def area(self):\n    return 0\n")
  with pytest.raises(ValueError, match="2 functions are named 'area'.*shapes.py:5"):
    pyedit.closest(cands, vague)
  with pytest.raises(ValueError, match="no function named 'area'"):
    pyedit.closest([], vague)


# ------------------------------------------------------------------ the tool


@pytest.fixture
def ws(tmp_path):
  root = write_toy(tmp_path / "repo")
  (root / "toylib" / "shapes.py").write_text(SHAPES)
  return tools.Workspace(root, NoSuite(), TOY.tests,
                         tools.ToolConfig(max_output_chars=2000, code_edits=True))


FIX = "I fix it.\n```python\ndef add(a, b):\n    return a + b\n```\n"


def test_a_python_block_is_the_edit_call_only_where_offered():
  code_tools = tools.ToolConfig(code_edits=True).tool_args()
  assert tools.parse_call(FIX, code_tools) == tools.ToolCall(
      "edit_function", {"code": "def add(a, b):\n    return a + b\n"})
  # A ```tool block wins over a python block; without code_edits a python block is no call.
  assert tools.parse_call(FIX + call("submit"), code_tools).name == "submit"
  with pytest.raises(tools.CallError, match="no tool call") as refused:
    tools.parse_call(FIX)
  assert "python" not in str(refused.value)
  with pytest.raises(tools.CallError, match="or the whole fixed function in one ```python"):
    tools.parse_call("I would change the sign.", code_tools)
  with pytest.raises(tools.CallError, match="unknown tool 'edit_function'"):
    tools.parse_call(call("edit_function", code="def add(a, b):\n  return 0\n"))
  assert tools.parse_call(call("edit_function", code="x", path="a.py"), code_tools).args == {
      "code": "x", "path": "a.py"}


def test_edit_function_changes_one_function_and_shows_the_diff(ws):
  lib = ws.root / "toylib" / "__init__.py"
  lib.write_text(TOY_LIB.replace("return a + b", "return a - b"))
  obs, ep = ws_step(ws, FIX)
  assert lib.read_text() == TOY_LIB
  assert obs == ("replaced function `add` in toylib/__init__.py (lines 4-5):\n"
                 "@@ -4,3 +4,3 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n ")
  assert ep.turns[-1].ok and ep.info()["tool_calls"][0]["name"] == "edit_function"
  # The same code again changes nothing: an error that says so.
  again, _ = ws_step(ws, FIX)
  assert again == ("error: edit_function: `add` in toylib/__init__.py already reads so; "
                   "nothing was changed (write the fixed function)")
  # A method, found among same-name ones by its code and re-indented as the file's.
  shapes = ws.root / "toylib" / "shapes.py"
  obs, _ = ws_step(ws, "```python\ndef area(self):\n    return 3.1416 * self.r ** 2\n```")
  assert obs.startswith("replaced function `Circle.area` in toylib/shapes.py (lines 16-17)")
  assert shapes.read_text() == SHAPES.replace("3.14 * self.r", "3.1416 * self.r")


def test_edit_function_errors_say_what_would_have_worked(ws):
  lib = ws.root / "toylib" / "__init__.py"
  obs, _ = ws_step(ws, "```python\ndef ad(a, b):\n    return a + b\n```")
  assert obs == ("error: edit_function: no function named 'ad' in the non-test Python "
                 "files; close names: add")
  # Test files are not searched unless named.
  obs, _ = ws_step(ws, "```python\ndef test_add():\n    assert True\n```")
  assert obs.startswith("error: edit_function: no function named 'test_add'")
  obs, _ = ws_step(ws, call("edit_function", code="def test_add():\n    assert True\n",
                            path="tests/test_toylib.py"))
  assert obs.startswith("replaced function `test_add` in tests/test_toylib.py") and (
      "(a test file: changes to test files are not graded)" in obs)
  obs, _ = ws_step(ws, "```python\ndef add(a, b):\n    return (a +\n```")
  assert obs.startswith("error: edit_function: SyntaxError")
  assert lib.read_text() == TOY_LIB


def ws_step(ws, text, budget=episode_lib.Budget()):
  ep = episode_lib.SweEpisode(ws, budget)
  return ep.step(text), ep


def test_submit_after_edit_stops_on_the_first_edit_that_changed_a_file(ws):
  (ws.root / "toylib" / "__init__.py").write_text(TOY_LIB.replace("a + b", "a - b"))
  budget = episode_lib.Budget(submit_after_edit=True)
  ep = episode_lib.SweEpisode(ws, budget)
  ep.step("```python\ndef nothing():\n    pass\n```")  # an edit that failed
  ep.step(call("read_file", path="toylib/__init__.py"))
  assert ep.stop is None
  ep.step(FIX)
  assert ep.stop == "submitted" and ep.info()["submitted"]
  # Without the rule the episode goes on.
  (ws.root / "toylib" / "__init__.py").write_text(TOY_LIB.replace("a + b", "a - b"))
  plain = episode_lib.SweEpisode(ws)
  plain.step(FIX)
  assert plain.stop is None


def test_a_fix_written_as_a_function_resolves_when_graded(toy_tree, suite, tmp_path):
  repo.checkout(toy_tree, ADD_TASK, tmp_path / "ep")
  ws = tools.Workspace(tmp_path / "ep", suite, TOY.tests, tools.ToolConfig(code_edits=True))
  ep = episode_lib.SweEpisode(ws, episode_lib.Budget(submit_after_edit=True))
  assert ep.step(FIX).startswith("replaced function `add`") and ep.stop == "submitted"
  verdict = repo.grade(ADD_TASK, toy_tree, tmp_path / "ep", suite, TOY.tests)
  assert verdict.resolved and verdict.changed == ("toylib/__init__.py",)
  wrong = tmp_path / "wrong"
  repo.checkout(toy_tree, ADD_TASK, wrong)
  ws = tools.Workspace(wrong, suite, TOY.tests, tools.ToolConfig(code_edits=True))
  episode_lib.SweEpisode(ws).step(FIX.replace("a + b", "b - a"))
  assert not repo.grade(ADD_TASK, toy_tree, wrong, suite, TOY.tests).resolved


def test_the_oracle_as_one_function_edit_resolves(toy_tree, suite, tmp_path):
  turn = agents.oracle_code_turn(ADD_TASK, TOY_LIB)
  assert turn == "I fix the faulty line.\n```python\ndef add(a, b):\n    return a + b\n```"
  repo.checkout(toy_tree, ADD_TASK, tmp_path / "ep")
  ws = tools.Workspace(tmp_path / "ep", suite, TOY.tests, tools.ToolConfig(code_edits=True))
  ep = episode_lib.SweEpisode(ws, episode_lib.Budget(submit_after_edit=True))
  ep.step(turn)
  assert ep.stop == "submitted"
  assert repo.grade(ADD_TASK, toy_tree, tmp_path / "ep", suite, TOY.tests).resolved
  with pytest.raises(ValueError, match="no function 'add' around line 5"):
    agents.oracle_code_turn(ADD_TASK, "x = 1\n")


def test_show_code_puts_the_named_function_in_the_issue_at_levels_0_and_1():
  bugged = TOY_LIB.replace("return a + b", "return a - b")
  l0 = synth.with_code(synth.at_level(ADD_TASK, 0), bugged)
  assert l0.problem_statement == (
      "add is wrong\nThe bug is in the function `add` of `toylib/__init__.py`.\n"
      "The faulty line is line 5: `return a - b`\nThe function now reads:\n"
      "```python\ndef add(a, b):\n    return a - b\n```")
  assert synth.with_code(ADD_TASK, bugged) == ADD_TASK  # level 2 names no function
  with pytest.raises(ValueError, match="no function 'add' around line 5"):
    synth.with_code(synth.at_level(ADD_TASK, 1), "x = 1\n")


@FUZZ
@given(model_text(), st.sampled_from(["def add(a, b):\n", "def area(self):\n    ", ""]))
def test_any_python_block_is_an_observation_never_a_crash(tmp_path_factory, text, head):
  root = write_toy(tmp_path_factory.mktemp("fuzz") / "repo")
  (root / "toylib" / "shapes.py").write_text(SHAPES)
  ws = tools.Workspace(root, NoSuite(), TOY.tests, tools.ToolConfig(code_edits=True))
  ep = episode_lib.SweEpisode(ws)
  with within(what="step"):
    obs = ep.step("```python\n" + head + text + "\n```")
  assert isinstance(obs, str) and len(obs) <= 4000 + 60
