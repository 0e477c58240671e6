"""A run directory is one run: an exclusive lock and a configuration fingerprint.

Lock (`WorkdirLock`): `<workdir>/.evotrainer.lock`, an exclusive `flock` held for the
process's life, with the holder's pid, host and command written inside. A second process
on the same workdir stops at once naming the holder. The kernel drops a `flock` when its
holder dies (kill -9 included), so a lock left by a dead process is simply taken over;
its file still names the dead pid, which is said. A `gs://` workdir (evotrainer/paths.py)
has no flock: its lock file lies in the workdir's local mirror, so it excludes a second
launch on the same host only. Branch children of an evolution train in
`<workdir>/versions/<id>/`, each under its own lock, while the parent holds the run's.

Fingerprint (`check_fingerprint`): `<workdir>/run_fingerprint.json` holds what makes the
run this run: every gin binding (from `gin.config_str()`, after `--gin_bindings`) except
those in `RESUMABLE` (budgets, timeouts, workers, cache locations: what may change on a
resume), with data files named by a binding replaced by their sha256 (moving a file is
no change, editing it is). After the policy is built, `check_built` adds the tokenizer's
digest and the model config. A relaunch that differs is refused with the list of
changes; `--new_segment` accepts the new configuration and records the change as a new
segment (`segments.jsonl`; launch.py copies the row into the ledger's `run/segments` meta
when there is a ledger: ledger.mirror.record_segment).
A tokenizer or model change is refused even then while checkpoints exist: weights
trained under one vocabulary mean nothing under another.
"""

from __future__ import annotations

import ast
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import socket
import sys
from typing import Any, Mapping, Optional

from evotrainer import paths

log = logging.getLogger(__name__)

LOCK_NAME = ".evotrainer.lock"
FINGERPRINT_NAME = "run_fingerprint.json"
SEGMENTS_NAME = "segments.jsonl"

# Bindings that may change between launches of one run (a resume): budgets and limits,
# parallelism, caches and locations. Everything else defines the run.
RESUMABLE = frozenset({
    "train.steps", "train.time_limit_s", "evolve.generations", "evolve.branch_timeout_s",
    "evolve.human_gated", "evolve.resume_from", "sweep.file", "branch.parent",
    "MathTask.verify_workers", "MathTask.verify_timeout_s", "EvalConfig.batch_rows",
    "Learner.micro_batch_size", "warm_start.cache_dir", "make_tokenizer.cache_dir",
    "compilation_cache.directory",
    "make_mesh.data", "make_mesh.fsdp", "make_mesh.tensor", "run.num_problems",
    "run.samples_per_problem", "train.progress_every", "policy.remat",
    "workdir_mirror.directory", "workdir_mirror.sync_every_s",
})
# Run state that shows a workdir holds a run from before fingerprints existed.
_RUN_STATE = ("checkpoints", "ledger.sqlite", "summary.json", "metrics.jsonl", "versions")


class WorkdirError(RuntimeError):
  """The workdir cannot be used as asked; the message says why and what to do."""


class WorkdirLocked(WorkdirError):
  """Another live process holds the workdir."""


class FingerprintMismatch(WorkdirError):
  """A relaunch's configuration differs from the run in the workdir."""


# ------------------------------------------------------------------ the lock


def _holder(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text() or "{}")
  except (OSError, ValueError):
    return {}


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class WorkdirLock:
  """The exclusive lock of a workdir, held until `release()` or the process ends.

  Raises WorkdirLocked (naming the holder's pid and host) when another process holds it.
  """

  def __init__(self, workdir: str | os.PathLike):
    self.workdir = workdir if paths.is_remote(workdir) else pathlib.Path(workdir)
    # A gs:// workdir has no flock: it is locked in its local mirror (this host only).
    self.path = paths.mirror_dir(workdir) / LOCK_NAME
    self._fd: Optional[int] = None
    self.took_over: Optional[dict] = None

  def acquire(self) -> "WorkdirLock":
    self.path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise
      h = _holder(self.path)
      raise WorkdirLocked(
          f"workdir {self.workdir} is in use by pid {h.get('pid', '?')} on host "
          f"{h.get('host', '?')} (since {h.get('started', '?')}): wait for that run to end "
          f"(or stop it), or use another --workdir") from None
    old = _holder(self.path)
    host = socket.gethostname()
    if old.get("pid") and old.get("pid") != os.getpid():
      # The flock was free, so its holder is gone (a crash or kill -9).
      same = old.get("host") == host
      state = ("dead" if not _pid_alive(int(old["pid"])) else "no longer holding it") \
          if same else f"on host {old.get('host')}"
      log.warning("workdir %s: taking over the lock of pid %s (%s)", self.workdir,
                  old["pid"], state)
      self.took_over = old
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({
        "pid": os.getpid(), "host": host,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv}).encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is not None:
      try:
        os.ftruncate(self._fd, 0)
      except OSError:
        pass
      os.close(self._fd)  # closing drops the flock
      self._fd = None

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def holder(workdir: str | os.PathLike) -> Optional[dict]:
  """{pid, host, started, argv} of the process holding `workdir`, None when it is free."""
  path = paths.mirror_dir(workdir) / LOCK_NAME
  if not path.exists():
    return None
  fd = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError:
    return _holder(path)
  finally:
    os.close(fd)  # a shared lock taken just to test is dropped here
  return None


# ------------------------------------------------------------------ the fingerprint


def config_bindings(config_text: str) -> dict:
  """{binding: value text} of a gin config string (`gin.config_str()`)."""
  out: dict = {}
  key = None
  for line in config_text.splitlines():
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    if line[0].isspace() and key is not None:
      out[key] = (out[key].rstrip("\\").rstrip() + " " + line.strip()).strip()
      continue
    name, sep, value = line.partition("=")
    if not sep:
      continue
    key = name.strip()
    out[key] = value.strip()
  return {k: v.rstrip("\\").strip() for k, v in out.items()}


def file_digest(path: str | os.PathLike) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _with_digests(value: str) -> str:
  """A binding's value with every string naming an existing file replaced by
  `sha256:<digest>`: the data, not where it lies, defines the run."""
  try:
    parsed = ast.literal_eval(value)
  except (ValueError, SyntaxError, MemoryError, RecursionError):
    return value

  def sub(x):
    if isinstance(x, str) and x and os.path.isfile(os.path.expanduser(x)):
      return "sha256:" + file_digest(os.path.expanduser(x))[:16]
    if isinstance(x, (list, tuple)):
      return [sub(y) for y in x]
    return x

  out = sub(parsed)
  return value if out == parsed else repr(out)


def config_fingerprint(config_text: Optional[str] = None) -> dict:
  """{binding: value} defining the run (see the module docstring)."""
  if config_text is None:
    import gin
    config_text = gin.config_str()
  return {k: _with_digests(v) for k, v in sorted(config_bindings(config_text).items())
          if k not in RESUMABLE}


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """Readable lines `binding: old -> new` (`(unset)` for a binding on one side only)."""
  lines = []
  for k in sorted(set(old) | set(new)):
    a, b = old.get(k, "(unset)"), new.get(k, "(unset)")
    if a != b:
      lines.append(f"{k}: {a} -> {b}")
  return lines


def _write_json(path, data: Mapping) -> None:
  paths.write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _record_segment(workdir, changes: list[str]) -> None:
  row = {"time": _now(), "changes": changes}
  log_path = workdir / SEGMENTS_NAME  # rewritten whole: a gs:// object cannot be appended to
  old = log_path.read_text() if log_path.exists() else ""
  paths.write_atomic(log_path, old + json.dumps(row) + "\n")


def check_fingerprint(workdir: str | os.PathLike, *, new_segment: bool = False,
                      config: Optional[Mapping[str, str]] = None) -> Optional[list[str]]:
  """Writes the workdir's fingerprint on a first launch; on a relaunch compares it.

  Returns the changes accepted as a new segment (None when nothing changed). Raises
  FingerprintMismatch with the changes when they differ and `new_segment` is False.
  """
  wd = paths.as_path(workdir)
  paths.makedirs(workdir)
  path = wd / FINGERPRINT_NAME
  now = dict(config if config is not None else config_fingerprint())
  if not path.exists():
    if any((wd / name).exists() for name in _RUN_STATE):
      log.warning("workdir %s holds a run from before run fingerprints; its configuration "
                  "is recorded from this launch", wd)
    _write_json(path, {"config": now, "created": _now()})
    return None
  stored = json.loads(path.read_text())
  changes = diff(stored.get("config", {}), now)
  if not changes:
    return None
  if not new_segment:
    shown = changes[:20] + ([f"... and {len(changes) - 20} more"] if len(changes) > 20 else [])
    raise FingerprintMismatch(
        f"workdir {wd} holds a run with another configuration; changed:\n  " +
        "\n  ".join(shown) +
        f"\nTo start a new run, use another --workdir. To continue this run under the new "
        f"settings as a new segment (recorded in {SEGMENTS_NAME} and the ledger), relaunch "
        f"with --new_segment.")
  _record_segment(wd, changes)
  _write_json(path, {**stored, "config": now})
  log.warning("workdir %s: new segment: %s", wd, "; ".join(changes))
  return changes


def tokenizer_digest(tok: Any) -> str:
  """sha256 of a tokenizer: its model file (sentencepiece), else its vocabulary (every
  id's decoded piece, in order)."""
  model_file = getattr(tok, "model_file", None)
  if model_file and os.path.isfile(model_file):
    return file_digest(model_file)
  h = hashlib.sha256()
  h.update(f"{type(tok).__name__}:{tok.vocab_size}:{tok.bos_id}:{tok.eos_id}:{tok.pad_id}"
           .encode())
  for i in range(tok.vocab_size):
    try:
      piece = tok.decode([i])
    except Exception:  # pylint: disable=broad-except  (a control id may not decode)
      piece = "\x00"
    h.update(piece.encode("utf-8", "surrogatepass") + b"\x01")
  return h.hexdigest()


def check_built(workdir: str | os.PathLike, *, tokenizer: str, model: Mapping) -> None:
  """Compares the built tokenizer digest and model config with the workdir's; records them
  on the first build. A change is refused while the workdir holds trained weights."""
  wd = paths.as_path(workdir)
  path = wd / FINGERPRINT_NAME
  stored = json.loads(path.read_text()) if path.exists() else {}
  now = {"tokenizer": tokenizer, "model": {k: str(v) for k, v in sorted(model.items())}}
  old = stored.get("built")
  if old == now:
    return
  weights = [p for p in ("checkpoints", "model") if (wd / p).is_dir()
             and any((wd / p).iterdir())]
  if old is not None and weights:
    changes = []
    if old.get("tokenizer") != now["tokenizer"]:
      changes.append(f"tokenizer: {old.get('tokenizer', '')[:12]} -> {tokenizer[:12]} (its "
                     f"text or options changed)")
    changes += [f"ModelConfig.{line}" for line in diff(old.get("model", {}), now["model"])]
    raise FingerprintMismatch(
        f"workdir {workdir}: the weights in {', '.join(weights)} were trained with another "
        f"tokenizer or model; changed:\n  " + "\n  ".join(changes) +
        "\nThis cannot continue as a segment: use another --workdir.")
  _write_json(path, {**stored, "built": now})


__all__ = ["FINGERPRINT_NAME", "FingerprintMismatch", "LOCK_NAME", "RESUMABLE",
           "WorkdirError", "WorkdirLock", "WorkdirLocked", "check_built",
           "check_fingerprint", "config_bindings", "config_fingerprint", "diff",
           "file_digest", "holder", "tokenizer_digest"]
