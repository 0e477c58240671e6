"""bench/real_model.py's bookkeeping: means over seeds by level, and a stored result is
reused only under the settings it ran with (no model is loaded)."""

import argparse

from bench import real_model
from bench.common import load_json, save_json


def _result(avg, greedy, prose, fired):
  return {"problems": 4, "avg8": avg, "pass8": 1.0, "greedy": greedy, "format": 1.0,
          "diagnostics": {"prose_rate": prose}, "fired": fired}


def test_summary_means_over_seeds_by_level():
  runs = {"code_L2/seed0": {"result": _result(0.25, 0.5, 0.125, ["prose_rate"])},
          "code_L2/seed1": {"result": _result(0.5, 1.0, 0.375, ["runaway_length"])},
          "humaneval/seed0": {"result": _result(0.0, 0.0, 0.0, [])}}
  out = real_model.summary(runs, k=8)
  assert out["code_base_test_pass1"] == {"2": {"avg8": 0.375, "pass8": 1.0, "greedy": 0.75,
                                               "format": 1.0, "seeds": 2, "problems": 4}}
  assert out["code_base_diagnostics"]["2"] == {"values": {"prose_rate": 0.25},
                                               "fired": ["prose_rate", "runaway_length"]}
  assert out["humaneval_pass1"]["avg8"] == 0.0 and out["humaneval_pass1"]["seeds"] == 1


def test_settings_decide_what_a_rerun_redoes(tmp_path):
  args = argparse.Namespace(num_test=64, k=8, max_new_tokens=128, humaneval=20,
                            humaneval_stride=8, humaneval_max_new_tokens=256, batch_rows=32)
  path = str(tmp_path / "out.json")
  save_json(path, {"other": 1, "code_base_runs": {
      "code_L1/seed0": {"settings": real_model.settings(args), "result": {}}}})
  stored = load_json(path)
  assert stored["other"] == 1  # other benchmarks' keys survive
  assert stored["code_base_runs"]["code_L1/seed0"]["settings"] == real_model.settings(args)
  args.k = 4
  assert stored["code_base_runs"]["code_L1/seed0"]["settings"] != real_model.settings(args)


def test_math_rungs_are_summarized_apart_from_code():
  runs = {"math_L1/seed0": {"result": _result(0.5, 1.0, 0.0, ["dead_group_ratio"])},
          "code_L1/seed0": {"result": _result(0.25, 0.5, 0.0, [])}}
  out = real_model.summary(runs, k=8)
  assert out["math_base_test_pass1"]["1"]["avg8"] == 0.5
  assert out["code_base_test_pass1"]["1"]["avg8"] == 0.25
  assert out["math_base_diagnostics"]["1"]["fired"] == ["dead_group_ratio"]


def test_the_math_ladder_names_real_sources_easiest_first():
  from evotrainer.tasks.math.task import PROCEDURAL_SOURCES
  assert list(real_model.MATH_LADDER) == [1, 2, 3, 4]
  assert all(src in PROCEDURAL_SOURCES and 1 <= d <= 3
             for src, d in real_model.MATH_LADDER.values())
  assert real_model.MATH_LADDER[1] == ("basic_arithmetic", 1)  # one-digit a +- b
  assert real_model.MATH_LADDER[4][0] == "gsm_symbolic"  # word problems last
