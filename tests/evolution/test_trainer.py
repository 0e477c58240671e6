"""The branch trainer's failure message names the child's error."""

from evotrainer.evolution.trainer import last_error

TRACEBACK = """$ python -m evotrainer.launch --workdir=w
Traceback (most recent call last):
  File "x.py", line 1, in <module>
    raise CheckpointError(msg)
evotrainer.checkpoint.CheckpointError: w/model: params/w fails its checksum
  In call to configurable 'run' (<function run at 0x7f>)
"""


def test_last_error_is_the_traceback_verdict():
  assert last_error(TRACEBACK) == ("evotrainer.checkpoint.CheckpointError: w/model: params/w "
                                   "fails its checksum")
  assert last_error("Traceback\nKeyError: 'a'\nValueError: second: b\n") == "ValueError: second: b"
  assert last_error("killed\n\n") == "killed"
  assert last_error("") == "(empty log)"
