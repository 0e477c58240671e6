"""run.py and modes/: the mode dispatch, the test-split evaluation it reports (eval/heldout.py)
against figures worked out by hand from a scripted rollout, and branch mode's files
(branch_result.json beside test_eval.json, the saved model) against the values the test
itself computes. Training is replaced by a scripted `train`: nothing here compiles a
learner."""

import json
import pathlib
import re
import types

import gin
import jax
import numpy as np
import pytest
from flax import nnx

from evotrainer import checkpoint
from evotrainer import run as run_lib
from evotrainer.modes import branch as branch_mode
from evotrainer.modes import evolve as evolve_mode
from evotrainer import train as train_lib
from evotrainer.eval.heldout import EvalConfig, evaluate_test_split, score_test_split
from evotrainer.evolution.ledger.mirror import open_ledger
from evotrainer.model.config import ModelConfig
from evotrainer.rollouts.generation import Generation
from evotrainer.rollouts.store import RolloutStore
from evotrainer.tasks.base import Problem
from evotrainer.types import Episode
from tests.model.test_transformer import _random_model

# Test problems t0..t4: correctness of each of k = 3 samples, and of the greedy answer.
CORRECT = {"t0": [1, 0, 0], "t1": [0, 0, 0], "t2": [1, 1, 1], "t3": [0, 1, 0], "t4": [1, 1, 0]}
GREEDY = {"t0": 1, "t1": 0, "t2": 1, "t3": 0, "t4": 0}
# By hand: avg@3 = (1 + 0 + 3 + 1 + 2) / 15; pass@3 = 4 of 5 problems solved at least
# once; greedy 2 of 5; format 1 on every row but t1's three: 12 / 15.
FIGURES = {"avg3": 7 / 15, "pass3": 0.8, "greedy": 0.4, "format": 0.8}
PER_PROBLEM = {"t0": 1 / 3, "t1": 0.0, "t2": 1.0, "t3": 1 / 3, "t4": 2 / 3}
TEST = [Problem(f"t{i}", f"q{i}", str(i), str(i), "scripted") for i in range(5)]
# The canaries' greedy answers: c0 right in the strict format, c1 the right number bare.
CANARIES = [Problem("c0", "q", "7", "7", "canary"), Problem("c1", "q", "9", "9", "canary")]
CANARY_TEXT = {"c0": "<answer>7</answer>", "c1": "9"}


class ScriptedTask:
  """Test problems and canaries; records which splits it was asked for."""

  def __init__(self):
    self.splits = []

  def heldout_problems(self, n: int, split: str = "validation") -> list:
    self.splits.append(split)
    return TEST[:n]

  def format_prompt(self, problem) -> str:
    return f"Q: {problem.prompt}"

  def canary_problems(self) -> list:
    return CANARIES

  def strict_verify(self, answer: str, text: str) -> bool:
    return text == f"<answer>{answer}</answer>"


class ScriptedRollout:
  """Returns a `Generation` scored from CORRECT / GREEDY; records (params, group, greedy)."""

  def __init__(self, task):
    self.task, self.calls = task, []

  def __call__(self, params, problems, group, key, sampling, pad_rows_to=None):
    self.calls.append((params, group, sampling.greedy))
    rows = [(p, j) for p in problems for j in range(group)]
    scores = [{"correct": float(GREEDY.get(p.id, 0) if sampling.greedy
                                else CORRECT[p.id][j]), "format": float(p.id != "t1")}
              for p, j in rows]
    b = len(rows)
    return Generation(problems=[p for p, _ in rows], prompt_tokens=np.zeros((b, 1), np.int32),
                      prompt_lengths=np.ones(b, np.int32), tokens=np.zeros((b, 1), np.int32),
                      logprobs=np.zeros((b, 1), np.float32), lengths=np.ones(b, np.int32),
                      truncated=np.zeros(b, bool),
                      texts=[CANARY_TEXT.get(p.id, "x") for p, _ in rows], scores=scores)


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


# ------------------------------------------------------------------ dispatch


def test_an_unknown_mode_names_every_mode_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match="run.mode='trian'") as e:
    run_lib.run(str(workdir), mode="trian", task=ScriptedTask())
  for mode in ("train", "branch", "evolve", "sweep", "ledger", "sample"):
    assert repr(mode) in str(e.value)
  assert not workdir.exists()


def test_ledger_mode_prints_the_ledger_and_never_creates_one(tmp_path, capsys):
  with pytest.raises(FileNotFoundError, match=f"no ledger.sqlite in {tmp_path}"):
    run_lib.run(str(tmp_path), mode="ledger", task=None)
  assert list(tmp_path.iterdir()) == []
  with open_ledger(tmp_path) as ledger:
    ledger.add_version("v0", None)
  assert run_lib.run(str(tmp_path), mode="ledger", task=None) == {}
  assert "v0" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["evolve", "sweep"])
def test_evolve_and_sweep_go_to_the_controller_and_write_its_summary(tmp_path, monkeypatch,
                                                                     mode):
  calls = []

  def fake_evolve(workdir, seed, **kwargs):
    calls.append((workdir, seed, kwargs))
    return {"versions": ["v0", "v1.0"]}

  monkeypatch.setattr(run_lib, "evolve", fake_evolve)
  task = ScriptedTask()
  summary = run_lib.run(str(tmp_path), mode=mode, seed=7, task=task)
  assert calls == [(str(tmp_path), 7, {"mode": mode, "task": task, "command_line": None})]
  assert summary["versions"] == ["v0", "v1.0"] and summary["wall_s"] >= 0
  assert json.loads((tmp_path / "summary.json").read_text()) == summary
  # A process other than 0 of a multi-process evolution: no summary, no file.
  (tmp_path / "summary.json").unlink()
  monkeypatch.setattr(run_lib, "evolve", lambda *a, **k: None)
  assert run_lib.run(str(tmp_path), mode=mode, task=task) == {}
  assert not (tmp_path / "summary.json").exists()
  # A resumed run that finishes at once keeps the controller's wall time of all its
  # invocations, not this one's fraction of a second.
  monkeypatch.setattr(run_lib, "evolve", lambda *a, **k: {"versions": [], "wall_s": 2793.28})
  assert run_lib.run(str(tmp_path), mode=mode, task=task)["wall_s"] == 2793.28
  assert json.loads((tmp_path / "summary.json").read_text())["wall_s"] == 2793.28


def test_a_sweep_without_a_file_is_an_error_before_any_ledger(tmp_path, clean_gin):
  from evotrainer.evolution.sweep import SweepError
  from tests.evolution.test_controller import space
  with pytest.raises(SweepError, match="needs a sweep file"):
    evolve_mode.evolve(str(tmp_path), 0, space=space(), mode="sweep")
  assert not (tmp_path / "ledger.sqlite").exists()


@pytest.mark.parametrize("knob", [{"adopt_against": "sibling"}, {"adopt_step_gain": -0.1},
                                  {"adopt_discoveries": "yes"}, {"branches": 0},
                                  {"continue_steps": -1}])
def test_a_bad_loop_knob_is_a_config_error_before_any_ledger(tmp_path, clean_gin, knob):
  """The launcher prints a ConfigError in one line (`error (config): ...`)."""
  from evotrainer.config import ConfigError
  from tests.evolution.test_controller import space
  (name, value), = knob.items()
  with pytest.raises(ConfigError, match=f"evolve: .*{name}={value!r}"):
    evolve_mode.evolve(str(tmp_path), 0, space=space(), **knob)
  assert not (tmp_path / "ledger.sqlite").exists()


@pytest.mark.parametrize("measured,adopt_against,step_gain,adopts", [
    ("control", "control", 0.0, True), ("parent", "control", 0.0, False),
    ("parent", "parent", 0.0, True), ("parent", "parent", 0.07, False),
    ("control", "control", 0.07, True)])
def test_evolve_adopt_skills_starts_the_root_from_a_pool_of_proven_skills(
    tmp_path, monkeypatch, clean_gin, measured, adopt_against, step_gain, adopts):
  """`evolve.adopt_skills` through the mode: the root of a new run trains with the pool's
  proven skill (`evolve.skills_dir`); the ledger names it. A skill measured against its
  parent only counts with `evolve.adopt_against = 'parent'`, less `adopt_step_gain`: two
  effects of 0.1 (half-width 0.05) pool to lo 0.1 - 0.05 / sqrt(2) = 0.0646, below a
  gain of 0.07; an effect against a control is never lessened."""
  from evotrainer.evolution.skills import SkillLibrary
  from tests.evolution import test_controller as tc
  pool = SkillLibrary.seeded(tmp_path / "pool", sources=[])
  tc._measured_skill(pool, "rloo-proven", {"binding": "Harness.estimator", "kind": "set",
                                           "value": "rloo"}, [0.1, 0.1], against=measured)
  trainer = tc.BindingTrainer({})
  monkeypatch.setattr(evolve_mode, "branch_trainer", lambda *a, **k: trainer)
  space = tc.space()
  monkeypatch.setattr(space, "current_values", lambda: dict(tc.VALUES))
  evolve_mode.evolve(str(tmp_path / "run"), 0, space=space, generations=0,
                     skills_dir=str(tmp_path / "pool"), adopt_skills=2,
                     adopt_against=adopt_against, adopt_step_gain=step_gain,
                     backtest=False)
  assert trainer.bindings == {"v0": ["Harness.estimator = 'rloo'"] if adopts else []}
  with open_ledger(tmp_path / "run") as ledger:
    assert (ledger.version("v0").bindings["Harness.estimator"] == "rloo") == adopts
    assert ledger.get_meta("controller/adopted")["skills"] == (["rloo-proven"] if adopts
                                                               else [])


# ------------------------------------------------------------------ evaluations


def test_test_evaluation_against_figures_by_hand():
  task = ScriptedTask()
  rollout = ScriptedRollout(task)
  # batch_rows 6 over k = 3: sampled 2 problems at a time (chunks 2, 2, 1).
  cfg = EvalConfig(num_test=5, k=3, batch_rows=6, max_new_tokens=4)
  figures, per = evaluate_test_split(rollout, "params", task, cfg)
  assert figures == pytest.approx(FIGURES) and set(figures) == set(FIGURES)
  assert per == pytest.approx(PER_PROBLEM) and list(per) == sorted(PER_PROBLEM)
  assert task.splits == ["test"]  # the test split, never validation
  assert [c for c in rollout.calls if not c[2]] == [("params", 3, False)] * 3
  assert [c for c in rollout.calls if c[2]] == [("params", 1, True)]
  assert evaluate_test_split(rollout, "params", task, EvalConfig(num_test=0)) == ({}, {})
  assert task.splits == ["test"] and len(rollout.calls) == 4  # num_test 0: nothing sampled
  seen = []  # progress after each sampled batch: 2, 4, then 5 of 5 problems
  assert score_test_split(ScriptedRollout(task), "params", task, cfg,
                          progress=lambda d, t: seen.append((d, t)))[0] == figures
  assert seen == [(2, 5), (4, 5), (5, 5)]


# ------------------------------------------------------------------ branch mode

TINY = ModelConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=4)
# The last held-out step's episodes (step 2; step 0's are older): per problem, the mean
# of `correct` over its samples, 0 where a sample has no `correct` part.
HELDOUT = {0: [("t0", {"correct": 1.0})],
           2: [("t0", {"correct": 1.0}), ("t0", {"correct": 0.0}), ("t1", {"correct": 1.0}),
               ("t2", {"format": 1.0})]}
BRANCH_PER_PROBLEM = {"t0": 0.5, "t1": 1.0, "t2": 0.0}
METRICS = [{"step": 1, "reward": 0.5, "correct": 0.25, "length_mean": 6.0, "truncated": 0.0},
           {"step": 2, "eval": True, "avg3": 0.4},  # an evaluation row: not a step
           {"step": 2, "reward": 0.75, "correct": 0.5, "length_mean": 5.0, "truncated": 0.25,
            "learner/entropy": 1.5, "learner/clip_frac_low": 0.125,
            "learner/clip_frac_high": 0.25}]
SERIES = {"correct": [0.25, 0.5], "reward": [0.5, 0.75], "entropy": [None, 1.5],
          "length": [6.0, 5.0], "truncated": [0.0, 0.25], "clip_frac": [None, 0.375]}


def _fake_train(trained_params, rollout, calls):
  """`train` as branch mode calls it: writes the step rows and the held-out episodes a
  real run would, and returns the trained state."""

  def train(workdir, task, model, tok, mesh, *, seed, sampling, version, parent_checkpoints):
    calls.append((version, seed, parent_checkpoints))
    (pathlib.Path(workdir) / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in METRICS))
    store = RolloutStore(pathlib.Path(workdir) / "rollouts")
    for step, rows in HELDOUT.items():
      store.write(version, step, "heldout", [
          Episode(f"{version}/heldout/{step}/{i}", i, tid, "q", "c", "a", parts,
                  version=version, step=step, split="heldout")
          for i, (tid, parts) in enumerate(rows)])
    return {"steps": 2, "initial": {"avg3": 0.1}, "final": {"avg3": 0.4},
            "state": types.SimpleNamespace(params=trained_params), "rollout": rollout}

  return train


def test_branch_writes_its_result_and_test_figures_against_values_by_hand(
    tmp_path, monkeypatch, clean_gin):
  gin.parse_config("run.branch.version = 'v2.1'\n"
                   "train.EvalConfig.num_test = 5\n"
                   "train.EvalConfig.k = 3\n"
                   "train.EvalConfig.batch_rows = 6\n")
  task = ScriptedTask()
  rollout = ScriptedRollout(task)
  model, trained = _random_model(TINY, seed=0), _random_model(TINY, seed=1)
  calls = []
  monkeypatch.setattr(train_lib, "train", _fake_train(nnx.state(trained, nnx.Param), rollout,
                                                      calls))
  exploit = {"exploit_recovery": 0.25, "exploit_recovery/echo": 0.25}
  monkeypatch.setattr(branch_mode, "exploit_recovery", lambda task, tok: dict(exploit))

  returned = branch_mode.train_branch(str(tmp_path), model, None, task, None, 3, None)
  assert calls == [("v2.1", 3, None)]  # no parent: trains from the model as given
  written = json.loads((tmp_path / "branch_result.json").read_text())
  assert written == returned == {
      "version": "v2.1", "steps": 2, "initial": {"avg3": 0.1},
      "final": {"avg3": 0.4, **exploit, "canary_accuracy": 0.5, "canary_n": 2.0},
      "checkpoint": str(tmp_path / "model"), "rollouts": str(tmp_path / "rollouts"),
      "per_problem": BRANCH_PER_PROBLEM, "series": SERIES, "canary": {"c0": 1.0, "c1": 0.0}}
  # The test split goes beside the result, never into it.
  test_eval = json.loads((tmp_path / "test_eval.json").read_text())
  assert test_eval["version"] == "v2.1"
  assert test_eval["final"] == pytest.approx(FIGURES)
  assert test_eval["per_problem"] == pytest.approx(PER_PROBLEM)
  # The trained parameters are saved as the branch's model.
  assert checkpoint.read_model_metadata(tmp_path / "model") == {"version": "v2.1"}
  restored = _random_model(TINY, seed=2)
  checkpoint.restore_params_into(tmp_path / "model", restored)
  for got, want in zip(*(jax.tree.leaves(nnx.state(m, nnx.Param))
                          for m in (restored, trained))):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # Finished before a crash of its caller: the stored result, nothing trained again.
  monkeypatch.setattr(train_lib, "train", None)
  assert branch_mode.train_branch(str(tmp_path), None, None, task, None, 3, None) == written



def test_branches_replay_the_whole_command_line_search_paths_included():
  from evotrainer.config import CommandLine
  cli = CommandLine(gin_files=("mine.gin",), gin_bindings=("a.b = 1",),
                    gin_search_paths=("/my/gin", "/more"), imports=("my_mod",),
                    flags=("--new_segment",))
  cmd = evolve_mode.branch_trainer(cli, branch_steps=7, timeout_s=60).command(
      version="v1.0", parent_checkpoint=None, bindings=["c.d = 2"], seed=3, workdir="/w")
  assert cmd[1:4] == ["-m", "evotrainer.launch", "--workdir=/w"]
  assert cmd[4:9] == ["--gin_file=mine.gin", "--import=my_mod", "--new_segment",
                      "--gin_search_paths=/my/gin", "--gin_search_paths=/more"]
  assert cmd[9:12] == ["--gin_bindings=a.b = 1", "--gin_bindings=train.steps = 7",
                       "--gin_bindings=c.d = 2"]


@pytest.mark.parametrize("steps,timeout,message", [
    (-1, 60, "branch_steps=-1; expected a whole number >= 0"),
    (2.5, 60, "branch_steps=2.5; expected a whole number"),
    (True, 60, "branch_steps=True"),
    (3, 0, "branch_timeout_s=0; expected seconds > 0"),
    (3, None, "branch_timeout_s=None")])
def test_bad_branch_steps_or_timeout_is_a_config_error(steps, timeout, message):
  from evotrainer.config import CommandLine, ConfigError
  with pytest.raises(ConfigError, match=re.escape(f"evolve: {message}")):
    evolve_mode.branch_trainer(CommandLine(), branch_steps=steps, timeout_s=timeout)


@pytest.mark.parametrize("bindings,said", [
    (("train.steps = 100",), True), (("a.b = 1\n  train.steps=5",), True),
    (("train.steps_per_eval = 3", "x.train.steps = 2"), False), ((), False)])
def test_a_command_line_train_steps_is_said_to_be_replaced(capsys, bindings, said):
  from evotrainer.config import CommandLine
  trainer = evolve_mode.branch_trainer(CommandLine(gin_bindings=bindings), branch_steps=7,
                                       timeout_s=60)
  out = capsys.readouterr().out
  assert ("replaced in every branch by evolve.branch_steps = 7" in out) is said, out
  cmd = trainer.command(version="v1.0", parent_checkpoint=None, bindings=[], seed=0,
                        workdir="/w")
  steps = [c for c in cmd if c.startswith("--gin_bindings=") and "train.steps" in c]
  assert steps[-1] == "--gin_bindings=train.steps = 7"  # the branch's value comes last


def test_a_missing_skills_dir_is_a_config_error_before_any_ledger(tmp_path, clean_gin):
  """A pool path that does not exist (e.g. a relative one read from another directory)
  would start the run from no skills without a word; it is refused."""
  from evotrainer.config import ConfigError
  from tests.evolution.test_controller import space
  with pytest.raises(ConfigError, match="skills_dir='.*nowhere' is not a directory"):
    evolve_mode.evolve(str(tmp_path / "run"), 0, space=space(),
                       skills_dir=str(tmp_path / "nowhere"))
  assert not (tmp_path / "run").exists()


def _naive_adoption(pool_dirs, domain, step_gain, min_n=2, z=1.96) -> set:
  """The skills a root adopts under `gin/code_smol_adopt.gin`'s rule, by a plain loop over
  the skill files: each history entry in `domain` that was not recorded because it was
  good (a learned skill's first entry, without a `selected` mark, counts as such), an
  effect against the parent less `step_gain`; inverse-variance pooling; at least `min_n`
  of them and the pooled interval above 0; the largest pooled mean per binding."""
  best = {}  # binding -> (mean, name)
  seen = set()
  for d in pool_dirs:
    for path in sorted(pathlib.Path(d).glob("*.json")):
      skill = json.loads(path.read_text())
      if skill["name"] in seen:
        continue
      seen.add(skill["name"])
      rows = []
      for i, h in enumerate(skill.get("history", [])):
        selected = h.get("selected", skill.get("source") == "learned" and i == 0)
        e = h.get("effect")
        if not e or h.get("domain") != domain or selected:
          continue
        off = step_gain if e.get("against", "parent") == "parent" else 0.0
        se = max((e["hi"] - e["lo"]) / (2 * z), 1e-3)
        rows.append((e["diff"] - off, se))
      if len(rows) < min_n or skill["intervention"]["kind"] == "revert":
        continue
      w = [1 / se ** 2 for _, se in rows]
      mean = sum(wi * d for wi, (d, _) in zip(w, rows)) / sum(w)
      if mean - z / sum(w) ** 0.5 > 0:
        binding = skill["intervention"]["binding"]
        best[binding] = max(best.get(binding, (-1.0, "")), (mean, skill["name"]))
  return {name for _, name in best.values()}


def test_the_shipped_adoption_config_adopts_what_its_committed_pool_proves(
    tmp_path, monkeypatch, clean_gin):
  """gin/code_smol_adopt.gin through the mode (a stand-in trainer, the root alone): the
  root trains under the skills that a plain pooling of the committed pool
  (bench/results/skills_pool_code_smol_replicated) says are proven, and no others."""
  from evotrainer import registry
  from evotrainer.evolution.skills import SEED_DIR
  from tests.evolution import test_controller as tc
  repo = pathlib.Path(__file__).resolve().parents[1]
  monkeypatch.chdir(repo)  # the config's pool path is relative to the repository root
  registry.parse(["gin/code_smol_adopt.gin"], ["evolve.generations = 0",
                                                "evolve.backtest = False"])
  assert gin.query_parameter("VerifyConfig.keep_on") == "unless_worse"
  expected = _naive_adoption([repo / "bench/results/skills_pool_code_smol_replicated",
                              SEED_DIR], "code", 0.027)
  assert expected  # the committed pool proves something, or the test shows nothing
  trainer = tc.BindingTrainer({})
  monkeypatch.setattr(evolve_mode, "branch_trainer", lambda *a, **k: trainer)
  evolve_mode.evolve(str(tmp_path / "run"), 0)
  with open_ledger(tmp_path / "run") as ledger:
    assert set(ledger.get_meta("controller/adopted")["skills"]) == expected
  assert len(trainer.bindings["v0"]) == len(expected)
