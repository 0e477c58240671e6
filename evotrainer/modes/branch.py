"""`branch` mode: one branch of the evolution, trained from its parent's model; writes
<workdir>/branch_result.json, what the controller reads back."""

from __future__ import annotations

import json
import math
import pathlib

import gin

from evotrainer.evolution.branch_result import BranchResult
from evotrainer.modes.common import write_json


@gin.configurable(module="run")
def branch(parent: str | None = None, version: str = "v0") -> dict:
  """gin knobs of `branch` mode: the parent model directory and this version's name."""
  return {"parent": parent, "version": version}



def train_branch(workdir, model, tok, task, mesh, seed, sampling) -> dict:
  """Trains one branch from its parent; returns (and writes) branch_result.json."""
  from flax import nnx

  from evotrainer import checkpoint
  from evotrainer.eval.heldout import canary_evaluation, evaluate_test_split
  from evotrainer.eval.test_scores import write_test_scores
  from evotrainer.rollouts.store import RolloutStore
  from evotrainer.sharding.multihost import is_primary
  from evotrainer.train import train

  cfg = branch()
  result_path = pathlib.Path(workdir) / "branch_result.json"
  if result_path.exists():  # finished before a crash of the caller: idempotent
    return BranchResult.read(workdir).to_json()
  parent_checkpoints = None
  if cfg["parent"]:
    checkpoint.restore_params_into(cfg["parent"], model)
    candidate = pathlib.Path(cfg["parent"]).parent / "checkpoints"
    parent_checkpoints = str(candidate) if candidate.is_dir() else None
  out = train(workdir, task, model, tok, mesh, seed=seed, sampling=sampling,
              version=cfg["version"], parent_checkpoints=parent_checkpoints)
  model_dir = pathlib.Path(workdir) / "model"
  if not model_dir.exists():
    nnx.update(model, out["state"].params)
    checkpoint.save_model(model_dir, model, metadata={"version": cfg["version"]})
  result = branch_result(workdir, cfg["version"], out, str(model_dir),
                          RolloutStore(pathlib.Path(workdir) / "rollouts"))
  result.final.update(exploit_recovery(task, tok))
  canary_figures, canary = canary_evaluation(out["rollout"], out["state"].params, task)
  result.final.update(canary_figures)
  result.canary.update(canary)
  figures, per_problem = evaluate_test_split(out["rollout"], out["state"].params, task)
  if not is_primary():  # process 0 writes the files of a multi-process branch
    return result.to_json()
  if figures:  # beside the result, never in it: the controller reads branch_result.json
    write_test_scores(workdir, cfg["version"], figures, per_problem)
  write_json(result_path, result.to_json())
  return result.to_json()



def exploit_recovery(task, tok, num_problems: int = 64) -> dict:
  """What this branch's reward pays each exploit family (harness/probes.py; a task with
  `exploit_completions` brings its own, code's lying program): `exploit_recovery/<family>`,
  and `exploit_recovery`, the worst (NaN when the reward does not separate right from
  wrong), judged by the `exploit_probe` validator. Probed on the first `num_problems`
  validation problems, or the whole split when it is smaller."""
  from evotrainer.harness.pipeline import Harness
  from evotrainer.harness.probes import exploit_recoveries
  each = exploit_recoveries(task.heldout_problems()[:num_problems], task.score_many,
                            Harness().composer, tok.encode,
                            completions=getattr(task, "exploit_completions", None))
  finite = [v for v in each.values() if not math.isnan(v)]
  return {"exploit_recovery": max(finite) if finite else math.nan,
          **{f"exploit_recovery/{k}": v for k, v in each.items()}}


# A branch's training series: {name: metrics.jsonl keys summed}, one value per step.
SERIES = {"correct": ("correct",), "reward": ("reward",),
           "entropy": ("learner/entropy",), "length": ("length_mean",),
           "truncated": ("truncated",),
           "clip_frac": ("learner/clip_frac_low", "learner/clip_frac_high")}


def branch_result(workdir, version, out, model_dir, store) -> BranchResult:
  """What the controller reads back: held-out figures with the per-problem scores a
  paired bootstrap needs (of the evaluation the segment ended on, `out['final_step']`:
  its last, or with `train.keep_best` its best), the training series (`SERIES`: BC,
  proxy reward, entropy, length, truncation, clip fraction per step; None where a step
  lacks one), paths."""
  from evotrainer.eval.heldout import per_problem
  steps = store.steps(version, "heldout")
  step = out.get("final_step", steps[-1] if steps else None)
  final = store.read(version=version, step=step, split="heldout") if step in steps else []
  series: dict = {k: [] for k in SERIES}
  metrics_path = pathlib.Path(workdir) / "metrics.jsonl"
  if metrics_path.exists():
    for line in metrics_path.read_text().splitlines():
      row = json.loads(line)
      if "reward" in row:  # a training step's row
        for name, keys in SERIES.items():
          vals = [row.get(k) for k in keys]
          series[name].append(None if None in vals else float(sum(vals)))
  return BranchResult(version=version, steps=out["steps"], initial=out["initial"],
                      final=out["final"], checkpoint=model_dir,
                      rollouts=str(pathlib.Path(workdir) / "rollouts"),
                      per_problem=per_problem(final), series=series)
