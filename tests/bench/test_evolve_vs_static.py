"""The benchmark's paired interval, by hand (the arms themselves are whole runs)."""

import pytest

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
  from bench.evolve_vs_static import arm_launches
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


@pytest.mark.parametrize("domain", ["math", "code"])
def test_the_static_arm_evaluates_on_the_evolutions_problems(domain):
  """Parsed as each arm's command parses them, the static arm's gin files and bindings
  give the same validation and test sets as the evolution's."""
  import gin

  from bench.evolve_vs_static import arm_launches
  from evotrainer import registry
  task = {"math": "MathTask", "code": "CodeTask"}[domain]
  names = ["EvalConfig.num_problems", "EvalConfig.num_test", "EvalConfig.k",
           f"{task}.num_validation", f"{task}.num_test"]
  out = arm_launches(domain, seed=0, generations=1, branches=2, branch_steps=10,
                     control=True)
  seen = {}
  for arm in ("static", "evotrainer"):
    gin_files, bindings = out[arm]
    try:
      registry.parse(gin_files, bindings, finalize=False)
      seen[arm] = {n: gin.query_parameter(n) for n in names}
    finally:
      gin.clear_config()
  assert seen["static"] == seen["evotrainer"]


def test_an_unknown_arm_is_refused_before_anything_runs(tmp_path, capsys):
  from bench.evolve_vs_static import main
  with pytest.raises(SystemExit):
    main(["--arms", "static,evotrainr", "--workdir", str(tmp_path / "w"), "--seeds", "0"])
  assert "unknown ['evotrainr']" in capsys.readouterr().err
  assert not any((tmp_path / "w").glob("*-s0*"))  # no arm was launched
