"""One training segment, read top to bottom as one RL step:

  prompts -> sample G completions each -> score (task verifier) -> rewards ->
  group advantages -> learner update -> (every k steps) held-out eval -> checkpoint.

Everything random in step s is a function of (seed, s): the prompts are
`task.train_problems(n, seed=data_seed(seed, s))` and the sampling key is
`fold_in(key(seed), s)`. A checkpoint therefore needs only the train state and the
step to resume exactly where a run stopped (same data position, same RNG stream).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import time
from typing import Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from flax import nnx

from evotrainer.checkpoint import Checkpoints
from evotrainer.learner.advantages import ESTIMATORS
from evotrainer.learner.step import Learner, TrainState
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sharding.mesh import state_shardings
from evotrainer.sharding.rules import SAMPLER_RULES
from evotrainer.types import TrainBatch

log = logging.getLogger(__name__)


def data_seed(seed: int, step: int) -> int:
  """Seed of the prompts of `step` (the data position is the step number)."""
  return (seed * 1_000_003 + step) % (2**31 - 1)


@dataclasses.dataclass
class Generation:
  """Host-side rollouts of one batch of problems (rows grouped: G per problem)."""

  problems: list  # [B] Problem, each repeated G times in a row
  prompt_tokens: np.ndarray  # [B, P] left-padded
  prompt_lengths: np.ndarray  # [B]
  tokens: np.ndarray  # [B, N] completion ids
  logprobs: np.ndarray  # [B, N]
  lengths: np.ndarray  # [B]
  truncated: np.ndarray  # [B] bool
  texts: list  # [B] decoded completions
  scores: list  # [B] dicts of reward parts from the task

  def part(self, name: str) -> np.ndarray:
    return np.array([s.get(name, 0.0) for s in self.scores], np.float32)


class Rollout:
  """Encode prompts, sample, decode, score: the path from problems to scored text."""

  def __init__(self, task, tokenizer, sampler: Sampler, sampler_shardings=None):
    self.task = task
    self.tok = tokenizer
    self.sampler = sampler
    self.sampler_shardings = sampler_shardings

  def __call__(self, params, problems: Sequence, group: int, key: jax.Array,
               sampling: SamplingParams, pad_rows_to: Optional[int] = None) -> Generation:
    if self.sampler_shardings is not None:
      params = jax.device_put(params, self.sampler_shardings)
    rows = [p for p in problems for _ in range(group)]
    ids = [self.tok.encode(self.task.format_prompt(p), add_bos=True) for p in rows]
    n = len(ids)
    if pad_rows_to and n < pad_rows_to:  # a fixed batch shape: no recompile
      ids = ids + [ids[-1]] * (pad_rows_to - n)
    batch = left_pad(ids, self.tok.pad_id)
    out = self.sampler(params, batch, key, stop_ids=self.tok.stop_ids, sampling=sampling)
    tokens = np.asarray(out.tokens)[:n]
    lengths = np.asarray(out.lengths)[:n]
    texts = [self.tok.decode(_cut_at_stop(tokens[i, :lengths[i]], self.tok.stop_ids))
             for i in range(n)]
    scores = self.task.score_many(rows, texts)
    return Generation(problems=rows, prompt_tokens=np.asarray(batch.tokens)[:n],
                      prompt_lengths=np.asarray(batch.lengths)[:n], tokens=tokens,
                      logprobs=np.asarray(out.logprobs)[:n], lengths=lengths,
                      truncated=np.asarray(out.truncated)[:n], texts=texts, scores=scores)


def _cut_at_stop(ids: np.ndarray, stop_ids: Sequence[int]) -> list:
  ids = ids.tolist()
  if ids and ids[-1] in stop_ids:
    ids = ids[:-1]
  return ids


@gin.configurable(module="train")
@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out evaluation: Avg@k and pass@k at `temperature`, plus greedy accuracy."""

  num_problems: int = 64
  k: int = 8
  temperature: float = 1.0
  max_new_tokens: int = 32
  batch_rows: int = 256


def evaluate(rollout: Rollout, params, heldout: Sequence, cfg: EvalConfig,
             key: jax.Array) -> dict:
  """{'avg8', 'pass8', 'greedy', 'format'} on the held-out problems (k in the names)."""
  problems = list(heldout[:cfg.num_problems])
  per = max(1, cfg.batch_rows // cfg.k)
  correct = []
  fmt = []
  sp = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
  for i in range(0, len(problems), per):
    chunk = problems[i:i + per]
    gen = rollout(params, chunk, cfg.k, jax.random.fold_in(key, i), sp,
                  pad_rows_to=per * cfg.k)
    correct.append(gen.part("correct").reshape(len(chunk), cfg.k))
    fmt.append(gen.part("format"))
  correct = np.concatenate(correct)
  greedy = []
  gp = SamplingParams(max_new_tokens=cfg.max_new_tokens, greedy=True)
  for i in range(0, len(problems), cfg.batch_rows):
    chunk = problems[i:i + cfg.batch_rows]
    gen = rollout(params, chunk, 1, key, gp, pad_rows_to=cfg.batch_rows)
    greedy.append(gen.part("correct"))
  k = cfg.k
  return {f"avg{k}": float(correct.mean()), f"pass{k}": float(correct.max(axis=1).mean()),
          "greedy": float(np.concatenate(greedy).mean()),
          "format": float(np.concatenate(fmt).mean())}


class MetricWriter:
  """Metrics as JSON lines (`metrics.jsonl`) and TensorBoard event files."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "metrics.jsonl")
    try:
      from tensorboardX import SummaryWriter
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    except ImportError:  # optional: JSON lines are the record
      self.tb = None

  def write(self, step: int, metrics: dict) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, **metrics}) + "\n")
    if self.tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)):
          self.tb.add_scalar(k, v, step)
      self.tb.flush()

  def truncate_after(self, step: int) -> None:
    """Drops lines logged after `step` (work redone after a resume is not duplicated)."""
    if not os.path.exists(self.path):
      return
    with open(self.path) as f:
      keep = [l for l in f if l.strip() and json.loads(l)["step"] <= step]
    with open(self.path, "w") as f:
      f.writelines(keep)


@gin.configurable(module="train")
def train(workdir: str, task, model, tokenizer, mesh=None, *, seed: int = 0,
          steps: int = 100, prompts_per_step: int = 16, group_size: int = 8,
          reward_weights: Optional[dict] = None, estimator: str = "grpo",
          updates_per_batch: int = 1, sampling: Optional[SamplingParams] = None,
          eval_every: int = 25, eval_config: Optional[EvalConfig] = None,
          checkpoint_every: int = 25, max_to_keep: int = 2, time_limit_s: Optional[float] = None,
          learner_factory: Callable[..., Learner] = Learner, progress: bool = True) -> dict:
  """Trains `model` with GRPO-family updates on `task`; resumes from `workdir` if possible.

  Args:
    workdir: run directory (checkpoints/, metrics.jsonl, tensorboard/).
    task: the domain (`train_problems`, `heldout_problems`, `format_prompt`, `score_many`).
    model, tokenizer: the policy (parameters are copied into the learner's state).
    mesh: device mesh, or None for the default device.
    seed: seed of the data order and of sampling.
    steps: RL steps (one batch of prompts each).
    prompts_per_step, group_size: prompts per step and completions per prompt (G).
    reward_weights: {reward part: weight}; the reward is the weighted sum of the task's
      parts (default {'correct': 1.0}).
    estimator: advantage estimator: 'grpo', 'dr_grpo' or 'rloo'.
    updates_per_batch: optimizer updates on each batch (PPO epochs).
    sampling: rollout sampling parameters.
    eval_every: held-out evaluation interval in steps (also at the start and the end).
    eval_config: see EvalConfig.
    checkpoint_every: checkpoint interval in steps (and at the end).
    max_to_keep: checkpoints kept.
    time_limit_s: stop early (with a checkpoint) after this many seconds of training.
    learner_factory: builds the Learner (gin: `Learner.*` knobs).
    progress: show a progress bar.

  Returns:
    {'steps', 'wall_s', 'initial': {...}, 'final': {...}, 'history': [...]} with
    held-out figures `avg{k}`, `pass{k}`, `greedy`.
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f"train.estimator={estimator!r}; expected one of {sorted(ESTIMATORS)}")
  if steps < 0 or prompts_per_step < 1 or group_size < 2:
    raise ValueError("train: steps >= 0, prompts_per_step >= 1 and group_size >= 2 "
                     f"(got {steps}, {prompts_per_step}, {group_size})")
  reward_weights = dict(reward_weights or {"correct": 1.0})
  sampling = sampling or SamplingParams()
  eval_config = eval_config or EvalConfig()
  start = time.time()
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  vocab_limit = tokenizer.vocab_size if tokenizer.vocab_size < model.config.vocab_size else None
  learner = learner_factory(model, mesh, vocab_limit=vocab_limit)
  sampler = Sampler(model, pad_id=tokenizer.pad_id, mesh=mesh, vocab_limit=vocab_limit)
  params0 = nnx.state(model)
  rollout = Rollout(task, tokenizer, sampler,
                    None if mesh is None else state_shardings(params0, mesh, SAMPLER_RULES))
  heldout = task.heldout_problems(eval_config.num_problems)
  eval_key = jax.random.key(seed + 7919)
  writer = MetricWriter(workdir)
  ckpts = Checkpoints(os.path.join(workdir, "checkpoints"), max_to_keep=max_to_keep)

  state = learner.init_state(params0)
  step0 = 0
  history = []
  initial = None
  latest = ckpts.latest_step()
  if latest is not None:
    restored, meta = ckpts.restore(latest, target={"state": _abstract(state)})
    state = restored["state"]
    step0, initial, history = meta["step"], meta["initial"], meta["history"]
    writer.truncate_after(step0)
    print(f"[train] resumed from step {step0} ({ckpts.directory})", flush=True)
  if initial is None:
    initial = evaluate(rollout, state.params, heldout, eval_config, eval_key)
    writer.write(0, {f"eval/{k}": v for k, v in initial.items()})
    print(f"[train] initial held-out: {_fmt(initial)}", flush=True)

  hp = learner.hparams()
  base_key = jax.random.key(seed)
  bar = tqdm.tqdm(total=steps, initial=step0, desc="RL", disable=not progress,
                  dynamic_ncols=True)
  step = step0
  t_train = time.time()
  while step < steps:
    # 1. prompts (the data position is the step number).
    problems = task.train_problems(prompts_per_step, seed=data_seed(seed, step))
    # 2. sample G completions each and 3. score them.
    key = jax.random.fold_in(base_key, step)
    gen = rollout(state.params, problems, group_size, key, sampling)
    rewards = sum(w * gen.part(name) for name, w in reward_weights.items())
    # 4. advantages within each group of G.
    adv = np.asarray(ESTIMATORS[estimator](jnp.asarray(rewards), group_size))
    batch = TrainBatch(
        prompt_tokens=gen.prompt_tokens, prompt_lengths=gen.prompt_lengths,
        completion_tokens=gen.tokens, loss_mask=_loss_mask(gen.lengths, gen.tokens.shape[1]),
        advantages=adv.astype(np.float32), old_logprobs=gen.logprobs,
        completion_lengths=gen.lengths)
    # 5. learner update(s).
    for _ in range(updates_per_batch):
      state, lm = learner.step(state, batch, hp)
    step += 1
    groups = rewards.reshape(-1, group_size)
    metrics = {
        "reward": float(rewards.mean()), "correct": float(gen.part("correct").mean()),
        "format": float(gen.part("format").mean()),
        "dead_group_ratio": float((groups.std(axis=1) == 0).mean()),
        "length_mean": float(gen.lengths.mean()), "truncated": float(gen.truncated.mean()),
        **{f"learner/{k}": float(v) for k, v in jax.device_get(lm).items()}}
    writer.write(step, metrics)
    bar.update(1)
    bar.set_postfix(reward=f"{metrics['reward']:.2f}", dead=f"{metrics['dead_group_ratio']:.2f}")
    # 6. held-out evaluation and 7. checkpoint.
    out_of_time = time_limit_s is not None and time.time() - t_train > time_limit_s
    last = step == steps or out_of_time
    if step % eval_every == 0 or last:
      ev = evaluate(rollout, state.params, heldout, eval_config, eval_key)
      history.append({"step": step, **ev})
      writer.write(step, {f"eval/{k}": v for k, v in ev.items()})
      bar.write(f"[train] step {step}: held-out {_fmt(ev)}")
    if step % checkpoint_every == 0 or last:
      ckpts.save(step, {"state": state},
                 {"step": step, "seed": seed, "initial": initial, "history": history})
    if out_of_time:
      bar.write(f"[train] time limit {time_limit_s}s reached at step {step}")
      break
  bar.close()
  ckpts.wait()
  final = history[-1] if history and history[-1]["step"] == step else evaluate(
      rollout, state.params, heldout, eval_config, eval_key)
  final = {k: v for k, v in final.items() if k != "step"}
  return {"steps": step, "wall_s": round(time.time() - start, 2), "initial": initial,
          "final": final, "history": history, "state": state}


def _loss_mask(lengths: np.ndarray, n: int) -> np.ndarray:
  return np.arange(n)[None, :] < lengths[:, None]


def _abstract(tree):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _fmt(ev: dict) -> str:
  return ", ".join(f"{k}={v:.3f}" for k, v in ev.items())
