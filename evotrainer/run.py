"""Run modes, selected by `run.mode` in gin (the entry point is evotrainer/launch.py).

Modes:
  sample   build the policy (tiny model from scratch or a local HF checkpoint), sample
           completions for held-out problems, score them, and report.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import gin

MODES = ("sample",)


def _print(msg: str = "") -> None:
  print(msg, flush=True)


@gin.configurable(module="run")
def run(workdir: str, *, mode: str = "sample", seed: int = 0, task=gin.REQUIRED,
        num_problems: int = 16, samples_per_problem: int = 4, tokenizer_texts: int = 2000,
        sampling=None) -> dict:
  """Runs one mode and returns its summary (also written to `<workdir>/summary.json`).

  Args:
    workdir: run directory.
    mode: one of MODES.
    seed: seed of everything random in the run.
    task: the domain (e.g. `@MathTask()`).
    num_problems: held-out problems shown in `sample` mode.
    samples_per_problem: completions per problem (temperature sampling).
    tokenizer_texts: training problems whose text trains a from-scratch tokenizer.
    sampling: a `SamplingParams` (gin: `run.sampling = @SamplingParams()`).
  """
  if mode not in MODES:
    raise ValueError(f"run.mode={mode!r}; expected one of {MODES}")
  import jax  # after flags: XLA_FLAGS set by the user apply
  import numpy as np
  from flax import nnx

  from evotrainer import config as config_lib
  from evotrainer.model.source import policy
  from evotrainer.sampling import Sampler, SamplingParams, left_pad
  from evotrainer.sharding.mesh import make_mesh
  from evotrainer.sharding.rules import SAMPLER_RULES
  from evotrainer.tokenizers import SentencePieceTokenizer

  start = time.time()
  sampling = sampling or SamplingParams()
  mesh = make_mesh()
  jax.set_mesh(mesh)
  _print(f"[evotrainer] mode={mode} workdir={workdir} devices={jax.device_count()} "
         f"mesh={dict(mesh.shape)}")
  train = task.train_problems(tokenizer_texts, seed)
  texts = [task.format_prompt(p) + " " + p.solution for p in train]
  model, tok = policy(texts, mesh, SAMPLER_RULES)
  c = model.config
  _print(f"[evotrainer] policy: {c.architecture} {c.num_layers} layers, d={c.hidden_size}, "
         f"{c.num_params() / 1e6:.2f}M parameters, vocab {tok.vocab_size}")
  heldout = task.heldout_problems(num_problems)
  prompts = [tok.encode(task.format_prompt(p), add_bos=True) for p in heldout]
  rows = [ids for ids in prompts for _ in range(samples_per_problem)]
  batch = left_pad(rows, tok.pad_id)
  sampler = Sampler(model, pad_id=tok.pad_id, mesh=mesh, vocab_limit=tok.vocab_size)
  t0 = time.time()
  out = sampler(nnx.state(model), batch, jax.random.key(seed), stop_ids=tok.stop_ids,
                sampling=sampling)
  tokens = np.asarray(out.tokens)
  sample_s = time.time() - t0
  lengths = np.asarray(out.lengths)
  texts_out = [tok.decode(tokens[i, :lengths[i]].tolist()) for i in range(len(rows))]
  problems = [p for p in heldout for _ in range(samples_per_problem)]
  scores = task.score_many(problems, texts_out)
  correct = np.array([s["correct"] for s in scores], np.float32)
  fmt = np.array([s["format"] for s in scores], np.float32)
  _print(f"[evotrainer] sampled {len(rows)} completions ({int(lengths.sum())} tokens) in "
         f"{sample_s:.1f}s incl. compile")
  for i in range(min(4, len(rows))):
    _print(f"  prompt: {task.format_prompt(problems[i])!r}\n  completion: {texts_out[i]!r}  "
           f"gold={problems[i].answer} correct={bool(correct[i])}")
  summary = {
      "mode": mode, "wall_s": round(time.time() - start, 2),
      "model": {"architecture": c.architecture, "params": c.num_params(),
                "source": "scratch" if isinstance(tok, SentencePieceTokenizer) else "hf"},
      "heldout": {"problems": len(heldout), "samples_per_problem": samples_per_problem,
                  "avg_correct": float(correct.mean()), "format_rate": float(fmt.mean()),
                  "mean_length": float(lengths.mean())},
  }
  _print(f"[evotrainer] held-out accuracy {correct.mean():.3f}, format rate {fmt.mean():.3f}. "
         "This build has the model, sampler and verifier only: the policy was not trained, "
         "so a from-scratch model answers at chance. RL training ('train' mode) and the "
         "evolution loop come next.")
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  config_lib.write_operative_config(workdir)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  _print(f"[evotrainer] wrote {workdir}/summary.json and operative_config.gin")
  task.close()
  return summary
