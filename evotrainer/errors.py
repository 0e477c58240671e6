"""Known failures as one line a user can act on (the entry point's exit code 2).

`explain(exc)` turns an exception of a known kind (configuration, data, checkpoint,
ledger, disk, permissions, memory, workdir lock / fingerprint, sweep file, gate) into
`(kind, message)`: where it happened and what to do next. Anything else is a bug or an
unknown failure and keeps its traceback. launch.py prints the one line, writes the full
traceback to `<workdir>/error.log` (or prints it with `--verbose`) and exits with 2. The
other processes of a multi-process evolution stop with process 0's known failure, under
its kind (evolution/pod.py).
"""

from __future__ import annotations

import errno
import os
import re
import traceback
from typing import Optional

EXIT_KNOWN = 2  # a known failure, explained in one line


def _first_line(e: BaseException) -> str:
  """The message without the `In call to configurable ...` lines gin appends."""
  text = str(e).strip() or type(e).__name__
  return re.split(r"\n\s*In call to configurable", text)[0].rstrip()


def _os_error(e: OSError) -> Optional[tuple[str, str]]:
  where = e.filename or ""
  if e.errno == errno.ENOSPC or e.errno == errno.EDQUOT:
    return ("disk", f"disk full writing {where or 'the run'}: free space (old checkpoints, "
                    f"runs/, caches under ~/.cache/evotrainer) and relaunch the same command "
                    f"(it resumes)")
  if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
    return ("permissions", f"permission denied on {where or '?'} ({os.strerror(e.errno)}): "
                           f"fix its permissions or choose another --workdir / cache_dir")
  if isinstance(e, FileNotFoundError):
    return ("data", f"{_first_line(e)}: check the path in your gin bindings or flags")
  return None


def explain(e: BaseException) -> Optional[tuple[str, str]]:
  """(kind, message) for a known failure, None for anything else (keep the traceback)."""
  from evotrainer.checkpoint import CheckpointError
  from evotrainer.config import ConfigError
  from evotrainer.evolution.gates import GateError, GateTimeout
  from evotrainer.evolution.ledger import LedgerError
  from evotrainer.evolution.pod import LeaderStopped
  from evotrainer.evolution.sweep_file import SweepError
  from evotrainer.infra import InfrastructureError
  from evotrainer.tasks.base import DataError
  from evotrainer.workdir import WorkdirError, WorkdirLocked

  if isinstance(e, WorkdirLocked):
    return "lock", _first_line(e)
  if isinstance(e, LeaderStopped) and e.kind:  # a follower ends with the leader's kind
    return e.kind, _first_line(e)
  if isinstance(e, WorkdirError):
    return "workdir", _first_line(e)
  if isinstance(e, ConfigError):
    return "config", _first_line(e)
  if isinstance(e, SweepError):
    return "sweep", _first_line(e)
  if isinstance(e, DataError):
    return "data", _first_line(e)
  if isinstance(e, CheckpointError):
    return "checkpoint", (f"{_first_line(e)} (restore that directory from a copy, or "
                          f"use another --workdir; a damaged newest training step is "
                          f"skipped by itself)")
  if isinstance(e, LedgerError):
    return "ledger", _first_line(e)
  if isinstance(e, InfrastructureError):
    return "infrastructure", _first_line(e)
  if isinstance(e, (GateError, GateTimeout)):
    return "gate", _first_line(e)
  if isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e)[:2000]:
    return "memory", ("out of memory: lower the batch (train.prompts_per_step, "
                      "train.group_size, EvalConfig.batch_rows) or set "
                      "Learner.micro_batch_size, then relaunch (it resumes)")
  if isinstance(e, OSError):
    return _os_error(e)
  cause = e.__cause__ or e.__context__
  if isinstance(cause, OSError) and cause is not e:
    return _os_error(cause)
  if type(e).__name__ == "ParseError" or "gin" in type(e).__module__:
    return "config", _first_line(e)
  return None


def write_traceback(path: str | os.PathLike, e: BaseException) -> Optional[str]:
  """Appends the traceback of `e` to `path`; returns the path, or None if unwritable."""
  try:
    with open(path, "a") as f:
      f.write("".join(traceback.format_exception(type(e), e, e.__traceback__)) + "\n")
    return os.fspath(path)
  except OSError:
    return None


__all__ = ["EXIT_KNOWN", "explain", "write_traceback"]
