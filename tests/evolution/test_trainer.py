"""The branch trainer: its failure message names the child's error; a finished branch's
result read from a copy of its directory names the copy's files."""

import json

from evotrainer.evolution.branch_result import BranchResult
from evotrainer.evolution.trainer import SubprocessTrainer, last_error

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


def test_a_finished_branch_read_in_another_mirror_points_at_its_own_files(tmp_path):
  """branch_result.json holds the absolute paths of the directory the branch trained in;
  read from a copy of that directory (a gs:// run resumed on another host), the paths
  that are gone are the copy's; paths that still exist are kept."""
  import json
  here = tmp_path / "host2/versions/v1.0"
  (here / "model").mkdir(parents=True)
  gone = str(tmp_path / "host1/versions/v1.0")
  (here / "branch_result.json").write_text(json.dumps({
      "version": "v1.0", "checkpoint": gone + "/model", "rollouts": gone + "/rollouts",
      "final": {}, "initial": {}, "per_problem": {}, "series": {}}))
  r = SubprocessTrainer([]).finished(str(here))
  assert r.checkpoint == str(here / "model")  # moved: the copy has it
  assert r.rollouts == gone + "/rollouts"  # the copy has none either: left as written
  assert BranchResult.from_json({**json.loads((here / "branch_result.json").read_text()),
                                 "checkpoint": str(here / "model")}).checkpoint == \
      str(here / "model")
