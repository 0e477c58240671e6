"""Issue levels: the L0 / L1 texts against the mutation record (a hand-planted bug and
the toy library's synthesized ones), L2 unchanged, and the level in the JSONL rows."""

from __future__ import annotations

import ast
import dataclasses
import json

import pytest

from evotrainer.tasks.swe import records, synth
from evotrainer.tasks.swe.records import Mutation

from tests.tasks.swe.conftest import ADD_TASK, TOY_LIB

FILE_SENTENCE = "The bug is in `toylib/__init__.py`."


def test_levels_of_the_hand_planted_bug():
  # ADD_TASK: `return a + b` made `return a - b` on line 5, in `add`.
  assert synth.at_level(ADD_TASK, 2) is ADD_TASK
  l1, l0 = synth.at_level(ADD_TASK, 1), synth.at_level(ADD_TASK, 0)
  assert l1.problem_statement == (
      "add is wrong\nThe bug is in the function `add` of `toylib/__init__.py`.")
  assert l0.problem_statement == (
      "add is wrong\nThe bug is in the function `add` of `toylib/__init__.py`.\n"
      "The faulty line is line 5: `return a - b`")
  assert (l1.level, l0.level) == (1, 0)
  assert (l1.level_id, l0.level_id, ADD_TASK.level_id) == (
      "toylib-add-L1", "toylib-add-L0", "toylib-add")
  # The same bug: only the text and the level differ.
  assert dataclasses.replace(l0, problem_statement=ADD_TASK.problem_statement,
                             level=2) == ADD_TASK


def test_the_easy_file_sentence_gives_way_and_context_lines_are_skipped():
  # An easy task's level-2 text ends with the file; levels 1 and 0 say it once. The
  # mutation's snippets carry context lines: the faulty line is the first that differs.
  task = dataclasses.replace(
      ADD_TASK, difficulty="easy", problem_statement="add is wrong\n" + FILE_SENTENCE,
      mutation=Mutation("toylib/__init__.py", "clamp", "operator_swap", 9,
                        "def clamp(x, lo, hi):\n    if x < lo:\n",
                        "def clamp(x, lo, hi):\n    if x >= lo:\n"))
  l0 = synth.at_level(task, 0).problem_statement
  assert l0 == ("add is wrong\nThe bug is in the function `clamp` of `toylib/__init__.py`.\n"
                "The faulty line is line 9: `if x >= lo:`")
  assert FILE_SENTENCE not in l0
  # A removed last statement: no line is left at its place.
  gone = dataclasses.replace(task, mutation=Mutation(
      "toylib/__init__.py", "total", "removed_statement", 21, "    s = 0\n    t = 1\n",
      "    s = 0\n"))
  assert synth.at_level(gone, 0).problem_statement.endswith(
      "The faulty line is line 21, at the end of the file.")


def test_levels_are_refused_where_they_cannot_be_derived():
  with pytest.raises(ValueError, match="no mutation known"):
    synth.at_level(dataclasses.replace(ADD_TASK, mutation=None), 0)
  with pytest.raises(ValueError, match="derived from the level-2 task"):
    synth.at_level(synth.at_level(ADD_TASK, 0), 1)
  with pytest.raises(ValueError, match="issue level 3"):
    synth.at_level(ADD_TASK, 3)


def _function_at(source: str, line: int) -> str:
  """The qualified name of the innermost function holding `line` (read with ast)."""
  found = []

  def visit(node, scope):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
        name = scope + [child.name]
        if isinstance(child, ast.FunctionDef) and child.lineno <= line <= child.end_lineno:
          found.append(".".join(name))
        visit(child, name)
  visit(ast.parse(source), [])
  return found[-1]


def test_synthesized_toy_tasks_name_their_file_function_and_line(toy_tasks):
  for task in toy_tasks:
    m = task.mutation
    assert synth.at_level(task, 2) is task and task.level == 2
    assert task.level_id == task.instance_id
    # The bugged file from the mutation record (search -> replace in the pristine file).
    mutant = TOY_LIB.replace(m.search, m.replace).splitlines()
    assert TOY_LIB.count(m.search) == 1 and _function_at(TOY_LIB, m.line) == m.function
    base = task.problem_statement.removesuffix("\n" + FILE_SENTENCE)
    where = f"The bug is in the function `{m.function}` of `{m.file}`."
    assert synth.at_level(task, 1).problem_statement == base + "\n" + where
    assert synth.at_level(task, 0).problem_statement == (
        f"{base}\n{where}\nThe faulty line is line {m.line}: `{mutant[m.line - 1].strip()}`")
    # Level 2 never names the function (the easy difficulty names only the file).
    assert f"`{m.function}`" not in task.problem_statement


def test_the_level_is_part_of_the_row_and_old_rows_read_as_level_2(tmp_path):
  l0 = synth.at_level(ADD_TASK, 0)
  assert l0.to_row()["level"] == 0 and records.from_row(l0.to_row()) == l0
  old = ADD_TASK.to_row()
  del old["level"]
  assert records.from_row(old) == ADD_TASK
  for bad in (3, "0", True, 1.0):
    with pytest.raises(records.TaskFormatError, match="level: expected one of"):
      records.from_row({**old, "level": bad})
  # One task may have a row per level; the same level twice is a duplicate.
  path = tmp_path / "tasks.jsonl"
  records.write_jsonl([ADD_TASK, l0, synth.at_level(ADD_TASK, 1)], path)
  assert [t.level for t in records.read_jsonl(path)] == [2, 0, 1]
  path.write_text((json.dumps(l0.to_row()) + "\n") * 2)
  with pytest.raises(records.TaskFormatError, match="at level 0 already on line 1"):
    records.read_jsonl(path)


def _hand_task_set(monkeypatch):
  """`SweDomain` on 7 hand-made tasks (no synthesis, no sandbox): 2 train, 2 validation,
  3 test; test task "t-dup" has the issue text of train task "a-0" (a duplicate)."""
  from evotrainer.tasks.swe import task as task_lib
  layout = [("a-0", "train", "issue a"), ("a-1", "train", "issue b"),
            ("v-0", "validation", "issue c"), ("v-1", "validation", "issue d"),
            ("t-dup", "test", "issue a"), ("t-1", "test", "issue e"), ("t-2", "test", "f")]
  tasks = [dataclasses.replace(
      ADD_TASK, instance_id=i, split=split, problem_statement=text,
      mutation=dataclasses.replace(ADD_TASK.mutation, function=f"f_{i}", line=n + 3))
      for n, (i, split, text) in enumerate(layout)]
  transcripts = {t.instance_id: [[f" turn of {t.instance_id}", "ok"]] for t in tasks}
  task_set = task_lib.TaskSet(tasks, {ADD_TASK.repo: "/nowhere"},
                              {ADD_TASK.repo: ("tests",)}, transcripts, {})
  monkeypatch.setattr(task_lib, "build_task_set", lambda *a, **k: task_set)
  return task_lib


def test_levels_order_the_problems_and_keep_the_held_out_tasks(monkeypatch, tmp_path):
  task_lib = _hand_task_set(monkeypatch)

  def domain(levels):
    return task_lib.SweDomain(levels=levels, suite=object(), cache_dir=str(tmp_path))
  default, mixed, low = domain((2,)), domain((0, 1)), domain((0,))
  # The duplicate is dropped at every level (its L0 text differs, its L2 text does not).
  assert [p.id for p in default.splits["test"]] == ["t-1", "t-2"]
  assert [p.id for p in low.splits["test"]] == ["t-1-L0", "t-2-L0"]
  # Held-out problems task by task, each at every level; training draws mix the levels.
  assert [(p.meta["instance_id"], p.meta["level"]) for p in mixed.splits["test"]] == [
      ("t-1", 0), ("t-1", 1), ("t-2", 0), ("t-2", 1)]
  assert [p.id for p in mixed.heldout_problems(2, "test")] == ["t-1-L0", "t-1-L1"]
  assert {p.meta["level"] for p in mixed.train_problems(50, 0)} == {0, 1}
  # Each problem's text is its task at its level; the oracle episode is the task's.
  for p in mixed.splits["validation"] + mixed.splits["test"]:
    task = default.records[p.meta["instance_id"]]
    assert p.prompt == synth.at_level(task, p.meta["level"]).problem_statement
    assert p.solution == " turn of " + task.instance_id
  assert default.splits["train"][0].prompt == "issue a"  # level 2: the text as built


def test_the_test_report_sums_up_each_level(monkeypatch, tmp_path):
  from evotrainer.types import Episode
  task_lib = _hand_task_set(monkeypatch)

  def ep(task_id, calls, stop):
    return Episode(episode_id="v0/0/0", group_id=0, task_id=task_id, prompt="",
                   completion="", answer="resolved", reward_parts={"correct": 0.0},
                   info={"tool_calls": calls, "stop": stop, "turns": 2})
  edit = {"name": "edit_function", "turn": 0, "ok": True}
  eps = [ep("t-1-L0", [edit], "submitted"), ep("t-2-L0", [], "tool_error"),
         ep("t-1-L1", [], "max_context")]
  mixed = task_lib.SweDomain(levels=(0, 1), suite=object(), cache_dir=str(tmp_path))
  got = mixed.test_report(eps)
  assert set(got) == {"all", "level0", "level1"}
  assert got["level0"]["stops"] == {"submitted": 0.5, "tool_error": 0.5}
  assert got["level0"]["first_turn"] == {"parsed": 0.5, "ran": 0.5}
  assert got["level0"]["first_edit_turn"] == 0.0
  assert got["level1"]["stops"] == {"max_context": 1.0}
  assert got["level1"]["first_edit_turn"] is None
  assert got["all"]["edited_share"] == round(1 / 3, 4)
  # One level: the whole report only.
  low = task_lib.SweDomain(levels=(0,), suite=object(), cache_dir=str(tmp_path))
  assert set(low.test_report(eps[:2])) == {"all"}


def test_the_levels_knob_is_read_from_gin(monkeypatch, tmp_path):
  import gin
  task_lib = _hand_task_set(monkeypatch)
  gin.parse_config("SweDomain.levels = [1, 2]")
  try:
    d = task_lib.SweDomain(suite=object(), cache_dir=str(tmp_path))
  finally:
    gin.clear_config()
  assert d.levels == (1, 2)
  assert [p.id for p in d.splits["validation"]] == ["v-0-L1", "v-0", "v-1-L1", "v-1"]
  assert d.splits["validation"][0].prompt == (
      "issue c\nThe bug is in the function `f_v-0` of `toylib/__init__.py`.")


def test_show_code_and_code_edits_are_read_from_gin(monkeypatch, tmp_path,
                                                                  toy_tree):
  import gin
  from evotrainer.tasks.swe import task as task_lib
  tasks = [dataclasses.replace(ADD_TASK, instance_id=i, split=s, problem_statement=f"{i} fails")
           for i, s in (("a", "train"), ("v", "validation"), ("t", "test"))]
  task_set = task_lib.TaskSet(tasks, {ADD_TASK.repo: str(toy_tree)},
                              {ADD_TASK.repo: ("tests",)},
                              {t.instance_id: [[" turn", "ok"]] for t in tasks}, {})
  monkeypatch.setattr(task_lib, "build_task_set", lambda *a, **k: task_set)
  gin.parse_config("SweDomain.levels = [0, 1, 2]\nSweDomain.show_code = True\n"
                   "SweDomain.tool_config = @ToolConfig()\nToolConfig.code_edits = True")
  try:
    d = task_lib.SweDomain(suite=object(), cache_dir=str(tmp_path))
  finally:
    gin.clear_config()
  shown = "The function now reads:\n```python\ndef add(a, b):\n    return a - b\n```"
  l0, l1, l2 = d.splits["test"]
  named = "t fails\nThe bug is in the function `add` of `toylib/__init__.py`."
  assert l0.prompt == named + "\nThe faulty line is line 5: `return a - b`\n" + shown
  assert l1.prompt == named + "\n" + shown
  assert l2.prompt == "t fails"
  assert d.records["t-L0"].problem_statement == l0.prompt
  # With code edits the oracle's episode is its one whole-function edit, at every level.
  fix = " I fix the faulty line.\n```python\ndef add(a, b):\n    return a + b\n```"
  assert l0.solution == l1.solution == l2.solution == fix


def test_code_edits_refuse_other_demonstrations(tmp_path):
  from evotrainer.tasks.swe import task as task_lib
  from evotrainer.tasks.swe.tools import ToolConfig
  with pytest.raises(ValueError, match="demonstrations='history' with ToolConfig.code_edits"):
    task_lib.SweDomain(suite=object(), cache_dir=str(tmp_path), demonstrations="history",
                       tool_config=ToolConfig(git=True, code_edits=True),
                       checkout_options={"keep_history": True})
