r"""End-to-end GRPO step throughput: ours vs Tunix vs TRL on the same checkpoint.

  python bench/rl_step.py --json out.json
  python bench/rl_step.py --frameworks ours --configs 8x4 --steps 3

One tiny Qwen3 checkpoint (vocab 8192, hidden 256, intermediate 704, 4 layers, 8 heads /
2 kv heads, head_dim 32, rope_theta 1e6, untied embeddings, torch seed 0; 7.0M
parameters) is built once with torch/transformers and saved in HF format
(config.json + model.safetensors) with a token-id tokenizer (the text of id i is "i";
pad and EOS ids past the model vocabulary) under `--cache_dir`. Every framework loads
those weights and runs the same GRPO step, in float32 on the CPU:

  rollout     G prompts x n samples, 64-token prompts (random ids, fixed seed, new
              prompts every step), exactly 64 new tokens at temperature 1 (no stop id
              for ours; the peers' EOS is an id the model cannot sample), reward =
              share of even ids in the completion,
              group-normalized advantages;
  reference   log-probs of the completions under the initial weights (KL coef 0.04, k3);
  update      one adamw step (lr 1e-5) on the clipped GRPO loss + KL.

Configs: "8x4" (8 prompts x 4 samples = 32 rows) and "16x8" (128 rows).

Ours runs in this process (`OursGRPO`: `Sampler` + `Learner`, the checkpoint imported
with `evotrainer.model.hf`). Tunix (google-tunix 0.1.7, `GRPOLearner` with a colocated
vanilla rollout) and TRL (trl 1.16.0, `GRPOTrainer` without vLLM) run in virtual
environments that this script creates on first use under `--venv_dir` (their pins
conflict with ours), driven by `bench/peers/*.py`. Each driver is a long-lived child
process that stops before every step and waits for a "go" on stdin, so the frameworks
are interleaved step by step (round r: one step of each framework, per config) and a
change in the load of the shared machine falls on all of them alike. Every driver
reports per-step wall time and the phase split as JSON lines; the first `--warmup`
steps (compilation, caches) are discarded.

Reported per framework and config: median s/step, tokens/s (prompt + completion
tokens of all rows), completion tokens/s, the rollout / reference / update split
(`phase_s`, medians; how each peer's phases were measured is in `phase_method`),
compile_s (first step minus the steady median), and `peak_fraction`: model FLOPs per
step / s_per_step / the f32 matmul peak measured in the same run (best of the
per-round measurements). Model FLOPs per step, the same for every framework
(`ModelConfig.flops_per_token`, forward = 2 x matmul params + attention):
  rollout:   B * sum over the T = P + N positions of one forward at its causal context,
             LM head on the N + 1 positions that sample (the last prompt slot included)
  reference: the same forward, LM head on the N completion positions
  update:    3 x the reference forward (forward + backward).
The top-level "ratios" are ours / peer tokens/s per config.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import machine, matmul_peak_gflops, write_json  # noqa: E402

VOCAB, HIDDEN, INTER, LAYERS, HEADS, KV, HEAD_DIM = 8192, 256, 704, 4, 8, 2, 32
ROPE_THETA = 1e6
PAD_ID = 0  # our sampler's fill after a stop (there is none: no stop ids)
PROMPT_LEN, NEW_TOKENS = 64, 64
LEARNING_RATE, KL_COEF = 1e-5, 0.04
CONFIGS = {"8x4": (8, 4), "16x8": (16, 8)}
FRAMEWORKS = ("ours", "tunix", "trl")
# Exact pins of the peers' environments. torch==2.13.0 is the local CPU wheel; a looser
# torch spec would download a multi-GB CUDA build.
PEER_REQUIREMENTS = {"tunix": ["google-tunix==0.1.7"],
                     "trl": ["trl==1.16.0", "torch==2.13.0"]}
PEER_SCRIPTS = {"tunix": "tunix_grpo.py", "trl": "trl_grpo.py"}
PEERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "evotrainer")


# --------------------------------------------------------------------------- shared set-up


def build_checkpoint(path: str, **sizes) -> str:
  """The benchmark's Qwen3 checkpoint + token-id tokenizer in `path` (built once).

  `sizes` overrides Qwen3Config fields (tests build a smaller model).
  """
  if os.path.exists(os.path.join(path, "model.safetensors")):
    return path
  import torch
  import transformers
  from tokenizers import Tokenizer, models, pre_tokenizers

  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  torch.manual_seed(0)
  fields = dict(
      vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
      num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
      head_dim=HEAD_DIM, rope_theta=ROPE_THETA, max_position_embeddings=512,
      tie_word_embeddings=False, pad_token_id=None, eos_token_id=None, bos_token_id=None)
  fields.update(sizes)
  cfg = transformers.Qwen3Config(**fields)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  tmp = path + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  model.save_pretrained(tmp)
  vocab_size = cfg.vocab_size
  # Token-id tokenizer: the text of id i is "i", so a space-separated id list encodes to
  # exactly those ids in every framework. Its pad and EOS ids lie past the model's
  # vocabulary: the model never samples them, so no row stops early and no sampled id
  # is mistaken for padding; prompts all have P tokens, so no pad id is ever embedded.
  vocab = {str(i): i for i in range(vocab_size)}
  vocab.update({"<pad>": vocab_size, "</s>": vocab_size + 1})
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<pad>",
      padding_side="left", clean_up_tokenization_spaces=False)
  fast.save_pretrained(tmp)
  os.replace(tmp, path)
  return path


def make_prompts(num_steps: int, num_prompts: int, seed: int = 0, *,
                 prompt_len: int = PROMPT_LEN, vocab: int = VOCAB) -> np.ndarray:
  """`[steps, G, P]` int32 prompt ids in [0, vocab): the same for every framework."""
  rng = np.random.default_rng(seed)
  return rng.integers(0, vocab, (num_steps, num_prompts, prompt_len)).astype(np.int32)


def even_share(completions: np.ndarray) -> np.ndarray:
  """Reward of each row: the share of even ids among its completion tokens. `[B, N]` -> `[B]`."""
  return (np.asarray(completions) % 2 == 0).mean(-1).astype(np.float32)


def step_flops(config, rows: int) -> Dict[str, float]:
  """Model FLOPs of one GRPO step per phase (module docstring)."""
  p, n = PROMPT_LEN, NEW_TOKENS
  head = 2.0 * config.hidden_size * config.vocab_size
  body = sum(config.flops_per_token(t + 1) - head for t in range(p + n))
  rollout = rows * (body + (n + 1) * head)
  reference = rows * (body + n * head)
  return {"rollout": rollout, "reference": reference, "update": 3.0 * reference}


# --------------------------------------------------------------------------- ours


class OursGRPO:
  """Our GRPO step: `Sampler` rollout, reference log-probs, one `Learner` update.

  Usage:
    grpo = OursGRPO(ckpt_dir, num_prompts=8, group_size=4)
    record = grpo.step(prompts)  # prompts [G, P] int32

  The reference forward and the update run in micro-batches of `micro_batch_size`
  rows (one optimizer update per step all the same): a micro-batch of 8 rows x 128
  positions keeps the activations small enough to stay in the CPU's caches while the
  matmuls stay 1024 rows tall (measured at 8x4: update 1.84 -> 1.50 s, reference
  0.59 -> 0.45 s against the whole batch at once; 4 or 2 rows were no faster). Entropy
  is not computed: the GRPO loss does not use it.
  """

  def __init__(self, source, num_prompts: int, group_size: int, *,
               new_tokens: int = NEW_TOKENS, seed: int = 0,
               micro_batch_size: Optional[int] = 8, kl_coef: float = KL_COEF,
               learning_rate: float = LEARNING_RATE, pad_id: int = PAD_ID,
               trainable_layers: Optional[int] = None):
    """`source`: an HF checkpoint directory or a loaded `Transformer`. With `kl_coef` 0
    there is no reference pass (nor a reference copy of the weights)."""
    from evotrainer.learner.step import Learner
    from evotrainer.model.hf import load_hf_checkpoint
    from evotrainer.sampling import Sampler, SamplingParams

    self.model = load_hf_checkpoint(source) if isinstance(source, str) else source
    self.config = self.model.config
    self.num_prompts, self.group_size = num_prompts, group_size
    self.rows = num_prompts * group_size
    self.new_tokens = new_tokens
    self.kl_coef = kl_coef
    self.sampler = Sampler(self.model, pad_id=pad_id)
    self.sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    micro = (micro_batch_size if micro_batch_size and self.rows % micro_batch_size == 0
             else None)
    self.learner = Learner(self.model, learning_rate=learning_rate, kl_coef=kl_coef,
                           kl_kind="k3", micro_batch_size=micro,
                           compute_entropy=False, trainable_layers=trainable_layers)
    self.hparams = self.learner.hparams(temperature=self.sampling.logprob_temperature)
    # The reference is the initial weights; the train state holds its own copy.
    self.ref_params = nnx.state(self.model)
    self.state = self.learner.init_state(self.ref_params)
    if not kl_coef:
      self.ref_params = None
    self.rng = jax.random.key(seed)
    self.steps = 0

  def step(self, prompts: np.ndarray, lengths: Optional[np.ndarray] = None) -> dict:
    """One GRPO step on `prompts` `[G, P]` (left-padded to P, each `lengths` `[G]` long;
    all P when None); returns timings, token counts and outputs."""
    from evotrainer.learner.advantages import grpo_advantages
    from evotrainer.types import PromptBatch, TrainBatch

    g, p = prompts.shape
    assert g == self.num_prompts, (g, self.num_prompts)
    rows = np.repeat(prompts, self.group_size, axis=0)  # groups contiguous
    lengths = np.repeat(np.full((g,), p, np.int32) if lengths is None
                        else np.asarray(lengths, np.int32), self.group_size)
    self.rng, key = jax.random.split(self.rng)
    t0 = time.perf_counter()
    out = self.sampler(self.state.params, PromptBatch(tokens=rows, lengths=lengths), key,
                       stop_ids=None, sampling=self.sampling)
    completions = np.asarray(out.tokens)  # [B, N]
    t1 = time.perf_counter()
    rewards = even_share(completions)  # [B]
    advantages = grpo_advantages(jnp.asarray(rewards), self.group_size)  # [B]
    batch = TrainBatch(
        prompt_tokens=rows, prompt_lengths=lengths, completion_tokens=completions,
        loss_mask=np.asarray(out.loss_mask), advantages=advantages,
        old_logprobs=out.logprobs, completion_lengths=out.lengths)
    phases = {"rollout": t1 - t0}
    if self.kl_coef:
      ref = self.learner.reference_logprobs(self.ref_params, batch)
      ref.block_until_ready()
      batch = batch.replace(ref_logprobs=ref)
    t2 = time.perf_counter()
    phases["reference" if self.kl_coef else "reward"] = t2 - t1  # reward + advantages in both
    self.state, metrics = self.learner.step(self.state, batch, self.hparams)
    metrics = jax.device_get(metrics)
    t3 = time.perf_counter()
    phases["update"] = t3 - t2
    self.steps += 1
    return {"step_s": t3 - t0, "phase_s": phases,
            "prompt_tokens": int(lengths.sum()),
            "completion_tokens": int(np.asarray(out.lengths).sum()),
            "completions": completions, "rewards": rewards,
            "advantages": np.asarray(advantages),
            "loss": float(metrics["loss"]), "kl": float(metrics.get("kl", 0.0))}


class OursRunner:
  """`OursGRPO` behind the same step interface as a peer process."""

  phase_method = ("exact: each phase is timed in-process and blocked on its result "
                  "(rollout includes the reward and advantages on the host)")

  def __init__(self, ckpt_dir: str, config: str, prompts: np.ndarray):
    g, n = CONFIGS[config]
    self.grpo = OursGRPO(ckpt_dir, g, n)
    self.prompts = prompts
    self.i = 0

  def step(self) -> dict:
    rec = self.grpo.step(self.prompts[self.i])
    self.i += 1
    return {k: rec[k] for k in ("step_s", "phase_s", "prompt_tokens", "completion_tokens")}

  def close(self) -> None:
    pass


class PeerProcess:
  """A peer driver (bench/peers/*.py) run in its venv, released one step at a time."""

  def __init__(self, framework: str, python: str, ckpt_dir: str, config: str,
               prompts_path: str, log_path: str, workdir: str):
    g, n = CONFIGS[config]
    del g
    self.framework, self.config, self.log_path = framework, config, log_path
    cmd = [python, os.path.join(PEERS_DIR, PEER_SCRIPTS[framework]), "--ckpt", ckpt_dir,
           "--prompts", prompts_path, "--group_size", str(n), "--new_tokens", str(NEW_TOKENS),
           "--learning_rate", str(LEARNING_RATE), "--kl_coef", str(KL_COEF), "--gated",
           "--workdir", workdir]
    self.log = open(log_path, "w")
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the peer gets the machine's defaults, as ours does
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=self.log, text=True, bufsize=1, env=env)
    self.events: "queue.Queue[Optional[dict]]" = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      try:
        self.events.put(json.loads(line))
      except json.JSONDecodeError:
        pass
    self.events.put(None)

  def _next(self, want: str, timeout: float) -> dict:
    while True:
      try:
        ev = self.events.get(timeout=timeout)
      except queue.Empty:
        raise RuntimeError(f"{self.framework} {self.config}: no '{want}' within {timeout} s; "
                           f"see {self.log_path}") from None
      if ev is None:
        self.log.flush()
        tail = open(self.log_path).read()[-3000:]
        raise RuntimeError(f"{self.framework} {self.config} exited (code "
                           f"{self.proc.wait()}) before '{want}'; log {self.log_path}:\n{tail}")
      if ev.get("event") == want:
        return ev

  def step(self, timeout: float = 1800.0) -> dict:
    self._next("ready", timeout)
    self.proc.stdin.write("go\n")
    self.proc.stdin.flush()
    ev = self._next("step", timeout)
    return {"step_s": ev["step_s"], "phase_s": ev["phase_s"],
            "prompt_tokens": ev.get("prompt_tokens", 0),
            "completion_tokens": ev.get("completion_tokens", 0)}

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self._next("ready", 600.0)
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=120)
      except Exception:  # noqa: BLE001  (a stuck peer must not hide the results)
        self.proc.kill()
        self.proc.wait()
    self.log.close()


def peer_phase_method(framework: str) -> str:
  """The "Phase split" paragraph of a peer driver's docstring."""
  with open(os.path.join(PEERS_DIR, PEER_SCRIPTS[framework])) as f:
    text = f.read()
  start = text.index("Phase split")
  return " ".join(text[start:text.index('"""', start)].split())


def ensure_venv(framework: str, venv_dir: str) -> str:
  """The python of `framework`'s virtual environment, created and installed on first use."""
  path = os.path.join(venv_dir, framework)
  python = os.path.join(path, "bin", "python")
  marker = os.path.join(path, ".bench_requirements")
  reqs = PEER_REQUIREMENTS[framework]
  if os.path.exists(marker) and open(marker).read().split() == reqs:
    return python
  print(f"creating {path} with {' '.join(reqs)} (one-time, a few minutes)", flush=True)
  os.makedirs(venv_dir, exist_ok=True)
  base = getattr(sys, "_base_executable", sys.executable)
  subprocess.run([base, "-m", "venv", path], check=True)
  result = subprocess.run([python, "-m", "pip", "install", "-q", *reqs],
                          capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError(f"pip install {' '.join(reqs)} into {path} failed:\n"
                       f"{result.stderr[-3000:]}")
  with open(marker, "w") as f:
    f.write("\n".join(reqs) + "\n")
  return python


# --------------------------------------------------------------------------- report


def summarize(framework: str, config: str, records: List[dict], warmup: int,
              flops: Dict[str, float], peak_gflops: float, phase_method: str) -> dict:
  steady = records[warmup:]
  med = lambda xs: float(np.median(xs))
  s = med([r["step_s"] for r in steady])
  tokens = med([r["prompt_tokens"] + r["completion_tokens"] for r in steady])
  completion = med([r["completion_tokens"] for r in steady])
  names = sorted({k for r in steady for k in r["phase_s"]},
                 key=lambda k: ("rollout", "reference", "update").index(k)
                 if k in ("rollout", "reference", "update") else 3)
  phases = {k: round(med([r["phase_s"].get(k, 0.0) for r in steady]), 3) for k in names}
  phases["other"] = round(med([r["step_s"] - sum(r["phase_s"].values()) for r in steady]), 3)
  return {
      "framework": framework, "config": config,
      "s_per_step": round(s, 3),
      "tokens_per_s": round(tokens / s, 1),
      "completion_tokens_per_s": round(completion / s, 1),
      "phase_s": phases,
      "compile_s": round(records[0]["step_s"] - s, 2),
      "peak_fraction": round(sum(flops.values()) / s / 1e9 / peak_gflops, 3),
      "tokens_per_step": int(tokens), "completion_tokens_per_step": int(completion),
      "steps_measured": len(steady), "step_s_each": [round(r["step_s"], 3) for r in records],
      "phase_method": phase_method,
  }


def print_table(rows: List[dict], ratios: dict) -> None:
  head = (f"{'framework':9s} {'config':6s} {'s/step':>7s} {'tok/s':>8s} {'compl/s':>8s} "
          f"{'rollout':>8s} {'ref':>6s} {'update':>7s} {'other':>6s} {'compile':>8s} {'peak':>5s}")
  print(head)
  print("-" * len(head))
  for r in rows:
    p = r["phase_s"]
    print(f"{r['framework']:9s} {r['config']:6s} {r['s_per_step']:7.2f} {r['tokens_per_s']:8.0f} "
          f"{r['completion_tokens_per_s']:8.0f} {p.get('rollout', 0):8.2f} "
          f"{p.get('reference', 0):6.2f} {p.get('update', 0):7.2f} {p.get('other', 0):6.2f} "
          f"{r['compile_s']:8.1f} {r['peak_fraction']:5.2f}")
  for config, rs in ratios.items():
    print(f"ratios {config}: " + ", ".join(f"{k} {v:.2f}x" for k, v in rs.items()))


# --------------------------------------------------------------------------- main


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                  help=f"comma-separated subset of {FRAMEWORKS}")
  ap.add_argument("--configs", default=",".join(CONFIGS),
                  help=f"comma-separated subset of {tuple(CONFIGS)}")
  ap.add_argument("--steps", type=int, default=4, help="measured steps per framework and config")
  ap.add_argument("--warmup", type=int, default=1, help="discarded first steps (compilation)")
  ap.add_argument("--cache_dir", default=os.path.join(DEFAULT_CACHE, "bench_rl_step"),
                  help="where the checkpoint and the peers' logs live")
  ap.add_argument("--venv_dir", default=os.path.join(DEFAULT_CACHE, "bench_venvs"),
                  help="where the peers' virtual environments are created")
  args = ap.parse_args()
  frameworks = args.frameworks.split(",")
  configs = args.configs.split(",")
  for f in frameworks:
    if f not in FRAMEWORKS:
      raise SystemExit(f"--frameworks: unknown {f!r}; expected some of {FRAMEWORKS}")
  for c in configs:
    if c not in CONFIGS:
      raise SystemExit(f"--configs: unknown {c!r}; expected some of {tuple(CONFIGS)}")
  if args.steps < 1 or args.warmup < 0:
    raise SystemExit("--steps must be >= 1 and --warmup >= 0")

  ckpt = build_checkpoint(os.path.join(args.cache_dir, "qwen3_tiny"))
  pythons = {f: ensure_venv(f, args.venv_dir) for f in frameworks if f != "ours"}
  total = args.warmup + args.steps
  run_dir = os.path.join(args.cache_dir, "run")
  os.makedirs(run_dir, exist_ok=True)
  runners, methods = {}, {}
  for c in configs:
    prompts = make_prompts(total + 1, CONFIGS[c][0])  # one spare: a peer stops at its gate
    prompts_path = os.path.join(run_dir, f"prompts_{c}.npy")
    np.save(prompts_path, prompts)
    for f in frameworks:
      if f == "ours":
        continue
      runners[f, c] = PeerProcess(f, pythons[f], ckpt, c, prompts_path,
                                  os.path.join(run_dir, f"{f}_{c}.log"),
                                  os.path.join(run_dir, f"{f}_{c}_work"))
      methods[f] = peer_phase_method(f)
    if "ours" in frameworks:
      runners["ours", c] = OursRunner(ckpt, c, prompts)
      methods["ours"] = OursRunner.phase_method

  records = {key: [] for key in runners}
  peaks, loads = [], []
  try:
    for r in range(total):
      for c in configs:
        for f in frameworks:
          rec = runners[f, c].step()
          records[f, c].append(rec)
          print(f"round {r} {f:5s} {c:5s} {rec['step_s']:7.2f} s  " + ", ".join(
              f"{k} {v:.2f}" for k, v in rec["phase_s"].items()), flush=True)
      peaks.append(matmul_peak_gflops())
      loads.append(os.getloadavg()[0])
      print(f"round {r}: f32 matmul peak {peaks[-1]:.1f} GFLOP/s, load {loads[-1]:.2f}",
            flush=True)
  finally:
    for runner in runners.values():
      runner.close()

  peak = max(peaks)
  from evotrainer.model.hf import config_from_hf
  model_config = config_from_hf(ckpt)
  rows = []
  for c in configs:
    flops = step_flops(model_config, CONFIGS[c][0] * CONFIGS[c][1])
    for f in frameworks:
      rows.append(summarize(f, c, records[f, c], args.warmup, flops, peak, methods[f]))
  ratios = {}
  if "ours" in frameworks:
    for c in configs:
      by = {row["framework"]: row for row in rows if row["config"] == c}
      ratios[c] = {f"ours/{f}": round(by["ours"]["tokens_per_s"] / by[f]["tokens_per_s"], 2)
                   for f in frameworks if f != "ours"}
  print_table(rows, ratios)
  write_json(args.json, {
      "benchmark": "rl_step",
      "rows": rows, "ratios": ratios,
      "peak_gflops_per_s": round(peak, 1),
      "peak_gflops_per_s_each_round": [round(x, 1) for x in peaks],
      "load_avg_1m_each_round": [round(x, 2) for x in loads],
      "steps": args.steps, "warmup": args.warmup,
      "setup": {"prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS,
                "configs": {c: {"prompts": CONFIGS[c][0], "samples": CONFIGS[c][1]}
                            for c in configs},
                "learning_rate": LEARNING_RATE, "kl_coef": KL_COEF, "dtype": "float32",
                "temperature": 1.0, "reward": "share of even ids in the completion",
                "model": {"vocab": VOCAB, "hidden": HIDDEN, "intermediate": INTER,
                          "layers": LAYERS, "heads": HEADS, "kv_heads": KV,
                          "head_dim": HEAD_DIM, "rope_theta": ROPE_THETA, "tied": False,
                          "num_params": model_config.num_params()},
                "versions": {"tunix": "google-tunix==0.1.7", "trl": "trl==1.16.0",
                             "torch (trl)": "2.13.0"}},
      "flops_formula": ("rollout = B * sum_t (flops_per_token(t + 1) - head) + B * (N + 1) * "
                        "head; reference = B * sum_t (flops_per_token(t + 1) - head) + B * N * "
                        "head; update = 3 * reference; t over the P + N positions"),
      "machine": machine()})


if __name__ == "__main__":
  main()
