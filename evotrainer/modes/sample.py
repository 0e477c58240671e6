"""`sample` mode: sample completions for held-out problems and score them."""

from __future__ import annotations

import time

from evotrainer.modes.common import say


def sample(model, tok, task, mesh, seed, num_problems, samples_per_problem, sampling) -> dict:
  """Samples and scores completions for held-out problems; prints a few."""
  import jax
  from flax import nnx

  from evotrainer.rollouts import rollout_for
  from evotrainer.sampling import Sampler

  vocab_limit = tok.vocab_size if tok.vocab_size < model.config.vocab_size else None
  rollout = rollout_for(task, tok, Sampler(model, pad_id=tok.pad_id, mesh=mesh,
                                           vocab_limit=vocab_limit))
  heldout = task.heldout_problems(num_problems)
  t0 = time.time()
  gen = rollout(nnx.state(model), heldout, samples_per_problem, jax.random.key(seed), sampling)
  correct, fmt = gen.part("correct"), gen.part("format")
  say(f"[evotrainer] sampled {len(gen.texts)} completions ({int(gen.lengths.sum())} "
      f"tokens) in {time.time() - t0:.1f}s incl. compile")
  for i in range(0, min(len(gen.texts), 4 * samples_per_problem), samples_per_problem):
    say(f"  prompt {task.format_prompt(gen.problems[i])!r} -> {gen.texts[i]!r} "
        f"(gold {gen.problems[i].answer}, {'correct' if correct[i] else 'wrong'})")
  say(f"[evotrainer] held-out accuracy {correct.mean():.3f}, format rate {fmt.mean():.3f}")
  return {"problems": len(heldout), "samples_per_problem": samples_per_problem,
          "avg_correct": float(correct.mean()), "format_rate": float(fmt.mean()),
          "mean_length": float(gen.lengths.mean())}
