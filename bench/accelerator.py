r"""Accelerator check: learner MFU and sampler tokens/s of a ~0.5B bf16 model, one run, JSON.

  python -m bench.accelerator --json out.json            # GPU / TPU: the 0.5B model
  python -m bench.accelerator --size tiny --json out.json  # any machine (CI runs this)

Model (`--size 0.5b`, the default on a GPU or TPU): Qwen2.5-0.5B's shape — vocab 151,936,
hidden 896, intermediate 4864, 24 layers, 14 heads, 2 kv heads, head_dim 64, tied
embeddings, QKV bias: 494M parameters (`ModelConfig.num_params`), float32 parameters,
bfloat16 compute, rematerialized layers, `Learner.logprob_chunk = 128`. Random weights:
throughput does not depend on them. `--size tiny` (the default on a CPU): the same code
on a 2-layer, 64-wide model with a 512-token vocabulary.

Learner: `--steps` timed `Learner.step`s (after one compile step) on `--batch` rows of
`--prompt_len` + `--completion_len` random tokens, GRPO loss, entropy on. Model FLOPs per
step = 3 x B x T x `flops_per_token((T + 1) / 2)` (forward + backward, every position a
token, mean causal context), as in bench/learner.py. MFU = model FLOP/s / peak.

Sampler: `--new_tokens` tokens (no early stop) for `--batch` prompts at temperature 1.0,
steady state over `--steps` runs after one compile run; decode FLOPs are each new
token's forward at its context length, as in bench/sampler.py.

Peak: the bf16 dense peak of the device from `PEAK_TFLOPS` (vendor figures, by
`device_kind`), else — a CPU, or an unknown device — a matmul measured in the compute
dtype on the device (`peak_source` says which).
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

from bench.common import machine, write_json  # noqa: E402
from evotrainer.learner.step import Learner  # noqa: E402
from evotrainer.model.config import ModelConfig  # noqa: E402
from evotrainer.model.transformer import Transformer  # noqa: E402
from evotrainer.sampling import Sampler, SamplingParams, left_pad  # noqa: E402
from evotrainer.types import TrainBatch  # noqa: E402

# Dense bf16 peak TFLOP/s per chip (vendor datasheets, without sparsity).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0,
               "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5p": 459.0,
               "TPU v5": 459.0, "TPU v6 lite": 918.0, "TPU v6e": 918.0}

SIZES = {
    "0.5b": dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_layers=24,
                 num_heads=14, num_kv_heads=2, head_dim=64, tie_embeddings=True,
                 qkv_bias=True, architecture="qwen2", max_position_embeddings=4096,
                 param_dtype="float32", dtype="bfloat16", remat=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16, tie_embeddings=True,
                 qkv_bias=True, architecture="qwen2", max_position_embeddings=512,
                 param_dtype="float32", dtype="bfloat16"),
}
DEFAULTS = {"0.5b": dict(batch=16, prompt_len=256, completion_len=768, new_tokens=256,
                         steps=5),
            "tiny": dict(batch=4, prompt_len=16, completion_len=32, new_tokens=16, steps=2)}


def device_peak(dtype) -> tuple[float, str]:
  """(peak FLOP/s of one device, where the figure comes from)."""
  kind = jax.devices()[0].device_kind
  for name, tflops in sorted(PEAK_TFLOPS.items(), key=lambda kv: -len(kv[0])):
    if name.lower() in kind.lower():
      return tflops * 1e12, f"datasheet ({name}, bf16 dense)"
  n = 1024
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  f(a, a).block_until_ready()
  best = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(5))
  return 2 * n**3 / best, f"measured ({jnp.dtype(dtype).name} {n}^3 matmul on {kind})"


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def learner_figures(model: Transformer, cfg: ModelConfig, b: int, p: int, n: int,
                    steps: int, peak: float) -> dict:
  chunk = 128 if cfg.vocab_size > 32_768 else None
  learner = Learner(model, learning_rate=1e-6, logprob_chunk=chunk)
  state = learner.init_state(nnx.state(model))
  rng = np.random.default_rng(0)
  v = cfg.vocab_size
  batch = jax.tree.map(jnp.asarray, TrainBatch(
      prompt_tokens=rng.integers(1, v, (b, p)).astype(np.int32),
      prompt_lengths=np.full((b,), p, np.int32),
      completion_tokens=rng.integers(1, v, (b, n)).astype(np.int32),
      loss_mask=np.ones((b, n), bool), advantages=rng.normal(size=b).astype(np.float32),
      old_logprobs=np.full((b, n), -np.log(v), np.float32),
      completion_lengths=np.full((b,), n, np.int32)))
  hp = learner.hparams()
  times = []
  for i in range(steps + 1):
    t = time.perf_counter()
    state, metrics = learner.step(state, batch, hp)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t)
    if not np.isfinite(float(metrics["loss"])):
      raise RuntimeError(f"non-finite loss at learner step {i}")
  steady = float(np.median(times[1:]))
  t_all = p + n
  flops = 3.0 * b * t_all * cfg.flops_per_token((t_all + 1) / 2)
  return {"batch": b, "prompt_len": p, "completion_len": n, "logprob_chunk": chunk,
          "step_s": round(steady, 6), "compile_s": round(times[0] - steady, 2),
          "tokens_per_s": round(b * t_all / steady, 1),
          "model_tflops_per_s": round(flops / steady / 1e12, 4),
          "mfu": round(flops / steady / peak, 4),
          "compiled_programs": learner.compiled_programs()}


def sampler_figures(model: Transformer, cfg: ModelConfig, b: int, p: int, new: int,
                    steps: int, peak: float) -> dict:
  sampler = Sampler(model, pad_id=0)
  rng = np.random.default_rng(1)
  batch = left_pad(rng.integers(1, cfg.vocab_size, (b, p)).tolist(), 0)
  params = nnx.state(model)
  sp = SamplingParams(max_new_tokens=new, temperature=1.0)
  times = []
  for i in range(steps + 1):
    t = time.perf_counter()
    out = sampler(params, batch, jax.random.key(i), stop_ids=None, sampling=sp)
    out.tokens.block_until_ready()
    times.append(time.perf_counter() - t)
    assert int(np.asarray(out.lengths).min()) == new, "a row stopped early"
  steady = float(np.median(times[1:]))
  flops = b * sum(cfg.flops_per_token(p + t) for t in range(new))
  return {"batch": b, "prompt_len": p, "new_tokens": new, "run_s": round(steady, 6),
          "compile_s": round(times[0] - steady, 2),
          "tokens_per_s": round(b * new / steady, 1),
          "decode_fraction_of_peak": round(flops / steady / peak, 5)}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--size", choices=("auto", *SIZES), default="auto",
                  help="auto: 0.5b on a GPU/TPU, tiny on a CPU")
  for name in ("batch", "prompt_len", "completion_len", "new_tokens", "steps"):
    ap.add_argument(f"--{name}", type=int, help="default: per size, see DEFAULTS")
  args = ap.parse_args(argv)
  size = args.size
  if size == "auto":
    size = "tiny" if jax.default_backend() == "cpu" else "0.5b"
  opts = {k: getattr(args, k) if getattr(args, k) is not None else v
          for k, v in DEFAULTS[size].items()}
  cfg = ModelConfig(**SIZES[size])
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  peak, source = device_peak(cfg.jnp_dtype)
  print(f"[accelerator] {size}: {cfg.num_params() / 1e6:.1f}M parameters on "
        f"{jax.devices()[0].device_kind}; peak {peak / 1e12:.3f} TFLOP/s ({source})",
        flush=True)
  learner = learner_figures(model, cfg, opts["batch"], opts["prompt_len"],
                            opts["completion_len"], opts["steps"], peak)
  print(f"[accelerator] learner {learner}", flush=True)
  sampler = sampler_figures(model, cfg, opts["batch"], opts["prompt_len"], opts["new_tokens"],
                            opts["steps"], peak)
  print(f"[accelerator] sampler {sampler}", flush=True)
  result = {"benchmark": "accelerator", "size": size, "params": cfg.num_params(),
            "dtype": cfg.dtype, "param_dtype": cfg.param_dtype,
            "device_kind": jax.devices()[0].device_kind, "backend": jax.default_backend(),
            "peak_tflops": round(peak / 1e12, 4), "peak_source": source,
            "learner": learner, "sampler": sampler, "machine": machine()}
  write_json(args.json, result)
  return result


if __name__ == "__main__":
  main()
