"""Loss terms against hand-computed values, independent numpy gradients, and trace counts."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evotrainer.learner import losses as L

# --------------------------------------------------------------------- aggregation

# Row 2 is a filtered row (no valid token): it must not count anywhere.
VALUES = jnp.array([[1., 2., 3., 4.], [5., 6., 7., 8.], [9., 9., 9., 9.]])
VMASK = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)


@pytest.mark.parametrize("mode,want", [
    (L.AGG_TOKEN_MEAN, (1 + 2 + 3 + 5) / 4),  # 11 tokens-sum over 4 tokens
    (L.AGG_SEQ_MEAN_TOKEN_MEAN, (6 / 3 + 5 / 1) / 2),  # two valid sequences
    (L.AGG_SEQ_MEAN_TOKEN_SUM_NORM, (6 / 4 + 5 / 4) / 2),  # L = T = 4
])
def test_aggregate_modes(mode, want):
  np.testing.assert_allclose(L.aggregate(VALUES, VMASK, mode), want, rtol=1e-6)
  np.testing.assert_allclose(L.aggregate(VALUES, VMASK, jnp.int32(mode)), want, rtol=1e-6)


def test_aggregate_overrides():
  got = L.aggregate(VALUES, VMASK, L.AGG_SEQ_MEAN_TOKEN_SUM_NORM, norm_length=10.0)
  np.testing.assert_allclose(got, (6 / 10 + 5 / 10) / 2, rtol=1e-6)
  # Micro-batching: normalize by the global counts of the full batch.
  got = L.aggregate(VALUES, VMASK, L.AGG_TOKEN_MEAN, num_tokens=8.0)
  np.testing.assert_allclose(got, 11 / 8, rtol=1e-6)
  got = L.aggregate(VALUES, VMASK, L.AGG_SEQ_MEAN_TOKEN_MEAN, num_seqs=4.0)
  np.testing.assert_allclose(got, 7 / 4, rtol=1e-6)


def test_aggregate_all_masked_is_zero():
  assert float(L.aggregate(VALUES, jnp.zeros_like(VMASK), L.AGG_TOKEN_MEAN)) == 0.0


# ---------------------------------------------------------------- PPO hand example
# old log-probs -1; new = old + log(ratio). clip_low 0.2, clip_high 0.28 -> [0.8, 1.28].
# Row 0, A = +1, ratios [1.1, 1.5, 0.5, (masked) 2.0]:
#   -min(r, clip r) = [-1.1, -1.28 (clip high), -0.5]            sum -2.88
# Row 1, A = -1, ratios [0.9, 0.5, 1.5, 4.0]:
#   max(r, clip r) = [0.9, 0.8 (clip low), 1.5, 4.0]; dual clip c = 3 caps 4.0 -> 3.0
#   sum 6.2 with dual clip, 7.2 without.
RATIOS = np.array([[1.1, 1.5, 0.5, 2.0], [0.9, 0.5, 1.5, 4.0]])
OLD = jnp.full((2, 4), -1.0)
NEW = OLD + jnp.log(jnp.asarray(RATIOS))
ADV = jnp.array([1.0, -1.0])
PMASK = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
HAND_LOSS_DUAL = {
    L.AGG_TOKEN_MEAN: (-2.88 + 6.2) / 7,
    L.AGG_SEQ_MEAN_TOKEN_MEAN: (-2.88 / 3 + 6.2 / 4) / 2,
    L.AGG_SEQ_MEAN_TOKEN_SUM_NORM: (-2.88 / 4 + 6.2 / 4) / 2,
}
HAND_LOSS_NO_DUAL = {
    L.AGG_TOKEN_MEAN: (-2.88 + 7.2) / 7,
    L.AGG_SEQ_MEAN_TOKEN_MEAN: (-2.88 / 3 + 7.2 / 4) / 2,
    L.AGG_SEQ_MEAN_TOKEN_SUM_NORM: (-2.88 / 4 + 7.2 / 4) / 2,
}


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_policy_loss_hand_example(mode):
  loss, _ = L.policy_loss(NEW, OLD, ADV, PMASK, 0.2, 0.28, 3.0, mode)
  np.testing.assert_allclose(loss, HAND_LOSS_DUAL[mode], rtol=1e-5)
  loss, _ = L.policy_loss(NEW, OLD, ADV, PMASK, 0.2, 0.28, 0.0, mode)  # dual clip off
  np.testing.assert_allclose(loss, HAND_LOSS_NO_DUAL[mode], rtol=1e-5)
  loss, _ = L.policy_loss(NEW, OLD, ADV, PMASK, 0.2, 0.28, 1.0, mode)  # c <= 1: off
  np.testing.assert_allclose(loss, HAND_LOSS_NO_DUAL[mode], rtol=1e-5)


def test_policy_loss_hand_metrics():
  _, m = L.policy_loss(NEW, OLD, ADV, PMASK, 0.2, 0.28, 3.0)
  valid = [1.1, 1.5, 0.5, 0.9, 0.5, 1.5, 4.0]
  np.testing.assert_allclose(m["clip_frac_low"], 1 / 7, rtol=1e-6)  # row 1, r = 0.5
  np.testing.assert_allclose(m["clip_frac_high"], 1 / 7, rtol=1e-6)  # row 0, r = 1.5
  np.testing.assert_allclose(m["dual_clip_frac"], 1 / 7, rtol=1e-6)  # row 1, r = 4
  np.testing.assert_allclose(m["ratio_mean"], sum(valid) / 7, rtol=1e-5)
  np.testing.assert_allclose(m["ratio_min"], 0.5, rtol=1e-5)
  np.testing.assert_allclose(m["ratio_max"], 4.0, rtol=1e-5)  # masked 2.0 ignored either way
  k3 = sum(r - 1 - math.log(r) for r in valid) / 7
  np.testing.assert_allclose(m["approx_kl"], k3, rtol=1e-5)


def test_policy_loss_per_token_advantages():
  # Per-token A equal to the broadcast row advantage gives the same loss ...
  adv_bt = jnp.array([[1., 1., 1., 1.], [-1., -1., -1., -1.]])
  loss, _ = L.policy_loss(NEW, OLD, adv_bt, PMASK, 0.2, 0.28, 3.0)
  np.testing.assert_allclose(loss, HAND_LOSS_DUAL[0], rtol=1e-5)
  # ... and flipping the sign of one token changes exactly that token:
  # row 0 token 1 (r = 1.5) with A = -1: max(1.5, 1.28) = 1.5 instead of -1.28.
  adv_bt = adv_bt.at[0, 1].set(-1.0)
  loss, _ = L.policy_loss(NEW, OLD, adv_bt, PMASK, 0.2, 0.28, 3.0)
  np.testing.assert_allclose(loss, (-2.88 + 1.28 + 1.5 + 6.2) / 7, rtol=1e-5)


def test_ratio_one_when_on_policy():
  rng = np.random.default_rng(0)
  logp = jnp.asarray(rng.normal(-2.0, 1.0, size=(3, 5)))
  adv = jnp.array([0.5, -1.0, 2.0])
  mask = jnp.asarray(rng.random((3, 5)) < 0.8)
  loss, m = L.policy_loss(logp, logp, adv, mask, 0.2, 0.28, 3.0)
  for k in ("ratio_mean", "ratio_min", "ratio_max"):
    assert float(m[k]) == 1.0
  for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl"):
    assert float(m[k]) == 0.0
  m_np = np.asarray(mask)
  want = -(np.asarray(adv)[:, None] * m_np).sum() / m_np.sum()  # -token-mean(A)
  np.testing.assert_allclose(loss, want, rtol=1e-6)


def _loss_and_grad_at_ratio(r, adv, clip_low=0.2, clip_high=0.28, dual=0.0):
  fn = lambda lp: L.policy_loss(lp, jnp.zeros((1, 1)), jnp.array([adv]),
                                jnp.ones((1, 1), bool), clip_low, clip_high, dual)[0]
  lp = jnp.full((1, 1), math.log(r))
  return float(fn(lp)), float(jax.grad(fn)(lp)[0, 0])


def test_clip_higher_bounds_positive_advantage():
  # A > 0: objective -loss = min(r, clip r) * A grows with r up to 1 + clip_high, then stops.
  for r in (1.3, 1.5, 3.0, 100.0):
    loss, grad = _loss_and_grad_at_ratio(r, 2.0)
    np.testing.assert_allclose(loss, -2.0 * 1.28, rtol=1e-6)
    assert grad == 0.0
  loss, grad = _loss_and_grad_at_ratio(1.2, 2.0)  # inside the range: still growing
  np.testing.assert_allclose(loss, -2.4, rtol=1e-6)
  np.testing.assert_allclose(grad, -2.4, rtol=1e-5)  # -A * r


def test_clip_low_bounds_negative_advantage():
  # A < 0: objective stops improving once r falls below 1 - clip_low.
  for r in (0.79, 0.5, 0.01):
    loss, grad = _loss_and_grad_at_ratio(r, -2.0)
    np.testing.assert_allclose(loss, 2.0 * 0.8, rtol=1e-6)
    assert grad == 0.0
  loss, grad = _loss_and_grad_at_ratio(0.9, -2.0)
  np.testing.assert_allclose(loss, 1.8, rtol=1e-6)
  np.testing.assert_allclose(grad, 1.8, rtol=1e-5)


def test_dual_clip_bounds_negative_advantage():
  for r in (5.0, 1e3, 1e6):
    loss, grad = _loss_and_grad_at_ratio(r, -2.0, dual=3.0)
    np.testing.assert_allclose(loss, 3.0 * 2.0, rtol=1e-6)  # c * |A|
    assert grad == 0.0
  loss, _ = _loss_and_grad_at_ratio(1e3, -2.0, dual=0.0)  # off: unbounded
  np.testing.assert_allclose(loss, 2e3, rtol=1e-4)
  loss, _ = _loss_and_grad_at_ratio(2.0, -2.0, dual=3.0)  # below c: untouched
  np.testing.assert_allclose(loss, 4.0, rtol=1e-6)
  loss, _ = _loss_and_grad_at_ratio(1e3, 2.0, dual=3.0)  # A > 0: dual clip irrelevant
  np.testing.assert_allclose(loss, -2.0 * 1.28, rtol=1e-6)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_grpo_gradient_matches_numpy(mode):
  rng = np.random.default_rng(mode)
  b, t = 4, 6
  logp = rng.normal(-1.5, 0.5, size=(b, t))
  old = logp + rng.normal(0.0, 0.3, size=(b, t))  # some ratios outside [0.8, 1.28]
  adv = rng.normal(size=b)
  mask = rng.random((b, t)) < 0.75
  mask[0, 0] = True
  mask[3] = False  # a filtered row
  clip_low, clip_high = 0.2, 0.28

  # Analytic gradient: unclipped tokens -A r w, clipped tokens 0, with w the
  # aggregation weight of the token.
  r = np.exp(logp - old)
  a = np.broadcast_to(adv[:, None], (b, t))
  clipped = ((a > 0) & (r > 1 + clip_high)) | ((a < 0) & (r < 1 - clip_low))
  lens = mask.sum(1)
  n_seq = (lens > 0).sum()
  if mode == 0:
    w = np.full((b, t), 1.0 / mask.sum())
  elif mode == 1:
    w = np.broadcast_to((1.0 / np.maximum(lens, 1) / n_seq)[:, None], (b, t))
  else:
    w = np.full((b, t), 1.0 / (t * n_seq))
  want = np.where(mask & ~clipped, -a * r * w, 0.0)
  assert clipped[mask].any() and (~clipped[mask]).any()  # the test exercises both

  fn = lambda lp: L.policy_loss(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                                clip_low, clip_high, 0.0, mode)[0]
  got = jax.grad(fn)(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)


# -------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_value_and_gradient():
  # Row 0: log ratios [0.1, 0.3, (masked)] -> s0 = exp(0.2); row 1: [-0.2, 0, 0.2] -> s1 = 1.
  old = jnp.zeros((2, 3))
  logp = jnp.array([[0.1, 0.3, 5.0], [-0.2, 0.0, 0.2]])
  mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
  adv = jnp.array([1.0, -2.0])
  s0, s1 = math.exp(0.2), 1.0
  fn = lambda lp: L.gspo_loss(lp, old, adv, mask, clip_low=0.5, clip_high=0.5)
  (loss, m), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  # Unclipped, seq-mean-token-mean: mean_i(-A_i s_i).
  np.testing.assert_allclose(loss, (-1.0 * s0 + 2.0 * s1) / 2, rtol=1e-6)
  # Sequence-level GSPO gradient: d/dlogp_t (-A_i s_i) / n_seq = -A_i s_i / (|y_i| n_seq).
  want = np.array([[-1.0 * s0 / 2 / 2, -1.0 * s0 / 2 / 2, 0.0],
                   [2.0 / 3 / 2, 2.0 / 3 / 2, 2.0 / 3 / 2]])
  np.testing.assert_allclose(grad, want, rtol=1e-5)
  np.testing.assert_allclose(m["ratio_max"], s0, rtol=1e-6)
  # Token-level ratios of row 1 differ from 1, but the sequence ratio is exactly 1:
  # the clip decision is per sequence. With the paper's tiny range row 0 is clipped.
  loss, m = L.gspo_loss(logp, old, adv, mask)  # (3e-4, 4e-4)
  np.testing.assert_allclose(loss, (-1.0 * (1 + 4e-4) + 2.0 * 1.0) / 2, rtol=1e-6)
  np.testing.assert_allclose(m["clip_frac_high"], 2 / 5, rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda lp: L.gspo_loss(lp, old, adv, mask)[0])(logp)[0],
                             0.0)


def test_seq_level_switch_matches_gspo():
  rng = np.random.default_rng(3)
  logp = jnp.asarray(rng.normal(size=(3, 4)))
  old = logp + jnp.asarray(rng.normal(0, 0.1, size=(3, 4)))
  adv, mask = jnp.array([1., -1., .5]), jnp.ones((3, 4), bool)
  a, _ = L.gspo_loss(logp, old, adv, mask, 0.2, 0.2, agg_mode=1)
  b, _ = L.policy_loss(logp, old, adv, mask, 0.2, 0.2, 0.0, 1, jnp.bool_(True))
  np.testing.assert_allclose(a, b, rtol=1e-6)


# ---------------------------------------------------------------------------- KL


def test_kl_estimators_match_formulas():
  rng = np.random.default_rng(4)
  logp = rng.normal(-2.0, 1.0, size=(3, 5))
  ref = rng.normal(-2.0, 1.0, size=(3, 5))
  d = logp - ref
  np.testing.assert_allclose(L.kl_k1(jnp.asarray(logp), jnp.asarray(ref)), d, rtol=1e-5)
  np.testing.assert_allclose(L.kl_k2(jnp.asarray(logp), jnp.asarray(ref)), 0.5 * d**2,
                             rtol=1e-5)
  k3 = np.exp(-d) + d - 1  # exp(ref - logp) - (ref - logp) - 1
  got3 = np.asarray(L.kl_k3(jnp.asarray(logp), jnp.asarray(ref)))
  np.testing.assert_allclose(got3, k3, rtol=1e-5, atol=1e-6)
  assert (got3 >= 0).all() and (np.asarray(L.kl_k2(logp, ref)) >= 0).all()
  assert float(L.kl_k3(jnp.float32(-1.0), jnp.float32(-1.0))) == 0.0


def test_kl_penalty_traced_kind_and_mask():
  logp = jnp.array([[0.0, 0.0, 9.0]])
  ref = jnp.array([[-0.5, 0.5, 0.0]])
  mask = jnp.array([[True, True, False]])
  # k1 = [0.5, -0.5]; k2 = [0.125, 0.125]; k3 = [e^-0.5 + 0.5 - 1, e^0.5 - 0.5 - 1].
  want = {L.KL_K1: 0.0, L.KL_K2: 0.125,
          L.KL_K3: (math.exp(-0.5) - 0.5 + math.exp(0.5) - 1.5) / 2}
  for kind, w in want.items():
    got = L.kl_penalty(logp, ref, mask, jnp.int32(kind))
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)
  per_tok = L.kl_per_token(logp, ref, mask, L.KL_K1)
  np.testing.assert_allclose(per_tok, [[0.5, -0.5, 0.0]], rtol=1e-6)


def test_kl_reward_penalty_is_constant():
  logp = jnp.array([[0.0, -1.0]])
  ref = jnp.array([[-0.5, -1.0]])
  mask = jnp.ones((1, 2), bool)
  np.testing.assert_allclose(L.kl_reward_penalty(logp, ref, mask, 0.1), [[0.05, 0.0]],
                             rtol=1e-6)
  g = jax.grad(lambda lp: L.kl_reward_penalty(lp, ref, mask, 0.1).sum())(logp)
  np.testing.assert_array_equal(g, 0.0)


# ----------------------------------------------------------------- entropy, value


def test_entropy_from_logits():
  p = np.array([0.5, 0.25, 0.25])
  logits = jnp.asarray(np.stack([np.log(p) + 3.0, np.zeros(3)])[None])  # [1, 2, 3]
  want = [[-(p * np.log(p)).sum(), math.log(3.0)]]  # 1.5 ln 2, ln 3
  np.testing.assert_allclose(L.entropy_from_logits(logits), want, rtol=1e-6)
  masked_vocab = jnp.array([[[0.0, 0.0, -jnp.inf]]])
  np.testing.assert_allclose(L.entropy_from_logits(masked_vocab), [[math.log(2.0)]],
                             rtol=1e-6)
  ent = jnp.array([[1.0, 2.0, 30.0]])
  np.testing.assert_allclose(L.entropy_bonus(ent, jnp.array([[1, 1, 0]], bool)), 1.5)


def test_token_logprobs_and_entropy_values_and_gradient():
  """The fused function (custom gradient) against autodiff of the plain formulas."""
  rng = np.random.default_rng(0)
  z = jnp.asarray(3 * rng.normal(size=(3, 5, 11)), jnp.float32)
  z = z.at[:, :, 9:].set(jnp.finfo(jnp.float32).min)  # a masked vocabulary, as the learner's
  targets = jnp.asarray(rng.integers(0, 9, (3, 5)), jnp.int32)
  g_logp = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  g_ent = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)

  def reference(z):
    logp = jnp.take_along_axis(jax.nn.log_softmax(z, -1), targets[..., None], -1)[..., 0]
    return logp, L.entropy_from_logits(z)

  def objective(fn):
    return lambda z: sum((x * g).sum() for x, g in zip(fn(z), (g_logp, g_ent)))

  fused = lambda z: L.token_logprobs_and_entropy(z, targets)  # noqa: E731
  for got, want in zip(fused(z), reference(z)):
    np.testing.assert_allclose(got, want, atol=1e-6)
  grad = jax.grad(objective(fused))(z)
  np.testing.assert_allclose(grad, jax.grad(objective(reference))(z), atol=1e-5)
  assert np.all(np.asarray(grad)[:, :, 9:] == 0)
  # A -inf logit adds 0 to the entropy and gets a zero (not NaN) gradient.
  z_inf = z.at[0, 0, 8].set(-jnp.inf)
  np.testing.assert_allclose(fused(z_inf)[1], L.entropy_from_logits(z_inf), atol=1e-6)
  grad = jax.grad(objective(fused))(z_inf)
  assert np.all(np.isfinite(grad)) and grad[0, 0, 8] == 0


def test_value_loss_hand_example():
  # clip 0.2. tok0: v 1, old .5, R 0: clipped v .7; max(1, .49) / 2 = 0.5
  #           tok1: v 1, old .5, R 1: clipped v .7; max(0, .09) / 2 = 0.045 (clipped)
  #           tok2: v 2, old 2,  R 3: max(1, 1) / 2 = 0.5;  tok3 masked.
  values = jnp.array([[1.0, 1.0, 2.0, 100.0]])
  old = jnp.array([[0.5, 0.5, 2.0, 0.0]])
  returns = jnp.array([[0.0, 1.0, 3.0, 0.0]])
  mask = jnp.array([[1, 1, 1, 0]], bool)
  loss, m = L.value_loss(values, old, returns, mask, 0.2)
  np.testing.assert_allclose(loss, (0.5 + 0.045 + 0.5) / 3, rtol=1e-5)
  np.testing.assert_allclose(m["vf_clip_frac"], 1 / 3, rtol=1e-6)
  loss, _ = L.value_loss(values, old, returns, mask, 0.2, L.AGG_SEQ_MEAN_TOKEN_SUM_NORM)
  np.testing.assert_allclose(loss, (0.5 + 0.045 + 0.5) / 4, rtol=1e-5)
  loss, _ = L.value_loss(values, old, returns, mask, jnp.inf)  # clipping off
  np.testing.assert_allclose(loss, (0.5 + 0.0 + 0.5) / 3, rtol=1e-5)


# ------------------------------------------------------------------ total, traces


def test_total_loss_hand_example():
  # On-policy, A = 1: pg = -1. k3 with ref = [-.5, .5]: see test above.
  # entropy [1, 2] -> 1.5. values 1, returns [0, 2]: 0.5 each -> 0.5.
  logp = jnp.zeros((1, 2))
  hp = L.LossHParams.create(kl_coef=0.1, kl_kind="k3", entropy_coef=0.01, vf_coef=0.5)
  loss, m = L.total_loss(logp, logp, jnp.array([1.0]), jnp.ones((1, 2), bool), hp,
                         ref_logprobs=jnp.array([[-0.5, 0.5]]),
                         entropy=jnp.array([[1.0, 2.0]]),
                         values=jnp.ones((1, 2)), old_values=jnp.ones((1, 2)),
                         returns=jnp.array([[0.0, 2.0]]))
  k3 = (math.exp(-0.5) - 0.5 + math.exp(0.5) - 1.5) / 2
  want = -1.0 + 0.1 * k3 - 0.01 * 1.5 + 0.5 * 0.5
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose([m["pg_loss"], m["kl"], m["entropy"], m["vf_loss"], m["loss"]],
                             [-1.0, k3, 1.5, 0.5, want], rtol=1e-6)


def test_total_loss_without_optional_terms():
  hp = L.LossHParams.create(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0)
  loss, m = L.total_loss(NEW, OLD, ADV, PMASK, hp)
  np.testing.assert_allclose(loss, HAND_LOSS_DUAL[0], rtol=1e-5)
  assert "kl" not in m and "vf_loss" not in m
  with pytest.raises(ValueError, match="together"):
    L.total_loss(NEW, OLD, ADV, PMASK, hp, values=jnp.zeros((2, 4)))
  with pytest.raises(ValueError, match="agg_mode"):
    L.LossHParams.create(agg_mode="token-sum")


def test_traced_hparams_do_not_recompile():
  traces = []

  @jax.jit
  def step(hp):
    traces.append(1)  # Python side effect: runs once per trace
    return L.total_loss(NEW, OLD, ADV, PMASK, hp)[0]

  for mode in (0, 1, 2):
    hp = L.LossHParams.create(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0, agg_mode=mode)
    np.testing.assert_allclose(step(hp), HAND_LOSS_DUAL[mode], rtol=1e-5)
  hp = L.LossHParams.create(clip_low=0.2, clip_high=0.28, dual_clip_c=0.0, agg_mode=2)
  np.testing.assert_allclose(step(hp), HAND_LOSS_NO_DUAL[2], rtol=1e-5)
  step(L.LossHParams.create(clip_low=0.1, clip_high=0.5, seq_level=1, kl_kind="k1"))
  assert len(traces) == 1

  # The same holds for bare Python scalars passed to a jitted policy_loss.
  traces.clear()

  @jax.jit
  def pl(clip_low, clip_high, dual, mode):
    traces.append(1)
    return L.policy_loss(NEW, OLD, ADV, PMASK, clip_low, clip_high, dual, mode)[0]

  np.testing.assert_allclose(pl(0.2, 0.28, 3.0, 1), HAND_LOSS_DUAL[1], rtol=1e-5)
  np.testing.assert_allclose(pl(0.2, 0.28, 0.0, 0), HAND_LOSS_NO_DUAL[0], rtol=1e-5)
  pl(0.3, 0.1, 2.0, 2)
  assert len(traces) == 1
