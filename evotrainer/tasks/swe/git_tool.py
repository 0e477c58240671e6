"""The episode's read-only `git` tool (off by default: `tools.ToolConfig.git`).

The model writes a git command line without the leading `git` (a leading `git` is
accepted and dropped):

    ```tool
    {"tool": "git", "args": {"command": "log --oneline"}}
    ```

It is split like a POSIX shell would (`shlex`, no expansion, nothing else runs) and
checked here before anything runs:
  - the subcommand must be one of `SUBCOMMANDS` (read-only; no option before it, so no
    `-c`, `-C`, `--git-dir`, `--exec-path`, `-p/--paginate`, and no alias: aliases live
    in a configuration the run does not have);
  - no long option that is, or abbreviates (git accepts unique prefixes), one of
    `UNSAFE_LONG`: options that run a program (`--ext-diff`, `--textconv`, `--exec`,
    `--upload-pack`, `--open-files-in-pager`, `--show-signature`, `--help` runs `man`),
    write a file (`--output`), change the configuration (`--config-env`) or read
    outside the repository (`--no-index`, `--contents`);
  - no short option `UNSAFE_SHORT` in a cluster (`-O<pager>` of `git grep` runs a
    program, `-o`, `-c`), read the way git reads clusters: letters are flags until one
    that takes a value (the subcommand's `VALUE_SHORT`), whose value is the rest
    (`log -Scount` is pickaxe; `grep -nOvim` runs vim and is refused);
  - no argument that is an absolute path or climbs out with `..` (`git diff` compares
    a path outside the working tree with no `--no-index`).
A refused command is a `CallError` (the observation says why); nothing runs.

An accepted command runs in a sandbox cell (the suite runner's pool), never on the
host: the episode's files and its `.git` travel in as the run's input, the driver
(`DRIVER`) writes them into the run's private folder and `exec`s `/usr/bin/git
--no-pager` there with an environment of ours only: no system or global configuration
(`GIT_CONFIG_NOSYSTEM`, `GIT_CONFIG_GLOBAL=/dev/null`), `HOME` the run's empty folder,
`cat` as pager, no optional locks, no prompt. The repository's own `.git/config` is the
one `repo.checkout` wrote (the tools never let the model write under `.git`). The run
has the tool's timeout and an output cap; the observation is git's stdout, then its
stderr, and the exit status when it is not 0.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shlex
from typing import Callable

from evotrainer import sandbox

SUBCOMMANDS = ("log", "show", "diff", "status", "blame", "grep")
UNSAFE_LONG = ("output", "ext-diff", "textconv", "exec", "exec-path", "upload-pack",
               "receive-pack", "config", "config-env", "open-files-in-pager", "paginate",
               "pager", "git-dir", "work-tree", "namespace", "no-index", "contents",
               "ignore-revs-file", "show-signature", "help", "super-prefix", "attr-source")
UNSAFE_SHORT = frozenset("Ooc")
# Each subcommand's short options that take a value (git reads the rest of a cluster as
# it: `log -Scount`, `status -uno`); the other letters of a cluster are flags.
_DIFF_VALUES = "SGLUnMClB"
VALUE_SHORT = {"log": _DIFF_VALUES, "show": _DIFF_VALUES, "diff": _DIFF_VALUES,
               "blame": "LSMC", "grep": "efABCm", "status": "u"}
MAX_ARGS = 64
MAX_REPO_BYTES = 64 << 20  # the files sent into the run, all together
OUTPUT_BYTES = 256 << 10   # git's output kept by the sandbox (the observation is capped)
SKIP_DIRS = {"__pycache__", ".pytest_cache"}
GIT = "/usr/bin/git"

DRIVER = r'''
import base64, json, os, sys
req = json.loads(sys.stdin.read())
root = os.path.join(os.getcwd(), "repo")
for rel, data in req["files"].items():
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(base64.b64decode(data))
os.chdir(root)
home = os.path.join(os.path.dirname(root), "home")
os.mkdir(home)
env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
       "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
       "GIT_ATTR_NOSYSTEM": "1", "GIT_PAGER": "cat", "PAGER": "cat",
       "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/true",
       "GIT_NO_REPLACE_OBJECTS": "1"}
os.execve(req["git"], [req["git"], "--no-pager", *req["argv"]], env)
'''


class GitRefused(ValueError):
  """A git command the tool does not run; the message says why (the observation)."""


def parse_command(command: str) -> list[str]:
  """The checked argument list of a git command line (see the module docstring).

  Raises:
    GitRefused: not splittable, empty, a subcommand not in `SUBCOMMANDS`, an unsafe
      option, a path outside the repository, too many arguments or a NUL.
  """
  try:
    argv = shlex.split(command)
  except ValueError as e:
    raise GitRefused(f"git: cannot split the command ({e})") from None
  if argv[:1] == ["git"]:
    argv = argv[1:]
  allowed = ", ".join(SUBCOMMANDS)
  if not argv:
    raise GitRefused(f"git: no subcommand; read-only subcommands: {allowed}")
  if len(argv) > MAX_ARGS:
    raise GitRefused(f"git: {len(argv)} arguments (at most {MAX_ARGS})")
  if any("\x00" in a for a in argv):
    raise GitRefused("git: an argument holds a NUL character")
  if argv[0] not in SUBCOMMANDS:
    what = "options before the subcommand are" if argv[0].startswith("-") else (
        f"{argv[0][:40]!r} is")
    raise GitRefused(f"git: {what} not allowed; read-only subcommands: {allowed}")
  paths = False
  for arg in argv[1:]:
    if arg == "--" and not paths:
      paths = True  # the rest are paths
      continue
    why = "" if paths else unsafe_option(arg, argv[0])
    if not why and (arg.startswith(("/", "~")) or ".." in pathlib.PurePosixPath(arg).parts):
      why = "a path outside the repository"
    if why:
      raise GitRefused(f"git: {arg[:80]!r} is refused ({why}); the tool is read-only")
  return argv


def unsafe_option(arg: str, subcommand: str) -> str:
  """Why `arg` (an argument of `subcommand`) is an option the tool refuses, or ""."""
  if arg.startswith("--"):
    name = arg[2:].split("=", 1)[0]
    for unsafe in UNSAFE_LONG:
      if name and (unsafe.startswith(name) or name.startswith(unsafe)):
        return f"--{unsafe} or an abbreviation of it"
    return ""
  if arg.startswith("-") and len(arg) > 1:
    for letter in arg[1:]:
      if letter in UNSAFE_SHORT:
        return f"the short option -{letter}"
      if letter in VALUE_SHORT[subcommand]:
        break
  return ""


def repo_payload(root: os.PathLike | str,
                 keep: Callable[[pathlib.Path], bool] = lambda p: True) -> dict[str, str]:
  """{relative path: base64 bytes} of the regular files under `root` (no symlinks, no
  caches) that `keep` accepts.

  Raises:
    GitRefused: more than `MAX_REPO_BYTES` in all.
  """
  root = pathlib.Path(root)
  files, total = {}, 0
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
    for name in sorted(filenames):
      path = pathlib.Path(dirpath) / name
      if path.is_symlink() or not path.is_file() or not keep(path):
        continue
      data = path.read_bytes()
      total += len(data)
      if total > MAX_REPO_BYTES:
        raise GitRefused(f"git: the repository is larger than {MAX_REPO_BYTES >> 20} MiB")
      files[path.relative_to(root).as_posix()] = base64.b64encode(data).decode()
  return files


def run(run_program: Callable[..., sandbox.RunResult], files: dict[str, str],
        argv: list[str], timeout_s: float) -> str:
  """Runs checked `argv` on the repository `files` (`repo_payload`) in the sandbox;
  returns the observation. `run_program(source, stdin=, timeout_s=, limits=)` runs a
  program in a cell (`runner.SuiteRunner.run_program`)."""
  request = json.dumps({"files": files, "argv": argv, "git": GIT})
  result = run_program(DRIVER, stdin=request, timeout_s=timeout_s,
                       limits=sandbox.Limits(memory_mb=1024, output_bytes=OUTPUT_BYTES))
  if result.status is sandbox.Status.TIMEOUT:
    return f"git: timed out after {timeout_s:g} s"
  if result.exit_code is None or result.status in (sandbox.Status.MEMORY,
                                                   sandbox.Status.KILLED):
    return f"git: the run was ended ({result.status.value})"
  out = result.stdout + result.stderr
  if result.stdout_truncated or result.stderr_truncated:
    out += f"\n[git's output was cut at {OUTPUT_BYTES >> 10} KiB]"
  if result.exit_code:
    out = f"git exited with status {result.exit_code}\n{out}"
  return out or "(no output)"
