"""In-graph sampler: one jitted program per (batch, prompt bucket, max new tokens).

Prompts are left-padded to a bucket length P, so every row's next token goes to the
same cache slot and the decode loop writes with one `dynamic_update_slice`. Prefill
runs the prompt once (attending only over the prompt, writing its keys/values into the
cache) and computes LM-head logits at the last position only. Decode is a
`lax.while_loop` that stops early when every row has emitted a stop id (or met its stop
rule: the n-th token of a kind, `stop_rules.py`). The cache is
exactly P + N slots long (no oversized cache to attend over) and is a donated buffer:
each call hands the previous call's cache back to XLA to overwrite in place.
Stale slots are never read: the mask admits only the row's prompt and what it
generated so far.

GRPO samples G completions of each prompt, as G consecutive identical rows. The sampler
finds such groups (`prompt_groups`) and prefills each prompt once: the prefill runs on
B / G rows and its keys/values and last-position logits are repeated to the G rows of
the group (the values are those of a per-row prefill; the rows then decode apart).
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

from evotrainer.model.transformer import (K_CACHE_AXES, V_CACHE_AXES, KVCache, Transformer,
                                          init_cache)
from evotrainer.sampling.stop_rules import MAX_RULE_IDS, check_rule
from evotrainer.sampling.strategies import select
from evotrainer.sharding.rules import SAMPLER_RULES, Rules, constrain, use_rules
from evotrainer.types import PromptBatch, SamplerOutput

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to choose tokens, and when a row ends. `temperature` and the stop rule's ids
  enter the program as arrays (no recompile); the rest are part of the compiled program.
  `stop_rule` names a rule of `stop_rules.STOP_RULES` ('' for none): the rollout engine
  resolves it against its tokenizer; held-out evaluation builds its own params and never
  applies one."""

  max_new_tokens: int = 64
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  stop_rule: str = ""

  def __post_init__(self):
    check_rule(self.stop_rule)
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if not self.greedy and self.temperature <= 0:
      raise ValueError(f"temperature must be > 0 (or greedy=True), got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def logprob_temperature(self) -> float:
    """The temperature T of the log-probs the sampler reports, log_softmax(logits / T),
    which a learner must recompute at the same T: `temperature`, or 1 when greedy
    (greedy decoding reports the model's own log-probs: `strategies.select`)."""
    return 1.0 if self.greedy else self.temperature


@flax.struct.dataclass
class DecodeState:
  """The `lax.while_loop` carry."""

  step: jax.Array  # [] int32: tokens generated so far (the next one goes to index `step`)
  tokens: jax.Array  # [B, N] int32: generated ids, pad where not generated
  logprobs: jax.Array  # [B, N] float32: log-probs of generated ids, 0 elsewhere
  done: jax.Array  # [B] bool: row has emitted a stop id or met its stop rule
  counts: jax.Array  # [B] int32: tokens emitted among the stop rule's ids
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


def prompt_groups(tokens: np.ndarray, lengths: np.ndarray) -> int:
  """The largest G such that the rows `[B, P]`, cut into consecutive chunks of G, hold one
  prompt per chunk: the greatest common divisor of the lengths of the runs of identical
  consecutive prompts (1: nothing to share). A run of 2G (the same problem drawn twice in
  a row, or a round padded with copies of its last group) keeps G, so every round of a
  step compiles the same program."""
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  b = tokens.shape[0]
  same = np.all(tokens[1:] == tokens[:-1], axis=1) & (lengths[1:] == lengths[:-1])  # [B-1]
  starts = np.flatnonzero(np.concatenate([[True], ~same]))
  runs = np.diff(np.append(starts, b))
  return int(np.gcd.reduce(runs))


def _is_stop(ids: jax.Array, stop_ids: jax.Array) -> jax.Array:
  """ids [B], stop_ids [B, K] (padded with -1) -> [B] bool."""
  return jnp.any(ids[:, None] == stop_ids, axis=-1)


@flax.struct.dataclass
class RuleStop:
  """A stop rule as the program sees it: a row ends once it has emitted `count` tokens
  among `ids` (`stop_rules.rule_ids`). `count` 0: no rule."""

  ids: jax.Array  # [MAX_RULE_IDS] int32, padded with -1
  count: jax.Array  # [] int32

  @classmethod
  def none(cls) -> "RuleStop":
    return cls(ids=np.full((MAX_RULE_IDS,), -1, np.int32), count=np.int32(0))

  def update(self, ids: jax.Array, live: jax.Array, counts: jax.Array):
    """(the counts after `ids` [B], the rows the rule ends now) for the `live` rows."""
    hit = live & jnp.any(ids[:, None] == self.ids[None, :], axis=-1)
    counts = counts + hit.astype(jnp.int32)
    return counts, hit & (self.count > 0) & (counts >= self.count)


@dataclasses.dataclass(frozen=True)
class Prefix:
  """A continuation's cached context: the previous call's cache and where its rows go.

  Attributes:
    cache: the KVCache a previous call returned (`Sampler(..., return_cache=True)`).
    shift: [B] int32: slot `s` of the new cache takes slot `s - shift[b]` of `cache`
      (a row's cached tokens move to its new left-padded place).
    width: P, the left-padded width of the whole new context (prompt bucket).
  """
  cache: KVCache
  shift: np.ndarray
  width: int


def shift_cache(cache: KVCache, shift: jax.Array, length: int) -> KVCache:
  """A cache of `length` slots whose slot s of row b holds slot `s - shift[b]` of
  `cache` (slots that fall outside hold some other slot: callers mask or overwrite them)."""
  src = jnp.clip(jnp.arange(length, dtype=jnp.int32)[None, :] - shift[:, None], 0,
                 cache.length - 1)  # [B, S]
  k = tuple(constrain(jnp.take_along_axis(x, src[:, None, None, :], axis=3), K_CACHE_AXES)
            for x in cache.k)
  v = tuple(constrain(jnp.take_along_axis(x, src[:, None, :, None], axis=2), V_CACHE_AXES)
            for x in cache.v)
  return KVCache(k=k, v=v)


def sample(graphdef, params, cache: KVCache, prompt_tokens: jax.Array,
           prompt_lengths: jax.Array, stop_ids: jax.Array, rng: jax.Array,
           temperature: jax.Array, shift: Optional[jax.Array] = None,
           rule: Optional[RuleStop] = None, *,
           max_new_tokens: int, top_k: int, top_p: float, greedy: bool, pad_id: int,
           rules: Optional[Rules] = SAMPLER_RULES, vocab_limit: Optional[int] = None,
           width: Optional[int] = None, group: int = 1):
  """Generates up to `max_new_tokens` per row. Pure; jit it with the keywords static.

  Args:
    graphdef, params: `nnx.split(model)`.
    cache: KVCache of [B, P + N] slots (contents irrelevant; donated); with `shift`, the
      previous call's cache (its rows' cached context, moved by `shift`).
    prompt_tokens: [B, P] int32 left-padded prompts; with `shift`, [B, M]: the last M
      tokens of each row's context (left-padded), recomputed into the shifted cache.
    prompt_lengths: [B] int32 (the whole context's, also with `shift`).
    stop_ids: [B, K] int32 stop ids per row, -1 for none.
    rng: PRNG key.
    temperature: [] float32.
    shift: None, or [B] int32 (`Prefix.shift`): continue from `cache`'s cached context.
    rule: the stop rule (`RuleStop`); None: none.
    vocab_limit: ids >= this are never sampled (a model vocabulary padded past the
      tokenizer's, as in Qwen checkpoints); log-probs are normalized over the rest.
    width: with `shift`, P: the whole context's padded width (static).
    group: G > 1: rows come in runs of G identical prompts (`prompt_groups`); the
      prefill runs once per run and is shared by its rows (static; not with `shift`).

  Returns:
    (SamplerOutput, the cache buffer for reuse).
  """
  ctx = use_rules(rules) if rules is not None else _null()
  with ctx:
    model: Transformer = nnx.merge(graphdef, params)
    # Weights in the compute dtype once, before the decode loop: every use casts them to
    # it anyway (same values), and a bf16 decode step then reads half the bytes.
    model = nnx.merge(graphdef, jax.tree.map(
        functools.partial(_to_compute_dtype, model.config.jnp_dtype), params))
    head = _decode_head(model, prompt_tokens.shape[0], vocab_limit)
    p = prompt_tokens.shape[1] if shift is None else width
    s = p + max_new_tokens
    if shift is not None:
      cache = shift_cache(cache, shift, s)
    pad = p - prompt_lengths  # [B] left padding per row
    logits, cache = _prefill(model, head, cache, prompt_tokens, pad, p=p, s=s,
                             continued=shift is not None, group=group)
    pick = functools.partial(select, temperature=temperature, top_k=top_k, top_p=top_p,
                             greedy=greedy)
    rule = RuleStop.none() if rule is None else rule
    state = _first_state(logits, cache, rng, stop_ids, rule, pick, n=max_new_tokens,
                         pad_id=pad_id)
    step = _decode_step(model, head, pad, stop_ids, rule, pick, p=p, s=s, pad_id=pad_id)
    state = jax.lax.while_loop(
        lambda st: (st.step < max_new_tokens) & ~jnp.all(st.done), step, state)
    out = SamplerOutput(tokens=state.tokens, logprobs=state.logprobs,
                        lengths=state.lengths, truncated=~state.done)
    return out, state.cache


def _decode_head(model: Transformer, rows: int, vocab_limit: Optional[int]):
  """The LM head at one position, `[B, 1, E] -> [B, V]` float32 logits (ids at or past
  `vocab_limit` masked out), in `_transposed_head`'s form for few rows on XLA:CPU."""
  v = model.config.vocab_size
  small = rows <= _TRANSPOSED_HEAD_ROWS and jax.default_backend() == "cpu"
  decode_head = _transposed_head(model) if small else None

  def head(h):
    logits = model.logits(h)[:, 0] if decode_head is None else decode_head(h[:, 0])
    if vocab_limit is not None and vocab_limit < v:
      logits = jnp.where(jnp.arange(v) < vocab_limit, logits, jnp.finfo(jnp.float32).min)
    return logits

  return head


def _prefill(model: Transformer, head, cache: KVCache, prompt_tokens: jax.Array,
             pad: jax.Array, *, p: int, s: int, continued: bool, group: int):
  """Runs the prompt chunk into cache slots [P - M, P) and returns (the last position's
  logits [B, V], the cache). A fresh prompt (M = P) attends within itself; a
  continuation's chunk attends over the whole (shifted) cache. With `group` G > 1 the
  chunk runs on one row per prompt group and its keys, values and logits are repeated
  to the group's G rows."""
  m = prompt_tokens.shape[1]
  slots = jnp.arange(s, dtype=jnp.int32)
  chunk_slots = slots[p - m:p]
  keys = slots if continued else chunk_slots
  positions = jnp.maximum(chunk_slots[None, :] - pad[:, None], 0)
  mask = ((keys[None, None, :] <= chunk_slots[None, :, None])
          & (keys[None, None, :] >= pad[:, None, None]))
  if group > 1:
    if continued:
      raise ValueError("a shared prefill (group > 1) cannot continue a prefix")
    first_rows = lambda x: x[::group]  # one row per prompt group: [B / G, ...]
    cache = KVCache(k=tuple(map(first_rows, cache.k)), v=tuple(map(first_rows, cache.v)))
    prompt_tokens, positions, mask = map(first_rows, (prompt_tokens, positions, mask))
  # The last layer's queries and MLP run on the last prompt slot only.
  hidden, cache = model(prompt_tokens, positions, mask, cache=cache, cache_index=p - m,
                        query_slice=(m - 1, m))
  logits = head(hidden)  # [B, V] ([B / G, V] when shared), last position only
  if group > 1:
    to_rows = lambda x, axes: constrain(jnp.repeat(x, group, axis=0), axes)
    cache = KVCache(k=tuple(to_rows(x, K_CACHE_AXES) for x in cache.k),
                    v=tuple(to_rows(x, V_CACHE_AXES) for x in cache.v))
    logits = to_rows(logits, ("batch", "vocab"))
  return logits, cache


def _first_state(logits: jax.Array, cache: KVCache, rng: jax.Array, stop_ids: jax.Array,
                 rule: RuleStop, pick, *, n: int, pad_id: int) -> DecodeState:
  """The decode loop's carry after the first token, picked from the prefill's logits."""
  b = logits.shape[0]
  rng, key = jax.random.split(rng)
  first, first_logp = pick(logits, key)
  tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(first)
  logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(first_logp)
  counts, ruled = rule.update(first, jnp.ones((b,), bool), jnp.zeros((b,), jnp.int32))
  return DecodeState(step=jnp.int32(1), tokens=constrain(tokens, ("batch", None)),
                     logprobs=logprobs, done=_is_stop(first, stop_ids) | ruled,
                     counts=counts, lengths=jnp.ones((b,), jnp.int32), cache=cache,
                     rng=rng)


def _decode_step(model: Transformer, head, pad: jax.Array, stop_ids: jax.Array,
                 rule: RuleStop, pick, *, p: int, s: int, pad_id: int):
  """The decode loop's body: feeds each row's last token at slot P + step - 1 (attending
  over its prompt and what it generated so far), picks the next; finished rows emit
  `pad_id` with log-prob 0."""
  slots = jnp.arange(s, dtype=jnp.int32)

  def body(st: DecodeState) -> DecodeState:
    index = p + st.step - 1  # slot of the token being fed
    last = jax.lax.dynamic_slice_in_dim(st.tokens, st.step - 1, 1, axis=1)  # [B, 1]
    pos = (index - pad)[:, None]
    key_valid = (slots[None, :] >= pad[:, None]) & (slots[None, :] <= index)  # [B, S]
    h, new_cache = model(last, pos, key_valid[:, None, :], cache=st.cache,
                         cache_index=index)
    rng, key = jax.random.split(st.rng)
    ids, logp = pick(head(h), key)
    live = ~st.done
    ids = jnp.where(live, ids, pad_id)
    logp = jnp.where(live, logp, 0.0)
    tokens = jax.lax.dynamic_update_slice_in_dim(st.tokens, ids[:, None], st.step, axis=1)
    logprobs = jax.lax.dynamic_update_slice_in_dim(st.logprobs, logp[:, None], st.step,
                                                   axis=1)
    counts, ruled = rule.update(ids, live, st.counts)
    return DecodeState(step=st.step + 1, tokens=tokens, logprobs=logprobs,
                       done=st.done | (live & _is_stop(ids, stop_ids)) | ruled,
                       counts=counts, lengths=st.lengths + live.astype(jnp.int32),
                       cache=new_cache, rng=rng)

  return body


def _to_compute_dtype(dtype, x: jax.Array) -> jax.Array:
  return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x


# Up to this many rows, XLA:CPU decodes with `_transposed_head`.
_TRANSPOSED_HEAD_ROWS = 32


def _transposed_head(model: Transformer):
  """The LM head as `[V, E] @ [E, B]`, for XLA:CPU: [B, E] rows -> [B, V] float32 logits.

  Why: at decode's few rows XLA:CPU's dot kernel is ~2x faster producing [V, B] from the
  [V, E] weight than [B, V] from [E, V] (the bench model's [256, 8192] head alone: 1.1 vs
  2.2 ms at 16 rows). Measured on whole decode steps (`bench/sampler.py`'s model, greedy):
  16 % faster at 16 rows, 8 % at 32, 6 % slower at 64, hence `_TRANSPOSED_HEAD_ROWS`.
  The optimization barriers keep XLA from folding the transposes back into the dot. The
  untied head's [E, V] weight is transposed once per call, outside the decode loop.
  """
  barrier = jax.lax.optimization_barrier
  w = model.head_weight()
  w_ve = w if model.config.tie_embeddings else barrier(w.T)

  def head(h):
    dt = h.dtype
    out = barrier(jnp.matmul(w_ve.astype(dt), barrier(h.T), preferred_element_type=jnp.float32))
    return constrain(out.T, ("batch", "vocab"))

  return head


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
  greedy, prompt group size); `temperature`, prompts, stop ids and the key are runtime
  arrays. With `share_prefill` (the default) a batch of G consecutive copies of each
  prompt prefills each prompt once (module docstring); under a mesh only when the B / G
  prefill rows still split evenly over its devices.
  """

  def __init__(self, model: Transformer, *, pad_id: int, mesh=None,
               rules: Rules = SAMPLER_RULES, max_stop_ids: int = 4,
               vocab_limit: Optional[int] = None, share_prefill: bool = True):
    self.graphdef = nnx.graphdef(model)
    self.config = model.config
    self.pad_id = int(pad_id)
    self.mesh = mesh
    self.rules = rules
    self.max_stop_ids = max_stop_ids
    self.vocab_limit = vocab_limit
    self.share_prefill = share_prefill
    self._caches: dict = {}
    static = ("max_new_tokens", "top_k", "top_p", "greedy", "pad_id", "rules",
              "vocab_limit", "width", "group")
    self._fn = jax.jit(functools.partial(sample, self.graphdef), static_argnames=static,
                       donate_argnums=(1,))
    # A continuation reads the previous call's cache into a new one of another length.
    self._continue_fn = jax.jit(functools.partial(sample, self.graphdef),
                                static_argnames=static)

  def compiled_programs(self) -> int:
    """Number of distinct programs compiled so far (for tests and logging)."""
    return self._fn._cache_size() + self._continue_fn._cache_size()

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

  def _group(self, batch: PromptBatch) -> int:
    """The prompt group size G the prefill may share (1: none)."""
    if not self.share_prefill:
      return 1
    g = prompt_groups(batch.tokens, batch.lengths)
    if self.mesh is not None and (batch.tokens.shape[0] // g) % self.mesh.size:
      return 1
    return g

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
               sampling: SamplingParams = SamplingParams(), prefix: Optional[Prefix] = None,
               return_cache: bool = False, rule_ids=None):
    """Samples a continuation of every row of `batch` (module docstring).

    `rule_ids` is `stop_rules.rule_ids(tokenizer, sampling.stop_rule)`: (ids, count), or
    None for no stop rule.

    With `prefix`, `batch.tokens` holds only the last M tokens of each row's context
    (left-padded) and `batch.lengths` the whole contexts' lengths (<= `prefix.width`): the
    rest is read from `prefix.cache`, moved by `prefix.shift`. With `return_cache`, returns
    (SamplerOutput, the call's cache) and keeps no buffer for reuse.
    """
    b, m = batch.tokens.shape
    if b == 0:
      raise ValueError("empty prompt batch")
    p = m if prefix is None else prefix.width
    if prefix is not None and not m <= p:
      raise ValueError(f"continuation chunk of {m} tokens exceeds the context width {p}")
    s = p + sampling.max_new_tokens
    if s > self.config.max_position_embeddings:
      raise ValueError(
          f"prompt bucket {p} + max_new_tokens {sampling.max_new_tokens} = {s} exceeds the "
          f"model's max_position_embeddings {self.config.max_position_embeddings}")
    if int(np.max(batch.lengths)) > p:
      raise ValueError(f"prompt length {int(np.max(batch.lengths))} exceeds the padded "
                       f"width {p}")
    tokens, lengths = batch.tokens, batch.lengths
    shift = None if prefix is None else np.asarray(prefix.shift, np.int32)
    if self.mesh is not None:
      from evotrainer.sharding.rules import named_sharding
      row = named_sharding(self.mesh, ("batch", None), self.rules, (b, m))
      tokens = jax.device_put(np.asarray(tokens), row)
      per_row = named_sharding(self.mesh, ("batch",), self.rules, (b,))
      lengths = jax.device_put(np.asarray(lengths), per_row)
      shift = None if shift is None else jax.device_put(shift, per_row)
    if prefix is None:
      fn, cache = self._fn, self._cache(b, s)
    else:
      fn, cache = self._continue_fn, prefix.cache
    group = self._group(batch) if prefix is None else 1
    out, cache = fn(
        params, cache, tokens, lengths, self._stop_array(stop_ids, b), rng,
        jnp.float32(sampling.temperature), shift, _rule_stop(rule_ids),
        max_new_tokens=sampling.max_new_tokens,
        top_k=sampling.top_k, top_p=float(sampling.top_p), greedy=sampling.greedy,
        pad_id=self.pad_id, rules=self.rules, vocab_limit=self.vocab_limit,
        width=None if prefix is None else p, group=group)
    if return_cache:
      return out, cache
    self._caches[(b, s)] = cache
    return out


def _rule_stop(rule_ids) -> RuleStop:
  if rule_ids is None:
    return RuleStop.none()
  ids, count = rule_ids
  return RuleStop(ids=np.asarray(ids, np.int32), count=np.int32(count))


# gin: `SamplingParams.max_new_tokens = 32`, `run.sampling = @SamplingParams()`.
import gin  # noqa: E402

gin.external_configurable(SamplingParams, module="sampling")
