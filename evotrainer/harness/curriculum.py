"""Which training prompts a step draws: prompts whose groups are likely to carry a signal.

A group whose completions all get the same reward trains nothing (a dead group: GRPO
gives every row advantage 0). When most of a task's prompts are out of the policy's reach
(SWE at 135M parameters: 69-78% of the groups dead), most of a step's rollouts are spent
on them. `LiveGroupCurriculum` remembers, per problem id, how often its groups were live,
and draws the prompts of a step from a larger pool of the task's own draws, favouring the
ones whose groups were live: the same rollouts, more of them with a signal. Unlike
`DynamicSampling` it generates nothing extra.

It is a harness component (`Harness.curriculum`): its state (the counts) is saved with
every step like the other stateful components, so a resume draws the same prompts, and
`Harness.process` updates it from the step's groups.
"""

from __future__ import annotations

import random
from typing import Sequence

import gin
import numpy as np

from evotrainer.harness.base import groups_of
from evotrainer.harness.filters import dead_groups
from evotrainer.types import Episode


@gin.configurable(module="harness")
class LiveGroupCurriculum:
  """Draws a step's prompts by the estimated chance that their group is live.

  Each problem id keeps decayed counts of its groups and of its live groups (reward not
  the same for every row): after each group, `seen <- memory * seen + 1` and
  `live <- memory * live + is_live`. Its estimated live share is
  `(live + prior) / (seen + 2 * prior)`: 0.5 for a problem never drawn, so unseen
  problems are tried. A step draws `pool` times the prompts it needs with the task's own
  draw, keeps each problem id once, and takes the prompts it needs by a weighted draw
  without replacement (weight: the live share, at least `floor`, so that a problem that
  was out of reach is still drawn now and then and its count can recover as the policy
  learns). With a procedural task whose prompts rarely repeat every weight is the prior's,
  and the pick is uniform among the task's draws: distributed as the task's own draw.

  Args:
    pool: candidates drawn per prompt needed (>= 1; 1: the task's own draw, deduplicated).
    memory: decay of the counts per group of the same problem, in (0, 1]; 1 keeps every
      group, smaller forgets old verdicts faster.
    prior: pseudo-counts of a live and of a dead group (> 0).
    floor: the least weight of a problem, in (0, 1].
    name: the component's name in metrics and state.
  """

  def __init__(self, pool: float = 4.0, memory: float = 0.8, prior: float = 1.0,
               floor: float = 0.05, name: str = "live_groups"):
    if not pool >= 1.0:
      raise ValueError(f"LiveGroupCurriculum.pool={pool}: expected >= 1")
    if not 0.0 < memory <= 1.0:
      raise ValueError(f"LiveGroupCurriculum.memory={memory}: expected in (0, 1]")
    if not prior > 0.0:
      raise ValueError(f"LiveGroupCurriculum.prior={prior}: expected > 0")
    if not 0.0 < floor <= 1.0:
      raise ValueError(f"LiveGroupCurriculum.floor={floor}: expected in (0, 1]")
    self.pool, self.memory, self.prior, self.floor = (float(pool), float(memory),
                                                      float(prior), float(floor))
    self.name = name
    self._counts: dict = {}  # problem id -> [seen, live] (decayed)

  def candidates(self, want: int) -> int:
    """How many prompts to draw from the task for a step that needs `want`."""
    return max(want, int(np.ceil(self.pool * want)))

  def live_share(self, problem_id: str) -> float:
    """The estimated chance that a group of this problem is live."""
    seen, live = self._counts.get(problem_id, (0.0, 0.0))
    return (live + self.prior) / (seen + 2.0 * self.prior)

  def choose(self, problems: Sequence, want: int, seed: int) -> list:
    """`want` of `problems` (the task's draws, each with an `id`), deterministic in `seed`
    and the counts: distinct ids first, by a weighted draw without replacement
    (Efraimidis-Spirakis keys); repeats only when fewer than `want` ids were drawn."""
    if want < 1 or len(problems) < want:
      raise ValueError(f"LiveGroupCurriculum.choose: {len(problems)} candidates for "
                       f"{want} prompts; draw candidates(want) of them")
    first: dict = {}
    for i, p in enumerate(problems):
      first.setdefault(p.id, i)
    rng = random.Random(seed)
    keys = {i: rng.random() ** (1.0 / max(self.live_share(pid), self.floor))
            for pid, i in first.items()}
    order = sorted(keys, key=lambda i: -keys[i])
    rest = [i for i in range(len(problems)) if i not in keys]
    return [problems[i] for i in sorted((order + rest)[:want])]

  def update(self, episodes: Sequence[Episode]) -> None:
    """Counts each group of `episodes` (contiguous by group_id) for its problem."""
    groups = groups_of(episodes)
    for g, dead in zip(groups, dead_groups(groups)):
      seen, live = self._counts.get(g[0].task_id, (0.0, 0.0))
      self._counts[g[0].task_id] = [self.memory * seen + 1.0,
                                    self.memory * live + float(not dead)]

  def metrics(self) -> dict:
    """'problems': problem ids with counts; 'live_share': their mean estimated share."""
    shares = [self.live_share(k) for k in self._counts]
    return {"problems": len(shares), "live_share": float(np.mean(shares)) if shares else 0.5}

  def state(self) -> dict:
    return {"counts": {k: list(v) for k, v in self._counts.items()}}

  def load_state(self, state: dict) -> None:
    if set(state) != {"counts"}:
      raise ValueError(f"LiveGroupCurriculum.load_state: expected the key counts; got "
                       f"{sorted(state)}")
    self._counts = {str(k): [float(v[0]), float(v[1])] for k, v in state["counts"].items()}
