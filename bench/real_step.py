r"""One GRPO step on the real SmolLM2-135M-Instruct policy, with its time broken down.

  python bench/real_step.py --json bench/results/real_step.json        # every variant
  python bench/real_step.py --variants bf16-top4 --json out.json       # some of them
  python bench/real_step.py --quick                                    # smoke run

The step is the training loop's (evotrainer/train.py) on 4 prompts x 8 samples x up to
128 new tokens at temperature 1, stopping at the model's end-of-turn token:

  prefill     the sampler on the prompts with max_new_tokens=1 (prefill + one token);
  decode      the sampler's whole call minus `prefill`;
  scoring     decoding the completions to text and `CodeTask.score_many` (the programs
              run in the project's sandbox); reward = the `correct` part;
  behaviour   `Learner.reference_logprobs` on the batch (the old log-probs the loop
              recomputes by default, `train.recompute_old_logprobs`); 0 in variants
              that keep the sampler's log-probs (`behaviour=False`);
  learner     `Learner.step` (advantages by `grpo_advantages`), split into
  optimizer   the optax update + apply on the trainable parameters alone (timed as its
              own jitted program on the same shapes), and
  fwd_bwd     learner - optimizer.

The prompts are CodeTask's procedural function problems, 2 of level 1 and 2 of level 2,
as a user turn of the model's ChatML template (`CodeTask.use_tokenizer`), left-padded to
`PROMPT_BUCKET` tokens. Every variant
runs one untimed step first (compiles, caches), then `--steps` timed steps, each on new
problems; the figures are medians over the timed steps. Variants differ in compute
dtype (`policy.dtype`; parameters stay float32), trained blocks
(`Learner.trainable_layers`, embeddings frozen), `Learner.micro_batch_size` and the
sampler's shared prefill per prompt group (`Sampler.share_prefill`).

The machine is shared: `load` records `os.getloadavg()` before and after every variant,
so compare variants of one run, and rerun on a quiet machine for absolute figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import sys
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from bench.common import machine, merge_json, write_json  # noqa: E402
from evotrainer.learner.advantages import grpo_advantages  # noqa: E402
from evotrainer.learner.step import Learner  # noqa: E402
from evotrainer.model.source import policy  # noqa: E402
from evotrainer.sampling import Sampler, SamplingParams, left_pad  # noqa: E402
from evotrainer.tasks.code.task import CodeTask  # noqa: E402
from evotrainer.types import TrainBatch  # noqa: E402

MODEL = "smollm2-135m-instruct"
# Every prompt is left-padded to this width, so a new draw of problems compiles nothing
# (the level-1/2 prompts in the chat template are 62-68 tokens).
PROMPT_BUCKET = 128
LEARNING_RATE = 1e-6


@dataclasses.dataclass(frozen=True)
class Variant:
  dtype: str = "float32"  # compute dtype (policy.dtype); parameters are float32
  trainable_layers: Optional[int] = None  # Learner.trainable_layers (None: all)
  micro_batch_size: Optional[int] = None  # Learner.micro_batch_size (None: whole batch)
  share_prefill: bool = True  # Sampler.share_prefill
  behaviour: bool = True  # train.recompute_old_logprobs (False: the sampler's log-probs)


VARIANTS = {
    "f32-full-rowprefill": Variant(share_prefill=False),
    "f32-full": Variant(),
    "f32-top4": Variant(trainable_layers=4),
    "f32-top4-sampler-logprobs": Variant(trainable_layers=4, behaviour=False),
    "bf16-full": Variant(dtype="bfloat16"),
    "bf16-top4": Variant(dtype="bfloat16", trainable_layers=4),
    "bf16-top4-mb8": Variant(dtype="bfloat16", trainable_layers=4, micro_batch_size=8),
    "bf16-top8": Variant(dtype="bfloat16", trainable_layers=8),
}


class Step:
  """The model, sampler, learner and task of one variant, and its timed GRPO step."""

  def __init__(self, variant: Variant, prompts: int, group: int, new_tokens: int):
    self.variant, self.prompts, self.group = variant, prompts, group
    self.model, self.tok = policy(gguf=MODEL, dtype=variant.dtype)
    self.sampler = Sampler(self.model, pad_id=self.tok.pad_id,
                           share_prefill=variant.share_prefill)
    self.learner = Learner(self.model, learning_rate=LEARNING_RATE,
                           trainable_layers=variant.trainable_layers,
                           micro_batch_size=variant.micro_batch_size)
    from flax import nnx  # pylint: disable=import-outside-toplevel
    self.state = self.learner.init_state(nnx.state(self.model))
    self.sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    self.hp = self.learner.hparams(temperature=self.sampling.logprob_temperature)
    self.tasks = [CodeTask(sources=["procedural"], difficulty=d, kinds=["function"])
                  for d in (1, 2)]
    for t in self.tasks:
      t.use_tokenizer(self.tok)
    tx = self.learner.tx
    self._optimizer = jax.jit(lambda p, s, g: optax.apply_updates(p, tx.update(g, s, p)[0]))

  def close(self) -> None:
    for t in self.tasks:
      t.close()

  def problems(self, seed: int) -> list:
    """`prompts` problems: the first half of level 1, the rest of level 2."""
    half = self.prompts // 2
    return (self.tasks[0].train_problems(half, seed)
            + self.tasks[1].train_problems(self.prompts - half, seed))

  def behaviour(self, params, train: TrainBatch) -> tuple[TrainBatch, Optional[float], float]:
    """The batch with the learner's old log-probs, their largest gap to the sampler's and
    the seconds spent; unchanged (gap None, 0 s) when the variant keeps the sampler's."""
    if not self.variant.behaviour:
      return train, None, 0.0
    start = time.perf_counter()
    old = jax.block_until_ready(self.learner.reference_logprobs(params, train, 1.0))
    seconds = time.perf_counter() - start
    gap = float(np.abs(np.asarray(old) - train.old_logprobs)[train.loss_mask].max())
    return train.replace(old_logprobs=np.asarray(old)), gap, seconds

  def run(self, seed: int) -> dict:
    """One GRPO step; {phase: seconds} plus what the batch looked like."""
    t = {}
    problems = self.problems(seed)
    task_of = [self.tasks[0]] * (self.prompts // 2) + [self.tasks[1]] * (
        self.prompts - self.prompts // 2)
    rows = [self.tok.encode(task_of[i].format_prompt(p))
            for i, p in enumerate(problems) for _ in range(self.group)]
    batch = left_pad(rows, self.tok.pad_id, buckets=(PROMPT_BUCKET,))
    key = jax.random.key(seed)
    params = self.state.params
    stops = self.tok.stop_ids

    start = time.perf_counter()
    one = dataclasses.replace(self.sampling, max_new_tokens=1)
    jax.block_until_ready(self.sampler(params, batch, key, stop_ids=stops, sampling=one))
    t["prefill"] = time.perf_counter() - start

    start = time.perf_counter()
    out = jax.block_until_ready(self.sampler(params, batch, key, stop_ids=stops,
                                             sampling=self.sampling))
    t["decode"] = time.perf_counter() - start - t["prefill"]

    start = time.perf_counter()
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    stopped = ~np.asarray(out.truncated)
    texts = [self.tok.decode(tokens[i, :lengths[i] - int(stopped[i])].tolist())
             for i in range(len(rows))]
    rewards = np.zeros(len(rows), np.float32)
    for task in self.tasks:
      idx = [i for i in range(len(rows)) if task_of[i // self.group] is task]
      parts = task.score_many([problems[i // self.group] for i in idx],
                              [texts[i] for i in idx])
      rewards[idx] = [p["correct"] for p in parts]
    t["scoring"] = time.perf_counter() - start

    n = tokens.shape[1]
    train = TrainBatch(
        prompt_tokens=np.asarray(batch.tokens), prompt_lengths=np.asarray(batch.lengths),
        completion_tokens=tokens, loss_mask=np.arange(n)[None, :] < lengths[:, None],
        advantages=np.asarray(grpo_advantages(rewards, self.group)),
        old_logprobs=np.asarray(out.logprobs), ref_logprobs=None, completion_lengths=lengths)

    train, gap, t["behaviour"] = self.behaviour(params, train)

    start = time.perf_counter()
    self.state, metrics = self.learner.step(self.state, train, self.hp)
    jax.block_until_ready(self.state)
    t["learner"] = time.perf_counter() - start

    trainable = self.learner.trainable.split(self.state.params)[0]
    grads = jax.tree.map(np.zeros_like, trainable)
    jax.block_until_ready(self._optimizer(trainable, self.state.opt_state, grads))  # warm
    start = time.perf_counter()
    jax.block_until_ready(self._optimizer(trainable, self.state.opt_state, grads))
    t["optimizer"] = time.perf_counter() - start
    t["fwd_bwd"] = t["learner"] - t["optimizer"]
    t["step"] = sum(t[k] for k in ("prefill", "decode", "scoring", "behaviour", "learner"))
    return dict(
        seconds=t, completion_tokens=int(lengths.sum()), mean_length=float(lengths.mean()),
        truncated=float(1 - stopped.mean()), reward_mean=float(rewards.mean()),
        sampler_learner_gap=gap, ratio_max=float(metrics["ratio_max"]),
        prompt_bucket=int(batch.tokens.shape[1]),
        trainable_params=int(sum(x.size for x in jax.tree.leaves(trainable))))


def measure(name: str, variant: Variant, prompts: int, group: int, new_tokens: int,
            steps: int) -> dict:
  load_before = os.getloadavg()
  start = time.perf_counter()
  step = Step(variant, prompts, group, new_tokens)
  try:
    step.run(seed=1000)  # compiles every program
    first_s = time.perf_counter() - start
    print(f"[{name}] set-up and first (compiling) step: {first_s:.0f} s", flush=True)
    runs = [step.run(seed=s) for s in range(steps)]
  finally:
    step.close()
  seconds = {k: float(np.median([r["seconds"][k] for r in runs])) for k in runs[0]["seconds"]}
  out = dict(variant=dataclasses.asdict(variant), seconds=seconds,
             setup_and_first_step_s=first_s, load_before=load_before,
             load_after=os.getloadavg(), steps=runs)
  print(f"[{name}] step {seconds['step']:.1f} s: " + ", ".join(
      f"{k} {v:.1f}" for k, v in seconds.items() if k != "step"), flush=True)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--variants", default=",".join(VARIANTS),
                  help=f"comma-separated, of {list(VARIANTS)}")
  ap.add_argument("--steps", type=int, default=1, help="timed steps per variant")
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--quick", action="store_true",
                  help="smoke run: 2 prompts x 2 samples x 8 tokens, the first variant")
  ap.add_argument("--json", default=None)
  ap.add_argument("--into", default=None,
                  help="also set `step_seconds` {variant: median step seconds} and "
                  "`step_breakdown` {variant: seconds per part} in this JSON file, keeping "
                  "its other keys (bench/results/real_model.json)")
  args = ap.parse_args()
  names = args.variants.split(",")
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    ap.error(f"unknown variants {unknown}; expected some of {list(VARIANTS)}")
  if args.quick:
    names, args.prompts, args.group, args.new_tokens = names[:1], 2, 2, 8
  results = {n: measure(n, VARIANTS[n], args.prompts, args.group, args.new_tokens,
                        args.steps) for n in names}
  write_json(args.json, dict(
      benchmark="real_step", model=MODEL, prompts=args.prompts, group=args.group,
      max_new_tokens=args.new_tokens, quick=args.quick, variants=results,
      peak_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      machine=machine()))
  if args.into:
    merge_json(args.into, {
        "step_seconds": {n: r["seconds"]["step"] for n, r in results.items()},
        "step_breakdown": {n: r["seconds"] for n, r in results.items()},
        "step_shape": {"prompts": args.prompts, "group": args.group,
                       "max_new_tokens": args.new_tokens, "quick": args.quick}})


if __name__ == "__main__":
  main()
