"""bench/real_rl.py's reading of a fixed-harness run's summary.json."""

import json

import pytest

from bench.real_rl import rl_result, summarize_rl


def _summary(base: dict, rl: dict) -> dict:
  mean = lambda d: sum(d.values()) / len(d)  # noqa: E731
  return {"steps": 30, "wall_s": 1800.0,
          "initial": {"avg8": 0.2, "pass8": 0.5}, "final": {"avg8": 0.3, "pass8": 0.6},
          "test": {"initial": {"avg8": mean(base)}, "final": {"avg8": mean(rl)},
                   "per_problem": rl, "per_problem_initial": base}}


def test_rl_result_reads_test_before_and_after():
  r = rl_result(_summary({"a": 0.0, "b": 0.5}, {"a": 0.25, "b": 0.5}))
  assert (r["base_test"], r["rl_test"]) == (0.25, 0.375)
  assert (r["base_validation"], r["rl_validation"]) == (0.2, 0.3)
  assert (r["steps"], r["minutes"]) == (30, 30.0)
  assert "test_report" not in r  # a task without a test report (code, math)
  report = {"initial": {"all": {"stops": {"max_turns": 1.0}}},
            "final": {"all": {"stops": {"submitted": 1.0}}}}
  summary = _summary({"a": 0.0}, {"a": 1.0})
  summary["test"]["report"] = report
  assert rl_result(summary)["test_report"] == report
  assert summarize_rl({"rl-s0": rl_result(summary)})["runs"]["rl-s0"]["test_report"] == report


def test_summary_pairs_problems_across_seeds():
  # Seed 0 gains 0.25 on one problem of two (mean +0.125), seed 1 gains 0.5 on both.
  runs = {"rl-s0": rl_result(_summary({"a": 0.0, "b": 0.5}, {"a": 0.25, "b": 0.5})),
          "rl-s1": rl_result(_summary({"a": 0.0, "b": 0.0}, {"a": 0.5, "b": 0.5}))}
  out = summarize_rl(runs)
  assert out["rl_minus_base"]["mean"] == pytest.approx((0.125 + 0.5) / 2)
  assert out["rl_minus_base"]["lo"] <= out["rl_minus_base"]["mean"] <= out["rl_minus_base"]["hi"]
  assert out["base_test"] == pytest.approx((0.25 + 0.0) / 2)
  assert out["rl_test"] == pytest.approx((0.375 + 0.5) / 2)
  assert "per_problem" not in out["runs"]["rl-s0"]


def test_training_diagnostics_average_each_end_of_the_run(tmp_path):
  from bench.real_rl import training_diagnostics
  rows = []
  for step in range(1, 6):  # correct 0.1 .. 0.5; a step's diagnostics on a second row
    rows.append({"step": step, "correct": step / 10, "time/step_s": 40.0})
    rows.append({"step": step, "diag/prose_rate": 0.5 - step / 10})
  rows.append({"step": "final", "correct": 1.0})  # not a training step
  path = tmp_path / "metrics.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  out = training_diagnostics(path, edge=2)
  assert out["first"] == {"correct": 0.15, "time/step_s": 40.0, "diag/prose_rate": 0.35}
  assert out["last"] == {"correct": 0.45, "time/step_s": 40.0, "diag/prose_rate": 0.05}


def test_a_warm_started_run_is_read_as_warm_not_base():
  summary = {**_summary({"a": 0.0, "b": 0.5}, {"a": 0.5, "b": 0.5}), "warm_start_s": 600.0}
  r = rl_result(summary)
  assert "base_test" not in r and r["warm_test"] == 0.25 and r["warm_start_minutes"] == 10.0
  out = summarize_rl({"math-rl-s0": r})
  assert out["warm_test"] == 0.25 and out["rl_minus_warm"]["mean"] == pytest.approx(0.25)
  base = rl_result(_summary({"a": 0.0, "b": 0.5}, {"a": 0.5, "b": 0.5}))
  assert base["warm_start_minutes"] is None
  with pytest.raises(ValueError, match="mix warm-started and base"):
    summarize_rl({"math-rl-s0": r, "math-rl-s1": base})


def test_every_domain_and_arm_names_an_existing_gin_file_and_its_own_section():
  import pathlib
  from bench.real_rl import GIN, SECTION
  repo = pathlib.Path(__file__).resolve().parents[2]
  assert set(GIN) == set(SECTION) == {(d, a) for d in ("code", "math", "swe")
                                      for a in ("rl", "evolve")}
  assert all((repo / g).is_file() for g in GIN.values())
  assert len(set(SECTION.values())) == len(SECTION)


def test_swe_resolve_per_level_by_hand(tmp_path):
  from bench.real_rl import level_resolve, swe_levels, swe_resolve
  (tmp_path / "operative_config.gin").write_text(
      "# Parameters for SweDomain:\nSweDomain.levels = [1]\nSweDomain.show_code = True\n")
  assert swe_levels(tmp_path) == [1]
  (tmp_path / "operative_config.gin").write_text("SweDomain.levels = (0, 2)\n")
  assert swe_levels(tmp_path) == [0, 2]  # a default written as a tuple
  (tmp_path / "operative_config.gin").write_text("SweDomain.show_code = True\n")
  assert swe_levels(tmp_path) == [2]
  # One level: its figure is the run's Avg@4; 5 tasks x 4 episodes.
  per = {f"t{i}-L1": 0.0 for i in range(5)}
  assert level_resolve({"avg4": 0.1, "pass4": 0.2, "greedy": 0.0}, per, [1]) == {
      "1": {"avg": 0.1, "episodes": 20}}
  # Two levels: each level's own figure; 2 tasks at each level, 4 episodes each.
  per = {"a-L0": 1.0, "a-L1": 0.0, "b-L0": 0.5, "b-L1": 0.0}
  figures = {"avg4": 0.375, "avg4_level0": 0.75, "avg4_level1": 0.0, "pass4_level0": 1.0}
  assert level_resolve(figures, per, [0, 1]) == {"0": {"avg": 0.75, "episodes": 8},
                                                 "1": {"avg": 0.0, "episodes": 8}}
  runs = {"swe-rl-s0": {"levels": {"1": {"initial": {"avg": 0.1, "episodes": 20},
                                         "final": {"avg": 0.3, "episodes": 20}}}},
          "swe-rl-s1": {"levels": {"1": {"initial": {"avg": 0.1, "episodes": 20},
                                         "final": {"avg": 0.2, "episodes": 20}}}}}
  assert swe_resolve(runs) == {"1": {"rl": 0.25, "rl_before": 0.1, "rl_episodes": 40,
                                     "rl_seeds": 2}}


def test_main_folds_a_swe_run_into_the_resolve_table_beside_the_base_figures(
    tmp_path, monkeypatch):
  from bench import real_rl
  launched = []

  def fake_run(gin_files, bindings, wd, log):
    launched.append((gin_files, bindings))
    wd.mkdir(parents=True)
    (wd / "operative_config.gin").write_text("SweDomain.levels = [1]\n")
    (wd / "metrics.jsonl").write_text(json.dumps({"step": 1, "correct": 0.25}) + "\n")
    summary = _summary({"a-L1": 0.0, "b-L1": 0.5}, {"a-L1": 0.5, "b-L1": 0.5})
    summary["warm_start_s"] = 60.0
    summary["initial"], summary["final"] = {"avg4": 0.2}, {"avg4": 0.3}  # validation
    summary["test"]["initial"], summary["test"]["final"] = {"avg4": 0.25}, {"avg4": 0.5}
    summary["test"]["report"] = {"initial": {"all": {}}, "final": {"all": {}}}
    return summary
  monkeypatch.setattr(real_rl, "run_or_read", fake_run)
  monkeypatch.setattr(real_rl, "packages", lambda names: {})
  out = tmp_path / "swe_real.json"
  out.write_text(json.dumps({"resolve": {"1": {"base": 0.0, "episodes": 20}}, "other": 1}))
  real_rl.main(["--domain", "swe", "--arm", "rl", "--workdir", str(tmp_path / "w"),
                "--json", str(out), "--gin_bindings", "train.steps = 2"])
  assert launched == [(["gin/swe_smol_code_warm.gin"], ["run.seed = 0", "train.steps = 2"])]
  got = json.loads(out.read_text())
  assert got["other"] == 1  # the file's other keys are kept
  # Two tasks at level 1, 4 episodes each; the base figures stay beside RL's.
  assert got["resolve"]["1"] == {"base": 0.0, "episodes": 20, "rl": 0.5, "rl_before": 0.25,
                                 "rl_episodes": 8, "rl_seeds": 1}
  run = got["swe_rl"]["runs"]["swe-rl-s0"]
  assert run["test_report"] == {"initial": {"all": {}}, "final": {"all": {}}}
  assert got["swe_rl"]["warm_test"] == 0.25 and got["swe_rl"]["rl_test"] == 0.5


def test_a_swe_evolution_adds_its_incumbents_test_resolve_rate_to_the_table(
    tmp_path, monkeypatch):
  from bench import real_rl
  from evotrainer.eval.test_scores import write_test_scores

  def fake_run(gin_files, bindings, wd, log):
    # The root resolves 1 of 8 test episodes, the kept branch (the incumbent) 3 of 8. As
    # in a real evolution, each version's directory holds its operative config, the
    # controller's (wd) none.
    for vid, per in (("v0.0", {"a-L1": 0.25, "b-L1": 0.0}),
                     ("v1.0", {"a-L1": 0.5, "b-L1": 0.25})):
      (wd / "versions" / vid).mkdir(parents=True)
      (wd / "versions" / vid / "operative_config.gin").write_text("SweDomain.levels = [1]\n")
      write_test_scores(wd / "versions" / vid, vid, {"avg4": sum(per.values()) / 2}, per)
    return {"incumbent": "v1.0", "wall_s": 600.0,
            "versions": [{"id": "v0.0", "status": "kept", "parent": None, "steps": 4},
                         {"id": "v1.0", "status": "kept", "parent": "v0.0", "steps": 8}]}
  monkeypatch.setattr(real_rl, "run_or_read", fake_run)
  monkeypatch.setattr(real_rl, "packages", lambda names: {})
  out = tmp_path / "swe_real.json"
  out.write_text(json.dumps({"resolve": {"1": {"base": 0.0, "episodes": 20}}}))
  real_rl.main(["--domain", "swe", "--arm", "evolve", "--workdir", str(tmp_path / "w"),
                "--json", str(out)])
  got = json.loads(out.read_text())
  assert got["resolve"]["1"] == {"base": 0.0, "episodes": 20, "evolved": 0.375,
                                 "evolved_episodes": 8, "evolved_seeds": 1}
  assert got["swe_evolution"]["runs"]["swe-evolve-s0"]["incumbent"] == "v1.0"
  assert got["swe_evolution_versions"] == 2.0
