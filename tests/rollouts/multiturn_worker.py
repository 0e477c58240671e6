"""One process of a 2-process multi-turn rollout, for `test_multiturn.py`.

  python -m tests.rollouts.multiturn_worker OUT_DIR [OVERLAP_WAVES]   (EVO_* variables
                                          set, see tests/sharding/spawn.py)

Every process joins the run, builds the same tiny model sharded over one `data` mesh of
all processes' devices, and runs the toy echo task's episodes through
`MultiTurnEngine` (rows sharded over the processes). Environments exist on process 0
only (`start_episode` refuses to run elsewhere). Each process writes what it got back,
and how many environment steps it ran itself, to OUT_DIR/process<i>.json.
"""

from __future__ import annotations

import json
import os
import sys

import jax
from flax import nnx
from jax.experimental import multihost_utils

from bench.multiturn import CharTokenizer, EchoEnv, EchoTask, tiny_config
from evotrainer.rollouts import MultiTurnEngine, TurnBudget
from evotrainer.sampling import Sampler, SamplingParams
from evotrainer.sharding.mesh import (create_model, initialize_distributed, make_mesh,
                                      state_shardings)
from evotrainer.sharding.rules import LEARNER_RULES, SAMPLER_RULES

STEPS = {"count": 0}


class CountingEnv(EchoEnv):
  def step(self, text):
    STEPS["count"] += 1
    return super().step(text)


def env_factory(problem):
  if jax.process_index() != 0:
    raise AssertionError(f"an environment was started on process {jax.process_index()}")
  return CountingEnv(submit_at=1 + int(problem.id.split("/")[1]) % 3, submit_char=None)


def main(argv) -> int:
  if len(argv) not in (2, 3) or not initialize_distributed():
    print(f"usage: {argv[0]} OUT_DIR [OVERLAP_WAVES] with EVO_* set", file=sys.stderr)
    return 2
  mesh = make_mesh(data=-1)
  tok = CharTokenizer()
  model = create_model(tiny_config(max_positions=128), mesh, LEARNER_RULES, seed=0)
  sampler = Sampler(model, pad_id=tok.pad_id, mesh=mesh)
  params = nnx.state(model)
  task = EchoTask(env_factory)
  rollout = MultiTurnEngine(task, tok, sampler, state_shardings(params, mesh, SAMPLER_RULES),
                            budget=TurnBudget(max_turns=4, max_context=64,
                                              max_tokens_per_turn=8),
                            overlap_waves=int(argv[2]) if len(argv) == 3 else 1)
  gen = rollout(params, task.train_problems(3, seed=0), 2, jax.random.key(7),
                SamplingParams(temperature=1.0), pad_rows_to=8)
  record = {"tokens": gen.tokens.tolist(), "logprobs": gen.logprobs.tolist(),
            "loss_mask": gen.loss_mask.tolist(), "lengths": gen.lengths.tolist(),
            "truncated": gen.truncated.tolist(), "texts": gen.texts, "scores": gen.scores,
            "infos": gen.infos, "env_steps": STEPS["count"]}
  with open(os.path.join(argv[1], f"process{jax.process_index()}.json"), "w") as f:
    json.dump(record, f)
  multihost_utils.sync_global_devices("multiturn_worker done")
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
