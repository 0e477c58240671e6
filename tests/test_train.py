"""The training segment: exact resume, and the launch command end to end."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from flax import nnx

from evotrainer.evolution.ledger import Ledger
from evotrainer.model import Transformer
from evotrainer.rollouts.store import RolloutStore
from evotrainer.tasks.math.task import MathTask
from evotrainer.tokenizers import SentencePieceTokenizer
from evotrainer.train import EvalConfig, train
from tests.tiny_models import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DigitShareTask:
  """MathTask with a reward that varies within groups even for a random policy: the
  share of digits in the completion (so the learner really moves the parameters)."""

  def __init__(self, task):
    self.task = task

  def __getattr__(self, name):
    return getattr(self.task, name)

  def score_many(self, problems, texts):
    return [{"correct": sum(c.isdigit() for c in t) / max(1, len(t)), "format": 0.0}
            for t in texts]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  task = MathTask(sources=["tiny_arithmetic"], prompt_template="{question}", num_validation=16)
  texts = [task.format_prompt(p) + " " + p.solution for p in task.train_problems(300, 0)]
  tok = SentencePieceTokenizer.train(texts, 300, str(tmp_path_factory.mktemp("spm")))
  cfg = tiny_config(vocab_size=tok.vocab_size, architecture="qwen3", qk_norm=True,
                    max_position_embeddings=128)
  return DigitShareTask(task), tok, cfg


def _run(setup, workdir, steps):
  task, tok, cfg = setup
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  from evotrainer.learner.step import Learner
  return train(str(workdir), task, model, tok, seed=3, steps=steps, prompts_per_step=4,
               group_size=4, eval_every=100, checkpoint_every=2, progress=False,
               eval_config=EvalConfig(num_problems=4, k=2, batch_rows=8, max_new_tokens=6),
               learner_factory=lambda m, mesh, **kw: Learner(m, mesh, learning_rate=3e-3, **kw))


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(l) for l in f]
  return {r["step"]: r for r in rows if "reward" in r}


@pytest.mark.slow
def test_resume_reproduces_an_uninterrupted_run(setup, tmp_path):
  full = _run(setup, tmp_path / "full", steps=4)
  _run(setup, tmp_path / "cut", steps=2)  # "interrupted" after step 2 (checkpointed)
  resumed = _run(setup, tmp_path / "cut", steps=4)
  a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "cut")
  assert sorted(b) == [1, 2, 3, 4]  # nothing logged twice after the resume
  for step in (3, 4):
    for key in ("reward", "length_mean", "learner/loss", "learner/grad_norm"):
      assert a[step][key] == pytest.approx(b[step][key], rel=1e-5, abs=1e-7), (step, key)
  assert a[3]["learner/grad_norm"] > 0  # the comparison is not between two no-ops
  pa = nnx.to_flat_state(full["state"].params)
  pb = nnx.to_flat_state(resumed["state"].params)
  for (ka, va), (kb, vb) in zip(pa, pb):
    np.testing.assert_allclose(np.asarray(va[...]), np.asarray(vb[...]), atol=1e-6)


@pytest.mark.slow
def test_test_mode_scores_a_trained_run_as_the_run_scored_itself(setup, tmp_path):
  """`test` mode (modes/scoring.py) loads a train run's last checkpoint into a fresh
  model and scores it on the test split: the parameters are the run's own, and the
  scores are those of the run's own rollout engine with its in-memory parameters."""
  import gin
  from evotrainer.eval.heldout import score_test_split
  from evotrainer.modes.scoring import load_trained, score_model
  task, tok, cfg = setup
  out = _run(setup, tmp_path / "run", steps=2)
  gin.clear_config()
  gin.parse_config(f"run.test.model = '{tmp_path / 'run'}'\n"
                   "train.EvalConfig.num_test = 4\ntrain.EvalConfig.k = 2\n"
                   "train.EvalConfig.batch_rows = 8\ntrain.EvalConfig.max_new_tokens = 6\n")
  try:
    fresh = Transformer(cfg, rngs=nnx.Rngs(5))
    untrained = _flat(nnx.state(fresh))
    (tmp_path / "test").mkdir()  # run() makes the workdir before any mode
    summary = score_model(str(tmp_path / "test"), fresh, tok, task, None)
    reference, _ = score_test_split(out["rollout"], out["state"].params, task)
  finally:
    gin.clear_config()
  for got, want, init in zip(_flat(nnx.state(fresh)), _flat(out["state"].params), untrained):
    np.testing.assert_array_equal(got, want)
  assert any(not np.array_equal(a, b) for a, b in zip(untrained, _flat(out["state"].params)))
  assert summary["test"]["final"] == reference and 0 < reference["avg2"] < 1
  written = json.loads((tmp_path / "test" / "test_eval.json").read_text())
  assert written["final"] == reference and len(written["per_problem"]) == 4
  assert load_trained(str(tmp_path / "run" / "checkpoints"), fresh, None).endswith(
      "checkpoints/2")
  from evotrainer.config import ConfigError
  with pytest.raises(ConfigError, match="no model export and no complete checkpoint"):
    load_trained(str(tmp_path / "test"), fresh, None)


class ScriptedValidation(DigitShareTask):
  """DigitShareTask whose validation rows score by a script, one value per evaluation
  (its sampled call: problems x k rows; the greedy call reuses the value), so which
  evaluation is best is known by hand."""

  def __init__(self, task, script, k):
    super().__init__(task)
    self.script, self.k = list(script), k
    self.valid = {p.id for p in task.heldout_problems(split="validation")}
    self.value = None

  def score_many(self, problems, texts):
    if problems[0].id not in self.valid:
      return super().score_many(problems, texts)
    if len(problems) % self.k == 0 and len(problems) > len({p.id for p in problems}):
      self.value = self.script.pop(0)
    return [{"correct": self.value, "format": 0.0} for _ in texts]


def _run_keep_best(setup, task, workdir, steps):
  _, tok, cfg = setup
  from evotrainer.learner.step import Learner
  return train(str(workdir), task, Transformer(cfg, rngs=nnx.Rngs(0)), tok, seed=3,
               steps=steps, prompts_per_step=4, group_size=4, eval_every=2,
               checkpoint_every=2, max_to_keep=None, progress=False, keep_best=True,
               eval_config=EvalConfig(num_problems=4, k=2, batch_rows=8, max_new_tokens=6),
               learner_factory=lambda m, mesh, **kw: Learner(m, mesh, learning_rate=3e-3, **kw))


def _flat(params):
  return [np.asarray(v[...]) for _, v in nnx.to_flat_state(params)]


@pytest.mark.slow
def test_keep_best_ends_on_the_best_validated_state_across_a_resume(setup, tmp_path):
  from evotrainer.checkpoint import Checkpoints
  # evaluations at steps 0, 2, 4 (the first run's last), then 6 after the resume
  task = ScriptedValidation(setup[0].task, [0.125, 0.5, 0.875, 0.25], k=2)
  first = _run_keep_best(setup, task, tmp_path, steps=4)
  assert first["final_step"] == 4 and first["final"]["avg2"] == 0.875
  out = _run_keep_best(setup, task, tmp_path, steps=6)  # resumes at step 4
  assert task.script == []  # every scripted evaluation ran, none twice
  assert out["steps"] == 6 and out["final_step"] == 4
  assert out["final"]["avg2"] == 0.875 and out["final"]["greedy"] == 0.875
  ckpts = Checkpoints(tmp_path / "checkpoints", max_to_keep=None)
  target = {"state": out["state"]}
  at4, _ = ckpts.restore(4, target)
  at6, meta6 = ckpts.restore(6, target)
  assert meta6["final_step"] == 4 and meta6["best"] == {"step": 4, "score": 0.875}
  for ours, four, six in zip(_flat(out["state"].params), _flat(at4["state"].params),
                             _flat(at6["state"].params)):
    np.testing.assert_array_equal(ours, four)  # the state of step 4 ...
    np.testing.assert_array_equal(six, four)   # ... is what the final checkpoint holds
  last = _run(setup, tmp_path / "plain", steps=6)  # the same run without keep_best
  assert any(not np.array_equal(a, b) for a, b in
             zip(_flat(last["state"].params), _flat(out["state"].params)))


class PoolTask(DigitShareTask):
  """DigitShareTask over 8 fixed training problems drawn with replacement (as SWE's tasks
  are); every other one scores 0 on every row, so its groups are dead."""

  def __init__(self, task):
    super().__init__(task)
    self.pool = task.train_problems(8, seed=0)
    self.dead = {p.id for p in self.pool[::2]}

  def train_problems(self, n, seed):
    rng = random.Random(seed)
    return [rng.choice(self.pool) for _ in range(n)]

  def score_many(self, problems, texts):
    return [{"correct": 0.0, "format": 0.0} if p.id in self.dead else s
            for p, s in zip(problems, super().score_many(problems, texts))]


def _run_curriculum(setup, workdir, steps):
  """The run's harness, after training."""
  from evotrainer.harness.curriculum import LiveGroupCurriculum
  from evotrainer.harness.pipeline import Harness
  from evotrainer.learner.step import Learner
  task, tok, cfg = setup
  harness = Harness(curriculum=LiveGroupCurriculum(pool=4.0, memory=1.0))
  train(str(workdir), PoolTask(task.task), Transformer(cfg, rngs=nnx.Rngs(0)), tok, seed=3,
        steps=steps, prompts_per_step=4, group_size=4, eval_every=100, checkpoint_every=1,
        progress=False,
        harness=harness,
        eval_config=EvalConfig(num_problems=4, k=2, batch_rows=8, max_new_tokens=6),
        learner_factory=lambda m, mesh, **kw: Learner(m, mesh, learning_rate=3e-3, **kw))
  return harness


@pytest.mark.slow
def test_the_curriculum_picks_the_prompts_and_resumes_exactly(setup, tmp_path):
  """Each step's 4 prompts are 4 distinct problems of the 8 (the curriculum's pick from
  16 candidates; a plain draw of 4 with replacement repeats one in 59% of steps), the
  counts hold every step's 4 groups once, and a resumed run draws what an uninterrupted
  one draws."""
  full = _run_curriculum(setup, tmp_path / "full", steps=5)
  _run_curriculum(setup, tmp_path / "cut", steps=2)
  _run_curriculum(setup, tmp_path / "cut", steps=5)
  ids = {}
  for name in ("full", "cut"):
    eps = RolloutStore(tmp_path / name / "rollouts").read(split="train")
    ids[name] = {s: [e.task_id for e in eps if e.step == s][::4] for s in range(1, 6)}
  assert ids["full"] == ids["cut"]
  assert all(len(set(v)) == 4 for v in ids["full"].values()), ids["full"]
  counts = full.state()["curriculum/live_groups"]["counts"]
  assert sum(seen for seen, _ in counts.values()) == 5 * 4
  pool = PoolTask(setup[0].task)
  assert all(live == 0 for pid, (_, live) in counts.items() if pid in pool.dead)
  a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "cut")
  for step in (3, 4, 5):
    assert a[step]["learner/loss"] == pytest.approx(b[step]["learner/loss"], rel=1e-5,
                                                    abs=1e-7)


class _HashFilter:
  """Passes a group when its problem id hashes to 1..3 mod 4 (about 3 in 4 groups), so
  dynamic sampling runs further rounds of fewer groups."""
  name = "hash_filter"

  def __call__(self, groups):
    import zlib
    return np.array([zlib.crc32(g[0].task_id.encode()) % 4 != 0 for g in groups])


@pytest.mark.slow
def test_dynamic_sampling_compiles_one_sampler_and_one_learner_program(setup, tmp_path):
  from evotrainer.harness.filters import DynamicSampling
  from evotrainer.harness.pipeline import Harness
  from evotrainer.learner.step import Learner
  task, tok, cfg = setup
  learners = []

  def factory(m, mesh, **kw):
    learners.append(Learner(m, mesh, learning_rate=3e-3, **kw))
    return learners[-1]

  out = train(str(tmp_path), task, Transformer(cfg, rngs=nnx.Rngs(0)), tok, seed=3, steps=6,
              prompts_per_step=4, group_size=4, eval_every=100, checkpoint_every=100,
              progress=False, store_rollouts=False,
              harness=Harness(group_filters=[_HashFilter()],
                              dynamic_sampling=DynamicSampling(oversample=1.5, max_rounds=3)),
              eval_config=EvalConfig(num_problems=4, k=2, batch_rows=8, max_new_tokens=6),
              learner_factory=factory)
  rounds = [m["rounds"] for m in _metrics(tmp_path).values()]
  assert max(rounds) >= 2, rounds  # later rounds asked for fewer groups than the first
  # one program for every training round, and the evaluation's sampled and greedy ones
  assert out["rollout"].sampler.compiled_programs() == 3
  assert learners[0].compiled_programs() == 1


def test_bad_train_arguments(setup, tmp_path):
  task, tok, cfg = setup
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  from evotrainer.harness.pipeline import Harness
  with pytest.raises(ValueError, match="estimator"):
    train(str(tmp_path), task, model, tok, harness=Harness(estimator="nope"))
  with pytest.raises(ValueError, match="group_size"):
    train(str(tmp_path), task, model, tok, group_size=1)


@pytest.mark.slow
def test_launch_train_end_to_end(tmp_path, launch_caches):
  workdir = tmp_path / "run"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math_train.gin",
       "--gin_file=gin/tiny.gin", f"--workdir={workdir}",
       *(f"--gin_bindings={b}" for b in launch_caches)],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["mode"] == "train" and summary["steps"] == 2 and summary["wall_s"] > 0
  for phase in ("initial", "final"):
    assert set(summary[phase]) >= {"avg2", "pass2", "greedy"}
    assert 0.0 <= summary[phase]["avg2"] <= summary[phase]["pass2"] <= 1.0
  assert (workdir / "operative_config.gin").read_text().count("train.steps = 2") == 1
  assert sorted(os.listdir(workdir / "checkpoints"))[-1] == "2"
  # `test` mode re-scores the trained run from its operative config and checkpoint, as a
  # user would, on twice the test problems: the first 8 are the run's own, with the same
  # keys, so their scores are the ones the run reported (0 for this tiny policy: the
  # values are checked in test_test_mode_scores_a_trained_run_as_the_run_scored_itself);
  # the 8 after them are new.
  rescored = tmp_path / "rescored"
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch",
       f"--gin_file={workdir / 'operative_config.gin'}", f"--workdir={rescored}",
       "--gin_bindings=run.mode = 'test'", f"--gin_bindings=test.model = '{workdir}'",
       "--gin_bindings=EvalConfig.num_test = 16"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert f"model from {workdir}/checkpoints/2" in proc.stdout
  scores = json.loads((rescored / "test_eval.json").read_text())["per_problem"]
  own = summary["test"]["per_problem"]
  assert len(own) == 8 and len(scores) == 16
  assert {k: scores[k] for k in own} == own
  # A model that is not there is a config error, before anything is scored.
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch",
       f"--gin_file={workdir / 'operative_config.gin'}", f"--workdir={tmp_path / 'none'}",
       "--gin_bindings=run.mode = 'test'", f"--gin_bindings=test.model = '{tmp_path}/nope'"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 2 and "error (config): test.model=" in proc.stderr


def test_bad_gin_binding_is_a_clear_error(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin",
       "--gin_bindings=train.stepz = 3", f"--workdir={tmp_path}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert "train.stepz = 3" in proc.stderr and "stepz" in proc.stderr
  assert not (tmp_path / "summary.json").exists()


@pytest.mark.slow
def test_evolve_mode_end_to_end(tmp_path, launch_caches):
  """The controller trains a root, a branch, the generation's control branch and its
  continuation in child processes (branch mode), from the parent's state, and records
  them in the ledger and summary.json."""
  workdir = tmp_path / "evo"

  def evolve(generations, rc=0):  # 1 branch of 2 steps per generation, tiny budgets
    proc = subprocess.run(
        [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin",
         "--gin_file=gin/tiny.gin", f"--workdir={workdir}",
         f"--gin_bindings=evolve.generations = {generations}",
         "--gin_bindings=evolve.branches = 1", "--gin_bindings=evolve.branch_steps = 2",
         "--gin_bindings=evolve.continue_steps = 1",
         "--gin_bindings=evolve.continue_keeps_best = True",
         *(f"--gin_bindings={b}" for b in launch_caches)],
        cwd=REPO, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=1200)
    assert proc.returncode == rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc

  evolve(1)
  summary = json.loads((workdir / "summary.json").read_text())
  versions = {v["id"]: v for v in summary["versions"]}
  assert set(versions) == {"v0", "v1.0", "v1.c", "v1.x"}
  # The continuation trained the verified incumbent further, 1 step, unchanged.
  cont = versions["v1.x"]
  assert cont["parent"] in ("v0", "v1.0", "v1.c") and cont["intervention"].startswith(
      "continuation")
  assert cont["parent"] == "v0" or versions[cont["parent"]]["status"] == "kept"
  assert cont["steps"] == 1 and cont["status"] in ("kept", "rejected") and cont["reason"]
  # the continuation keeps its best validated state (train.keep_best in its child)
  assert (workdir / "versions" / "v1.x" / "best" / "1").is_dir()
  assert summary["mode"] == "evolve"
  assert summary["incumbent"] == ("v1.x" if cont["status"] == "kept" else cont["parent"])
  assert versions["v1.0"]["parent"] == versions["v1.c"]["parent"] == "v0"
  assert versions["v1.0"]["status"] in ("kept", "rejected") and versions["v1.0"]["reason"]
  assert versions["v1.c"]["status"] in ("kept", "pruned")
  assert versions["v1.c"]["intervention"].startswith("control")
  # The control trained from the parent's state under the parent's bindings, and the
  # branch was compared with it on the same problems.
  control = json.loads((workdir / "versions" / "v1.c" / "branch_result.json").read_text())
  assert set(control["per_problem"]) == set(
      json.loads((workdir / "versions" / "v1.0" / "branch_result.json").read_text())
      ["per_problem"])
  branch = json.loads((workdir / "versions" / "v1.0" / "branch_result.json").read_text())
  assert branch["checkpoint"].endswith("model") and branch["per_problem"]
  # The training series the stability gate reads, one value per RL step (2 steps).
  assert {k: len(v) for k, v in branch["series"].items()} == {
      k: 2 for k in ("correct", "reward", "entropy", "length", "truncated", "clip_frac")}
  assert all(v is not None for v in branch["series"]["entropy"])
  # Every version is scored greedily on the 128 shipped canaries, and the canary gate
  # judged the branch against its parent (paired per canary).
  assert branch["final"]["canary_n"] == 128 and len(branch["canary"]) == 128
  assert branch["final"]["canary_accuracy"] == pytest.approx(
      sum(branch["canary"].values()) / 128)
  assert versions["v1.0"]["validators"]["canary_prompts"] in ("pass", "fail")
  log = (workdir / "versions" / "v1.0" / "branch.log").read_text()
  assert "starting from the parent's state" in log
  # The main job's path at a new user's default device count (XLA_FLAGS cleared: no fake
  # devices), not the 8 fake devices of the test process.
  assert "devices=1 " in log
  report = (workdir / "report.html").read_text()
  assert "v1.0" in report and "<svg" in report
  # The test split: scored beside each branch result (never in it), joined to the
  # summary with the selection gap, and disjoint from validation and training problems.
  test = json.loads((workdir / "versions" / "v1.0" / "test_eval.json").read_text())
  assert len(test["per_problem"]) == 8 and "avg8" not in branch.get("test", {})
  assert not set(test["per_problem"]) & set(branch["per_problem"])
  trained = {e.task_id for e in RolloutStore(workdir / "versions" / "v1.0" / "rollouts")
             .read(version="v1.0", split="train")}
  assert trained and not set(test["per_problem"]) & trained
  # k = 2 under tiny.gin: the figure is the mean per-problem score (= avg2).
  assert versions["v1.0"]["test_avg8"] == pytest.approx(test["final"]["avg2"])
  assert "validation_avg8" in versions["v0"] and summary["split_reported"] == "test"
  # A harness-side intervention was replayed on v0's stored rollouts before training.
  with Ledger(workdir / "ledger.sqlite") as ledger:
    decision = next(d for d in ledger.decisions() if d.version_id == "v1.0")
  if decision.intervention["binding"].startswith(("RewardComposer.", "Harness.")):
    assert decision.backtest["groups"] > 0 and decision.backtest["passed"]

  # Bad input: the incumbent's checkpoint is corrupted (a byte flipped in its largest
  # array file). A relaunch for one more generation cannot train its branch: an
  # infrastructure failure (retried once), not a rejection; with no branch trained the
  # run stops with exit code 2 and the cause, the branch stays untried, and every earlier
  # record is left as it was.
  def records():
    with Ledger(workdir / "ledger.sqlite") as ledger:
      return [(v.id, v.parent, v.status, v.reason, v.checkpoint) for v in ledger.versions()]
  before = records()
  model = workdir / "versions" / summary["incumbent"] / "model"
  victim = max((f for f in model.rglob("*") if f.is_file() and f.parent.name == "d"),
               key=lambda f: f.stat().st_size)
  data = bytearray(victim.read_bytes())
  data[len(data) // 2] ^= 0x10
  victim.write_bytes(bytes(data))
  proc = evolve(2, rc=2)
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error (infrastructure): no branch of generation 2 could train")
  assert "missing or corrupt checkpoint" in last
  after = records()
  assert after[:len(before)] == before
  (v2,) = [r for r in after if r[0] == "v2.0"]
  assert v2[1] == summary["incumbent"] and v2[2] == "running"  # untried, not evidence
  assert "v2.c" not in [r[0] for r in after]  # no control trained for nothing
  with Ledger(workdir / "ledger.sqlite") as ledger:
    failures = ledger.meta_items("controller/infra/")["controller/infra/v2.0"]
    assert ledger.decisions(version="v2.0")[0].outcome is None
  assert [f["kind"] for f in failures] == ["missing or corrupt checkpoint"] * 2
  assert "checksum" in failures[0]["message"], failures[0]
