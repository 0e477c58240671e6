"""branch_result.json: one record for the branch that writes it and the controller that
reads it; unknown and missing keys are errors naming the file."""

import json

import pytest

from evotrainer.evolution.branch_result import BranchResult, BranchResultError
from evotrainer.evolution.trainer import SubprocessTrainer

# A file as a branch writes it (modes/branch.py), key order included.
FILE = {"version": "v1.0", "steps": 3, "initial": {"avg8": 0.25},
        "final": {"avg8": 0.5, "exploit_recovery": 0.0}, "checkpoint": "/w/v1.0/model",
        "rollouts": "/w/v1.0/rollouts", "per_problem": {"p0": 0.5, "p1": 0.0},
        "series": {"correct": [0.1, None, 0.3]}, "canary": {"c0": 1}}


def test_round_trip_through_the_file(tmp_path):
  (tmp_path / "branch_result.json").write_text(json.dumps(FILE, indent=2))
  r = BranchResult.read(tmp_path)
  assert r == BranchResult(version="v1.0", checkpoint="/w/v1.0/model",
                           final={"avg8": 0.5, "exploit_recovery": 0.0},
                           initial={"avg8": 0.25}, per_problem={"p0": 0.5, "p1": 0.0},
                           series={"correct": [0.1, None, 0.3]}, rollouts="/w/v1.0/rollouts",
                           steps=3, workdir=str(tmp_path), canary={"c0": 1})
  assert list(r.to_json().items()) == list(FILE.items())  # workdir is not stored


def test_an_older_file_without_steps_and_canary_reads_with_their_defaults(tmp_path):
  old = {k: v for k, v in FILE.items() if k not in ("steps", "canary")}
  (tmp_path / "branch_result.json").write_text(json.dumps(old))
  r = SubprocessTrainer([]).finished(str(tmp_path))
  assert (r.steps, r.canary, r.final) == (0, {}, FILE["final"])


def test_unknown_keys_are_an_error_naming_the_file_and_the_keys(tmp_path):
  path = tmp_path / "branch_result.json"
  path.write_text(json.dumps({**FILE, "test_final": {}, "workdir": "/elsewhere"}))
  with pytest.raises(BranchResultError) as e:
    SubprocessTrainer([]).finished(str(tmp_path))
  assert str(path) in str(e.value)
  assert "unknown keys ['test_final', 'workdir']" in str(e.value)


def test_missing_required_keys_are_an_error_naming_the_file_and_the_keys(tmp_path):
  path = tmp_path / "branch_result.json"
  path.write_text(json.dumps({k: v for k, v in FILE.items()
                              if k not in ("per_problem", "checkpoint")}))
  with pytest.raises(BranchResultError) as e:
    BranchResult.read(tmp_path)
  assert str(path) in str(e.value) and "unknown" not in str(e.value)
  assert "missing keys ['checkpoint', 'per_problem']" in str(e.value)


@pytest.mark.parametrize("text, says", [("{not json", "not JSON"),
                                        ("[1, 2]", "expected a JSON object, got list")])
def test_a_file_that_is_not_an_object_is_an_error_naming_it(tmp_path, text, says):
  path = tmp_path / "branch_result.json"
  path.write_text(text)
  with pytest.raises(BranchResultError, match=says) as e:
    BranchResult.read(tmp_path)
  assert str(e.value).startswith(f"{path}: ")


class _Store:
  """The two RolloutStore calls modes/branch.py makes: the held-out steps and one step's episodes."""

  def __init__(self, episodes):
    self.episodes = episodes

  def steps(self, version, split):
    return [0, 2] if split == "heldout" else []

  def read(self, version, step, split):
    assert (step, split) == (2, "heldout")
    return self.episodes


def test_the_record_a_branch_builds_reads_back_through_the_controllers_side(tmp_path):
  from evotrainer.modes import branch as branch_mode
  from evotrainer.types import Episode
  episodes = [Episode(f"v1.0/2/{i}", 0, task, "q", "c", "a", {"correct": c})
              for i, (task, c) in enumerate([("p1", 1.0), ("p0", 0.0), ("p1", 0.0)])]
  rows = [{"step": 1, "reward": 0.5, "correct": 0.25, "length_mean": 10.0},
          {"step": 1, "eval": True},  # not a training step's row: skipped
          {"step": 2, "reward": 1.0, "correct": 0.75, "learner/entropy": 2.0,
           "learner/clip_frac_low": 0.25, "learner/clip_frac_high": 0.5}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = {"steps": 2, "initial": {"avg8": 0.1}, "final": {"avg8": 0.4}}
  r = branch_mode.branch_result(str(tmp_path), "v1.0", out, str(tmp_path / "model"),
                                _Store(episodes))
  (tmp_path / "branch_result.json").write_text(json.dumps(r.to_json()))
  back = BranchResult.read(tmp_path)
  assert back.per_problem == {"p0": 0.0, "p1": 0.5}
  assert back.series == {"correct": [0.25, 0.75], "reward": [0.5, 1.0],
                         "entropy": [None, 2.0], "length": [10.0, None],
                         "truncated": [None, None], "clip_frac": [None, 0.75]}
  assert (back.version, back.steps, back.initial, back.final, back.canary) == (
      "v1.0", 2, {"avg8": 0.1}, {"avg8": 0.4}, {})
  assert (back.checkpoint, back.rollouts) == (str(tmp_path / "model"),
                                              str(tmp_path / "rollouts"))
