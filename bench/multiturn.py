r"""Multi-turn rollout engine throughput: tokens/s and the prefill vs decode time share.

    python bench/multiturn.py --batch 16 64 --turns 4 --out multiturn.json

The engine (`evotrainer/rollouts/multiturn.py`) re-prefills every episode's whole
context (prompt + trajectory so far) at each turn. This bench runs it on the tiny
from-scratch model on the CPU with a toy echo environment (`EchoTask`: the observation
is a short digest of the turn, no tools, so the time measured is the sampler's), and
splits the sampler's time into prefill and decode by timing a 1-token turn (prefill +
one decode-free first token) at the same context widths. The prefill share is what
KV-cache continuation would save at most (it would prefill only the new observation).

Reported per batch size: model tokens/s (sampled ids), trajectory tokens/s (sampled +
observation ids), wall seconds of the measured call, turns, and `prefill_share`.
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

from bench.common import machine, write_json  # noqa: E402
from evotrainer.model import ModelConfig, Transformer  # noqa: E402
from evotrainer.rollouts.multiturn import MultiTurnRollout, TurnBudget  # noqa: E402
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
  turn contains '!' and (when `submit_at` is set) after that many turns."""

  def __init__(self, submit_at: Optional[int] = None):
    self.submit_at = submit_at
    self.texts: list = []
    self.stop: Optional[str] = None

  @property
  def done(self) -> bool:
    return self.stop is not None

  def step(self, text: str) -> str:
    self.texts.append(text)
    if "!" in text or (self.submit_at is not None and len(self.texts) >= self.submit_at):
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


def tiny_model(seed: int = 0, hidden: int = 32, layers: int = 2,
               max_positions: int = 256) -> Transformer:
  cfg = ModelConfig(vocab_size=CharTokenizer.vocab_size, hidden_size=hidden,
                    intermediate_size=2 * hidden, num_layers=layers, num_heads=4,
                    num_kv_heads=2, head_dim=hidden // 4, architecture="qwen3", qk_norm=True,
                    max_position_embeddings=max_positions)
  return Transformer(cfg, rngs=nnx.Rngs(seed))


def measure(batch: int, turns: int, tokens_per_turn: int, max_context: int,
            repeats: int = 2, hidden: int = 32, layers: int = 2) -> dict:
  """One warm-up call (compiles), then the best of `repeats` timed calls."""
  tok = CharTokenizer()
  model = tiny_model(hidden=hidden, layers=layers, max_positions=max_context)
  sampler = Sampler(model, pad_id=tok.pad_id)
  task = EchoTask(lambda p: EchoEnv(submit_at=turns))  # exactly `turns` turns
  budget = TurnBudget(max_turns=turns, max_context=max_context,
                      max_tokens_per_turn=tokens_per_turn)
  rollout = MultiTurnRollout(task, tok, sampler, budget=budget)
  params = nnx.state(model)
  problems = task.train_problems(batch, seed=0)
  sp = SamplingParams(temperature=1.0)
  rollout(params, problems, 1, jax.random.key(0), sp)  # compile every width
  best, gen = float("inf"), None
  for r in range(repeats):
    t = time.perf_counter()
    gen = rollout(params, problems, 1, jax.random.key(r + 1), sp)
    best = min(best, time.perf_counter() - t)
  model_tokens = int(gen.loss_mask.sum())
  # Prefill alone at the widths this run sampled: a 1-token turn over each turn's
  # contexts (prefill + the first token, no decode loop).
  one = SamplingParams(max_new_tokens=1, temperature=1.0)
  prefill = 0.0
  contexts = _turn_contexts(gen, tok)
  for ctx in contexts:  # compile
    sampler(params, left_pad(ctx, tok.pad_id, rollout.buckets), jax.random.key(0),
            stop_ids=tok.stop_ids, sampling=one).tokens.block_until_ready()
  for ctx in contexts:
    b = left_pad(ctx, tok.pad_id, rollout.buckets)
    t = time.perf_counter()
    sampler(params, b, jax.random.key(0), stop_ids=tok.stop_ids,
            sampling=one).tokens.block_until_ready()
    prefill += time.perf_counter() - t
  return {"batch": batch, "turns": turns, "tokens_per_turn": tokens_per_turn,
          "wall_s": round(best, 4), "model_tokens": model_tokens,
          "trajectory_tokens": int(gen.lengths.sum()),
          "model_tokens_per_s": round(model_tokens / best, 1),
          "trajectory_tokens_per_s": round(int(gen.lengths.sum()) / best, 1),
          "prefill_s": round(prefill, 4), "prefill_share": round(min(1.0, prefill / best), 3),
          "sampler_programs": sampler.compiled_programs()}


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
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--out", default=None, help="write the JSON here too")
  args = ap.parse_args(argv)
  rows = [measure(b, args.turns, args.tokens_per_turn, args.max_context, args.repeats)
          for b in args.batch]
  payload = {"bench": "multiturn", "machine": machine(), "mode": "re-prefill per turn",
             "results": rows}
  write_json(args.out, payload)
  return payload


if __name__ == "__main__":
  main()
