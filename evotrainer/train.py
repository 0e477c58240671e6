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
import functools
import json
import logging
import os
import time
from typing import Callable, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from evotrainer import paths
from evotrainer.background import Background
from evotrainer.checkpoint import Checkpoints
from evotrainer.console import progress_bar
from evotrainer.eval.heldout import EvalConfig, evaluate
from evotrainer.harness.diagnostics import run_diagnostics
from evotrainer.harness.pipeline import Harness
from evotrainer.learner.step import Learner, TrainState
from evotrainer.metric_writer import MetricWriter, NoWriter
from evotrainer.rollouts.generation import merge
from evotrainer.rollouts.multiturn import rollout_for
from evotrainer.rollouts.store import RolloutStore
from evotrainer.sampling import Sampler, SamplingParams
from evotrainer.sharding.mesh import state_shardings
from evotrainer.sharding.multihost import (broadcast_json, check_agree, is_multiprocess,
                                           is_primary, to_host)
from evotrainer.sharding.rules import SAMPLER_RULES
from evotrainer.types import TrainBatch

log = logging.getLogger(__name__)


def data_seed(seed: int, step: int) -> int:
  """Seed of the prompts of `step` (the data position is the step number)."""
  return (seed * 1_000_003 + step) % (2**31 - 1)


@gin.configurable(module="train")
def train(workdir: str, task, model, tokenizer, mesh=None, *, seed: int = 0,
          steps: int = 100, prompts_per_step: int = 16, group_size: int = 8,
          harness: Optional[Harness] = None, diagnostics: Optional[Sequence] = None,
          version: str = "v0", updates_per_batch: int = 1,
          sampling: Optional[SamplingParams] = None, eval_every: int = 25,
          eval_config: Optional[EvalConfig] = None, checkpoint_every: int = 25,
          max_to_keep: int = 2, store_rollouts: bool = True,
          time_limit_s: Optional[float] = None, parent_checkpoints: Optional[str] = None,
          learner_factory: Callable[..., Learner] = Learner, progress: bool = True,
          recompute_old_logprobs: bool = True, progress_every: int = 10) -> dict:
  """Trains `model` with GRPO-family updates on `task`; resumes from `workdir` if possible.

  Args:
    workdir: run directory (checkpoints/, rollouts/, metrics.jsonl, findings.jsonl,
      tensorboard/): a local path or a `gs://` URL (evotrainer/paths.py: the logs are
      then written in a local mirror and uploaded whole).
    task: the domain (`train_problems`, `heldout_problems`, `format_prompt`, `score_many`);
      evaluation reads its validation split only. A task with `multi_turn = True`
      (`tasks.base.MultiTurnTask`) runs episodes through `rollouts.MultiTurnRollout`
      (gin: `MultiTurnRollout.budget = @TurnBudget()`).
    model, tokenizer: the policy (parameters are copied into the learner's state).
    mesh: device mesh, or None for the default device.
    seed: seed of the data order and of sampling.
    steps: RL steps (one batch of prompts each).
    prompts_per_step, group_size: groups in the training batch and completions per prompt.
    harness: reward composition, filters and advantages (gin: `train.harness =
      @Harness()`, see gin/harness/); default: reward = correctness, GRPO advantages.
    diagnostics: diagnostics run on every step's episodes (findings.jsonl, `diag/*`
      metrics); default none.
    version: the lineage version this segment trains (names episodes and rollout files).
    updates_per_batch: optimizer updates on each batch (PPO epochs).
    sampling: rollout sampling parameters.
    eval_every: held-out evaluation interval in steps (also at the start and the end).
    eval_config: see EvalConfig.
    checkpoint_every: checkpoint interval in steps (and at the end).
    max_to_keep: checkpoints kept.
    store_rollouts: write every training and evaluation episode to rollouts/ (Parquet).
    time_limit_s: stop early (with a checkpoint) after this many seconds of training.
    parent_checkpoints: a parent run's checkpoints/ directory: a fresh segment starts from
      its latest train state (parameters *and* optimizer moments; restarting Adam from
      zero moments jolts a trained policy), with the step counter reset.
    learner_factory: builds the Learner (gin: `Learner.*` knobs).
    progress: show progress: a bar on a terminal, else (a log file) one line every
      `progress_every` steps or minute (evotrainer/console.py).
    recompute_old_logprobs: the PPO ratio's denominator is recomputed by the learner's
      teacher-forced pass (the same program as the update's numerator) instead of the
      sampler's KV-cache decode, so a numeric mismatch between the two (bf16, fused
      kernels) never reads as policy change; the mismatch is logged as
      `learner/sampler_logprob_gap` (max |difference| over trained tokens). Costs one
      forward pass per batch. With `Learner.kl_coef > 0` reference log-probs under the
      segment's starting parameters are computed for every batch as well.

  Returns:
    {'steps', 'wall_s', 'initial', 'final', 'history', 'state', 'rollout',
    'harness_share'}: validation figures `avg{k}`, `pass{k}`, `greedy` before and after,
    the final train state, the `Rollout` (its compiled sampler serves a test evaluation),
    and the share of step time spent in the harness and diagnostics.
  """
  if steps < 0 or prompts_per_step < 1 or group_size < 2:
    raise ValueError("train: steps >= 0, prompts_per_step >= 1 and group_size >= 2 "
                     f"(got {steps}, {prompts_per_step}, {group_size})")
  harness = harness if harness is not None else Harness()
  diagnostics = list(diagnostics or [])
  sampling = sampling or SamplingParams()
  eval_config = eval_config or EvalConfig()
  start = time.time()
  paths.makedirs(workdir)
  vocab_limit = tokenizer.vocab_size if tokenizer.vocab_size < model.config.vocab_size else None
  learner = learner_factory(model, mesh, vocab_limit=vocab_limit)
  sampler = Sampler(model, pad_id=tokenizer.pad_id, mesh=mesh, vocab_limit=vocab_limit)
  params0 = nnx.state(model)
  # Multi-turn tasks (`task.multi_turn`) get the multi-turn engine, same signature.
  rollout = rollout_for(task, tokenizer, sampler,
                        None if mesh is None else state_shardings(params0, mesh, SAMPLER_RULES))
  heldout = task.heldout_problems(eval_config.num_problems, split="validation")
  eval_key = eval_config.key()
  # Process 0 writes the run's files; the others log their step lines only.
  primary = is_primary()
  writer = MetricWriter(workdir) if primary else NoWriter()
  store = (RolloutStore(os.path.join(workdir, "rollouts"))
           if store_rollouts and primary else None)
  ckpts = Checkpoints(os.path.join(workdir, "checkpoints"), max_to_keep=max_to_keep)
  background = Background()

  state = learner.init_state(params0)
  step0, history, initial = 0, [], None
  latest = ckpts.latest_step()
  if latest is not None:  # a corrupted newest step falls back to the previous intact one
    _, restored, meta = ckpts.restore_latest_intact(target={"state": _abstract(state)})
    state = restored["state"]
    step0, initial, history = meta["step"], meta["initial"], meta["history"]
    harness.load_state(meta.get("harness_state", {}), strict=False)
    if primary:
      writer.truncate_after(step0)
    print(f"[train] resumed from step {step0} ({ckpts.directory})", flush=True)
  elif parent_checkpoints:
    parent = Checkpoints(parent_checkpoints, max_to_keep=None)
    restored, _ = parent.restore(None, target={"state": _abstract(state)})
    state = restored["state"].replace(step=jnp.zeros((), jnp.int32))
    print(f"[train] starting from the parent's state in {parent_checkpoints}", flush=True)

  def run_eval(step: int) -> dict:
    ev, eps = evaluate(rollout, state.params, heldout, eval_config, eval_key, version=version,
                       step=step)
    if store is not None and not store.exists(version, step, "heldout"):
      store.write(version, step, "heldout", eps, meta={"eval": ev})
    return ev

  if initial is None:
    initial = run_eval(0)
    writer.write(0, {f"eval/{k}": v for k, v in initial.items()})
    print(f"[train] initial held-out: {_fmt(initial)}", flush=True)

  # The learner's log-probs are those of the distribution the sampler drew from.
  hp = learner.hparams(temperature=sampling.logprob_temperature)
  # The KL term's frozen reference: the policy this segment started from.
  ref_params = (jax.tree.map(jnp.copy, state.params) if learner.kl_coef > 0 else None)
  base_key = jax.random.key(seed)
  bar = progress_bar(total=steps, initial=step0, desc="RL", disable=not progress,
                     every=progress_every, dynamic_ncols=True)
  step = step0
  t_train = time.time()
  harness_s = total_s = 0.0
  while step < steps:
    t_step = time.time()
    # 1. prompts (the data position is the step number) -> 2. G samples each -> 3. scores.
    #    With dynamic sampling, further rounds until enough groups carry a signal.
    gens, episodes, out, rounds = [], [], None, 0
    ds = harness.dynamic_sampling
    want = prompts_per_step if ds is None else ds.groups_to_generate(prompts_per_step)
    # Every round samples one batch shape (the first round's rows; a smaller round is
    # padded, and the padding discarded), so dynamic sampling compiles one sampler program.
    round_rows = want * group_size
    t_harness = 0.0
    while want > 0:
      problems = task.train_problems(want, seed=data_seed(seed, step) + 7_777_777 * rounds)
      gen = rollout(state.params, problems, group_size,
                    jax.random.fold_in(jax.random.fold_in(base_key, step), rounds), sampling,
                    pad_rows_to=round_rows)
      t0 = time.time()
      episodes += gen.episodes(task, version=version, step=step + 1, split="train",
                               group=group_size, first_row=len(episodes))
      gens.append(gen)
      rounds += 1
      if ds is None:
        t_harness += time.time() - t0
        break
      out = harness.process(episodes, group_size, target_groups=prompts_per_step,
                            update_state=False)
      want = ds.groups_to_generate(prompts_per_step, len(episodes) // group_size,
                                   int(out.metrics["groups/passed"]), rounds)
      t_harness += time.time() - t0
    gen = merge(gens)
    # 4. harness: composed reward, filters, group advantages.
    t0 = time.time()
    out = harness.process(episodes, group_size,
                          target_groups=prompts_per_step if ds is not None else None)
    rows = out.batch
    batch = TrainBatch(
        prompt_tokens=gen.prompt_tokens[rows], prompt_lengths=gen.prompt_lengths[rows],
        completion_tokens=gen.tokens[rows],
        loss_mask=gen.completion_mask()[rows] & out.keep[rows, None],
        advantages=out.advantages[rows].astype(np.float32), old_logprobs=gen.logprobs[rows],
        completion_lengths=gen.lengths[rows])
    t_harness += time.time() - t0
    # 5. behaviour and reference log-probs, then the learner update(s).
    batch, gap = _behaviour_logprobs(learner, state, batch, hp, ref_params,
                                     recompute_old_logprobs)
    for _ in range(updates_per_batch):
      state, lm = learner.step(state, batch, hp)
    lm = {k: float(v) for k, v in to_host(lm).items()}
    if gap is not None:
      lm["sampler_logprob_gap"] = gap
    step += 1
    # 6. diagnostics and the rollout store, on the background thread.
    t0 = time.time()
    metrics = {"correct": float(gen.part("correct").mean()),
               "format": float(gen.part("format").mean()),
               "length_mean": float(gen.lengths.mean()), "truncated": float(gen.truncated.mean()),
               "rounds": rounds, **{f"harness/{k}": float(v) for k, v in out.metrics.items()},
               **{f"learner/{k}": v for k, v in lm.items()}}
    metrics["reward"] = float(out.rewards.mean())
    if primary:
      background.submit(functools.partial(
          _bookkeeping, writer, store, diagnostics, version, step, episodes, out,
          lm, {"group_size": group_size, "target_groups": prompts_per_step,
               "harness": harness.describe()}))
    t_harness += time.time() - t0
    harness_s += t_harness
    total_s += time.time() - t_step
    metrics["time/step_s"] = time.time() - t_step
    metrics["time/harness_share"] = t_harness / metrics["time/step_s"]
    writer.write(step, metrics)
    if is_multiprocess():  # every process logs the step; all must agree, bit for bit
      agreed = {k: metrics[k] for k in _AGREED if k in metrics}
      print(f"[train] process {jax.process_index()} step {step}: "
            + json.dumps(agreed), flush=True)
      check_agree(agreed, f"step {step}")
    bar.update(1)
    bar.set_postfix(reward=f"{metrics['reward']:.2f}",
                    dead=f"{out.metrics.get('dead_group_ratio/raw', 0.0):.2f}")
    # 7. held-out evaluation and checkpoint.
    out_of_time = time_limit_s is not None and time.time() - t_train > time_limit_s
    if time_limit_s is not None:  # the clock of process 0 decides for all processes
      out_of_time = broadcast_json(out_of_time)
    last = step == steps or out_of_time
    if step % eval_every == 0 or last:
      ev = run_eval(step)
      history.append({"step": step, **ev})
      writer.write(step, {f"eval/{k}": v for k, v in ev.items()})
      bar.write(f"[train] step {step}: held-out {_fmt(ev)}")
    if step % checkpoint_every == 0 or last:
      background.flush()  # the step's rollouts are on disk before its checkpoint
      writer.sync()  # ... and its logs in a gs:// workdir
      ckpts.save(step, {"state": state},
                 {"step": step, "seed": seed, "initial": initial, "history": history,
                  "harness_state": harness.state(), "harness": harness.describe()})
    if out_of_time:
      bar.write(f"[train] time limit {time_limit_s}s reached at step {step}")
      break
  bar.close()
  background.flush()
  writer.sync()
  ckpts.wait()
  final = history[-1] if history and history[-1]["step"] == step else run_eval(step)
  final = {k: v for k, v in final.items() if k != "step"}
  return {"steps": step, "wall_s": round(time.time() - start, 2), "initial": initial,
          "final": final, "history": history, "state": state, "rollout": rollout,
          "harness_share": round(harness_s / total_s, 4) if total_s else None}


# The metrics every process of a multi-process run prints per step and checks for
# agreement: they depend on the gathered rollouts, the scores, the harness and the
# learner's global reductions, so a wrong gather or placement shows in them.
_AGREED = ("reward", "correct", "length_mean", "learner/loss", "learner/pg_loss",
           "learner/grad_norm", "learner/entropy", "learner/approx_kl")


def _behaviour_logprobs(learner: Learner, state: TrainState, batch: TrainBatch, hp,
                        ref_params, recompute: bool) -> tuple[TrainBatch, Optional[float]]:
  """The batch with learner-computed old (and reference) log-probs at the sampling
  temperature, and the largest |sampler - learner| log-prob gap over trained tokens."""
  gap = None
  if recompute:
    old = learner.reference_logprobs(state.params, batch, hp.temperature)  # [B, N]
    mask = np.asarray(batch.loss_mask, bool)
    diff = np.abs(to_host(old) - np.asarray(batch.old_logprobs))
    gap = float(diff[mask].max()) if mask.any() else 0.0
    batch = dataclasses.replace(batch, old_logprobs=old)
  if ref_params is not None:
    batch = dataclasses.replace(
        batch, ref_logprobs=learner.reference_logprobs(ref_params, batch, hp.temperature))
  return batch, gap


def _bookkeeping(writer: MetricWriter, store: Optional[RolloutStore],
                 diagnostics: Sequence, version: str, step: int, episodes: list, out,
                 learner_metrics: dict, meta: dict) -> None:
  """Diagnostics (metrics + findings) and the rollout store for one finished step."""
  if diagnostics:
    dm, findings = run_diagnostics(diagnostics, episodes,
                                   {"advantages": out.advantages, "learner": learner_metrics})
    writer.write(step, {f"diag/{k}": float(v) for k, v in dm.items()})
    writer.write_findings(step, findings)
  if store is not None and not store.exists(version, step, "train"):
    store.write(version, step, "train", episodes, advantages=out.advantages, kept=out.keep,
                harness_state=out.state, meta=meta)


def _abstract(tree):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _fmt(ev: dict) -> str:
  return ", ".join(f"{k}={v:.3f}" for k, v in ev.items())
