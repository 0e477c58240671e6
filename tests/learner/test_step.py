"""The train step: teacher-forced log-probs vs the sampler and an unpadded reference,
micro-batching vs the whole batch, no recompiles on knob changes, sharded vs one device,
and a GRPO update that moves log-probs the way the advantages say."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from evotrainer.learner.losses import AGG_SEQ_MEAN_TOKEN_MEAN
from evotrainer.learner.step import Learner, TrainState, completion_logprobs
from evotrainer.model.transformer import Transformer
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sharding.mesh import make_mesh
from evotrainer.types import TrainBatch
from tests.tiny_models import tiny_config

TOL = 1e-5
B, PLEN, N, V = 8, 8, 6, 64
PROMPT_LENGTHS = np.array([8, 1, 5, 3, 8, 2, 7, 4], np.int32)
COMPLETION_LENGTHS = np.array([6, 1, 4, 6, 2, 5, 3, 6], np.int32)
FILTERED_ROW = 5  # a row a harness filter dropped: loss mask all False

# Adam's first update is ~lr * sign(g), which would compare gradient signs (unstable
# where g ~ 0). With eps >> |g| it is lr / eps * g: with lr = eps the update is the
# (clipped) gradient itself, so parameter comparisons below compare gradients.
LINEAR_ADAM = dict(learning_rate=1e3, eps=1e3)


@pytest.fixture(scope="module")
def model():
  return Transformer(tiny_config(vocab_size=V), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def params(model):
  return nnx.state(model)


@pytest.fixture(scope="module")
def learner(model):
  return Learner(model, **LINEAR_ADAM)


@pytest.fixture(scope="module")
def micro_learner(model):
  return Learner(model, micro_batch_size=2, **LINEAR_ADAM)


def token_batch(seed: int = 0) -> TrainBatch:
  """Tokens and masks only (log-probs zero): lengths vary, pad id 0 fills the rest."""
  rng = np.random.default_rng(seed)
  prompt = np.zeros((B, PLEN), np.int32)
  for i, length in enumerate(PROMPT_LENGTHS):
    prompt[i, PLEN - length:] = rng.integers(1, V, length)
  in_completion = np.arange(N)[None, :] < COMPLETION_LENGTHS[:, None]
  completion = np.where(in_completion, rng.integers(1, V, (B, N)), 0).astype(np.int32)
  loss_mask = in_completion.copy()
  loss_mask[FILTERED_ROW] = False
  zeros = np.zeros((B, N), np.float32)
  return TrainBatch(prompt_tokens=prompt, prompt_lengths=PROMPT_LENGTHS,
                    completion_tokens=completion, loss_mask=loss_mask,
                    advantages=rng.normal(size=B).astype(np.float32), old_logprobs=zeros,
                    ref_logprobs=zeros, completion_lengths=COMPLETION_LENGTHS)


@pytest.fixture(scope="module")
def current_logprobs(learner, params):
  """[B, N] log-probs of `token_batch()` under the initial parameters."""
  return np.asarray(learner.reference_logprobs(params, token_batch()))


def train_batch(current_logprobs, seed: int = 1) -> TrainBatch:
  """Old and reference log-probs a little off the current ones: ratios != 1, some clipped."""
  rng = np.random.default_rng(seed)
  mask = token_batch().loss_mask
  old = current_logprobs + np.where(mask, rng.normal(0, 0.3, (B, N)), 0.0)
  ref = current_logprobs + np.where(mask, rng.normal(0, 0.3, (B, N)), 0.0)
  return token_batch().replace(old_logprobs=old.astype(np.float32),
                               ref_logprobs=ref.astype(np.float32))


def max_abs_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


# ---- completion_logprobs --------------------------------------------------------------


def test_completion_logprobs_equal_sampler_logprobs(model, params):
  vocab_limit = 48
  prompts = [list(np.random.default_rng(i).integers(1, vocab_limit, n))
             for i, n in enumerate(PROMPT_LENGTHS)]
  prompt_batch = left_pad(prompts, pad_id=0, buckets=(PLEN,))
  sampler = Sampler(model, pad_id=0, vocab_limit=vocab_limit, max_stop_ids=8)
  out = sampler(params, prompt_batch, jax.random.key(3), stop_ids=[1, 2, 3, 4, 5, 6],
                sampling=SamplingParams(max_new_tokens=N, temperature=1.0))
  batch = TrainBatch(prompt_tokens=prompt_batch.tokens, prompt_lengths=prompt_batch.lengths,
                     completion_tokens=out.tokens, loss_mask=out.loss_mask,
                     advantages=np.zeros(B, np.float32), old_logprobs=out.logprobs,
                     completion_lengths=out.lengths)
  graphdef = nnx.graphdef(model)
  logp, ent = jax.jit(lambda s, b: completion_logprobs(
      nnx.merge(graphdef, s), b, vocab_limit=vocab_limit, with_entropy=True))(params, batch)

  lengths = np.asarray(out.lengths)
  assert lengths.min() < N, "want some rows stopped early (test is weaker otherwise)"
  diff = np.max(np.abs(np.asarray(logp) - np.asarray(out.logprobs)))
  print(f"learner vs sampler log-probs: max abs diff {diff:.3g}")
  assert diff <= 1e-4
  after_end = ~np.asarray(out.loss_mask)
  assert np.all(np.asarray(logp)[after_end] == 0) and np.all(np.asarray(ent)[after_end] == 0)
  # Entropy over the 48 allowed ids of a near-uniform random model: close to log 48.
  ent_valid = np.asarray(ent)[~after_end]
  assert np.all(ent_valid <= np.log(vocab_limit) + 1e-4)
  assert np.all(ent_valid > np.log(vocab_limit) - 0.1)


@pytest.mark.slow
def test_completion_logprobs_equal_unpadded_forward(model):
  batch = token_batch()
  logp, ent = completion_logprobs(model, jax.tree.map(jnp.asarray, batch))
  assert ent is None
  # Reference: each row's prompt + completion starting at slot 0, no left padding; the
  # rows are right-padded to one width only to run them in one call (causal attention:
  # a token after the end cannot change the tokens before it).
  seqs = [np.concatenate([batch.prompt_tokens[i, PLEN - PROMPT_LENGTHS[i]:],
                          batch.completion_tokens[i, :COMPLETION_LENGTHS[i]]])
          for i in range(B)]
  width = max(len(s) for s in seqs)
  tokens = np.array([np.pad(s, (0, width - len(s))) for s in seqs], np.int32)
  valid = np.arange(width)[None, :] < np.array([len(s) for s in seqs])[:, None]
  graphdef, state = nnx.split(model)
  ref = np.asarray(jax.jit(lambda s, t, v: jax.nn.log_softmax(
      nnx.merge(graphdef, s).forward_logits(t, v), -1))(state, tokens, valid))  # [B, T, V]
  for i in range(B):
    completion = batch.completion_tokens[i, :COMPLETION_LENGTHS[i]]
    rows = np.arange(PROMPT_LENGTHS[i] - 1, PROMPT_LENGTHS[i] - 1 + len(completion))
    np.testing.assert_allclose(np.asarray(logp[i, :len(completion)]),
                               ref[i, rows, completion], atol=TOL)
    assert np.all(np.asarray(logp[i, len(completion):]) == 0)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
@pytest.mark.slow
def test_sampler_at_temperature_and_learner_agree_and_ratio_is_one(model, params, learner,
                                                                    temperature):
  """Samples drawn at T != 1: the learner's log-probs at T equal the sampler's, so the
  first on-policy update has ratio 1 and clips nothing; at T = 1 (the learner's old
  behaviour) the ratio is far from 1."""
  vocab_limit = 48
  prompts = [list(np.random.default_rng(i).integers(1, vocab_limit, n))
             for i, n in enumerate(PROMPT_LENGTHS)]
  prompt_batch = left_pad(prompts, pad_id=0, buckets=(PLEN,))
  sampler = Sampler(model, pad_id=0, vocab_limit=vocab_limit, max_stop_ids=8)
  out = sampler(params, prompt_batch, jax.random.key(5), stop_ids=[1, 2, 3],
                sampling=SamplingParams(max_new_tokens=N, temperature=temperature))
  batch = TrainBatch(prompt_tokens=prompt_batch.tokens, prompt_lengths=prompt_batch.lengths,
                     completion_tokens=out.tokens, loss_mask=out.loss_mask,
                     advantages=np.linspace(-1, 1, B).astype(np.float32),
                     old_logprobs=out.logprobs, completion_lengths=out.lengths)
  lim = Learner(model, vocab_limit=vocab_limit, **LINEAR_ADAM)
  at_t = np.asarray(lim.reference_logprobs(params, batch, temperature))
  mask = np.asarray(out.loss_mask)
  assert np.max(np.abs(at_t - np.asarray(out.logprobs))[mask]) <= 1e-4
  at_1 = np.asarray(lim.reference_logprobs(params, batch, 1.0))
  assert np.max(np.abs(at_1 - np.asarray(out.logprobs))[mask]) > 0.05

  _, m = lim.step(lim.init_state(params), batch, lim.hparams(temperature=temperature))
  m = jax.device_get(m)
  assert abs(m["ratio_min"] - 1) <= 1e-4 and abs(m["ratio_max"] - 1) <= 1e-4
  assert m["clip_frac_low"] == 0 and m["clip_frac_high"] == 0
  _, m1 = lim.step(lim.init_state(params), batch, lim.hparams(temperature=1.0))
  m1 = jax.device_get(m1)
  assert max(abs(m1["ratio_min"] - 1), abs(m1["ratio_max"] - 1)) > 0.05


def test_kl_term_changes_the_update_when_on(learner, params, current_logprobs):
  """With reference log-probs off the current ones, kl_coef > 0 moves the parameters
  differently than kl_coef = 0; with the reference equal to the policy it adds nothing."""
  batch = token_batch().replace(old_logprobs=current_logprobs)
  off_ref = train_batch(current_logprobs).ref_logprobs
  def update(kl_coef, ref):
    state, m = learner.step(learner.init_state(params), batch.replace(ref_logprobs=ref),
                            learner.hparams(kl_coef=kl_coef))
    return state.params, jax.device_get(m)
  p0, _ = update(0.0, off_ref)
  p1, m1 = update(0.5, off_ref)
  assert m1["kl"] > 0 and max_abs_diff(p0, p1) > 1e-6
  p2, m2 = update(0.5, current_logprobs)
  assert abs(m2["kl"]) <= 1e-6 and max_abs_diff(p0, p2) <= 1e-5


def test_bad_temperature_is_a_clear_error(learner):
  with pytest.raises(ValueError, match="temperature must be > 0"):
    learner.hparams(temperature=0.0)


# ---- the step -----------------------------------------------------------------------


def test_first_step_on_policy_has_unit_ratio(learner, params, current_logprobs):
  batch = token_batch().replace(old_logprobs=current_logprobs)
  state, metrics = learner.step(learner.init_state(params), batch, learner.hparams())
  metrics = jax.device_get(metrics)
  assert abs(metrics["ratio_mean"] - 1) <= TOL
  assert abs(metrics["ratio_min"] - 1) <= TOL and abs(metrics["ratio_max"] - 1) <= TOL
  assert metrics["clip_frac_low"] == 0 and metrics["clip_frac_high"] == 0
  assert abs(metrics["approx_kl"]) <= TOL
  assert metrics["num_tokens"] == token_batch().loss_mask.sum()
  assert metrics["grad_norm"] > 0 and int(state.step) == 1


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batched_step_equals_full_batch(learner, micro_learner, params,
                                              current_logprobs, agg_mode):
  batch = train_batch(current_logprobs)
  hp = dict(agg_mode=agg_mode, kl_coef=0.1, entropy_coef=0.01)
  full, m_full = learner.step(learner.init_state(params), batch, learner.hparams(**hp))
  micro, m_micro = micro_learner.step(micro_learner.init_state(params), batch,
                                      micro_learner.hparams(**hp))
  diff = max_abs_diff(micro.params, full.params)
  moved = max_abs_diff(full.params, params)
  print(f"{agg_mode}: micro vs full params max abs diff {diff:.3g} (update size {moved:.3g})")
  assert diff <= TOL
  assert moved > 1e-3  # the update is not vacuous
  for k in m_full:
    assert abs(float(m_micro[k]) - float(m_full[k])) <= TOL * max(1.0, abs(float(m_full[k]))), k
  assert float(m_full["clip_frac_low"]) + float(m_full["clip_frac_high"]) > 0


@pytest.mark.parametrize("chunk", [1, 4])  # 4 does not divide N = 6: a padded last block
@pytest.mark.slow
def test_chunked_logprobs_step_equals_one_block(model, learner, params, current_logprobs,
                                                chunk):
  chunked = Learner(model, logprob_chunk=chunk, **LINEAR_ADAM)
  plain = Learner(model, **LINEAR_ADAM)
  batch = train_batch(current_logprobs)
  hp = dict(kl_coef=0.1, entropy_coef=0.01, temperature=0.8)
  a, m_a = chunked.step(chunked.init_state(params), batch, chunked.hparams(**hp))
  b, m_b = plain.step(plain.init_state(params), batch, plain.hparams(**hp))
  assert max_abs_diff(a.params, b.params) <= TOL
  assert max_abs_diff(b.params, params) > 1e-3  # the update is not vacuous
  for k in m_b:
    assert abs(float(m_a[k]) - float(m_b[k])) <= TOL * max(1.0, abs(float(m_b[k]))), k
  np.testing.assert_allclose(chunked.reference_logprobs(params, batch, 0.8),
                             plain.reference_logprobs(params, batch, 0.8), atol=TOL)
  with pytest.raises(ValueError, match="logprob_chunk"):
    Learner(model, logprob_chunk=0)


def test_bf16_logits_and_attention_accumulate_in_float32():
  """Under bf16 compute the LM head and attention scores are accumulated in float32:
  the log-probs match a float64 numpy forward of the same bf16-rounded inputs to
  float32-accumulation accuracy, not bf16's ~3 digits."""
  from evotrainer.model.transformer import head_logits
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(2, 3, 256)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(256, 512)) / 16, jnp.bfloat16)
  got = np.asarray(head_logits(h, w, tied=False))
  ref = np.asarray(h, np.float64) @ np.asarray(w, np.float64)
  rounded = np.asarray((h @ w).astype(jnp.float32))  # a bf16 result, for contrast
  assert np.max(np.abs(got - ref)) < 1e-4 < np.max(np.abs(rounded - ref))
  got_tied = np.asarray(head_logits(h, w.T, tied=True))
  assert np.max(np.abs(got_tied - ref)) < 1e-4
  # attention: in a bf16 model's forward every q.k score dot ([B, KV, G, T, S]) and the
  # LM head's dot produce float32 from bf16 operands
  bf = Transformer(tiny_config(vocab_size=V, dtype="bfloat16"), rngs=nnx.Rngs(0))
  x = jnp.asarray(rng.integers(1, V, (2, 5)), jnp.int32)  # T = 5 != head_dim
  dots = [e for e in jax.make_jaxpr(bf.forward_logits)(x).eqns
          if e.primitive.name == "dot_general"]
  scores = [e for e in dots if e.outvars[0].aval.ndim == 5 and
            e.outvars[0].aval.shape[-1] == e.outvars[0].aval.shape[-2]]
  assert len(scores) == tiny_config(vocab_size=V).num_layers
  for e in scores + [dots[-1]]:  # the last dot is the LM head
    assert [v.aval.dtype for v in e.invars] == [jnp.bfloat16] * 2
    assert e.outvars[0].aval.dtype == jnp.float32


def test_knob_changes_do_not_recompile(learner, params, current_logprobs):
  batch = train_batch(current_logprobs)
  state = learner.init_state(params)
  losses = []
  for hp in [dict(),
             dict(clip_low=0.1, clip_high=0.5),
             dict(kl_coef=0.5, kl_kind="k2"),
             dict(entropy_coef=0.1),
             dict(agg_mode=AGG_SEQ_MEAN_TOKEN_MEAN),
             dict(agg_mode="seq-mean-token-sum-norm", dual_clip_c=3.0, seq_level=1),
             dict(lr_scale=0.5)]:
    state, metrics = learner.step(state, batch, learner.hparams(**hp))
    losses.append(float(metrics["loss"]))
  assert learner.compiled_programs() == 1
  assert len(set(losses)) == len(losses)  # every knob reached the loss
  assert float(metrics["lr"]) == pytest.approx(0.5 * LINEAR_ADAM["learning_rate"])


def test_zero_lr_scale_leaves_params_unchanged(learner, params, current_logprobs):
  state = learner.init_state(params)
  state, metrics = learner.step(state, train_batch(current_logprobs),
                                learner.hparams(lr_scale=0.0))
  assert max_abs_diff(state.params, params) == 0
  assert float(metrics["grad_norm"]) > 0 and float(metrics["lr"]) == 0


def test_sharded_step_equals_single_device(model, learner, params, current_logprobs, devices):
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  sharded = Learner(model, mesh=mesh, micro_batch_size=4, **LINEAR_ADAM)
  batch = train_batch(current_logprobs)
  hp = dict(kl_coef=0.1, entropy_coef=0.01)
  ref, m_ref = learner.step(learner.init_state(params), batch, learner.hparams(**hp))
  state = sharded.init_state(params)
  state, metrics = sharded.step(state, batch, sharded.hparams(**hp))

  diff = max_abs_diff(state.params, ref.params)
  print(f"sharded vs single-device params max abs diff {diff:.3g}")
  assert diff <= TOL
  assert max_abs_diff(state.opt_state, ref.opt_state) <= TOL
  assert abs(float(metrics["loss"]) - float(m_ref["loss"])) <= TOL
  # Parameters and Adam moments stay split over fsdp x tensor after the update.
  gate = state.params["layers"][0]["mlp"]["gate"][...]
  assert gate.sharding.spec == P("fsdp", "tensor")
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.shape == gate.shape]
  assert len(moments) >= 2 * 2 * 2  # mu and nu of gate and up, in 2 layers
  assert all(x.sharding.spec == P("fsdp", "tensor") for x in moments)
  assert len(state.step.sharding.device_set) == 8


def test_grpo_steps_move_logprobs_with_the_advantage(learner, params, current_logprobs):
  advantages = np.zeros(B, np.float32)
  advantages[[0, 3]] = [1.0, -1.0]  # two full-length completions
  batch = token_batch().replace(old_logprobs=current_logprobs, advantages=advantages)
  state = learner.init_state(params)
  hp = learner.hparams(lr_scale=0.1)
  for _ in range(3):
    state, _ = learner.step(state, batch, hp)
  after = np.asarray(learner.reference_logprobs(state.params, batch))
  gain = (after - current_logprobs).sum(-1)  # [B], summed over each completion
  print(f"log-prob change of the +1 row {gain[0]:.3g}, of the -1 row {gain[3]:.3g}")
  assert gain[0] > 0.05
  assert gain[3] < -0.05


def test_bad_input_is_a_clear_error(model, micro_learner, params):
  with pytest.raises(ValueError, match="agg_mode"):
    Learner(model, agg_mode="mean")
  with pytest.raises(ValueError, match="unknown"):
    micro_learner.hparams(clip=0.3)
  with pytest.raises(ValueError, match="micro_batch_size"):
    Learner(model, micro_batch_size=0)


@pytest.mark.parametrize("rows,most,count", [(8, 8, 1), (16, 8, 2), (12, 8, 2), (4, 8, 1),
                                             (3, 2, 3), (7, 3, 7), (6, 4, 2), (5, None, 1)])
def test_batch_splits_into_the_fewest_equal_micro_batches(model, rows, most, count):
  # By hand: the smallest count >= rows / most that divides rows.
  learner = Learner(model, micro_batch_size=most)
  assert learner._num_micro(rows) == count  # pylint: disable=protected-access


def test_a_batch_micro_batch_size_does_not_divide_equals_the_whole_batch(
    learner, micro_learner, params, current_logprobs):
  """3 rows at most 2 a micro-batch: three of one row, the same update as all three."""
  odd = jax.tree.map(lambda x: x[:3], train_batch(current_logprobs))
  full, _ = learner.step(learner.init_state(params), odd, learner.hparams())
  micro, _ = micro_learner.step(micro_learner.init_state(params), odd, micro_learner.hparams())
  assert max_abs_diff(micro.params, full.params) <= TOL
  assert max_abs_diff(full.params, params) > 1e-4  # the update is not vacuous


def test_train_state_is_a_pytree(learner, params):
  state = learner.init_state(params)
  assert isinstance(state, TrainState)
  leaves = jax.tree.leaves(state)
  assert len(leaves) > len(jax.tree.leaves(params))
  assert int(state.step) == 0
