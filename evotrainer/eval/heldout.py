"""Held-out evaluation of a policy: the figures every evolution decision reads.

`evaluate` samples `EvalConfig.k` completions per problem at `EvalConfig.temperature` for
Avg@k and pass@k, plus one greedy completion per problem. A training segment evaluates
the validation split every `train.eval_every` steps (train.py); a `train` or `branch`
run evaluates the test split once at the end (`evaluate_test_split`, reported only; a task
with a `test_report` also sums up those episodes: `score_test_split`) and a branch checks
its canaries greedily (`canary_evaluation`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import gin
import jax
import numpy as np

from evotrainer.rollouts.single_turn import SingleTurnEngine
from evotrainer.sampling import SamplingParams


# module="train": the evaluation is configured beside the training segment that runs it;
# gin files and stored operative configs name it `EvalConfig.*` (`train.EvalConfig.*`).
@gin.configurable(module="train")
@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out evaluation: Avg@k and pass@k at `temperature`, plus greedy accuracy.

  `num_problems` validation problems are evaluated every `train.eval_every` steps (what
  every evolution decision reads); `num_test` test problems only at the end of a `train`
  or `branch` run (reported, never selected on). The sampling key depends on `seed`
  only, never on the run seed: every version is evaluated with the same keys on the same
  problems (common random numbers), so a child and its parent are compared paired.

  `temperature` is the evaluation's own setting, apart from the training sampler's
  (`SamplingParams.temperature`, which the learner's log-probs follow): the figures every
  version is compared on must not move when an evolution mutates how training samples.
  """

  num_problems: int = 64
  k: int = 8
  temperature: float = 1.0
  max_new_tokens: int = 32
  batch_rows: int = 256
  num_test: int = 0
  seed: int = 0

  def key(self) -> jax.Array:
    return jax.random.key(self.seed + 7919)


def evaluate(rollout: SingleTurnEngine, params, heldout: Sequence, cfg: EvalConfig,
             key: jax.Array, *, version: str = "v0", step: int = 0,
             num_problems: Optional[int] = None, split: str = "heldout",
             progress: Optional[Callable[[int, int], None]] = None) -> tuple[dict, list]:
  """Held-out figures {'avg{k}', 'pass{k}', 'greedy', 'format'} and the sampled episodes
  over the first `num_problems` (default `cfg.num_problems`) of `heldout`; `progress(done,
  total)` is called with the problems sampled so far after each batch."""
  problems = list(heldout[:cfg.num_problems if num_problems is None else num_problems])
  per = max(1, cfg.batch_rows // cfg.k)
  correct, fmt, episodes = [], [], []
  sp = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
  for i in range(0, len(problems), per):
    chunk = problems[i:i + per]
    gen = rollout(params, chunk, cfg.k, jax.random.fold_in(key, i), sp,
                  pad_rows_to=per * cfg.k)
    correct.append(gen.part("correct").reshape(len(chunk), cfg.k))
    fmt.append(gen.part("format"))
    episodes += gen.episodes(rollout.task, version=version, step=step, split=split,
                             group=cfg.k, first_row=len(episodes))
    if progress is not None:
      progress(i + len(chunk), len(problems))
  correct = np.concatenate(correct)
  greedy = []
  gp = SamplingParams(max_new_tokens=cfg.max_new_tokens, greedy=True)
  for i in range(0, len(problems), cfg.batch_rows):
    chunk = problems[i:i + cfg.batch_rows]
    gen = rollout(params, chunk, 1, key, gp, pad_rows_to=cfg.batch_rows)
    greedy.append(gen.part("correct"))
  k = cfg.k
  return ({f"avg{k}": float(correct.mean()), f"pass{k}": float(correct.max(axis=1).mean()),
           "greedy": float(np.concatenate(greedy).mean()),
           "format": float(np.concatenate(fmt).mean()),
           **by_level(problems, correct)}, episodes)


def by_level(problems: Sequence, correct: np.ndarray) -> dict:
  """{'avg{k}_level{L}', 'pass{k}_level{L}'} per `Problem.meta['level']` when the
  problems span two or more levels (SWE issue levels, `SweDomain.levels`); {} otherwise.
  `correct` is [problems, k]."""
  levels = [(p.meta or {}).get("level") for p in problems]
  if None in levels or len(set(levels)) < 2:
    return {}
  k, out = correct.shape[1], {}
  for level in sorted(set(levels)):
    rows = correct[[i for i, v in enumerate(levels) if v == level]]
    out[f"avg{k}_level{level}"] = float(rows.mean())
    out[f"pass{k}_level{level}"] = float(rows.max(axis=1).mean())
  return out


def evaluate_test_split(rollout, params, task, eval_config=None) -> tuple[dict, dict]:
  """Figures and {task_id: mean correct} on the test split (`score_test_split`)."""
  figures, episodes = score_test_split(rollout, params, task, eval_config)
  return figures, per_problem(episodes)


def score_test_split(rollout, params, task, eval_config=None,
                     progress: Optional[Callable[[int, int], None]] = None
                     ) -> tuple[dict, list]:
  """Figures and episodes on the test split (`EvalConfig.num_test` problems, the
  evaluation's fixed keys); ({}, []) when `num_test` is 0.

  The test split is reported only: its figures go to summaries and `test_eval.json`,
  never to a branch result, the rollout store or anything the controller reads.
  """
  cfg = eval_config or EvalConfig()
  if cfg.num_test <= 0:
    return {}, []
  problems = task.heldout_problems(cfg.num_test, split="test")
  return evaluate(rollout, params, problems, cfg, cfg.key(), split="test",
                  num_problems=len(problems), progress=progress)


def canary_evaluation(rollout, params, task, eval_config=None) -> tuple[dict, dict]:
  """Greedy accuracy on the task's canaries (`canary_problems`, known answers shipped as
  data: tasks/math/canaries.py), each checked by the task's strict verifier against the
  file's answer, never by the reward: ({'canary_accuracy', 'canary_n'}, {canary id: 0/1});
  ({}, {}) for a task without canaries."""
  canaries = getattr(task, "canary_problems", list)()
  if not canaries:
    return {}, {}
  cfg = eval_config or EvalConfig()
  sp = SamplingParams(max_new_tokens=cfg.max_new_tokens, greedy=True)
  correct = {}
  for i in range(0, len(canaries), cfg.batch_rows):
    chunk = canaries[i:i + cfg.batch_rows]
    gen = rollout(params, chunk, 1, cfg.key(), sp, pad_rows_to=cfg.batch_rows)
    for p, text in zip(chunk, gen.texts):
      correct[p.id] = float(task.strict_verify(p.answer, text))
  return ({"canary_accuracy": sum(correct.values()) / len(correct),
           "canary_n": float(len(correct))}, correct)


def per_problem(episodes) -> dict:
  """{task_id: mean correctness over its samples}: what a paired comparison reads."""
  out: dict = {}
  for ep in episodes:
    out.setdefault(ep.task_id, []).append(float(ep.reward_parts.get("correct", 0.0)))
  return {k: sum(v) / len(v) for k, v in sorted(out.items())}


__all__ = ["EvalConfig", "by_level", "canary_evaluation", "evaluate", "evaluate_test_split",
           "per_problem", "score_test_split"]
