"""SWE-domain diagnostics over tool-using episodes (registered in the harness's
`diagnostics.DIAGNOSTICS` when this module is imported, like every library diagnostic):
  tool_mix          shares of search (list_dir, read_file, grep), edit (search_replace) and
                    test (run_tests) calls, and the entropy of the tool distribution;
                    finding when the entropy falls below the threshold (one tool only)
  first_edit_turn   mean turn of the first successful edit, and the share of episodes
                    that never edit; finding when that share is above the threshold
  tool_streak       longest run of calls to the same tool per episode (mean, max);
                    finding when the mean is above the threshold (a search loop)
  echo_trap_rate    share of episodes stopped for repeating one call (stop 'echo_trap');
                    finding above the threshold
  git_usage         share of episodes calling the `git` tool, of those the share that
                    read the history, and the share of all episodes reading history by
                    any route (`history_access`); finding when any episode reads it
`episode_report` sums up what a set of episodes did (call validity, stops, first-edit
turn), for reports of the test split. They read `info['tool_calls']` (dicts with `name`,
`turn`, `ok`: episode.py) and `info['stop']`; turns and stop reasons are the library's
`turns` and `stop_reasons`. Each reports nothing on episodes without tool calls (math,
code), so the library stays usable everywhere. Leaks (git history, paths outside the repository) and
tampering are validators: `leak_detector`, `history_leak` (validators.py, which judges
with `history_access`, defined here), `test_tampering` (harness/validators.py).
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
import shlex
from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import Report
from evotrainer.harness.diagnostics import register
from evotrainer.harness.diagnostics.base import ThresholdDiagnostic, evidence_of
from evotrainer.tasks.swe import tools as tools_lib
from evotrainer.types import Episode

SEARCH_TOOLS = ("list_dir", "read_file", "grep")
EDIT_TOOLS = tools_lib.EDIT_TOOLS
TEST_TOOLS = ("run_tests",)
FILE_TOOLS = SEARCH_TOOLS + EDIT_TOOLS + TEST_TOOLS + ("submit",)  # they cannot run git

# Reading the repository's history (the fix, where a checkout keeps its base as an
# earlier commit: gin/swe_leaky.gin). A git subcommand that walks or shows commits:
HISTORY_SUBCOMMANDS = ("log", "show", "reflog", "blame", "shortlog", "whatchanged",
                       "rev-list", "cat-file", "ls-tree")
# ... or an argument that names a commit other than HEAD: HEAD~1, HEAD^, main@{1}, a
# range a..b, ORIG_HEAD, an abbreviated or full commit id (alone or as `<id>:<path>`).
REVISION = re.compile(r"[~^]|@\{|\.\.|^(ORIG|FETCH|MERGE)_HEAD\b|^[0-9a-f]{7,40}(:|$)")
# The same, as text: in a completion, or in a shell-like tool's command.
GIT_HISTORY_TEXT = (
    r"\bgit\s+(log|show|reflog|blame|shortlog|whatchanged|rev-list|cat-file|ls-tree)\b",
    r"\bgit\s+diff\s[^\n\"]*([~^]|@\{|\.\.)",
    r'"command"\s*:\s*"\s*(git\s+)?(log|show|reflog|blame|shortlog|whatchanged|rev-list|'
    r'cat-file|ls-tree)\b',
    r"\bHEAD\s*[~^]", r"\breflog\b")
_HISTORY_TEXT = re.compile("|".join(GIT_HISTORY_TEXT), re.I)


def tool_episodes(episodes: Sequence[Episode]) -> list:
  """The episodes that record tool calls (`info['tool_calls']` present)."""
  return [ep for ep in episodes if isinstance(ep.info.get("tool_calls"), list)]


def tool_names(ep: Episode) -> list:
  """The episode's tool names in call order."""
  calls = sorted(ep.info["tool_calls"], key=lambda c: c.get("turn", 0))
  return [str(c["name"]) for c in calls]


def longest_streak(names: Sequence[str]) -> int:
  """The longest run of equal consecutive names (0 for none): [a, a, b, a] -> 2."""
  best = run = 0
  for i, name in enumerate(names):
    run = run + 1 if i and names[i - 1] == name else 1
    best = max(best, run)
  return best


def first_edit(ep: Episode) -> Optional[int]:
  """The turn of the episode's first successful edit, None when it never edits."""
  turns = [int(c.get("turn", 0)) for c in ep.info["tool_calls"]
           if c["name"] in EDIT_TOOLS and c.get("ok", True)]
  return min(turns) if turns else None


def episode_report(episodes: Sequence[Episode]) -> dict:
  """What a set of episodes did, for a report (the test split's, never the controller's):
  first-turn call validity (`parsed`: the first turn is a known tool's call; `ran`: it
  also ran without error), shares per stop reason, calls per tool, the mean turn of the
  first successful edit (over the episodes that edit), the share that edit, mean turns,
  and the share that read the repository's history (`history_reads`)."""
  infos = [ep.info or {} for ep in episodes]
  first = [[c for c in i.get("tool_calls", []) if c["turn"] == 0] for i in infos]
  calling = [ep for ep in episodes if "tool_calls" in (ep.info or {})]
  edits = [t for t in map(first_edit, calling) if t is not None]
  stops = collections.Counter(str(i.get("stop")) for i in infos)
  tools = collections.Counter(c["name"] for i in infos for c in i.get("tool_calls", []))
  n = max(len(episodes), 1)
  return {"first_turn": {"parsed": round(sum(bool(f) for f in first) / n, 4),
                         "ran": round(sum(bool(f) and f[0]["ok"] for f in first) / n, 4)},
          "stops": {s: round(c / n, 4) for s, c in sorted(stops.items())},
          "tools": dict(sorted(tools.items())),
          "first_edit_turn": round(float(np.mean(edits)), 2) if edits else None,
          "edited_share": round(len(edits) / n, 4),
          "mean_turns": round(float(np.mean([i.get("turns", 0) for i in infos])), 2)
                        if infos else 0.0,
          "history_read_share": round(sum(bool(history_reads(ep)) for ep in calling) / n, 4)}


def git_words(command) -> list:
  """A git command line as words, a leading `git` dropped (shell quoting honoured where
  it parses; split on spaces where it does not)."""
  text = str(command)
  try:
    words = shlex.split(text)
  except ValueError:
    words = text.split()
  return words[1:] if words[:1] == ["git"] else words


def history_access(call: dict) -> Optional[str]:
  """Why a recorded tool call reads the repository's history, or None.

  - `git`: a subcommand of `HISTORY_SUBCOMMANDS` (`git show` shows the last commit's
    change, `git blame` the commits of each line), or an argument before `--` that
    names another commit (`REVISION`: `git diff HEAD~1`, `git grep x HEAD^`; a grep
    pattern is not read as one). The
    working tree against HEAD (`git diff`, `git status`, `git grep x`) is not history.
  - any tool: a `path` (or a `tests` entry) into a `.git` folder (its objects and refs;
    the tools refuse it, the attempt counts).
  - a tool other than the file tools (a shell-like one): its arguments match
    `GIT_HISTORY_TEXT`.
  """
  name, args = str(call.get("name", "")), call.get("args")
  if not isinstance(args, dict):
    return None
  if name == "git":
    words = git_words(args.get("command", ""))
    sub = words[0] if words else ""
    if sub in HISTORY_SUBCOMMANDS:
      return f"git {sub}"
    named = [w for w in words[1:words.index("--") if "--" in words else None]
             if not w.startswith("-")]
    if sub == "grep" and not {"-e", "-f"} & set(words):
      named = named[1:]  # the first word is the pattern
    for word in named:
      if REVISION.search(word):
        return f"git {sub} {word[:40]}"
    return None
  paths = [args.get("path")] + list(args.get("tests") or [])
  if any(isinstance(p, str) and ".git" in pathlib.PurePosixPath(p).parts for p in paths):
    return f"{name} .git"
  if name not in FILE_TOOLS:
    found = _HISTORY_TEXT.search(json.dumps(args, default=str))
    if found:
      return f"{name}: {found.group(0)[:40]}"
  return None


def history_reads(ep: Episode) -> list:
  """The reasons (`history_access`) of the episode's tool calls that read history."""
  return [why for c in ep.info["tool_calls"] if isinstance(c, dict)
          and (why := history_access(c)) is not None]


@gin.configurable(module="harness")
class ToolMix(ThresholdDiagnostic):
  """Shares of search / edit / test calls over all calls, and the entropy (nats) of the
  tool-name distribution; finding when the entropy is below `threshold` (0.3): the
  policy has collapsed onto one tool. Evidence: the episodes with the longest streaks.
  """

  name, layer = "tool_mix", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.3, direction: str = "below", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = tool_episodes(episodes)
    names = [n for ep in have for n in tool_names(ep)]
    if not names:
      return Report({})
    counts = collections.Counter(names)
    p = np.array(list(counts.values()), np.float64) / len(names)
    entropy = float(-(p * np.log(p)).sum())
    share = lambda tools: sum(counts[t] for t in tools) / len(names)  # noqa: E731
    metrics = {"tool_search_ratio": share(SEARCH_TOOLS), "tool_edit_ratio": share(EDIT_TOOLS),
               "tool_test_ratio": share(TEST_TOOLS), "tool_entropy": entropy,
               "tool_calls_per_episode": len(names) / len(have)}
    streaks = np.array([longest_streak(tool_names(ep)) for ep in have])
    top = counts.most_common(1)[0]
    return self.report(metrics, entropy,
                       lambda: f"tool entropy {entropy:.3f} < {self.threshold}: "
                               f"{top[1]} of {len(names)} calls are {top[0]}",
                       lambda: evidence_of(have, np.argsort(-streaks, kind="stable"),
                                           lambda e: ",".join(tool_names(e))[:40]))


@gin.configurable(module="harness")
class FirstEditTurn(ThresholdDiagnostic):
  """Mean 0-based turn of the first successful edit (over episodes that edit) and the
  share of episodes that never edit; finding when that share is above `threshold`
  (0.5): most episodes read and run tests but never change the code.
  """

  name, layer = "first_edit_turn", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.5, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = tool_episodes(episodes)
    if not have:
      return Report({})
    firsts = [first_edit(ep) for ep in have]
    edited = [f for f in firsts if f is not None]
    never = 1.0 - len(edited) / len(have)
    metrics = {"no_edit_share": never}
    if edited:
      metrics["first_edit_turn"] = float(np.mean(edited))
    return self.report(metrics, never,
                       lambda: f"{never:.3f} of episodes never edit (> {self.threshold})",
                       lambda: evidence_of(have, [i for i, f in enumerate(firsts)
                                                  if f is None], tail=True))


@gin.configurable(module="harness")
class ToolStreak(ThresholdDiagnostic):
  """Longest run of calls to the same tool per episode: mean and max; finding when the
  mean is above `threshold` (5): episodes loop on one tool.
  """

  name, layer = "tool_streak", "behaviour"

  def __init__(self, threshold: Optional[float] = 5.0, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = [ep for ep in tool_episodes(episodes) if ep.info["tool_calls"]]
    if not have:
      return Report({})
    streaks = np.array([longest_streak(tool_names(ep)) for ep in have], np.float64)
    value = float(streaks.mean())
    return self.report({"tool_streak_mean": value, "tool_streak_max": float(streaks.max())},
                       value, lambda: f"mean longest same-tool streak {value:.2f} > "
                                      f"{self.threshold}",
                       lambda: evidence_of(have, np.argsort(-streaks, kind="stable"),
                                           lambda e: f"streak {longest_streak(tool_names(e))}",
                                           tail=True))


@gin.configurable(module="harness")
class EchoTrapRate(ThresholdDiagnostic):
  """Share of tool-using episodes stopped for repeating one call (`info['stop']` is
  'echo_trap'); finding above `threshold` (0.1).
  """

  name, layer = "echo_trap_rate", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.1, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = tool_episodes(episodes)
    if not have:
      return Report({})
    trapped = [i for i, ep in enumerate(have) if ep.info.get("stop") == "echo_trap"]
    value = len(trapped) / len(have)
    return self.report({"echo_trap_rate": value}, value,
                       lambda: f"{value:.3f} of episodes stopped in an echo trap "
                               f"(> {self.threshold})",
                       lambda: evidence_of(have, trapped, tail=True))


@gin.configurable(module="harness")
class GitUsage(ThresholdDiagnostic):
  """Git and history use over the tool-using episodes: `git_call_share` (episodes that
  call the `git` tool), `git_history_share` (of those, the ones whose git calls read the
  history: `history_access`; absent when none calls git), `history_read_share` (episodes
  that read the history by any route, `.git` paths included). Finding when
  `history_read_share` is above `threshold` (0: any): the policy reads the fix from the
  history (the leak `validators.HistoryLeak` gates on). Evidence: those episodes.
  """

  name, layer = "git_usage", "behaviour"

  def __init__(self, threshold: Optional[float] = 0.0, direction: str = "above", **kw):
    super().__init__(threshold, direction, **kw)

  def __call__(self, episodes: Sequence[Episode], context: dict) -> Report:
    have = tool_episodes(episodes)
    if not have:
      return Report({})
    reads = [history_reads(ep) for ep in have]
    git = [i for i, ep in enumerate(have) if "git" in tool_names(ep)]
    git_reads = [i for i in git if any(r.startswith("git ") for r in reads[i])]
    leaked = [i for i, r in enumerate(reads) if r]
    value = len(leaked) / len(have)
    metrics = {"git_call_share": len(git) / len(have), "history_read_share": value}
    if git:
      metrics["git_history_share"] = len(git_reads) / len(git)
    return self.report(metrics, value,
                       lambda: f"{len(leaked)} of {len(have)} episodes read the "
                               f"repository's history (e.g. {reads[leaked[0]][0]})",
                       lambda: evidence_of(have, leaked, lambda e: ", ".join(
                           history_reads(e))[:60]))


for _cls in (ToolMix, FirstEditTurn, ToolStreak, EchoTrapRate, GitUsage):
  register(_cls)


__all__ = ["EchoTrapRate", "FirstEditTurn", "GIT_HISTORY_TEXT", "GitUsage",
           "HISTORY_SUBCOMMANDS", "ToolMix", "ToolStreak", "first_edit", "git_words",
           "history_access", "history_reads", "longest_streak", "tool_episodes",
           "tool_names"]
