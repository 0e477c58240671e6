"""Loss terms of the learner: pure functions over token arrays `[B, T]` with a loss mask.

Every term returns a scalar aggregated by `aggregate` (token-mean, seq-mean-token-mean
or seq-mean-token-sum-norm), and the policy and value terms also return metrics. Every
hyper-parameter the evolution controller may mutate -- clip ranges, dual-clip constant,
aggregation mode, token vs sequence importance ratio, KL estimator and coefficient,
entropy and value coefficients -- is accepted as a (traced) array: the choice between
variants is made with `jnp.select` / `jnp.where` over values that are all computed, so
changing it never recompiles the train step. The extra work is a few elementwise ops
on `[B, T]`, negligible next to the model.

Conventions: `mask` is True on tokens the policy generated and is trained on (prompt,
padding and tool-output tokens are False); arrays are upcast to float32; a loss is
something to minimize.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple, Union

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

Scalar = Union[float, Float[Array, ""]]
IntScalar = Union[int, Int[Array, ""]]
Metrics = Dict[str, Float[Array, ""]]

# Loss aggregation modes (traced ints).
AGG_TOKEN_MEAN = 0  # sum over all valid tokens / number of valid tokens (DAPO)
AGG_SEQ_MEAN_TOKEN_MEAN = 1  # mean over sequences of the per-sequence token mean (GRPO)
AGG_SEQ_MEAN_TOKEN_SUM_NORM = 2  # per-sequence token sum / constant length, mean (Dr. GRPO)
AGG_MODES = {"token-mean": AGG_TOKEN_MEAN,
             "seq-mean-token-mean": AGG_SEQ_MEAN_TOKEN_MEAN,
             "seq-mean-token-sum-norm": AGG_SEQ_MEAN_TOKEN_SUM_NORM}

# KL estimators (traced ints), after Schulman, "Approximating KL divergence" (2020).
KL_K1 = 0
KL_K2 = 1
KL_K3 = 2
KL_KINDS = {"k1": KL_K1, "k2": KL_K2, "k3": KL_K3}

# Log importance ratios are clamped before `exp` so one diverged token cannot produce
# inf/NaN; exp(20) ~ 5e8 is far beyond any clip range, so the loss value is unaffected
# wherever the clip or dual clip is active.
MAX_LOG_RATIO = 20.0


def aggregate(
    values: Float[Array, "B T"],
    mask: Bool[Array, "B T"],
    mode: IntScalar = AGG_TOKEN_MEAN,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Float[Array, ""]:
  """Reduces a per-token loss `[B, T]` to a scalar; the mode is a traced int.

  - `AGG_TOKEN_MEAN` (0): `sum_{b,t} m x / sum_{b,t} m`. Every token weighs the same,
    so long sequences are not under-weighted (DAPO, Yu et al. 2025).
  - `AGG_SEQ_MEAN_TOKEN_MEAN` (1): `mean_b (sum_t m x / sum_t m)`, the original GRPO
    objective (Shao et al. 2024).
  - `AGG_SEQ_MEAN_TOKEN_SUM_NORM` (2): `mean_b (sum_t m x / L)` with a constant `L`
    (Dr. GRPO, Liu et al. 2025): no per-sequence length normalization, hence no length
    bias.
  Any other value behaves as mode 2. Sequences without a valid token (rows dropped by
  a filter) do not count in the sequence means.

  Args:
    values: `[B, T]` per-token values.
    mask: `[B, T]` validity.
    mode: one of the `AGG_*` constants; may be a traced int32 scalar.
    norm_length: `L` of mode 2; defaults to `T` (the static padded length). Set it to
      the generation budget to keep it constant across batches.
    num_tokens: overrides the token count of mode 0, e.g. the count over the whole
      batch when this call sees one micro-batch (so micro-batch losses sum to the
      batch loss).
    num_seqs: likewise overrides the sequence count of modes 1 and 2.

  Returns:
    The scalar aggregate (float32).
  """
  m = mask.astype(jnp.float32)  # [B, T]
  x = jnp.where(m > 0, values.astype(jnp.float32), 0.0)  # [B, T]; masked garbage -> 0
  tokens_per_seq = m.sum(-1)  # [B]
  seq_sum = x.sum(-1)  # [B]
  n_tok = m.sum() if num_tokens is None else num_tokens
  n_seq = (tokens_per_seq > 0).sum().astype(jnp.float32) if num_seqs is None else num_seqs
  length = mask.shape[-1] if norm_length is None else norm_length
  token_mean = seq_sum.sum() / jnp.maximum(n_tok, 1.0)
  seq_token_mean = (seq_sum / jnp.maximum(tokens_per_seq, 1.0)).sum() / jnp.maximum(n_seq, 1.0)
  seq_sum_norm = (seq_sum / length).sum() / jnp.maximum(n_seq, 1.0)
  mode = jnp.asarray(mode)
  return jnp.select([mode == AGG_TOKEN_MEAN, mode == AGG_SEQ_MEAN_TOKEN_MEAN],
                    [token_mean, seq_token_mean], seq_sum_norm)


def _token_mean(x: Float[Array, "B T"], m: Float[Array, "B T"]) -> Float[Array, ""]:
  """Masked mean over all tokens, for metrics."""
  return jnp.where(m > 0, x, 0.0).sum() / jnp.maximum(m.sum(), 1.0)


def policy_loss(
    logprobs: Float[Array, "B T"],
    old_logprobs: Float[Array, "B T"],
    advantages: Union[Float[Array, "B"], Float[Array, "B T"]],
    mask: Bool[Array, "B T"],
    clip_low: Scalar = 0.2,
    clip_high: Scalar = 0.2,
    dual_clip_c: Scalar = 0.0,
    agg_mode: IntScalar = AGG_TOKEN_MEAN,
    seq_level: IntScalar = 0,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Tuple[Float[Array, ""], Metrics]:
  """PPO clipped surrogate with clip-higher and dual clip; token or sequence ratio.

  Per token, with `r` the importance ratio and `A` the advantage:
    `l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`  (PPO, Schulman et al. 2017)
  The range is asymmetric (clip-higher, DAPO, Yu et al. 2025): a larger `clip_high` lets
  low-probability tokens with `A > 0` grow further, which counters entropy collapse.
  Dual clip (Ye et al. 2020): for `A < 0` the loss is further bounded by
  `l = min(l, c |A|)`, so a token whose ratio has exploded cannot dominate the update.
  It needs `c > 1`; `dual_clip_c <= 1` (e.g. the default 0) disables it.

  Importance ratio, selected by the traced `seq_level`:
  - 0, token level (PPO / GRPO): `r_t = exp(logp_t - old_t)`.
  - 1, sequence level (GSPO, Zheng et al. 2025): `s_i = exp(mean_t(logp_t - old_t))`
    over the valid tokens of sequence `i`, used in the token-level form GSPO-token:
    `r_t = sg(s_i) * exp(logp_t - sg(logp_t))`. Its value is `s_i` on every token, so
    clipping acts per sequence; its gradient is `s_i * grad logp_t`. With a per-sequence
    advantage and `AGG_SEQ_MEAN_TOKEN_MEAN` this equals sequence-level GSPO in value and
    gradient; it also admits per-token advantages.

  Args:
    logprobs: `[B, T]` log-probs of the sampled tokens under the current policy.
    old_logprobs: `[B, T]` log-probs under the policy that sampled them (constants).
    advantages: `[B]` per-sequence or `[B, T]` per-token advantages.
    mask: `[B, T]` loss mask.
    clip_low: `epsilon_low`; ratios below `1 - clip_low` are clipped.
    clip_high: `epsilon_high`; ratios above `1 + clip_high` are clipped.
    dual_clip_c: dual-clip constant `c` (> 1 to enable; 3 in Ye et al.).
    agg_mode: an `AGG_*` constant, see `aggregate`.
    seq_level: 0 = token ratio (PPO), 1 = sequence ratio (GSPO); traced int or bool.
    norm_length, num_tokens, num_seqs: passed to `aggregate`.

  Returns:
    `(loss, metrics)`; metrics are token-means over the mask: `clip_frac_low` (A < 0 and
    r < 1 - clip_low), `clip_frac_high` (A > 0 and r > 1 + clip_high), `dual_clip_frac`,
    `ratio_mean`, `ratio_min`, `ratio_max` (of the ratio in use: `s_i` under GSPO), and
    `approx_kl`, the k3 estimate of KL(old || new) from the per-token ratio.
  """
  logp = logprobs.astype(jnp.float32)  # [B, T]
  valid = mask.astype(bool)  # [B, T]
  m = valid.astype(jnp.float32)  # [B, T]
  adv = advantages.astype(jnp.float32)
  if adv.ndim == 1:
    adv = adv[:, None]
  adv = jnp.broadcast_to(adv, logp.shape)  # [B, T]

  log_ratio_tok = jnp.where(valid, logp - old_logprobs.astype(jnp.float32), 0.0)  # [B, T]
  # GSPO: length-normalized sequence log-ratio, re-attached to each token's graph.
  seq_len = jnp.maximum(m.sum(-1, keepdims=True), 1.0)  # [B, 1]
  seq_log_ratio = log_ratio_tok.sum(-1, keepdims=True) / seq_len  # [B, 1]
  log_ratio_seq = jax.lax.stop_gradient(seq_log_ratio) + logp - jax.lax.stop_gradient(logp)
  log_ratio = jnp.where(jnp.asarray(seq_level) != 0, log_ratio_seq, log_ratio_tok)
  log_ratio = jnp.where(valid, jnp.clip(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO), 0.0)
  ratio = jnp.exp(log_ratio)  # [B, T]

  lo, hi = 1.0 - clip_low, 1.0 + clip_high
  pg_unclipped = -adv * ratio  # [B, T]
  pg_clipped = -adv * jnp.clip(ratio, lo, hi)  # [B, T]
  pg = jnp.maximum(pg_unclipped, pg_clipped)  # [B, T]
  dual_bound = -adv * dual_clip_c  # [B, T]; = c |A| where A < 0
  dual_active = (dual_clip_c > 1.0) & (adv < 0) & (dual_bound < pg)
  pg = jnp.where(dual_active, dual_bound, pg)
  loss = aggregate(pg, valid, agg_mode, norm_length, num_tokens, num_seqs)

  sg = jax.lax.stop_gradient
  ratio_sg = sg(ratio)
  lr_tok = sg(jnp.clip(log_ratio_tok, -MAX_LOG_RATIO, MAX_LOG_RATIO))
  any_valid = m.sum() > 0
  metrics = {
      "clip_frac_low": _token_mean(((adv < 0) & (ratio_sg < lo)).astype(jnp.float32), m),
      "clip_frac_high": _token_mean(((adv > 0) & (ratio_sg > hi)).astype(jnp.float32), m),
      "dual_clip_frac": _token_mean(sg(dual_active).astype(jnp.float32), m),
      "ratio_mean": _token_mean(ratio_sg, m),
      "ratio_min": jnp.where(any_valid, jnp.where(valid, ratio_sg, jnp.inf).min(), 1.0),
      "ratio_max": jnp.where(any_valid, jnp.where(valid, ratio_sg, -jnp.inf).max(), 1.0),
      "approx_kl": _token_mean(jnp.expm1(lr_tok) - lr_tok, m),  # k3 of KL(old || new)
  }
  return loss, metrics


def gspo_loss(
    logprobs: Float[Array, "B T"],
    old_logprobs: Float[Array, "B T"],
    advantages: Union[Float[Array, "B"], Float[Array, "B T"]],
    mask: Bool[Array, "B T"],
    clip_low: Scalar = 3e-4,
    clip_high: Scalar = 4e-4,
    agg_mode: IntScalar = AGG_SEQ_MEAN_TOKEN_MEAN,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Tuple[Float[Array, ""], Metrics]:
  """GSPO (Zheng et al. 2025): `policy_loss` with the sequence-level ratio, no dual clip.

  Defaults follow the paper: clip range (3e-4, 4e-4) on the length-normalized sequence
  ratio, sequence-mean aggregation. See `policy_loss` for the GSPO-token form used.
  """
  return policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high,
                     dual_clip_c=0.0, agg_mode=agg_mode, seq_level=1,
                     norm_length=norm_length, num_tokens=num_tokens, num_seqs=num_seqs)


def kl_k1(logprobs: Float[Array, "*S"], ref_logprobs: Float[Array, "*S"]) -> Float[Array, "*S"]:
  """k1 = log(pi / pi_ref): unbiased for KL(pi || pi_ref) under samples of pi, high variance."""
  return logprobs - ref_logprobs


def kl_k2(logprobs: Float[Array, "*S"], ref_logprobs: Float[Array, "*S"]) -> Float[Array, "*S"]:
  """k2 = 0.5 (log(pi / pi_ref))^2: biased, low variance, >= 0; its gradient is that of KL."""
  return 0.5 * jnp.square(logprobs - ref_logprobs)


def kl_k3(logprobs: Float[Array, "*S"], ref_logprobs: Float[Array, "*S"]) -> Float[Array, "*S"]:
  """k3 = (rho - 1) - log rho with rho = pi_ref / pi: unbiased, low variance, >= 0.

  The log ratio is clamped to +-MAX_LOG_RATIO before `exp`.
  """
  d = jnp.clip(ref_logprobs - logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  return jnp.expm1(d) - d


def kl_per_token(
    logprobs: Float[Array, "B T"],
    ref_logprobs: Float[Array, "B T"],
    mask: Bool[Array, "B T"],
    kind: IntScalar = KL_K3,
) -> Float[Array, "B T"]:
  """Per-token estimate of KL(pi || pi_ref); `kind` (a `KL_K*`, traced) picks k1/k2/k3.

  Returns:
    `[B, T]` float32, 0 where masked.
  """
  logp = logprobs.astype(jnp.float32)
  ref = ref_logprobs.astype(jnp.float32)
  kind = jnp.asarray(kind)
  kl = jnp.select([kind == KL_K1, kind == KL_K2], [kl_k1(logp, ref), kl_k2(logp, ref)],
                  kl_k3(logp, ref))
  return jnp.where(mask.astype(bool), kl, 0.0)


def kl_penalty(
    logprobs: Float[Array, "B T"],
    ref_logprobs: Float[Array, "B T"],
    mask: Bool[Array, "B T"],
    kind: IntScalar = KL_K3,
    agg_mode: IntScalar = AGG_TOKEN_MEAN,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Float[Array, ""]:
  """KL to a frozen reference as a loss term (GRPO adds `beta * k3`; Shao et al. 2024).

  Multiply by a coefficient and add to the loss. Note that the gradient of k1 as a loss
  is zero in expectation; k3 (GRPO's choice) or k2 give a useful gradient.
  """
  return aggregate(kl_per_token(logprobs, ref_logprobs, mask, kind), mask, agg_mode,
                   norm_length, num_tokens, num_seqs)


def kl_reward_penalty(
    logprobs: Float[Array, "B T"],
    ref_logprobs: Float[Array, "B T"],
    mask: Bool[Array, "B T"],
    coef: Scalar,
    kind: IntScalar = KL_K1,
) -> Float[Array, "B T"]:
  """Per-token `coef * KL` to subtract from token rewards (KL in the reward, as in PPO RLHF).

  Use with `gae` (`rewards - kl_reward_penalty(...)`). Gradient is stopped: a reward
  is a constant of the loss. k1 is the usual choice here (unbiased per-sample return).

  Returns:
    `[B, T]` float32, 0 where masked.
  """
  return jax.lax.stop_gradient(coef * kl_per_token(logprobs, ref_logprobs, mask, kind))


def entropy_from_logits(logits: Float[Array, "B T V"]) -> Float[Array, "B T"]:
  """Entropy of the next-token distribution, `H = logsumexp(z) - sum softmax(z) z`, in float32."""
  z = logits.astype(jnp.float32)  # [B, T, V]
  log_z = jax.nn.logsumexp(z, axis=-1)  # [B, T]
  p = jax.nn.softmax(z, axis=-1)  # [B, T, V]
  # where(): a -inf logit (masked vocabulary entry) has p = 0 and must add 0, not NaN.
  return log_z - jnp.where(p > 0, p * z, 0.0).sum(-1)


@jax.custom_vjp
def token_logprobs_and_entropy(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"],
) -> Tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """`log softmax(z)[target]` and the entropy of `softmax(z)`, float32, with one gradient.

  Same values as `log_softmax` + select and `entropy_from_logits`, computed from shared
  reductions (max, `s = sum e^(z - max)`, `sum e^(z - max) (z - max)`, the target logit);
  the backward pass is the closed form
    dz = g_logp * (onehot - p) - g_ent * p * (log p + H)
  written in one pass over `[B, T, V]` instead of the several that autodiff of the two
  formulas makes (measured on the learner step; the LM head's `[B, N, V]` arrays are
  the largest of the step). Entries with `p = 0` (masked vocabulary, -inf or the
  float32 minimum) get zero gradient and add 0 to the entropy, as in
  `entropy_from_logits`. The target is selected by comparison, not a gather, so a
  vocabulary split over devices needs no all-gather.
  """
  out, _ = _logprobs_entropy_fwd(logits, targets)
  return out


def _logprobs_entropy_fwd(logits, targets):
  z = logits.astype(jnp.float32)  # [B, T, V]
  m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))  # [B, T, 1]
  e = jnp.exp(z - m)
  s = e.sum(-1)  # [B, T]
  log_s = jnp.log(s)
  # where(): a -inf logit has e = 0 and must add 0, not NaN.
  ez = jnp.where(e > 0, e * (z - m), 0.0).sum(-1)  # [B, T]
  hit = jnp.arange(z.shape[-1], dtype=jnp.int32) == targets[..., None]  # [B, T, V]
  z_target = jnp.where(hit, z - m, 0.0).sum(-1)  # [B, T]
  logprobs = z_target - log_s
  entropy = log_s - ez / s
  lse = m[..., 0] + log_s
  return (logprobs, entropy), (logits, targets, lse, entropy)


def _logprobs_entropy_bwd(res, g):
  logits, targets, lse, entropy = res
  g_logp, g_ent = g  # [B, T] each
  z = logits.astype(jnp.float32)
  log_p = z - lse[..., None]  # [B, T, V]
  p = jnp.exp(log_p)
  hit = jnp.arange(z.shape[-1], dtype=jnp.int32) == targets[..., None]
  coef = g_logp[..., None] + g_ent[..., None] * (log_p + entropy[..., None])
  dz = jnp.where(hit, g_logp[..., None], 0.0) - jnp.where(p > 0, p * coef, 0.0)
  return dz.astype(logits.dtype), None


token_logprobs_and_entropy.defvjp(_logprobs_entropy_fwd, _logprobs_entropy_bwd)


def entropy_bonus(
    entropy: Float[Array, "B T"],
    mask: Bool[Array, "B T"],
    agg_mode: IntScalar = AGG_TOKEN_MEAN,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Float[Array, ""]:
  """Aggregated entropy; the loss *subtracts* `entropy_coef *` this to keep exploring."""
  return aggregate(entropy, mask, agg_mode, norm_length, num_tokens, num_seqs)


def value_loss(
    values: Float[Array, "B T"],
    old_values: Float[Array, "B T"],
    returns: Float[Array, "B T"],
    mask: Bool[Array, "B T"],
    clip: Scalar = 0.2,
    agg_mode: IntScalar = AGG_TOKEN_MEAN,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Tuple[Float[Array, ""], Metrics]:
  """PPO clipped value loss: `0.5 max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2)`.

  The clipped term keeps the value head from moving further than `clip` from the
  values seen at rollout time (PPO baselines; Schulman et al. 2017). `clip = inf`
  disables clipping.

  Returns:
    `(loss, metrics)` with `vf_clip_frac` (share of tokens where the clipped error is
    the larger) and `value_mean`, token-means over the mask.
  """
  v = values.astype(jnp.float32)  # [B, T]
  v_old = old_values.astype(jnp.float32)
  ret = returns.astype(jnp.float32)
  v_clipped = v_old + jnp.clip(v - v_old, -clip, clip)  # [B, T]
  err = jnp.square(v - ret)  # [B, T]
  err_clipped = jnp.square(v_clipped - ret)  # [B, T]
  per_token = 0.5 * jnp.maximum(err, err_clipped)
  loss = aggregate(per_token, mask, agg_mode, norm_length, num_tokens, num_seqs)
  m = mask.astype(jnp.float32)
  metrics = {
      "vf_clip_frac": _token_mean(jax.lax.stop_gradient(err_clipped > err).astype(jnp.float32), m),
      "value_mean": _token_mean(jax.lax.stop_gradient(v), m),
  }
  return loss, metrics


class LossHParams(NamedTuple):
  """The mutable scalars of the loss, as arrays (a pytree: pass it into `jit`).

  A controller mutation changes values here, never shapes or dtypes, so the jitted
  train step is not recompiled. Build with `LossHParams.create`.
  """

  clip_low: Float[Array, ""]
  clip_high: Float[Array, ""]
  dual_clip_c: Float[Array, ""]  # <= 1 disables the dual clip
  agg_mode: Int[Array, ""]  # AGG_*
  seq_level: Int[Array, ""]  # 0 = token ratio (PPO/GRPO), 1 = sequence ratio (GSPO)
  kl_coef: Float[Array, ""]
  kl_kind: Int[Array, ""]  # KL_K*
  entropy_coef: Float[Array, ""]
  vf_coef: Float[Array, ""]
  vf_clip: Float[Array, ""]

  @classmethod
  def create(
      cls,
      clip_low: float = 0.2,
      clip_high: float = 0.2,
      dual_clip_c: float = 0.0,
      agg_mode: Union[int, str] = AGG_TOKEN_MEAN,
      seq_level: Union[int, bool] = 0,
      kl_coef: float = 0.0,
      kl_kind: Union[int, str] = KL_K3,
      entropy_coef: float = 0.0,
      vf_coef: float = 0.0,
      vf_clip: float = 0.2,
  ) -> "LossHParams":
    """Converts Python values (names allowed for `agg_mode` / `kl_kind`) to arrays."""
    if isinstance(agg_mode, str):
      if agg_mode not in AGG_MODES:
        raise ValueError(f"agg_mode={agg_mode!r}; expected one of {sorted(AGG_MODES)}")
      agg_mode = AGG_MODES[agg_mode]
    if isinstance(kl_kind, str):
      if kl_kind not in KL_KINDS:
        raise ValueError(f"kl_kind={kl_kind!r}; expected one of {sorted(KL_KINDS)}")
      kl_kind = KL_KINDS[kl_kind]
    f = lambda x: jnp.asarray(x, jnp.float32)
    i = lambda x: jnp.asarray(int(x), jnp.int32)
    return cls(clip_low=f(clip_low), clip_high=f(clip_high), dual_clip_c=f(dual_clip_c),
               agg_mode=i(agg_mode), seq_level=i(seq_level), kl_coef=f(kl_coef),
               kl_kind=i(kl_kind), entropy_coef=f(entropy_coef), vf_coef=f(vf_coef),
               vf_clip=f(vf_clip))


def total_loss(
    logprobs: Float[Array, "B T"],
    old_logprobs: Float[Array, "B T"],
    advantages: Union[Float[Array, "B"], Float[Array, "B T"]],
    mask: Bool[Array, "B T"],
    hparams: LossHParams,
    ref_logprobs: Optional[Float[Array, "B T"]] = None,
    entropy: Optional[Float[Array, "B T"]] = None,
    values: Optional[Float[Array, "B T"]] = None,
    old_values: Optional[Float[Array, "B T"]] = None,
    returns: Optional[Float[Array, "B T"]] = None,
    norm_length: Optional[Scalar] = None, num_tokens: Optional[Scalar] = None,
    num_seqs: Optional[Scalar] = None,
) -> Tuple[Float[Array, ""], Metrics]:
  """`policy + kl_coef * KL - entropy_coef * entropy + vf_coef * value`, one aggregation.

  Terms whose inputs are None are left out (a static choice: GRPO without a reference
  model or value head compiles neither). All terms use `hparams.agg_mode`.

  Args:
    logprobs, old_logprobs, advantages, mask: as in `policy_loss`.
    hparams: the traced coefficients and switches.
    ref_logprobs: `[B, T]` reference-policy log-probs for the KL term.
    entropy: `[B, T]` per-token entropy (e.g. `entropy_from_logits`) for the bonus.
    values, old_values, returns: `[B, T]` for the PPO value loss (all three or none).
    norm_length, num_tokens, num_seqs: passed to `aggregate`.

  Returns:
    `(loss, metrics)`: the policy metrics plus `pg_loss`, `kl`, `entropy`, `vf_loss`
    (those present), `vf_clip_frac`, `value_mean`, and `loss`.
  """
  agg = dict(norm_length=norm_length, num_tokens=num_tokens, num_seqs=num_seqs)
  pg, metrics = policy_loss(logprobs, old_logprobs, advantages, mask, hparams.clip_low,
                            hparams.clip_high, hparams.dual_clip_c, hparams.agg_mode,
                            hparams.seq_level, **agg)
  metrics = dict(metrics, pg_loss=pg)
  loss = pg
  if ref_logprobs is not None:
    kl = kl_penalty(logprobs, ref_logprobs, mask, hparams.kl_kind, hparams.agg_mode, **agg)
    loss = loss + hparams.kl_coef * kl
    metrics["kl"] = kl
  if entropy is not None:
    ent = entropy_bonus(entropy, mask, hparams.agg_mode, **agg)
    loss = loss - hparams.entropy_coef * ent
    metrics["entropy"] = ent
  value_args = (values, old_values, returns)
  if any(a is not None for a in value_args):
    if any(a is None for a in value_args):
      raise ValueError("value loss needs values, old_values and returns together")
    vf, vf_metrics = value_loss(values, old_values, returns, mask, hparams.vf_clip,
                                hparams.agg_mode, **agg)
    loss = loss + hparams.vf_coef * vf
    metrics.update(vf_metrics, vf_loss=vf)
  metrics["loss"] = loss
  return loss, metrics
