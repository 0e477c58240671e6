"""Multi-turn rollouts: episodes that alternate model turns and environment observations.

`MultiTurnEngine` has `SingleTurnEngine`'s signature and returns a `Generation`, so
`train()` and `evaluate()` use either; `rollout_for` picks this one for a task with
`multi_turn = True` (`tasks.base.MultiTurnTask`). One row is one episode (rows grouped G
per problem).

The turn loop, until every episode stopped:
  1. every running episode's context (its prompt ids + its trajectory ids so far) is
     left-padded into one batch of the full row count (stopped and padding rows get a
     1-token filler, sampled and discarded) whose width is a bucket below the context
     limit, so the sampler compiles one program per bucket at most; each row samples at
     most `TurnBudget.max_tokens_per_turn` tokens, ending at the tokenizer's stop ids.
     With `kv_continuation` (the default) a turn after the first continues from the
     previous turn's KV cache: each row's cached context moves to its new left-padded
     place (`sampling.sampler.Prefix`) and only the last M tokens of every context are
     prefilled (M: the bucket of the longest new part, the previous turn's last sampled
     id plus the observation); without it the whole context is re-prefilled every turn
     (bench/multiturn.py measures both);
  2. the sampled ids are appended to the trajectory exactly as sampled (token in, token
     out: never re-tokenized), with their sampler log-probs and loss mask 1;
  3. `env.step(decoded turn text)` runs for every such episode at once, each on its own
     host thread under `tool_time_limit_s`, on process 0 only (observations and stops
     are broadcast to the other processes);
  4. unless the episode stopped, `task.format_observation(observation)` is encoded (no
     BOS) and appended with loss mask 0 and log-prob 0; after a turn cut at
     `max_tokens_per_turn` (no stop id sampled), the task's `end_of_turn` text (its chat
     template's end of a turn; absent: "") goes first, so the context stays well formed.
At the end `task.finish_episodes` grades every episode (process 0; scores broadcast).

Overlap (`overlap_waves` W >= 2): the rows are split into W waves of one fixed row count
(so no new sampler programs) that take turns on the sampler in a fixed order. A wave
collects its last step's results (steps 3-4), samples its next turn (steps 1-2) and
hands its env steps to a host worker; the sampler then runs the next wave's turn while
those tools run (JAX releases the GIL while it computes). Each wave keeps its own KV
cache and turn count; the order, the keys and every process's collectives do not depend
on the tools' timing, and each step keeps its own `tool_time_limit_s` deadline.

Stop reasons (`Episode.info['stop']`; `truncated` = a budget stop, `BUDGET_STOPS`):
  submitted, echo_trap, tool_error, ...  the environment's own (`env.stop`; `max_turns`
                                         too when the env keeps its own turn budget)
  max_turns    `TurnBudget.max_turns` model turns taken
  max_context  the next turn (`max_tokens_per_turn` more tokens) or the next observation
               would not fit in the context limit
  max_tokens   the episode's model tokens reached `TurnBudget.max_model_tokens`. A turn
               that hits `max_tokens_per_turn` without a stop id is not a stop: its text
               still goes to the environment (the model simply wrote a long turn)
  env_timeout  one `env.step` ran longer than `tool_time_limit_s`
  tool_error   `env.step` raised (contained: the episode stops, the batch goes on), or
               the environment stopped with it
Each row's scores carry the stop one-hot as `stop_<reason>` parts (`STOPS`, plus the
reason itself when an environment reports another), so `generation.stop_reason` and
`Episode.info['stop']` agree.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Optional, Sequence

import gin
import jax
import numpy as np

from evotrainer.rollouts.generation import Generation, cut_at_stop
from evotrainer.rollouts.single_turn import SingleTurnEngine
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sampling.sampler import DEFAULT_BUCKETS, Prefix, bucket_length
from evotrainer.types import PromptBatch
from evotrainer.sharding.multihost import broadcast_json, is_primary, to_host

# Every stop reason of the SWE taxonomy (issue 13); each row's scores carry all of them.
STOPS = ("submitted", "max_turns", "max_context", "max_tokens", "env_timeout", "tool_error",
         "echo_trap", "abandon", "idle")
BUDGET_STOPS = ("max_turns", "max_context", "max_tokens", "env_timeout")


@gin.configurable(module="rollouts")
@dataclasses.dataclass(frozen=True)
class TurnBudget:
  """The budgets of one multi-turn episode.

  Attributes:
    max_turns: model turns at most; then the episode stops 'max_turns'.
    max_context: prompt + trajectory tokens at most (capped further by the model's
      `max_position_embeddings`); an episode whose next turn or observation would not
      fit stops 'max_context'.
    max_tokens_per_turn: tokens sampled per model turn at most (the turn ends earlier at
      a stop id). `SamplingParams.max_new_tokens` is not read by the multi-turn engine.
    max_model_tokens: the episode's sampled tokens at most, over all turns (None: no such
      budget); reaching it stops the episode 'max_tokens' after that turn's step.
    tool_time_limit_s: wall-clock seconds one `env.step` may take; a longer step stops
      the episode 'env_timeout' (the step's thread is abandoned, not killed: the tools
      themselves must bound their work, as the sandbox does).
    mask_budget_stops: episodes that end on a budget (`BUDGET_STOPS`) get an all-zero
      loss mask, so a cut-off trajectory trains nothing. (The harness-side alternative,
      which the evolution can toggle: `StopReasonFilter.stops` listing those reasons
      cuts such episodes from the batch.)
  """

  max_turns: int = 8
  max_context: int = 1024
  max_tokens_per_turn: int = 64
  max_model_tokens: Optional[int] = None
  tool_time_limit_s: float = 60.0
  mask_budget_stops: bool = False

  def __post_init__(self):
    if self.max_turns < 1 or self.max_tokens_per_turn < 1:
      raise ValueError(f"TurnBudget.max_turns and .max_tokens_per_turn must be >= 1 "
                       f"(got {self.max_turns}, {self.max_tokens_per_turn})")
    if self.max_context <= self.max_tokens_per_turn:
      raise ValueError(f"TurnBudget.max_context={self.max_context} must exceed "
                       f"max_tokens_per_turn={self.max_tokens_per_turn} (room for a prompt)")
    if self.max_model_tokens is not None and self.max_model_tokens < 1:
      raise ValueError(f"TurnBudget.max_model_tokens must be >= 1 or None, got "
                       f"{self.max_model_tokens}")
    if not self.tool_time_limit_s > 0:
      raise ValueError(f"TurnBudget.tool_time_limit_s must be > 0, got "
                       f"{self.tool_time_limit_s}")


@dataclasses.dataclass
class EpisodeTrack:
  """One episode's token trajectory as it grows (host side).

  Attributes:
    ids: trajectory ids after the prompt: sampled turns and encoded observations.
    logprobs: the sampler's log-prob of each sampled id, 0 at observation ids.
    mask: True at sampled ids (trained), False at observation ids.
    spans: per model turn [start, end, sum of its log-probs], indices into `ids`.
    text: the decoded trajectory (turn texts with stop ids cut, observation texts).
    stop: None while running, else the stop reason.
    error: what went wrong for 'tool_error' / 'env_timeout' stops by the engine.
  """

  ids: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  mask: list = dataclasses.field(default_factory=list)
  spans: list = dataclasses.field(default_factory=list)
  text: str = ""
  stop: Optional[str] = None
  error: Optional[str] = None

  @property
  def model_tokens(self) -> int:
    return int(sum(self.mask))


@dataclasses.dataclass
class _Cached:
  """A turn's KV cache and, per row, its left padding and the context tokens it holds."""
  cache: object
  pad: np.ndarray
  fed: np.ndarray


@dataclasses.dataclass
class _Wave:
  """A fixed set of batch slots that samples its turns together (`overlap_waves`).

  Attributes:
    slots: each batch slot's row, None for a filler slot.
    turn: model turns sampled so far.
    kv: the last turn's cache (`_Cached`), with kv_continuation.
    stepping: the rows whose env steps of the last turn are awaited.
    future: those steps' results (process 0 only).
  """
  slots: list
  turn: int = 0
  kv: Optional[_Cached] = None
  stepping: list = dataclasses.field(default_factory=list)
  future: Optional[concurrent.futures.Future] = None

  @property
  def rows(self) -> list:
    return [i for i in self.slots if i is not None]


def context_buckets(cap: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> tuple:
  """The bucket widths below `cap`, then `cap` itself: widths never exceed the cap, and
  a run compiles one program per bucket at most."""
  return tuple(b for b in buckets if b < cap) + (cap,)


@gin.configurable(module="rollouts",
                  denylist=["task", "tokenizer", "sampler", "sampler_shardings"])
class MultiTurnEngine:
  """Problems -> batched multi-turn episodes -> a scored `Generation` (module docstring).

  Args:
    task: a `tasks.base.MultiTurnTask`.
    tokenizer: the policy's tokenizer (its `stop_ids`, and the task's `turn_end_texts`
      tokens, end a model turn).
    sampler: the compiled sampler.
    sampler_shardings: parameter shardings of the sampler (as `SingleTurnEngine`'s).
    budget: the episode budgets (gin: `MultiTurnEngine.budget = @TurnBudget()`).
    kv_continuation: continue each turn from the previous turn's KV cache (prefill only
      the new tokens); False: re-prefill every context every turn (module docstring).
    overlap_waves: W >= 2 splits the batch's rows into W waves of one fixed row count
      that take turns on the sampler: while one wave's env steps (tools) run on host
      workers, the sampler runs another wave's turn. 1: lock-step (every row samples,
      then every env steps). Wave w's turn t samples with `fold_in(key, t * W + w)`, so
      a run is reproducible whatever the tools' timing, but other W sample other tokens
      at temperature > 0 (greedy: the same tokens). (module docstring; bench/multiturn.py
      --env_latency_s measures it.)
  """

  def __init__(self, task, tokenizer, sampler: Sampler, sampler_shardings=None,
               budget: TurnBudget = TurnBudget(), kv_continuation: bool = True,
               overlap_waves: int = 1):
    if overlap_waves < 1:
      raise ValueError(f"MultiTurnEngine.overlap_waves must be >= 1, got {overlap_waves}")
    for name in ("start_episode", "format_observation", "finish_episodes"):
      if not callable(getattr(task, name, None)):
        raise TypeError(f"{type(task).__name__} declares multi_turn but has no {name}() "
                        "(see tasks.base.MultiTurnTask)")
    env_turns = getattr(task, "max_turns", None)
    if env_turns is not None and env_turns != budget.max_turns:
      raise ValueError(
          f"{type(task).__name__}.max_turns={env_turns} (the environment's own turn "
          f"budget) differs from TurnBudget.max_turns={budget.max_turns}: bind both to one "
          f"value (gin: a macro, as gin/swe_train.gin's MAX_TURNS)")
    self.task = task
    self.tok = tokenizer
    self.sampler = sampler
    self.sampler_shardings = sampler_shardings
    self.budget = budget
    self.kv_continuation = kv_continuation
    self.overlap_waves = overlap_waves
    # Prompt + trajectory tokens at most; every sampled context leaves room for a turn.
    self.context_limit = min(budget.max_context, sampler.config.max_position_embeddings)
    if self.context_limit <= budget.max_tokens_per_turn:
      raise ValueError(
          f"the context limit {self.context_limit} (min of TurnBudget.max_context and the "
          f"model's max_position_embeddings) leaves no room for a prompt before a turn of "
          f"TurnBudget.max_tokens_per_turn={budget.max_tokens_per_turn} tokens")
    self.buckets = context_buckets(self.context_limit - budget.max_tokens_per_turn)
    self.turn_stop_ids = tuple(tokenizer.stop_ids) + text_stop_ids(
        tokenizer, getattr(task, "turn_end_texts", ()))

  def __call__(self, params, problems: Sequence, group: int, key: jax.Array,
               sampling: SamplingParams, pad_rows_to: Optional[int] = None) -> Generation:
    """Runs G episodes per problem; `sampling` gives temperature / top-k / top-p /
    greedy (its `max_new_tokens` is replaced by `TurnBudget.max_tokens_per_turn`). A
    turn ends at a stop id or its budget; `SamplingParams.stop_rule` is single-turn only."""
    if sampling.stop_rule:
      raise ValueError(f"SamplingParams.stop_rule = {sampling.stop_rule!r} applies to "
                       "single-turn rollouts; a multi-turn episode's turns end at a stop id "
                       "or TurnBudget.max_tokens_per_turn")
    if self.sampler_shardings is not None:
      params = jax.device_put(params, self.sampler_shardings)
    budget = self.budget
    rows = [p for p in problems for _ in range(group)]
    prompts = [self.tok.encode(self.task.format_prompt(p), add_bos=True) for p in rows]
    primary = is_primary()
    envs = [self.task.start_episode(p) for p in rows] if primary else None
    tracks = [EpisodeTrack() for _ in rows]
    turn = dataclasses.replace(sampling, max_new_tokens=budget.max_tokens_per_turn)
    room = self.context_limit - budget.max_tokens_per_turn  # context before a turn
    waves = [_Wave(slots) for slots in self._wave_slots(len(rows), pad_rows_to)]
    # The waves take turns on the sampler in a fixed order (the same on every process,
    # whatever the tools' timing): a wave collects its last step's results, samples its
    # next turn and hands the step to a host worker, then the next wave samples while
    # that step runs. With one wave this is the lock-step loop.
    queue = collections.deque(waves)
    with concurrent.futures.ThreadPoolExecutor(len(waves), "env-wave") as pool:
      while queue:
        wave = queue.popleft()
        if wave.stepping:
          # Process 0 steps the environments (tools run under wall-clock limits, so
          # hosts could disagree) and sends every process the same observations and stops.
          results = broadcast_json(wave.future.result() if primary else None)
          for i, (observation, stop, error) in zip(wave.stepping, results):
            self._after_step(tracks[i], observation, stop, error, len(prompts[i]), wave.turn)
        for i in wave.rows:
          if tracks[i].stop is None and len(prompts[i]) + len(tracks[i].ids) > room:
            tracks[i].stop = "max_context"  # only a prompt too long for one turn gets here
        wave.stepping = [i for i in wave.rows if tracks[i].stop is None]
        if not wave.stepping:
          continue
        texts, wave.kv = self._sample_turn(
            params, prompts, tracks, wave.slots, wave.stepping,
            jax.random.fold_in(key, wave.turn * len(waves) + waves.index(wave)), turn, wave.kv)
        wave.turn += 1
        if primary:
          wave.future = pool.submit(_step_envs, [envs[i] for i in wave.stepping],
                                    [texts[i] for i in wave.stepping], budget.tool_time_limit_s)
        queue.append(wave)
    finished = None
    if primary:
      finished = {"scores": self.task.finish_episodes(rows, envs),
                  "infos": [env.info() for env in envs]}
    finished = broadcast_json(finished)
    return self._generation(rows, prompts, tracks, finished["scores"], finished["infos"])

  def _wave_slots(self, n: int, pad_rows_to: Optional[int]) -> list:
    """Per wave, its batch slots' rows (None: a filler slot). Every wave has one fixed
    row count (ceil(batch rows / waves), rounded up to a multiple of the mesh's devices so
    any batch sharding divides it), the real rows spread evenly over the waves: one
    sampler program per bucket, as in lock-step. Fewer waves than asked when the rows
    do not fill that many (a device's worth of slots per wave at least, a real row in
    each: a wave of filler rows would sample for nothing)."""
    b = max(n, pad_rows_to or 0)
    mesh = getattr(self.sampler, "mesh", None)
    devices = 1 if mesh is None else mesh.devices.size
    w = max(1, min(self.overlap_waves, n, b // devices))
    if w == 1:
      return [list(range(n)) + [None] * (b - n)]
    q = -(-n // w)  # rows per wave, the last wave's fewer: spread for balanced waves
    r = -(-b // w)
    r = -(-r // devices) * devices  # slots per wave (>= q)
    waves = [list(range(k, min(k + q, n))) for k in range(0, n, q)]
    return [rows + [None] * (r - len(rows)) for rows in waves]

  def _sample_turn(self, params, prompts: list, tracks: list, slots: list, live: list,
                   key: jax.Array, turn: SamplingParams, kv: Optional["_Cached"]
                   ) -> tuple[dict, Optional["_Cached"]]:
    """Samples one turn for the `live` rows in a batch of `slots` (each slot's row, None
    for a filler); appends the sampled ids to their tracks. Returns ({row: decoded turn
    text}, the cache to continue from)."""
    b = len(slots)
    filler = [self.tok.pad_id]
    live = set(live)
    live_slots = [j for j, i in enumerate(slots) if i in live]
    contexts = [filler] * b
    for j in live_slots:
      contexts[j] = prompts[slots[j]] + tracks[slots[j]].ids
    lengths = np.array([len(c) for c in contexts], np.int32)
    width = bucket_length(int(lengths.max()), self.buckets)
    prefix = None
    if kv is None:
      batch = left_pad(contexts, self.tok.pad_id, self.buckets)
    else:
      # Rows keep their cached tokens; the last M of every context are prefilled (filler
      # rows' single token too). Live rows were live last turn, so `kv.fed` covers them.
      new = np.where(np.isin(np.arange(b), live_slots), lengths - kv.fed, lengths)
      m = min(bucket_length(int(new.max()), self.buckets), width)
      chunk = left_pad([c[-m:] for c in contexts], self.tok.pad_id, (m,))
      batch = PromptBatch(tokens=chunk.tokens, lengths=lengths)
      prefix = Prefix(kv.cache, (width - lengths) - kv.pad, width)
    # Every process samples the same shapes and gathers the whole batch (a collective).
    out = self.sampler(params, batch, key, stop_ids=self.turn_stop_ids, sampling=turn,
                       prefix=prefix, return_cache=self.kv_continuation)
    if self.kv_continuation:
      out, cache = out
    out = to_host(out)
    texts = {}
    for j in live_slots:
      i = slots[j]
      k = int(out.lengths[j])
      ids, logp = out.tokens[j, :k], out.logprobs[j, :k]
      tr = tracks[i]
      tr.spans.append([len(tr.ids), len(tr.ids) + k, float(np.sum(logp, dtype=np.float64))])
      tr.ids += ids.tolist()
      tr.logprobs += logp.tolist()
      tr.mask += [True] * k
      texts[i] = self.tok.decode(cut_at_stop(ids, self.tok.stop_ids))
      tr.text += texts[i]
    if not self.kv_continuation:
      return texts, None
    # Fed to the model: the context and every sampled id but the last.
    return texts, _Cached(cache, pad=width - lengths,
                          fed=lengths + np.asarray(out.lengths, np.int32) - 1)

  def _after_step(self, tr: EpisodeTrack, observation: Optional[str], stop: Optional[str],
                  error: Optional[str], prompt_len: int, turns: int) -> None:
    """Records one environment step: the stop it decided, else the budgets', else the
    observation appended (masked out of the loss)."""
    budget = self.budget
    tr.error = error
    if stop is None and turns >= budget.max_turns:
      stop = "max_turns"
    if stop is None and budget.max_model_tokens is not None and \
        tr.model_tokens >= budget.max_model_tokens:
      stop = "max_tokens"
    if stop is None:
      text = self.task.format_observation(observation)
      # A turn cut at its budget is closed as its stop id would have (ids only: the text
      # keeps turns without their stop ids).
      cut = bool(tr.ids) and tr.ids[-1] not in self.turn_stop_ids
      closing = getattr(self.task, "end_of_turn", "") if cut else ""
      ids = self.tok.encode(closing + text, add_bos=False)
      if prompt_len + len(tr.ids) + len(ids) > self.context_limit - budget.max_tokens_per_turn:
        stop = "max_context"
      else:
        tr.ids += ids
        tr.logprobs += [0.0] * len(ids)
        tr.mask += [False] * len(ids)
        tr.text += text
    tr.stop = stop

  def _generation(self, rows: list, prompts: list, tracks: list, scores: list,
                  infos: list) -> Generation:
    """The host record of the finished episodes; widths bucketed (bounded learner
    programs), trajectories right-padded with the pad id."""
    n = len(rows)
    lengths = np.array([len(tr.ids) for tr in tracks], np.int32)
    width = _bucket(max(1, int(lengths.max())), context_buckets(self.context_limit))
    tokens = np.full((n, width), self.tok.pad_id, np.int32)
    logprobs = np.zeros((n, width), np.float32)
    mask = np.zeros((n, width), bool)
    for i, tr in enumerate(tracks):
      tokens[i, :len(tr.ids)] = tr.ids
      logprobs[i, :len(tr.ids)] = tr.logprobs
      mask[i, :len(tr.ids)] = tr.mask
    truncated = np.array([tr.stop in BUDGET_STOPS for tr in tracks])
    if self.budget.mask_budget_stops:
      mask &= ~truncated[:, None]
    prompt = left_pad(prompts, self.tok.pad_id)
    out_scores, out_infos = [], []
    for tr, score, info in zip(tracks, scores, infos):
      stops = {f"stop_{r}": float(r == tr.stop) for r in STOPS + (tr.stop,)}
      out_scores.append({**score, **stops})
      record = {"turns": len(tr.spans), **info, "stop": tr.stop, "turn_spans": tr.spans,
                "model_tokens": tr.model_tokens}
      if tr.error is not None:
        record["error"] = tr.error
      out_infos.append(record)
    return Generation(problems=rows, prompt_tokens=np.asarray(prompt.tokens),
                      prompt_lengths=np.asarray(prompt.lengths), tokens=tokens,
                      logprobs=logprobs, lengths=lengths, truncated=truncated,
                      texts=[tr.text for tr in tracks], scores=out_scores, loss_mask=mask,
                      infos=out_infos)


def _bucket(n: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= n)


def _step_envs(envs: Sequence, texts: Sequence[str], limit_s: float) -> list:
  """[observation, stop, error] per env after `env.step(text)`, all envs at once.

  Each step runs on its own daemon thread (tools block on subprocesses and I/O; the
  batch bounds the thread count), so one slow tool delays no other episode, and a step
  past `limit_s` is abandoned ('env_timeout') without holding up the batch or the
  interpreter's exit. A raise is contained as 'tool_error' with the exception's text.
  """
  out: list = [None] * len(envs)

  def work(j: int) -> None:
    try:
      observation = envs[j].step(texts[j])
      if not isinstance(observation, str):
        raise TypeError(f"env.step returned {type(observation).__name__}, not str")
      out[j] = [observation, envs[j].stop, None]
    except Exception as e:  # contained: only this episode stops
      out[j] = [None, "tool_error", f"{type(e).__name__}: {e}"]

  threads = [threading.Thread(target=work, args=(j,), daemon=True, name=f"env-step-{j}")
             for j in range(len(envs))]
  deadline = time.monotonic() + limit_s
  for th in threads:
    th.start()
  results = []  # read once per step: an abandoned thread may still write `out` later
  for j, th in enumerate(threads):
    th.join(timeout=max(0.0, deadline - time.monotonic()))
    done = out[j]
    results.append(done if done is not None else
                   [None, "env_timeout", f"env.step ran over {limit_s}s"])
  return results


def text_stop_ids(tokenizer, texts: Sequence[str]) -> tuple:
  """The ids of every token of `tokenizer` whose decoded text, stripped, is one of
  `texts`, in id order; () for no texts. Raises ValueError when a text has none."""
  if not texts:
    return ()
  wanted = {t.strip() for t in texts}
  ids = tuple(i for i in range(tokenizer.vocab_size) if tokenizer.decode([i]).strip() in wanted)
  missing = wanted - {tokenizer.decode([i]).strip() for i in ids}
  if missing:
    raise ValueError(f"turn_end_texts {sorted(missing)}: no token of the tokenizer is "
                     f"that text")
  return ids


def rollout_for(task, tokenizer, sampler: Sampler, sampler_shardings=None):
  """The rollout engine of `task`: `MultiTurnEngine` when it declares `multi_turn =
  True`, else `SingleTurnEngine`."""
  if getattr(task, "multi_turn", False):
    return MultiTurnEngine(task, tokenizer, sampler, sampler_shardings)
  return SingleTurnEngine(task, tokenizer, sampler, sampler_shardings)
