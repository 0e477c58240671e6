"""Replay and backtest: run a harness over stored rollouts without generating again.

docs/method.md step 5 (backtest before spending training compute): re-score the cached
rollouts under a candidate reward / filter and check the predicted direction, e.g. "an
auxiliary reward rescued 9 of 20 dead groups", "a soft-truncation threshold of 20 cut
4-9% of trajectories and only 3-5 fully correct ones", "an edit-streak penalty of weight
0.01 caused 1 ranking violation in 1,540 trajectories". The primitives:

  replay_step                one stored step under a harness (the stored harness state,
                             the stored group layout); under the harness that trained it,
                             the stored rewards, keep mask and advantages come back exactly
  backtest                   a candidate against a baseline over stored steps: dead groups
                             before / after, groups rescued, ranking violations against BC,
                             correct episodes cut by the candidate's filters
  validator_precision_recall a validator (or several) against labelled evidence
  diagnostic_by_version      one diagnostic metric over each stored version's episodes
                             (docs/method.md, the outer loop: replay a new metric over earlier
                             versions and keep it only if it separates good from bad ones)

Nothing here writes to the store. Episodes are decoded fresh from Parquet for each step
and each harness runs on its own deep copy (`copy_episode`), so the composer's write-back
into `reward_parts` / `reward` never reaches another harness or the stored step.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Optional, Sequence

import numpy as np

from evotrainer.harness.base import Evidence
from evotrainer.harness.diagnostics import run_diagnostics
from evotrainer.harness.filters import dead_groups
from evotrainer.harness.pipeline import Harness, HarnessOutput
from evotrainer.harness.rewards import part_name
from evotrainer.harness.validators import run_validators
from evotrainer.rollouts.store import RolloutStore, StoredStep
from evotrainer.types import Episode

# The reason Harness.process gives a row of a passing group that dynamic sampling left out
# of a full batch (pipeline.py). With the group filters' "<name>: group <id> dropped",
# these are the only reasons set after the trajectory stage; `_trajectory_keep` relies on
# it (tests/harness/test_replay.py checks it against the pipeline).
_DS_REASON = "dynamic_sampling: group not selected (batch already full)"
_MAX_EXAMPLES = 5  # evidence kept per step: rescued group ids, violating pairs


@dataclasses.dataclass(frozen=True)
class ReplayResult:
  """One stored step re-run under a harness, next to what was stored.

  Rows are the stored rows, in stored order.
  """

  version: str
  step: int
  split: str
  group_size: int
  target_groups: Optional[int]  # as passed to Harness.process (None: every group)
  episodes: list  # [n] Episode: deep copies, rescored by the harness (reward, reward_parts)
  output: HarnessOutput  # the harness's output on them (rewards, keep, advantages, ...)
  stored_rewards: np.ndarray  # [n] float64: `episode.reward` as stored
  stored_advantages: Optional[np.ndarray]  # [n] float64, None when not recorded
  stored_kept: Optional[np.ndarray]  # [n] bool, None when not recorded

  @property
  def rewards(self) -> np.ndarray:  # [n] float32
    return self.output.rewards

  @property
  def advantages(self) -> np.ndarray:  # [n] float32
    return self.output.advantages

  @property
  def keep(self) -> np.ndarray:  # [n] bool
    return self.output.keep

  def reproduces(self) -> bool:
    """True iff rewards, keep and advantages equal the stored ones bit for bit (the
    stored float64 values are the float32 ones widened, so equality is exact)."""
    return (np.array_equal(self.rewards.astype(np.float64), self.stored_rewards)
            and self.stored_advantages is not None and self.stored_kept is not None
            and np.array_equal(self.advantages.astype(np.float64), self.stored_advantages)
            and np.array_equal(self.keep, self.stored_kept))


def _layout(stored: StoredStep, harness: Harness, group_size: Optional[int],
            target_groups: Optional[int]) -> tuple:
  """(group_size, target_groups) for Harness.process, as train.py called it."""
  meta = stored.metadata.meta if isinstance(stored.metadata.meta, dict) else {}
  gs = group_size if group_size is not None else meta.get("group_size")
  if gs is None:
    md = stored.metadata
    raise ValueError(f"replay: the stored step version={md.version!r} step={md.step} "
                     f"split={md.split!r} records no group_size in its meta ({md.path}); "
                     f"pass group_size=")
  # train.py passes target_groups only when the harness samples dynamically; without
  # dynamic sampling every group given trains (and the stored value is just the count).
  tg = target_groups if target_groups is not None else meta.get("target_groups")
  return int(gs), (None if harness.dynamic_sampling is None or tg is None else int(tg))


def copy_episode(ep: Episode) -> Episode:
  """A deep copy of an episode, ~3x faster than `copy.deepcopy`: the mutable fields
  (`reward_parts`, `info`, the token arrays) are copied, the rest is immutable. Assumes
  `reward_parts` values are numbers, as the composer and the store make them."""
  c = copy.copy(ep)
  c.reward_parts = dict(ep.reward_parts)
  c.info = copy.deepcopy(ep.info) if ep.info else {}
  if ep.completion_ids is not None:
    c.completion_ids = np.array(ep.completion_ids)
  if ep.logprobs is not None:
    c.logprobs = np.array(ep.logprobs)
  return c


def _replay(stored: StoredStep, harness: Harness, group_size: Optional[int] = None,
            target_groups: Optional[int] = None, consume: bool = False) -> ReplayResult:
  """Runs `harness` on copies of `stored`'s episodes (on the episodes themselves when
  `consume`: the caller will not use them again) from the stored harness state; the
  harness's own state is put back afterwards."""
  gs, tg = _layout(stored, harness, group_size, target_groups)
  episodes = list(stored.episodes) if consume else [copy_episode(e) for e in stored.episodes]
  stored_rewards = np.array([ep.reward for ep in stored.episodes], np.float64)  # [n]
  saved = harness.state()
  try:
    # strict=False: a candidate may lack a stored component (skipped) or add one (it runs
    # from the state it has, normally its initial one).
    harness.load_state(stored.metadata.harness_state or {}, strict=False)
    out = harness.process(episodes, gs, target_groups=tg, update_state=False)
  finally:
    harness.load_state(saved)
  md = stored.metadata
  return ReplayResult(version=md.version, step=md.step, split=md.split, group_size=gs,
                      target_groups=tg, episodes=episodes, output=out,
                      stored_rewards=stored_rewards, stored_advantages=stored.advantages,
                      stored_kept=stored.kept)


def replay_step(store: RolloutStore, version: str, step: int, harness: Harness,
                split: str = "train", *, group_size: Optional[int] = None,
                target_groups: Optional[int] = None) -> ReplayResult:
  """Re-runs one stored step under `harness`, as train.py ran it.

  The harness state stored with the step (the state *before* it, `HarnessOutput.state`) is
  loaded with `strict=False`, `process(update_state=False)` runs on deep copies of the
  episodes read back with the stored `group_size` / `target_groups` (meta written by
  train.py), and the harness's own state is restored afterwards: replaying never moves an
  EMA. Under the harness that trained the step, `result.reproduces()` is True.

  Args:
    store, version, step, split: the stored step.
    harness: the harness to run (the run's own, or a candidate).
    group_size, target_groups: override the stored meta (e.g. for a held-out split, whose
      meta records no group size).

  Raises:
    FileNotFoundError / CorruptRolloutError: from the store.
    ValueError: no group size is known.
  """
  return _replay(store.read_step(version, step, split), harness, group_size, target_groups)


# ---------------------------------------------------------------------------------------
# Backtest.


def _trajectory_keep(result: ReplayResult, harness: Harness) -> np.ndarray:
  """[n] bool: rows kept by the quarantine and the trajectory filters (what the group
  filters see). A row cut later keeps the reason its group filter or dynamic sampling
  gave; a row cut earlier keeps its earlier reason."""
  eps, out = result.episodes, result.output
  names = [part_name(gf) for gf in harness.group_filters]
  keep = out.keep.copy()
  for i in np.flatnonzero(~keep):
    r = out.reasons[i]
    keep[i] = r is None or r == _DS_REASON or any(
        r == f"{name}: group {eps[i].group_id} dropped" for name in names)
  return keep


def _dead(result: ReplayResult, traj_keep: np.ndarray) -> np.ndarray:
  """[G] bool: groups whose composed rewards over their trajectory-kept rows are all equal
  (or that have fewer than two such rows): `dead_group_ratio/before` per group."""
  gs = result.group_size
  rows = np.arange(len(result.episodes)).reshape(-1, gs)  # [G, group_size]
  return dead_groups([[result.episodes[i] for i in r if traj_keep[i]] for r in rows])


def _bc(episodes: Sequence[Episode], key: str) -> np.ndarray:  # [n] float64, NaN if absent
  return np.array([float(ep.reward_parts.get(key, np.nan)) for ep in episodes], np.float64)


def ranking_counts(bc: np.ndarray, rewards: np.ndarray, scored: np.ndarray,
                   group_size: int) -> tuple:
  """Pairs ordered by BC, and how a reward orders them, within each group.

  Args:
    bc: [n] BC per row (NaN: unknown, never compared).
    rewards: [n] composed rewards.
    scored: [n] bool, rows to compare (quarantined rows have no real reward).
    group_size: rows per group; groups are contiguous.

  Returns:
    `(pairs, violations, ties, examples)`: `pairs` counts
    ordered pairs (i, j) in one group with BC(i) > BC(j), both scored; `violations` those
    with reward(i) < reward(j) (the reward reverses BC); `ties` those with
    reward(i) == reward(j) (the reward loses BC's order); `examples` [(i, j), ...] row
    indices of the first violating pairs.
  """
  b = bc.reshape(-1, group_size)  # [G, g]
  r = np.asarray(rewards, np.float64).reshape(-1, group_size)  # [G, g]
  s = scored.reshape(-1, group_size)  # [G, g]
  ordered = (b[:, :, None] > b[:, None, :]) & s[:, :, None] & s[:, None, :]  # [G, g, g]
  reversed_ = ordered & (r[:, :, None] < r[:, None, :])
  tied = ordered & (r[:, :, None] == r[:, None, :])
  g, i, j = np.nonzero(reversed_)
  examples = [(int(gg * group_size + ii), int(gg * group_size + jj))
              for gg, ii, jj in zip(g[:_MAX_EXAMPLES], i, j)]
  return int(ordered.sum()), int(reversed_.sum()), int(tied.sum()), examples


@dataclasses.dataclass(frozen=True)
class BacktestRow:
  """One stored step: the baseline and the candidate on the same episodes.

  Dead groups are counted over each harness's trajectory-kept rows (see `backtest`).
  """

  version: str
  step: int
  episodes: int
  groups: int
  dead_before: int  # dead under the baseline
  dead_after: int  # dead under the candidate
  rescued: int  # dead under the baseline, alive under the candidate
  newly_dead: int  # alive under the baseline, dead under the candidate
  pairs: int  # in-group pairs with BC(i) > BC(j), both scored by the candidate
  violations: int  # of those, candidate reward(i) < reward(j)
  ties: int  # of those, candidate reward(i) == reward(j)
  baseline_pairs: int  # the same three under the baseline
  baseline_violations: int
  baseline_ties: int
  correct: int  # rows with BC >= 0.5
  cut: int  # rows the candidate's quarantine / trajectory filters cut
  correct_cut: int  # ... of them correct
  newly_cut: int  # cut by the candidate's trajectory stage, not by the baseline's
  correct_newly_cut: int
  not_trained: int  # rows that do not train under the candidate (any stage)
  correct_not_trained: int
  changed: int  # rows whose training signal differs from the baseline's (see `backtest`)
  reward_sum_before: float = 0.0  # composed reward summed over the rows, baseline
  reward_sum_after: float = 0.0  # ... under the candidate
  rescued_groups: tuple = ()  # group ids of the first rescued groups
  violation_examples: tuple = ()  # ((higher-BC episode_id, lower-BC episode_id), ...)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["rescued_groups"] = list(self.rescued_groups)
    d["violation_examples"] = [list(p) for p in self.violation_examples]
    return d


_COUNTS = tuple(f.name for f in dataclasses.fields(BacktestRow)
                if f.type == "int" and f.name != "step")


@dataclasses.dataclass(frozen=True)
class BacktestReport:
  """Per-step rows and their totals (see `backtest` for the definitions)."""

  candidate: dict  # candidate.describe()
  baseline: dict  # baseline.describe()
  rows: tuple  # BacktestRow, in (version, step) order
  seconds: float  # wall time of the backtest (reading + both harnesses)

  @property
  def totals(self) -> dict:
    """Each count summed over the rows, plus ratios: `dead_ratio_before/after`
    (dead / groups), `effective_before/after` (1 - those), `violation_rate`
    (violations / pairs, NaN without pairs), `cut_share` (cut / episodes),
    `correct_cut_share` (correct_cut / correct), and the mean composed reward per
    episode `reward_before/after` (the proxy under each harness)."""
    t = {k: int(sum(getattr(r, k) for r in self.rows)) for k in _COUNTS}
    ratio = lambda a, b: float(a / b) if b else float("nan")  # noqa: E731
    t.update(steps=len(self.rows),
             dead_ratio_before=ratio(t["dead_before"], t["groups"]),
             dead_ratio_after=ratio(t["dead_after"], t["groups"]),
             violation_rate=ratio(t["violations"], t["pairs"]),
             cut_share=ratio(t["cut"], t["episodes"]),
             correct_cut_share=ratio(t["correct_cut"], t["correct"]),
             reward_before=ratio(sum(r.reward_sum_before for r in self.rows), t["episodes"]),
             reward_after=ratio(sum(r.reward_sum_after for r in self.rows), t["episodes"]))
    t["effective_before"] = 1.0 - t["dead_ratio_before"]
    t["effective_after"] = 1.0 - t["dead_ratio_after"]
    return t

  @property
  def episodes_per_s(self) -> float:
    n = sum(r.episodes for r in self.rows)
    return n / self.seconds if self.seconds > 0 else float("nan")

  def to_dict(self) -> dict:
    """JSON-able (NaN ratios become None)."""
    clean = lambda v: None if isinstance(v, float) and np.isnan(v) else v  # noqa: E731
    return {"candidate": self.candidate, "baseline": self.baseline,
            "totals": {k: clean(v) for k, v in self.totals.items()},
            "rows": [r.to_dict() for r in self.rows], "seconds": round(self.seconds, 4),
            "episodes_per_s": clean(self.episodes_per_s)}


def _compare(stored: StoredStep, candidate: Harness, baseline: Harness,
             bc_key: str) -> BacktestRow:
  bc = _bc(stored.episodes, bc_key)  # [n], before any harness writes into reward_parts
  base = _replay(stored, baseline)
  cand = _replay(stored, candidate, consume=True)  # the step was read for this call only
  gs, eps = cand.group_size, cand.episodes
  correct = bc >= 0.5  # [n]
  bt, ct = _trajectory_keep(base, baseline), _trajectory_keep(cand, candidate)  # [n]
  dead_b, dead_c = _dead(base, bt), _dead(cand, ct)  # [G]
  rescued = dead_b & ~dead_c
  group_ids = [eps[g * gs].group_id for g in np.flatnonzero(rescued)[:_MAX_EXAMPLES]]
  # Quarantined rows (reward 0 by fiat) are not compared; trajectory-cut rows are: ranking
  # is a property of the composed reward, whoever trains on it.
  pairs, viol, ties, ex = ranking_counts(bc, cand.rewards, _scored(cand, candidate), gs)
  b_pairs, b_viol, b_ties, _ = ranking_counts(bc, base.rewards, _scored(base, baseline), gs)
  cut = ~ct
  new = cut & bt
  # Float32 advantages of the same rows can differ in the last bits between harnesses that
  # compute them alike (another reward sum order): such a row is unchanged.
  same_advantage = np.isclose(base.advantages, cand.advantages, rtol=1e-5, atol=1e-6)
  changed = (base.keep != cand.keep) | (cand.keep & ~same_advantage)
  return BacktestRow(
      version=cand.version, step=cand.step, episodes=len(eps), groups=len(dead_c),
      dead_before=int(dead_b.sum()), dead_after=int(dead_c.sum()),
      rescued=int(rescued.sum()), newly_dead=int((dead_c & ~dead_b).sum()),
      pairs=pairs, violations=viol, ties=ties, baseline_pairs=b_pairs,
      baseline_violations=b_viol, baseline_ties=b_ties, correct=int(correct.sum()),
      cut=int(cut.sum()), correct_cut=int((cut & correct).sum()), newly_cut=int(new.sum()),
      correct_newly_cut=int((new & correct).sum()),
      not_trained=int((~cand.keep).sum()), correct_not_trained=int((~cand.keep & correct).sum()),
      changed=int(changed.sum()),
      reward_sum_before=float(base.rewards.sum()), reward_sum_after=float(cand.rewards.sum()),
      rescued_groups=tuple(group_ids),
      violation_examples=tuple((eps[i].episode_id, eps[j].episode_id) for i, j in ex))


def _scored(result: ReplayResult, harness: Harness) -> np.ndarray:
  """[n] bool: rows the composer did not quarantine, i.e. every part with a non-zero
  weight is finite (the composer wrote each part's value into `reward_parts`)."""
  weighted = [k for k, w in harness.composer.parts.items() if w != 0.0]
  return np.array([all(np.isfinite(ep.reward_parts.get(k, np.nan)) for k in weighted)
                   for ep in result.episodes], bool)


def _keys(store: RolloutStore, version: Optional[str], steps: Optional[Sequence[int]],
          split: str) -> list:
  versions = [version] if version is not None else store.versions()
  out = []
  for v in versions:
    stored = store.steps(v, split)
    if steps is not None:
      missing = sorted(set(steps) - set(stored))
      if version is not None and missing:
        raise FileNotFoundError(f"backtest: steps {missing} of version={v!r} split={split!r} "
                                f"are not stored (stored: {stored})")
      stored = [s for s in stored if s in set(steps)]
    out += [(v, s) for s in stored]
  return out


def backtest(store: RolloutStore, candidate: Harness, baseline: Harness, *,
             version: Optional[str] = None, steps: Optional[Sequence[int]] = None,
             split: str = "train", bc_key: str = "correct") -> BacktestReport:
  """Re-scores stored steps under a baseline and a candidate harness and compares them.

  Each step is read once and replayed under both harnesses (`replay_step`: stored state,
  stored group layout, no state update). A stateful component that the stored state does
  not know (e.g. a StdGroupFilter the candidate adds) runs from its current state at every
  step, its initial one for a new object: its EMA does not warm up across replayed steps.
  Per step (a `BacktestRow`; `totals` sums them):

  - dead groups: a group is dead under a harness when the composed rewards of its rows
    that the harness's quarantine and trajectory filters keep are all equal, or fewer
    than two rows are kept (the pipeline's `dead_group_ratio/before`, per group: what the
    group filters see). `dead_before` counts them under the baseline, `dead_after` under
    the candidate, `rescued` = dead before and alive after, `newly_dead` = the reverse.
  - ranking violations against BC (`bc_key`, default 'correct'): over the ordered pairs
    (i, j) of rows of one group with BC(i) > BC(j) whose weighted parts are all finite
    (not quarantined) under the candidate (`pairs`), a *violation* is candidate reward(i)
    < reward(j) (the composed reward reverses BC), a *tie* is reward(i) == reward(j)
    (the reward no longer separates them). Rows cut by a filter are still compared:
    this judges the reward, not the filters. A group with k correct and m wrong rows has
    k * m pairs. A row without the BC part is never compared. The same counts under the
    baseline are `baseline_pairs/violations/ties`.
  - cuts: `cut` rows the candidate's quarantine or trajectory filters remove, `newly_cut`
    those of them the baseline's keep, `not_trained` rows whose final keep is False
    (including group filters and dynamic sampling); each with its `correct_*` share,
    correct meaning BC >= 0.5.
  - `changed`: rows whose training signal differs from the baseline's: kept by one
    harness and not the other, or kept by both with another advantage (beyond float32
    rounding). 0 over the replayed steps: the candidate is inert on them, and the learner
    would see exactly what it saw (a part equal on every row of a group, a filter that
    cuts nothing).

  Args:
    store: the rollout store.
    candidate, baseline: harnesses (their state is left as it was).
    version: one version, or None for every stored version.
    steps: steps to use (None: every stored step of the split; with `version=None`, the
      listed steps each version has).
    split: 'train' (or another split whose meta records group_size).
    bc_key: the reward part holding binary correctness.

  Returns:
    A BacktestReport; `to_dict()` is JSON-able.
  """
  t0 = time.perf_counter()
  rows = [_compare(store.read_step(v, s, split), candidate, baseline, bc_key)
          for v, s in _keys(store, version, steps, split)]
  return BacktestReport(candidate=candidate.describe(), baseline=baseline.describe(),
                        rows=tuple(rows), seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------
# Validators and diagnostics over stored or labelled evidence.


def validator_precision_recall(validators, labelled: Sequence) -> dict:
  """How well a validator (or several) flags bad branches on labelled evidence.

  A case is *flagged* when the validator fails it (with several, when any of them fails;
  a validator that raises counts as failing, as in `run_validators`). Positive = bad.

  Args:
    validators: one validator or a sequence of them.
    labelled: [(Evidence, bad: bool), ...].

  Returns:
    {'precision': tp / (tp + fp), 'recall': tp / (tp + fn), 'tp', 'fp', 'fn', 'tn'};
    precision (recall) is NaN when nothing is flagged (nothing is bad).
  """
  vs = list(validators) if isinstance(validators, (list, tuple)) else [validators]
  if not vs:
    raise ValueError("validator_precision_recall: no validator given")
  tp = fp = fn = tn = 0
  for i, case in enumerate(labelled):
    if not (isinstance(case, (tuple, list)) and len(case) == 2
            and isinstance(case[0], Evidence)):
      raise TypeError(f"validator_precision_recall: labelled[{i}] is {type(case).__name__}; "
                      f"expected (Evidence, bad: bool)")
    evidence, bad = case
    flagged = any(not v.passed for v in run_validators(vs, evidence))
    tp += flagged and bool(bad)
    fp += flagged and not bad
    fn += (not flagged) and bool(bad)
    tn += (not flagged) and not bad
  return {"precision": tp / (tp + fp) if tp + fp else float("nan"),
          "recall": tp / (tp + fn) if tp + fn else float("nan"),
          "tp": int(tp), "fp": int(fp), "fn": int(fn), "tn": int(tn)}


def diagnostic_by_version(store: RolloutStore, diagnostic, split: str = "train", *,
                          metric: Optional[str] = None, context: Optional[dict] = None,
                          versions: Optional[Sequence[str]] = None) -> dict:
  """One diagnostic metric per stored version, over all of that version's episodes.

  The diagnostic runs once per version on the episodes of every stored step of `split`,
  pooled (steps in order; group ids are renumbered per (step, group) so groups of
  adjacent steps never merge). When every step recorded advantages they are passed as
  `context['advantages']` (for AdvantageHealth); `context` adds or overrides keys.

  Args:
    store: the rollout store.
    diagnostic: a Diagnostic (`name`, `layer`, `__call__(episodes, context) -> Report`).
    split: the split to read.
    metric: the key of the diagnostic's `Report.metrics` to return; default its `name`
      (e.g. 'dead_group_ratio', 'bc'; LengthPercentiles needs e.g. 'length_p90').
    context: extra context for the diagnostic.
    versions: versions to read (default: every stored version, sorted).

  Returns:
    {version: value}: versions without episodes of `split` are left out; a version whose
    report lacks the metric gets NaN.

  Raises:
    KeyError: no version's report has the metric (names the metrics it does report).
  """
  metric = metric or diagnostic.name
  out, seen = {}, set()
  for v in (versions if versions is not None else store.versions()):
    episodes, advantages, gid, last = [], [], -1, None
    for s in store.steps(v, split):
      st = store.read_step(v, s, split)
      for ep in st.episodes:  # shallow copies: only the group id changes
        if (s, ep.group_id) != last:  # a new contiguous run = a new group (groups_of)
          gid, last = gid + 1, (s, ep.group_id)
        episodes.append(dataclasses.replace(ep, group_id=gid))
      advantages.append(st.advantages)
    if not episodes:
      continue
    ctx = {}
    if all(a is not None for a in advantages):
      ctx["advantages"] = np.concatenate(advantages)
    ctx.update(context or {})
    metrics, _ = run_diagnostics([diagnostic], episodes, ctx)
    seen.update(metrics)
    out[v] = float(metrics.get(metric, float("nan")))
  if out and metric not in seen:
    raise KeyError(f"diagnostic_by_version: {diagnostic.name!r} reports {sorted(seen)}, not "
                   f"{metric!r}; pass metric=")
  return out


__all__ = ["BacktestReport", "BacktestRow", "ReplayResult", "backtest",
           "copy_episode", "diagnostic_by_version", "ranking_counts", "replay_step",
           "validator_precision_recall"]
