"""In-graph sampler: one jitted program per (batch, prompt bucket, max new tokens).

Prompts are left-padded to a bucket length P, so every row's next token goes to the
same cache slot and the decode loop writes with one `dynamic_update_slice`. Prefill
runs the prompt once (attending only over the prompt, writing its keys/values into the
cache) and computes LM-head logits at the last position only. Decode is a
`lax.while_loop` that stops early when every row has emitted a stop id. The cache is
exactly P + N slots long (no oversized cache to attend over) and is a donated buffer:
each call hands the previous call's cache back to XLA to overwrite in place.
Stale slots are never read: the mask admits only the row's prompt and what it
generated so far.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from evotrainer.model.transformer import KVCache, Transformer, init_cache
from evotrainer.sampling.strategies import select
from evotrainer.sharding.rules import SAMPLER_RULES, Rules, constrain, use_rules
from evotrainer.types import PromptBatch, Rollouts

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to choose tokens. `temperature` enters the program as an array (no recompile);
  the rest are part of the compiled program."""

  max_new_tokens: int = 64
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if not self.greedy and self.temperature <= 0:
      raise ValueError(f"temperature must be > 0 (or greedy=True), got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@flax.struct.dataclass
class DecodeState:
  """The `lax.while_loop` carry."""

  step: jax.Array  # [] int32: tokens generated so far (the next one goes to index `step`)
  tokens: jax.Array  # [B, N] int32: generated ids, pad where not generated
  logprobs: jax.Array  # [B, N] float32: log-probs of generated ids, 0 elsewhere
  done: jax.Array  # [B] bool: row has emitted a stop id
  lengths: jax.Array  # [B] int32: generated tokens per row, stop id included
  cache: KVCache  # per layer [B, KV, P + N, D]
  rng: jax.Array  # PRNG key


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
  """Smallest bucket >= n (so a run compiles a handful of prompt shapes)."""
  for b in buckets:
    if b >= n:
      return b
  raise ValueError(f"prompt of {n} tokens exceeds the largest bucket {max(buckets)}")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int,
             buckets: Sequence[int] = DEFAULT_BUCKETS) -> PromptBatch:
  """Token lists -> PromptBatch left-padded to the bucket of the longest prompt."""
  if not len(prompts):
    raise ValueError("empty prompt batch")
  lengths = np.array([len(p) for p in prompts], np.int32)
  if lengths.min() < 1:
    raise ValueError(f"prompt {int(lengths.argmin())} is empty")
  p = bucket_length(int(lengths.max()), buckets)
  tokens = np.full((len(prompts), p), pad_id, np.int32)
  for i, ids in enumerate(prompts):
    tokens[i, p - len(ids):] = ids
  return PromptBatch(tokens=tokens, lengths=lengths)


def _is_stop(ids: jax.Array, stop_ids: jax.Array) -> jax.Array:
  """ids [B], stop_ids [B, K] (padded with -1) -> [B] bool."""
  return jnp.any(ids[:, None] == stop_ids, axis=-1)


def sample(graphdef, params, cache: KVCache, prompt_tokens: jax.Array,
           prompt_lengths: jax.Array, stop_ids: jax.Array, rng: jax.Array,
           temperature: jax.Array, *, max_new_tokens: int, top_k: int, top_p: float,
           greedy: bool, pad_id: int, rules: Optional[Rules] = SAMPLER_RULES,
           vocab_limit: Optional[int] = None):
  """Generates up to `max_new_tokens` per row. Pure; jit it with the keywords static.

  Args:
    graphdef, params: `nnx.split(model)`.
    cache: KVCache of [B, P + N] slots (contents irrelevant; donated).
    prompt_tokens: [B, P] int32 left-padded prompts.
    prompt_lengths: [B] int32.
    stop_ids: [B, K] int32 stop ids per row, -1 for none.
    rng: PRNG key.
    temperature: [] float32.
    vocab_limit: ids >= this are never sampled (a model vocabulary padded past the
      tokenizer's, as in Qwen checkpoints); log-probs are normalized over the rest.

  Returns:
    (Rollouts, the cache buffer for reuse).
  """
  ctx = use_rules(rules) if rules is not None else _null()
  with ctx:
    model: Transformer = nnx.merge(graphdef, params)
    v = model.config.vocab_size

    def head(h):  # [B, 1, E] -> [B, V]
      logits = model.logits(h)[:, 0]
      if vocab_limit is not None and vocab_limit < v:
        logits = jnp.where(jnp.arange(v) < vocab_limit, logits, jnp.finfo(jnp.float32).min)
      return logits

    b, p = prompt_tokens.shape
    n = max_new_tokens
    s = cache.length
    pad = p - prompt_lengths  # [B] left padding per row
    slots = jnp.arange(s, dtype=jnp.int32)

    # Prefill: attend within the prompt, fill cache slots [0, P).
    prompt_slots = slots[:p]
    valid = prompt_slots[None, :] >= pad[:, None]  # [B, P]
    positions = jnp.maximum(prompt_slots[None, :] - pad[:, None], 0)
    mask = (prompt_slots[None, None, :] <= prompt_slots[None, :, None]) & valid[:, None, :]
    # The last layer's queries and MLP run on the last prompt slot only.
    hidden, cache = model(prompt_tokens, positions, mask, cache=cache, cache_index=0,
                          query_slice=(p - 1, p))
    logits = head(hidden)  # [B, V], last position only
    rng, key = jax.random.split(rng)
    first, first_logp = select(logits, key, temperature, top_k=top_k, top_p=top_p,
                               greedy=greedy)
    done = _is_stop(first, stop_ids)
    tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(first)
    logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(first_logp)
    state = DecodeState(step=jnp.int32(1), tokens=constrain(tokens, ("batch", None)),
                        logprobs=logprobs, done=done, lengths=jnp.ones((b,), jnp.int32),
                        cache=cache, rng=rng)

    def cond(st: DecodeState):
      return (st.step < n) & ~jnp.all(st.done)

    def body(st: DecodeState):
      index = p + st.step - 1  # slot of the token being fed
      last = jax.lax.dynamic_slice_in_dim(st.tokens, st.step - 1, 1, axis=1)  # [B, 1]
      pos = (index - pad)[:, None]
      key_valid = (slots[None, :] >= pad[:, None]) & (slots[None, :] <= index)  # [B, S]
      step_mask = key_valid[:, None, :]
      h, new_cache = model(last, pos, step_mask, cache=st.cache, cache_index=index)
      step_logits = head(h)
      rng, key = jax.random.split(st.rng)
      ids, logp = select(step_logits, key, temperature, top_k=top_k, top_p=top_p,
                         greedy=greedy)
      live = ~st.done
      ids = jnp.where(live, ids, pad_id)
      logp = jnp.where(live, logp, 0.0)
      tokens = jax.lax.dynamic_update_slice_in_dim(st.tokens, ids[:, None], st.step, axis=1)
      logprobs = jax.lax.dynamic_update_slice_in_dim(st.logprobs, logp[:, None], st.step,
                                                     axis=1)
      return DecodeState(step=st.step + 1, tokens=tokens, logprobs=logprobs,
                         done=st.done | (live & _is_stop(ids, stop_ids)),
                         lengths=st.lengths + live.astype(jnp.int32), cache=new_cache,
                         rng=rng)

    state = jax.lax.while_loop(cond, body, state)
    out = Rollouts(tokens=state.tokens, logprobs=state.logprobs, lengths=state.lengths,
                   truncated=~state.done)
    return out, state.cache


class _null:
  def __enter__(self):
    return None

  def __exit__(self, *a):
    return False


class Sampler:
  """Holds the compiled sampling programs and their cache buffers.

  Usage:
    sampler = Sampler(model, pad_id=tok.pad_id, mesh=mesh)
    out = sampler(nnx.state(model), batch, rng, stop_ids=[tok.eos_id],
                  params=SamplingParams(max_new_tokens=64, temperature=1.0))

  One program is compiled per (batch size, prompt bucket, max_new_tokens, top_k, top_p,
  greedy); `temperature`, prompts, stop ids and the key are runtime arrays.
  """

  def __init__(self, model: Transformer, *, pad_id: int, mesh=None,
               rules: Rules = SAMPLER_RULES, max_stop_ids: int = 4,
               vocab_limit: Optional[int] = None):
    self.graphdef = nnx.graphdef(model)
    self.config = model.config
    self.pad_id = int(pad_id)
    self.mesh = mesh
    self.rules = rules
    self.max_stop_ids = max_stop_ids
    self.vocab_limit = vocab_limit
    self._caches: dict = {}
    self._fn = jax.jit(
        functools.partial(sample, self.graphdef),
        static_argnames=("max_new_tokens", "top_k", "top_p", "greedy", "pad_id", "rules",
                         "vocab_limit"),
        donate_argnums=(1,))

  def compiled_programs(self) -> int:
    """Number of distinct programs compiled so far (for tests and logging)."""
    return self._fn._cache_size()

  def _stop_array(self, stop_ids, b: int) -> np.ndarray:
    arr = np.asarray(stop_ids if stop_ids is not None else [], np.int32)
    if arr.ndim == 1:
      arr = np.broadcast_to(arr, (b, arr.shape[0]))
    if arr.shape[0] != b:
      raise ValueError(f"stop_ids has {arr.shape[0]} rows for a batch of {b}")
    if arr.shape[1] > self.max_stop_ids:
      raise ValueError(f"at most {self.max_stop_ids} stop ids per row, got {arr.shape[1]}")
    out = np.full((b, self.max_stop_ids), -1, np.int32)
    out[:, :arr.shape[1]] = arr
    return out

  def _cache(self, b: int, s: int) -> KVCache:
    key = (b, s)
    cache = self._caches.pop(key, None)
    if cache is None:
      make = functools.partial(init_cache, self.config, b, s)
      if self.mesh is not None:
        with use_rules(self.rules):
          cache = jax.jit(make)()
      else:
        cache = make()
    return cache

  def __call__(self, params, batch: PromptBatch, rng: jax.Array, *, stop_ids=None,
               sampling: SamplingParams = SamplingParams()) -> Rollouts:
    b, p = batch.tokens.shape
    if b == 0:
      raise ValueError("empty prompt batch")
    s = p + sampling.max_new_tokens
    if s > self.config.max_position_embeddings:
      raise ValueError(
          f"prompt bucket {p} + max_new_tokens {sampling.max_new_tokens} = {s} exceeds the "
          f"model's max_position_embeddings {self.config.max_position_embeddings}")
    if int(np.max(batch.lengths)) > p:
      raise ValueError(f"prompt length {int(np.max(batch.lengths))} exceeds the padded "
                       f"width {p}")
    tokens, lengths = batch.tokens, batch.lengths
    if self.mesh is not None:
      from evotrainer.sharding.rules import named_sharding
      row = named_sharding(self.mesh, ("batch", None), self.rules, (b, p))
      tokens = jax.device_put(np.asarray(tokens), row)
      lengths = jax.device_put(np.asarray(lengths),
                               named_sharding(self.mesh, ("batch",), self.rules, (b,)))
    out, cache = self._fn(
        params, self._cache(b, s), tokens, lengths, self._stop_array(stop_ids, b), rng,
        jnp.float32(sampling.temperature), max_new_tokens=sampling.max_new_tokens,
        top_k=sampling.top_k, top_p=float(sampling.top_p), greedy=sampling.greedy,
        pad_id=self.pad_id, rules=self.rules, vocab_limit=self.vocab_limit)
    self._caches[(b, s)] = cache
    return out


# gin: `SamplingParams.max_new_tokens = 32`, `run.sampling = @SamplingParams()`.
import gin  # noqa: E402

gin.external_configurable(SamplingParams, module="sampling")
