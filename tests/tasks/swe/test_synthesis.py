"""Synthesis on the toy library, against mutants and F2P sets worked out by hand."""

from __future__ import annotations

import random
import subprocess

import pytest

from evotrainer.tasks.swe import agents, mutate, repo, runner, synth

from tests.tasks.swe.conftest import TOY, TOY_LIB, TOY_TEST_IDS


def test_sites_and_mutants_by_hand():
  source = "def f(a, b):\n    if a < b:\n        return g(a, b)\n    x = a + 1\n    return x\n"
  found = mutate.sites(source)
  kinds = sorted((s.kind, s.line) for s in found)
  assert kinds == [("constant_change", 4), ("inverted_condition", 2), ("operator_swap", 2),
                   ("operator_swap", 4), ("removed_statement", 4), ("swapped_arguments", 3)]
  assert {s.function for s in found} == {"f"}
  by_kind = {s.kind + str(s.line): s for s in found}
  assert mutate.mutate(source, by_kind["operator_swap2"]) == source.replace("a < b", "a <= b")
  assert mutate.mutate(source, by_kind["operator_swap4"]) == source.replace("a + 1", "a - 1")
  assert mutate.mutate(source, by_kind["constant_change4"]) == source.replace("a + 1", "a + 0")  # 1 -> 0, 0 -> 1, n -> n + 1
  assert mutate.mutate(source, by_kind["inverted_condition2"]) == source.replace(
      "if a < b", "if not (a < b)")
  assert mutate.mutate(source, by_kind["swapped_arguments3"]) == source.replace(
      "g(a, b)", "g(b, a)")
  assert mutate.mutate(source, by_kind["removed_statement4"]) == source.replace(
      "    x = a + 1\n", "")
  # Code outside functions is never mutated (no function to name).
  assert mutate.sites("X = 1 + 2\n") == []


def test_suite_outcomes_in_the_sandbox(toy_tree, suite):
  files = runner.repo_files(toy_tree)
  broken = dict(files, **{"toylib/__init__.py": TOY_LIB.replace("a + b", "a * b")})
  base, mutant = suite.run_many([(files, ["tests"]), (broken, ["tests"])])
  assert base.passed() == TOY_TEST_IDS
  # add(2, 3) = 6 and add(-1, 1) = -1 under `*`: exactly these two fail.
  assert mutant.passed() == TOY_TEST_IDS - {"tests/test_toylib.py::test_add",
                                            "tests/test_toylib.py::test_add_negative"}
  # pytest's assertion rewriting: the message names the call (synthesis scrubs it).
  assert mutant.messages["tests/test_toylib.py::test_add"].split() == [
      "assert", "6", "==", "5", "+", "where", "6", "=", "add(2,", "3)"]


def test_planted_operator_swap_has_the_hand_computed_f2p(toy_tree, suite):
  config = synth.SynthConfig(max_tasks=50, max_candidates=100, kinds=("operator_swap",),
                             per_function=5)
  tasks, stats = synth.synthesize(TOY, toy_tree, suite, config)
  assert stats.stable_tests == 7
  by_snippet = {t.mutation.replace.strip(): t for t in tasks}
  # add: `a + b` -> `a - b` breaks 2 + 3 and -1 + 1, nothing else.
  task = by_snippet["return a - b"]
  assert task.mutation.function == "add" and task.mutation.line == 5
  assert set(task.FAIL_TO_PASS) == {"tests/test_toylib.py::test_add",
                                    "tests/test_toylib.py::test_add_negative"}
  assert set(task.PASS_TO_PASS) == TOY_TEST_IDS - set(task.FAIL_TO_PASS)
  # clamp: `x < lo` -> `x <= lo` changes nothing the tests see: no task.
  assert "if x <= lo:" not in by_snippet
  assert stats.rejected.get("no_failing_test", 0) >= 1
  # The issue names the failing tests and their messages, never the function or file
  # (except at the easy difficulty, which names the file).
  text = task.problem_statement
  assert "test_add_negative" in text and "assert -2 == 0" in text
  assert "toylib/__init__.py" not in text.replace("The bug is in `toylib/__init__.py`.", "")
  assert "add(" not in text and "clamp" not in text
  assert task.difficulty in ("easy", "medium")


def test_every_kept_task_respects_the_bounds(toy_tasks):
  for task in toy_tasks:
    assert 1 <= len(task.FAIL_TO_PASS) <= synth.SynthConfig().max_f2p
    assert set(task.FAIL_TO_PASS) | set(task.PASS_TO_PASS) == TOY_TEST_IDS
    assert task.difficulty == ("hard" if task.mutation.kind not in mutate.ONE_TOKEN
                               else task.difficulty)


def test_checkout_is_one_commit_without_history(toy_tree, toy_tasks, tmp_path):
  task = toy_tasks[0]
  commit = repo.checkout(toy_tree, task, tmp_path / "a")
  assert repo.checkout(toy_tree, task, tmp_path / "b") == commit  # fixed author and date

  def git(*args):
    return subprocess.run(["git", *args], cwd=tmp_path / "a", capture_output=True,
                          text=True, env=repo.GIT_ENV).stdout.strip()
  assert git("log", "--all", "--format=%H") == commit
  assert git("remote") == "" and git("status", "--porcelain") == ""
  assert git("reflog") == "" and not (tmp_path / "a" / ".git" / "logs").exists()
  assert git("branch", "-a", "--format=%(refname)") == "refs/heads/main"
  text = (tmp_path / "a" / task.mutation.file).read_text()
  assert task.mutation.replace in text and task.mutation.search not in text


def _grade_with(agent, tasks, tree, suite, tmp_path):
  episodes = []
  for task in tasks:
    dest = tmp_path / task.instance_id
    repo.checkout(tree, task, dest)
    agent(task, dest)
    episodes.append(dest)
  return repo.grade_many(tasks, [tree] * len(tasks), episodes, suite,
                         [TOY.tests] * len(tasks))


def test_oracle_resolves_every_task_and_random_almost_none(toy_tree, toy_tasks, suite,
                                                           tmp_path):
  oracle = _grade_with(agents.oracle, toy_tasks, toy_tree, suite, tmp_path / "o")
  assert all(g.resolved for g in oracle), [g for g in oracle if not g.resolved]
  assert all(g.changed == (t.mutation.file,) for g, t in zip(oracle, toy_tasks))
  rng = random.Random(0)
  rand = _grade_with(lambda t, d: agents.random_agent(d, rng), toy_tasks, toy_tree, suite,
                     tmp_path / "r")
  assert sum(g.resolved for g in rand) <= 1
  # Doing nothing resolves nothing, and scores F2P 0.
  idle = _grade_with(lambda t, d: None, toy_tasks, toy_tree, suite, tmp_path / "n")
  assert not any(g.resolved for g in idle) and all(g.f2p_fraction == 0 for g in idle)


def test_grading_drops_test_edits(toy_tree, toy_tasks, suite, tmp_path):
  task = toy_tasks[0]

  def cheat(task, dest):
    # Rewrite every test to pass and add a conftest that skips everything: both are
    # test files, dropped at grading, so the bug still fails its tests.
    (dest / "tests" / "test_toylib.py").write_text(
        "".join(f"def {t.split('::')[1]}():\n    pass\n" for t in TOY_TEST_IDS))
    (dest / "conftest.py").write_text("import pytest\n@pytest.fixture(autouse=True)\n"
                                      "def _skip():\n    pytest.skip('no')\n")
  (verdict,) = _grade_with(cheat, [task], toy_tree, suite, tmp_path)
  assert not verdict.resolved and verdict.changed == ()
  assert verdict.p2p_passed == len(task.PASS_TO_PASS) and verdict.f2p_passed == 0


# Reaches into the driver (`__main__`) and makes every recorded outcome "passed".
FORGE_RESULTS = """
import sys as _s
_m = _s.modules.get("__main__")
class _Outcome(dict):
    def __setitem__(self, key, value):
        dict.__setitem__(self, key, "passed" if key == "outcome" else value)
class _Results(dict):
    def setdefault(self, key, default=None):
        return dict.setdefault(self, key, _Outcome(default or {}))
if _m is not None and hasattr(_m, "_c"):
    _m._c.results = _Results()
"""
# Patches json.dumps, which the driver took before any repository code ran.
FORGE_JSON = """
import json as _j
_dumps = _j.dumps
def _forged(obj, *args, **kwargs):
    for record in (obj.get("tests", {}) if isinstance(obj, dict) else {}).values():
        record["outcome"] = "passed"
    return _dumps(obj, *args, **kwargs)
_j.dumps = _forged
"""


def test_forged_verdicts_are_flagged_or_fail(toy_tree, toy_tasks, suite, tmp_path):
  task = toy_tasks[0]

  def appending(code):
    def agent(task, dest):
      path = dest / task.mutation.file
      path.write_text(path.read_text() + code)
    return agent
  (results,) = _grade_with(appending(FORGE_RESULTS), [task], toy_tree, suite, tmp_path / "r")
  # Library code runs in pytest's process, so digging into the driver forges the verdicts
  # (a known hole); `tampered` is the evidence a validator must act on.
  assert results.resolved and results.tampered
  (dumps,) = _grade_with(appending(FORGE_JSON), [task], toy_tree, suite, tmp_path / "j")
  assert not dumps.resolved and dumps.f2p_passed == 0
  (honest,) = _grade_with(agents.oracle, [task], toy_tree, suite, tmp_path / "o")
  assert honest.resolved and not honest.tampered
