"""Known failures map to one line naming the place and the next step (launch exit 2)."""

import errno

from evotrainer import errors
from evotrainer.checkpoint import CorruptCheckpointError
from evotrainer.tasks.base import DataError


def test_known_failures_are_one_line_with_a_next_step():
  disk = OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoints/3")
  kind, msg = errors.explain(disk)
  assert kind == "disk" and "/runs/x/checkpoints/3" in msg and "relaunch" in msg
  kind, msg = errors.explain(PermissionError(errno.EACCES, "Permission denied", "/ro/w"))
  assert kind == "permissions" and "/ro/w" in msg
  kind, msg = errors.explain(MemoryError())
  assert kind == "memory" and "Learner.micro_batch_size" in msg
  # gin appends the configurable it was calling; the line keeps the cause only.
  e = DataError("f.jsonl:3: bad\n  In call to configurable 'run' (<function run>)")
  assert errors.explain(e) == ("data", "f.jsonl:3: bad")
  kind, msg = errors.explain(CorruptCheckpointError("/w/checkpoints/3: fails its checksum"))
  assert kind == "checkpoint" and msg.startswith("/w/checkpoints/3")
  # A cause wrapped in another exception is still found.
  try:
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/w/rollouts")
    except OSError as inner:
      raise RuntimeError("write failed") from inner
  except RuntimeError as outer:
    assert errors.explain(outer)[0] == "disk"


def test_unknown_failures_keep_their_traceback():
  assert errors.explain(ZeroDivisionError("x")) is None
  assert errors.explain(KeyError("k")) is None
