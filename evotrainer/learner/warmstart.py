"""Supervised warm start: a short, cached run of next-token training on solved examples.

A model trained from scratch answers at chance, and RL from a policy that is never right
gets no signal (every group of samples scores 0). So before RL the tiny CPU model is
trained for a *fixed, small* number of steps on `prompt -> solution` pairs of the task,
the loss on the completion tokens only (the prompt is context, as in RL). The budget is
deliberately short: the policy should be right some of the time, not always, leaving
the RL phase a measurable gap to close on the held-out split.

Each example is laid out exactly as the sampler and the learner see a rollout: the
prompt `bos + encode(format_prompt(p))`, left-padded, then the completion
`encode(p.solution) + eos`, right-padded; log-probs come from the learner's
`completion_logprobs` (same RoPE positions, same vocabulary limit as the sampler). A
multi-turn task (`task.solution_segments(p)`, e.g. SWE's oracle episodes) gives the
completion as segments: each model turn `encode(turn) + eos`, each observation
`encode(observation)` between them, as the multi-turn engine lays an episode out; the
observations are masked out of the loss. Rows of very different lengths (episodes) can be
trained in length buckets (`bucket_width`: the prompt packed into the row, the same
log-probs, a batch padded to its bucket) and cut to a prefix (`max_tokens`); a
multi-turn task can stop on the share of sampled first turns that parse as a tool call
(`target_validity`), the single-turn one on sampled accuracy (`target_accuracy`).

The result is cached under `cache_dir`, keyed by a hash of everything it depends on: the
model config and its initial parameters, the tokenizer, every training token, and the
optimizer settings. A later run with the same inputs loads it (`checkpoint.save_model`
/ `restore_params_into`) instead of training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float

from evotrainer import checkpoint
from evotrainer.console import progress_bar
from evotrainer.learner import losses
from evotrainer.learner.step import completion_logprobs
from evotrainer.learner.trainable import TrainableSet, merge
from evotrainer.model.transformer import Transformer
from evotrainer.sharding.mesh import opt_state_shardings, shard_batch, state_shardings
from evotrainer.sharding.multihost import all_true, broadcast_json, is_primary, to_host
from evotrainer.sharding.rules import LEARNER_RULES, Rules, use_rules
from evotrainer.tasks.base import Problem
from evotrainer.tokenizers import Tokenizer
from evotrainer.types import TrainBatch

log = logging.getLogger(__name__)

# Bumped whenever the training recipe changes, so that old cache entries are not reused.
_RECIPE_VERSION = 1
_DEFAULT_CACHE_DIR = "~/.cache/evotrainer/warmstart"
# The temperature the stop checks (`target_accuracy`, `target_validity`) sample at: the
# model's own distribution, which is also what RL samples from by default
# (`SamplingParams.temperature`), so a target is met by the policy RL starts from.
CHECK_TEMPERATURE = 1.0


# ------------------------------------------------------------------ data


Segments = Sequence[tuple[str, bool]]


def _completion_row(tokenizer: Tokenizer, solution: str | Segments) -> tuple[list, list]:
  """(ids, trained) of one solution: a text (+ eos, all trained), or (text, trained)
  segments, each encoded on its own as the multi-turn engine does, a trained segment (a
  model turn) followed by eos, an untrained one (an observation) masked."""
  if isinstance(solution, str):
    solution = [(solution, True)]
  ids, trained = [], []
  for text, is_model in solution:
    seg = tokenizer.encode(text) + ([tokenizer.eos_id] if is_model else [])
    ids += seg
    trained += [bool(is_model)] * len(seg)
  return ids, trained


def solution_batch(tokenizer: Tokenizer, prompts: Sequence[str],
                   solutions: Sequence[str | Segments]) -> TrainBatch:
  """Prompt/solution pairs in the rollout layout, padded to the longest of each.

  A solution is a text, or a multi-turn episode as (text, trained) segments (see
  `_completion_row`: model turns each end with eos; observations are masked).

  Returns:
    A `TrainBatch` with prompt_tokens [B, P] (bos + prompt, left-padded),
    completion_tokens [B, N] (solution + eos, right-padded), completion_lengths [B],
    loss_mask [B, N] (the trained completion tokens); advantages and old_logprobs are
    zeros.
  """
  if len(prompts) != len(solutions):
    raise ValueError(f"{len(prompts)} prompts but {len(solutions)} solutions")
  if tokenizer.bos_id is None:
    rows_p = [tokenizer.encode(t) for t in prompts]
  else:
    rows_p = [[tokenizer.bos_id] + tokenizer.encode(t) for t in prompts]
  rows = [_completion_row(tokenizer, s) for s in solutions]
  rows_c = [ids for ids, _ in rows]
  b = len(rows_p)
  p = max(len(r) for r in rows_p)
  n = max(len(r) for r in rows_c)
  prompt = np.full((b, p), tokenizer.pad_id, np.int32)
  completion = np.full((b, n), tokenizer.pad_id, np.int32)
  for i, (rp, rc) in enumerate(zip(rows_p, rows_c)):
    if not rp:
      raise ValueError(f"prompt {i} encodes to no tokens: {prompts[i]!r}")
    prompt[i, p - len(rp):] = rp
    completion[i, :len(rc)] = rc
  lengths_c = np.asarray([len(r) for r in rows_c], np.int32)
  mask = np.zeros((b, n), bool)
  for i, (_, trained) in enumerate(rows):
    mask[i, :len(trained)] = trained
  return TrainBatch(prompt_tokens=prompt,
                    prompt_lengths=np.asarray([len(r) for r in rows_p], np.int32),
                    completion_tokens=completion, loss_mask=mask,
                    advantages=np.zeros((b,), np.float32),
                    old_logprobs=np.zeros((b, n), np.float32),
                    completion_lengths=lengths_c)


def _rows(batch: TrainBatch, idx: np.ndarray) -> TrainBatch:
  return jax.tree.map(lambda x: None if x is None else x[idx], batch)


def pack_prompts(batch: TrainBatch, pad_id: int,
                 max_tokens: Optional[int] = None) -> TrainBatch:
  """The same rows with each prompt moved into the completion, masked out of the loss.

  The prompt keeps its first token only (bos, where the tokenizer has one); the rest of
  the prompt leads the completion with `loss_mask` False. Tokens, RoPE positions and the
  trained tokens' log-probs are those of `batch` (`completion_logprobs` counts valid
  slots only), but a row is now one right-padded run of `prompt + completion` tokens:
  cut to a width, it pads to its own length rather than to the longest prompt plus the
  longest completion (what `length_buckets` needs).

  Args:
    batch: rows in the rollout layout (`solution_batch`).
    pad_id: the padding id.
    max_tokens: None, or each row is cut to its first `max_tokens` tokens (the prompt's
      included): the trained tokens after the cut are dropped. A causal model's
      log-probs of the tokens kept do not depend on the ones dropped.

  Returns:
    A `TrainBatch` with prompt_tokens [B, 1], completion_tokens [B, M] where M is the
    longest `prompt_length - 1 + completion_length` (at most `max_tokens - 1`), and
    matching lengths and mask.
  """
  b, p = batch.prompt_tokens.shape
  lp = np.asarray(batch.prompt_lengths)
  lc = np.asarray(batch.completion_lengths)
  lengths = lp - 1 + lc
  m = int(lengths.max())
  completion = np.full((b, m), pad_id, np.int32)
  mask = np.zeros((b, m), bool)
  for i in range(b):
    head = batch.prompt_tokens[i, p - lp[i] + 1:]
    completion[i, :lengths[i]] = np.concatenate([head, batch.completion_tokens[i, :lc[i]]])
    mask[i, lp[i] - 1:lengths[i]] = batch.loss_mask[i, :lc[i]]
  if max_tokens is not None:
    if max_tokens < 2:
      raise ValueError(f"warm_start.max_tokens={max_tokens}: expected at least 2")
    m = min(m, max_tokens - 1)
    lengths = np.minimum(lengths, m)
    completion, mask = completion[:, :m], mask[:, :m]
  first = batch.prompt_tokens[np.arange(b), p - lp][:, None]  # [B, 1]
  return TrainBatch(prompt_tokens=first.astype(np.int32),
                    prompt_lengths=np.ones((b,), np.int32), completion_tokens=completion,
                    loss_mask=mask, advantages=np.zeros((b,), np.float32),
                    old_logprobs=np.zeros((b, m), np.float32),
                    completion_lengths=lengths.astype(np.int32))


def length_buckets(lengths: np.ndarray, width: int, batch_size: int
                   ) -> list[tuple[int, np.ndarray]]:
  """Rows grouped by length so that a batch pads to its bucket, not to the longest row.

  A row of length L goes to the bucket `ceil(L / width) * width`; a bucket with fewer
  than `batch_size` rows joins the next wider one (the last joins the one before it),
  so every bucket fills a batch and the widths, one compiled step each, stay few.

  Args:
    lengths: [R] tokens per row.
    width: the bucket granularity in tokens.
    batch_size: rows per batch.

  Returns:
    [(bucket width, row indices)], narrowest first.
  """
  if width <= 0:
    raise ValueError(f"warm_start.bucket_width={width}: expected a positive token count")
  lengths = np.asarray(lengths)
  edge = -(-lengths // width) * width
  buckets: list[tuple[int, np.ndarray]] = []
  carry = np.zeros((0,), np.int64)
  for w in np.unique(edge):
    carry = np.concatenate([carry, np.flatnonzero(edge == w)])
    if len(carry) >= batch_size:
      buckets.append((int(w), carry))
      carry = np.zeros((0,), np.int64)
  if len(carry):
    w = int(edge[carry].max())
    if buckets:
      buckets[-1] = (w, np.concatenate([buckets[-1][1], carry]))
    else:
      buckets.append((w, carry))
  return buckets


def _bucket_epoch(buckets: list[tuple[int, np.ndarray]], batch_size: int,
                  rng: np.random.Generator) -> list[tuple[int, np.ndarray]]:
  """One pass over the bucketed rows: each bucket shuffled and cut into full batches (a
  bucket smaller than a batch is drawn with replacement), the batches shuffled."""
  out = []
  for w, rows in buckets:
    rows = rng.permutation(rows)
    if len(rows) < batch_size:
      rows = rng.choice(rows, batch_size)
    out += [(w, rows[i:i + batch_size])
            for i in range(0, len(rows) - batch_size + 1, batch_size)]
  return [out[i] for i in rng.permutation(len(out))]


def _cut(batch: TrainBatch, width: int) -> TrainBatch:
  """The completion arrays cut to `width` slots (the rows' padding beyond it)."""
  return dataclasses.replace(batch, completion_tokens=batch.completion_tokens[:, :width],
                             loss_mask=batch.loss_mask[:, :width],
                             old_logprobs=batch.old_logprobs[:, :width])


# ------------------------------------------------------------------ loss and step


def supervised_loss(logprobs: Float[Array, "B N"],
                    mask: Bool[Array, "B N"]) -> tuple[Float[Array, ""], dict]:
  """Token-mean negative log-likelihood of the completion tokens (prompt excluded).

  Returns:
    (loss, {"nll": loss, "tokens": number of trained tokens}).
  """
  loss = losses.aggregate(-logprobs, mask, losses.AGG_TOKEN_MEAN)
  return loss, {"nll": loss, "tokens": mask.astype(jnp.float32).sum()}


def _optimizer(steps: int, learning_rate: float) -> optax.GradientTransformation:
  warmup = max(1, min(20, steps // 10))
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, learning_rate, warmup_steps=warmup, decay_steps=max(steps, warmup + 1),
      end_value=0.1 * learning_rate)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=0.0))


def _train(model: Transformer, data: TrainBatch, *, steps: int, batch_size: int,
           learning_rate: float, seed: int, vocab_limit: Optional[int],
           mesh: Optional[Mesh], rules: Rules, check_every: int = 0,
           stop: Optional[Callable[[nnx.State], bool]] = None,
           buckets: Optional[list[tuple[int, np.ndarray]]] = None,
           trainable: Optional[TrainableSet] = None) -> list[float]:
  """Trains `model` in place for up to `steps` steps of `batch_size` rows.

  Every `check_every` steps `stop(params)` may end training early (`params`: the whole
  tree). With `buckets` (`length_buckets` of a packed `data`) each batch comes from one
  bucket, cut to its width; else batches are drawn from all rows, padded to the longest.
  With `trainable`, only its subset gets gradients and optimizer state; the rest is
  frozen. Returns the losses.
  """
  graphdef, whole = nnx.split(model, nnx.Param)
  trainable = trainable or TrainableSet(model.config.num_layers)
  params, frozen = trainable.split(whole)
  tx = _optimizer(steps, learning_rate)
  if mesh is not None:
    param_shardings = state_shardings(params, mesh, rules)
    abstract = jax.eval_shape(tx.init, params)
    init = jax.jit(tx.init,
                   out_shardings=opt_state_shardings(tx, abstract, param_shardings, mesh))
  else:
    init = jax.jit(tx.init)

  def step(params, frozen, opt_state, batch: TrainBatch):
    with use_rules(rules) if mesh is not None else contextlib.nullcontext():

      def loss_fn(p):
        logp, _ = completion_logprobs(nnx.merge(graphdef, merge(p, frozen)), batch,
                                      vocab_limit=vocab_limit)
        return supervised_loss(logp, batch.loss_mask.astype(bool))

      (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(step, donate_argnums=(0, 2))
  rng = np.random.default_rng(seed)
  n = data.prompt_tokens.shape[0]
  order = rng.permutation(n)
  pos = 0
  schedule: list[tuple[int, np.ndarray]] = []
  history = []
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    opt_state = init(params)
    bar = progress_bar(total=steps, desc="warm start", unit="step", leave=False, every=100)
    for i in range(steps):
      bar.update(1)
      if (stop is not None and check_every and i and i % check_every == 0
          and stop(merge(params, frozen))):
        break
      if buckets is not None:
        if not schedule:  # next epoch, reshuffled
          schedule = _bucket_epoch(buckets, batch_size, rng)
        width, rows = schedule.pop()
        batch = _cut(_rows(data, rows), width)
      else:
        if pos + batch_size > n:  # next epoch, reshuffled
          order, pos = rng.permutation(n), 0
        batch = _rows(data, order[pos:pos + batch_size])
        pos += batch_size
      batch = (shard_batch(batch, mesh, rules) if mesh is not None
               else jax.tree.map(jnp.asarray, batch))
      params, opt_state, loss = step(params, frozen, opt_state, batch)
      history.append(loss)
    bar.close()
  nnx.update(model, merge(params, frozen))
  return [float(x) for x in jax.device_get(history)]


# ------------------------------------------------------------------ cache key


def _tokenizer_identity(tokenizer: Tokenizer) -> str:
  """The bytes that define the tokenizer: its model file, else its vocabulary."""
  h = hashlib.sha256(type(tokenizer).__name__.encode())
  model_file = getattr(tokenizer, "model_file", None)
  if model_file and os.path.isfile(model_file):
    with open(model_file, "rb") as f:
      h.update(f.read())
  else:
    inner = getattr(tokenizer, "_tok", None)
    vocab = inner.get_vocab() if hasattr(inner, "get_vocab") else {}
    h.update(json.dumps(sorted(vocab.items()) or tokenizer.vocab_size).encode())
  h.update(json.dumps([tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id]).encode())
  return h.hexdigest()


def cache_key(model: Transformer, tokenizer: Tokenizer, task: Any, data: TrainBatch,
              settings: dict) -> str:
  """sha256 of everything the warm-started parameters depend on."""
  h = hashlib.sha256()
  header = {"recipe": _RECIPE_VERSION, "config": checkpoint.config_to_json(model.config),
            "init": checkpoint.fingerprint(nnx.state(model, nnx.Param)),
            "tokenizer": _tokenizer_identity(tokenizer), "task": type(task).__name__,
            **settings}
  h.update(json.dumps(header, sort_keys=True).encode())
  for x in (data.prompt_tokens, data.completion_tokens, data.prompt_lengths,
            data.completion_lengths):
    h.update(np.ascontiguousarray(x).tobytes())
    h.update(repr(x.shape).encode())
  return h.hexdigest()


# ------------------------------------------------------------------ entry point


@gin.configurable(module="learner",
                  denylist=["model", "tokenizer", "task", "seed", "mesh"])
def warm_start(model: Transformer, tokenizer: Tokenizer, task: Any, *, steps: int = 200,
               batch_size: int = 64, learning_rate: float = 3e-3, seed: int = 0,
               cache_dir: str = _DEFAULT_CACHE_DIR, mesh: Optional[Mesh] = None,
               rules: Rules = LEARNER_RULES, max_problems: int = 8192,
               target_accuracy: Optional[float] = None, check_every: int = 50,
               check_problems: int = 128, target_validity: Optional[float] = None,
               bucket_width: Optional[int] = None,
               max_tokens: Optional[int] = None,
               top_layers: Optional[int] = None) -> Transformer:
  """Trains `model` on the task's solved training problems, or loads the cached result.

  Args:
    model: the freshly initialized policy (updated in place and returned).
    tokenizer: its tokenizer.
    task: anything with `train_problems(n, seed)` and `format_prompt(problem)`.
    steps: optimizer steps; 0 disables the warm start. Keep it short on purpose (see
      the module docstring).
    batch_size: rows per step (a multiple of the mesh's data x fsdp size).
    learning_rate: peak of a warmup + cosine schedule (AdamW, clipped gradients).
    seed: draws the problems and their order.
    cache_dir: where warm-started models are kept (`~` expanded).
    mesh, rules: where the batch goes; the parameters stay where they are.
    max_problems: distinct problems drawn at most (`steps * batch_size` is cycled
      through them), which bounds generation time for slow sources.
    target_accuracy: stop as soon as the policy, sampled at `CHECK_TEMPERATURE`, solves
      this share of `check_problems` *training* problems (never held-out ones), checked
      every `check_every` steps; `steps` is then the cap. Where the model "gets" a task is
      abrupt and differs between seeds, so a fixed step count gives anything from 5% to
      75%; a target gives every seed the same starting point, with room left for RL.
    check_every, check_problems: see `target_accuracy` and `target_validity`.
    target_validity: the multi-turn counterpart of `target_accuracy` (a task with
      `solution_segments` and `call_parses(turn)`): stop as soon as this share of first
      turns, sampled at `CHECK_TEMPERATURE` on `check_problems` training problems, parse
      as a tool call, checked every `check_every` steps. A syntax check, not a solve: the
      first turn is what a policy must get right before any episode goes anywhere.
    bucket_width: None: every batch pads to the longest prompt plus the longest
      solution of all rows (the layout of a rollout). A token count: each row's prompt
      is packed into its completion (`pack_prompts`, masked; same log-probs) and every
      batch is drawn from one length bucket of this granularity (`length_buckets`), so
      it pads to its bucket's width. For rows of very different lengths (multi-turn
      episodes): the step's cost follows the batch's own length, at one compile per
      bucket.
    max_tokens: with `bucket_width`, each row is cut to its first `max_tokens` tokens,
      prompt included (`pack_prompts`): a long episode's last turns are not trained on,
      and a row left with no trained token is dropped (logged). Attention's cost grows
      with the square of a row's length, so a few long episodes can cost most of the
      time; their late turns (e.g. `submit`) are learned from the short ones.
    top_layers: None trains every parameter (a from-scratch model). K trains only the
      top K blocks, the final norm and an untied LM head (`learner.trainable`), the
      embeddings and lower blocks frozen: a pretrained policy taught a syntax at a
      fraction of the cost, as `Learner.trainable_layers` does for RL.

  Returns:
    `model`, with warm-started parameters.
  """
  if steps <= 0:
    return model
  _check_arguments(model, tokenizer, task, batch_size=batch_size,
                   learning_rate=learning_rate, target_accuracy=target_accuracy,
                   target_validity=target_validity, top_layers=top_layers,
                   bucket_width=bucket_width, max_tokens=max_tokens)
  settings = {"steps": steps, "batch_size": batch_size, "learning_rate": learning_rate,
              "seed": seed, "vocab_limit": tokenizer.vocab_size,
              "target_accuracy": target_accuracy, "check_every": check_every,
              "check_problems": check_problems, "target_validity": target_validity,
              "top_layers": top_layers, "bucket_width": bucket_width,
              "max_tokens": max_tokens}
  # Unset options stay out of the cache key (entries made before they existed stay valid).
  settings = {k: v for k, v in settings.items()
              if v is not None or k == "target_accuracy"}
  problems: list[Problem] = task.train_problems(min(steps * batch_size, max_problems), seed)
  data, buckets = _warm_data(tokenizer, task, problems, bucket_width, max_tokens, batch_size)
  if getattr(task, "solution_segments", None) or buckets:
    # The loss mask is not all completion tokens: part of the key.
    settings["mask_sha256"] = hashlib.sha256(np.packbits(data.loss_mask).tobytes()).hexdigest()
  key = cache_key(model, tokenizer, task, data, settings)
  path = os.path.join(os.path.expanduser(cache_dir), f"warmstart-{key[:32]}")
  if _restored(path, model):
    return model
  start, checks = time.time(), []
  stop = _stop_rule(model, tokenizer, task, seed=seed, mesh=mesh, record=checks,
                    target_accuracy=target_accuracy, target_validity=target_validity,
                    check_problems=check_problems)
  history = _train(model, data, steps=steps, batch_size=batch_size,
                   learning_rate=learning_rate, seed=seed, vocab_limit=tokenizer.vocab_size,
                   mesh=mesh, rules=rules, check_every=check_every, stop=stop,
                   buckets=buckets, trainable=TrainableSet.for_config(model.config, top_layers))
  seconds = time.time() - start
  log.info("warm start: %d steps in %.1fs, loss %.3f -> %.3f; saved to %s", len(history),
           seconds, history[0], history[-1], path)
  meta = {"settings": settings, "problems": len(problems), "seconds": round(seconds, 2),
          "steps_run": len(history), "checks": checks,
          "losses": [round(x, 5) for x in history], "key": key}
  _save(path, model, meta)
  return model


def _check_arguments(model: Transformer, tokenizer: Tokenizer, task: Any, *,
                     batch_size: int, learning_rate: float,
                     target_accuracy: Optional[float], target_validity: Optional[float],
                     top_layers: Optional[int], bucket_width: Optional[int],
                     max_tokens: Optional[int]) -> None:
  """`warm_start`'s arguments that cannot work together, as ValueErrors that name them."""
  if batch_size <= 0 or learning_rate <= 0:
    raise ValueError(f"warm_start: batch_size={batch_size} and learning_rate="
                     f"{learning_rate} must be positive")
  if target_accuracy is not None and target_validity is not None:
    raise ValueError("warm_start: set target_accuracy or target_validity, not both")
  if target_accuracy is not None and getattr(task, "multi_turn", False):
    raise ValueError("warm_start.target_accuracy needs single-turn sampling; a multi-turn "
                     "task stops on warm_start.target_validity (set target_accuracy = "
                     "None)")
  if target_validity is not None and not (hasattr(task, "call_parses") and
                                          hasattr(task, "solution_segments")):
    raise ValueError(f"warm_start.target_validity needs a multi-turn task with "
                     f"call_parses() and solution_segments(); {type(task).__name__} has "
                     f"not (use target_accuracy)")
  if tokenizer.vocab_size > model.config.vocab_size:
    raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size "
                     f"is {model.config.vocab_size}")
  if top_layers is not None and (type(top_layers) is not int
                                 or not 1 <= top_layers <= model.config.num_layers):
    raise ValueError(f"warm_start.top_layers={top_layers!r}: expected None (every "
                     f"parameter) or 1..{model.config.num_layers} (the model's blocks)")
  if max_tokens is not None and bucket_width is None:
    raise ValueError("warm_start.max_tokens cuts packed rows: set warm_start.bucket_width "
                     "too")


def _warm_data(tokenizer: Tokenizer, task: Any, problems: Sequence[Problem],
               bucket_width: Optional[int], max_tokens: Optional[int], batch_size: int
               ) -> tuple[TrainBatch, Optional[list]]:
  """The supervised rows of `problems` and, with `bucket_width`, their length buckets
  (rows packed, cut to `max_tokens`, rows left with no trained token dropped)."""
  # A multi-turn task gives its episodes as segments: observations are masked.
  segments = getattr(task, "solution_segments", None)
  data = solution_batch(tokenizer, [task.format_prompt(p) for p in problems],
                        [segments(p) if segments else p.solution for p in problems])
  if bucket_width is None:
    return data, None
  data = pack_prompts(data, tokenizer.pad_id, max_tokens)
  if max_tokens is not None:
    kept = np.flatnonzero(data.loss_mask.any(axis=1))
    if not len(kept):
      raise ValueError(f"warm_start.max_tokens={max_tokens}: every prompt is as long; "
                       f"nothing is left to train on")
    if len(kept) < len(problems):
      log.info("warm start: %d of %d rows have no trained token in their first %d; "
               "dropped", len(problems) - len(kept), len(problems), max_tokens)
      data = _rows(data, kept)
  buckets = length_buckets(data.completion_lengths, bucket_width, batch_size)
  log.info("warm start: %d rows in length buckets %s", len(data.completion_lengths),
           {w: len(rows) for w, rows in buckets})
  return data, buckets


def _restored(path: str, model: Transformer) -> bool:
  """Restores the cached warm start at `path` into `model`; False when there is none (or
  it is unusable). Every process restores, or every process trains: one host missing the
  entry (a cache on local disk) must not leave the others waiting in a collective."""
  if not all_true(os.path.isdir(path)):
    return False
  try:
    checkpoint.restore_params_into(path, model)
  except checkpoint.CheckpointError as e:
    log.warning("warm start: cache entry %s is unusable (%s); training again", path, e)
    return False
  log.info("warm start: cache hit %s", path)
  return True


def _save(path: str, model: Transformer, meta: dict) -> None:
  try:
    checkpoint.save_model(path, model, metadata=meta, overwrite=os.path.isdir(path))
  except FileExistsError:  # another process finished the same warm start first
    log.info("warm start: %s was written meanwhile; keeping it", path)


def _stop_rule(model: Transformer, tokenizer: Tokenizer, task: Any, *, seed: int,
               mesh: Optional[Mesh], record: list, target_accuracy: Optional[float],
               target_validity: Optional[float], check_problems: int
               ) -> Optional[Callable[[nnx.State], bool]]:
  """`warm_start`'s early stop: sampled accuracy or first-turn validity on training
  problems past the ones trained on (never held-out ones); None without a target."""
  if target_accuracy is None and target_validity is None:
    return None
  val = task.train_problems(check_problems, seed + 104729)
  if target_accuracy is not None:
    longest = max(len(tokenizer.encode(p.solution)) for p in val) + 1

    def accuracy(problems, texts):
      return [s["correct"] for s in task.score_many(problems, texts)]

    return _sampled_stop(model, tokenizer, task, val, target_accuracy, seed, mesh, record,
                         longest, accuracy, "accuracy")
  # The first model turn and its eos: the first trained segment.
  longest = max(len(tokenizer.encode(task.solution_segments(p)[0][0])) for p in val) + 1

  def validity(problems, texts):
    return [float(task.call_parses(t)) for t in texts]

  return _sampled_stop(model, tokenizer, task, val, target_validity, seed, mesh, record,
                       longest, validity, "validity")


def _sampled_stop(model: Transformer, tokenizer: Tokenizer, task: Any,
                  problems: Sequence[Problem], target: float, seed: int,
                  mesh: Optional[Mesh], record: list, max_new_tokens: int,
                  score: Callable[[Sequence[Problem], list[str]], list[float]], name: str
                  ) -> Callable[[nnx.State], bool]:
  """A `stop(params)` that samples one completion per problem at `CHECK_TEMPERATURE` (at
  most `max_new_tokens`) and stops when the mean of `score(problems, texts)` reaches
  `target`; each check is appended to `record` as {"check", name}."""
  from evotrainer.sampling import Sampler, SamplingParams, left_pad

  vocab_limit = tokenizer.vocab_size if tokenizer.vocab_size < model.config.vocab_size else None
  sampler = Sampler(model, pad_id=tokenizer.pad_id, mesh=mesh, vocab_limit=vocab_limit)
  batch = left_pad([tokenizer.encode(task.format_prompt(p), add_bos=True) for p in problems],
                   tokenizer.pad_id)
  sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=CHECK_TEMPERATURE)
  calls = [0]

  def stop(params: nnx.State) -> bool:
    calls[0] += 1
    out = sampler(params, batch, jax.random.key(seed * 7919 + calls[0]),
                  stop_ids=tokenizer.stop_ids, sampling=sp)
    tokens, lengths = to_host((out.tokens, out.lengths))
    texts = [tokenizer.decode([t for t in tokens[i, :lengths[i]].tolist()
                               if t not in tokenizer.stop_ids]) for i in range(len(problems))]
    # Process 0 decides (scoring has timeouts; see sharding/multihost.py).
    value = broadcast_json(float(np.mean(score(problems, texts))) if is_primary() else None)
    record.append({"check": calls[0], name: value})
    log.info("warm start: check %d, sampled %s %.3f (target %.2f)", calls[0], name, value,
             target)
    return value >= target

  return stop
