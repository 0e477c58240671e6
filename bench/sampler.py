r"""Sampler throughput: ours vs transformers `generate` on the same weights.

  python bench/sampler.py --json out.json

Builds one tiny Llama (4 layers, d_model 256, 8 heads, 2 kv heads, vocab 8192) with
torch, saves it in HF format, loads the same weights into our model, and generates 128
new tokens (no early stop) for 64-token prompts at batch 16 and 64 in four modes: greedy,
temperature 1.0, top-k 50 and top-p 0.9 (both at temperature 1.0). Reports steady-state
tokens/s (compile measured apart; median of `--repeats` timed calls each), the speedup
over transformers measured in the same run, whether it meets the goal (GOALS: >= 3x at
batch 16, >= 2x at batch 64), and the decode FLOP rate as a fraction of the f32 matmul
peak measured in the same run.

Each side runs in its own child process, one batch size at a time and one after the
other: in one process, PyTorch's and XLA's thread pools slowed each other (measured:
ours at batch 16 greedy 1209 tokens/s after transformers had run in the process, ~1900
alone).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import machine, matmul_peak_gflops, timed, write_json  # noqa: E402
from evotrainer import lifetime  # noqa: E402
from evotrainer.model.hf import load_hf_checkpoint  # noqa: E402
from evotrainer.sampling import Sampler, SamplingParams, left_pad  # noqa: E402

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV = 8192, 256, 704, 4, 8, 2
# Speedup over transformers `generate` that each batch size should reach, every mode.
GOALS = {16: 3.0, 64: 2.0}
# mode -> (greedy, top_k, top_p); temperature 1.0 when sampling.
MODES = {"greedy": (True, 0, 1.0), "temperature_1.0": (False, 0, 1.0),
         "top_k_50": (False, 50, 1.0), "top_p_0.9": (False, 0, 0.9)}


def build_checkpoint(path: str) -> None:
  import torch
  import transformers
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
      vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
      max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False)
  transformers.LlamaForCausalLM(cfg).eval().save_pretrained(path)


def transformers_generate(model, prompts, new_tokens: int, mode: tuple):
  """One transformers `generate` call as a function of nothing: returns the new ids
  `[B, new_tokens]` of `prompts` (a `[B, P]` list) in `mode` = MODES[...]."""
  import torch
  ids = torch.tensor(prompts)
  mask = torch.ones_like(ids)
  greedy, top_k, top_p = mode

  def go() -> np.ndarray:
    with torch.no_grad():
      out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=not greedy,
                           temperature=1.0 if not greedy else None, top_k=top_k,
                           top_p=top_p,
                           use_cache=True, pad_token_id=0, eos_token_id=None)
    assert out.shape[1] == ids.shape[1] + new_tokens
    return out[:, ids.shape[1]:].numpy()

  return go


def ours_generate(model, prompts, new_tokens: int, mode: tuple, pad_id: int = 0):
  """One call of our `Sampler` as a function of nothing (a new key each call): returns
  the new ids `[B, new_tokens]` of `prompts` in `mode` = MODES[...]."""
  sampler = Sampler(model, pad_id=pad_id)
  batch = left_pad(prompts, pad_id)
  params = nnx.state(model)
  greedy, top_k, top_p = mode
  sp = SamplingParams(max_new_tokens=new_tokens, greedy=greedy, temperature=1.0,
                      top_k=top_k, top_p=top_p)
  keys = iter(range(10**6))

  def go() -> np.ndarray:
    out = sampler(params, batch, jax.random.key(next(keys)), stop_ids=None, sampling=sp)
    out.tokens.block_until_ready()
    assert int(np.asarray(out.lengths).min()) == new_tokens
    return np.asarray(out.tokens)

  return go


def bench_transformers(path, prompts, new_tokens, mode, repeats):
  import torch
  import transformers
  torch.set_num_threads(os.cpu_count() or 1)
  model = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  steady, first, _ = timed(transformers_generate(model, prompts, new_tokens, MODES[mode]),
                           repeats)
  return steady, first


def bench_ours(model, prompts, new_tokens, mode, repeats):
  steady, first, _ = timed(ours_generate(model, prompts, new_tokens, MODES[mode]), repeats)
  return steady, first - steady


def worker(side: str, path: str, batch: int, modes, prompt_len: int, new_tokens: int,
           repeats: int) -> dict:
  """One side's timings for one batch size, in this (child) process: mode -> seconds."""
  prompts = np.random.default_rng(batch).integers(1, VOCAB, size=(batch, prompt_len)).tolist()
  out = {}
  if side == "ours":
    model = load_hf_checkpoint(path)
  for mode in modes:
    if side == "ours":
      steady, compile_s = bench_ours(model, prompts, new_tokens, mode, repeats)
    else:
      steady, compile_s = bench_transformers(path, prompts, new_tokens, mode, repeats)
    out[mode] = {"steady_s": steady, "first_call_s": compile_s,
                 "load_average_1min": round(os.getloadavg()[0], 1)}
  return out


def run_side(side: str, path: str, batch: int, args) -> dict:
  """`worker` in a fresh child process; its result (the child prints one JSON line)."""
  cmd = [sys.executable, os.path.abspath(__file__), "--_worker", side, "--_checkpoint", path,
         "--batches", str(batch), "--modes", args.modes, "--prompt_len", str(args.prompt_len),
         "--new_tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=lifetime.child_env())
  if proc.returncode:
    raise RuntimeError(f"{side} worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--batches", default="16,64")
  ap.add_argument("--modes", default=",".join(MODES), help=f"subset of {list(MODES)}")
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--skip_transformers", action="store_true")
  ap.add_argument("--_worker", choices=["ours", "transformers"], help=argparse.SUPPRESS)
  ap.add_argument("--_checkpoint", help=argparse.SUPPRESS)
  args = ap.parse_args()
  modes = args.modes.split(",")
  if args._worker:
    lifetime.die_with_launcher()  # a killed benchmark leaves no measurement running
    print(json.dumps(worker(args._worker, args._checkpoint, int(args.batches), modes,
                            args.prompt_len, args.new_tokens, args.repeats)))
    return

  peak = matmul_peak_gflops()
  print(f"f32 matmul peak: {peak:.1f} GFLOP/s", flush=True)
  rows = []
  with tempfile.TemporaryDirectory() as d:
    build_checkpoint(d)  # torch in this process: nothing is timed here from now on
    cfg = load_hf_checkpoint(d).config
    for b in map(int, args.batches.split(",")):
      ours = run_side("ours", d, b, args)
      theirs = {} if args.skip_transformers else run_side("transformers", d, b, args)
      for mode in modes:
        ours_s = ours[mode]["steady_s"]
        n_tok = b * args.new_tokens
        # Decode FLOPs: each new token's forward at its context length.
        flops = b * sum(cfg.flops_per_token(args.prompt_len + t)
                        for t in range(args.new_tokens))
        row = {"batch": b, "mode": mode, "load_average_1min": ours[mode]["load_average_1min"],
               "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
               "ours_tokens_per_s": round(n_tok / ours_s, 1),
               "ours_ms_per_step": round(1000 * ours_s / args.new_tokens, 2),
               "compile_s": round(ours[mode]["first_call_s"], 2),
               "decode_flops_fraction_of_peak": round(flops / ours_s / 1e9 / peak, 3)}
        if theirs:
          hf_s = theirs[mode]["steady_s"]
          row["transformers_tokens_per_s"] = round(n_tok / hf_s, 1)
          row["transformers_ms_per_step"] = round(1000 * hf_s / args.new_tokens, 2)
          row["speedup"] = round(hf_s / ours_s, 2)
          if b in GOALS:
            row["goal_speedup"] = GOALS[b]
            row["meets_goal"] = row["speedup"] >= GOALS[b]
        print(row, flush=True)
        rows.append(row)
  write_json(args.json, {"benchmark": "sampler", "peak_gflops_per_s": round(peak, 1),
                         "goals_speedup_by_batch": GOALS, "load_average": os.getloadavg(),
                         "machine": machine(), "results": rows})


if __name__ == "__main__":
  main()
