"""The episode's tools, and the call syntax the model writes to use them.

Call syntax: one call per model turn, as one fenced block tagged `tool` holding one JSON
object `{"tool": NAME, "args": {...}}` (`args` may be left out when a tool takes none):

    ```tool
    {"tool": "read_file", "args": {"path": "toylib/__init__.py", "start": 1, "end": 40}}
    ```

Text around the block is the model's own (its reasoning); it is not read. No block, two
blocks, a block that is not such an object, an unknown tool, a missing, unknown or
mistyped argument: each is a `CallError` whose message is the observation the model
gets back (`Workspace.execute` never raises on model input).

Tools (paths are relative to the repository root, "/" separated):
  list_dir(path=".")                         entries, folders with a trailing "/"
  read_file(path, start=1, end=start+199)    numbered lines `start..end` (1-based, inclusive)
  grep(pattern, path=".")                    lines containing `pattern` (a fixed string,
                                             not a regex: model text never drives a regex
                                             engine on the host), as `path:line: text`
  search_replace(path, search, replace)      `search` must occur exactly once in the file
                                             (exact match); else the file is left as is
                                             and the observation says how many times,
                                             with what would have worked: where an
                                             ambiguous text occurs, or for a missing
                                             one the lines it matches but for
                                             whitespace, else the closest lines
                                             (hints.py). With
                                             `ToolConfig.indent_tolerant`, a text
                                             that is not in the file but matches one
                                             run of whole lines once each line's
                                             leading and trailing whitespace is
                                             ignored replaces those lines, indented as
                                             the file's first matched line
                                             (`indent_edit`), and the observation
                                             shows the lines as written
  run_tests(tests=[])                        pytest node ids or test files; [] runs the
                                             task's test folders. Runs in a sandbox cell
                                             (`runner.SuiteRunner`), never on the host
  submit()                                   ends the episode; grading follows
  edit_function(code, path=None)             only with `ToolConfig.code_edits`: the
                                             code's one function replaces the
                                             repository's function of that name (the
                                             closest one where several share it), and
                                             a ```python block defining a function is
                                             this call when the turn has no ```tool
                                             block (pyedit.py)
  git(command)                               only with `ToolConfig.git` (off by
                                             default: an unknown tool otherwise): a
                                             read-only git command line, e.g.
                                             "log --oneline", run in a sandbox cell
                                             (git_tool.py)

A path that does not exist gets the repository's nearest paths in its error (hints.py;
symlinks and hard-linked files are never offered). A path that is absolute, climbs out
with "..", reaches outside the repository through a symlink, names `.git` (or leads
into it through a symlink), or is a file with more than one name (a hard link, whose
other name may lie outside) is refused (the observation says so); the refusal is
recorded (`.git` ones apart: `Turn.git_internals`), and the leak validators read such
attempts (`validators.SWE_OUTSIDE_REPO`, `validators.HistoryLeak`). `grep`, `run_tests`
and `git` leave hard-linked files out of what they read. Every observation is capped at
`ToolConfig.max_output_chars` and ends with a note when cut.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import pathlib
import re
import stat
from typing import Optional, Sequence

from evotrainer.tasks.swe import git_tool, hints, pyedit
from evotrainer.tasks.swe import repo as repo_lib
from evotrainer.tasks.swe import runner as runner_lib

FENCE = re.compile(r"```tool[ \t]*\r?\n(.*?)```", re.S)
MAX_CALL_CHARS = 20_000    # a longer block is refused unread (a cost bound on model text)
MAX_MODEL_CHARS = 200_000  # only this much of a turn's text is searched for the block
MAX_PATHS = 5000           # repository paths a missing path is compared with
SKIP = {".git", "__pycache__", ".pytest_cache"}

# name -> {argument: (accepted types, required)}
TOOL_ARGS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "list_dir": {"path": ((str,), False)},
    "read_file": {"path": ((str,), True), "start": ((int,), False), "end": ((int,), False)},
    "grep": {"pattern": ((str,), True), "path": ((str,), False)},
    "search_replace": {"path": ((str,), True), "search": ((str,), True),
                       "replace": ((str,), True)},
    "run_tests": {"tests": ((list,), False)},
    "submit": {},
}
TOOLS = tuple(TOOL_ARGS)
EDIT_TOOLS = ("search_replace", "edit_function")  # the tools that change a file
GIT_ARGS = {"command": ((str,), True)}  # the `git` tool, where `ToolConfig.git` is on
# `edit_function`, where `ToolConfig.code_edits` is on (also written as a ```python block)
EDIT_ARGS = {"code": ((str,), True), "path": ((str,), False)}


class CallError(ValueError):
  """A turn whose text is not a valid call; the message is the observation."""


class PathRefused(CallError):
  """A path outside the repository (absolute, `..`, a symlink out, `.git`), or a hard
  link: a file whose other names may lie outside, out of reach of the checks on names."""


class GitInternalsRefused(PathRefused):
  """A path into the repository's `.git` folder (its history's objects and refs)."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One parsed call: the tool's name and its arguments (validated against `TOOL_ARGS`)."""
  name: str
  args: dict

  def key(self) -> str:
    """A canonical text of the call: equal calls have equal keys (the echo-trap test)."""
    return json.dumps({"tool": self.name, "args": self.args}, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class ToolConfig:
  """Knobs of the tools.

  Attributes:
    max_output_chars: an observation longer than this is cut, and says so.
    read_lines: lines `read_file` shows when no `end` is given.
    grep_matches: the most matching lines `grep` lists.
    test_timeout_s: wall-clock limit of one `run_tests` run in the sandbox.
    git: offer the read-only `git` tool (git_tool.py). Off by default: a `git` call is
      then an unknown tool. On, with a checkout that keeps its history
      (`repo.checkout(keep_history=True)`), the history holds the fix: the leak of
      gin/swe_leaky.gin, which `validators.HistoryLeak` catches.
    git_timeout_s: wall-clock limit of one `git` run in the sandbox.
    indent_tolerant: a `search_replace` whose text is not in the file but matches
      exactly one run of whole lines once each line's leading and trailing whitespace
      is ignored edits those lines (`indent_edit`), saying which and what it wrote.
      Off: the edit is refused and the hint shows the file's exact text.
    code_edits: offer `edit_function(code, path)` (pyedit.py), and read a turn with no
      ```tool block whose ```python block defines a function as that call: the block's
      function replaces the repository's function of the same name. Off: a python
      block is no call.
  """
  max_output_chars: int = 4000
  read_lines: int = 200
  grep_matches: int = 50
  test_timeout_s: float = 60.0
  git: bool = False
  git_timeout_s: float = 10.0
  indent_tolerant: bool = False
  code_edits: bool = False

  def __post_init__(self):
    if not self.git_timeout_s > 0:
      raise ValueError(f"ToolConfig.git_timeout_s={self.git_timeout_s}: expected seconds > 0")

  def tool_args(self) -> dict[str, dict[str, tuple[tuple[type, ...], bool]]]:
    """The offered tools: {name: {argument: (types, required)}}."""
    offered = {**TOOL_ARGS, "git": GIT_ARGS} if self.git else dict(TOOL_ARGS)
    if self.code_edits:
      offered["edit_function"] = EDIT_ARGS
    return offered


def call_text(name: str, **args) -> str:
  """A call written in the documented syntax (what scripted agents and the warm start
  write): `call_text("submit")` is a ```tool block holding {"tool": "submit", "args": {}}."""
  return "```tool\n" + json.dumps({"tool": name, "args": args}) + "\n```"


def parse_call(text: str, tool_args: Optional[dict] = None) -> ToolCall:
  """The call in one model turn (see the module docstring for the syntax); `tool_args`
  are the offered tools (`ToolConfig.tool_args`; default `TOOL_ARGS`).

  Raises:
    CallError: no block, several blocks, bad JSON, an unknown tool or bad arguments; the
      message tells the model what was expected.
  """
  blocks = FENCE.findall(text[:MAX_MODEL_CHARS])
  offered = TOOL_ARGS if tool_args is None else tool_args
  code = (pyedit.python_block(text[:MAX_MODEL_CHARS])
          if not blocks and "edit_function" in offered else None)
  if code is not None:
    if len(code) > MAX_CALL_CHARS:
      raise CallError(f"the python block has {len(code)} characters (at most "
                      f"{MAX_CALL_CHARS})")
    return ToolCall("edit_function", {"code": code})
  if not blocks:
    raise CallError('no tool call: write one block per turn:\n```tool\n'
                    '{"tool": NAME, "args": {...}}\n```' +
                    ("\nor the whole fixed function in one ```python block"
                     if "edit_function" in offered else ""))
  if len(blocks) > 1:
    raise CallError(f"{len(blocks)} tool blocks in one turn; write exactly one")
  body = blocks[0].strip()
  if len(body) > MAX_CALL_CHARS:
    raise CallError(f"the tool block has {len(body)} characters (at most {MAX_CALL_CHARS})")
  try:
    obj = json.loads(body)
  except (ValueError, RecursionError) as e:
    raise CallError(f"the tool block is not JSON: {str(e)[:200]}") from None
  if not isinstance(obj, dict) or not isinstance(obj.get("tool"), str):
    raise CallError('the tool block must be one JSON object {"tool": NAME, "args": {...}}')
  extra = sorted(set(obj) - {"tool", "args"})
  if extra:
    raise CallError(f"unknown key(s) {extra} in the call; only 'tool' and 'args'")
  name, args = obj["tool"], obj.get("args", {})
  if name not in offered:
    raise CallError(f"unknown tool {name[:80]!r}; tools: {', '.join(offered)}")
  if not isinstance(args, dict):
    raise CallError(f"{name}: 'args' must be a JSON object")
  spec = offered[name]
  unknown = sorted(set(args) - set(spec))
  if unknown:
    raise CallError(f"{name}: unknown argument(s) {unknown}; it takes {sorted(spec) or 'none'}")
  for arg, (types, required) in spec.items():
    if arg not in args:
      if required:
        raise CallError(f"{name}: missing argument {arg!r}")
      continue
    value = args[arg]
    if isinstance(value, bool) or not isinstance(value, types):
      raise CallError(f"{name}: argument {arg!r} must be {types[0].__name__}, got "
                      f"{type(value).__name__}")
  return ToolCall(name, dict(args))


def cap(text: str, max_chars: int) -> str:
  """`text`, or its first `max_chars` characters and a note saying how much was cut."""
  if len(text) <= max_chars:
    return text
  return (text[:max_chars] + f"\n[output cut: showing {max_chars} of {len(text)} "
          f"characters]")


class Workspace:
  """The tools acting on one episode's copy of a task's repository (`repo.checkout`).

  Args:
    root: the episode's repository.
    suite: runs `run_tests` in sandbox cells.
    test_dirs: the task's test folders (what `run_tests` with no tests runs).
    config: see `ToolConfig`.

  Raises:
    ValueError: `config.git` is on and this machine has no `git_tool.GIT`.
  """

  def __init__(self, root: os.PathLike | str, suite: runner_lib.SuiteRunner,
               test_dirs: Sequence[str] = ("tests",), config: ToolConfig = ToolConfig()):
    self.root = pathlib.Path(root).resolve()
    self.suite, self.test_dirs, self.config = suite, tuple(test_dirs), config
    self.tool_args = config.tool_args()
    if config.git and not os.access(git_tool.GIT, os.X_OK):
      raise ValueError(f"ToolConfig.git is on but {git_tool.GIT} is not an executable "
                       "here (install git, or turn the tool off)")
    self._git_dir: Optional[dict[str, str]] = None  # .git's files: the tools never write it

  # ---------------------------------------------------------------- paths

  def resolve(self, path: str) -> pathlib.Path:
    """The file or folder `path` names inside the repository.

    Raises:
      PathRefused: absolute, `..`, a symlink leading out, `.git`.
      CallError: a NUL in the path, a symlink loop.
    """
    if "\x00" in path:
      raise CallError(f"{path[:80]!r}: not a valid path")
    pure = pathlib.PurePosixPath(path)
    if pure.is_absolute() or path.startswith("~") or ".." in pure.parts:
      raise PathRefused(f"{path[:200]!r}: outside the repository (paths are relative to "
                        f"its root; no '..', no absolute paths)")
    git_refusal = GitInternalsRefused(f"{path[:200]!r}: the repository's .git folder "
                                      f"is not readable through the tools")
    if ".git" in pure.parts:
      raise git_refusal
    try:
      full = (self.root / pure).resolve()
    except (OSError, RuntimeError):  # a symlink loop
      raise CallError(f"{path[:200]!r}: cannot be resolved (a symlink loop?)") from None
    if full != self.root and self.root not in full.parents:
      raise PathRefused(f"{path[:200]!r}: leads outside the repository (a symlink)")
    if full.relative_to(self.root).parts[:1] == (".git",):  # a symlink into .git
      raise git_refusal
    return full

  def _files(self, folder: pathlib.Path) -> dict[str, str]:
    """`runner.repo_files` of `folder` less the hard-linked files (see `_text`)."""
    return {rel: text for rel, text in runner_lib.repo_files(folder).items()
            if not _hard_linked(folder / rel)}

  def _rel(self, full: pathlib.Path) -> str:
    return full.relative_to(self.root).as_posix() or "."

  def _paths(self) -> list[str]:
    """The repository's paths the tools can use (folders end with "/"; no `SKIP`
    folders, symlinks or hard-linked files), at most MAX_PATHS: what `_missing` offers."""
    found = []
    for folder, dirs, files in os.walk(self.root):
      dirs[:] = sorted(d for d in dirs if d not in SKIP and
                       not os.path.islink(os.path.join(folder, d)))
      rel = pathlib.Path(folder).relative_to(self.root).as_posix()
      prefix = "" if rel == "." else rel + "/"
      found += [prefix + d + "/" for d in dirs]
      for name in sorted(files):
        full = pathlib.Path(folder) / name
        if not full.is_symlink() and not _hard_linked(full):
          found.append(prefix + name)
      if len(found) >= MAX_PATHS:
        break
    return found[:MAX_PATHS]

  def _missing(self, path: str, full: pathlib.Path, what: str) -> CallError:
    """The error for a `path` (resolved: `full`) that names no `what` ("file",
    "folder", "file or folder"): the other kind it is, or the nearest paths."""
    if full.is_dir() and what == "file":
      return CallError(f"{path[:200]!r}: a folder, not a file (list_dir lists it)")
    if full.is_file() and what == "folder":
      return CallError(f"{path[:200]!r}: a file, not a folder (read_file reads it)")
    near = hints.close_paths(pathlib.PurePosixPath(path).as_posix(), self._paths())
    return CallError(f"{path[:200]!r}: no such {what}" +
                     (f"; close paths: {', '.join(near)}" if near else ""))

  def _text(self, path: str) -> tuple[pathlib.Path, str]:
    full = self.resolve(path)
    if not full.is_file():
      raise self._missing(path, full, "file")
    if _hard_linked(full):
      raise PathRefused(f"{path[:200]!r}: a hard link (the file has other names, "
                        f"possibly outside the repository); not usable through the tools")
    if full.stat().st_size > runner_lib.MAX_FILE_BYTES:
      raise CallError(f"{path[:200]!r}: larger than {runner_lib.MAX_FILE_BYTES} bytes")
    try:
      return full, full.read_text(encoding="utf-8")
    except UnicodeDecodeError:
      raise CallError(f"{path[:200]!r}: not a UTF-8 text file") from None

  # ---------------------------------------------------------------- tools

  def list_dir(self, path: str = ".") -> str:
    full = self.resolve(path)
    if not full.is_dir():
      raise self._missing(path, full, "folder")
    names = []
    for entry in sorted(full.iterdir(), key=lambda p: p.name):
      if entry.name in SKIP:
        continue
      names.append(entry.name + ("/" if entry.is_dir() and not entry.is_symlink() else ""))
    return "\n".join(names) if names else "(empty folder)"

  def read_file(self, path: str, start: int = 1, end: Optional[int] = None) -> str:
    _, text = self._text(path)
    lines = text.splitlines()
    end = start + self.config.read_lines - 1 if end is None else end
    if start < 1 or end < start:
      raise CallError(f"read_file: need 1 <= start <= end, got start={start}, end={end}")
    if lines and start > len(lines):
      raise CallError(f"read_file: {path[:200]!r} has {len(lines)} lines; start={start}")
    shown = lines[start - 1:end]
    body = "\n".join(f"{start + i:5d}| {line}" for i, line in enumerate(shown))
    last = start + len(shown) - 1
    return f"{path} lines {start}-{last} of {len(lines)}\n{body}"

  def grep(self, pattern: str, path: str = ".") -> str:
    if not pattern:
      raise CallError("grep: empty pattern")
    full = self.resolve(path)
    if full.is_file():
      files = {self._rel(full): self._text(path)[1]}
    elif full.is_dir():
      files = self._files(full)
      prefix = self._rel(full)
      files = {(f if prefix == "." else f"{prefix}/{f}"): t for f, t in files.items()}
    else:
      raise self._missing(path, full, "file or folder")
    hits, total = [], 0
    for rel, text in sorted(files.items()):
      for number, line in enumerate(text.splitlines(), 1):
        if pattern in line:
          total += 1
          if len(hits) < self.config.grep_matches:
            hits.append(f"{rel}:{number}: {line}")
    if not hits:
      return f"no line contains {pattern[:200]!r}"
    more = (f"\n[{total - len(hits)} more matching lines not shown]"
            if total > len(hits) else "")
    return "\n".join(hits) + more

  def search_replace(self, path: str, search: str, replace: str) -> str:
    full, text = self._text(path)
    count = text.count(search) if search else 0
    edit = (indent_edit(text, search, replace)
            if count == 0 and self.config.indent_tolerant else None)
    if edit is not None:
      new_text, first, last, written = edit
      full.write_text(new_text, encoding="utf-8")
      span = f"line {first}" if first == last else f"lines {first}-{last}"
      return (f"no exact match; {span} of {self._rel(full)} match the search text but "
              f"for indentation, and now read{self._test_note(full)}:\n{written}")
    if count != 1:
      raise CallError(_missed_edit(path, text, search, count))
    full.write_text(repo_lib.search_replace(text, search, replace, path), encoding="utf-8")
    line = text[:text.index(search)].count("\n") + 1
    return (f"replaced 1 occurrence in {self._rel(full)} at line {line}"
            f"{self._test_note(full)}")

  def edit_function(self, code: str, path: Optional[str] = None) -> str:
    try:
      new = pyedit.parse_block(code)
    except ValueError as e:
      raise CallError(f"edit_function: {e}") from None
    if path is None:
      files = {rel: text for rel, text in self._files(self.root).items()
               if rel.endswith(".py") and not repo_lib.is_test_path(rel, self.test_dirs)}
    else:
      full, text = self._text(path)
      files = {self._rel(full): text}
    candidates, names = [], set()
    for rel, text in sorted(files.items()):
      try:
        sites = pyedit.functions(text)
      except ValueError:
        continue
      names.update(s.name for s in sites)
      candidates += [(rel, s, pyedit.source(text, s)) for s in sites if s.name == new.name]
    if not candidates:
      near = difflib.get_close_matches(new.name, sorted(names), n=5)
      raise CallError(f"edit_function: no function named {new.name!r} in "
                      f"{path or 'the non-test Python files'}" +
                      (f"; close names: {', '.join(near)}" if near else ""))
    try:
      rel, site = pyedit.closest(candidates, new)
      full, text = self._text(rel)
      new_text = pyedit.replace(text, site, new)
    except ValueError as e:
      raise CallError(f"edit_function: {e}") from None
    if new_text == text:
      raise CallError(f"edit_function: `{site.qualname}` in {rel} already reads so; "
                      f"nothing was changed (write the fixed function)")
    full.write_text(new_text, encoding="utf-8")
    left = (f"; {new.left_out} other statement(s) of the block left out"
            if new.left_out else "")
    return (f"replaced function `{site.qualname}` in {rel} (lines {site.start}-{site.end})"
            f"{left}{self._test_note(full)}:\n{pyedit.diff(text, new_text, rel)}")

  def _test_note(self, full: pathlib.Path) -> str:
    return (" (a test file: changes to test files are not graded)"
            if repo_lib.is_test_path(self._rel(full), self.test_dirs) else "")

  def run_tests(self, tests: Sequence = ()) -> str:
    if not all(isinstance(t, str) and t for t in tests):
      raise CallError("run_tests: 'tests' must be a list of test ids or files (strings)")
    for t in tests:
      if t.startswith("-"):
        raise CallError(f"run_tests: {t[:80]!r} is an option, not a test")
      try:
        found = self.resolve(t.split("::", 1)[0]).exists()
      except OSError:
        found = False
      if not found:
        raise CallError(f"run_tests: {t[:200]!r}: no such test file")
    result = self.suite.run(self._files(self.root), list(tests) or
                            list(self.test_dirs), self.config.test_timeout_s)
    return suite_summary(result)

  def git(self, command: str) -> str:
    try:
      argv = git_tool.parse_command(command)
      if self._git_dir is None:
        self._git_dir = git_tool.repo_payload(self.root / ".git")
      tree = git_tool.repo_payload(self.root, lambda p: ".git" not in
                                   p.relative_to(self.root).parts and not _hard_linked(p))
    except git_tool.GitRefused as e:
      raise CallError(str(e)) from None
    files = {**tree, **{f".git/{k}": v for k, v in self._git_dir.items()}}
    return git_tool.run(self.suite.run_program, files, argv, self.config.git_timeout_s)

  # ---------------------------------------------------------------- dispatch

  def execute(self, call: ToolCall) -> str:
    """Runs a parsed call; returns the capped observation.

    Raises:
      CallError: a bad argument value or a refused path (the message is the observation).
    """
    if call.name == "submit":
      return "submitted"
    if call.name in ("run_tests", "git"):  # the sandbox's errors are the operator's to see
      return cap(getattr(self, call.name)(**call.args), self.config.max_output_chars)
    try:
      out = getattr(self, call.name)(**call.args)
    except OSError as e:  # a name too long, a file the mode forbids: an observation
      raise CallError(f"{call.name}: {e.strerror or type(e).__name__}") from None
    return cap(out, self.config.max_output_chars)


def _indent(line: str) -> str:
  return line[:len(line) - len(line.lstrip())]


def indent_edit(text: str, search: str, replace: str
                ) -> Optional[tuple[str, int, int, str]]:
  """The edit of `ToolConfig.indent_tolerant`: where `search`'s lines (blank ones at
  its ends dropped), each stripped, equal one run of `text`'s lines stripped, and only
  one, those lines are replaced by `replace`'s: each keeps its indentation relative to
  the search text's first line, re-based on the file's first matched line (a line less
  indented than that is put at the file's indentation). Returns (new text, first line,
  last line, the lines written), or None when no run or several match."""
  want = search.splitlines()
  while want and not want[-1].strip():
    want.pop()
  while want and not want[0].strip():
    want.pop(0)
  lines = text.splitlines(keepends=True)
  if not want or len(want) > len(lines):
    return None
  stripped = [ln.strip() for ln in lines]
  goal = [ln.strip() for ln in want]
  starts = [i for i in range(len(lines) - len(want) + 1)
            if stripped[i:i + len(want)] == goal]
  if len(starts) != 1:
    return None
  first, last = starts[0], starts[0] + len(want) - 1
  base, lead = _indent(lines[first]), _indent(want[0])
  kept = replace.rstrip("\n")
  new = [("" if not r.strip() else base + r[len(lead):] if r.startswith(lead)
          else base + r.lstrip()) for r in kept.split("\n")] if kept else []
  ending = lines[last][len(lines[last].rstrip("\r\n")):]
  written = "\n".join(new)
  middle = written + ending if new else ""  # an empty replacement removes the lines
  out = "".join(lines[:first]) + middle + "".join(lines[last + 1:])
  return out, first + 1, last + 1, written


def _missed_edit(path: str, text: str, search: str, count: int) -> str:
  """A `search_replace` that changed nothing: why, and what would have worked."""
  head = f"search_replace: the search text must occur exactly once in {path[:200]!r}; "
  if not search:
    return head + "it is empty (nothing was changed)"
  if count > 1:
    return head + (f"it occurs {count} times (nothing was changed); add surrounding lines "
                   f"to make it unique; it starts at {hints.occurrences(text, search)}")
  hint = hints.missed_search(text, search)
  hint = "\n" + hint if hint else ""
  return head + "it is not in the file (nothing was changed)" + hint


def _hard_linked(path: pathlib.Path) -> bool:
  """Whether `path` is a regular file with more than one name."""
  info = path.stat()
  return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def suite_summary(result: runner_lib.SuiteResult) -> str:
  """A test run as the model sees it: counts, then each failing test and its message."""
  counts: dict[str, int] = {}
  for outcome in result.outcomes.values():
    counts[outcome] = counts.get(outcome, 0) + 1
  head = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no test ran"
  if result.status.value != "ok":
    head += f" (run status: {result.status.value})"
  lines = [head]
  for test, outcome in sorted(result.outcomes.items()):
    if outcome in ("failed", "error"):
      lines.append(f"{outcome.upper()} {test}: {result.messages.get(test, '')}")
  if not result.outcomes:
    lines.append(result.log[-1000:])
  return "\n".join(lines)
