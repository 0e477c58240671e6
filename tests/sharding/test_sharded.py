"""The model sharded by the learner rules on a (data=2, fsdp=2, tensor=2) mesh computes
what the same parameters compute on one device: forward logits and one AdamW step."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from evotrainer.sharding.mesh import (create_model, make_mesh, opt_state_shardings,
                                      shard_batch, state_shardings)
from evotrainer.sharding import rules
from evotrainer.sharding.rules import LEARNER_RULES, use_rules
from tests.sharding.multihost_worker import fixed_tokens, tiny_config

TOL = 1e-5


@pytest.fixture(scope="module")
def mesh(devices):
  return make_mesh(data=2, fsdp=2, tensor=2)


@pytest.fixture(scope="module")
def sharded(mesh):
  """(graphdef, params state) created directly on the mesh."""
  return nnx.split(create_model(tiny_config(), mesh, LEARNER_RULES, seed=0))


def _on_one_device(tree):
  return jax.device_put(tree, jax.devices()[0])


def _max_abs_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _forward(graphdef, rules):
  @jax.jit
  def forward(state, tokens):  # [B, T] -> [B, T, V]
    model = nnx.merge(graphdef, state)
    if rules is None:
      return model.forward_logits(tokens)
    with use_rules(rules):
      return model.forward_logits(tokens)
  return forward


def test_sharded_forward_matches_single_device(mesh, sharded):
  graphdef, state = sharded
  tokens = fixed_tokens()
  with jax.set_mesh(mesh):
    logits = _forward(graphdef, LEARNER_RULES)(state, shard_batch(tokens, mesh, LEARNER_RULES))
  ref = _forward(graphdef, None)(_on_one_device(state), tokens)

  # Rows over data+fsdp and vocabulary over tensor, as the rules say.
  assert logits.sharding.spec == P(("data", "fsdp"), None, "tensor")
  assert len(ref.sharding.device_set) == 1
  diff = _max_abs_diff(logits, ref)
  print(f"forward: sharded vs single-device max abs diff {diff:.3g}")
  assert diff <= TOL
  assert float(np.std(ref)) > 1e-3


def test_parameters_are_sharded(mesh, sharded):
  _, state = sharded
  cases = {
      # MLP kernel [embed, mlp] -> (fsdp, tensor); embedding table [vocab, embed] ->
      # (None, fsdp): its vocabulary axis stays whole so the row lookup stays local.
      "gate": (state["layers"][0]["mlp"]["gate"][...], P("fsdp", "tensor"), (32, 64)),
      "embed": (state["embed"][...], P(None, "fsdp"), (128, 32)),
      # Norm scales stay whole.
      "norm": (state["final_norm"]["scale"][...], P(None), (64,)),
  }
  for name, (x, spec, shard_shape) in cases.items():
    assert x.sharding.spec == spec, name
    shards = x.addressable_shards
    assert len(shards) == 8, name
    full = np.asarray(x)
    for s in shards:
      assert s.data.shape == shard_shape, name
      np.testing.assert_array_equal(np.asarray(s.data), full[s.index])
    # One distinct piece per fsdp x tensor cell the spec uses; data replicas repeat them.
    distinct = {tuple((i.start, i.stop) for i in s.index) for s in shards}
    pieces = 1
    for axis in spec:
      pieces *= {None: 1, "fsdp": 2, "tensor": 2}[axis]
    assert len(distinct) == pieces, name


def test_shard_batch(mesh):
  tokens = fixed_tokens()
  weights = np.arange(8, dtype=np.float32)
  batch = shard_batch({"tokens": tokens, "weights": jax.numpy.asarray(weights)}, mesh,
                      LEARNER_RULES, logical={"tokens": ("batch", "length"),
                                              "weights": ("batch",)})
  assert batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
  assert batch["weights"].sharding.spec == P(("data", "fsdp"))
  for s in batch["tokens"].addressable_shards:
    assert s.data.shape == (2, 16)
    np.testing.assert_array_equal(np.asarray(s.data), tokens[s.index])
  np.testing.assert_array_equal(np.asarray(batch["weights"]), weights)
  # 6 rows do not split over data*fsdp = 4 devices: replicated rather than an error.
  odd = shard_batch(tokens[:6], mesh, LEARNER_RULES)
  assert odd.sharding.spec == P(None, None)


def _train_step(graphdef, tx, rules):
  """(params, opt_state, batch) -> (params, opt_state, loss): next-token CE + one update."""

  def loss_fn(params, tokens):  # tokens [B, T]
    logits = nnx.merge(graphdef, params).forward_logits(tokens)  # [B, T, V]
    return optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1], tokens[:, 1:]).mean()

  def step(params, opt_state, batch):
    if rules is None:
      loss, grads = jax.value_and_grad(loss_fn)(params, batch["tokens"])
    else:
      with use_rules(rules):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch["tokens"])
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


@pytest.mark.slow
def test_sharded_train_step_matches_single_device(mesh, sharded):
  graphdef, params = sharded
  tx = optax.adamw(1e-3, weight_decay=0.1)
  batch = {"tokens": fixed_tokens()}

  # Sharded: params as created, optimizer state sharded like them, rows over data+fsdp.
  param_sh = state_shardings(params, mesh, LEARNER_RULES)
  opt_sh = opt_state_shardings(tx, jax.eval_shape(tx.init, params), param_sh, mesh)
  opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
  mu = opt_state[0].mu["layers"][0]["mlp"]["gate"][...]
  assert mu.sharding.spec == P("fsdp", "tensor")
  assert opt_state[0].count.sharding.spec == P()
  sharded_batch = shard_batch(batch, mesh, LEARNER_RULES)
  assert sharded_batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
  batch_sh = jax.tree.map(lambda x: x.sharding, sharded_batch)
  replicated = NamedSharding(mesh, P())
  step = jax.jit(_train_step(graphdef, tx, LEARNER_RULES),
                 in_shardings=(param_sh, opt_sh, batch_sh),
                 out_shardings=(param_sh, opt_sh, replicated))
  with jax.set_mesh(mesh):
    new_params, new_opt, loss = step(params, opt_state, sharded_batch)

  # Reference: the same numbers on one device, no mesh, no rules.
  ref_params = _on_one_device(params)
  ref_step = jax.jit(_train_step(graphdef, tx, None))
  ref_new_params, ref_new_opt, ref_loss = ref_step(
      ref_params, tx.init(ref_params), _on_one_device(batch))

  assert new_params["layers"][0]["mlp"]["gate"][...].sharding.spec == P("fsdp", "tensor")
  loss_diff = abs(float(loss) - float(ref_loss))
  param_diff = _max_abs_diff(new_params, ref_new_params)
  opt_diff = _max_abs_diff(new_opt, ref_new_opt)
  print(f"train step: loss {float(ref_loss):.6f}, |dloss| {loss_diff:.3g}, "
        f"params max abs diff {param_diff:.3g}, opt state max abs diff {opt_diff:.3g}")
  assert np.isclose(float(ref_loss), np.log(tiny_config().vocab_size), atol=0.1)
  assert loss_diff <= TOL
  assert param_diff <= TOL
  assert opt_diff <= TOL
  # The step did move the parameters (by ~lr per entry), so the comparison is not vacuous.
  assert _max_abs_diff(ref_new_params, ref_params) > 5e-4


def test_sampler_rules_keep_parameters_whole_over_fsdp():
  """The sampler's table is the learner's with `embed` unsplit, every other axis alike."""
  learner, sampler = dict(rules.LEARNER_RULES), dict(rules.SAMPLER_RULES)
  assert learner["embed"] == "fsdp" and sampler["embed"] is None
  assert {k: v for k, v in sampler.items() if k != "embed"} == \
      {k: v for k, v in learner.items() if k != "embed"}
  assert [k for k, _ in rules.SAMPLER_RULES] == list(rules.LOGICAL_AXES)
  with pytest.raises(ValueError, match="embedd"):
    rules._with_axes(rules.LEARNER_RULES, embedd=None)
