"""Filters: trajectory sentinels, group filters, and the dynamic-sampling backfill policy.

Trajectory sentinels (`TrajectoryFilter`: episodes -> FilterResult) cut single episodes
that should not train the policy: truncated ones (hard / soft rules), echo-trap loops,
malformed ones (or any other recorded stop reason), and for multi-turn episodes abandoned
or idle ones (docs/method.md#stop-reasons). A cut row is masked out of its group's
statistics and gets advantage 0.

Group filters (`GroupFilter`: groups -> [num_groups] bool) judge GRPO groups by their
composed rewards (`episode.reward`, set by the composer). The pipeline hands them each
group's *kept* episodes, so a group whose only correct row was cut is dead; a group may
be empty.

`DynamicSampling` is DAPO's over-sampling with a backfill so the training batch keeps its
size: a pure helper the trainer asks how many groups to generate and which to train on.

Multi-turn records. The multi-turn sentinels read `episode.info['turns']` (the number of
policy turns, or a list with one record per turn) and `episode.info['tool_calls']` (a list
of dicts with at least 'name' and 'turn', the 0-based turn of the call). Episodes without
`info['turns']` are single-turn: these two sentinels keep them.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Optional, Sequence

import gin
import numpy as np

from evotrainer.harness.base import FilterResult, snippet
from evotrainer.harness.rewards import UNITS, completion_units
from evotrainer.tasks.answers import extract_answer
from evotrainer.types import Episode

# Extraction methods that count as "the completion gives an answer": explicit markers only.
# The last-number fallback is excluded: any long completion contains a number.
MARKED_ANSWER = ("answer_tag", "boxed", "hashes")


def _has_answer(ep: Episode, methods: Sequence[str]) -> bool:
  return extract_answer(ep.completion, methods)[0] is not None


# ---------------------------------------------------------------------------------------
# Trajectory sentinels.


@gin.configurable(module="harness")
class TruncationFilter:
  """Cuts truncated completions.

  - mode='hard': cut every episode with `episode.truncated` (hit max_new_tokens before a
    stop token).
  - mode='soft': cut an episode iff its length (tokens, stop included) is at least
    `limit - soft_threshold` AND the completion gives no marked answer (`answer_methods`:
    answer tag, box, `####`). A truncated completion that already gave its answer is kept
    (it was rambling after answering); one that stopped just short of the limit without
    answering is cut (it was about to be truncated).

  Args:
    mode: 'hard' or 'soft'.
    soft_threshold: tokens below the limit that count as "hit the limit" (soft mode).
    max_length: the token limit; None reads `episode.info['max_new_tokens']` (soft mode).
    answer_methods: extraction methods that count as an answer (soft mode).
    name: the filter's name.
  """

  def __init__(self, mode: str = "hard", soft_threshold: int = 20,
               max_length: Optional[int] = None,
               answer_methods: Sequence[str] = MARKED_ANSWER, name: str = "truncation"):
    if mode not in ("hard", "soft"):
      raise ValueError(f"TruncationFilter.mode={mode!r}; expected 'hard' or 'soft'")
    if soft_threshold < 0:
      raise ValueError(f"TruncationFilter.soft_threshold must be >= 0, got {soft_threshold}")
    self.mode, self.soft_threshold, self.max_length = mode, int(soft_threshold), max_length
    self.answer_methods, self.name = tuple(answer_methods), name

  def _limit(self, ep: Episode) -> int:
    limit = self.max_length if self.max_length is not None else ep.info.get("max_new_tokens")
    if limit is None:
      raise ValueError(f"TruncationFilter(mode='soft') needs the token limit: set "
                       f"TruncationFilter.max_length or info['max_new_tokens'] (episode "
                       f"{ep.episode_id!r} has neither)")
    return int(limit)

  def __call__(self, episodes: Sequence[Episode]) -> FilterResult:
    keep = np.ones(len(episodes), bool)
    reasons: list = [None] * len(episodes)
    for i, ep in enumerate(episodes):
      if self.mode == "hard":
        if ep.truncated:
          keep[i], reasons[i] = False, f"{self.name}: truncated at {ep.length} tokens"
      else:
        limit = self._limit(ep)
        if ep.completion_ids is None:
          raise ValueError(f"TruncationFilter(mode='soft') is token based but episode "
                           f"{ep.episode_id!r} has no completion_ids")
        length = ep.length
        if length >= limit - self.soft_threshold and not _has_answer(ep, self.answer_methods):
          keep[i] = False
          reasons[i] = (f"{self.name}: {length} tokens, within {self.soft_threshold} of the "
                        f"limit {limit}, and no answer")
    return FilterResult(keep=keep, reasons=tuple(reasons))


def find_loop(units: np.ndarray, n: int, max_repeats: int,
              max_period: int) -> Optional[tuple]:
  """The shortest echo-trap loop in `units` [L], or None.

  A loop is a block of `p` units, `n <= p <= max_period`, repeated back to back at least
  `max_repeats` times. Per period, vectorized over positions: `eq[j] = units[j] ==
  units[j - p]`; a run of R consecutive True ending at j means units[j - R - p + 1 .. j]
  has period p, i.e. (R + p) / p copies of the block, so a loop needs
  R >= (max_repeats - 1) * p. Cost O(L * max_period) time, O(L) memory.

  Returns:
    (period, repeats, start) of the loop with the shortest period, or None.
  """
  length = len(units)
  hi = min(max_period, length // max_repeats)
  if hi < n:
    return None
  # Cheap exit: a loop's first n-gram occurs at least `max_repeats` times.
  seq = units.tolist()
  counts = collections.Counter(zip(*(seq[i:] for i in range(n))))
  if max(counts.values()) < max_repeats:
    return None
  # One period at a time (shortest first), so memory stays O(L) for any text.
  for p in range(n, hi + 1):
    eq = units[p:] == units[:-p]  # [L - p]: units[j] == units[j - p], j = k + p
    k = np.arange(eq.size)
    run = k - np.maximum.accumulate(np.where(eq, -1, k))  # consecutive matches ending at k
    if run.max() >= (max_repeats - 1) * p:
      end = int(np.argmax(run))
      longest = int(run[end])
      return p, (longest + p) // p, end - longest + 1  # start = (end + p) - longest - p + 1
  return None


@gin.configurable(module="harness")
class EchoTrapFilter:
  """Cuts completions caught in a repetition loop (an "echo trap").

  Cut iff some block of `p` units with `n <= p <= max_period` repeats back to back at least
  `max_repeats` times (`find_loop`): e.g. with n=4, max_repeats=3 the words
  "x = 5 . x = 5 . x = 5 ." are a loop, "a b a b a b" (period 2 < n) and a sentence said
  twice are not.

  Args:
    n: the shortest block (n-gram) that counts as a loop.
    max_repeats: back-to-back copies that make a loop.
    max_period: the longest block searched (bounds the cost: O(L * max_period)).
    unit: 'tokens' (completion ids) or 'words' (whitespace split of the text).
    name: the filter's name.
  """

  def __init__(self, n: int = 4, max_repeats: int = 3, max_period: int = 64,
               unit: str = "tokens", name: str = "echo_trap"):
    if n < 1 or max_repeats < 2 or max_period < n or unit not in UNITS:
      raise ValueError(f"EchoTrapFilter: need n >= 1, max_repeats >= 2, max_period >= n, "
                       f"unit in {UNITS}; got n={n}, max_repeats={max_repeats}, "
                       f"max_period={max_period}, unit={unit!r}")
    self.n, self.max_repeats, self.max_period = int(n), int(max_repeats), int(max_period)
    self.unit, self.name = unit, name

  def __call__(self, episodes: Sequence[Episode]) -> FilterResult:
    keep = np.ones(len(episodes), bool)
    reasons: list = [None] * len(episodes)
    for i, ep in enumerate(episodes):
      loop = find_loop(completion_units(ep, self.unit), self.n, self.max_repeats,
                       self.max_period)
      if loop is not None:
        p, reps, start = loop
        where = ""
        if self.unit == "words":
          where = f": '{snippet(' '.join(ep.completion.split()[start:start + p]), 60)}'"
        keep[i] = False
        reasons[i] = (f"{self.name}: a {p}-{self.unit[:-1]} block repeats {reps} times in a "
                      f"row from {self.unit[:-1]} {start}{where}")
    return FilterResult(keep=keep, reasons=tuple(reasons))


def _turns(ep: Episode) -> Optional[int]:
  turns = ep.info.get("turns")
  if turns is None:
    return None
  if isinstance(turns, (list, tuple)):
    return len(turns)
  try:
    return int(turns)
  except (TypeError, ValueError):
    raise ValueError(f"episode {ep.episode_id!r}: info['turns'] = {turns!r}; expected a "
                     f"count or a list of turn records") from None


def _tool_calls(ep: Episode) -> list:
  calls = ep.info.get("tool_calls") or []
  for c in calls:
    if not isinstance(c, dict) or "name" not in c:
      raise ValueError(f"episode {ep.episode_id!r}: info['tool_calls'] entries must be "
                       f"dicts with 'name' (and 'turn'); got {c!r}")
  return list(calls)


@gin.configurable(module="harness")
class AbandonFilter:
  """Cuts multi-turn episodes that stopped on their own without submitting or answering.

  Abandoned iff: the episode is multi-turn (`info['turns']` present), made no call to a
  `submit_tools` tool, has no `info['submitted']`, gives no marked answer in its text, and
  did not run out of budget (not `truncated`, its stop reason `info['stop']` — what the
  trainer and the stop_reasons diagnostic read — not in `budget_stops`: running out is
  the truncation rules' business).

  Args:
    submit_tools: tool names that submit the work.
    answer_methods: extraction methods that count as an answer.
    budget_stops: stop reasons that mean the budget ran out.
    name: the filter's name.
  """

  def __init__(self, submit_tools: Sequence[str] = ("submit",),
               answer_methods: Sequence[str] = MARKED_ANSWER,
               budget_stops: Sequence[str] = ("max_turns", "max_tokens", "truncation"),
               name: str = "abandon"):
    self.submit_tools, self.answer_methods = tuple(submit_tools), tuple(answer_methods)
    self.budget_stops, self.name = tuple(budget_stops), name

  def __call__(self, episodes: Sequence[Episode]) -> FilterResult:
    keep = np.ones(len(episodes), bool)
    reasons: list = [None] * len(episodes)
    for i, ep in enumerate(episodes):
      turns = _turns(ep)
      if turns is None:
        continue
      submitted = (any(c["name"] in self.submit_tools for c in _tool_calls(ep))
                   or bool(ep.info.get("submitted")) or _has_answer(ep, self.answer_methods))
      stop = ep.info.get("stop")
      if not submitted and not ep.truncated and stop not in self.budget_stops:
        keep[i] = False
        reasons[i] = (f"{self.name}: ended after {turns} turns (stop={stop!r}) "
                      f"without submitting or answering")
    return FilterResult(keep=keep, reasons=tuple(reasons))


@gin.configurable(module="harness")
class IdleFilter:
  """Cuts multi-turn episodes with `max_idle_turns` consecutive turns doing nothing.

  A turn is idle when it has no tool call (of `active_tools`, or of any tool when None):
  the policy talks instead of reading, editing or running anything.

  Args:
    max_idle_turns: consecutive idle turns that cut an episode.
    active_tools: tool names that count as activity (None: every tool).
    name: the filter's name.
  """

  def __init__(self, max_idle_turns: int = 3, active_tools: Optional[Sequence[str]] = None,
               name: str = "idle"):
    if max_idle_turns < 1:
      raise ValueError(f"IdleFilter.max_idle_turns must be >= 1, got {max_idle_turns}")
    self.max_idle_turns = int(max_idle_turns)
    self.active_tools = None if active_tools is None else tuple(active_tools)
    self.name = name

  def __call__(self, episodes: Sequence[Episode]) -> FilterResult:
    keep = np.ones(len(episodes), bool)
    reasons: list = [None] * len(episodes)
    for i, ep in enumerate(episodes):
      turns = _turns(ep)
      if turns is None:
        continue
      active = np.zeros(turns, bool)
      for c in _tool_calls(ep):
        if "turn" not in c:
          raise ValueError(f"IdleFilter: a tool call of episode {ep.episode_id!r} has no "
                           f"'turn': {c!r}")
        if (self.active_tools is None or c["name"] in self.active_tools) and \
            0 <= int(c["turn"]) < turns:
          active[int(c["turn"])] = True
      run = best = start = best_start = 0
      for t in range(turns):
        run = 0 if active[t] else run + 1
        if run == 1:
          start = t
        if run > best:
          best, best_start = run, start
      if best >= self.max_idle_turns:
        keep[i] = False
        reasons[i] = (f"{self.name}: {best} consecutive turns without a tool call "
                      f"(turns {best_start}..{best_start + best - 1} of {turns})")
    return FilterResult(keep=keep, reasons=tuple(reasons))


@gin.configurable(module="harness")
class StopReasonFilter:
  """Cuts episodes whose stop reason (`episode.info['stop']`) is one of `stops`.

  The trainer records why each completion ended (`rollouts.Generation.episodes`):
  'stop_token', 'max_tokens', or 'malformed' when the task refused to read it (a text or
  answer too long, an answer nested too deep: the task's `malformed` part, see
  `MathTask.score_many`). By default malformed completions are cut, so they train
  nothing instead of counting as ordinary wrong answers. Episodes without a stop reason
  are kept.

  Args:
    stops: the stop reasons to cut.
    name: the filter's name.
  """

  def __init__(self, stops: Sequence[str] = ("malformed",), name: str = "stop_reason"):
    if isinstance(stops, str) or not stops:
      raise ValueError(f"StopReasonFilter.stops must be a non-empty list of stop reasons, "
                       f"got {stops!r}")
    self.stops, self.name = tuple(stops), name

  def __call__(self, episodes: Sequence[Episode]) -> FilterResult:
    stops = [(ep.info or {}).get("stop") for ep in episodes]
    keep = np.array([s not in self.stops for s in stops], bool)
    reasons = tuple(None if k else f"{self.name}: stopped {s!r}" for k, s in zip(keep, stops))
    return FilterResult(keep=keep, reasons=reasons)


# ---------------------------------------------------------------------------------------
# Group filters.


def group_stds(groups: Sequence[Sequence[Episode]]) -> np.ndarray:
  """[G] population std of each group's composed rewards (0 for fewer than 2 rows)."""
  return np.array([np.std([e.reward for e in g]) if len(g) >= 2 else 0.0 for g in groups],
                  np.float64)


# Rewards within this (relative) distance count as equal: a composed reward such as
# 0.1 * 3 vs 0.3 differs in the last bit, which is no signal.
DEAD_TOL = 1e-6


def dead_groups(groups: Sequence[Sequence[Episode]]) -> np.ndarray:
  """[G] bool: groups that carry no relative signal (all rewards equal within
  `DEAD_TOL` relative to their magnitude, or < 2 rows)."""

  def dead(g) -> bool:
    if len(g) < 2:
      return True
    r = np.array([e.reward for e in g], np.float64)
    return bool(np.ptp(r) <= DEAD_TOL * max(1.0, float(np.abs(r).max())))

  return np.array([dead(g) for g in groups], bool)


@gin.configurable(module="harness")
class DropZeroVarianceGroups:
  """Drops groups whose rewards are all equal (DAPO dynamic sampling, Yu et al. 2025).

  Such "dead" groups give every row advantage 0: they cost compute and dilute the batch.
  Pair with `DynamicSampling` to keep the batch size.
  """

  def __init__(self, name: str = "drop_zero_variance"):
    self.name = name

  def __call__(self, groups: Sequence[Sequence[Episode]]) -> np.ndarray:  # [G] bool
    return ~dead_groups(groups)


@gin.configurable(module="harness")
class StdGroupFilter:
  """Keeps groups whose within-group reward std is at least an EMA top-p threshold.

  Each call (one training step) takes q = the (1 - top_p) quantile of the groups'
  reward stds (numpy's linear interpolation), updates the threshold
  `t = q` on the first step and `t = ema * t + (1 - ema) * q` after, and keeps groups
  with std >= t. So about the top `top_p` share of groups by spread survive, with a
  threshold that moves slowly across steps. With many dead groups t can be 0 and dead
  groups pass: list `DropZeroVarianceGroups` too.

  State (`state()` / `load_state()`): the threshold and the number of steps seen.
  """

  def __init__(self, top_p: float = 0.9, ema: float = 0.9, name: str = "std_group"):
    if not 0.0 < top_p <= 1.0 or not 0.0 <= ema < 1.0:
      raise ValueError(f"StdGroupFilter: need 0 < top_p <= 1 and 0 <= ema < 1, got "
                       f"top_p={top_p}, ema={ema}")
    self.top_p, self.ema, self.name = float(top_p), float(ema), name
    self._threshold: Optional[float] = None
    self._steps = 0
    self._last: dict = {}

  def __call__(self, groups: Sequence[Sequence[Episode]]) -> np.ndarray:  # [G] bool
    if not groups:
      return np.zeros(0, bool)
    stds = group_stds(groups)
    q = float(np.quantile(stds, 1.0 - self.top_p))
    t = q if self._threshold is None else self.ema * self._threshold + (1.0 - self.ema) * q
    self._threshold, self._steps = t, self._steps + 1
    keep = stds >= t
    self._last = {"threshold": t, "quantile": q, "kept": float(keep.mean())}
    return keep

  def metrics(self) -> dict:
    """Figures of the last call: threshold, this step's quantile, share kept."""
    return dict(self._last)

  def state(self) -> dict:
    return {"threshold": self._threshold, "steps": self._steps}

  def load_state(self, state: dict) -> None:
    if set(state) != {"threshold", "steps"}:
      raise ValueError(f"StdGroupFilter.load_state: expected keys threshold, steps; got "
                       f"{sorted(state)}")
    t = state["threshold"]
    self._threshold = None if t is None else float(t)
    self._steps = int(state["steps"])


# ---------------------------------------------------------------------------------------
# Dynamic sampling (over-sampling + backfill).


@dataclasses.dataclass(frozen=True)
class Selection:
  """The groups a step trains on, in generation order."""

  groups: np.ndarray  # [target] int: group indices, ascending, no repeats
  backfilled: np.ndarray  # [target] bool: True where the group failed the filters
  num_passed: int  # groups that passed the filters, of all generated

  @property
  def num_backfilled(self) -> int:
    return int(self.backfilled.sum())


@gin.configurable(module="harness")
class DynamicSampling:
  """DAPO dynamic sampling with backfill (Yu et al. 2025): a fixed-size batch of live groups.

  The trainer generates `groups_to_generate(...)` groups per round, runs the harness, and
  stops when enough groups passed the group filters or after `max_rounds` rounds. Then
  `select` takes the first `target` passing groups in generation order; when fewer passed
  it backfills with failed groups (first generated first), so the batch has exactly
  `target` groups and no group (hence no episode) appears twice. Backfilled groups keep
  the filters' verdict: their rows are masked out (advantage 0) and only hold the shape.

  Args:
    oversample: groups generated per round = ceil(oversample * target) on the first round.
    max_rounds: generation rounds per step, at most.
  """

  def __init__(self, oversample: float = 1.5, max_rounds: int = 3):
    if oversample < 1.0 or max_rounds < 1:
      raise ValueError(f"DynamicSampling: need oversample >= 1 and max_rounds >= 1, got "
                       f"oversample={oversample}, max_rounds={max_rounds}")
    self.oversample, self.max_rounds = float(oversample), int(max_rounds)

  def groups_to_generate(self, target: int, generated: int = 0, passed: int = 0,
                         rounds: int = 0) -> int:
    """How many groups to generate next (0 = stop and `select`).

    Args:
      target: groups the training batch needs.
      generated: groups generated so far this step.
      passed: of those, groups that passed the group filters.
      rounds: generation rounds done so far this step.

    Returns:
      0 when `passed >= target` or the rounds are spent (but never fewer than the
      groups still missing to reach `target`); on the first round
      ceil(oversample * target); later, the missing passing groups divided by the pass
      rate seen so far, times `oversample`, at most ceil(oversample * target).
    """
    missing = max(0, target - generated)
    per_round = math.ceil(self.oversample * target)
    if passed >= target or rounds >= self.max_rounds:
      return missing
    if generated == 0:
      return per_round
    rate = passed / generated
    want = per_round if rate == 0 else math.ceil(self.oversample * (target - passed) / rate)
    return max(missing, min(want, per_round))

  def select(self, passed: np.ndarray, target: int) -> Selection:
    """The `target` groups to train on. `passed`: [G] bool, in generation order."""
    passed = np.asarray(passed, bool).reshape(-1)
    if target < 1 or passed.size < target:
      raise ValueError(f"DynamicSampling.select: {passed.size} groups generated for a batch "
                       f"of {target}; generate at least the target (groups_to_generate)")
    good = np.flatnonzero(passed)[:target]
    fill = np.flatnonzero(~passed)[:target - good.size]
    groups = np.sort(np.concatenate([good, fill]))
    return Selection(groups=groups, backfilled=~passed[groups], num_passed=int(passed.sum()))
