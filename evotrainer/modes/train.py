"""`train` mode: GRPO with the fixed default harness (evotrainer/train.py), with held-out
figures before and after RL."""

from __future__ import annotations

from evotrainer.modes.common import say


def train_and_test(workdir, task, model, tok, mesh, seed, sampling) -> dict:
  """Trains the policy; returns the summary's figures (validation and test, before and
  after RL)."""
  from flax import nnx

  from evotrainer.eval.heldout import per_problem, score_test_split
  from evotrainer.train import train
  result = train(workdir, task, model, tok, mesh, seed=seed, sampling=sampling)
  summary = {k: result[k] for k in ("steps", "initial", "final", "history")}
  i, f = result["initial"], result["final"]
  say("[evotrainer] validation before -> after RL: " + ", ".join(
      f"{k} {i[k]:.3f} -> {f[k]:.3f}" for k in i))
  # The test split, reported only: the warm start (the model's own parameters are
  # untouched by training) and the trained policy, with the same keys.
  ti, ti_eps = score_test_split(result["rollout"], nnx.state(model), task)
  tf, tf_eps = score_test_split(result["rollout"], result["state"].params, task)
  if tf:
    summary["test"] = {"initial": ti, "final": tf, "per_problem": per_problem(tf_eps),
                       "per_problem_initial": per_problem(ti_eps)}
    if hasattr(task, "test_report"):  # what the episodes did, e.g. SWE's tool use
      summary["test"]["report"] = {"initial": task.test_report(ti_eps),
                                   "final": task.test_report(tf_eps)}
    say("[evotrainer] test before -> after RL: " + ", ".join(
        f"{k} {ti[k]:.3f} -> {tf[k]:.3f}" for k in ti))
  return summary
