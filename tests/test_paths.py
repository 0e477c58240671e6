"""The workdir path layer: local paths unchanged, gs:// through epath (a local stand-in for
GCS, tests/fake_gcs.py), and the rollout store and checkpoints on top of it."""

import json
import os
import pathlib

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer import checkpoint as ck
from evotrainer import paths
from evotrainer.evolution.ledger import Ledger
from evotrainer.model import ModelConfig, Transformer
from evotrainer.rollouts import CorruptRolloutError, RolloutExistsError, RolloutStore
from tests.fake_gcs import fake_gcs
from tests.rollouts.test_store import assert_same, make_episodes
from tests.test_train import _metrics, _run, setup  # noqa: F401  (setup: a fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=8)


@pytest.fixture
def gcs(tmp_path, monkeypatch):
  """A fake bucket root; the cwd is an empty directory (no `gs:` may appear in it) and
  mirrors go under tmp_path."""
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  gin.clear_config()
  gin.bind_parameter("workdir_mirror.directory", None)
  monkeypatch.setattr(paths, "DEFAULT_MIRROR_ROOT", str(tmp_path / "mirrors"))
  with fake_gcs(tmp_path / "bucket-root") as root:
    yield root
  assert os.listdir(cwd) == [], "a local directory was created for a URL"
  gin.clear_config()


def test_scheme_and_local_paths_unchanged(tmp_path):
  assert paths.scheme("gs://b/run") == "gs" and paths.scheme("/a/gs://x") is None
  assert not paths.is_remote("runs/x") and paths.is_remote("gs://b/x")
  assert isinstance(paths.as_path(tmp_path / "a"), pathlib.Path)
  assert type(paths.as_path("runs/a")) is type(pathlib.Path("runs/a"))
  assert paths.resolve("runs/a") == os.path.abspath("runs/a")
  assert paths.resolve("~/x") == os.path.expanduser("~/x")
  assert paths.mirror_dir(tmp_path / "w") == tmp_path / "w"  # a local workdir is its own
  with pytest.raises(paths.RemotePathError, match=r"memory:// is not supported.*gs://"):
    paths.check("memory://x/run")
  paths.write_atomic(tmp_path / "f.json", '{"a": 1}')
  paths.write_atomic(tmp_path / "f.json", b'{"a": 2}')
  assert json.loads((tmp_path / "f.json").read_text()) == {"a": 2}
  assert sorted(os.listdir(tmp_path)) == ["f.json"]  # no temporary left behind


def test_gs_paths_land_in_the_bucket(gcs):
  assert paths.resolve("gs://b/run") == "gs://b/run"
  paths.makedirs("gs://b/run")  # nothing to create on an object store
  paths.write_atomic("gs://b/run/summary.json", json.dumps({"x": 1}))
  assert json.loads((gcs / "b/run/summary.json").read_text()) == {"x": 1}
  assert paths.as_path("gs://b/run/summary.json").read_text() == '{"x": 1}'


def test_mirror_uploads_changes_and_fetches_on_restart(gcs, tmp_path):
  mirror = paths.Mirror("gs://b/run")
  assert mirror.dir.parent == tmp_path / "mirrors"
  log = mirror.local("metrics.jsonl")
  log.write_text('{"step": 1}\n')
  (mirror.local("tensorboard")).mkdir()
  (mirror.local("tensorboard") / "events.1").write_bytes(b"\x00\x01")
  mirror.push("metrics.jsonl", "tensorboard")
  assert (gcs / "b/run/metrics.jsonl").read_text() == '{"step": 1}\n'
  assert (gcs / "b/run/tensorboard/events.1").read_bytes() == b"\x00\x01"
  with open(log, "a") as f:
    f.write('{"step": 2}\n')
  mirror.sync_every_s = 3600.0
  mirror.push("metrics.jsonl", throttle=True)  # within the interval: not yet
  assert (gcs / "b/run/metrics.jsonl").read_text() == '{"step": 1}\n'
  mirror.push("metrics.jsonl")
  assert (gcs / "b/run/metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
  # Another host (an empty mirror) starts from the workdir's copy; a copy the workdir no
  # longer has is dropped rather than appended to.
  gin.bind_parameter("workdir_mirror.directory", str(tmp_path / "host2"))
  other = paths.Mirror("gs://b/run")
  assert other.dir == tmp_path / "host2"
  assert other.fetch("metrics.jsonl")
  assert other.local("metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
  other.local("findings.jsonl").write_text("stale\n")
  assert not other.fetch("findings.jsonl")
  assert not other.local("findings.jsonl").exists()


def test_rollout_store_on_gs(gcs):
  store = RolloutStore("gs://b/run/rollouts")
  eps = make_episodes(step=3)
  path = store.write("v0", 3, "train", eps, meta={"k": 1})
  assert str(path) == "gs://b/run/rollouts/v0/train/step-00000003.parquet"
  assert (gcs / "b/run/rollouts/v0/train/step-00000003.parquet").is_file()
  assert store.exists("v0", 3, "train") and store.steps("v0", "train") == [3]
  assert store.versions() == ["v0"] and store.splits("v0") == ["train"]
  assert [e.episode_id for e in store.read(version="v0")] == [e.episode_id for e in eps]
  got = store.read(version="v0")
  assert len(got) == len(eps)
  for g, w in zip(got, eps):
    assert_same(g, w)
  assert store.step_metadata("v0", 3, "train").meta == {"k": 1}
  with pytest.raises(RolloutExistsError):
    store.write("v0", 3, "train", eps)
  # A damaged file is moved to the quarantine (never deleted) with its reason.
  f = gcs / "b/run/rollouts/v0/train/step-00000003.parquet"
  f.write_bytes(f.read_bytes()[:-40])
  with pytest.raises(CorruptRolloutError):
    store.read_step("v0", 3, "train")
  q = gcs / "b/run/rollouts/_quarantine/v0/train"
  assert sorted(os.listdir(q)) == ["step-00000003.parquet", "step-00000003.parquet.reason.json"]
  assert not store.exists("v0", 3, "train")


def test_checkpoints_and_model_export_on_gs(gcs):
  model = Transformer(CFG, rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  with ck.Checkpoints("gs://b/run/checkpoints", max_to_keep=2) as ckpts:
    assert ckpts.directory == "gs://b/run/checkpoints"
    for step in (1, 2, 3):
      moved = jax.tree.map(lambda x, s=step: x + s, params)
      assert ckpts.save(step, {"params": moved}, {"step": step}).startswith("gs://b/run/")
    assert ckpts.all_steps() == [2, 3]
    restored, meta = ckpts.restore(None, {"params": params})
  assert meta == {"step": 3}
  for a, b in zip(jax.tree.leaves(restored["params"]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b) + 3)
  assert sorted(d for d in os.listdir(gcs / "b/run/checkpoints") if d.isdigit()) == ["2", "3"]
  assert (gcs / "b/run/checkpoints/3/commit_success.txt").is_file()
  ck.save_model("gs://b/run/model", model)
  other = nnx.clone(model)
  nnx.update(other, jax.tree.map(jnp.zeros_like, params))
  ck.restore_params_into("gs://b/run/model", other)
  for a, b in zip(jax.tree.leaves(nnx.state(other, nnx.Param)), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ck.CheckpointError, match="no model checkpoint at gs://b/none"):
    ck.restore_params_into("gs://b/none", other)


def test_operative_config_fingerprint_and_lock_of_a_gs_workdir(gcs, tmp_path):
  from evotrainer import config as config_lib
  from evotrainer import workdir as workdir_lib
  assert config_lib.write_operative_config("gs://b/run") == "gs://b/run/operative_config.gin"
  assert (gcs / "b/run/operative_config.gin").is_file()
  assert workdir_lib.check_fingerprint("gs://b/run", config={"a": "1"}) is None
  assert json.loads((gcs / "b/run/run_fingerprint.json").read_text())["config"] == {"a": "1"}
  with pytest.raises(workdir_lib.FingerprintMismatch, match="a: 1 -> 2"):
    workdir_lib.check_fingerprint("gs://b/run", config={"a": "2"})
  assert workdir_lib.check_fingerprint("gs://b/run", config={"a": "2"},
                                       new_segment=True) == ["a: 1 -> 2"]
  workdir_lib.check_fingerprint("gs://b/run", config={"a": "3"}, new_segment=True)
  segments = (gcs / "b/run/segments.jsonl").read_text().splitlines()
  assert [json.loads(s)["changes"] for s in segments] == [["a: 1 -> 2"], ["a: 2 -> 3"]]
  workdir_lib.check_built("gs://b/run", tokenizer="t1", model={"d": 1})
  (gcs / "b/run/checkpoints/1").mkdir(parents=True)
  (gcs / "b/run/checkpoints/1/x").write_text("w")
  with pytest.raises(workdir_lib.FingerprintMismatch, match="trained with another tokenizer"):
    workdir_lib.check_built("gs://b/run", tokenizer="t2", model={"d": 1})
  # No flock on an object store: the lock lies in the workdir's local mirror.
  with workdir_lib.WorkdirLock("gs://b/run") as lock:
    assert lock.path == paths.mirror_dir("gs://b/run") / workdir_lib.LOCK_NAME
    assert lock.path.is_relative_to(tmp_path / "mirrors")
    assert workdir_lib.holder("gs://b/run")["pid"] == os.getpid()
    rc, out = _lock_from_another_process("gs://b/run", tmp_path)
    assert rc == 3 and "workdir gs://b/run is in use by pid" in out, out
  assert not (gcs / "b/run" / workdir_lib.LOCK_NAME).exists()


def _lock_from_another_process(workdir, tmp_path) -> tuple[int, str]:
  """(exit code, output) of WorkdirLock.acquire in a child process (3: refused)."""
  import subprocess
  import sys
  code = (f"import sys; sys.path.insert(0, {REPO!r}); from evotrainer import paths, workdir\n"
          f"paths.DEFAULT_MIRROR_ROOT = {str(tmp_path / 'mirrors')!r}\n"
          f"try:\n  workdir.WorkdirLock({workdir!r}).acquire()\n"
          f"except workdir.WorkdirLocked as e:\n  print(e); sys.exit(3)\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120)
  return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_train_into_a_gs_workdir_and_resume_on_another_host(setup, gcs, tmp_path, capsys):
  """Checkpoints, metrics, TensorBoard files and rollouts land in the bucket; a second host
  (an empty mirror) resumes from the bucket alone. (That a resume continues exactly as an
  uninterrupted run is tests/test_train.py's test, on the same code path.)"""
  _run(setup, "gs://b/run", steps=1)
  run = gcs / "b/run"
  assert sorted(os.listdir(run / "checkpoints")) == ["1"]
  assert os.listdir(run / "rollouts/v0/train") == ["step-00000001.parquet"]
  assert sorted(os.listdir(run / "rollouts/v0/heldout")) == [
      "step-00000000.parquet", "step-00000001.parquet"]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(run / "tensorboard"))
  assert sorted(_metrics(run)) == [1]
  first = _metrics(run)[1]
  gin.bind_parameter("workdir_mirror.directory", str(tmp_path / "host2"))
  capsys.readouterr()
  out = _run(setup, "gs://b/run", steps=2)
  assert "[train] resumed from step 1 (gs://b/run/checkpoints)" in capsys.readouterr().out
  assert out["steps"] == 2 and [h["step"] for h in out["history"]] == [1, 2]
  assert sorted(os.listdir(run / "checkpoints")) == ["1", "2"]
  assert sorted(_metrics(run)) == [1, 2]  # nothing logged twice after the resume
  assert _metrics(run)[1] == first
  assert (tmp_path / "host2" / "metrics.jsonl").read_text() == \
      (run / "metrics.jsonl").read_text()


def _launch(args, cwd, bucket, timeout=300):
  """`python -m evotrainer.launch` on math.gin + tiny.gin + `args`, its gs:// in `bucket`
  (tests/fake_gcs_launch.py)."""
  import subprocess
  import sys
  return subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", f"--gin_file={REPO}/gin/math.gin",
       f"--gin_file={REPO}/gin/tiny.gin", "--import=tests.fake_gcs_launch", *args],
      cwd=cwd, env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "",
                    "EVO_FAKE_GCS_ROOT": str(bucket)},
      capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,message", [
    (["run.mode = 'branch'"], "run.mode='branch' needs a local --workdir"),
    (["run.mode = 'evolve'", "evolve.human_gated = True"],
     "evolve.human_gated = True needs a local --workdir"),
    (["run.mode = 'sweep'", "--resume_from=gs://b/old"],
     "--resume_from=gs://b/old: the workdir to start from must be local"),
    (["--workdir=memory://b/run"], "the scheme memory:// is not supported for a workdir"),
])
def test_launch_refuses_what_a_remote_workdir_cannot_do(tmp_path, args, message):
  """Refused before anything is built or written, and no local `gs:` directory appears."""
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  flags = [a if a.startswith("--") else f"--gin_bindings={a}" for a in args]
  proc = _launch(["--workdir=gs://b/run", *flags], cwd, tmp_path / "bucket")
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert f"error (config): " in proc.stderr and message in proc.stderr, proc.stderr
  assert os.listdir(cwd) == [] and not os.listdir(tmp_path / "bucket")


@pytest.mark.slow
def test_evolve_into_a_gs_workdir_and_resume_on_another_host(tmp_path, launch_caches):
  """`run.mode='evolve'` into gs:// through the launcher: the controller works in host 1's
  mirror and the bucket gets the ledger, summary, report, skills and the root's model;
  host 2 (an empty mirror) continues the run from the bucket alone for one generation,
  its branch started from the root's fetched model. (0 RL steps per branch: what is
  tested here is where files go, not training.)"""
  from tests.sharding.spawn import TINY_RL_BINDINGS
  bucket, run = tmp_path / "bucket", tmp_path / "bucket/b/evo"
  cwd = tmp_path / "cwd"
  cwd.mkdir()

  def evolve(host, generations):  # 1 branch of 0 RL steps (evaluated, saved), no control
    bindings = [f"evolve.generations = {generations}", "evolve.branches = 1",
                "evolve.branch_steps = 0", "evolve.control = False", *TINY_RL_BINDINGS,
                "MathTask.canary_file = None",
                *launch_caches, f"workdir_mirror.directory = '{tmp_path / host}'"]
    proc = _launch(["--workdir=gs://b/evo", *(f"--gin_bindings={b}" for b in bindings)],
                   cwd, bucket, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

  def ledger_copy():  # the bucket's ledger, read from a copy (opening it writes a WAL)
    copy = tmp_path / f"ledger-{len(os.listdir(tmp_path))}.sqlite"
    copy.write_bytes((run / "ledger.sqlite").read_bytes())
    return Ledger(copy)

  evolve("host1", 0)  # the root only
  assert [v["id"] for v in json.loads((run / "summary.json").read_text())["versions"]] == \
      ["v0"]
  assert (run / "report.html").is_file() and os.listdir(run / "skills")
  assert (run / "versions/v0/branch_result.json").is_file()
  assert os.listdir(run / "versions/v0/model")  # the checkpoint the next branch reads
  with ledger_copy() as ledger:
    assert ledger._q("SELECT checkpoint FROM versions")[0][0] == "versions/v0/model"  # noqa
  evolve("host2", 1)
  summary = json.loads((run / "summary.json").read_text())
  assert [(v["id"], v["parent"]) for v in summary["versions"]] == [("v0", None),
                                                                  ("v1.0", "v0")]
  assert summary["generations"] == 1 and summary["wall_s"] > 0
  assert (run / "versions/v1.0/model").is_dir()
  log = (run / "versions/v1.0/branch.log").read_text()
  # The branch restored the root's model from host 2's mirror, fetched from the bucket.
  assert f'branch.parent = "{tmp_path / "host2/versions/v0/model"}"' in log, log[-3000:]
  assert os.listdir(tmp_path / "host2/versions/v0/model")
  with ledger_copy() as ledger:
    assert ledger.version("v1.0").status in ("kept", "rejected")
    assert ledger.get_meta("controller/generation") == 1
  assert not os.listdir(cwd)  # nothing local for the URL


def test_metric_writer_on_gs_truncates_and_uploads(gcs, tmp_path):
  from evotrainer.metric_writer import MetricWriter
  from evotrainer.types import Finding
  gin.bind_parameter("workdir_mirror.sync_every_s", 3600.0)
  writer = MetricWriter("gs://b/run")
  for step in (1, 2, 3):
    writer.write(step, {"reward": float(step), "nan": float("nan")})
    writer.write_findings(step, [Finding(kind="k", layer="score", severity=0.5, value=1.0,
                                         threshold=0.5, message=f"m{step}")])
  assert not (gcs / "b/run/metrics.jsonl").exists()  # throttled: nothing uploaded yet
  writer.sync()
  rows = [json.loads(l) for l in (gcs / "b/run/metrics.jsonl").read_text().splitlines()]
  assert rows == [{"step": s, "reward": float(s), "nan": None} for s in (1, 2, 3)]
  writer.truncate_after(2)  # a resume from step 2: uploaded at once
  assert [json.loads(l)["step"] for l in
          (gcs / "b/run/metrics.jsonl").read_text().splitlines()] == [1, 2]
  assert [json.loads(l)["message"] for l in
          (gcs / "b/run/findings.jsonl").read_text().splitlines()] == ["m1", "m2"]
  assert any(f.startswith("events.out") for f in os.listdir(gcs / "b/run/tensorboard"))
