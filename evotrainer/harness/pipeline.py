"""The harness pipeline: episodes -> rewards -> filters -> advantages for the learner.

    episodes (groups contiguous)
      -> RewardComposer: reward parts, composed reward, quarantine of non-finite rows
      -> trajectory filters: keep mask + a reason per cut row
      -> group filters over each group's kept rows (composed rewards)
      -> LiveGroupCurriculum (optional): counts each prompt's live groups for later draws
      -> DynamicSampling (optional): which groups form the batch, backfill
      -> advantages with the estimator over kept rows only, optional whitening
      -> HarnessOutput (+ metrics per component)

Configured in gin, e.g.

    Harness.composer = @RewardComposer()
    RewardComposer.parts = {'correct': 1.0, 'overlong': 1.0}
    RewardComposer.components = [@OverlongPenalty()]
    Harness.trajectory_filters = [@TruncationFilter(), @EchoTrapFilter()]
    Harness.group_filters = [@DropZeroVarianceGroups(), @StdGroupFilter()]
    Harness.estimator = 'grpo'
    Harness.dynamic_sampling = @DynamicSampling()
    Harness.curriculum = @LiveGroupCurriculum()

Stateful components (e.g. StdGroupFilter's EMA threshold) expose `state()` /
`load_state()`; `Harness.state()` gathers them, and `HarnessOutput.state` is the state
*before* the call, so storing it with a step lets a replay reproduce the step exactly.
`describe()` is the JSON record of the active components and knobs (saved with each
checkpoint). Everything runs on the host in numpy, except the estimator call, which reuses
the learner's estimators (learner/advantages.py) pinned to the CPU device.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from evotrainer.harness.base import FilterResult, groups_of
from evotrainer.harness.curriculum import LiveGroupCurriculum
from evotrainer.harness.filters import (AbandonFilter, DropZeroVarianceGroups, DynamicSampling,
                                        EchoTrapFilter, IdleFilter, StdGroupFilter,
                                        TruncationFilter, dead_groups)
from evotrainer.harness.rewards import RewardComposer, part_name
from evotrainer.learner import advantages as adv_lib
from evotrainer.types import Episode


# Built-in kinds, to catch a filter listed under the wrong kind when the harness is built.
_GROUP_FILTERS = (DropZeroVarianceGroups, StdGroupFilter)
_TRAJECTORY_FILTERS = (TruncationFilter, EchoTrapFilter, AbandonFilter, IdleFilter)


@dataclasses.dataclass(frozen=True)
class HarnessOutput:
  """What one harness step hands to the learner and the diagnostics (rows = input rows)."""

  rewards: np.ndarray  # [n] float32 composed reward (0 for quarantined rows)
  keep: np.ndarray  # [n] bool: the row trains (passed every filter and is in the batch)
  reasons: tuple  # [n] Optional[str]: why a row does not train (None when it does)
  advantages: np.ndarray  # [n] float32, 0 where not kept
  batch: np.ndarray  # [m] int row indices of the training batch (m = groups * group_size)
  group_keep: np.ndarray  # [G] bool: groups that passed every group filter
  metrics: dict  # {name: float}: per-component figures (see Harness.process)
  state: dict  # Harness.state() before this call: load it to replay the step


def _jsonable(x):
  if isinstance(x, (str, bool, int, float)) or x is None:
    return x
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if hasattr(x, "__call__") and (hasattr(x, "name") or inspect.isfunction(x)):
    return describe_component(x)
  return repr(x)


def describe_component(component) -> dict:
  """{'class': ..., 'name': ..., knobs...}: a component's public attributes, JSON-able."""
  if inspect.isfunction(component):
    return {"function": f"{component.__module__}.{component.__qualname__}"}
  out = {"class": type(component).__name__}
  for k, v in vars(component).items():
    if not k.startswith("_"):
      out[k] = _jsonable(v)
  return out


def _check_unique(kind: str, components: Sequence) -> list:
  names = [part_name(c) for c in components]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise ValueError(f"Harness.{kind}: duplicate component names {dupes}; give each a "
                     f"distinct `name`")
  return names


@gin.configurable(module="harness")
class Harness:
  """The operative harness: composer, filters, estimator, whitening, dynamic sampling.

  Args:
    composer: the RewardComposer (default: reward = 'correct').
    trajectory_filters: TrajectoryFilters, applied in order; a row's reason is the first
      one that cut it (each filter's own cut share is reported separately).
    group_filters: GroupFilters, all applied to the same groups; a group must pass all.
    estimator: 'grpo', 'dr_grpo' or 'rloo' (learner/advantages.py ESTIMATORS).
    estimator_kwargs: extra arguments of the estimator (e.g. {'ddof': 1}).
    whiten: whiten the advantages over the kept rows of the batch.
    dynamic_sampling: a DynamicSampling policy, or None (train on every group given).
    curriculum: a LiveGroupCurriculum that picks each step's prompts from a larger draw
      by how often their groups were live, or None (the task's own draw).
  """

  def __init__(self, composer: Optional[RewardComposer] = None,
               trajectory_filters: Sequence = (), group_filters: Sequence = (),
               estimator: str = "grpo", estimator_kwargs: Optional[dict] = None,
               whiten: bool = False, dynamic_sampling: Optional[DynamicSampling] = None,
               curriculum: Optional[LiveGroupCurriculum] = None):
    if estimator not in adv_lib.ESTIMATORS:
      raise ValueError(f"Harness.estimator={estimator!r}; expected one of "
                       f"{sorted(adv_lib.ESTIMATORS)}")
    self.composer = composer if composer is not None else RewardComposer()
    self.trajectory_filters = list(trajectory_filters)
    self.group_filters = list(group_filters)
    for f in self.trajectory_filters:
      if isinstance(f, _GROUP_FILTERS):
        raise ValueError(f"Harness.trajectory_filters lists {type(f).__name__}, a group "
                         f"filter: list it in Harness.group_filters")
    for f in self.group_filters:
      if isinstance(f, _TRAJECTORY_FILTERS):
        raise ValueError(f"Harness.group_filters lists {type(f).__name__}, a trajectory "
                         f"filter: list it in Harness.trajectory_filters")
    _check_unique("trajectory_filters", self.trajectory_filters)
    _check_unique("group_filters", self.group_filters)
    self.estimator = estimator
    self.estimator_kwargs = dict(estimator_kwargs or {})
    self.whiten = bool(whiten)
    self.dynamic_sampling = dynamic_sampling
    self.curriculum = curriculum

  # -- state and description --------------------------------------------------------------

  def _stateful(self) -> dict:
    out = {}
    for section, comps in (("composer", self.composer.components),
                           ("trajectory_filters", self.trajectory_filters),
                           ("group_filters", self.group_filters),
                           ("curriculum", [] if self.curriculum is None
                            else [self.curriculum])):
      for c in comps:
        if callable(getattr(c, "state", None)):
          out[f"{section}/{part_name(c)}"] = c
    return out

  def state(self) -> dict:
    """{'section/name': component state} of every stateful component (a deep copy)."""
    return {k: copy.deepcopy(c.state()) for k, c in self._stateful().items()}

  def load_state(self, state: dict, strict: bool = True) -> None:
    """Restores `state()`. strict=False (replaying under a changed harness) skips entries
    without a component and leaves components without an entry as they are."""
    comps = self._stateful()
    if strict and set(state) != set(comps):
      raise ValueError(f"Harness.load_state: state has {sorted(state)} but the stateful "
                       f"components are {sorted(comps)}")
    for k, c in comps.items():
      if k in state:
        c.load_state(copy.deepcopy(state[k]))

  def describe(self) -> dict:
    """A JSON-able record of the active components and their knobs."""
    comp = self.composer
    return {
        "composer": {"class": type(comp).__name__, "parts": dict(comp.parts),
                     "clip": None if comp.clip is None else list(comp.clip),
                     "components": [describe_component(c) for c in comp.components]},
        "trajectory_filters": [describe_component(f) for f in self.trajectory_filters],
        "group_filters": [describe_component(f) for f in self.group_filters],
        "estimator": self.estimator,
        "estimator_kwargs": _jsonable(self.estimator_kwargs),
        "whiten": self.whiten,
        "dynamic_sampling": (None if self.dynamic_sampling is None
                             else describe_component(self.dynamic_sampling)),
        "curriculum": (None if self.curriculum is None
                       else describe_component(self.curriculum)),
    }

  # -- one step ---------------------------------------------------------------------------

  def process(self, episodes: Sequence[Episode], group_size: int,
              target_groups: Optional[int] = None, update_state: bool = True) -> HarnessOutput:
    """Rewards, keep mask, reasons and advantages of one step's episodes.

    Args:
      episodes: [n] episodes, groups of `group_size` contiguous rows with one group_id.
      group_size: rows per group.
      target_groups: groups in the training batch (needs `dynamic_sampling`); default:
        every group given.
      update_state: False leaves stateful components as they were (a dynamic-sampling
        round that only counts passing groups, or a dry run).

    Returns:
      HarnessOutput. Metrics: 'cut/quarantine', 'cut/<filter>' (share of rows each
      trajectory filter cuts, on its own), 'cut/total'; 'groups/total', 'groups/passed',
      'groups/in_batch', 'groups/backfilled', 'groups_dropped/<filter>' (count, on its own);
      'curriculum/problems', 'curriculum/live_share' (with a curriculum, after counting
      this call's groups); 'dead_group_ratio/raw' (all rows), '/before' (kept rows,
      before group filters),
      '/after' (share of the batch's groups without a trainable signal: the passing
      groups, plus backfilled ones under dynamic sampling; 1 when no group trains);
      '<filter>/<figure>' from components with `metrics()`; 'reward/mean',
      'reward_part/<name>', 'adv/nonzero' and 'keep/batch_share' (over the batch's rows).
    """
    episodes = list(episodes)
    n = self._check_layout(episodes, group_size)
    num_groups = n // group_size
    state_before = self.state()
    metrics: dict = {}

    composed = self.composer(episodes)
    rewards = composed.rewards  # [n] float32
    keep, reasons = self._trajectory_cut(episodes, composed, metrics)
    rows = np.arange(n).reshape(num_groups, group_size)  # [G, group_size]
    kept_groups = [[episodes[i] for i in r if keep[i]] for r in rows]
    metrics["dead_group_ratio/raw"] = float(dead_groups(groups_of(episodes)).mean())
    metrics["dead_group_ratio/before"] = float(dead_groups(kept_groups).mean())
    group_keep = self._group_cut(episodes, kept_groups, rows, keep, reasons, metrics)
    if self.curriculum is not None:
      self.curriculum.update(episodes)
      metrics.update({f"curriculum/{k}": v for k, v in self.curriculum.metrics().items()})
    if not update_state:
      self.load_state(state_before)

    batch_groups, backfilled = self._batch_groups(group_keep, target_groups)
    selected = np.zeros(num_groups, bool)
    selected[batch_groups] = True
    row_group = np.arange(n) // group_size  # [n]
    over = keep & group_keep[row_group] & ~selected[row_group]
    for i in np.flatnonzero(over):
      reasons[i] = "dynamic_sampling: group not selected (batch already full)"
    keep = keep & group_keep[row_group] & selected[row_group]
    batch = np.flatnonzero(selected[row_group])

    advantages = self._advantages(rewards, keep, group_size)
    # DGR after: over the groups that make up the batch, i.e. the passing ones, plus the
    # backfilled ones under dynamic sampling (they fill the batch but carry no signal).
    batch_live = batch_groups if self.dynamic_sampling is not None else \
        np.flatnonzero(group_keep)
    dead_after = dead_groups([[episodes[i] for i in rows[g] if keep[i]] for g in batch_live])
    scored = composed.quarantine.keep
    metrics.update({
        "groups/total": num_groups, "groups/passed": int(group_keep.sum()),
        "groups/in_batch": int(selected.sum()), "groups/backfilled": int(backfilled),
        "dead_group_ratio/after": float(dead_after.mean()) if dead_after.size else 1.0,
        "reward/mean": float(rewards[scored].mean()) if scored.any() else 0.0,
        "adv/nonzero": float((advantages[batch] != 0).mean()),
        "keep/batch_share": float(keep[batch].mean()),
    })
    for name, v in composed.parts.items():
      finite = np.isfinite(v)
      metrics[f"reward_part/{name}"] = float(v[finite].mean()) if finite.any() else 0.0
    return HarnessOutput(rewards=rewards, keep=keep, reasons=tuple(reasons),
                         advantages=advantages, batch=batch, group_keep=group_keep,
                         metrics=metrics, state=state_before)

  def _trajectory_cut(self, episodes: list, composed, metrics: dict
                      ) -> tuple[np.ndarray, list]:
    """The rows the quarantine and the trajectory filters keep ([n] bool), and each cut
    row's reason (the first component that cut it); 'cut/*' metrics."""
    n = len(episodes)
    keep = composed.quarantine.keep.copy()  # [n] bool
    reasons = list(composed.quarantine.reasons)
    metrics["cut/quarantine"] = float((~keep).mean())
    for f in self.trajectory_filters:
      res = f(episodes)
      k = self._check_filter_result(f, res, n)
      metrics[f"cut/{f.name}"] = float((~k).mean())
      for i in np.flatnonzero(~k & keep):
        reasons[i] = res.reasons[i] or f"{f.name}: cut"
      keep &= k
    metrics["cut/total"] = float((~keep).mean())
    return keep, reasons

  def _group_cut(self, episodes: list, kept_groups: list, rows: np.ndarray,
                 keep: np.ndarray, reasons: list, metrics: dict) -> np.ndarray:
    """The groups every group filter passes ([G] bool), judged on their kept rows; the
    reasons of the kept rows of a dropped group name the first filter that dropped it;
    'groups_dropped/*' and the filters' own metrics."""
    num_groups = len(kept_groups)
    group_keep = np.ones(num_groups, bool)  # [G]
    for gf in self.group_filters:
      gk = gf(kept_groups)
      if not (isinstance(gk, np.ndarray) and gk.dtype == bool and gk.shape == (num_groups,)):
        got = (f"{type(gk).__name__} {getattr(gk, 'dtype', '')} {getattr(gk, 'shape', '')}")
        raise ValueError(f"group filter {part_name(gf)!r} returned {got}; expected a bool "
                         f"array of shape ({num_groups},) (is it a trajectory filter? list it "
                         f"in Harness.trajectory_filters)")
      metrics[f"groups_dropped/{gf.name}"] = int((~gk).sum())
      if callable(getattr(gf, "metrics", None)):
        metrics.update({f"{gf.name}/{k}": v for k, v in gf.metrics().items()})
      for g in np.flatnonzero(~gk & group_keep):
        for i in rows[g]:
          if keep[i]:
            reasons[i] = f"{gf.name}: group {episodes[i].group_id} dropped"
      group_keep &= gk
    return group_keep

  def _batch_groups(self, group_keep: np.ndarray, target_groups: Optional[int]
                    ) -> tuple[np.ndarray, int]:
    """(the groups that make up the batch, how many of them are backfilled): every group,
    or dynamic sampling's pick of `target_groups`."""
    num_groups = len(group_keep)
    target = num_groups if target_groups is None else int(target_groups)
    if self.dynamic_sampling is not None:
      sel = self.dynamic_sampling.select(group_keep, target)
      return sel.groups, sel.num_backfilled
    if target != num_groups:
      raise ValueError(f"Harness.process: target_groups={target} with {num_groups} groups "
                       f"needs Harness.dynamic_sampling")
    return np.arange(num_groups), 0

  def _advantages(self, rewards: np.ndarray, keep: np.ndarray,
                  group_size: int) -> np.ndarray:  # [n] float32
    estimator = adv_lib.ESTIMATORS[self.estimator]
    with jax.default_device(jax.devices("cpu")[0]):  # tiny: stay on the host
      mask = jnp.asarray(keep)
      adv = estimator(jnp.asarray(rewards), group_size, mask=mask, **self.estimator_kwargs)
      if self.whiten:
        adv = adv_lib.whiten(adv, mask)
      return np.asarray(adv, np.float32)

  @staticmethod
  def _check_layout(episodes: list, group_size: int) -> int:
    n = len(episodes)
    if n == 0 or group_size < 1 or n % group_size:
      raise ValueError(f"Harness.process: {n} episodes do not form groups of "
                       f"group_size={group_size}")
    ids = [e.episode_id for e in episodes]
    if len(set(ids)) != n:
      dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
      raise ValueError(f"Harness.process: duplicate episode ids {dupes}")
    row = 0
    for g in groups_of(episodes):
      if len(g) != group_size:
        raise ValueError(f"Harness.process: group_id {g[0].group_id} has {len(g)} contiguous "
                         f"rows from row {row}; expected group_size={group_size} (rows of a "
                         f"group must be contiguous and groups distinct)")
      row += len(g)
    return n

  @staticmethod
  def _check_filter_result(f, res, n: int) -> np.ndarray:
    if not isinstance(res, FilterResult):
      raise ValueError(f"trajectory filter {part_name(f)!r} returned {type(res).__name__}; "
                       f"expected a FilterResult (is it a group filter? list it in "
                       f"Harness.group_filters)")
    k = np.asarray(res.keep)
    if k.dtype != bool or k.shape != (n,) or len(res.reasons) != n:
      raise ValueError(f"trajectory filter {part_name(f)!r} returned keep {k.dtype} "
                       f"{k.shape} with {len(res.reasons)} reasons; expected bool ({n},) and "
                       f"{n} reasons")
    return k
