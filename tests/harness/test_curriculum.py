"""LiveGroupCurriculum: counts of live groups per problem, the weighted pick, its state
in the harness."""

import dataclasses

import numpy as np
import pytest

from evotrainer.harness.curriculum import LiveGroupCurriculum
from evotrainer.harness.pipeline import Harness
from evotrainer.types import Episode


@dataclasses.dataclass(frozen=True)
class P:
  id: str


def _episodes(groups):
  """groups: [(task_id, [rewards])] -> episodes with `correct` = the reward."""
  out = []
  for g, (tid, rewards) in enumerate(groups):
    for r in rewards:
      out.append(Episode(episode_id=f"e{len(out)}", group_id=g, task_id=tid, prompt="q",
                         completion="c", answer="a", reward_parts={"correct": r}, reward=r))
  return out


def test_counts_decay_and_give_the_live_share_by_hand():
  cur = LiveGroupCurriculum(memory=0.5, prior=1.0)
  assert cur.live_share("a") == 0.5  # never drawn: the prior's
  cur.update(_episodes([("a", [0.0, 1.0]), ("b", [1.0, 1.0])]))  # a live, b dead
  # a: seen 1, live 1 -> (1 + 1) / (1 + 2); b: seen 1, live 0 -> 1 / 3
  assert cur.live_share("a") == pytest.approx(2 / 3)
  assert cur.live_share("b") == pytest.approx(1 / 3)
  cur.update(_episodes([("a", [0.0, 0.0])]))  # a dead: seen 0.5 + 1, live 0.5 + 0
  assert cur.live_share("a") == pytest.approx((0.5 + 1) / (1.5 + 2))
  assert cur.metrics() == {"problems": 2,
                           "live_share": pytest.approx(((1.5 / 3.5) + (1 / 3)) / 2)}


def test_the_pick_follows_the_weights():
  """One pick of two: P(hot) = w_hot / (w_hot + w_cold) for Efraimidis-Spirakis keys.
  hot: 10 live groups of 10 -> 11/12; cold: 0 of 10 -> 1/12 (above the floor)."""
  cur = LiveGroupCurriculum(memory=1.0, prior=1.0, floor=0.05)
  cur.load_state({"counts": {"hot": [10.0, 10.0], "cold": [10.0, 0.0]}})
  picks = [cur.choose([P("cold"), P("hot")], 1, seed)[0].id for seed in range(4000)]
  share = picks.count("hot") / len(picks)
  assert share == pytest.approx(11 / 12, abs=0.02)
  # The floor: a problem never live is weighted at least `floor`.
  cur.load_state({"counts": {"hot": [100.0, 100.0], "cold": [100.0, 0.0]}})
  picks = [cur.choose([P("cold"), P("hot")], 1, seed)[0].id for seed in range(4000)]
  w_hot, w_cold = 101 / 102, 0.05  # cold's estimate 1/102 is under the floor
  assert picks.count("cold") / len(picks) == pytest.approx(w_cold / (w_hot + w_cold),
                                                           abs=0.015)


def test_the_pick_keeps_distinct_ids_first_and_the_draw_order():
  cur = LiveGroupCurriculum()
  problems = [P("a"), P("b"), P("a"), P("c")]
  two = cur.choose(problems, 2, seed=0)
  assert len({p.id for p in two}) == 2
  assert [p.id for p in cur.choose(problems, 3, seed=0)] == ["a", "b", "c"]
  four = cur.choose(problems, 4, seed=0)  # only 3 ids: the repeat fills the last place
  assert [p.id for p in four] == ["a", "b", "a", "c"]
  assert cur.choose(problems, 2, seed=5) == cur.choose(problems, 2, seed=5)
  assert cur.candidates(3) == 12 and LiveGroupCurriculum(pool=1.0).candidates(3) == 3
  with pytest.raises(ValueError, match="candidates"):
    cur.choose(problems[:1], 2, seed=0)


@pytest.mark.parametrize("kw", [{"pool": 0.5}, {"memory": 0.0}, {"memory": 1.5},
                                {"prior": 0.0}, {"floor": 0.0}])
def test_bad_knobs_are_refused(kw):
  with pytest.raises(ValueError, match="LiveGroupCurriculum"):
    LiveGroupCurriculum(**kw)


def test_the_harness_counts_each_step_and_keeps_the_state():
  h = Harness(curriculum=LiveGroupCurriculum(memory=1.0))
  eps = _episodes([("a", [0.0, 1.0]), ("b", [1.0, 1.0])])
  h.process(eps, 2, update_state=False)  # a dry run (a dynamic-sampling round) counts nothing
  assert h.state() == {"curriculum/live_groups": {"counts": {}}}
  out = h.process(eps, 2)
  assert out.state == {"curriculum/live_groups": {"counts": {}}}  # the state before
  assert h.state() == {"curriculum/live_groups": {"counts": {"a": [1.0, 1.0],
                                                             "b": [1.0, 0.0]}}}
  assert out.metrics["curriculum/problems"] == 2
  assert out.metrics["curriculum/live_share"] == pytest.approx((2 / 3 + 1 / 3) / 2)
  other = Harness(curriculum=LiveGroupCurriculum(memory=1.0))
  other.load_state(h.state())
  assert other.curriculum.live_share("a") == pytest.approx(2 / 3)
  assert h.describe()["curriculum"]["class"] == "LiveGroupCurriculum"
  assert Harness().describe()["curriculum"] is None
  with pytest.raises(ValueError, match="counts"):
    other.curriculum.load_state({"count": {}})
  # Counting changes no reward or advantage: b's group is dead and trains nothing.
  np.testing.assert_array_equal(out.advantages[2:], [0.0, 0.0])
  assert out.advantages[1] > 0 > out.advantages[0]
