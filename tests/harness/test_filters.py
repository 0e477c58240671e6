"""Trajectory sentinels, group filters and dynamic sampling on crafted episodes."""

import numpy as np
import pytest

from evotrainer.harness import filters as F
from evotrainer.harness.base import GroupFilter, TrajectoryFilter
from tests.harness import make_episode


def test_filters_follow_the_shared_signatures():
  for f in (F.TruncationFilter(), F.EchoTrapFilter(), F.AbandonFilter(), F.IdleFilter()):
    assert isinstance(f, TrajectoryFilter)
  for f in (F.DropZeroVarianceGroups(), F.StdGroupFilter()):
    assert isinstance(f, GroupFilter)


# -- truncation ---------------------------------------------------------------------------


def test_truncation_hard_cuts_truncated_only():
  eps = [make_episode(0, length=20), make_episode(1, length=32, truncated=True),
         make_episode(2, length=31)]
  res = F.TruncationFilter("hard")(eps)
  np.testing.assert_array_equal(res.keep, [True, False, True])
  assert res.reasons[0] is None and res.reasons[1].startswith("truncation: truncated at 32")


def test_truncation_soft_threshold_and_answer():
  # limit 20, threshold 5: cut iff length >= 15 and no marked answer.
  rows = [
      (20, True, "so we keep going and", False),  # hit the limit, no answer: cut
      (20, True, "<answer>3</answer> and then", True),  # answered, then truncated: kept
      (15, False, "almost out of room", False),  # exactly at limit - threshold: cut
      (14, False, "almost out of room", True),  # one token further from the limit: kept
      (18, False, "the total is 42", False),  # a bare number is not an answer: cut
      (17, False, "\\boxed{42}", True),  # a box is an answer: kept
  ]
  eps = [make_episode(i, length=n, truncated=t, completion=c)
         for i, (n, t, c, _) in enumerate(rows)]
  res = F.TruncationFilter("soft", soft_threshold=5, max_length=20)(eps)
  np.testing.assert_array_equal(res.keep, [k for *_, k in rows])
  assert "15 tokens, within 5 of the limit 20, and no answer" in res.reasons[2]
  # The limit can come from the episode instead.
  eps2 = [make_episode(0, length=15, info={"max_new_tokens": 20})]
  assert not F.TruncationFilter("soft", soft_threshold=5)(eps2).keep[0]
  with pytest.raises(ValueError, match="max_new_tokens"):
    F.TruncationFilter("soft")([make_episode(0, length=15)])
  with pytest.raises(ValueError, match="mode"):
    F.TruncationFilter("medium")


# -- echo trap ----------------------------------------------------------------------------


def test_find_loop_by_hand():
  units = np.array([9, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 7])
  assert F.find_loop(units, n=4, max_repeats=3, max_period=64) == (4, 3, 1)
  assert F.find_loop(units, n=4, max_repeats=4, max_period=64) is None
  assert F.find_loop(units, n=5, max_repeats=3, max_period=64) is None
  assert F.find_loop(units[:5], n=4, max_repeats=3, max_period=64) is None


def test_echo_trap_cuts_exactly_the_two_looping_completions():
  completions = [
      "we add the numbers and the sum of the numbers is the answer",  # repeated words only
      "x = 5 . x = 5 . x = 5 . x = 5 . done",  # a 4-word block 4 times: loop
      "a b a b a b a b",  # period 2 (< n), and "a b a b" only twice
      "x = 5 . x = 5 . so x is 5",  # a block said twice
      "First we add . Let me check it again . Let me check it again . "
      "Let me check it again . ok",  # a 6-word block 3 times: loop
      "1 1 1 1 1 1 1 1 1 1 1",  # 11 equal words: "1 1 1 1" fits 2.75 times
  ]
  eps = [make_episode(i, completion=c) for i, c in enumerate(completions)]
  res = F.EchoTrapFilter(n=4, max_repeats=3, unit="words")(eps)
  np.testing.assert_array_equal(res.keep, [True, False, True, True, False, True])
  assert res.reasons[1] == ("echo_trap: a 4-word block repeats 4 times in a row from word 0: "
                            "'x = 5 .'")
  # The loop starts at the first word that begins a copy: the "." closing "First we add".
  assert res.reasons[4].endswith(
      "a 6-word block repeats 3 times in a row from word 3: '. Let me check it again'")


def test_echo_trap_on_tokens():
  loop = [5, 6, 7, 8, 9]
  eps = [make_episode(0, ids=[1, 2] + loop * 3 + [3]), make_episode(1, ids=[1, 2] + loop * 2),
         make_episode(2, length=40)]
  res = F.EchoTrapFilter(n=4, max_repeats=3)(eps)
  np.testing.assert_array_equal(res.keep, [False, True, True])
  assert "a 5-token block repeats 3 times in a row from token 2" in res.reasons[0]
  # A block longer than max_period is not searched.
  assert F.EchoTrapFilter(n=4, max_repeats=3, max_period=4)(eps).keep.all()


# -- multi-turn ---------------------------------------------------------------------------


def test_abandon_filter():
  eps = [
      make_episode(0, completion="single turn, no answer"),  # not multi-turn: kept
      make_episode(1, info={"turns": 3, "tool_calls": [{"name": "read_file", "turn": 0},
                                                       {"name": "submit", "turn": 2}]}),
      make_episode(2, completion="I give up", info={
          "turns": 2, "tool_calls": [{"name": "read_file", "turn": 0}],
          "stop": "stop_token"}),  # abandoned
      make_episode(3, info={"turns": 5, "tool_calls": [], "stop": "max_turns"}),
      make_episode(4, completion="<answer>4</answer>", info={"turns": [{}, {}]}),
      make_episode(5, info={"turns": 1, "submitted": True}),
  ]
  res = F.AbandonFilter()(eps)
  np.testing.assert_array_equal(res.keep, [True, True, False, True, True, True])
  assert res.reasons[2] == ("abandon: ended after 2 turns (stop='stop_token') without "
                            "submitting or answering")
  with pytest.raises(ValueError, match="tool_calls"):
    F.AbandonFilter()([make_episode(0, info={"turns": 1, "tool_calls": ["submit"]})])


def test_idle_filter():
  def calls(*turns, name="read_file"):
    return [{"name": name, "turn": t} for t in turns]

  eps = [
      make_episode(0, info={"turns": 6, "tool_calls": calls(0, 5)}),  # idle 1..4: cut
      make_episode(1, info={"turns": 6, "tool_calls": calls(0, 3)}),  # runs of 2: kept
      make_episode(2, info={"turns": [{}] * 3, "tool_calls": []}),  # 3 idle turns: cut
      make_episode(3),  # single turn: kept
  ]
  res = F.IdleFilter(max_idle_turns=3)(eps)
  np.testing.assert_array_equal(res.keep, [False, True, False, True])
  assert res.reasons[0] == "idle: 4 consecutive turns without a tool call (turns 1..4 of 6)"
  # Only edits count as activity: reading every turn is idle.
  reader = [make_episode(0, info={"turns": 4, "tool_calls": calls(0, 1, 2, 3)}),
            make_episode(1, info={"turns": 4, "tool_calls": calls(0, 1, 2, 3) +
                                  calls(2, name="search_replace")})]
  got = F.IdleFilter(max_idle_turns=3, active_tools=["search_replace"])(reader)
  np.testing.assert_array_equal(got.keep, [False, True])


# -- group filters ------------------------------------------------------------------------


def _groups(rewards):
  return [[make_episode(10 * g + j, group=g, reward=r) for j, r in enumerate(rs)]
          for g, rs in enumerate(rewards)]


def test_drop_zero_variance_groups():
  rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1],
             [0.5, 0, 0, 0], [0.2, 0.2, 0.2, 0.2], [0, 0, 0, 1]]
  keep = F.DropZeroVarianceGroups()(_groups(rewards))
  np.testing.assert_array_equal(keep, [True, False, True, True, False, True, False, True])
  # A group with fewer than two kept rows carries no signal either.
  np.testing.assert_array_equal(F.DropZeroVarianceGroups()(_groups([[], [1.0], [1, 0]])),
                                [False, False, True])


def test_zero_variance_is_judged_with_a_tolerance():
  # 0.1 * 3 != 0.3 in floating point: composed rewards that differ in the last bit are
  # no signal; a real difference of 1e-3 is.
  a, b = 0.1 * 3, 0.3
  assert a != b
  keep = F.DropZeroVarianceGroups()(_groups([[a, b, b, a], [100 * a, 100 * b, 30, 30],
                                             [0.3, 0.301, 0.3, 0.3]]))
  np.testing.assert_array_equal(keep, [False, False, True])


def test_std_group_filter_threshold_and_ema_by_hand():
  f = F.StdGroupFilter(top_p=0.5, ema=0.5)
  # Step 1 stds [0, .5, .25, 1]: the 0.5 quantile of [0, .25, .5, 1] is .375 = threshold.
  step1 = _groups([[0, 0], [0, 1], [0, 0.5], [0, 2]])
  np.testing.assert_array_equal(f(step1), [False, True, False, True])
  assert f.state() == {"threshold": 0.375, "steps": 1}
  after1 = f.state()
  # Step 2 stds [.1, .3, .4, .6]: quantile .35; threshold .5 * .375 + .5 * .35 = .3625.
  step2 = _groups([[0, 0.2], [0, 0.6], [0, 0.8], [0, 1.2]])
  np.testing.assert_array_equal(f(step2), [False, False, True, True])
  assert f.state()["threshold"] == pytest.approx(0.3625)
  assert f.metrics()["quantile"] == pytest.approx(0.35)
  # Restoring the state after step 1 reproduces step 2.
  g = F.StdGroupFilter(top_p=0.5, ema=0.5)
  g.load_state(after1)
  np.testing.assert_array_equal(g(step2), [False, False, True, True])
  assert g.state() == f.state()
  with pytest.raises(ValueError, match="threshold, steps"):
    g.load_state({"thr": 1.0})


# -- dynamic sampling ---------------------------------------------------------------------


def test_select_first_passing_groups():
  ds = F.DynamicSampling()
  sel = ds.select(np.array([False, True, False, True, True, False]), target=2)
  np.testing.assert_array_equal(sel.groups, [1, 3])
  assert sel.num_backfilled == 0 and sel.num_passed == 3


def test_select_backfills_in_generation_order():
  sel = F.DynamicSampling().select(np.array([False, True, False, True, False, False]), 4)
  np.testing.assert_array_equal(sel.groups, [0, 1, 2, 3])
  np.testing.assert_array_equal(sel.backfilled, [True, False, True, False])
  assert sel.num_backfilled == 2


def test_select_when_nothing_passes():
  sel = F.DynamicSampling().select(np.zeros(5, bool), 3)
  np.testing.assert_array_equal(sel.groups, [0, 1, 2])
  assert sel.num_backfilled == 3 and sel.num_passed == 0
  with pytest.raises(ValueError, match="2 groups generated for a batch of 3"):
    F.DynamicSampling().select(np.ones(2, bool), 3)


def test_select_is_exact_and_never_duplicates():
  rng = np.random.default_rng(0)
  ds = F.DynamicSampling()
  for _ in range(200):
    num = int(rng.integers(1, 30))
    target = int(rng.integers(1, num + 1))
    passed = rng.random(num) < rng.random()
    sel = ds.select(passed, target)
    assert len(sel.groups) == target == len(set(sel.groups.tolist()))
    good = np.flatnonzero(passed)
    # the first passing groups are all in, and only as many failed ones as needed
    assert set(good[:target].tolist()) <= set(sel.groups.tolist())
    assert sel.num_backfilled == max(0, target - len(good))


def test_groups_to_generate():
  ds = F.DynamicSampling(oversample=1.5, max_rounds=3)
  assert ds.groups_to_generate(8) == 12
  # pass rate 1/3, 4 missing: 1.5 * 4 * 3 = 18, capped at one round's 12.
  assert ds.groups_to_generate(8, generated=12, passed=4, rounds=1) == 12
  # pass rate 1/2, 2 missing: 1.5 * 2 / 0.5 = 6.
  assert ds.groups_to_generate(8, generated=12, passed=6, rounds=1) == 6
  assert ds.groups_to_generate(8, generated=12, passed=0, rounds=1) == 12
  assert ds.groups_to_generate(8, generated=12, passed=8, rounds=1) == 0
  assert ds.groups_to_generate(8, generated=36, passed=2, rounds=3) == 0
  # Out of rounds but short of the batch: generate what is missing, no more.
  assert ds.groups_to_generate(8, generated=5, passed=2, rounds=3) == 3
