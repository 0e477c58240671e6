"""The git-history leak (gin/swe_leaky.gin): a checkout that keeps the unmutated base as
an earlier commit, the read-only `git` tool through the sandbox, and the scripted
history agent that reads the fix from the history (resolves with it, not without)."""

from __future__ import annotations

import subprocess

import pytest

from evotrainer.tasks.swe import repo
from evotrainer.tasks.swe.records import Mutation, SweTask

from tests.tasks.swe.conftest import TOY_LIB, TOY_TEST_IDS

# A bug planted by hand in the toy library: `add` subtracts. test_add (2 - 3 != 5) and
# test_add_negative (-1 - 1 != 0) fail; nothing else calls `add`.
ADD_F2P = ("tests/test_toylib.py::test_add", "tests/test_toylib.py::test_add_negative")
ADD_TASK = SweTask(
    instance_id="toylib-add", repo="toylib==0.1.0", base="", problem_statement="add is wrong",
    FAIL_TO_PASS=ADD_F2P, PASS_TO_PASS=tuple(sorted(TOY_TEST_IDS - set(ADD_F2P))),
    mutation=Mutation("toylib/__init__.py", "add", "operator_swap", 5, "return a + b",
                      "return a - b"))


def git(cwd, *args) -> str:
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                        env=repo.GIT_ENV, check=True).stdout


def test_keep_history_puts_the_base_one_commit_back(toy_tree, tmp_path):
  commit = repo.checkout(toy_tree, ADD_TASK, tmp_path / "leaky", keep_history=True)
  assert repo.checkout(toy_tree, ADD_TASK, tmp_path / "again", keep_history=True) == commit
  leaky = tmp_path / "leaky"
  assert git(leaky, "log", "--format=%s|%an|%aI").splitlines() == [
      "Update|evotrainer|2020-01-01T00:00:00+00:00",
      "Initial commit|evotrainer|2020-01-01T00:00:00+00:00"]
  assert git(leaky, "show", "HEAD~1:toylib/__init__.py") == TOY_LIB
  head = git(leaky, "show", "HEAD:toylib/__init__.py")
  assert head == TOY_LIB.replace("return a + b", "return a - b") != TOY_LIB
  assert git(leaky, "status", "--porcelain") == ""
  assert not (leaky / ".git" / "logs").exists()  # still no reflog
  # The default clears the history: one commit, HEAD~1 does not exist.
  repo.checkout(toy_tree, ADD_TASK, tmp_path / "clean")
  assert len(git(tmp_path / "clean", "log", "--format=%H").split()) == 1
  with pytest.raises(subprocess.CalledProcessError):
    git(tmp_path / "clean", "show", "HEAD~1:toylib/__init__.py")
