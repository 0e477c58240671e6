"""Advantage estimators: pure `jnp` functions from rewards to advantages.

Group layout. The outcome estimators (GRPO, Dr. GRPO, RLOO) take a flat reward vector
`rewards: [N]` with `N = num_groups * group_size`, in which the `group_size`
completions of one prompt are **contiguous**: rows `[g * n, (g + 1) * n)` form group
`g`. This is the order the sampler produces (each prompt repeated `n` times), so
no gather by group id is needed; internally the vector is reshaped to
`[num_groups, group_size]`. `group_size` is a static Python int.

Validity mask. Each outcome estimator takes an optional per-row `mask: [N]` (True =
row kept). Rows dropped by a harness filter do not count in the group's mean / std /
leave-one-out mean and get advantage 0. A group left with one valid row (or none) gets
advantage 0 everywhere: it carries no relative signal.

`gae` is the token-level estimator for PPO with a value head; `whiten` is optional
masked batch normalization applied after any estimator.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple, Union

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

Scalar = Union[float, Float[Array, ""]]


def _grouped(x: Float[Array, "N"], group_size: int) -> Float[Array, "G n"]:
  """Reshapes a contiguous-group vector `[G * n]` into `[G, n]`."""
  if x.ndim != 1:
    raise ValueError(f"expected a flat [num_groups * group_size] vector, got shape {x.shape}")
  if group_size < 1 or x.shape[0] % group_size:
    raise ValueError(f"length {x.shape[0]} is not a multiple of group_size={group_size}")
  return x.reshape(-1, group_size)


def _group_moments(
    rewards: Float[Array, "N"], group_size: int, mask: Optional[Bool[Array, "N"]],
    ddof: int = 0,
) -> Tuple[Float[Array, "G n"], Float[Array, "G n"], Float[Array, "G 1"],
           Float[Array, "G 1"], Float[Array, "G 1"]]:
  """Masked per-group count, mean and variance.

  Returns:
    (r [G, n], m [G, n] as 0/1 floats, count [G, 1], mean [G, 1], var [G, 1]).
  """
  r = _grouped(rewards.astype(jnp.float32), group_size)  # [G, n]
  if mask is None:
    m = jnp.ones_like(r)
  else:
    m = _grouped(mask.astype(jnp.float32), group_size)  # [G, n]
  count = m.sum(-1, keepdims=True)  # [G, 1]
  mean = (r * m).sum(-1, keepdims=True) / jnp.maximum(count, 1.0)  # [G, 1]
  sq = (m * jnp.square(r - mean)).sum(-1, keepdims=True)  # [G, 1]
  var = sq / jnp.maximum(count - ddof, 1.0)  # [G, 1]
  return r, m, count, mean, var


def grpo_advantages(
    rewards: Float[Array, "N"],
    group_size: int,
    mask: Optional[Bool[Array, "N"]] = None,
    eps: Scalar = 1e-6,
    ddof: int = 0,
) -> Float[Array, "N"]:
  """GRPO group-normalized advantages (Shao et al. 2024, DeepSeekMath).

  `A_i = (r_i - mean_group(r)) / (std_group(r) + eps)` over the valid rows of
  each group. A zero-variance ("dead") group gets advantage 0.

  Args:
    rewards: `[N]` scalar rewards, groups contiguous (see module docstring).
    group_size: completions per prompt `n` (static).
    mask: optional `[N]` validity; invalid rows are excluded and get 0.
    eps: added to the std.
    ddof: delta degrees of freedom of the std. 0 = population std (default); 1 =
      the unbiased std that TRL / verl use (`torch.std`).

  Returns:
    `[N]` float32 advantages.
  """
  r, m, count, mean, var = _group_moments(rewards, group_size, mask, ddof)
  adv = (r - mean) / (jnp.sqrt(var) + eps)  # [G, n]
  adv = jnp.where((m > 0) & (count > 1), adv, 0.0)
  return adv.reshape(-1)


def dr_grpo_advantages(
    rewards: Float[Array, "N"],
    group_size: int,
    mask: Optional[Bool[Array, "N"]] = None,
) -> Float[Array, "N"]:
  """Dr. GRPO advantages: `A_i = r_i - mean_group(r)`, no std division.

  Liu et al. 2025 ("Understanding R1-Zero-Like Training") show that dividing by the
  group std up-weights groups that are almost all right or all wrong (a question-level
  difficulty bias); dropping it removes the bias.

  Args:
    rewards: `[N]` scalar rewards, groups contiguous.
    group_size: completions per prompt (static).
    mask: optional `[N]` validity; invalid rows are excluded and get 0.

  Returns:
    `[N]` float32 advantages.
  """
  r, m, count, mean, _ = _group_moments(rewards, group_size, mask)
  adv = jnp.where((m > 0) & (count > 1), r - mean, 0.0)  # [G, n]
  return adv.reshape(-1)


def rloo_advantages(
    rewards: Float[Array, "N"],
    group_size: int,
    mask: Optional[Bool[Array, "N"]] = None,
) -> Float[Array, "N"]:
  """RLOO leave-one-out advantages (Ahmadian et al. 2024, "Back to Basics").

  `A_i = r_i - (1 / (k - 1)) * sum_{j != i} r_j` over the `k` valid rows of the
  group: each sample's baseline is the mean of the others, so it is independent of
  the sample itself (an unbiased REINFORCE baseline). Equals `k / (k - 1) * (r_i - mean)`.

  Args:
    rewards: `[N]` scalar rewards, groups contiguous.
    group_size: completions per prompt (static).
    mask: optional `[N]` validity; invalid rows are excluded and get 0.

  Returns:
    `[N]` float32 advantages.
  """
  r, m, count, _, _ = _group_moments(rewards, group_size, mask)
  total = (r * m).sum(-1, keepdims=True)  # [G, 1]
  loo_mean = (total - r) / jnp.maximum(count - 1.0, 1.0)  # [G, n]
  adv = jnp.where((m > 0) & (count > 1), r - loo_mean, 0.0)
  return adv.reshape(-1)


def gae(
    rewards: Float[Array, "B T"],
    values: Union[Float[Array, "B T"], Float[Array, "B T+1"]],
    mask: Bool[Array, "B T"],
    gamma: Scalar = 1.0,
    lam: Scalar = 1.0,
) -> Tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Generalized advantage estimation (Schulman et al. 2016; used by PPO, 2017).

  `delta_t = r_t + gamma * V_{t+1} - V_t`, `A_t = delta_t + gamma * lam * A_{t+1}`,
  computed right to left with `jax.lax.scan`.

  Masked steps (`mask == False`) are *skipped*, not treated as zero-reward steps: they
  add no reward, no discount, and the value / advantage of the next valid step passes
  through them unchanged. So padding after the end of a sequence contributes nothing,
  and masked tool-output tokens inside a multi-turn sequence are transparent (the last
  model token before a tool call bootstraps from the first model token after it).
  This matches verl's `compute_gae_advantage_return`.

  Args:
    rewards: `[B, T]` per-token rewards (typically the outcome reward on the last valid
      token, minus an optional per-token KL penalty). Ignored where masked.
    values: `[B, T]` value predictions, with bootstrap value 0 after the last valid
      token (terminal episodes), or `[B, T + 1]` whose last column is the bootstrap
      value of the state after the final step (use it for truncated episodes).
    mask: `[B, T]` True on steps that are actions of the policy.
    gamma: discount factor (may be a traced scalar).
    lam: GAE lambda (may be a traced scalar).

  Returns:
    `(advantages [B, T], returns [B, T])`, both 0 where masked; `returns = A + V`
    are the value-function targets.
  """
  b, t = rewards.shape
  values = values.astype(jnp.float32)
  if values.shape == (b, t):
    bootstrap = jnp.zeros((b,), jnp.float32)  # [B]
  elif values.shape == (b, t + 1):
    bootstrap = values[:, t]  # [B]
    values = values[:, :t]  # [B, T]
  else:
    raise ValueError(f"values must be [B, T] or [B, T + 1] for rewards {rewards.shape}, "
                     f"got {values.shape}")
  valid = mask.astype(bool)  # [B, T]

  def step(carry, xs):
    next_value, next_adv = carry  # [B], [B]
    r_t, v_t, m_t = xs  # [B] each
    delta = r_t + gamma * next_value - v_t
    adv_t = delta + gamma * lam * next_adv
    # A masked step leaves the carry untouched, so it is invisible to earlier steps.
    carry = (jnp.where(m_t, v_t, next_value), jnp.where(m_t, adv_t, next_adv))
    return carry, jnp.where(m_t, adv_t, 0.0)

  xs = (rewards.astype(jnp.float32).T, values.T, valid.T)  # time-major [T, B]
  init = (bootstrap, jnp.zeros((b,), jnp.float32))
  _, adv = jax.lax.scan(step, init, xs, reverse=True)  # [T, B]
  adv = adv.T  # [B, T]
  returns = jnp.where(valid, adv + values, 0.0)  # [B, T]
  return adv, returns


def whiten(
    x: Float[Array, "*S"],
    mask: Optional[Bool[Array, "*S"]] = None,
    shift_mean: bool = True,
    eps: Scalar = 1e-8,
) -> Float[Array, "*S"]:
  """Masked whitening: `(x - mean) / sqrt(var + eps)` over the valid entries.

  Optional batch-level normalization of advantages (e.g. after GAE, as in PPO
  implementations; a harness switch after GRPO). Uses the population variance.

  Args:
    x: array of any shape, e.g. `[N]` per-row or `[B, T]` per-token advantages.
    mask: optional validity of the same shape; statistics use only valid entries, and
      invalid entries come back as 0.
    shift_mean: if False, only scale (the mean is added back), so that the sign of
      the advantages is preserved on average.
    eps: added to the variance.

  Returns:
    The whitened array, same shape as `x`, float32.
  """
  x = x.astype(jnp.float32)
  m = jnp.ones_like(x) if mask is None else mask.astype(jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  mean = (x * m).sum() / n
  var = (m * jnp.square(x - mean)).sum() / n
  out = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(m > 0, out, 0.0)


# Outcome-reward estimators by name, for gin / the controller. All share the signature
# `(rewards [N], group_size, mask=None, **kwargs) -> [N]`. GAE needs values and is
# called directly by the PPO learner.
ESTIMATORS: Dict[str, Callable[..., Float[Array, "N"]]] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}
