"""One training segment, read top to bottom as one RL step:

  prompts -> sample G completions each -> score (task verifier) -> harness (rewards,
  filters, group advantages) -> learner update -> (every k steps) held-out evaluation ->
  checkpoint.

`train` is that loop; each step is a helper below, named for it. What a segment wires
together once is a `_Segment`; what the loop carries from step to step is a `_Progress`.
Evaluation lives in evotrainer/eval/, the logs in metric_writer.py.

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
from typing import Any, Callable, Optional, Sequence

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
from evotrainer.harness.pipeline import Harness, HarnessOutput
from evotrainer.learner.step import Learner, StepHParams, TrainState
from evotrainer.metric_writer import MetricWriter, NoWriter
from evotrainer.rollouts.generation import Generation, merge
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


@gin.configurable(module="train", denylist=[
    "workdir", "task", "model", "tokenizer", "mesh", "seed", "sampling"])
def train(workdir: str, task, model, tokenizer, mesh=None, *, seed: int = 0,
          steps: int = 100, prompts_per_step: int = 16, group_size: int = 8,
          harness: Optional[Harness] = None, diagnostics: Optional[Sequence] = None,
          version: str = "v0", updates_per_batch: int = 1,
          sampling: Optional[SamplingParams] = None, eval_every: int = 25,
          eval_config: Optional[EvalConfig] = None, checkpoint_every: int = 25,
          max_to_keep: int = 2, store_rollouts: bool = True,
          time_limit_s: Optional[float] = None, parent_checkpoints: Optional[str] = None,
          learner_factory: Callable[..., Learner] = Learner, progress: bool = True,
          recompute_old_logprobs: bool = True, progress_every: int = 10,
          keep_best: bool = False) -> dict:
  """Trains `model` with GRPO-family updates on `task`; resumes from `workdir` if possible.

  Args:
    workdir: run directory (checkpoints/, rollouts/, metrics.jsonl, findings.jsonl,
      tensorboard/): a local path or a `gs://` URL (evotrainer/paths.py: the logs are
      then written in a local mirror and uploaded whole).
    task: the domain (`train_problems`, `heldout_problems`, `format_prompt`, `score_many`);
      evaluation reads its validation split only. A task with `multi_turn = True`
      (`tasks.base.MultiTurnTask`) runs episodes through `rollouts.MultiTurnEngine`
      (gin: `MultiTurnEngine.budget = @TurnBudget()`).
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
    keep_best: end on the best validated train state of the segment, not the last: every
      periodic evaluation after step 0 that scores at least as high (Avg@k) as the best
      so far saves its state under best/ (Orbax, one kept, so a resume keeps it); at the
      end, if the last evaluation scored lower, that state (parameters and optimizer
      moments) replaces the last one, in the final checkpoint and the saved model, and
      `final` holds its figures. Selecting among several evaluations on the validation
      split flatters the figure selected on; test figures are unaffected. The controller
      sets it for continuations with `evolve.continue_keeps_best`.

  Returns:
    {'steps', 'wall_s', 'initial', 'final', 'final_step', 'history', 'state', 'rollout',
    'harness_share'}: validation figures `avg{k}`, `pass{k}`, `greedy` before and after
    (`final_step`: the step whose state and figures the segment ends on),
    the final train state, the rollout engine (its compiled sampler serves a test
    evaluation),
    and the share of step time spent in the harness and diagnostics.
  """
  _check_sizes(steps, prompts_per_step, group_size)
  start = time.time()
  seg = _wire(workdir, task, model, tokenizer, mesh, seed=seed,
              prompts_per_step=prompts_per_step, group_size=group_size,
              harness=harness if harness is not None else Harness(),
              diagnostics=list(diagnostics or []), version=version,
              updates_per_batch=updates_per_batch, sampling=sampling or SamplingParams(),
              eval_config=eval_config or EvalConfig(), max_to_keep=max_to_keep,
              store_rollouts=store_rollouts, learner_factory=learner_factory,
              recompute_old_logprobs=recompute_old_logprobs, keep_best=keep_best)
  run = _start(seg, model, parent_checkpoints)
  if run.initial is None:
    _initial_evaluation(seg, run)
  # The KL term's frozen reference: the policy this segment started from.
  ref_params = (jax.tree.map(jnp.copy, run.state.params) if seg.learner.kl_coef > 0
                else None)
  bar = progress_bar(total=steps, initial=run.step, desc="RL", disable=not progress,
                     every=progress_every, dynamic_ncols=True)
  t_train = time.time()
  while run.step < steps:
    t_step = time.time()
    # 1. prompts -> 2. G samples each -> 3. scores (more rounds with dynamic sampling).
    gen, episodes, rounds, t_harness = _sample(seg, run.state.params, run.step)
    # 4. harness: composed reward, filters, group advantages.
    t0 = time.time()
    out, batch = _harness_batch(seg, gen, episodes)
    t_harness += time.time() - t0
    # 5. behaviour and reference log-probs, then the learner update(s).
    run.state, lm = _learn(seg, run.state, batch, ref_params)
    run.step += 1
    # 6. diagnostics and the rollout store, on the background thread.
    t0 = time.time()
    metrics = _step_metrics(gen, out, rounds, lm)
    _bookkeeping_later(seg, run.step, episodes, out, lm)
    t_harness += time.time() - t0
    _log_step(seg, run, bar, metrics, out, t_step, t_harness)
    # 7. held-out evaluation and checkpoint.
    out_of_time = _out_of_time(time_limit_s, t_train)
    last = run.step == steps or out_of_time
    if run.step % eval_every == 0 or last:
      _periodic_evaluation(seg, run, bar)
      _remember_best(seg, run)
    if last:
      _end_on_best(seg, run, bar)
    if run.step % checkpoint_every == 0 or last:
      _checkpoint(seg, run)
    if out_of_time:
      bar.write(f"[train] time limit {time_limit_s}s reached at step {run.step}")
      break
  bar.close()
  return _finish(seg, run, start)


# The metrics every process of a multi-process run prints per step and checks for
# agreement: they depend on the gathered rollouts, the scores, the harness and the
# learner's global reductions, so a wrong gather or placement shows in them.
_AGREED = ("reward", "correct", "length_mean", "learner/loss", "learner/pg_loss",
           "learner/grad_norm", "learner/entropy", "learner/approx_kl")


@dataclasses.dataclass
class _Segment:
  """What one training segment wires together once: the task, the engines, the
  settings of its steps and the places its records go."""

  task: Any
  version: str
  seed: int
  prompts_per_step: int
  group_size: int
  sampling: SamplingParams
  updates_per_batch: int
  recompute_old_logprobs: bool
  learner: Learner
  hparams: StepHParams  # the learner's hyper-parameters, at the sampler's temperature
  rollout: Callable  # rollouts.SingleTurnEngine or MultiTurnEngine (same signature)
  harness: Harness
  diagnostics: list
  eval_config: EvalConfig
  heldout: list  # the validation problems of every evaluation
  primary: bool  # process 0: it alone writes the run's files
  writer: MetricWriter | NoWriter
  store: Optional[RolloutStore]
  ckpts: Checkpoints
  background: Background
  best: Optional[Checkpoints] = None  # with keep_best: the best validated state so far


@dataclasses.dataclass
class _Progress:
  """What the loop carries from step to step; a checkpoint stores all but the timers."""

  state: TrainState
  step: int = 0
  initial: Optional[dict] = None  # the validation figures at step 0
  history: list = dataclasses.field(default_factory=list)  # {'step', figures...} per eval
  harness_s: float = 0.0  # seconds of step time spent in the harness and diagnostics
  total_s: float = 0.0  # seconds of step time
  best: Optional[dict] = None  # with keep_best: {'step', 'score'} of the best evaluation
  final_step: Optional[int] = None  # the step the segment ends on, when not its last


def _check_sizes(steps: int, prompts_per_step: int, group_size: int) -> None:
  if steps < 0 or prompts_per_step < 1 or group_size < 2:
    raise ValueError("train: steps >= 0, prompts_per_step >= 1 and group_size >= 2 "
                     f"(got {steps}, {prompts_per_step}, {group_size})")


def _wire(workdir: str, task, model, tokenizer, mesh, *, seed: int, prompts_per_step: int,
          group_size: int, harness: Harness, diagnostics: list, version: str,
          updates_per_batch: int, sampling: SamplingParams, eval_config: EvalConfig,
          max_to_keep: int, store_rollouts: bool, learner_factory: Callable[..., Learner],
          recompute_old_logprobs: bool, keep_best: bool) -> _Segment:
  """Builds the learner, the sampler and rollout engine, and the run's writers."""
  paths.makedirs(workdir)
  vocab_limit = tokenizer.vocab_size if tokenizer.vocab_size < model.config.vocab_size else None
  learner = learner_factory(model, mesh, vocab_limit=vocab_limit)
  sampler = Sampler(model, pad_id=tokenizer.pad_id, mesh=mesh, vocab_limit=vocab_limit)
  # Multi-turn tasks (`task.multi_turn`) get the multi-turn engine, same signature.
  rollout = rollout_for(task, tokenizer, sampler, None if mesh is None else
                        state_shardings(nnx.state(model), mesh, SAMPLER_RULES))
  heldout = task.heldout_problems(eval_config.num_problems, split="validation")
  primary = is_primary()
  writer = MetricWriter(workdir) if primary else NoWriter()
  store = (RolloutStore(os.path.join(workdir, "rollouts"))
           if store_rollouts and primary else None)
  ckpts = Checkpoints(os.path.join(workdir, "checkpoints"), max_to_keep=max_to_keep)
  return _Segment(
      task=task, version=version, seed=seed, prompts_per_step=prompts_per_step,
      group_size=group_size, sampling=sampling, updates_per_batch=updates_per_batch,
      recompute_old_logprobs=recompute_old_logprobs, learner=learner,
      # The learner's log-probs are those of the distribution the sampler drew from.
      hparams=learner.hparams(temperature=sampling.logprob_temperature),
      rollout=rollout, harness=harness, diagnostics=diagnostics, eval_config=eval_config,
      heldout=heldout, primary=primary, writer=writer, store=store, ckpts=ckpts,
      background=Background(),
      best=Checkpoints(os.path.join(workdir, "best"), max_to_keep=1) if keep_best else None)


def _start(seg: _Segment, model, parent_checkpoints: Optional[str]) -> _Progress:
  """The fresh train state, or the one to resume: this run's latest intact checkpoint
  (its step, figures and harness state too), else a parent's (step reset to 0)."""
  state = seg.learner.init_state(nnx.state(model))
  if seg.ckpts.latest_step() is not None:  # a corrupted newest step falls back
    _, restored, meta = seg.ckpts.restore_latest_intact(target={"state": _abstract(state)})
    seg.harness.load_state(meta.get("harness_state", {}), strict=False)
    seg.writer.truncate_after(meta["step"])
    print(f"[train] resumed from step {meta['step']} ({seg.ckpts.directory})", flush=True)
    return _Progress(restored["state"], meta["step"], meta["initial"], meta["history"],
                     best=meta.get("best"), final_step=meta.get("final_step"))
  if parent_checkpoints:
    parent = Checkpoints(parent_checkpoints, max_to_keep=None)
    restored, _ = parent.restore(None, target={"state": _abstract(state)})
    state = restored["state"].replace(step=jnp.zeros((), jnp.int32))
    print(f"[train] starting from the parent's state in {parent_checkpoints}", flush=True)
  return _Progress(state)


def _evaluate(seg: _Segment, params, step: int) -> dict:
  """Validation figures of `params` at `step`; the episodes go to the rollout store."""
  ev, eps = evaluate(seg.rollout, params, seg.heldout, seg.eval_config,
                     seg.eval_config.key(), version=seg.version, step=step)
  if seg.store is not None and not seg.store.exists(seg.version, step, "heldout"):
    seg.store.write(seg.version, step, "heldout", eps, meta={"eval": ev})
  return ev


def _initial_evaluation(seg: _Segment, run: _Progress) -> None:
  run.initial = _evaluate(seg, run.state.params, 0)
  seg.writer.write(0, {f"eval/{k}": v for k, v in run.initial.items()})
  print(f"[train] initial held-out: {_fmt(run.initial)}", flush=True)


def _sample(seg: _Segment, params, step: int) -> tuple[Generation, list, int, float]:
  """Steps 1-3: the prompts of `step`, `group_size` completions each, scored. With
  dynamic sampling, further rounds until enough groups carry a signal. Returns the
  merged generation, its episodes, the rounds and the seconds spent in the harness."""
  episodes, gens, rounds, t_harness = [], [], 0, 0.0
  ds = seg.harness.dynamic_sampling
  want = seg.prompts_per_step if ds is None else ds.groups_to_generate(seg.prompts_per_step)
  # Every round samples one batch shape (the first round's rows; a smaller round is
  # padded, and the padding discarded), so dynamic sampling compiles one sampler program.
  round_rows = want * seg.group_size
  step_key = jax.random.fold_in(jax.random.key(seg.seed), step)
  while want > 0:
    seed = data_seed(seg.seed, step) + 7_777_777 * rounds
    problems = _draw(seg, want, seed)
    gen = seg.rollout(params, problems, seg.group_size, jax.random.fold_in(step_key, rounds),
                      seg.sampling, pad_rows_to=round_rows)
    t0 = time.time()
    episodes += gen.episodes(seg.task, version=seg.version, step=step + 1, split="train",
                             group=seg.group_size, first_row=len(episodes))
    gens.append(gen)
    rounds += 1
    if ds is not None:
      out = seg.harness.process(episodes, seg.group_size, target_groups=seg.prompts_per_step,
                                update_state=False)
      want = ds.groups_to_generate(seg.prompts_per_step, len(episodes) // seg.group_size,
                                   int(out.metrics["groups/passed"]), rounds)
    t_harness += time.time() - t0
    if ds is None:
      break
  return merge(gens), episodes, rounds, t_harness


def _draw(seg: _Segment, want: int, seed: int) -> list:
  """The `want` prompts of a round: the task's draw, or the harness curriculum's pick
  from a larger one."""
  cur = seg.harness.curriculum
  if cur is None:
    return seg.task.train_problems(want, seed=seed)
  return cur.choose(seg.task.train_problems(cur.candidates(want), seed=seed), want, seed)


def _harness_batch(seg: _Segment, gen: Generation,
                   episodes: list) -> tuple[HarnessOutput, TrainBatch]:
  """Step 4: the harness's rewards, filters and advantages, and the rows it keeps as the
  learner's batch."""
  ds = seg.harness.dynamic_sampling
  out = seg.harness.process(episodes, seg.group_size,
                            target_groups=seg.prompts_per_step if ds is not None else None)
  rows = out.batch
  return out, TrainBatch(
      prompt_tokens=gen.prompt_tokens[rows], prompt_lengths=gen.prompt_lengths[rows],
      completion_tokens=gen.tokens[rows],
      loss_mask=gen.completion_mask()[rows] & out.keep[rows, None],
      advantages=out.advantages[rows].astype(np.float32), old_logprobs=gen.logprobs[rows],
      completion_lengths=gen.lengths[rows])


def _learn(seg: _Segment, state: TrainState, batch: TrainBatch,
           ref_params) -> tuple[TrainState, dict]:
  """Step 5: behaviour (and reference) log-probs, then `updates_per_batch` updates.
  Returns the new state and the learner's metrics as host floats."""
  batch, gap = _behaviour_logprobs(seg.learner, state, batch, seg.hparams, ref_params,
                                   seg.recompute_old_logprobs)
  for _ in range(seg.updates_per_batch):
    state, lm = seg.learner.step(state, batch, seg.hparams)
  lm = {k: float(v) for k, v in to_host(lm).items()}
  if gap is not None:
    lm["sampler_logprob_gap"] = gap
  return state, lm


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


def _step_metrics(gen: Generation, out: HarnessOutput, rounds: int, lm: dict) -> dict:
  """The step's line of metrics.jsonl (its timings are added by `_log_step`)."""
  metrics = {"correct": float(gen.part("correct").mean()),
             "format": float(gen.part("format").mean()),
             "length_mean": float(gen.lengths.mean()),
             "truncated": float(gen.truncated.mean()), "rounds": rounds, **{f"harness/{k}": float(v) for k, v in out.metrics.items()},
             **{f"learner/{k}": v for k, v in lm.items()}}
  metrics["reward"] = float(out.rewards.mean())
  return metrics


def _bookkeeping_later(seg: _Segment, step: int, episodes: list, out: HarnessOutput,
                       lm: dict) -> None:
  """Step 6: queues the step's diagnostics and rollout store write (process 0 only)."""
  if seg.primary:
    seg.background.submit(functools.partial(
        _bookkeeping, seg.writer, seg.store, seg.diagnostics, seg.version, step, episodes,
        out, lm, {"group_size": seg.group_size, "target_groups": seg.prompts_per_step,
                  "harness": seg.harness.describe()}))


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


def _log_step(seg: _Segment, run: _Progress, bar, metrics: dict, out: HarnessOutput,
              t_step: float, t_harness: float) -> None:
  """Writes the step's metrics with its timings, checks that every process of a
  multi-process run agrees on them, and moves the progress bar."""
  run.harness_s += t_harness
  run.total_s += time.time() - t_step
  metrics["time/step_s"] = time.time() - t_step
  metrics["time/harness_share"] = t_harness / metrics["time/step_s"]
  seg.writer.write(run.step, metrics)
  if is_multiprocess():  # every process logs the step; all must agree, bit for bit
    agreed = {k: metrics[k] for k in _AGREED if k in metrics}
    print(f"[train] process {jax.process_index()} step {run.step}: "
          + json.dumps(agreed), flush=True)
    check_agree(agreed, f"step {run.step}")
  bar.update(1)
  bar.set_postfix(reward=f"{metrics['reward']:.2f}",
                  dead=f"{out.metrics.get('dead_group_ratio/raw', 0.0):.2f}")


def _out_of_time(time_limit_s: Optional[float], t_train: float) -> bool:
  """Whether training has run past `time_limit_s`; process 0's clock decides for all."""
  if time_limit_s is None:
    return False
  return broadcast_json(time.time() - t_train > time_limit_s)


def _periodic_evaluation(seg: _Segment, run: _Progress, bar) -> None:
  """Step 7: validation figures, appended to the history and logged."""
  ev = _evaluate(seg, run.state.params, run.step)
  run.history.append({"step": run.step, **ev})
  seg.writer.write(run.step, {f"eval/{k}": v for k, v in ev.items()})
  bar.write(f"[train] step {run.step}: held-out {_fmt(ev)}")


def _remember_best(seg: _Segment, run: _Progress) -> None:
  """With keep_best: saves the state just evaluated when it scores at least the best so
  far (ties go to the later, longer-trained state); step 0 (the start) never counts.

  After a resume the replayed steps may meet best/ ahead of them (saved before the crash,
  not yet in the resumed checkpoint): at that very step the saved state is this one (the
  replay is exact); a step before it is no better than it (it was a best when saved)."""
  if seg.best is None or run.step == 0:
    return
  score = run.history[-1][f"avg{seg.eval_config.k}"]
  if run.best is not None and score < run.best["score"]:
    return
  saved = seg.best.all_steps()
  if saved and max(saved) > run.step:
    return
  if run.step not in saved:
    seg.best.save(run.step, {"state": run.state})
  run.best = {"step": run.step, "score": score}


def _end_on_best(seg: _Segment, run: _Progress, bar) -> None:
  """With keep_best, at the last step: the best validated state replaces the last one
  when the last evaluation scored lower."""
  if seg.best is None or run.best is None or run.best["step"] == run.step:
    return
  restored, _ = seg.best.restore(run.best["step"], target={"state": _abstract(run.state)})
  run.state, run.final_step = restored["state"], run.best["step"]
  bar.write(f"[train] ending on the best validated state, step {run.best['step']} "
            f"(Avg@{seg.eval_config.k} {run.best['score']:.3f} > the last evaluation's "
            f"{run.history[-1][f'avg{seg.eval_config.k}']:.3f})")


def _checkpoint(seg: _Segment, run: _Progress) -> None:
  """Step 8: the train state, with what a resume needs to continue exactly."""
  seg.background.flush()  # the step's rollouts are on disk before its checkpoint
  seg.writer.sync()  # ... and its logs in a gs:// workdir
  seg.ckpts.save(run.step, {"state": run.state},
                 {"step": run.step, "seed": seg.seed, "initial": run.initial,
                  "history": run.history, "harness_state": seg.harness.state(),
                  "best": run.best, "final_step": run.final_step,
                  "harness": seg.harness.describe()})


def _finish(seg: _Segment, run: _Progress, start: float) -> dict:
  """Waits for the background work and checkpoints; `train`'s return value."""
  seg.background.flush()
  seg.writer.sync()
  seg.ckpts.wait()
  final_step = run.step if run.final_step is None else run.final_step
  final = next((h for h in run.history if h["step"] == final_step), None)
  final = final if final is not None else _evaluate(seg, run.state.params, run.step)
  final = {k: v for k, v in final.items() if k != "step"}
  return {"steps": run.step, "wall_s": round(time.time() - start, 2),
          "initial": run.initial, "final": final, "final_step": final_step,
          "history": run.history,
          "state": run.state, "rollout": seg.rollout,
          "harness_share": round(run.harness_s / run.total_s, 4) if run.total_s else None}


def _abstract(tree):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _fmt(ev: dict) -> str:
  return ", ".join(f"{k}={v:.3f}" for k, v in ev.items())
