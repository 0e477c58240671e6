r"""Learner throughput: tokens/s and MFU of one `Learner.step` on a ~20M-parameter model.

  python bench/learner.py --json out.json

Model: Llama-style decoder, vocab 8192, hidden 512, intermediate 1408, 4 layers, 8 heads,
4 kv heads, head_dim 64, untied LM head: 20.19M parameters (`ModelConfig.num_params`;
the 6-layer variant of these widths is 26.1M, so the layer count was cut to reach ~20M).
f32 parameters and compute.

Batch: prompt P = 64 + completion N = 192 = 256 positions per row, every slot valid
(full-length prompts, no early stop), random tokens, random per-row advantages. One
measurement is one `Learner.step`: teacher-forced forward with the LM head on the N
completion positions only (as the learner always does), GRPO clipped loss with
token-mean aggregation, entropy computed (the Learner default), no KL term,
clip-by-global-norm + adamw. Every setting (batch size x micro-batch size) has its own
Learner and compiled step; `compile_s` is its first call minus its steady state. The
steady state is the median of `--repeats` rounds, each round one step of every setting
followed by a matmul-peak measurement: the CPU is shared with other jobs, and
interleaving makes a change in their load fall on every setting alike rather than on
whichever ran last (the load average of each round is in the JSON).

FLOP accounting (the `flops_formula` field of the JSON):
  model_flops_per_step = 3 * B * T * ModelConfig.flops_per_token((T + 1) / 2)
i.e. forward + backward = 3 x forward, with T = P + N = 256 positions per row (all
counted as tokens) and the mean causal context (T + 1) / 2 for the attention term.
`flops_per_token` charges the LM head on every position; the learner runs it on N of
the T positions only, so `executed_gflops_per_s` / `executed_mfu` also report the rate
with the head charged on those N positions (about 6% less; attention is counted
causally in both, although the step computes the full masked T x T scores). MFU = model FLOP/s divided by
the f32 matmul peak measured in the same run (`bench.common.matmul_peak_gflops`, the
best of one measurement per round: the least disturbed one, hence the lowest MFU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import machine, matmul_peak_gflops, write_json  # noqa: E402
from evotrainer.learner.step import Learner  # noqa: E402
from evotrainer.model.config import ModelConfig  # noqa: E402
from evotrainer.model.transformer import Transformer  # noqa: E402
from evotrainer.types import TrainBatch  # noqa: E402

CONFIG = ModelConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_layers=4,
                     num_heads=8, num_kv_heads=4, head_dim=64, tie_embeddings=False)
FLOPS_FORMULA = ("model_flops_per_step = 3 * B * T * ModelConfig.flops_per_token((T + 1) / 2), "
                 "T = P + N; executed: LM head charged on the N completion positions only")


def make_batch(b: int, p: int, n: int, seed: int = 0, vocab: int = CONFIG.vocab_size
               ) -> TrainBatch:
  """A full-length batch on the default device: `[B, P]` prompts, `[B, N]` completions of
  random ids in [1, vocab)."""
  rng = np.random.default_rng(seed)
  v = vocab
  batch = TrainBatch(
      prompt_tokens=rng.integers(1, v, (b, p)).astype(np.int32),
      prompt_lengths=np.full((b,), p, np.int32),
      completion_tokens=rng.integers(1, v, (b, n)).astype(np.int32),
      loss_mask=np.ones((b, n), bool),
      advantages=rng.normal(size=b).astype(np.float32),
      # Near the log-prob of a uniform guess, so the ratios are ~1 and clipping is rare.
      old_logprobs=np.full((b, n), -np.log(v), np.float32),
      completion_lengths=np.full((b,), n, np.int32))
  return jax.tree.map(jnp.asarray, batch)


def step_flops(b: int, p: int, n: int) -> tuple[float, float]:
  """(model FLOPs, executed FLOPs) of one training step, see the module docstring."""
  t = p + n
  per_token = CONFIG.flops_per_token((t + 1) / 2)
  head = 2.0 * CONFIG.hidden_size * CONFIG.vocab_size  # forward FLOPs of the LM head
  model = 3.0 * b * t * per_token
  executed = 3.0 * b * (t * (per_token - head) + n * head)
  return model, executed


class Setting:
  """One (batch, micro-batch) configuration: its learner, state and step times."""

  def __init__(self, model: Transformer, b: int, micro: int | None, p: int, n: int):
    self.b, self.micro, self.p, self.n = b, micro, p, n
    self.learner = Learner(model, learning_rate=1e-5, micro_batch_size=micro)
    self.hp = self.learner.hparams(agg_mode="token-mean")
    self.batch = make_batch(b, p, n)
    self.state = self.learner.init_state(nnx.state(model))
    jax.block_until_ready(self.state)
    self.times: list[float] = []
    self.first_s = 0.0

  def step(self) -> float:
    """Runs one `Learner.step` to completion; returns its wall time."""
    t0 = time.perf_counter()
    self.state, metrics = self.learner.step(self.state, self.batch, self.hp)
    jax.block_until_ready((self.state, metrics))
    dt = time.perf_counter() - t0
    if not np.isfinite(float(metrics["loss"])):
      raise RuntimeError(f"non-finite loss at batch {self.b}, micro {self.micro}")
    return dt

  def row(self) -> dict:
    assert self.learner.compiled_programs() == 1, "the step recompiled"
    steady = float(np.median(self.times))
    model_flops, executed_flops = step_flops(self.b, self.p, self.n)
    tokens = self.b * (self.p + self.n)
    return {"batch": self.b, "micro_batch": self.micro, "prompt_len": self.p,
            "completion_len": self.n, "tokens_per_step": tokens,
            "step_s": round(steady, 3), "step_s_min": round(min(self.times), 3),
            "compile_s": round(self.first_s - steady, 2),
            "tokens_per_s": round(tokens / steady, 1),
            "model_gflops_per_s": round(model_flops / steady / 1e9, 2),
            "executed_gflops_per_s": round(executed_flops / steady / 1e9, 2)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--settings", default="8,16,32,16:8,32:8,32:16",
                  help="comma-separated BATCH or BATCH:MICRO_BATCH")
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--completion_len", type=int, default=192)
  ap.add_argument("--warmup", type=int, default=1)
  ap.add_argument("--repeats", type=int, default=5, help="timed rounds")
  args = ap.parse_args()

  print(f"params: {CONFIG.num_params() / 1e6:.2f}M ({CONFIG.num_params()})", flush=True)
  model = Transformer(CONFIG, rngs=nnx.Rngs(0))
  settings = []
  for s in args.settings.split(","):
    b, _, mb = s.partition(":")
    setting = Setting(model, int(b), int(mb) if mb else None, args.prompt_len,
                      args.completion_len)
    setting.first_s = setting.step()  # compile + one step
    for _ in range(args.warmup):
      setting.step()
    print(f"compiled batch {setting.b} micro {setting.micro}: first step "
          f"{setting.first_s:.1f} s", flush=True)
    settings.append(setting)
  # Rounds: one step of every setting, then the matmul peak, so that a change in the
  # load of the (shared) machine falls on every setting alike.
  peaks, loads = [], []
  for r in range(args.repeats):
    for setting in settings:
      setting.times.append(setting.step())
    peaks.append(matmul_peak_gflops())
    loads.append(os.getloadavg()[0])
    print(f"round {r}: " + ", ".join(f"{st.b}:{st.micro} {st.times[-1]:.2f}s" for st in settings)
          + f", peak {peaks[-1]:.1f} GFLOP/s, load {loads[-1]:.2f}", flush=True)
  peak = max(peaks)
  rows = [st.row() for st in settings]
  for row in rows:
    row["mfu"] = round(row["model_gflops_per_s"] / peak, 3)
    row["executed_mfu"] = round(row["executed_gflops_per_s"] / peak, 3)
    print(row, flush=True)
  best = max(rows, key=lambda r: r["tokens_per_s"])
  write_json(args.json, {
      "benchmark": "learner",
      "tokens_per_s": best["tokens_per_s"],
      "model_gflops_per_s": best["model_gflops_per_s"],
      "peak_gflops_per_s": round(peak, 1),
      "mfu": best["mfu"],
      "executed_mfu": best["executed_mfu"],
      "best_setting": {"batch": best["batch"], "micro_batch": best["micro_batch"]},
      "peak_gflops_per_s_each_round": [round(x, 1) for x in peaks],
      "load_avg_1m_each_round": [round(x, 2) for x in loads],
      "flops_formula": FLOPS_FORMULA,
      "model": {"num_params": CONFIG.num_params(), "vocab": CONFIG.vocab_size,
                "hidden": CONFIG.hidden_size, "intermediate": CONFIG.intermediate_size,
                "layers": CONFIG.num_layers, "heads": CONFIG.num_heads,
                "kv_heads": CONFIG.num_kv_heads, "head_dim": CONFIG.head_dim,
                "tied": CONFIG.tie_embeddings, "dtype": CONFIG.dtype,
                "forward_flops_per_token": CONFIG.flops_per_token(
                    (args.prompt_len + args.completion_len + 1) / 2)},
      "loss": "GRPO clipped, token-mean, entropy computed, no KL; clip_by_global_norm + adamw",
      "machine": machine(),
      "rows": rows})


if __name__ == "__main__":
  main()
