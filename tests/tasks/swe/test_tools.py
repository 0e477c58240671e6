"""The episode's tools on the toy repository: hand-checked observations, refused paths,
malformed calls, stop reasons, and an oracle episode through the tools graded for real."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evotrainer import sandbox
from evotrainer.tasks.swe import episode as episode_lib
from evotrainer.tasks.swe import agents, repo, runner, synth, tools

from tests.fuzz_text import FUZZ, model_text, within
from tests.tasks.swe.conftest import TOY, TOY_LIB, write_toy

TOOL_FIELDS = ("path", "start", "end", "pattern")


def call(name: str, **args) -> str:
  """A model turn making one call, with some reasoning around it."""
  return f"Let me look.\n{tools.call_text(name, **args)}\nDone."


class NoSuite:
  """Stands in for the sandbox runner where no test may run."""

  def run(self, *a, **k):
    raise AssertionError("run_tests reached the sandbox")


@pytest.fixture
def ws(tmp_path):
  root = write_toy(tmp_path / "repo")
  (tmp_path / "secret.txt").write_text("the fix is a + b\n")
  return tools.Workspace(root, NoSuite(), TOY.tests, tools.ToolConfig(max_output_chars=400))


def observe(ws, text):
  ep = episode_lib.SweEpisode(ws)
  return ep.step(text), ep


# ------------------------------------------------------------------ the call syntax


def test_parse_call_accepts_one_block_and_refuses_the_rest():
  assert tools.parse_call(call("read_file", path="a.py", start=2)) == tools.ToolCall(
      "read_file", {"path": "a.py", "start": 2})
  assert tools.parse_call('```tool\n{"tool": "submit"}\n```').name == "submit"
  bad = {
      "no block": ("just talking", "no tool call"),
      "two": (call("submit") + call("submit"), "2 tool blocks"),
      "json": ("```tool\n{not json}\n```", "not JSON"),
      "list": ("```tool\n[1, 2]\n```", "one JSON object"),
      "unknown tool": (call("rm_rf", path="."), "unknown tool 'rm_rf'"),
      "unknown arg": (call("list_dir", path=".", depth=3), "unknown argument(s) ['depth']"),
      "missing": (call("read_file"), "missing argument 'path'"),
      "type": (call("read_file", path="a.py", start="1"), "'start' must be int, got str"),
      "bool": (call("read_file", path="a.py", start=True), "'start' must be int, got bool"),
      "extra key": ('```tool\n{"tool": "submit", "why": 1}\n```', "unknown key(s) ['why']"),
      "long": ("```tool\n" + "[" * 15_000 + "]" * 15_000 + "\n```", "characters"),
      "deep": ("```tool\n" + "[" * 9_000 + "]" * 9_000 + "\n```", "not JSON"),
  }
  for what, (text, message) in bad.items():
    with pytest.raises(tools.CallError) as e:
      tools.parse_call(text)
    assert message in str(e.value), what


def test_cap_marks_cut_output():
  assert tools.cap("abc", 3) == "abc"
  assert tools.cap("abcdef", 4) == "abcd\n[output cut: showing 4 of 6 characters]"


# ------------------------------------------------------------------ each tool by hand


def test_list_dir_and_read_file(ws):
  obs, _ = observe(ws, call("list_dir"))
  assert obs == "pyproject.toml\ntests/\ntoylib/"
  obs, _ = observe(ws, call("read_file", path="toylib/__init__.py", start=4, end=5))
  assert obs == ("toylib/__init__.py lines 4-5 of 24\n"
                 "    4| def add(a, b):\n"
                 "    5|     return a + b")
  obs, _ = observe(ws, call("read_file", path="toylib/__init__.py", start=40))
  assert obs == "error: read_file: 'toylib/__init__.py' has 24 lines; start=40"
  obs, _ = observe(ws, call("read_file", path="nope.py"))
  assert obs == "error: 'nope.py': no such file"


def test_grep_is_a_fixed_string_search(ws):
  obs, _ = observe(ws, call("grep", pattern="clamp(", path="tests"))
  assert obs.splitlines() == [
      "tests/test_toylib.py:13:     assert clamp(-5, 0, 10) == 0",
      "tests/test_toylib.py:17:     assert clamp(50, 0, 10) == 10",
      "tests/test_toylib.py:21:     assert clamp(5, 0, 10) == 5"]
  obs, _ = observe(ws, call("grep", pattern="(.*)+$"))  # a regex is only text here
  assert obs == "no line contains '(.*)+$'"
  ws.config = tools.ToolConfig(grep_matches=2)
  obs, _ = observe(ws, call("grep", pattern="def "))
  assert obs.splitlines()[:2] == ["tests/test_toylib.py:4: def test_add():",
                                  "tests/test_toylib.py:8: def test_add_negative():"]
  assert obs.splitlines()[2] == "[9 more matching lines not shown]"  # 7 tests + 4 functions


def test_search_replace_exactly_once(ws):
  path = ws.root / "toylib" / "__init__.py"
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="return a + b", replace="return a - b"))
  assert obs == "replaced 1 occurrence in toylib/__init__.py at line 5"
  assert path.read_text() == TOY_LIB.replace("a + b", "a - b")
  missed = ("error: search_replace: the search text must occur exactly once in "
            "'toylib/__init__.py'; it is not in the file (nothing was changed)")
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="return a + b", replace="x"))
  # The closest line (line 5 now reads `return a - b`), as it is in the file.
  assert obs == missed + ("\nthe closest lines in the file; search for their exact text:"
                          "\nline 5:\n    return a - b")
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="        return ", replace="x"))
  assert obs == ("error: search_replace: the search text must occur exactly once in "
                 "'toylib/__init__.py'; it occurs 2 times (nothing was changed); add "
                 "surrounding lines to make it unique; it starts at lines 10, 12")
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="unrelated text", replace="x"))
  assert obs == missed  # nothing near: no hint
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py", search="",
                            replace="x"))
  assert obs.endswith("; it is empty (nothing was changed)")
  assert path.read_text() == TOY_LIB.replace("a + b", "a - b")
  obs, _ = observe(ws, call("search_replace", path="tests/test_toylib.py",
                            search="clamp(5, 0, 10) == 5", replace="clamp(5, 0, 10) == 6"))
  assert obs.endswith("(a test file: changes to test files are not graded)")


def test_a_missed_search_shows_what_would_have_worked(ws):
  path = ws.root / "toylib" / "__init__.py"
  head = ("error: search_replace: the search text must occur exactly once in "
          "'toylib/__init__.py'; it is not in the file (nothing was changed)\n")
  # Lines 9-10 of TOY_LIB ("    if x < lo:" / "        return lo"), spaced otherwise.
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="if x<lo:\n  return lo", replace="x"))
  spaced = ("it matches once whitespace is ignored; the file's exact text there (spaces "
            "and indentation must match):\n")
  assert obs == head + spaced + "lines 9-10:\n    if x < lo:\n        return lo"
  # Copied from read_file's output, line numbers and all.
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="   17|     s = 0", replace="x"))
  assert obs == head + ("the search text holds read_file's line-number prefixes (like "
                        "'    5| '); search the file's own text\n") + spaced + (
                            "line 17:\n    s = 0")
  # A misremembered signature: the nearest line only.
  obs, _ = observe(ws, call("search_replace", path="toylib/__init__.py",
                            search="def clamp(x, low, high):", replace="x"))
  assert obs == head + ("the closest lines in the file; search for their exact text:\n"
                        "line 8:\ndef clamp(x, lo, hi):")
  assert path.read_text() == TOY_LIB  # hints never edit


def test_indent_tolerant_edits_the_one_run_of_lines_that_matches_but_for_indentation(ws):
  path = ws.root / "toylib" / "__init__.py"
  edit = call("search_replace", path="toylib/__init__.py", search="if x < lo:\nreturn lo\n",
              replace="if x <= lo:\n    return lo")
  obs, _ = observe(ws, edit)  # off (the default): refused, the file as it was
  assert obs.startswith("error: search_replace: the search text must occur exactly once")
  assert path.read_text() == TOY_LIB
  ws.config = tools.ToolConfig(max_output_chars=400, indent_tolerant=True)
  obs, _ = observe(ws, edit)
  assert obs == ("no exact match; lines 9-10 of toylib/__init__.py match the search text "
                 "but for indentation, and now read:\n    if x <= lo:\n        return lo")
  assert path.read_text() == TOY_LIB.replace("    if x < lo:\n        return lo",
                                             "    if x <= lo:\n        return lo")
  # Two runs match once stripped ("return 1" in f and in g): refused, nothing written.
  (ws.root / "toylib" / "two.py").write_text("def f():\n    return 1\n\ndef g():\n"
                                             "    return 1\n")
  obs, _ = observe(ws, call("search_replace", path="toylib/two.py", search="return 1 ",
                            replace="return 2"))
  assert obs.startswith("error: search_replace: the search text must occur exactly once")
  assert (ws.root / "toylib" / "two.py").read_text().count("return 1") == 2


def test_indent_edit_by_hand():
  text = "class A:\n    def f(self):\n        x = 1\n        return x\n"
  # The search written at 2 spaces: the replacement keeps its lines' relative indentation
  # on the file's 8; a line less indented than the search's first goes to the file's.
  out = tools.indent_edit(text, "  x = 1\n  return x", "  y = 2\n    z = 3\nreturn y\n")
  assert out == ("class A:\n    def f(self):\n        y = 2\n          z = 3\n"
                 "        return y\n", 3, 4, "        y = 2\n          z = 3\n        return y")
  # An empty replacement removes the lines; no match, or a fragment of a line: None.
  assert tools.indent_edit(text, "x = 1", "")[0] == ("class A:\n    def f(self):\n"
                                                     "        return x\n")
  assert tools.indent_edit(text, "x = 2", "y") is None
  assert tools.indent_edit(text, "return", "y") is None
  assert tools.indent_edit(text, "\n\n", "y") is None


def test_missing_paths_get_the_nearest_paths(ws):
  expected = {
      call("read_file", path="toylib/init.py"):
          "error: 'toylib/init.py': no such file; close paths: toylib/__init__.py, toylib/",
      call("read_file", path="__init__.py"):
          "error: '__init__.py': no such file; close paths: toylib/__init__.py",
      call("search_replace", path="test_toylib.py", search="a", replace="b"):
          "error: 'test_toylib.py': no such file; close paths: tests/test_toylib.py",
      call("grep", pattern="add", path="test/"):
          "error: 'test/': no such file or folder; close paths: tests/",
      call("list_dir", path="toylb"): "error: 'toylb': no such folder; close paths: toylib/",
      call("read_file", path="toylib"): "error: 'toylib': a folder, not a file (list_dir "
                                        "lists it)",
      call("list_dir", path="pyproject.toml"): "error: 'pyproject.toml': a file, not a "
                                               "folder (read_file reads it)",
  }
  for text, observation in expected.items():
    obs, ep = observe(ws, text)
    assert obs == observation and not ep.turns[-1].refused_path


def test_paths_out_of_the_repository_are_refused(ws, tmp_path):
  os.symlink(tmp_path / "secret.txt", ws.root / "link.txt")
  os.symlink(tmp_path, ws.root / "up")
  escapes = ["../secret.txt", "/etc/passwd", str(tmp_path / "secret.txt"),
             "toylib/../../secret.txt", "link.txt", "up/secret.txt", ".git/config",
             "~/.bashrc"]
  for path in escapes:
    for text in (call("read_file", path=path), call("list_dir", path=path),
                 call("grep", pattern="fix", path=path),
                 call("search_replace", path=path, search="a", replace="b"),
                 call("run_tests", tests=[path + "::test_x"])):
      obs, ep = observe(ws, text)
      assert obs.startswith("error: ") and "the fix" not in obs, (path, obs)
      assert ep.turns[-1].refused_path and ep.info()["refused_paths"] == 1, (path, obs)
  assert (tmp_path / "secret.txt").read_text() == "the fix is a + b\n"
  os.symlink("loop", ws.root / "loop")  # a repository may ship odd links: no crash either
  for path in ("loop", "loop/x", "x" * 5000):
    obs, ep = observe(ws, call("read_file", path=path))
    assert obs.startswith("error: ") and not ep.turns[-1].ok, (path, obs)
  obs, _ = observe(ws, call("grep", pattern="the fix"))  # the symlinks are skipped
  assert obs == "no line contains 'the fix'"


class RecordingSuite:
  """Stands in for the sandbox: keeps what each run and program would have been given."""

  def __init__(self):
    self.payloads: list[dict] = []

  def run(self, files, tests, timeout_s):
    self.payloads.append(files)
    return runner.SuiteResult({}, {}, sandbox.Status.OK, 0.0)

  def run_program(self, source, **kwargs):
    self.payloads.append(json.loads(kwargs["stdin"])["files"])
    return sandbox.RunResult(sandbox.Status.OK, 0, "", "", False, False, 0.0, 0.0)


def test_hard_links_out_of_the_repository_are_refused(tmp_path):
  # A file outside the repository given a second name inside it: the path passes every
  # check on names. Nothing of the file may be read, found, changed, run or sent to git.
  root = write_toy(tmp_path / "repo")
  secret = tmp_path / "secret.txt"
  secret.write_text("the fix is a + b\n")
  os.link(secret, root / "toylib" / "notes.txt")
  suite = RecordingSuite()
  ws = tools.Workspace(root, suite, TOY.tests, tools.ToolConfig(git=True))
  for text in (call("read_file", path="toylib/notes.txt"),
               call("grep", pattern="fix", path="toylib/notes.txt"),
               call("search_replace", path="toylib/notes.txt", search="the fix",
                    replace="pwned")):
    obs, ep = observe(ws, text)
    assert obs.startswith("error: ") and "the fix" not in obs, obs
    assert "hard link" in obs and ep.turns[-1].refused_path, obs
  assert secret.read_text() == "the fix is a + b\n"
  obs, _ = observe(ws, call("grep", pattern="the fix"))
  assert obs == "no line contains 'the fix'"
  observe(ws, call("run_tests"))
  observe(ws, call("git", command="status"))
  assert len(suite.payloads) == 2
  for files in suite.payloads:
    assert "toylib/__init__.py" in files and "toylib/notes.txt" not in files, sorted(files)
  # Nor is its name offered for a near miss (a symlink's neither).
  os.symlink(secret, root / "toylib" / "notez.txt")
  obs, _ = observe(ws, call("read_file", path="toylib/note.txt"))
  assert obs == ("error: 'toylib/note.txt': no such file; close paths: toylib/, "
                 "toylib/__init__.py")


def test_run_tests_refuses_options_and_missing_files(ws):
  obs, _ = observe(ws, call("run_tests", tests=["-p", "evil"]))
  assert obs == "error: run_tests: '-p' is an option, not a test"
  obs, _ = observe(ws, call("run_tests", tests=["tests/test_nope.py"]))
  assert obs == "error: run_tests: 'tests/test_nope.py': no such test file"
  obs, _ = observe(ws, call("run_tests", tests=[3]))
  assert "must be a list of test ids" in obs


def test_long_output_is_cut_and_marked(ws):
  obs, _ = observe(ws, call("read_file", path="toylib/__init__.py"))
  assert len(obs) < 500 and obs.endswith("characters]") and "[output cut: showing 400 of" in obs


# ------------------------------------------------------------------ stop reasons


def test_stop_reasons_and_info(ws):
  ep = episode_lib.SweEpisode(ws, episode_lib.Budget(max_turns=4, max_errors=2, echo_k=3))
  ep.step(call("list_dir"))
  ep.step(call("list_dir"))
  ep.step(call("read_file", path="pyproject.toml"))
  assert not ep.done
  ep.step(call("list_dir"))
  assert ep.stop == "max_turns"
  with pytest.raises(RuntimeError, match="stopped"):
    ep.step(call("submit"))

  echo = episode_lib.SweEpisode(ws, episode_lib.Budget(echo_k=3))
  for _ in range(3):
    echo.step(call("grep", pattern="def"))
  assert echo.stop == "echo_trap" and len(echo.turns) == 3

  errors = episode_lib.SweEpisode(ws, episode_lib.Budget(max_errors=2))
  errors.step("no call at all")
  errors.step(call("read_file", path="../x"))
  assert errors.stop == "tool_error"

  done = episode_lib.SweEpisode(ws)
  done.step(call("nope"))
  done.step(call("list_dir", path="toylib"))
  done.step(call("submit"))
  assert done.stop == "submitted"
  assert done.info() == {
      "turns": 3, "stop": "submitted", "submitted": True, "refused_paths": 0,
      "git_internals": 0,
      "tool_calls": [{"name": "list_dir", "turn": 1, "args": {"path": "toylib"}, "ok": True},
                     {"name": "submit", "turn": 2, "args": {}, "ok": True}]}
  assert episode_lib.tool_validity(done) == pytest.approx(2 / 3)
  assert not episode_lib.tested_before_submit(done)


# ------------------------------------------------------------------ real episodes


@pytest.fixture(scope="module")
def toy_task(toy_tree, suite):
  config = synth.SynthConfig(max_tasks=1, max_candidates=6, kinds=("operator_swap",),
                             stability_runs=1)
  tasks, stats = synth.synthesize(TOY, toy_tree, suite, config)
  assert tasks, stats
  return tasks[0]


def test_oracle_through_the_tools_resolves_and_idle_submit_does_not(toy_tree, toy_task,
                                                                    suite, tmp_path):
  m = toy_task.mutation
  repo.checkout(toy_tree, toy_task, tmp_path / "oracle")
  ws = tools.Workspace(tmp_path / "oracle", suite, TOY.tests)
  ep = episode_lib.SweEpisode(ws)
  before = ep.step(call("run_tests", tests=list(toy_task.FAIL_TO_PASS)))
  assert before.startswith(f"{len(toy_task.FAIL_TO_PASS)} failed\nFAILED ")
  read, fix, test, submit = agents.oracle_turns(toy_task)
  assert m.replace.strip() in ep.step(read)
  assert ep.step(fix).startswith(f"replaced 1 occurrence in {m.file} at line")
  assert ep.step(test) == f"{len(toy_task.FAIL_TO_PASS)} passed"
  assert ep.step(call("run_tests")) == "7 passed"  # no tests named: the test folders
  assert ep.step(submit) == "submitted" and ep.stop == "submitted"
  verdict = repo.grade(toy_task, toy_tree, tmp_path / "oracle", suite, TOY.tests)
  assert verdict.resolved and verdict.changed == (m.file,)
  assert episode_lib.reward_parts(verdict, ep) == {
      "correct": 1.0, "partial": 1.0, "tamper": 0.0, "tool_validity": 1.0,
      "tested_before_submit": 1.0}

  repo.checkout(toy_tree, toy_task, tmp_path / "idle")
  idle = episode_lib.SweEpisode(tools.Workspace(tmp_path / "idle", suite, TOY.tests))
  idle.step(call("submit"))
  verdict = repo.grade(toy_task, toy_tree, tmp_path / "idle", suite, TOY.tests)
  assert not verdict.resolved and verdict.f2p_fraction == 0.0
  assert episode_lib.reward_parts(verdict, idle)["correct"] == 0.0


@FUZZ
@given(model_text(), st.sampled_from(TOOL_FIELDS), st.text(max_size=40))
def test_any_model_text_is_an_observation_never_a_crash(tmp_path_factory, text, field, value):
  ws = tools.Workspace(write_toy(tmp_path_factory.mktemp("fuzz") / "repo"), NoSuite(),
                       TOY.tests)
  ep = episode_lib.SweEpisode(ws)
  for turn in (text, "```tool\n" + text + "\n```",
               call("read_file", **{field: value}), call("grep", pattern=value or "x",
                                                         path=value)):
    with within(what="step"):
      obs = ep.step(turn)
    assert isinstance(obs, str) and len(obs) <= 4000 + 60
    if ep.done:
      break
