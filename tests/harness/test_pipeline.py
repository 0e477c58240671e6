"""The harness pipeline: hand-computed advantages with cut rows, DGR, dynamic sampling,
exact replay through state(), gin configuration and its errors."""

import copy
import json
import math

import gin
import numpy as np
import pytest

from evotrainer import config, registry
from evotrainer.harness.filters import (DropZeroVarianceGroups, DynamicSampling,
                                        StdGroupFilter, TruncationFilter)
from evotrainer.harness.base import FilterResult
from evotrainer.harness.pipeline import Harness
from evotrainer.harness.rewards import RewardComposer
from tests.harness import make_groups

S2 = math.sqrt(2.0)


def _a_and_b():
  # group A = [1, 0, 0, 0] with row 1 truncated; group B = [1, 1, 0, 0].
  eps = make_groups([[1, 0, 0, 0], [1, 1, 0, 0]])
  eps[1].truncated = True
  return eps


def test_advantages_exclude_a_cut_trajectory_from_its_group():
  h = Harness(trajectory_filters=[TruncationFilter("hard")], estimator_kwargs={"eps": 0.0})
  out = h.process(_a_and_b(), group_size=4)
  # A's kept rows [1, 0, 0]: mean 1/3, std sqrt(2)/3 -> sqrt2, -1/sqrt2, -1/sqrt2; row 1: 0.
  # Had row 1 counted, row 0 would get sqrt3 (see tests/learner/test_advantages.py).
  np.testing.assert_allclose(out.advantages, [S2, 0, -1 / S2, -1 / S2, 1, 1, -1, -1],
                             rtol=1e-6)
  np.testing.assert_array_equal(out.keep, [True, False] + [True] * 6)
  assert out.reasons[1].startswith("truncation: truncated")
  assert out.metrics["cut/truncation"] == out.metrics["cut/total"] == 1 / 8
  np.testing.assert_array_equal(out.batch, np.arange(8))
  np.testing.assert_array_equal(out.rewards, [1, 0, 0, 0, 1, 1, 0, 0])


def test_dr_grpo_with_whitening_by_hand():
  h = Harness(trajectory_filters=[TruncationFilter("hard")], estimator="dr_grpo", whiten=True)
  out = h.process(_a_and_b(), group_size=4)
  # Dr. GRPO: A = [2/3, -, -1/3, -1/3], B = [.5, .5, -.5, -.5]. Over the 7 kept rows the
  # mean is 0 and the variance (4/9 + 1/9 + 1/9 + 4 * 1/4) / 7 = 5/21.
  raw = np.array([2 / 3, 0, -1 / 3, -1 / 3, 0.5, 0.5, -0.5, -0.5])
  np.testing.assert_allclose(out.advantages, raw / math.sqrt(5 / 21 + 1e-8), rtol=1e-5)
  assert out.advantages[1] == 0.0


class _NanOnRow1:
  name = "judge"

  def __call__(self, episodes):
    return np.array([math.nan if i == 1 else 0.0 for i in range(len(episodes))])


def test_quarantined_row_is_excluded_like_a_cut_one():
  composer = RewardComposer(parts={"correct": 1.0, "judge": 0.5}, components=[_NanOnRow1()])
  eps = make_groups([[1, 0, 0, 0], [1, 1, 0, 0]])
  out = Harness(composer=composer, estimator_kwargs={"eps": 0.0}).process(eps, 4)
  np.testing.assert_allclose(out.advantages, [S2, 0, -1 / S2, -1 / S2, 1, 1, -1, -1],
                             rtol=1e-6)
  assert out.reasons[1] == "reward part judge returned nan"
  assert out.metrics["cut/quarantine"] == 1 / 8
  assert out.metrics["reward/mean"] == pytest.approx(3 / 7)


def test_dead_groups_dropped_and_dgr_reported():
  rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1],
             [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]  # dead: 1, 4, 6
  h = Harness(group_filters=[DropZeroVarianceGroups()])
  out = h.process(make_groups(rewards), group_size=4)
  assert out.metrics["dead_group_ratio/before"] == 0.375
  assert out.metrics["dead_group_ratio/raw"] == 0.375
  assert out.metrics["dead_group_ratio/after"] == 0.0
  assert out.metrics["groups_dropped/drop_zero_variance"] == 3
  np.testing.assert_array_equal(np.flatnonzero(~out.group_keep), [1, 4, 6])
  dead_rows = np.concatenate([np.arange(4, 8), np.arange(16, 20), np.arange(24, 28)])
  np.testing.assert_array_equal(np.flatnonzero(~out.keep), dead_rows)
  assert out.reasons[4] == "drop_zero_variance: group 1 dropped"
  assert out.metrics["adv/nonzero"] == 20 / 32


def test_a_cut_row_can_kill_a_group():
  # [1, 0, 0, 0] with the only correct row truncated leaves [0, 0, 0]: dead.
  eps = make_groups([[1, 0, 0, 0], [1, 0, 1, 0]])
  eps[0].truncated = True
  out = Harness(trajectory_filters=[TruncationFilter()],
                group_filters=[DropZeroVarianceGroups()]).process(eps, 4)
  assert out.metrics["dead_group_ratio/raw"] == 0.0
  assert out.metrics["dead_group_ratio/before"] == 0.5
  np.testing.assert_array_equal(out.group_keep, [False, True])
  assert out.reasons[0].startswith("truncation") and out.reasons[1].startswith("drop_zero")


def _two_steps():
  step1 = make_groups([[0, 0], [0, 1], [0, 0.5], [0, 2]], step=1)
  step2 = make_groups([[0, 0.2], [0, 0.9], [0, 1.1], [0, 1.2]], step=2)
  return step1, step2


def _stateful_harness():
  return Harness(group_filters=[DropZeroVarianceGroups(), StdGroupFilter(top_p=0.5, ema=0.5)])


def test_state_round_trip_replays_a_step_exactly():
  step1, step2 = _two_steps()
  stored2 = copy.deepcopy(step2)
  h = _stateful_harness()
  h.process(step1, 2)
  out2 = h.process(step2, 2)
  assert out2.state == {"group_filters/std_group": {"threshold": 0.375, "steps": 1}}
  # Step 1 set the threshold to .375 (see test_filters). Step 2 stds [.1, .45, .55, .6]:
  # quantile .5, threshold .5 * .375 + .5 * .5 = .4375 -> groups 1, 2, 3 pass.
  np.testing.assert_array_equal(out2.group_keep, [False, True, True, True])
  assert out2.metrics["std_group/threshold"] == pytest.approx(0.4375)
  # Replay: a fresh harness, the stored state, the stored episodes.
  replay = _stateful_harness()
  replay.load_state(json.loads(json.dumps(out2.state)))
  again = replay.process(stored2, 2)
  for field in ("rewards", "keep", "advantages", "batch", "group_keep"):
    np.testing.assert_array_equal(getattr(again, field), getattr(out2, field))
  assert again.reasons == out2.reasons
  assert replay.state() == h.state()
  # Without the state the replay differs: step 2 alone sets the threshold to .5.
  fresh = _stateful_harness().process(copy.deepcopy(stored2), 2)
  np.testing.assert_array_equal(fresh.group_keep, [False, False, True, True])
  assert fresh.metrics["std_group/threshold"] == pytest.approx(0.5)


def test_load_state_strictness_and_dry_runs():
  step1, _ = _two_steps()
  h = _stateful_harness()
  h.process(step1, 2, update_state=False)
  assert h.state() == {"group_filters/std_group": {"threshold": None, "steps": 0}}
  with pytest.raises(ValueError, match="stateful components"):
    h.load_state({})
  h.load_state({"group_filters/other": {}}, strict=False)  # a changed harness: skipped


def test_dynamic_sampling_backfills_to_an_exact_batch():
  rewards = [[0, 0], [0, 1], [1, 1], [0, 0], [1, 0], [1, 1]]  # passing: 1, 4
  h = Harness(group_filters=[DropZeroVarianceGroups()], dynamic_sampling=DynamicSampling())
  eps = make_groups(rewards)
  out = h.process(eps, 2, target_groups=3)
  np.testing.assert_array_equal(out.batch, [0, 1, 2, 3, 8, 9])  # groups 0 (backfill), 1, 4
  assert len({eps[i].episode_id for i in out.batch}) == 6
  assert out.metrics["groups/backfilled"] == 1 and out.metrics["groups/in_batch"] == 3
  np.testing.assert_array_equal(np.flatnonzero(out.keep), [2, 3, 8, 9])
  assert out.metrics["dead_group_ratio/after"] == pytest.approx(1 / 3)
  # More passing groups than needed: the first ones win, the rest say why.
  out1 = h.process(make_groups(rewards), 2, target_groups=1)
  np.testing.assert_array_equal(out1.batch, [2, 3])
  assert out1.reasons[8] == "dynamic_sampling: group not selected (batch already full)"
  assert out1.advantages[8] == 0.0


def test_dynamic_sampling_when_nothing_passes():
  h = Harness(group_filters=[DropZeroVarianceGroups()], dynamic_sampling=DynamicSampling())
  eps = make_groups([[0, 0], [1, 1], [0, 0]])
  out = h.process(eps, 2, target_groups=2)
  np.testing.assert_array_equal(out.batch, [0, 1, 2, 3])
  assert not out.keep.any() and not out.advantages.any()
  assert out.metrics["groups/backfilled"] == 2
  assert out.metrics["dead_group_ratio/after"] == 1.0
  with pytest.raises(ValueError, match="needs Harness.dynamic_sampling"):
    Harness().process(make_groups([[0, 1], [1, 0]]), 2, target_groups=1)


def test_bad_layouts_and_misplaced_filters():
  eps = make_groups([[0, 1], [1, 0]])
  with pytest.raises(ValueError, match="group_size=3"):
    Harness().process(eps, 3)
  mixed = [eps[0], eps[2], eps[1], eps[3]]
  with pytest.raises(ValueError, match="contiguous"):
    Harness().process(mixed, 2)
  with pytest.raises(ValueError, match="duplicate episode ids"):
    Harness().process([eps[0], eps[0]], 2)
  with pytest.raises(ValueError, match="a group filter: list it in Harness.group_filters"):
    Harness(trajectory_filters=[DropZeroVarianceGroups()])
  with pytest.raises(ValueError, match="a trajectory filter: list it in"):
    Harness(group_filters=[TruncationFilter()])

  class Mine:  # a user's trajectory filter listed as a group filter
    name = "mine"

    def __call__(self, groups):
      return FilterResult(keep=np.ones(len(groups), bool), reasons=(None,) * len(groups))

  with pytest.raises(ValueError, match="returned FilterResult.*Harness.trajectory_filters"):
    Harness(group_filters=[Mine()]).process(eps, 2)
  with pytest.raises(ValueError, match="estimator"):
    Harness(estimator="ppo")
  with pytest.raises(ValueError, match="duplicate component names"):
    Harness(group_filters=[StdGroupFilter(), StdGroupFilter()])


GIN = """
Harness.composer = @RewardComposer()
RewardComposer.parts = {'correct': 1.0, 'overlong': 1.0}
RewardComposer.components = [@OverlongPenalty()]
RewardComposer.clip = (-1.0, 1.0)
OverlongPenalty.max_length = 10
OverlongPenalty.buffer = 4
Harness.trajectory_filters = [@TruncationFilter(), @EchoTrapFilter()]
Harness.group_filters = [@DropZeroVarianceGroups(), @StdGroupFilter()]
StdGroupFilter.top_p = 0.8
Harness.estimator = 'rloo'
Harness.dynamic_sampling = @DynamicSampling()
"""


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_gin_builds_the_harness_and_describe_is_json(clean_gin):
  gin.parse_config(GIN)
  h = Harness()
  d = json.loads(json.dumps(h.describe()))
  assert d["composer"]["parts"] == {"correct": 1.0, "overlong": 1.0}
  assert d["composer"]["clip"] == [-1.0, 1.0]
  assert d["composer"]["components"] == [
      {"class": "OverlongPenalty", "max_length": 10, "buffer": 4, "name": "overlong"}]
  assert [f["class"] for f in d["trajectory_filters"]] == ["TruncationFilter", "EchoTrapFilter"]
  assert d["group_filters"][1] == {"class": "StdGroupFilter", "top_p": 0.8, "ema": 0.9,
                                   "name": "std_group"}
  assert d["estimator"] == "rloo" and d["whiten"] is False
  assert d["dynamic_sampling"] == {"class": "DynamicSampling", "oversample": 1.5,
                                   "max_rounds": 3}


def test_unknown_component_in_gin_is_a_clear_error(clean_gin, tmp_path):
  # gin itself refuses the reference at parse time and names it.
  with pytest.raises(ValueError, match=r"No configurable matching reference '@NoSuchPart\(\)'"):
    gin.parse_config("RewardComposer.components = [@NoSuchPart()]")
  # Through the project's parser the message also names the file and the line.
  path = tmp_path / "harness.gin"
  path.write_text(GIN + "Harness.trajectory_filters = [@TruncationFilter(), @NoSuchPart()]\n")
  with pytest.raises(config.ConfigError) as e:
    registry.parse([str(path)], finalize=False)
  msg = str(e.value)
  assert "harness.gin" in msg and "@NoSuchPart()" in msg and "No configurable" in msg
