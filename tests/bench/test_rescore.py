"""bench/rescore.py: which model each arm re-scores, with which config, and the fresh
problems' figures against values by hand. The `test`-mode runs are scripted here (the
mode itself is driven end to end in tests/test_train.py)."""

import json
import pathlib

import pytest

from bench import rescore

SEEDS = ["1", "2"]
# Benchmark problems b0, b1 (what the benchmark scored); fresh problems f0, f1.
RESCORED = {  # (arm, seed) -> per-problem scores of the `test`-mode run
    ("base", "1"): {"b0": 0.0, "b1": 0.5, "f0": 0.0, "f1": 0.25},
    ("static", "1"): {"b0": 0.5, "b1": 0.5, "f0": 0.25, "f1": 0.25},
    ("static", "2"): {"b0": 0.25, "b1": 0.5, "f0": 0.5, "f1": 0.0},
    ("evotrainer", "1"): {"b0": 0.75, "b1": 0.5, "f0": 0.5, "f1": 0.5},
    ("evotrainer", "2"): {"b0": 0.5, "b1": 0.5, "f0": 0.75, "f1": 0.25},
}


def _bench(tmp_path):
  reported = {k: {p: v for p, v in pp.items() if p.startswith("b")}
              for k, pp in RESCORED.items()}
  reported[("evotrainer", "2")]["b0"] = 0.375  # the one the re-scoring does not reproduce
  arms = {"base": {s: {"per_problem": reported[("base", "1")], "same_run_as": "static"}
                   for s in SEEDS},
          "clip_higher": {s: {"per_problem": reported[("static", s)], "same_run_as": "static"}
                          for s in SEEDS},
          "static": {s: {"per_problem": reported[("static", s)]} for s in SEEDS},
          "evotrainer": {s: {"per_problem": reported[("evotrainer", s)], "incumbent": f"v{s}.0"}
                         for s in SEEDS}}
  path = tmp_path / "bench.json"
  path.write_text(json.dumps({"seeds": [1, 2], "model": "m", "arms": arms}))
  runs = tmp_path / "runs"
  for d in ("static-s1", "static-s2", "evotrainer-s1/versions/v1.0",
            "evotrainer-s2/versions/v2.0"):
    (runs / d).mkdir(parents=True)
    (runs / d / "operative_config.gin").write_text("run.seed = 0\n")
  return path, runs


def test_rescore_scores_each_final_model_once_and_the_fresh_problems_by_hand(tmp_path,
                                                                           monkeypatch):
  path, runs = _bench(tmp_path)
  calls = []

  def run_or_read(gin_files, bindings, wd, log):
    calls.append((wd.name, gin_files, bindings))
    arm, seed = wd.name.rsplit("-s", 1)
    return {"test": {"per_problem": RESCORED[(arm, seed)]}, "wall_s": 1.0}

  monkeypatch.setattr(rescore, "run_or_read", run_or_read)
  out = rescore.main(["--bench", str(path), "--runs", str(runs), "--num_test", "4",
                      "--workdir", str(tmp_path / "wd"), "--json", str(tmp_path / "o.json")])
  # base once, before RL, from the static run's config; clip_higher is static's run.
  r = runs.resolve()
  assert calls == [
      ("base-s1", [f"{r}/static-s1/operative_config.gin"],
       ["run.mode = 'test'", "EvalConfig.num_test = 4"]),
      *[(f"static-s{s}", [f"{r}/static-s{s}/operative_config.gin"],
         ["run.mode = 'test'", "EvalConfig.num_test = 4", f"test.model = '{r}/static-s{s}'"])
        for s in SEEDS],
      *[(f"evotrainer-s{s}", [f"{r}/evotrainer-s{s}/versions/v{s}.0/operative_config.gin"],
         ["run.mode = 'test'", "EvalConfig.num_test = 4",
          f"test.model = '{r}/evotrainer-s{s}/versions/v{s}.0'"]) for s in SEEDS]]
  assert out["problems"] == {"benchmark": 2, "fresh": 2}
  # Fresh problems f0, f1, mean over seeds: static (0.25 + 0.25) / 2 = 0.25;
  # evotrainer (0.5 + 0.5) / 2 = 0.5; base 0.125 on both seeds.
  assert out["means_fresh"] == pytest.approx(
      {"base": 0.125, "static": 0.25, "evotrainer": 0.5, "clip_higher": 0.25})
  assert out["means_benchmark"]["evotrainer"] == pytest.approx((0.625 + 0.5) / 2)
  # evotrainer - static per fresh problem: seed 1 (0.25, 0.25), seed 2 (0.25, 0.25).
  d = out["diff_vs_static"]
  assert d["mean"] == pytest.approx(0.25) and d["lo"] == pytest.approx(0.25)
  assert out["diffs_vs_static"]["clip_higher"]["mean"] == 0
  assert out["reproduced"]["evotrainer"]["2"] == {"equal": 1, "n": 2, "max_abs_diff": 0.125}
  assert out["reproduced"]["static"]["1"] == {"equal": 2, "n": 2, "max_abs_diff": 0.0}
  assert json.loads((tmp_path / "o.json").read_text())["means_fresh"] == out["means_fresh"]


def test_rescore_needs_more_problems_than_the_benchmark_scored(tmp_path):
  path, runs = _bench(tmp_path)
  with pytest.raises(SystemExit, match="scored 2 test problems already"):
    rescore.main(["--bench", str(path), "--runs", str(runs), "--num_test", "2"])
