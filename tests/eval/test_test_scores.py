"""The test split's scores: what a branch writes is what the reports read back."""

import json

from evotrainer.eval.test_scores import TEST_FILE, read_test_scores, write_test_scores


def test_written_scores_read_back_by_version(tmp_path):
  (tmp_path / "versions" / "v1").mkdir(parents=True)  # a branch's workdir
  write_test_scores(tmp_path / "versions" / "v1", "v1", {"avg8": 0.25, "pass8": 0.5},
                    {"p0": 0.0, "p1": 0.5})
  (tmp_path / "versions" / "v2").mkdir()
  (tmp_path / "versions" / "v2" / TEST_FILE).write_text("{not json")  # skipped
  assert json.loads((tmp_path / "versions" / "v1" / "test_eval.json").read_text()) == {
      "version": "v1", "final": {"avg8": 0.25, "pass8": 0.5},
      "per_problem": {"p0": 0.0, "p1": 0.5}}
  assert read_test_scores(tmp_path) == {
      "v1": {"avg8": 0.25, "pass8": 0.5, "per_problem": {"p0": 0.0, "p1": 0.5}}}
