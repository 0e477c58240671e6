"""Replay and backtest over a rollout store: exact replay of stored steps, and backtest
figures (dead groups, rescues, ranking violations, cuts) counted by hand."""

import json
import math

import numpy as np
import pytest

from evotrainer.harness.base import Evidence, Verdict
from evotrainer.harness.diagnostics import (CorrectnessRate, DeadGroupRatio,
                                            LengthPercentiles)
from evotrainer.harness.filters import (DropZeroVarianceGroups, DynamicSampling,
                                        EchoTrapFilter, StdGroupFilter, TruncationFilter)
from evotrainer.harness.pipeline import Harness
from evotrainer.harness.replay import (backtest, copy_episode, diagnostic_by_version,
                                       ranking_counts, replay_step,
                                       validator_precision_recall)
from evotrainer.harness.rewards import OverlongPenalty, RewardComposer
from evotrainer.harness.validators import ProxyTrueDisagreement
from evotrainer.rollouts import RolloutStore
from tests.harness import make_episode, make_groups

LOOP = "x = 5 . x = 5 . x = 5 . x = 5"  # a 4-word block repeated: an echo trap
PLAIN = "we add the numbers and get 5"


def _write(store, version, step, harness, episodes, group_size, target_groups=None):
  """Runs the harness on a step and stores it exactly as train.py does."""
  out = harness.process(episodes, group_size, target_groups=target_groups)
  store.write(version, step, "train", episodes, advantages=out.advantages, kept=out.keep,
              harness_state=out.state,
              meta={"group_size": group_size,
                    "target_groups": target_groups or len(episodes) // group_size,
                    "harness": harness.describe()})
  return out


def _groups(bc, partial, step=0):
  """Contiguous groups with task parts `correct` = bc[g][j] and `partial` = partial[g][j]."""
  eps = make_groups(bc, step=step)
  for ep, p in zip(eps, [p for g in partial for p in g]):
    ep.reward_parts["partial"] = float(p)
  return eps


# ------------------------------------------------------------------ exact replay


def _trained_harness():
  # Reward parts (one of them a harness part written back into reward_parts), a
  # trajectory filter, a dead-group filter, the stateful EMA group filter, whitening.
  return Harness(
      composer=RewardComposer(parts={"correct": 1.0, "overlong": 0.5},
                              components=[OverlongPenalty(max_length=6, buffer=2)]),
      trajectory_filters=[TruncationFilter("hard")],
      group_filters=[DropZeroVarianceGroups(), StdGroupFilter(top_p=0.5, ema=0.5)],
      whiten=True)


def _three_steps():
  rng = np.random.default_rng(0)
  steps = []
  for step in (1, 2, 3):
    eps = make_groups(rng.integers(0, 2, (6, 4)).tolist(), step=step)
    for ep in eps:  # lengths 3..7 tokens: some in the overlong band, some past it
      ep.completion_ids = np.arange(int(rng.integers(3, 8)), dtype=np.int32)
      ep.truncated = ep.length == 7
    steps.append(eps)
  return steps


def test_replay_under_the_unchanged_harness_reproduces_the_stored_step_exactly(tmp_path):
  store = RolloutStore(tmp_path)
  h = _trained_harness()
  outs = [_write(store, "v0", k + 1, h, eps, 4) for k, eps in enumerate(_three_steps())]
  # The EMA state moved during training, so steps 2 and 3 need the stored state.
  assert outs[0].state["group_filters/std_group"]["threshold"] is None
  assert outs[2].state["group_filters/std_group"]["steps"] == 2
  assert outs[2].state["group_filters/std_group"]["threshold"] is not None
  final = h.state()

  fresh = _trained_harness()  # a new process rebuilding the same harness
  for step, out in zip((1, 2, 3), outs):
    res = replay_step(store, "v0", step, fresh)
    assert np.array_equal(res.rewards, out.rewards)
    assert np.array_equal(res.advantages, out.advantages)
    assert np.array_equal(res.keep, out.keep)
    assert np.array_equal(res.output.group_keep, out.group_keep)
    assert np.array_equal(res.rewards.astype(np.float64), res.stored_rewards)
    assert np.array_equal(res.advantages.astype(np.float64), res.stored_advantages)
    assert res.reproduces() and res.output.reasons == out.reasons
    assert (res.group_size, res.target_groups) == (4, None)
  # Replaying leaves the harness's own state as it was: still fresh.
  assert fresh.state() == {"group_filters/std_group": {"threshold": None, "steps": 0}}
  assert h.state() == final

  # Without the stored state, step 3 comes out differently (the EMA matters here).
  stored3 = store.read_step("v0", 3, "train")
  again = _trained_harness().process(stored3.episodes, 4, update_state=False)
  assert not np.array_equal(again.group_keep, outs[2].group_keep)


def test_replay_does_not_touch_stored_data_and_reads_dynamic_sampling_meta(tmp_path):
  store = RolloutStore(tmp_path)
  h = Harness(group_filters=[DropZeroVarianceGroups()], dynamic_sampling=DynamicSampling())
  eps = make_groups([[0, 0], [0, 1], [1, 1], [1, 0]], step=1)
  out = _write(store, "v0", 1, h, eps, 2, target_groups=1)
  np.testing.assert_array_equal(out.batch, [2, 3])  # the first passing group only
  res = replay_step(store, "v0", 1, h)
  assert res.target_groups == 1 and res.reproduces()
  # A candidate that writes a new part into reward_parts does not change the store.
  cand = Harness(composer=RewardComposer(parts={"correct": 1.0, "overlong": 1.0},
                                         components=[OverlongPenalty(2, 1)]))
  res = replay_step(store, "v0", 1, cand)
  assert res.target_groups is None  # no dynamic sampling: every group trains
  assert res.episodes[0].reward_parts["overlong"] == -1.0  # 4 tokens > 2
  np.testing.assert_array_equal(res.rewards, [-1, -1, -1, 0, 0, 0, 0, -1])
  assert not res.reproduces()
  stored = store.read_step("v0", 1, "train")
  assert "overlong" not in stored.episodes[0].reward_parts
  assert [e.reward for e in stored.episodes] == [0, 0, 0, 1, 1, 1, 1, 0]
  # Held-out steps record no group size: a clear error, or pass it.
  store.write("v0", 1, "heldout", make_groups([[1, 0]]), meta={"eval": {}})
  with pytest.raises(ValueError, match="no group_size"):
    replay_step(store, "v0", 1, Harness(), split="heldout")
  assert replay_step(store, "v0", 1, Harness(), split="heldout", group_size=2).group_size == 2


def test_copy_episode_is_deep():
  ep = make_episode(reward_parts={"correct": 1.0}, info={"calls": [{"name": "a"}]},
                    ids=[1, 2])
  ep.logprobs = np.zeros(2, np.float32)
  c = copy_episode(ep)
  c.reward_parts["x"] = 1.0
  c.info["calls"][0]["name"] = "b"
  c.completion_ids[0] = 9
  c.logprobs[0] = 1.0
  c.reward = 3.0
  assert ep.reward_parts == {"correct": 1.0} and ep.info["calls"][0]["name"] == "a"
  assert ep.completion_ids[0] == 1 and ep.logprobs[0] == 0.0 and ep.reward == 0.0


# ------------------------------------------------------------------ backtest by hand

# Step A: 8 groups of 4. Under BC only, groups 0-3 are dead. The candidate adds
# 0.5 * partial: groups 0 and 3 have varying partial scores and come alive, group 1 (all
# 0.3) and group 2 (all correct, partial 1) stay dead.
BC_A = [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0],
        [1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0]]
PARTIAL_A = [[.1, .5, .2, 0], [.3, .3, .3, .3], [1, 1, 1, 1], [0, 0, 0, .6],
             [1, .2, .2, .2], [1, 1, .4, 0], [1, .9, 1, .9], [.5, 1, .5, .5]]
# Step B (another version): 4 groups of 2, candidate reward = partial alone.
BC_B = [[1, 0], [1, 0], [0, 1], [0, 0]]
PARTIAL_B = [[.4, .6], [.5, .5], [.1, .9], [.2, .3]]


def _partial(weight_correct=1.0, weight_partial=0.5, **kw):
  parts = {"partial": weight_partial}
  if weight_correct:
    parts = {"correct": weight_correct, **parts}
  return Harness(composer=RewardComposer(parts=parts), **kw)


def test_backtest_counts_rescued_groups_by_hand(tmp_path):
  store = RolloutStore(tmp_path)
  _write(store, "v0", 1, Harness(), _groups(BC_A, PARTIAL_A, step=1), 4)
  report = backtest(store, _partial(), Harness())
  (row,) = report.rows
  assert (row.version, row.step, row.episodes, row.groups) == ("v0", 1, 32, 8)
  assert (row.dead_before, row.dead_after, row.rescued, row.newly_dead) == (4, 2, 2, 0)
  assert row.rescued_groups == (0, 3)
  # Pairs (correct, wrong) per group: 3 + 4 + 4 + 3 in groups 4-7, none in 0-3. Correct
  # rows score >= 1, wrong ones <= 0.5: no violation, no tie; BC alone has none either.
  assert (row.pairs, row.violations, row.ties) == (14, 0, 0)
  assert (row.baseline_pairs, row.baseline_violations, row.baseline_ties) == (14, 0, 0)
  assert (row.cut, row.correct_cut, row.not_trained) == (0, 0, 0)
  assert row.correct == 4 + 1 + 2 + 2 + 1  # groups 2, 4, 5, 6, 7
  # Rows whose advantage (GRPO: (r - mean) / std per group) changes: group 0's rewards
  # [.05, .25, .1, 0] give row 2 the group mean, advantage 0 as under BC (3 rows); group 3
  # (4 rows); group 5, [1.5, 1.5, .2, 0] against [1, 1, 0, 0] (4 rows). Groups 4, 6 and 7
  # get an affine map of their BC rewards (e.g. [1.5, .1, .1, .1] for [1, 0, 0, 0]): the
  # same advantages; groups 1 and 2 stay dead (advantage 0).
  assert row.changed == 3 + 4 + 4
  t = report.totals
  assert t["dead_ratio_before"] == 0.5 and t["dead_ratio_after"] == 0.25
  assert t["effective_after"] == 0.75 and t["steps"] == 1
  # The proxy under each harness: mean BC (10 / 32), and mean of BC + 0.5 * partial.
  assert t["reward_before"] == pytest.approx(10 / 32)
  assert t["reward_after"] == pytest.approx((10 + 0.5 * sum(map(sum, PARTIAL_A))) / 32)
  json.dumps(report.to_dict(), allow_nan=False)  # JSON-able, NaN-free

  # Add the dead-group filter: rescues are unchanged (dead is judged before the group
  # filters), and the rows of the 2 groups still dead do not train.
  report = backtest(store, _partial(group_filters=[DropZeroVarianceGroups()]), Harness())
  (row,) = report.rows
  assert (row.rescued, row.dead_after, row.cut, row.not_trained) == (2, 2, 0, 8)
  assert row.correct_not_trained == 4  # group 2, all correct
  assert row.changed == 11 + 8  # and the dropped rows, which trained (at 0) under BC

  # The incumbent's own harness is inert on its own steps; so is a part that adds the
  # same reward to every row (BC + 0.5 * BC is an affine map of BC in every group).
  assert backtest(store, Harness(), Harness()).totals["changed"] == 0
  store2 = RolloutStore(tmp_path / "same")
  _write(store2, "v0", 1, Harness(), _groups(BC_A, BC_A, step=1), 4)
  assert backtest(store2, _partial(), Harness()).totals["changed"] == 0


def test_backtest_ranking_violations_and_totals_over_versions(tmp_path):
  store = RolloutStore(tmp_path)
  _write(store, "v0", 1, Harness(), _groups(BC_A, PARTIAL_A, step=1), 4)
  _write(store, "v1", 5, Harness(), _groups(BC_B, PARTIAL_B, step=5), 2)
  cand = _partial(weight_correct=0.0, weight_partial=1.0)  # reward = partial only
  row = backtest(store, cand, Harness(), version="v1").rows[0]
  # Group 0: BC [1, 0], reward [.4, .6] -> a violation; group 1: [.5, .5] -> a tie;
  # group 2: BC [0, 1], reward [.1, .9] -> in order; group 3: no pair.
  assert (row.pairs, row.violations, row.ties) == (3, 1, 1)
  assert row.violation_examples == (("v0/5/0", "v0/5/1"),)
  # Dead: group 3 under BC (rescued by [.2, .3]); group 1 under the candidate (newly).
  assert (row.dead_before, row.dead_after, row.rescued, row.newly_dead) == (1, 1, 1, 1)

  report = backtest(store, cand, Harness())  # both versions
  assert [(r.version, r.step) for r in report.rows] == [("v0", 1), ("v1", 5)]
  # Step A under partial alone: group 6 [1, .9, 1, .9] and 5 [1, 1, .4, 0] are in order;
  # group 7 BC [0, 1, 0, 0], partial [.5, 1, .5, .5] in order; group 4 in order. Ties:
  # none. So the totals are step B's.
  t = report.totals
  assert (t["pairs"], t["violations"], t["ties"]) == (14 + 3, 1, 1)
  assert t["violation_rate"] == pytest.approx(1 / 17)
  assert t["groups"] == 12 and t["episodes"] == 40
  assert backtest(store, cand, Harness(), version="v0", steps=[1]).totals["pairs"] == 14
  with pytest.raises(FileNotFoundError, match="steps \\[2\\]"):
    backtest(store, cand, Harness(), version="v0", steps=[2])


def test_ranking_counts_one_pair_by_hand():
  bc, scored = np.array([1.0, 0.0]), np.ones(2, bool)
  assert ranking_counts(bc, np.array([0.4, 0.6]), scored, 2) == (1, 1, 0, [(0, 1)])
  assert ranking_counts(bc, np.array([0.6, 0.4]), scored, 2) == (1, 0, 0, [])
  assert ranking_counts(bc, np.array([0.5, 0.5]), scored, 2) == (1, 0, 1, [])
  # A quarantined row or a row without BC is not compared.
  assert ranking_counts(bc, np.array([0.4, 0.6]), np.array([True, False]), 2)[:3] == (0, 0, 0)
  assert ranking_counts(np.array([1.0, np.nan]), np.array([0.4, 0.6]), scored, 2)[0] == 0


def _echo_step(step=1):
  # Group 0: a correct loop (row 0), a wrong loop (row 1), two plain wrong rows.
  # Group 1: a correct plain row, a correct loop (row 5), two plain wrong rows.
  # Group 2: plain, BC [1, 0, 1, 0].
  texts = [LOOP, LOOP, PLAIN, PLAIN, PLAIN, LOOP, PLAIN, PLAIN, PLAIN, PLAIN, PLAIN, PLAIN]
  eps = make_groups([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0]], step=step)
  for ep, t in zip(eps, texts):
    ep.completion = t
  return eps


def test_backtest_counts_correct_episodes_cut_by_echo_trap(tmp_path):
  store = RolloutStore(tmp_path)
  # Trained with dynamic sampling and a batch of 1 group (meta target_groups = 1).
  _write(store, "v0", 1, Harness(dynamic_sampling=DynamicSampling()), _echo_step(), 4,
         target_groups=1)
  cand = Harness(trajectory_filters=[EchoTrapFilter(unit="words")])
  row = backtest(store, cand, Harness()).rows[0]
  # Cut: rows 0, 1, 5; of them correct: rows 0 and 5.
  assert (row.cut, row.correct_cut, row.newly_cut, row.correct_newly_cut) == (3, 2, 3, 2)
  assert (row.not_trained, row.correct_not_trained, row.correct) == (3, 2, 5)
  # Group 0 keeps rows 2, 3 (both wrong): cut into a dead group.
  assert (row.dead_before, row.dead_after, row.newly_dead) == (0, 1, 1)
  # Ranking is judged on the reward, cut rows included: BC-only has no violations.
  assert (row.pairs, row.violations, row.ties) == (3 + 4 + 4, 0, 0)
  assert backtest(store, cand, cand).rows[0].newly_cut == 0  # the baseline cuts them too

  # With a group filter and dynamic sampling (stored target: 1 group), rows cut later
  # are not counted as cut by the trajectory stage, but do not train.
  cand = Harness(trajectory_filters=[EchoTrapFilter(unit="words")],
                 group_filters=[DropZeroVarianceGroups()], dynamic_sampling=DynamicSampling())
  res = replay_step(store, "v0", 1, cand)
  assert res.output.reasons[2] == "drop_zero_variance: group 0 dropped"
  assert res.output.reasons[8].startswith("dynamic_sampling: group not selected")
  row = backtest(store, cand, Harness()).rows[0]
  assert (row.cut, row.correct_cut, row.dead_after) == (3, 2, 1)
  assert row.dead_after == res.output.metrics["dead_group_ratio/before"] * 3  # pipeline's
  # Not trained: the 3 cut rows, group 0's rows 2-3, group 2 (batch full after group 1).
  assert (row.not_trained, row.correct_not_trained) == (3 + 2 + 4, 2 + 0 + 2)


# ------------------------------------------------------------------ validators, diagnostics


def _series(reward, correct):
  return Evidence(episodes=[], series={"reward": reward, "correct": correct}, heldout={})


def test_validator_precision_recall_on_four_labelled_cases():
  rising, flat = [0.1, 0.2, 0.3, 0.4, 0.5], [0.3] * 5
  labelled = [
      (_series(rising, flat), True),  # hacking, flagged: tp
      (_series(rising, flat), False),  # flagged, but labelled fine: fp
      (_series(flat, flat), True),  # bad, not flagged: fn
      (_series(rising, rising), False),  # both rise: passes: tn
  ]
  v = ProxyTrueDisagreement(window=5)
  assert [v(e).passed for e, _ in labelled] == [False, False, True, True]
  assert validator_precision_recall(v, labelled) == {
      "precision": 0.5, "recall": 0.5, "tp": 1, "fp": 1, "fn": 1, "tn": 1}

  class Broken:  # raises: a failed verdict, so every case is flagged
    name = "broken"

    def __call__(self, evidence) -> Verdict:
      raise RuntimeError("no")

  assert validator_precision_recall([v, Broken()], labelled) == {
      "precision": 0.5, "recall": 1.0, "tp": 2, "fp": 2, "fn": 0, "tn": 0}
  pr = validator_precision_recall(v, [(_series(flat, flat), False)])
  assert math.isnan(pr["precision"]) and math.isnan(pr["recall"]) and pr["tn"] == 1
  with pytest.raises(TypeError, match="labelled\\[0\\]"):
    validator_precision_recall(v, [("not evidence", True)])


def test_diagnostic_by_version(tmp_path):
  store = RolloutStore(tmp_path)
  # v0: step 1 = one dead group [0, 0] (id 0), step 2 = one dead group [1, 1] (also id 0).
  # Pooled naively the rows would form one live group; per (step, group) both are dead.
  _write(store, "v0", 1, Harness(), make_groups([[0, 0]], step=1), 2)
  _write(store, "v0", 2, Harness(), make_groups([[1, 1]], step=2), 2)
  _write(store, "v1", 1, Harness(), make_groups([[0, 1], [0, 0]], step=1), 2)
  store.write("v2", 0, "heldout", make_groups([[1, 1]]), meta={})  # no train split
  assert diagnostic_by_version(store, DeadGroupRatio()) == {"v0": 1.0, "v1": 0.5}
  assert diagnostic_by_version(store, CorrectnessRate()) == {"v0": 0.5, "v1": 0.25}
  assert diagnostic_by_version(store, DeadGroupRatio(), versions=["v1"]) == {"v1": 0.5}
  assert diagnostic_by_version(store, LengthPercentiles(), metric="length_p90") == {
      "v0": 4.0, "v1": 4.0}
  # Stored advantages reach AdvantageHealth: v1's live group [0, 1] has 2 non-zero of 4.
  from evotrainer.harness.diagnostics import AdvantageHealth
  assert diagnostic_by_version(store, AdvantageHealth(), metric="nonzero_advantage") == {
      "v0": 0.0, "v1": 0.5}
  with pytest.raises(KeyError, match="length_p90"):
    diagnostic_by_version(store, LengthPercentiles())
