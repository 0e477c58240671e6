r"""Multi-turn rollout engine throughput: KV-cache continuation vs re-prefill per turn,
and, with `--env_latency_s`, tools overlapping the sampler vs lock-step.

    python bench/multiturn.py --batch 16 64 --turns 4 --json multiturn.json
    python bench/multiturn.py --batch 16 64 --env_latency_s 0.5 --json overlap.json

The engine (`evotrainer/rollouts/multiturn.py`) runs on the tiny from-scratch model on
the CPU with a toy echo environment (`EchoTask`: the observation is a short digest of the
turn plus `--obs_chars` filler characters, no tools), every episode taking exactly
`--turns` turns, twice on the same keys (so on the same tokens): continuing each turn from
the previous turn's KV cache (`kv_continuation=True`, the default) and re-prefilling every
context every turn (`kv_continuation=False`). It then replays the sampler alone on the
same per-turn contexts: a whole turn (`--tokens_per_turn` tokens) and a 1-token turn
(prefill + first token, no decode loop). `prefill_share` = 1-token time / whole-turn
time is the share of the re-prefilling sampler's time spent re-reading contexts.

Reported per batch size: model tokens/s (sampled ids) and trajectory tokens/s (sampled +
observation ids) over each engine's wall time (best of `--repeats`), the speedup of
continuation, the sampler replay times, `prefill_share`, and the sampler's share of the
re-prefilling engine's wall time (the rest is host work: decoding, env threads, encoding,
padding).

With `--env_latency_s L` every `env.step` sleeps L seconds (a tool: SWE's steps take
0.16 s on average, up to 1.4 s for a sandboxed `run_tests`) and the bench instead times
the lock-step engine (`overlap_waves=1`) against `--overlap_waves` waves (default 2:
one wave's tools run on host threads while the sampler runs the other's turn), both
continuing from the KV cache, alternating, best of `--repeats`: episodes/s, model
tokens/s, the speedup, and the lock-step engine's seconds in env steps (turns x L). A
sleep takes no CPU; real tools (pytest in the sandbox) also compete for the sampler's
cores, so this is the overlap's best case on a CPU host.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Optional, Sequence

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine, median_time, write_json  # noqa: E402
from evotrainer.model import ModelConfig, Transformer  # noqa: E402
from evotrainer.rollouts.multiturn import MultiTurnEngine, TurnBudget  # noqa: E402
from evotrainer.sampling import Sampler, SamplingParams, left_pad  # noqa: E402
from evotrainer.tasks.base import Problem  # noqa: E402

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 +=!<>:.\n"


class CharTokenizer:
  """One id per character of `CHARS` after pad 0, bos 1, eos 2 (the stop id): a
  tokenizer whose ids a test can read by eye."""

  vocab_size = 3 + len(CHARS)
  bos_id, eos_id, pad_id = 1, 2, 0
  stop_ids = (2,)

  def encode(self, text: str, add_bos: bool = False) -> list:
    ids = [3 + CHARS.index(c) for c in text]
    return [self.bos_id] + ids if add_bos else ids

  def decode(self, ids: Sequence[int]) -> str:
    return "".join(CHARS[i - 3] for i in ids if i >= 3)


class EchoEnv:
  """Observation: the turn's length and first 4 characters; stops 'submitted' when the
  turn contains `submit_char` (None: never) or after `submit_at` turns (None: never)."""

  def __init__(self, submit_at: Optional[int] = None, submit_char: Optional[str] = "!"):
    self.submit_at = submit_at
    self.submit_char = submit_char
    self.texts: list = []
    self.stop: Optional[str] = None

  @property
  def done(self) -> bool:
    return self.stop is not None

  def step(self, text: str) -> str:
    self.texts.append(text)
    if (self.submit_char is not None and self.submit_char in text) or (
        self.submit_at is not None and len(self.texts) >= self.submit_at):
      self.stop = "submitted"
    return self.observe(text)

  @staticmethod
  def observe(text: str) -> str:
    return f"{len(text)}:{text[:4]}"

  def info(self) -> dict:
    return {"turns": len(self.texts), "env_stop": self.stop}


class EchoTask:
  """A toy multi-turn task: a few random letters as the question, an `EchoEnv` per
  episode (`env_factory(problem)` builds another), reward 1 for a submitted episode."""

  multi_turn = True

  def __init__(self, env_factory=None):
    self.env_factory = env_factory or (lambda problem: EchoEnv())

  def _problem(self, key: int) -> Problem:
    rng = random.Random(key)
    q = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 8)))
    return Problem(id=f"echo/{key}", prompt=q, answer="", solution="", source="echo")

  def train_problems(self, n: int, seed: int) -> list:
    return [self._problem(1000 + seed * 997 + i) for i in range(n)]

  def heldout_problems(self, n: Optional[int] = None, split: str = "validation") -> list:
    return [self._problem(i) for i in range(n or 8)]

  def format_prompt(self, problem: Problem) -> str:
    return f"q:{problem.prompt}\n"

  def format_observation(self, observation: str) -> str:
    return f"<{observation}>\n"

  def start_episode(self, problem: Problem):
    return self.env_factory(problem)

  def finish_episodes(self, problems: Sequence[Problem], envs: Sequence) -> list:
    return [{"correct": float(env.stop == "submitted"), "format": 0.0} for env in envs]

  def score(self, problem, completion):  # Task protocol; the rollout grades episodes
    raise NotImplementedError("EchoTask is graded by finish_episodes")

  def score_many(self, problems, completions):
    raise NotImplementedError("EchoTask is graded by finish_episodes")


def tiny_config(hidden: int = 32, layers: int = 2, max_positions: int = 256) -> ModelConfig:
  """A from-scratch decoder over `CharTokenizer`'s vocabulary."""
  return ModelConfig(vocab_size=CharTokenizer.vocab_size, hidden_size=hidden,
                     intermediate_size=2 * hidden, num_layers=layers, num_heads=4,
                     num_kv_heads=2, head_dim=hidden // 4, architecture="qwen3",
                     qk_norm=True, max_position_embeddings=max_positions)


def tiny_model(seed: int = 0, hidden: int = 32, layers: int = 2,
               max_positions: int = 256) -> Transformer:
  return Transformer(tiny_config(hidden, layers, max_positions), rngs=nnx.Rngs(seed))


class _PaddedEnv(EchoEnv):
  """An `EchoEnv` whose observations carry `obs_chars` filler characters more (a long
  tool output) and whose steps sleep `latency_s` (a slow tool)."""

  def __init__(self, obs_chars: int, latency_s: float = 0.0, **kw):
    super().__init__(**kw)
    self.obs_chars = obs_chars
    self.latency_s = latency_s

  def step(self, text: str) -> str:
    if self.latency_s:
      time.sleep(self.latency_s)
    return super().step(text) + "." * self.obs_chars


def _time_engines(rollouts: list, params, problems, sp, repeats: int) -> list:
  """One warm-up call each (compiles every width), then each engine's best of `repeats`
  timed calls, the engines alternating (a load change on a shared machine hits both):
  [(seconds, the last Generation)] per engine."""
  for rollout in rollouts:
    rollout(params, problems, 1, jax.random.key(0), sp)
  best, gens = [float("inf")] * len(rollouts), [None] * len(rollouts)
  for r in range(repeats):
    for j, rollout in enumerate(rollouts):
      t = time.perf_counter()
      gens[j] = rollout(params, problems, 1, jax.random.key(r + 1), sp)
      best[j] = min(best[j], time.perf_counter() - t)
  return list(zip(best, gens))


def measure(batch: int, turns: int, tokens_per_turn: int, max_context: int,
            repeats: int = 2, hidden: int = 32, layers: int = 2, obs_chars: int = 0) -> dict:
  """Both engines on the same keys (best of `repeats` timed calls each, alternating)."""
  tok = CharTokenizer()
  model = tiny_model(hidden=hidden, layers=layers, max_positions=max_context)
  sampler = Sampler(model, pad_id=tok.pad_id)
  task = EchoTask(lambda p: _PaddedEnv(obs_chars, submit_at=turns, submit_char=None))
  budget = TurnBudget(max_turns=turns, max_context=max_context,
                      max_tokens_per_turn=tokens_per_turn)
  params = nnx.state(model)
  problems = task.train_problems(batch, seed=0)
  sp = SamplingParams(temperature=1.0)
  rollout = MultiTurnEngine(task, tok, sampler, budget=budget, kv_continuation=False)
  (kv_s, kv_gen), (best, gen) = _time_engines(
      [MultiTurnEngine(task, tok, sampler, budget=budget), rollout], params, problems, sp,
      repeats)
  same = bool(np.array_equal(kv_gen.tokens, gen.tokens))
  model_tokens = int(gen.loss_mask.sum())
  # The sampler alone at the contexts this run sampled, turn by turn: a whole turn
  # (`tokens_per_turn` tokens, no stop ids) and a 1-token turn (the prefill and the
  # first token: no decode loop). Their ratio is the prefill share of the sampler's time.
  contexts = _turn_contexts(gen, tok)
  turn_s = _probe(sampler, params, contexts, tokens_per_turn, rollout.buckets, repeats)
  prefill_s = _probe(sampler, params, contexts, 1, rollout.buckets, repeats)
  return {"batch": batch, "turns": turns, "tokens_per_turn": tokens_per_turn,
          "obs_chars": obs_chars, "hidden": hidden, "layers": layers,
          "mean_context_tokens": round(float(np.mean(gen.prompt_lengths + gen.lengths)), 1),
          "same_tokens": same,
          "continuation": {"wall_s": round(kv_s, 4),
                           "model_tokens_per_s": round(model_tokens / kv_s, 1),
                           "trajectory_tokens_per_s": round(int(gen.lengths.sum()) / kv_s, 1)},
          "speedup_continuation": round(best / kv_s, 3),
          "wall_s": round(best, 4),
          "model_tokens": model_tokens, "trajectory_tokens": int(gen.lengths.sum()),
          "model_tokens_per_s": round(model_tokens / best, 1),
          "trajectory_tokens_per_s": round(int(gen.lengths.sum()) / best, 1),
          "sampler_turn_s": round(turn_s, 4), "sampler_prefill_s": round(prefill_s, 4),
          "prefill_share": round(prefill_s / turn_s, 3),
          "sampler_share_of_wall": round(turn_s / best, 3),
          "sampler_programs": sampler.compiled_programs()}


def measure_overlap(batch: int, turns: int, tokens_per_turn: int, max_context: int,
                    env_latency_s: float, waves: int = 2, repeats: int = 2, hidden: int = 32,
                    layers: int = 2, obs_chars: int = 0) -> dict:
  """Lock-step vs `waves` overlapping waves, every step sleeping `env_latency_s`."""
  tok = CharTokenizer()
  model = tiny_model(hidden=hidden, layers=layers, max_positions=max_context)
  sampler = Sampler(model, pad_id=tok.pad_id)
  task = EchoTask(lambda p: _PaddedEnv(obs_chars, env_latency_s, submit_at=turns,
                                       submit_char=None))
  budget = TurnBudget(max_turns=turns, max_context=max_context,
                      max_tokens_per_turn=tokens_per_turn)
  problems = task.train_problems(batch, seed=0)
  arms = {w: MultiTurnEngine(task, tok, sampler, budget=budget, overlap_waves=w)
          for w in (1, waves)}
  timed = _time_engines(list(arms.values()), nnx.state(model), problems,
                        SamplingParams(temperature=1.0), repeats)
  out = {"batch": batch, "turns": turns, "tokens_per_turn": tokens_per_turn,
         "env_latency_s": env_latency_s, "overlap_waves": waves, "hidden": hidden,
         "layers": layers, "env_s_lock_step": round(turns * env_latency_s, 3)}
  for name, (seconds, gen) in zip(("lock_step", "overlap"), timed):
    out[name] = {"wall_s": round(seconds, 4),
                 "episodes_per_s": round(batch / seconds, 2),
                 "model_tokens_per_s": round(int(gen.loss_mask.sum()) / seconds, 1)}
  out["speedup_overlap"] = round(timed[0][0] / timed[1][0], 3)
  out["sampler_programs"] = sampler.compiled_programs()
  return out


def _probe(sampler: Sampler, params, contexts: list, new_tokens: int, buckets, repeats: int
           ) -> float:
  """Seconds the sampler takes over `contexts` (one batch per turn) for `new_tokens`
  tokens a row (no stop ids: every row decodes them all); median of `repeats`."""
  sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
  total = 0.0
  for ctx in contexts:
    batch = left_pad(ctx, sampler.pad_id, buckets)
    call = lambda: sampler(params, batch, jax.random.key(0), stop_ids=None,
                           sampling=sp).tokens.block_until_ready()
    call()  # compile
    total += median_time(call, max(1, repeats))
  return total


def _turn_contexts(gen, tok: CharTokenizer) -> list:
  """The contexts each turn of `gen` was sampled from (prompt + trajectory before it)."""
  out = []
  turns = max(len(info["turn_spans"]) for info in gen.infos)
  for t in range(turns):
    ctx = []
    for i, info in enumerate(gen.infos):
      prompt = gen.prompt_tokens[i, -int(gen.prompt_lengths[i]):].tolist()
      spans = info["turn_spans"]  # a row stopped before turn t sampled a filler
      ctx.append(prompt + gen.tokens[i, :spans[t][0]].tolist() if t < len(spans)
                 else [tok.pad_id])
    out.append(ctx)
  return out


def main(argv: Optional[Sequence[str]] = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, nargs="+", default=[16, 64])
  ap.add_argument("--turns", type=int, default=4)
  ap.add_argument("--tokens_per_turn", type=int, default=32)
  ap.add_argument("--max_context", type=int, default=256)
  ap.add_argument("--obs_chars", type=int, default=0,
                  help="filler characters added to every observation (long tool output)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--hidden", type=int, default=32, help="model width (tiny: 32)")
  ap.add_argument("--layers", type=int, default=2, help="decoder layers (tiny: 2)")
  ap.add_argument("--env_latency_s", type=float, default=None,
                  help="every env step sleeps this long; times overlap vs lock-step instead")
  ap.add_argument("--overlap_waves", type=int, default=2,
                  help="waves of the overlapping engine (with --env_latency_s)")
  ap.add_argument("--json", default=None, help="write the JSON here too")
  args = ap.parse_args(argv)
  if args.env_latency_s is None:
    rows = [measure(b, args.turns, args.tokens_per_turn, args.max_context, args.repeats,
                    args.hidden, args.layers, args.obs_chars) for b in args.batch]
    mode = "KV continuation vs re-prefill per turn (the unprefixed figures)"
  else:
    rows = [measure_overlap(b, args.turns, args.tokens_per_turn, args.max_context,
                            args.env_latency_s, args.overlap_waves, args.repeats,
                            args.hidden, args.layers, args.obs_chars) for b in args.batch]
    mode = "env steps overlapping other waves' turns vs lock-step (both KV-continued)"
  payload = {"bench": "multiturn", "machine": machine(), "load": list(os.getloadavg()),
             "mode": mode, "results": rows}
  write_json(args.json, payload)
  return payload


if __name__ == "__main__":
  main()
