"""The metrics of a training segment: JSON lines (`metrics.jsonl`), findings
(`findings.jsonl`) and TensorBoard event files, written by process 0 only.

In a `gs://` workdir the logs are appended to in its local mirror and uploaded whole
(evotrainer/paths.py). A resumed segment first drops what was logged after its
checkpoint (`truncate_after`), so redone steps are not logged twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from typing import Sequence

import numpy as np

from evotrainer import atomic, paths


def _tensorboard_writer_class() -> type:
  """tensorboardX's `SummaryWriter`, imported without importing torch.

  tensorboardX's writer module imports torch whenever it is installed (the test extra
  installs it), only to accept torch tensors; this writer logs Python numbers. That
  import costs 2-3 s of CPU in every process that trains, i.e. every branch of an
  evolution, so torch is hidden while tensorboardX is imported (unless something already
  imported it) and visible again right after: a later `import torch` works as usual.
  """
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # `import torch` raises ImportError while this is set
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    if hide and "torch" in sys.modules and sys.modules["torch"] is None:
      del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Metrics as JSON lines (`metrics.jsonl`), findings (`findings.jsonl`) and TensorBoard
  event files (thread-safe). In a `gs://` workdir they are appended to in its local mirror
  and uploaded whole (evotrainer/paths.py): throttled on `write`, at once on `sync`."""

  _LOGS = ("metrics.jsonl", "findings.jsonl", "tensorboard")

  def __init__(self, workdir: str):
    self._lock = threading.Lock()
    self._mirror = paths.Mirror(workdir)
    for name in self._LOGS[:2]:  # on a restart the mirror starts as the workdir's copy
      self._mirror.fetch(name)
    self._mirror.clear("tensorboard")
    self.path = str(self._mirror.local("metrics.jsonl"))
    self.findings_path = str(self._mirror.local("findings.jsonl"))
    try:
      self.tb = _tensorboard_writer_class()(str(self._mirror.local("tensorboard")))
    except ImportError:  # optional: JSON lines are the record
      self.tb = None

  def write(self, step: int, metrics: dict) -> None:
    # NaN (e.g. a correlation over constant rewards) is written as null: strict JSON.
    clean = {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
             for k, v in metrics.items()}
    with self._lock:
      with open(self.path, "a") as f:
        f.write(json.dumps({"step": step, **clean}) + "\n")
      if self.tb is not None:
        for k, v in clean.items():
          if isinstance(v, (int, float)):
            self.tb.add_scalar(k, v, step)
        self.tb.flush()
      self._mirror.push(*self._LOGS, throttle=True)

  def write_findings(self, step: int, findings: Sequence) -> None:
    if not findings:
      return
    with self._lock:
      with open(self.findings_path, "a") as f:
        for x in findings:
          f.write(json.dumps({"step": step, **dataclasses.asdict(x)}, default=str) + "\n")

  def truncate_after(self, step: int) -> None:
    """Drops metrics and findings logged after `step` (work redone after a resume is not
    duplicated)."""
    with self._lock:
      truncate_jsonl(self.path, step)
      truncate_jsonl(self.findings_path, step)
      self._mirror.push(*self._LOGS)

  def sync(self) -> None:
    """Uploads the logs of a `gs://` workdir now (before a checkpoint, at the end)."""
    with self._lock:
      self._mirror.push(*self._LOGS)


def truncate_jsonl(path: str, step: int) -> None:
  """Keeps the lines of a JSON-lines log with `step <= step` (and drops a torn last line)."""
  if not os.path.exists(path):
    return
  keep = []
  with open(path) as f:
    for line in f:
      try:
        if json.loads(line)["step"] <= step:
          keep.append(line if line.endswith("\n") else line + "\n")
      except (ValueError, KeyError):  # a line cut by a crash
        continue
  atomic.write_text(path, "".join(keep))


class NoWriter:
  """The MetricWriter of processes other than 0: they write no files."""

  def write(self, step: int, metrics: dict) -> None:
    del step, metrics

  def write_findings(self, step: int, findings: Sequence) -> None:
    del step, findings

  def truncate_after(self, step: int) -> None:
    del step

  def sync(self) -> None:
    pass


__all__ = ["MetricWriter", "NoWriter", "truncate_jsonl"]
