"""How the controller trains a branch, without touching JAX itself.

The controller hands a `Trainer` a parent checkpoint path plus gin bindings and gets back
a `BranchResult`: held-out figures with per-problem scores (for a paired bootstrap), the
training series (BC and proxy reward per step), the new checkpoint and the rollouts.

`SubprocessTrainer` runs `python -m evotrainer.launch ... run.mode='branch'` in a child
process per branch: a crash or a hang costs one branch, the run's gin plus the branch's
bindings is exactly what a person would type to replay it, and a branch whose
`branch_result.json` exists is not trained again (resume after kill -9).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Callable, Optional, Protocol, Sequence

from evotrainer import lifetime
from evotrainer.evolution.branch_result import FILE_NAME, BranchResult


class Trainer(Protocol):

  def train(self, *, version: str, parent_checkpoint: Optional[str], bindings: Sequence[str],
            seed: int, workdir: str) -> BranchResult:
    """Trains `version` from `parent_checkpoint` (None: the root policy) under `bindings`
    (gin binding strings) in `workdir`."""
    ...


def last_error(log: str) -> str:
  """The last `module.Error: message` line of a log (a Python traceback's verdict), else
  its last non-empty line."""
  lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
  for ln in reversed(lines):
    if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*:", ln):
      return ln
  return lines[-1] if lines else "(empty log)"


class BranchFailed(RuntimeError):
  """A branch's training process failed; the message holds the tail of its log.

  Attributes: `rc` (the exit code, negative for a signal, or 'timeout') and `log_tail`
  (what infra.py classifies the failure by)."""

  def __init__(self, message: str, rc=None, log_tail: str = ""):
    super().__init__(message)
    self.rc, self.log_tail = rc, log_tail


class SubprocessTrainer:
  """Trains each branch in a child process running `evotrainer.launch` in branch mode.

  Args:
    gin_files: the run's gin files (the same for every branch).
    bindings: the run's own extra bindings (before each branch's).
    imports: modules for `--import`.
    timeout_s: wall-clock limit of one branch.
    env: extra environment variables for the child.
    flags: extra launch flags for the child (the parent's `--new_segment`).
  """

  def __init__(self, gin_files: Sequence[str], bindings: Sequence[str] = (),
               imports: Sequence[str] = (), timeout_s: float = 3600,
               env: Optional[dict] = None, flags: Sequence[str] = ()):
    self.flags = list(flags)
    self.gin_files = list(gin_files)
    self.bindings = list(bindings)
    self.imports = list(imports)
    self.timeout_s = timeout_s
    self.env = dict(env or {})

  def command(self, *, version: str, parent_checkpoint: Optional[str],
              bindings: Sequence[str], seed: int, workdir: str) -> list[str]:
    cmd = [sys.executable, "-m", "evotrainer.launch", f"--workdir={workdir}"]
    cmd += [f"--gin_file={f}" for f in self.gin_files]
    cmd += [f"--import={m}" for m in self.imports] + self.flags
    own = ["run.mode = 'branch'", f"run.seed = {int(seed)}",
           f"branch.version = {json.dumps(version)}",
           f"branch.parent = {json.dumps(parent_checkpoint) if parent_checkpoint else 'None'}"]
    cmd += [f"--gin_bindings={b}" for b in [*self.bindings, *bindings, *own]]
    return cmd

  def finished(self, workdir: str) -> Optional[BranchResult]:
    """The result of a branch trained before in `workdir` (None when there is none)."""
    exists = (pathlib.Path(workdir) / FILE_NAME).exists()
    return BranchResult.read(workdir) if exists else None

  def train(self, *, version: str, parent_checkpoint: Optional[str], bindings: Sequence[str],
            seed: int, workdir: str) -> BranchResult:
    done = self.finished(workdir)
    if done is not None:
      return done
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    log_path = pathlib.Path(workdir) / "branch.log"
    cmd = self.command(version=version, parent_checkpoint=parent_checkpoint,
                       bindings=bindings, seed=seed, workdir=workdir)
    start = time.time()
    rc = run_child(cmd, log_path, env={**os.environ, **self.env}, timeout_s=self.timeout_s)
    return self.collect(version, workdir, rc, start, log_path)

  def collect(self, version: str, workdir: str, rc, start: float, log_path: os.PathLike,
              tail: Optional[str] = None, where: str = "") -> BranchResult:
    """The branch's result after its child ended with `rc`; raises BranchFailed (with
    `tail`, by default the end of `log_path`) unless it exited 0 and wrote its result.
    `where` names the failing process of a multi-process branch (pod.py)."""
    done = self.finished(workdir) if rc == 0 else None
    if done is None:
      tail = log_tail(log_path) if tail is None else tail
      raise BranchFailed(f"branch {version} failed{where} ({rc}) after "
                         f"{time.time() - start:.0f}s: {last_error(tail)}; log {log_path}:"
                         f"\n{tail}", rc=rc, log_tail=tail)
    return done


def log_tail(log_path: os.PathLike, chars: int = 3000) -> str:
  """The end of a child's log (what BranchFailed and infra.py read)."""
  path = pathlib.Path(log_path)
  return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def run_child(cmd: Sequence[str], log_path: os.PathLike, *, env: dict, timeout_s: float,
              stop: Optional[Callable[[], bool]] = None, poll_s: float = 1.0,
              cwd: Optional[os.PathLike] = None):
  """Runs `cmd` (in `cwd`, default this process's), appending the command line and its
  output to `log_path`.

  Returns:
    its exit code (negative: the signal), 'timeout' when it ran past `timeout_s`, or
    'stopped' when `stop()` (asked every `poll_s` seconds) turned true first; the child
    is killed in both cases, and when the caller is interrupted. An EvoTrainer child
    (`evotrainer.launch`) also ends when this process is killed (`lifetime`).
  """
  deadline = time.monotonic() + timeout_s
  with open(log_path, "ab") as log:
    log.write(("$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                            env=lifetime.child_env(env))
    try:
      while True:
        left = deadline - time.monotonic()
        try:
          return proc.wait(timeout=max(0.0, min(left, poll_s) if stop else left))
        except subprocess.TimeoutExpired:
          if time.monotonic() >= deadline:
            return "timeout"
          if stop is not None and stop():
            return "stopped"
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
