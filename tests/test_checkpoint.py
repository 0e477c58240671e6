"""Checkpoints: round trips, sharded restores, retention, atomicity and corruption."""

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from evotrainer import checkpoint as ck
from evotrainer.model import ModelConfig, Transformer
from evotrainer.sharding.mesh import make_mesh, opt_state_shardings, state_shardings
from evotrainer.sharding.rules import LEARNER_RULES
from tests.tiny_models import small_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every sharded axis divides the (2, 2, 2) mesh.
CFG = small_config(qk_norm=True)


def trained_state(cfg=CFG, seed=0):
  """Params (nnx.State) and an adamw state after one update (so mu, nu are not zero)."""
  params = nnx.state(Transformer(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
  tx = optax.adamw(1e-3)
  opt_state = tx.init(params)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  _, opt_state = tx.update(grads, opt_state, params)
  return tx, params, opt_state


def assert_trees_equal(a, b):
  la, lb = jax.tree.leaves(ck._to_pure(a)), jax.tree.leaves(ck._to_pure(b))
  assert len(la) == len(lb) and la
  for x, y in zip(la, lb):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def data_files(step_dir):
  """Array data files of a step, largest first."""
  files = glob.glob(os.path.join(step_dir, "**", "d", "*"), recursive=True)
  return sorted(files, key=os.path.getsize, reverse=True)


@pytest.mark.slow
def test_round_trip_params_opt_state_and_metadata(tmp_path):
  tx, params, opt_state = trained_state()
  key = jax.random.key(7)
  meta = {"data_position": 1234, "rng": ck.key_to_json(key), "metrics": {"loss": 0.25},
          "np_scalar": np.float32(1.5), "tags": ["a", "b"]}
  ckpts = ck.Checkpoints(tmp_path / "run")
  path = ckpts.save(10, {"params": params, "opt_state": opt_state}, meta)
  assert path == str(tmp_path / "run" / "10")
  assert ckpts.all_steps() == [10] and ckpts.latest_step() == 10

  state, got = ckpts.restore(target={"params": params, "opt_state": opt_state})
  assert isinstance(state["params"], nnx.State)
  assert jax.tree.structure(state["opt_state"]) == jax.tree.structure(opt_state)
  assert_trees_equal(state["params"], params)
  assert_trees_equal(state["opt_state"], opt_state)
  assert got == {"data_position": 1234, "rng": ck.key_to_json(key), "metrics": {"loss": 0.25},
                 "np_scalar": 1.5, "tags": ["a", "b"]}
  np.testing.assert_array_equal(jax.random.key_data(ck.key_from_json(got["rng"])),
                                jax.random.key_data(key))
  assert ckpts.metadata() == got

  # A subset, and everything as saved (no target).
  only, _ = ckpts.restore(10, target={"params": params})
  assert list(only) == ["params"]
  raw, _ = ckpts.restore(10)
  assert sorted(raw) == ["opt_state", "params"]
  assert_trees_equal(raw["params"], params)
  ckpts.close()

  # The one-shot helpers write the same layout.
  ck.save(tmp_path / "one", 3, params, opt_state, extra={"x": 1})
  state, got = ck.restore(tmp_path / "one", {"params": params, "opt_state": opt_state})
  assert got == {"x": 1}
  assert_trees_equal(state["opt_state"], opt_state)


@pytest.mark.slow
def test_restore_onto_mesh_is_sharded_and_equal(tmp_path, devices):
  tx, params, opt_state = trained_state()
  ck.save(tmp_path, 1, params, opt_state)  # written from one device

  mesh = make_mesh(2, 2, 2)
  graphdef, abs_params = ck.abstract_params(CFG, mesh, LEARNER_RULES)
  param_shardings = state_shardings(abs_params, mesh, LEARNER_RULES)
  abs_opt = jax.eval_shape(tx.init, abs_params)
  abs_opt = ck.with_shardings(abs_opt, opt_state_shardings(tx, abs_opt, param_shardings, mesh))
  state, _ = ck.restore(tmp_path, {"params": abs_params, "opt_state": abs_opt})

  restored = state["params"]
  q = restored["layers"][0]["attn"]["q"][...]
  assert q.sharding.spec == P("fsdp", "tensor", None)
  assert restored["layers"][1]["mlp"]["down"][...].sharding.spec == P("tensor", "fsdp")
  assert restored["embed"][...].sharding.spec == P(None, "fsdp")
  assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (32, 2, 16)
  mu = state["opt_state"][0].mu["layers"][0]["attn"]["q"][...]
  assert mu.sharding.spec == P("fsdp", "tensor", None)
  assert_trees_equal(restored, params)
  assert_trees_equal(state["opt_state"], opt_state)
  # The restored state drives the model as before.
  tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
  model = nnx.merge(graphdef, restored)
  ref = Transformer(CFG, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(model.forward_logits(tokens), ref.forward_logits(tokens),
                             atol=1e-5)


def test_max_to_keep(tmp_path):
  _, params, _ = trained_state()
  with ck.Checkpoints(tmp_path, max_to_keep=2) as ckpts:
    for step in (1, 2, 3, 4, 5):
      ckpts.save(step, {"params": params}, {"step": step})
    assert ckpts.all_steps() == [4, 5]
    assert ckpts.metadata(4) == {"step": 4}
    with pytest.raises(ValueError, match="already saved"):
      ckpts.save(5, {"params": params})
    with pytest.raises(ck.CheckpointError, match=r"step 2 is not .*\[4, 5\]"):
      ckpts.restore(2, {"params": params})
  assert sorted(d for d in os.listdir(tmp_path) if d.isdigit()) == ["4", "5"]


def test_partial_and_tmp_directories_are_ignored(tmp_path):
  _, params, _ = trained_state()
  other = jax.tree.map(lambda x: x + 1, params)
  ckpts = ck.Checkpoints(tmp_path)
  ckpts.save(1, {"params": params}, {"step": 1})
  # What a save killed part-way leaves: Orbax's temporary directories ...
  os.makedirs(tmp_path / "2.orbax-checkpoint-tmp" / "params")
  (tmp_path / "2.orbax-checkpoint-tmp" / "params" / "junk").write_text("x")
  os.makedirs(tmp_path / "3.orbax-checkpoint-tmp-1712345678" / "params")
  reader = ck.Checkpoints(tmp_path)
  assert reader.all_steps() == [1] and reader.latest_step() == 1
  state, meta = reader.restore(target={"params": params})
  assert meta == {"step": 1}
  assert_trees_equal(state["params"], params)
  # Saving the interrupted step again replaces the leftover.
  ckpts.save(2, {"params": other}, {"step": 2})
  assert reader.latest_step() == 2
  assert not (tmp_path / "2.orbax-checkpoint-tmp").exists()
  assert_trees_equal(reader.restore(target={"params": params})[0]["params"], other)
  # A half-copied step directory (no commit_success.txt) is not a checkpoint either.
  os.makedirs(tmp_path / "3" / "params")
  assert reader.all_steps() == [1, 2]
  with pytest.raises(ck.CheckpointError, match=r"step 3 is not a complete"):
    reader.restore(3, {"params": params})
  ckpts.save(4, {"params": params}, {"step": 4})
  assert reader.latest_step() == 4


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path):
  """A process killed after writing every file of step 2 but before the rename."""
  script = textwrap.dedent(f"""
      import os
      import numpy as np
      from orbax.checkpoint._src.path import atomicity
      from evotrainer import checkpoint as ck
      ckpts = ck.Checkpoints({str(tmp_path)!r})
      ckpts.save(1, {{"params": {{"w": np.arange(6.0)}}}}, {{"step": 1}})
      async def crash(self):
        os._exit(17)
      atomicity.AtomicRenameTemporaryPath.finalize = crash
      ckpts.save(2, {{"params": {{"w": np.arange(6.0) * 2}}}}, {{"step": 2}})
      """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO, XLA_FLAGS="")
  proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 17, proc.stderr[-2000:]
  leftovers = [d for d in os.listdir(tmp_path) if d.startswith("2.")]
  assert leftovers and all(".orbax-checkpoint-tmp" in d for d in leftovers)
  ckpts = ck.Checkpoints(tmp_path)
  assert ckpts.latest_step() == 1
  state, meta = ckpts.restore(target={"params": {"w": np.zeros(6)}})  # host float64
  assert meta == {"step": 1}
  np.testing.assert_array_equal(state["params"]["w"], np.arange(6.0))


# Orbax leaves a pending read coroutine behind when TensorStore fails; harmless.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["truncate", "delete", "flip_byte", "integrity"])
def test_corrupted_checkpoint_raises(tmp_path, damage):
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.float32),
            "b": jnp.zeros((64,))}
  step_dir = ck.save(tmp_path, 1, params)
  victim = data_files(os.path.join(step_dir, "params"))[0]
  if damage == "truncate":
    with open(victim, "r+b") as f:
      f.truncate(os.path.getsize(victim) // 2)
  elif damage == "delete":
    os.remove(victim)
  elif damage == "flip_byte":  # what TensorStore alone restores silently wrong
    with open(victim, "r+b") as f:
      f.seek(os.path.getsize(victim) // 2)
      byte = f.read(1)
      f.seek(-1, 1)
      f.write(bytes([byte[0] ^ 0x10]))
  else:
    os.remove(os.path.join(step_dir, "integrity", "metadata"))
  with pytest.raises(ck.CheckpointError) as err:
    ck.restore(tmp_path, {"params": params})
  assert step_dir in str(err.value)
  if damage == "flip_byte":
    assert "checksum" in str(err.value) or "cannot read" in str(err.value)


def test_readable_but_wrong_arrays_fail_the_checksum(tmp_path):
  """Well-formed array files of another save (a botched copy) read without any error
  from TensorStore; only the checksum tells."""
  rng = np.random.default_rng(0)
  a = {"w": jnp.asarray(rng.normal(size=(16, 16)), jnp.float32)}
  b = {"w": a["w"].at[3, 4].add(1.0)}
  with ck.Checkpoints(tmp_path) as ckpts:
    ckpts.save(1, {"params": a})
    ckpts.save(2, {"params": b})
  victim = str(tmp_path / "1" / "params")
  shutil.rmtree(victim)
  shutil.copytree(str(tmp_path / "2" / "params"), victim)
  with pytest.raises(ck.CheckpointError,
                     match=r"/1: params/w fails its checksum .* corrupted"):
    ck.restore(tmp_path, {"params": a}, step=1)
  assert_trees_equal(ck.restore(tmp_path, {"params": a}, step=2)[0]["params"], b)


def test_target_mismatch_is_named(tmp_path):
  _, params, _ = trained_state()
  ck.save(tmp_path, 1, params)
  wrong = jax.tree.map(lambda x: x, params)
  wrong["embed"] = nnx.Param(jnp.zeros((7, 64)))
  with pytest.raises(ck.CheckpointError, match=r"embed has shape \(128, 64\).*\(7, 64\)"):
    ck.restore(tmp_path, {"params": wrong})
  with pytest.raises(ck.CheckpointError, match=r"no item\(s\) \['opt_state'\]"):
    ck.restore(tmp_path, {"opt_state": params})
  with pytest.raises(ck.CheckpointError, match="no complete checkpoint"):
    ck.restore(tmp_path / "empty", {"params": params})
  with pytest.raises(ValueError, match="no sharding"):
    ck.restore(tmp_path, {"params": jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)})


def test_save_validates_inputs(tmp_path):
  with ck.Checkpoints(tmp_path) as ckpts:
    with pytest.raises(ValueError, match="not JSON-serializable"):
      ckpts.save(1, {"params": {"w": np.ones(2)}}, {"f": object()})
    with pytest.raises(ValueError, match="PRNG key"):
      ckpts.save(1, {"params": {"w": np.ones(2)}}, {"key": jax.random.key(0)})
    with pytest.raises(ValueError, match="names must be identifiers"):
      ckpts.save(1, {"metadata": {"w": np.ones(2)}})
    assert ckpts.all_steps() == []


@pytest.mark.slow
def test_save_and_restore_model_bf16(tmp_path, devices):
  cfg = ModelConfig(**{**ck.config_to_json(CFG), "param_dtype": "bfloat16",
                       "dtype": "bfloat16"})
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  path = ck.save_model(tmp_path / "m", model, metadata={"trained_steps": 5})
  with open(os.path.join(path, "model_config", "metadata")) as f:
    assert json.load(f)["param_dtype"] == "bfloat16"
  assert ck.read_model_config(path) == cfg
  assert ck.read_model_metadata(path) == {"trained_steps": 5}

  back = ck.restore_model(path)
  assert back.config == cfg
  assert back.embed[...].dtype == jnp.bfloat16
  assert_trees_equal(nnx.state(back, nnx.Param), nnx.state(model, nnx.Param))

  mesh = make_mesh(2, 2, 2)
  sharded = ck.restore_model(path, cfg, mesh=mesh, rules=LEARNER_RULES)
  assert sharded.layers[0].mlp.gate[...].sharding.spec == P("fsdp", "tensor")
  assert_trees_equal(nnx.state(sharded, nnx.Param), nnx.state(model, nnx.Param))

  # A float32 view of the same model: cast after the checksum check.
  f32 = ModelConfig(**{**ck.config_to_json(cfg), "param_dtype": "float32"})
  wide = ck.restore_model(path, f32)
  assert wide.embed[...].dtype == jnp.float32
  np.testing.assert_array_equal(wide.embed[...], model.embed[...].astype(jnp.float32))

  into = Transformer(cfg, rngs=nnx.Rngs(99))
  ck.restore_params_into(path, into)
  assert_trees_equal(nnx.state(into, nnx.Param), nnx.state(model, nnx.Param))

  with pytest.raises(ck.CheckpointError, match="num_layers=2 .asked 3"):
    ck.restore_model(path, ModelConfig(**{**ck.config_to_json(cfg), "num_layers": 3}))
  with pytest.raises(FileExistsError):
    ck.save_model(path, model)
  ck.save_model(path, Transformer(cfg, rngs=nnx.Rngs(4)), overwrite=True)
  assert not np.array_equal(np.asarray(ck.restore_model(path).embed[...], np.float32),
                            np.asarray(model.embed[...], np.float32))
  with pytest.raises(ck.CheckpointError, match="no model checkpoint"):
    ck.restore_model(tmp_path / "missing")


def test_async_save_then_restore(tmp_path):
  _, params, opt_state = trained_state()
  with ck.Checkpoints(tmp_path, max_to_keep=2, async_save=True) as ckpts:
    for step in (1, 2, 3):
      ckpts.save(step, {"params": params, "opt_state": opt_state}, {"step": step})
    ckpts.wait()
    assert ckpts.all_steps() == [2, 3]
    state, meta = ckpts.restore(target={"params": params})
  assert meta == {"step": 3}
  assert_trees_equal(state["params"], params)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupted_latest_step_falls_back_to_the_previous_intact_one(tmp_path, capsys):
  ws = [{"w": jnp.full((32, 32), float(i), jnp.float32)} for i in range(4)]
  with ck.Checkpoints(tmp_path, max_to_keep=None) as ckpts:
    for i in (1, 2, 3):
      ckpts.save(i, {"params": ws[i]}, {"step": i})
  victim = data_files(str(tmp_path / "3" / "params"))[0]
  with open(victim, "r+b") as f:  # a torn write of the newest step
    f.truncate(os.path.getsize(victim) // 2)
  with ck.Checkpoints(tmp_path, max_to_keep=None) as ckpts:
    step, state, meta = ckpts.restore_latest_intact({"params": ws[0]})
    assert (step, meta) == (2, {"step": 2})
    assert_trees_equal(state["params"], ws[2])
    assert "step 3" in capsys.readouterr().out
    moved = os.listdir(str(tmp_path) + ".corrupt")
    assert len(moved) == 1 and moved[0].startswith("3-")  # kept, not deleted
    assert ckpts.all_steps() == [1, 2]
    ckpts.save(3, {"params": ws[3]}, {"step": 3})  # training goes on from step 2
    assert ckpts.restore_latest_intact({"params": ws[0]})[0] == 3
  # A structure mismatch is no corruption: it is raised, nothing is moved.
  with ck.Checkpoints(tmp_path, max_to_keep=None) as ckpts:
    with pytest.raises(ck.CheckpointError, match="shape"):
      ckpts.restore_latest_intact({"params": {"w": jnp.zeros((4, 4))}})
    assert ckpts.all_steps() == [1, 2, 3]
