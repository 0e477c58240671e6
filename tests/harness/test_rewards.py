"""Reward parts and the composer against hand-computed values."""

import math

import numpy as np
import pytest

from evotrainer.harness import rewards as R
from evotrainer.harness.base import RewardPart
from tests.harness import make_episode


def test_parts_follow_the_shared_signature():
  for part in (R.TaskPart(), R.OverlongPenalty(10, 4), R.LengthPenalty(5, 10.0),
               R.RepetitionPenalty(), R.BehaviourBonus("judge")):
    assert isinstance(part, RewardPart)


def test_task_part_reads_reward_parts():
  eps = [make_episode(0, reward_parts={"correct": 1.0, "partial": 0.3}),
         make_episode(1, reward_parts={"correct": 0.0, "partial": 0.7})]
  np.testing.assert_array_equal(R.TaskPart()(eps), [1.0, 0.0])
  np.testing.assert_array_equal(R.TaskPart("partial")(eps), [0.3, 0.7])
  assert R.TaskPart("partial", name="cr").name == "cr"


def test_task_part_missing_names_episode_and_available_parts():
  eps = [make_episode(0, reward_parts={"correct": 1.0}),
         make_episode(7, reward_parts={"format": 1.0})]
  with pytest.raises(KeyError, match=r"'correct'.*'v0/0/7'.*\['format'\]"):
    R.TaskPart("correct")(eps)


def test_overlong_penalty_dapo():
  # L = 10, B = 4: 0 up to 6 tokens, (6 - len) / 4 on (6, 10], -1 beyond 10.
  eps = [make_episode(i, length=n) for i, n in enumerate([5, 6, 7, 8, 10, 11])]
  got = R.OverlongPenalty(max_length=10, buffer=4)(eps)
  np.testing.assert_allclose(got, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
  # buffer 0: a hard step at L.
  np.testing.assert_allclose(R.OverlongPenalty(10, 0)(eps), [0, 0, 0, 0, 0, -1])


def test_overlong_penalty_needs_tokens_and_valid_knobs():
  with pytest.raises(ValueError, match="no completion_ids"):
    R.OverlongPenalty(10, 4)([make_episode(3, completion="text only")])
  with pytest.raises(ValueError, match="buffer"):
    R.OverlongPenalty(10, 11)


def test_length_penalty():
  eps = [make_episode(i, length=n) for i, n in enumerate([3, 5, 8, 25])]
  np.testing.assert_allclose(R.LengthPenalty(target=5, scale=10)(eps), [0, 0, -0.3, -2.0])


def test_repetition_penalty_tokens_and_words():
  # [1,2,3,1,2,3], n=2: 5 bigrams, 3 distinct -> share 2/5.
  eps = [make_episode(0, ids=[1, 2, 3, 1, 2, 3]), make_episode(1, ids=[1, 2, 3, 4]),
         make_episode(2, ids=[7])]
  np.testing.assert_allclose(R.RepetitionPenalty(n=2)(eps), [-0.4, 0.0, 0.0])
  # "a b a b": bigrams ab, ba, ab -> 1 repeat of 3.
  words = [make_episode(0, completion="a b a b"), make_episode(1, completion="a b c d e")]
  np.testing.assert_allclose(R.RepetitionPenalty(n=2, unit="words")(words), [-1 / 3, 0.0])


def test_behaviour_bonus_hook():
  eps = [make_episode(0, info={"judge": 0.5}), make_episode(1)]
  np.testing.assert_allclose(R.BehaviourBonus("judge", scale=2.0)(eps), [1.0, 0.0])
  with pytest.raises(KeyError, match=r"v0/0/1.*judge"):
    R.BehaviourBonus("judge", default=None)(eps)
  with pytest.raises(ValueError, match="not a number"):
    R.BehaviourBonus("judge")([make_episode(0, info={"judge": "great"})])


def _four():
  # (correct, partial, tokens)
  rows = [(1, 1.0, 5), (0, 0.4, 8), (0, 0.0, 11), (1, 1.0, 7)]
  return [make_episode(i, reward_parts={"correct": c, "partial": p}, length=n)
          for i, (c, p, n) in enumerate(rows)]


def test_composer_weighted_sum_writes_parts_and_reward():
  eps = _four()
  comp = R.RewardComposer(parts={"correct": 1.0, "partial": 0.5, "overlong": 1.0},
                          components=[R.OverlongPenalty(10, 4)])
  out = comp(eps)
  # overlong: [0, -0.5, -1, -0.25]; reward = correct + 0.5 * partial + overlong.
  want = [1.5, 0.2 - 0.5, -1.0, 1.5 - 0.25]
  np.testing.assert_allclose(out.rewards, want, rtol=1e-6)
  assert out.rewards.dtype == np.float32
  assert out.quarantine.keep.all()
  assert [e.reward_parts["overlong"] for e in eps] == [0.0, -0.5, -1.0, -0.25]
  assert [e.reward for e in eps] == [float(np.float32(w)) for w in want]
  assert comp.names == ["overlong", "correct", "partial"]


def test_composer_clips():
  eps = _four()
  comp = R.RewardComposer(parts={"correct": 1.0, "partial": 0.5, "overlong": 1.0},
                          components=[R.OverlongPenalty(10, 4)], clip=(-0.5, 1.2))
  np.testing.assert_allclose(comp(eps).rewards, [1.2, -0.3, -0.5, 1.2], rtol=1e-6)
  with pytest.raises(ValueError, match="lo < hi"):
    R.RewardComposer(clip=(1.0, 0.0))


def test_unweighted_component_is_stored_but_not_summed():
  eps = _four()
  out = R.RewardComposer(components=[R.LengthPenalty(5, 10)])(eps)
  np.testing.assert_array_equal(out.rewards, [1, 0, 0, 1])
  assert eps[2].reward_parts["length"] == pytest.approx(-0.6)


class _Bad:
  name = "bad"

  def __init__(self, values):
    self.values = values

  def __call__(self, episodes):
    return np.asarray(self.values)


def test_nan_part_quarantines_the_episode_with_a_reason():
  eps = [make_episode(i, reward_parts={"correct": 1.0}) for i in range(3)]
  comp = R.RewardComposer(parts={"correct": 1.0, "bad": 1.0},
                          components=[_Bad([0.5, math.nan, math.inf])])
  out = comp(eps)
  np.testing.assert_array_equal(out.quarantine.keep, [True, False, False])
  assert out.quarantine.reasons == (None, "reward part bad returned nan",
                                    "reward part bad returned inf")
  np.testing.assert_allclose(out.rewards, [1.5, 0.0, 0.0])
  assert math.isnan(eps[1].reward_parts["bad"])  # the evidence is kept
  # Weight 0: listed for the record, quarantines nothing.
  out0 = R.RewardComposer(parts={"correct": 1.0, "bad": 0.0},
                          components=[_Bad([0.5, math.nan, math.inf])])(eps)
  assert out0.quarantine.keep.all()


def test_wrong_shape_is_an_error_naming_the_part():
  eps = [make_episode(i, reward_parts={"correct": 1.0}) for i in range(3)]
  with pytest.raises(ValueError, match=r"'bad'.*shape \(2,\).*expected \(3,\)"):
    R.RewardComposer(components=[_Bad([0.0, 1.0])])(eps)
  with pytest.raises(ValueError, match="non-numbers"):
    R.RewardComposer(components=[_Bad(["x", "y", "z"])])(eps)


def test_function_component_and_duplicate_names():
  def bonus(episodes):
    return np.ones(len(episodes))

  eps = [make_episode(i, reward_parts={"correct": 0.0}) for i in range(2)]
  out = R.RewardComposer(parts={"correct": 1.0, "bonus": 0.25}, components=[bonus])(eps)
  np.testing.assert_allclose(out.rewards, [0.25, 0.25])
  with pytest.raises(ValueError, match="duplicate"):
    R.RewardComposer(components=[R.LengthPenalty(1, 1), R.LengthPenalty(2, 1)])


def test_missing_weighted_task_part_is_an_error():
  eps = [make_episode(0, reward_parts={"correct": 1.0})]
  with pytest.raises(KeyError, match=r"'partial'.*'v0/0/0'"):
    R.RewardComposer(parts={"correct": 1.0, "partial": 1.0})(eps)
