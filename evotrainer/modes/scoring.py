"""`test` mode: scores a model trained earlier on the test split, exactly as a run scores
its own at the end (`eval.heldout.score_test_split`: `EvalConfig.num_test` problems,
the evaluation's fixed keys), so a finished run can be re-scored on more test problems
than it was: the first `num_test` of the split are the same problems with the same keys,
the ones after them are new.

The model (`test.model`) is one of
- a model export (`<dir>/model_config`: an evolution version's `versions/<id>/model`);
- a training checkpoint directory (`<run>/checkpoints`): its newest intact step, the
  state the run ended on (with `train.keep_best` its best validated one);
- a run directory: its `model` export if it has one, else its `checkpoints`;
- None: the policy the configuration builds (the pretrained model, or the warm start).

Writes `<workdir>/test_eval.json` (`eval.test_scores.write_test_scores`) and returns the
summary's figures.
"""

from __future__ import annotations

import pathlib
import time
from typing import Optional

import gin

from evotrainer.config import ConfigError
from evotrainer.modes.common import say


@gin.configurable("test", module="run")
def model_under_test(model: Optional[str] = None) -> Optional[str]:
  """gin knob of `test` mode: the model to score (see the module docstring)."""
  return model


def score_model(workdir, model, tok, task, mesh) -> dict:
  """Loads `test.model` into `model`, scores it on the test split, writes test_eval.json."""
  from flax import nnx

  from evotrainer.eval.heldout import EvalConfig, per_problem, score_test_split
  from evotrainer.eval.test_scores import write_test_scores
  from evotrainer.rollouts.multiturn import rollout_for
  from evotrainer.sampling import Sampler
  from evotrainer.sharding.multihost import is_primary

  source = model_under_test()
  if source is not None:
    say(f"[test] model from {load_trained(source, model, mesh)}")
  if EvalConfig().num_test <= 0:
    raise ConfigError("run.mode='test' scores EvalConfig.num_test test problems; it is 0 "
                      "(set e.g. EvalConfig.num_test = 64)")
  vocab_limit = tok.vocab_size if tok.vocab_size < model.config.vocab_size else None
  rollout = rollout_for(task, tok, Sampler(model, pad_id=tok.pad_id, mesh=mesh,
                                           vocab_limit=vocab_limit))
  start = time.time()

  def progress(done: int, total: int) -> None:
    say(f"[test] sampled {done}/{total} problems ({time.time() - start:.0f}s)")

  figures, episodes = score_test_split(rollout, nnx.state(model), task, progress=progress)
  scores = per_problem(episodes)
  if is_primary():  # process 0 writes the files of a multi-process run
    write_test_scores(workdir, "test", figures, scores)
  say("[test] " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()) +
      f" on {len(scores)} test problems")
  out = {"test": {"final": figures, "per_problem": scores}, "model_source": source}
  if hasattr(task, "test_report"):  # what the episodes did, e.g. SWE's tool use
    out["test"]["report"] = task.test_report(episodes)
  return out


def load_trained(source: str, model, mesh) -> str:
  """Loads the parameters `source` names into `model` (see the module docstring);
  returns what was read."""
  from evotrainer import checkpoint
  path = pathlib.Path(source)
  if (path / "model").is_dir() and not (path / "model_config").exists():
    path = path / "model"
  elif (path / "checkpoints").is_dir():
    path = path / "checkpoints"
  if (path / "model_config").exists():
    checkpoint.restore_params_into(path, model)
    return str(path)
  if path.is_dir():
    return _load_train_state(path, model, mesh)
  raise ConfigError(f"test.model={source!r}: no such directory (expected a model export, "
                    f"a run directory or its checkpoints/)")


def _load_train_state(directory: pathlib.Path, model, mesh) -> str:
  """The parameters of a `train` run's newest intact checkpoint: the state the run ended
  on (with `train.keep_best`, its best validated one, which the last checkpoint holds)."""
  from flax import nnx

  from evotrainer.checkpoint import Checkpoints
  from evotrainer.learner.step import Learner

  ckpts = Checkpoints(str(directory), max_to_keep=None)
  if ckpts.latest_step() is None:
    raise ConfigError(f"test.model: {directory} holds no model export and no complete "
                      f"checkpoint")
  # A fresh train state of the run's learner is the layout to restore into (its arrays'
  # shapes and shardings: `Checkpoints.restore`).
  state = Learner(model, mesh).init_state(nnx.state(model))
  step, restored, _ = ckpts.restore_latest_intact(target={"state": state})
  nnx.update(model, restored["state"].params)
  return f"{directory}/{step}"
