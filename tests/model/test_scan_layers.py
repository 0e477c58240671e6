"""`ModelConfig.scan_layers`: the cache-free forward as one `lax.scan` over the layers
equals the unrolled one (logits, query slice, remat, gradients), traces the block once
whatever the depth, and leaves the parameter layout (HF / sharding) unchanged."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evotrainer.model import Transformer
from evotrainer.model.transformer import init_cache, logical_axes
from tests.tiny_models import tiny_config

CFG = tiny_config(num_layers=3, architecture="qwen3", qk_norm=True)
TOL = 1e-5  # float32; measured 0 (the same ops, in a loop)


def pair(**overrides):
  cfg = dataclasses.replace(CFG, **overrides)
  unrolled = Transformer(cfg, rngs=nnx.Rngs(1))
  scanned = Transformer(dataclasses.replace(cfg, scan_layers=True), rngs=nnx.Rngs(1))
  return unrolled, scanned


def inputs():
  tokens = jax.random.randint(jax.random.key(0), (2, 10), 1, CFG.vocab_size)
  valid = jnp.arange(10)[None, :] >= jnp.array([0, 3])[:, None]  # row 1 left-padded
  return tokens, valid


def jitted(model, fn):
  """`fn(model, *args)` jitted with the parameters as arguments (remat inside)."""
  graphdef, state = nnx.split(model)
  f = jax.jit(lambda s, *a: fn(nnx.merge(graphdef, s), *a))
  return lambda *a: f(state, *a)


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_logits_and_query_slice_equal_unrolled(remat):
  unrolled, scanned = pair(remat=remat)
  tokens, valid = inputs()
  logits = lambda m, t, v: m.forward_logits(t, v)
  np.testing.assert_allclose(jitted(scanned, logits)(tokens, valid),
                             jitted(unrolled, logits)(tokens, valid), atol=TOL)

  def sliced(m, t, v):
    slots = jnp.broadcast_to(jnp.arange(10), t.shape)
    mask = (slots[:, None, :] <= slots[:, :, None]) & v[:, None, :]
    return m(t, jnp.maximum(jnp.cumsum(v, axis=1) - 1, 0), mask, query_slice=(6, 9))[0]

  np.testing.assert_allclose(jitted(scanned, sliced)(tokens, valid),
                             jitted(unrolled, sliced)(tokens, valid), atol=TOL)


@pytest.mark.slow
def test_scanned_gradients_equal_unrolled():
  unrolled, scanned = pair(remat=True)
  tokens, valid = inputs()

  def grads(model):
    graphdef, state = nnx.split(model)

    def loss(s):
      logp = jax.nn.log_softmax(nnx.merge(graphdef, s).forward_logits(tokens, valid), -1)
      return jnp.mean(jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1))

    return jax.jit(jax.grad(loss))(state)

  want, got = grads(unrolled), grads(scanned)
  assert jax.tree.structure(want) == jax.tree.structure(got)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, atol=TOL)
  assert max(float(jnp.max(jnp.abs(w))) for w in jax.tree.leaves(want)) > 1e-4


def count_dots(cfg) -> int:
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  tokens, valid = inputs()
  jaxpr = jax.make_jaxpr(jitted(model, lambda m, t, v: m.forward_logits(t, v)))(tokens, valid)
  return str(jaxpr).count("dot_general")


def test_scan_traces_one_block_whatever_the_depth():
  # Unrolled: the program grows with depth; scanned: the same program text at 2 and 6
  # layers (the compile-time story: bench/compile_depth.py measures it).
  two, six = (dataclasses.replace(CFG, num_layers=n) for n in (2, 6))
  assert count_dots(six) > count_dots(two)
  scan = lambda c: dataclasses.replace(c, scan_layers=True)
  assert count_dots(scan(six)) == count_dots(scan(two))


def test_parameter_layout_unchanged():
  unrolled, scanned = pair()
  assert jax.tree.structure(nnx.state(unrolled)) == jax.tree.structure(nnx.state(scanned))
  assert logical_axes(unrolled) == logical_axes(scanned)


def test_calls_with_a_cache_run_unrolled_and_equal():
  # The sampler's prefill / decode keep the per-layer cache: those calls do not scan.
  unrolled, scanned = pair()
  tokens, valid = inputs()
  slots = jnp.broadcast_to(jnp.arange(10), tokens.shape)
  mask = (slots[:, None, :] <= slots[:, :, None]) & valid[:, None, :]
  positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
  run = lambda m: m(tokens, positions, mask, init_cache(CFG, 2, 10), 0)
  (h1, c1), (h2, c2) = run(unrolled), run(scanned)
  np.testing.assert_allclose(h2, h1, atol=TOL)
  for a, b in zip(jax.tree.leaves(c1), jax.tree.leaves(c2)):
    np.testing.assert_allclose(b, a, atol=TOL)


@pytest.mark.slow
def test_sharded_learner_step_with_scan_equals_unrolled(devices):
  # On the 8-device mesh (fsdp x tensor split parameters) the stacked copy inside the
  # program is sharded by propagation; the update equals the unrolled model's.
  from evotrainer.learner.step import Learner
  from evotrainer.sharding.mesh import make_mesh
  from evotrainer.types import TrainBatch
  unrolled, scanned = pair(remat=True)
  rng = np.random.default_rng(0)
  b, p, n = 8, 4, 3
  batch = TrainBatch(
      prompt_tokens=rng.integers(1, CFG.vocab_size, (b, p)).astype(np.int32),
      prompt_lengths=np.full(b, p, np.int32),
      completion_tokens=rng.integers(1, CFG.vocab_size, (b, n)).astype(np.int32),
      loss_mask=np.ones((b, n), bool), advantages=rng.normal(size=b).astype(np.float32),
      old_logprobs=np.full((b, n), -4.0, np.float32),
      ref_logprobs=np.full((b, n), -4.0, np.float32))
  states = []
  for model in (unrolled, scanned):
    # lr = eps >> |g|: Adam's first update is the (clipped) gradient itself, not its sign.
    learner = Learner(model, mesh=make_mesh(data=2, fsdp=2, tensor=2),
                      learning_rate=1e3, eps=1e3)
    state, _ = learner.step(learner.init_state(nnx.state(model)), batch, learner.hparams())
    states.append(state.params)
  for a, b_ in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    np.testing.assert_allclose(b_, a, atol=TOL)
  moved = max(float(jnp.max(jnp.abs(a - b_))) for a, b_ in
              zip(jax.tree.leaves(states[0]), jax.tree.leaves(nnx.state(unrolled))))
  assert moved > 1e-3
