"""The jitted train step: teacher-forced log-probs, the PPO/GRPO loss, one optax update.

`completion_logprobs` recomputes, with one full-sequence forward pass, the log-probs the
sampler returned: the LM head runs only on the N positions that predict completion
tokens. `Learner` wires the pure loss (`losses.total_loss`) to the model and an optax
chain, and owns the compiled programs. The train state is explicit (`TrainState`);
every scalar the controller may change (clip ranges, dual clip, aggregation mode,
sequence ratio, KL kind and coefficient, entropy coefficient, learning-rate scale)
enters the step as an array (`StepHParams`), so changing it never recompiles.

Gradient accumulation: a batch of B rows is split into the fewest equal micro-batches of
at most `micro_batch_size` rows (B / micro_batch_size when it divides B), which a
`lax.scan` runs one after another, summing gradients. Each
micro-batch normalizes its loss by the token and sequence counts of the *whole* batch
(`aggregate`'s `num_tokens` / `num_seqs`), so the summed gradient equals the full-batch
gradient in every aggregation mode.

Partial training (`Learner.trainable_layers`): the step differentiates w.r.t. the
trainable subset only (`trainable.TrainableSet`) and the optimizer state covers that
subset; the train state still holds every parameter.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Dict, NamedTuple, Optional, Tuple

import flax.struct
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Float

from evotrainer.learner import losses
from evotrainer.learner.losses import LossHParams
from evotrainer.learner.trainable import TrainableSet, merge
from evotrainer.model.transformer import Transformer, attention_mask, head_logits
from evotrainer.sharding.mesh import opt_state_shardings, shard_batch, state_shardings
from evotrainer.sharding.rules import LEARNER_RULES, constrain, use_rules
from evotrainer.types import TrainBatch

Metrics = Dict[str, Float[Array, ""]]


def completion_logprobs(
    model: Transformer, batch: TrainBatch, *, vocab_limit: Optional[int] = None,
    with_entropy: bool = False, temperature: Optional[Float[Array, ""]] = None,
    chunk: Optional[int] = None,
) -> Tuple[Float[Array, "B N"], Optional[Float[Array, "B N"]]]:
  """Log-probs (and entropies) of the completion tokens under `model`, teacher-forced.

  The sequence is the sampler's layout, `concat(prompt, completion)` `[B, P + N]`.
  Valid slots are the prompt's last `prompt_lengths` slots and the first
  `completion_lengths` completion slots (all N when `completion_lengths` is None): the
  tokens after a stop are padding. RoPE positions count valid slots only, so a row's
  completion token j sits at position `prompt_length + j`, exactly where the sampler
  decoded it. Padding after the stop comes after every real token, so causal attention
  keeps it from changing any real token's log-prob; marking it invalid only zeroes the
  outputs there (as the sampler does). The prediction of completion token j is read
  at slot `P - 1 + j`, and the LM head runs on those N slots only.

  Args:
    model: the policy (or reference) decoder.
    batch: a `TrainBatch` (only the token and length fields are read).
    vocab_limit: ids >= this get probability 0, as in `Sampler(vocab_limit=...)`, so the
      log-probs are normalized over the same vocabulary as the sampler's.
    with_entropy: also return the entropy of each predicted distribution.
    temperature: the sampling temperature T (a traced scalar; None = 1): the log-probs
      are those of softmax(logits / T), the distribution the sampler drew from, so the
      PPO ratio of the first on-policy update is exactly 1 at any temperature.
    chunk: when set and below N, the LM head and the log-prob / entropy reductions run
      over `chunk` completion slots at a time under `jax.checkpoint`, so neither pass
      holds the `[B, N, V]` float32 logits: the forward keeps one `[B, chunk, V]` block
      and the backward recomputes each block from the hidden states (same values).

  Returns:
    `logprobs` `[B, N]` float32 (0 after the end) and `entropy` `[B, N]` float32
    (0 after the end) or None. Equal to the sampler's log-probs at the same temperature.
  """
  prompt = jnp.asarray(batch.prompt_tokens, jnp.int32)  # [B, P]
  completion = jnp.asarray(batch.completion_tokens, jnp.int32)  # [B, N]
  b, p = prompt.shape
  n = completion.shape[1]
  prompt_valid = jnp.arange(p)[None, :] >= (p - jnp.asarray(batch.prompt_lengths))[:, None]
  if batch.completion_lengths is None:
    completion_valid = jnp.ones((b, n), bool)
  else:
    completion_valid = jnp.arange(n)[None, :] < jnp.asarray(batch.completion_lengths)[:, None]
  tokens = jnp.concatenate([prompt, completion], axis=1)  # [B, P + N]
  valid = jnp.concatenate([prompt_valid, completion_valid], axis=1)  # [B, P + N]
  positions = jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
  slots = jnp.broadcast_to(jnp.arange(p + n), (b, p + n))
  mask = attention_mask(valid, valid, slots, slots)  # [B, P + N, P + N]
  # The last layer runs its queries only on the N slots that predict completion tokens.
  hidden, _ = model(tokens, positions, mask, query_slice=(p - 1, p + n - 1))  # [B, N, E]
  head = functools.partial(_head_logprobs, tied=model.config.tie_embeddings,
                           vocab_limit=vocab_limit, with_entropy=with_entropy)
  w = model.head_weight()
  if chunk is None or chunk >= n:
    logprobs, entropy = head(hidden, completion, w, temperature)
  else:
    k = -(-n // chunk)  # blocks; the last one padded
    pad = k * chunk - n
    blocks = lambda x: jnp.moveaxis(  # [B, N, ...] -> [k, B, chunk, ...]
        jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)).reshape(
            (b, k, chunk) + x.shape[2:]), 1, 0)
    step = jax.checkpoint(lambda hc, tc: head(hc, tc, w, temperature))
    logprobs, entropy = jax.lax.map(lambda a: step(*a), (blocks(hidden), blocks(completion)))
    unblock = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, k * chunk)[:, :n]
    logprobs = unblock(logprobs)
    entropy = None if entropy is None else unblock(entropy)
  if entropy is not None:
    entropy = jnp.where(completion_valid, entropy, 0.0)
  logprobs = jnp.where(completion_valid, logprobs, 0.0)
  return logprobs, entropy


def _head_logprobs(hidden, targets, w, temperature, *, tied, vocab_limit, with_entropy):
  """LM head and the target's log-prob (and entropy) for hidden states `[B, C, E]`."""
  logits = head_logits(hidden, w, tied)  # [B, C, V] float32
  if temperature is not None:
    # Scaled before the vocabulary mask: the mask value divided by T < 1 would be -inf.
    logits = logits / jnp.asarray(temperature, logits.dtype)
  v = logits.shape[-1]
  vocab = jnp.arange(v, dtype=jnp.int32)
  if vocab_limit is not None and vocab_limit < v:
    # Same masking value as the sampler: finite, so 0 * it stays 0 (no NaN).
    logits = jnp.where(vocab < vocab_limit, logits, jnp.finfo(jnp.float32).min)
  if with_entropy:
    # One set of reductions and a one-pass backward for both (the train step's path).
    return losses.token_logprobs_and_entropy(logits, targets)  # [B, C] each
  logp_all = jax.nn.log_softmax(logits, axis=-1)  # [B, C, V]
  # Select with a comparison rather than a gather: with the vocabulary split over the
  # `tensor` axis this is a local select plus a sum, not an all-gather of the logits.
  hit = vocab[None, None, :] == targets[:, :, None]  # [B, C, V]
  return jnp.where(hit, logp_all, 0.0).sum(-1), None  # [B, C]


@flax.struct.dataclass
class TrainState:
  """Everything the learner updates, as one donated pytree."""

  step: jax.Array  # [] int32: optimizer updates applied so far (drives the lr schedule)
  params: nnx.State  # all the policy's parameters, sharded by LEARNER_RULES under a mesh
  opt_state: optax.OptState  # optax state of `Learner.tx` for the trainable parameters
  # only (`Learner.trainable`), sharded like them


class StepHParams(NamedTuple):
  """The traced knobs of one step: the loss's, a multiplier on the learning rate and the
  temperature the batch was sampled at."""

  loss: LossHParams
  lr_scale: Float[Array, ""]  # multiplies the scheduled learning rate; 0 freezes params
  temperature: Float[Array, ""]  # the sampling temperature: log-probs of softmax(z / T)


def _split_micro(x: jax.Array, num_micro: int) -> jax.Array:
  """`[B, ...]` -> `[M, B / M, ...]`, micro-batch k holding rows k, k + M, k + 2M, ...

  Strided rather than contiguous: with rows split over devices in contiguous blocks,
  every device then holds an equal share of every micro-batch (no idle devices).
  """
  mb = x.shape[0] // num_micro
  x = x.reshape((mb, num_micro) + x.shape[1:]).swapaxes(0, 1)
  return constrain(x, (None, "batch") + (None,) * (x.ndim - 2))


def _merge_micro(x: jax.Array) -> jax.Array:
  """Inverse of `_split_micro`: `[M, B / M, ...]` -> `[B, ...]`."""
  return x.swapaxes(0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _combine_metrics(ms: Metrics, tokens: jax.Array, total_tokens: jax.Array) -> Metrics:
  """Per-micro-batch metrics `[M]` -> batch metrics.

  Loss terms are already normalized by whole-batch counts and add up; token means are
  weighted by each micro-batch's token share; ratio extremes take min / max over the
  micro-batches that have tokens.
  """
  has = tokens > 0
  weights = tokens / jnp.maximum(total_tokens, 1.0)
  out = {}
  for k, v in ms.items():
    if k in ("loss", "pg_loss", "kl", "entropy", "vf_loss"):
      out[k] = v.sum()
    elif k == "ratio_min":
      out[k] = jnp.where(has.any(), jnp.where(has, v, jnp.inf).min(), 1.0)
    elif k == "ratio_max":
      out[k] = jnp.where(has.any(), jnp.where(has, v, -jnp.inf).max(), 1.0)
    else:
      out[k] = (v * weights).sum()
  return out


_BATCH_DTYPES = dict(prompt_tokens=np.int32, prompt_lengths=np.int32,
                     completion_tokens=np.int32, loss_mask=np.bool_,
                     advantages=np.float32, old_logprobs=np.float32,
                     ref_logprobs=np.float32, completion_lengths=np.int32)


# Trimmed prompt widths are rounded up to a multiple of this (few compiled shapes).
PROMPT_WIDTH_MULTIPLE = 16


def trim_prompt_padding(batch: TrainBatch,
                        multiple: int = PROMPT_WIDTH_MULTIPLE) -> TrainBatch:
  """The batch without the leading prompt columns that are padding in every row (the
  width kept is the longest prompt rounded up to `multiple`, at most the old width).

  Why: the sampler pads prompts to a bucket (128 for 65-token chat prompts), and every
  padding column costs the learner a full forward and backward per row. The log-probs
  do not change: padding slots are masked out of attention and RoPE positions count
  valid slots only (`completion_logprobs`).
  """
  p = batch.prompt_tokens.shape[1]
  longest = int(np.max(np.asarray(batch.prompt_lengths)))
  width = min(p, -(-longest // multiple) * multiple)
  if width == p:
    return batch
  return batch.replace(prompt_tokens=np.asarray(batch.prompt_tokens)[:, p - width:])


def _canonical_batch(batch: TrainBatch) -> TrainBatch:
  """Fixed dtypes, so int64 numpy input does not compile a second program."""
  fields = {}
  for name, dtype in _BATCH_DTYPES.items():
    x = getattr(batch, name)
    if x is not None:
      x = x.astype(dtype) if isinstance(x, jax.Array) else np.asarray(x, dtype)
    fields[name] = x
  return TrainBatch(**fields)


def _check_knobs(learning_rate, warmup_steps, total_steps, logprob_chunk,
                 micro_batch_size) -> None:
  """Learner's knobs that are wrong before any step: a ValueError naming the knob."""
  if learning_rate < 0:
    raise ValueError(f"Learner.learning_rate must be >= 0, got {learning_rate}")
  if warmup_steps < 0:
    raise ValueError(f"Learner.warmup_steps must be >= 0, got {warmup_steps}")
  if total_steps is not None and total_steps <= warmup_steps:
    raise ValueError(f"Learner.total_steps={total_steps} must exceed "
                     f"warmup_steps={warmup_steps} (or be None for a constant rate)")
  if logprob_chunk is not None and logprob_chunk < 1:
    raise ValueError(f"Learner.logprob_chunk must be >= 1 or None, got {logprob_chunk}")
  if micro_batch_size is not None and micro_batch_size < 1:
    raise ValueError(f"Learner.micro_batch_size must be >= 1 or None, got {micro_batch_size}")


@gin.configurable(module="learner", denylist=["model", "mesh", "vocab_limit"])
class Learner:
  """Optimizer, schedule and the compiled step for one policy model.

  Usage:
    learner = Learner(model, mesh=mesh, learning_rate=1e-6, micro_batch_size=8)
    state = learner.init_state(nnx.state(model))
    hp = learner.hparams(clip_high=0.3)          # arrays; mutate freely
    state, metrics = learner.step(state, batch, hp)

  The optimizer is `clip_by_global_norm(max_grad_norm) -> adamw(schedule)`; the
  update is then multiplied by the traced `lr_scale` inside the step, which scales the
  effective learning rate (weight decay included, as in adamw) without recompiling.
  Adam's moments are updated even when `lr_scale` is 0.

  Schedule: linear warm-up from `learning_rate / warmup_steps` to `learning_rate` over
  `warmup_steps` updates, then constant when `total_steps` is None, else a cosine decay
  to `end_lr_fraction * learning_rate` at `total_steps` (held there afterwards).

  Static choices (each a separate compiled program, chosen once per run): the batch
  shape, the micro-batch size, whether the batch carries `ref_logprobs` (the KL term)
  and `completion_lengths`, and `compute_entropy`. A run with a reference model should
  always pass `ref_logprobs`, so that `kl_coef` can move (from 0 too) without a compile;
  likewise entropy is computed by default so that `entropy_coef` can move.

  Args:
    model: the policy; only its structure (graphdef, parameter shapes and logical axes)
      is kept, the parameters enter through `init_state`.
    mesh: a `('data', 'fsdp', 'tensor')` mesh; None runs on the default device.
    learning_rate: peak learning rate.
    warmup_steps: linear warm-up length (0: none).
    total_steps: cosine decay horizon; None keeps the rate constant after warm-up.
    end_lr_fraction: final rate of the cosine, as a fraction of `learning_rate`.
    weight_decay: adamw's decoupled weight decay.
    b1, b2, eps: Adam's constants.
    max_grad_norm: global-norm clip of the gradient; None disables it.
    micro_batch_size: most rows per gradient-accumulation micro-batch: the batch splits
      into the fewest equal micro-batches of at most this many rows; None = whole batch.
    vocab_limit: ids >= this are masked out of the softmax (as in the sampler).
    norm_length: the constant `L` of seq-mean-token-sum-norm (default: N).
    compute_entropy: compute the per-token entropy (metric and entropy bonus).
    logprob_chunk: completion slots per block of the LM head and log-prob reductions
      (`completion_logprobs(chunk=...)`); None: one block. With a large vocabulary this
      bounds the `[rows, slots, V]` float32 logits the step holds (bench/learner_memory.py).
    trainable_layers: train only the top K blocks (and, with `train_head`, the final
      norm and an untied LM head); the embeddings and the blocks below are frozen: no
      gradient is computed for them and the optimizer keeps no state for them
      (`trainable.TrainableSet`). None trains every parameter.
    train_head: with `trainable_layers`, also train the final norm (and untied head).
    clip_low, clip_high, dual_clip_c, agg_mode, seq_level, kl_coef, kl_kind,
      entropy_coef: defaults of `hparams()`, see `losses.LossHParams.create`.
  """

  def __init__(
      self,
      model: Transformer,
      mesh: Optional[Mesh] = None,
      *,
      learning_rate: float = 1e-5,
      warmup_steps: int = 0,
      total_steps: Optional[int] = None,
      end_lr_fraction: float = 0.0,
      weight_decay: float = 0.0,
      b1: float = 0.9,
      b2: float = 0.999,
      eps: float = 1e-8,
      max_grad_norm: Optional[float] = 1.0,
      micro_batch_size: Optional[int] = None,
      vocab_limit: Optional[int] = None,
      norm_length: Optional[int] = None,
      compute_entropy: bool = True,
      logprob_chunk: Optional[int] = None,
      trainable_layers: Optional[int] = None,
      train_head: bool = True,
      clip_low: float = 0.2,
      clip_high: float = 0.28,
      dual_clip_c: float = 0.0,
      agg_mode: Any = "token-mean",
      seq_level: int = 0,
      kl_coef: float = 0.0,
      kl_kind: Any = "k3",
      entropy_coef: float = 0.0,
  ):
    _check_knobs(learning_rate, warmup_steps, total_steps, logprob_chunk, micro_batch_size)
    self.graphdef, params = nnx.split(model)
    abstract_params = jax.eval_shape(lambda s: s, params)  # keep no reference to the values
    del params
    self.config = model.config
    self.trainable = TrainableSet.for_config(model.config, trainable_layers, train_head)
    abstract_train = self.trainable.split(abstract_params)[0]
    self.mesh = mesh
    self.rules = LEARNER_RULES
    self.micro_batch_size = micro_batch_size
    self.logprob_chunk = logprob_chunk
    self.vocab_limit = vocab_limit
    self.norm_length = norm_length
    self.compute_entropy = compute_entropy
    self._default_hparams = dict(
        clip_low=clip_low, clip_high=clip_high, dual_clip_c=dual_clip_c, agg_mode=agg_mode,
        seq_level=seq_level, kl_coef=kl_coef, kl_kind=kl_kind, entropy_coef=entropy_coef)
    # Validates agg_mode / kl_kind now, not at the first step; fixes the hparam dtypes.
    self._hparam_dtypes = jax.tree.map(lambda x: x.dtype, self.hparams())

    self.schedule = _schedule(learning_rate, warmup_steps, total_steps, end_lr_fraction)
    parts = [] if max_grad_norm is None else [optax.clip_by_global_norm(max_grad_norm)]
    parts.append(optax.adamw(self.schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    self.tx = optax.chain(*parts)

    self.param_shardings, self.state_shardings = self._shardings(abstract_params,
                                                                 abstract_train)
    out_sh = None if mesh is None else (self.state_shardings, NamedSharding(mesh, PartitionSpec()))
    jit_kw = {} if mesh is None else dict(out_shardings=out_sh)
    self._step_fn = jax.jit(self._step, donate_argnums=(0,), **jit_kw)
    self._logprobs_fn = jax.jit(self._logprobs)
    self._init_fn = jax.jit(self._init, **({} if mesh is None else
                                           dict(out_shardings=self.state_shardings)))

  def _shardings(self, abstract_params, abstract_train) -> tuple:
    """(params, TrainState) shardings under the learner rules; (None, None) without a
    mesh. The Adam moments follow their parameters' layout."""
    if self.mesh is None:
      return None, None
    params = state_shardings(abstract_params, self.mesh, self.rules)
    abstract_opt = jax.eval_shape(self.tx.init, abstract_train)
    opt = opt_state_shardings(self.tx, abstract_opt, self.trainable.split(params)[0],
                              self.mesh)
    return params, TrainState(step=NamedSharding(self.mesh, PartitionSpec()), params=params,
                              opt_state=opt)

  # ---- state and hyper-parameters -------------------------------------------------

  def init_state(self, params: nnx.State) -> TrainState:
    """A fresh TrainState (step 0, zeroed Adam moments) holding a *copy* of `params`.

    The copy is placed by the learner rules under a mesh; `params` (e.g.
    `nnx.state(model)`) stays valid, since the step donates the state it is given.
    """
    if self.mesh is not None:
      params = jax.device_put(params, self.param_shardings)  # e.g. from the sampler layout
    return self._run(self._init_fn, params)

  def _init(self, params: nnx.State) -> TrainState:
    params = jax.tree.map(jnp.copy, params)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=self.tx.init(self.trainable.split(params)[0]))

  def hparams(self, **overrides) -> StepHParams:
    """The traced knobs: constructor defaults, `overrides` applied (plus `lr_scale`).

    Keys: the fields of `LossHParams.create` (names allowed for `agg_mode` and
    `kl_kind`), `lr_scale` (default 1.0) and `temperature` (the sampling temperature of
    the batches, default 1.0; the learner's log-probs are those of softmax(logits / T)).
    """
    lr_scale = overrides.pop("lr_scale", 1.0)
    temperature = overrides.pop("temperature", 1.0)
    if not temperature > 0:
      raise ValueError(f"Learner.hparams: temperature must be > 0, got {temperature}")
    known = set(LossHParams._fields)
    unknown = set(overrides) - known
    if unknown:
      raise ValueError(f"Learner.hparams: unknown {sorted(unknown)}; expected some of "
                       f"{sorted(known | {'lr_scale', 'temperature'})}")
    loss_hp = LossHParams.create(**{**self._default_hparams, **overrides})
    return StepHParams(loss=loss_hp, lr_scale=jnp.asarray(lr_scale, jnp.float32),
                       temperature=jnp.asarray(temperature, jnp.float32))

  @property
  def kl_coef(self) -> float:
    """The constructor's KL coefficient: a run whose value is > 0 computes reference
    log-probs for every batch (`reference_logprobs`)."""
    return float(self._default_hparams["kl_coef"])

  def compiled_programs(self) -> int:
    """Number of train-step programs compiled so far (for tests and logging)."""
    return self._step_fn._cache_size()

  # ---- public entry points ----------------------------------------------------------

  def step(self, state: TrainState, batch: TrainBatch,
           hparams: StepHParams) -> Tuple[TrainState, Metrics]:
    """One optimizer update on `batch`; `state` is donated (do not reuse it).

    Returns:
      The new state and scalar metrics: `loss`, `pg_loss`, `clip_frac_low`,
      `clip_frac_high`, `dual_clip_frac`, `approx_kl` (k3 of KL(old || new)),
      `ratio_mean` / `ratio_min` / `ratio_max`, `entropy` (when computed), `kl` (to the
      reference, when the batch has `ref_logprobs`), `grad_norm` (before clipping),
      `lr` (the rate applied, `lr_scale` included), `num_tokens`.
    """
    if not isinstance(hparams, StepHParams):
      raise TypeError(f"Learner.step: hparams must be a StepHParams (from "
                      f"Learner.hparams()), got {type(hparams).__name__}")
    # Canonical dtypes: a Python float or an int64 array would compile a new program.
    hparams = jax.tree.map(lambda x, d: jnp.asarray(x, d), hparams, self._hparam_dtypes)
    batch = self._place(batch)
    self._num_micro(batch.batch_size)  # a clear error before tracing
    return self._run(self._step_fn, state, batch, hparams)

  def reference_logprobs(self, ref_params: nnx.State, batch: TrainBatch,
                         temperature: float = 1.0) -> Float[Array, "B N"]:
    """`[B, N]` log-probs of the completions under `ref_params` (frozen reference, or
    any parameters of this model, e.g. the current ones for the behaviour log-probs of
    a batch) at `temperature`, micro-batched like the step. 0 after the end."""
    if self.mesh is not None:
      ref_params = jax.device_put(ref_params, self.param_shardings)
    return self._run(self._logprobs_fn, ref_params, self._place(batch),
                     jnp.asarray(temperature, jnp.float32))

  # ---- traced code ------------------------------------------------------------------

  def _run(self, fn, *args):
    if self.mesh is None:
      return fn(*args)
    with jax.set_mesh(self.mesh):
      return fn(*args)

  def _rules(self):
    return use_rules(self.rules) if self.mesh is not None else contextlib.nullcontext()

  def _place(self, batch: TrainBatch) -> TrainBatch:
    batch = _canonical_batch(trim_prompt_padding(batch))
    if self.mesh is None:
      return jax.tree.map(jnp.asarray, batch)
    return shard_batch(batch, self.mesh, self.rules)

  def _num_micro(self, b: int) -> int:
    """The fewest equal micro-batches of at most `micro_batch_size` rows that `b` splits
    into (12 rows at most 8: two of 6; a prime b above it: b of one row)."""
    mb = self.micro_batch_size or b
    return next(m for m in range(-(-b // mb), b + 1) if b % m == 0)

  def _logprobs(self, params: nnx.State, batch: TrainBatch,
                temperature: jax.Array) -> jax.Array:
    with self._rules():
      model = nnx.merge(self.graphdef, params)
      m = self._num_micro(batch.batch_size)
      micro = jax.tree.map(lambda x: _split_micro(x, m), batch)
      logp = jax.lax.map(
          lambda mb: completion_logprobs(model, mb, vocab_limit=self.vocab_limit,
                                         temperature=temperature,
                                         chunk=self.logprob_chunk)[0], micro)
      return _merge_micro(logp)  # [B, N]

  def _step(self, state: TrainState, batch: TrainBatch,
            hparams: StepHParams) -> Tuple[TrainState, Metrics]:
    with self._rules():
      m = self._num_micro(batch.batch_size)
      mask = batch.loss_mask.astype(bool)  # [B, N]
      tokens_per_seq = mask.sum(-1)  # [B]
      num_tokens = tokens_per_seq.sum().astype(jnp.float32)
      num_seqs = (tokens_per_seq > 0).sum().astype(jnp.float32)

      # Gradients w.r.t. the trainable part only: the frozen part enters as a constant,
      # so the backward pass never reaches the blocks below the trainable ones.
      train, frozen = self.trainable.split(state.params)

      def loss_fn(train_params, mb: TrainBatch):
        model = nnx.merge(self.graphdef, train_params, frozen)
        logp, ent = completion_logprobs(model, mb, vocab_limit=self.vocab_limit,
                                        with_entropy=self.compute_entropy,
                                        temperature=hparams.temperature,
                                        chunk=self.logprob_chunk)
        return losses.total_loss(
            logp, mb.old_logprobs, mb.advantages, mb.loss_mask, hparams.loss,
            ref_logprobs=mb.ref_logprobs, entropy=ent, norm_length=self.norm_length,
            num_tokens=num_tokens, num_seqs=num_seqs)

      grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

      def accumulate(grads, mb: TrainBatch):
        (_, metrics), g = grad_fn(train, mb)
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return grads, (metrics, mb.loss_mask.astype(jnp.float32).sum())

      zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), train)
      micro = jax.tree.map(lambda x: _split_micro(x, m), batch)
      grads, (per_micro, micro_tokens) = jax.lax.scan(accumulate, zeros, micro)
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, train)
      metrics = _combine_metrics(per_micro, micro_tokens, num_tokens)

      grad_norm = optax.tree.norm(grads)
      updates, opt_state = self.tx.update(grads, state.opt_state, train)
      scale = hparams.lr_scale
      updates = jax.tree.map(lambda u: (u * scale).astype(u.dtype), updates)
      params = merge(optax.apply_updates(train, updates), frozen)
      metrics.update(grad_norm=grad_norm, lr=self.schedule(state.step) * scale,
                     num_tokens=num_tokens)
      new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
      return new_state, metrics


def _schedule(lr: float, warmup: int, total: Optional[int], end_fraction: float):
  """Step -> learning rate (see `Learner`). Pure jnp, evaluated inside the step."""

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    rate = jnp.asarray(lr, jnp.float32)
    if warmup > 0:
      rate = rate * jnp.minimum(1.0, (count + 1.0) / warmup)
    if total is not None:
      frac = jnp.clip((count - warmup) / (total - warmup), 0.0, 1.0)
      cosine = 0.5 * (1.0 + jnp.cos(math.pi * frac))
      rate = rate * (end_fraction + (1.0 - end_fraction) * cosine)
    return rate

  return schedule
