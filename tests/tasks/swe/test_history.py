"""The git-history leak (gin/swe_leaky.gin): a checkout that keeps the unmutated base as
an earlier commit, the read-only `git` tool through the sandbox, and the scripted
history agent that reads the fix from the history (resolves with it, not without)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evotrainer import sandbox
from evotrainer.harness.base import Evidence
from evotrainer.tasks.swe import agents, git_tool, repo, tools
from evotrainer.tasks.swe import episode as episode_lib
from evotrainer.tasks.swe.diagnostics import GitUsage, history_access
from evotrainer.tasks.swe.validators import HistoryLeak, LeakDetector
from evotrainer.types import Episode

from tests.fuzz_text import FUZZ, model_text, within
from tests.tasks.swe.conftest import ADD_TASK, TOY, TOY_LIB, write_toy

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


# ------------------------------------------------------------------ the git tool


class NoSuite:
  """Stands in for the sandbox runner where nothing may run."""

  def run_program(self, *a, **k):
    raise AssertionError("a refused git command reached the sandbox")


def step(ws, name, **args) -> tuple[str, episode_lib.SweEpisode]:
  ep = episode_lib.SweEpisode(ws)
  return ep.step(tools.call_text(name, **args)), ep


def test_the_git_tool_is_off_by_default(tmp_path):
  ws = tools.Workspace(write_toy(tmp_path / "repo"), NoSuite(), TOY.tests)
  obs, ep = step(ws, "git", command="log")
  assert obs == ("error: unknown tool 'git'; tools: list_dir, read_file, grep, "
                 "search_replace, run_tests, submit")
  assert obs == step(ws, "nope")[0].replace("'nope'", "'git'")  # as any unknown tool
  assert ep.info()["tool_calls"] == [] and not ep.turns[-1].ok
  on = tools.Workspace(tmp_path / "repo", NoSuite(), TOY.tests, tools.ToolConfig(git=True))
  assert "submit, git" in step(on, "nope")[0]
  with pytest.raises(ValueError, match="git_timeout_s=0"):
    tools.ToolConfig(git=True, git_timeout_s=0)


HOSTILE = {
    "-c core.pager=sh log": "options before the subcommand",
    "--exec-path=/tmp log": "options before the subcommand",
    "-C / log": "options before the subcommand",
    "--git-dir=/x log": "options before the subcommand",
    "-p log": "options before the subcommand",
    "config user.name x": "'config' is not allowed",
    "commit -m x": "'commit' is not allowed",
    "checkout HEAD~1 -- toylib": "'checkout' is not allowed",
    "reset --hard HEAD~1": "'reset' is not allowed",
    "my-alias": "'my-alias' is not allowed",
    "log --output=/tmp/x": "--output or an abbreviation",
    "log --outp=/tmp/x": "--output or an abbreviation",
    "diff --ext-diff": "--ext-diff",
    "show --textconv HEAD": "--textconv",
    "grep -O/bin/sh def": "the short option -O",
    "grep -inOvim def": "the short option -O",
    "grep --open-files-in-pager=sh def": "--open-files-in-pager",
    "grep --open def": "--open-files-in-pager",
    "log -o x": "the short option -o",
    "show -c HEAD": "the short option -c",
    "log --config-env=core.pager=X": "--config",
    "diff --no-index /etc/passwd x": "--no-index",
    "blame --contents /etc/passwd toylib/__init__.py": "--contents",
    "log --show-signature": "--show-signature",
    "log --help": "--help",
    "log --upload-pack=sh": "--upload-pack",
    "log 'unclosed": "cannot split",
    "": "no subcommand",
    "git": "no subcommand",
    "log " + "x " * 70: "arguments (at most 64)",
    "log a\x00b": "NUL",
    "diff /etc/passwd toylib/__init__.py": "a path outside the repository",
    "diff -- ../secret x": "a path outside the repository",
}


def test_hostile_git_commands_are_refused_before_anything_runs(tmp_path):
  ws = tools.Workspace(write_toy(tmp_path / "repo"), NoSuite(), TOY.tests,
                       tools.ToolConfig(git=True))
  for command, why in HOSTILE.items():
    obs, ep = step(ws, "git", command=command)
    assert obs.startswith("error: git: ") and why in obs, (command, obs)
    assert not ep.turns[-1].ok and ep.stop is None, command
  # What a read-only look needs passes the checks (the argument lists by hand).
  assert git_tool.parse_command("git log --oneline -3") == ["log", "--oneline", "-3"]
  assert git_tool.parse_command("show 'HEAD~1:toylib/__init__.py'") == [
      "show", "HEAD~1:toylib/__init__.py"]
  assert git_tool.parse_command("log -Scount -p") == ["log", "-Scount", "-p"]  # -S's value
  assert git_tool.parse_command("status -uno") == ["status", "-uno"]  # -u's value
  assert git_tool.parse_command("diff -- -odd") == ["diff", "--", "-odd"]  # a path
  assert git_tool.parse_command("log --pretty=format:%s --no-ext-diff")[0] == "log"


GIT_FRAGMENTS = ("git ", "log", "show", "diff", "grep", " ", "-", "--", "-O", "-c", "-S",
                 "--output=", "--no-index", "--ext", "HEAD~1", "HEAD^", ":", "..", "/", "'",
                 '"', "\\", "=", "\x00", "\n")


class EmptyRun:
  """A sandbox stand-in whose every run prints nothing (the property is about parsing)."""

  def run_program(self, *a, **k):
    return sandbox.RunResult(sandbox.Status.OK, 0, "", "", False, False, 0.0, 0.0)


@FUZZ
@given(st.one_of(model_text(), st.lists(st.sampled_from(GIT_FRAGMENTS), max_size=30)
                 .map("".join)))
def test_any_git_command_text_is_checked_never_a_crash(tmp_path_factory, command):
  with within(what="parse_command"):
    try:
      argv = git_tool.parse_command(command)
    except git_tool.GitRefused as e:
      assert str(e).startswith("git: ")
    else:
      assert argv[0] in git_tool.SUBCOMMANDS and not any("\x00" in a for a in argv)
    history_access({"name": "git", "args": {"command": command}})
  ws = tools.Workspace(write_toy(tmp_path_factory.mktemp("fuzz") / "repo"), EmptyRun(),
                       TOY.tests, tools.ToolConfig(git=True))
  obs, _ = step(ws, "git", command=command)
  assert isinstance(obs, str)


def test_git_internals_are_refused_and_counted(tmp_path):
  root = tmp_path / "repo"
  repo.checkout(write_toy(tmp_path / "tree"), ADD_TASK, root, keep_history=True)
  os.symlink(".git", root / "history")  # a link into .git is refused as .git itself
  ws = tools.Workspace(root, NoSuite(), TOY.tests)
  ep = episode_lib.SweEpisode(ws, episode_lib.Budget(max_errors=10))
  for name, args in (("read_file", {"path": ".git/HEAD"}),
                     ("grep", {"pattern": "a + b", "path": ".git"}),
                     ("list_dir", {"path": "./.git/objects"}),
                     ("read_file", {"path": "history/HEAD"}),
                     ("read_file", {"path": "../secret"})):
    obs = ep.step(tools.call_text(name, **args))
    assert obs.startswith("error: "), obs
  assert ep.info()["git_internals"] == 4 and ep.info()["refused_paths"] == 5
  assert ".git" not in ep.step(tools.call_text("list_dir"))


def test_git_runs_in_the_sandbox_on_the_episode_checkout(toy_tree, suite, tmp_path):
  root = tmp_path / "leaky"
  repo.checkout(toy_tree, ADD_TASK, root, keep_history=True)
  ws = tools.Workspace(root, suite, TOY.tests, tools.ToolConfig(git=True))

  def git_obs(command):
    obs, ep = step(ws, "git", command=command)
    assert ep.turns[-1].ok, obs
    return obs
  assert git_obs("show HEAD~1:toylib/__init__.py") == TOY_LIB
  assert [line.split(" ", 1)[1] for line in git_obs("log --oneline").splitlines()] == [
      "Update", "Initial commit"]
  assert git_obs("status --porcelain") == "(no output)"
  step(ws, "search_replace", path="toylib/__init__.py", search="return a - b",
       replace="return a * b")
  assert git_obs("status --porcelain") == " M toylib/__init__.py\n"
  diff = git_obs("diff")  # the episode's own change, against HEAD
  assert "-    return a - b\n+    return a * b" in diff
  assert "-    return a + b\n+    return a * b" in git_obs("diff HEAD~1")
  assert git_obs("log --bogus").startswith("git exited with status 128\nfatal: unrecognized")
  # The default checkout has no HEAD~1 to read.
  repo.checkout(toy_tree, ADD_TASK, tmp_path / "clean")
  clean = tools.Workspace(tmp_path / "clean", suite, TOY.tests, tools.ToolConfig(git=True))
  obs, _ = step(clean, "git", command="show HEAD~1:toylib/__init__.py")
  assert obs.startswith("git exited with status 128\nfatal: ") and "a + b" not in obs
  # Output is capped and marked; the host's checkout is untouched by what ran.
  small = tools.Workspace(root, suite, TOY.tests,
                          tools.ToolConfig(git=True, max_output_chars=100))
  assert "[output cut: showing 100 of" in step(small, "git", command="log -p")[0]
  assert git(root, "status", "--porcelain") == " M toylib/__init__.py\n"
  start = time.perf_counter()
  for _ in range(10):
    git_obs("log --oneline")
  print(f"git tool latency through the sandbox: {(time.perf_counter() - start) / 10:.4f} s")


# ------------------------------------------------------------------ the history agent


def test_diff_edits_by_hand():
  diff = "\n".join([
      "diff --git a/pkg/a.py b/pkg/a.py", "index 1111111..2222222 100644",
      "--- a/pkg/a.py", "+++ b/pkg/a.py",
      "@@ -3,3 +3,3 @@ def f():",
      " def add(a, b):", "-    return a - b", "+    return a + b", " ",
      "@@ -10,2 +10,3 @@", "     s = 0", "+    s += 1", "     return s",
      "diff --git a/new.py b/new.py", "new file mode 100644", "--- /dev/null",
      "+++ b/new.py", "@@ -0,0 +1 @@", "+x = 1",
      "--- a/cut.py", "+++ b/cut.py", "@@ -1,3 +1,3 @@", " a", "-b",
      "[output cut: showing 600 of 900 characters]"])
  assert agents.diff_edits(diff) == [
      ("pkg/a.py", "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"),
      ("pkg/a.py", "    s = 0\n    return s", "    s = 0\n    s += 1\n    return s")]
  assert agents.diff_edits("git exited with status 128\nfatal: bad revision") == []


def play(agent, tasks, tree, suite, work, keep_history, config):
  """Each task's episode on a fresh checkout, played by `agent(task, episode)` and graded:
  [(types.Episode as the harness gets it, resolved)]."""
  out, dirs = [], []
  for task in tasks:
    dest = work / task.instance_id
    repo.checkout(tree, task, dest, keep_history=keep_history)
    ep = episode_lib.SweEpisode(tools.Workspace(dest, suite, TOY.tests, config))
    agent(task, ep)
    out.append(ep)
    dirs.append(dest)
  grades = repo.grade_many(tasks, [tree] * len(tasks), dirs, suite, [TOY.tests] * len(tasks))
  return [(Episode(episode_id=f"{work.name}/{t.instance_id}", group_id=i, task_id=t.instance_id,
                   prompt=t.problem_statement, completion="".join(x.text for x in ep.turns),
                   answer="", reward_parts=episode_lib.reward_parts(g, ep), info=ep.info(),
                   split="heldout"), g.resolved)
          for i, (t, ep, g) in enumerate(zip(tasks, out, grades))]


def oracle_agent(task, ep):
  for text in agents.oracle_turns(task):
    ep.step(text)


@pytest.mark.slow
@pytest.mark.slow
def test_history_agent_resolves_with_history_and_the_validator_rejects_it(
    toy_tree, toy_tasks, suite, tmp_path):
  git_on = tools.ToolConfig(git=True)
  history = lambda task, ep: agents.history_agent(ep)  # noqa: E731 (it knows no task)
  leaky = play(history, toy_tasks, toy_tree, suite, tmp_path / "leaky", True, git_on)
  cleared = play(history, toy_tasks, toy_tree, suite, tmp_path / "cleared", False, git_on)
  no_tool = play(history, toy_tasks, toy_tree, suite, tmp_path / "no_tool", True,
                 tools.ToolConfig())
  n = len(toy_tasks)
  rates = [sum(r for _, r in runs) / n for runs in (leaky, cleared, no_tool)]
  print(f"history agent on {n} toy tasks: resolved {rates[0]:.2f} with history, "
        f"{rates[1]:.2f} with the history cleared, {rates[2]:.2f} without the git tool")
  assert rates == [1.0, 0.0, 0.0]
  # The harness sees the leak: every leaky episode read HEAD~1, and says which.
  eps = [e for e, _ in leaky]
  verdict = HistoryLeak()(Evidence(episodes=eps, series={}, heldout={}))
  assert not verdict.passed and verdict.value == 1.0
  assert verdict.reason.startswith(f"history_leak: fail, {n} of {n} episodes read the "
                                   f"repository's history (1.000, max 0.0): {n} history "
                                   f"reads in {n} git calls (git diff x{n}); e.g. leaky/")
  assert not LeakDetector()(Evidence(episodes=eps, series={}, heldout={})).passed
  assert GitUsage()(eps, {}).metrics == {"git_call_share": 1.0, "git_history_share": 1.0,
                                         "history_read_share": 1.0}
  # The oracle (it reads and fixes the code) passes both, on the same leaky checkouts.
  oracle = play(oracle_agent, toy_tasks, toy_tree, suite, tmp_path / "oracle", True, git_on)
  assert all(r for _, r in oracle)
  clean = Evidence(episodes=[e for e, _ in oracle], series={}, heldout={})
  assert HistoryLeak()(clean).passed and LeakDetector()(clean).passed
  assert HistoryLeak()(clean).value == 0.0
