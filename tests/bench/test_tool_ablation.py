"""bench/tool_ablation.py: the lineage it reads from a ledger, the bindings each ablation
run gets, and its report's arithmetic, on a hand-made ledger and hand-made scores."""

import json

import pytest

from bench import tool_ablation as ta


@pytest.fixture
def ledger(tmp_path):
  from evotrainer.evolution.ledger.core import Ledger
  path = tmp_path / "ledger.sqlite"
  with Ledger(path) as db:
    for vid, parent, bindings in [
        ("v0", None, {"MathTask.calculator": False, "Learner.learning_rate": 2e-5,
                      "Harness.group_filters": []}),
        ("v1.0", "v0", {"MathTask.calculator": True}),
        ("v2.0", "v1.0", {"Learner.learning_rate": 4e-5}),  # rejected: not on the way
        ("v3.0", "v1.0", {"Harness.group_filters": ["@DropZeroVarianceGroups()"]})]:
      db.add_version(vid, parent, bindings=bindings, status="kept")
  return path


def test_the_lineage_runs_from_the_root_to_the_incumbent(ledger):
  chain = ta.lineage(ledger, "v3.0")
  assert [v for v, _ in chain] == ["v0", "v1.0", "v3.0"]
  assert ta.lineage_bindings(chain) == {"MathTask.calculator": True,
                                        "Learner.learning_rate": 2e-5,
                                        "Harness.group_filters": ["@DropZeroVarianceGroups()"]}
  assert ta.lineage_bindings(chain[:1])["MathTask.calculator"] is False


def test_each_ablation_run_sets_the_tool_and_the_lineage_s_bindings(tmp_path, monkeypatch):
  seen = {}

  def fake_run(gin_files, bindings, wd, log):
    seen["gin"], seen["bindings"] = gin_files, bindings
    wd.mkdir(parents=True)
    (wd / "test_eval.json").write_text(json.dumps({"final": {"avg8": 0.5},
                                                   "per_problem": {"a": 0.5}}))

  monkeypatch.setattr(ta, "run_or_read", fake_run)
  out = ta.test_run(tmp_path / "r", 2, tmp_path / "m",
                    {"MathTask.calculator": True, "Harness.group_filters": ["@F()"]}, False)
  assert out == {"test": 0.5, "per_problem": {"a": 0.5}}
  assert seen["gin"] == ["gin/math_smol.gin"]
  assert seen["bindings"] == ["Harness.group_filters = [@F()]", "MathTask.calculator = False",
                              "run.mode = 'test'", "run.seed = 2",
                              f"test.model = '{tmp_path / 'm'}'"]


def test_the_report_s_differences_are_paired_per_problem():
  seed = {"root_test": 0.25, "root_per_problem": {"a": 0.0, "b": 0.5},
          "root_with_tool": {"test": 0.75, "per_problem": {"a": 1.0, "b": 0.5}},
          "incumbent_without_tool": {"test": 0.25, "per_problem": {"a": 0.5, "b": 0.0}},
          "incumbent_with_tool": {"test": 1.0, "per_problem": {"a": 1.0, "b": 1.0}},
          "evotrainer": {"test": 0.75, "per_problem": {"a": 1.0, "b": 0.5}},
          "static": {"test": 0.5, "per_problem": {"a": 0.5, "b": 0.5}}}
  out = ta.report({0: seed})
  assert out["means"] == {"root": 0.25, "root_with_tool": 0.75,
                          "incumbent_without_tool": 0.25, "incumbent_with_tool": 1.0,
                          "evotrainer": 0.75, "static": 0.5}
  assert out["reproduced"] == {"0": {"equal": 1, "n": 2}}  # a agrees, b does not
  assert out["tool_alone"]["mean"] == pytest.approx(0.5)  # (1 - 0 + 0.5 - 0.5) / 2
  assert out["rl_with_tool"]["mean"] == pytest.approx(0.25)  # (0 + 0.5) / 2
  assert out["policy_alone_vs_static"]["mean"] == pytest.approx(-0.25)  # (0 - 0.5) / 2
  assert out["rescored_vs_static"]["mean"] == pytest.approx(0.5)  # (0.5 + 0.5) / 2
