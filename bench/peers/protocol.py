"""What every peer driver shares: arguments, the reward, the step gate, JSON-line output.

Runs inside the peers' own virtual environments (numpy only, no evotrainer import).

Protocol with `bench/rl_step.py` (stdout, one JSON object a line; stdin, one word a line):
  {"event": "ready", "step": i}     the driver is about to start step i and, when run
                                    with --gated, waits for "go" (or "stop") on stdin
  {"event": "step", "step": i, "step_s": ..., "phase_s": {...}, "prompt_tokens": ...,
   "completion_tokens": ..., "reward_mean": ...}
                                    step i's wall time: from the moment it was released
                                    to the moment the driver is ready for step i + 1 (or
                                    training returned), so everything the framework does
                                    per step counts
  {"event": "done"}
Anything else a framework prints goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Sequence

import numpy as np

# The real stdout carries the protocol; frameworks' own prints are sent to stderr.
_PROTOCOL_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
sys.stdout = sys.stderr


def parse_args(description: str) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--ckpt", required=True, help="HF checkpoint + tokenizer directory")
  ap.add_argument("--gguf_file", default=None,
                  help="a .gguf file in --ckpt: model and tokenizer come from it")
  ap.add_argument("--prompts", required=True,
                  help=".npy of [steps, G, P] prompt ids, or .json of [steps][G] prompt texts")
  ap.add_argument("--group_size", type=int, required=True, help="samples per prompt")
  ap.add_argument("--new_tokens", type=int, default=64)
  ap.add_argument("--learning_rate", type=float, default=1e-5)
  ap.add_argument("--kl_coef", type=float, default=0.04)
  ap.add_argument("--epsilon_high", type=float, default=None,
                  help="upper clip range (None: the framework's default)")
  ap.add_argument("--exact_new_tokens", action="store_true",
                  help="every row generates --new_tokens (EOS suppressed until then)")
  ap.add_argument("--micro_batch", type=int, default=None,
                  help="rows per gradient-accumulation micro-batch of the one update per "
                  "step (default: the whole batch at once)")
  ap.add_argument("--gated", action="store_true", help="wait for 'go' before every step")
  ap.add_argument("--workdir", default=None, help="scratch directory for the framework")
  return ap.parse_args()


def emit(**record) -> None:
  _PROTOCOL_OUT.write(json.dumps(record) + "\n")
  _PROTOCOL_OUT.flush()


def prompt_texts(prompts: np.ndarray) -> List[str]:
  """`[G, P]` ids -> texts of the token-id tokenizer ("12 7 4051 ...")."""
  return [" ".join(str(int(t)) for t in row) for row in prompts]


def load_prompt_texts(path: str) -> List[List[str]]:
  """`[steps][G]` prompt texts: a .json list of lists, or a .npy of `[steps, G, P]` ids
  (token-id texts, `prompt_texts`)."""
  if path.endswith(".json"):
    with open(path) as f:
      return json.load(f)
  return [prompt_texts(step) for step in np.load(path)]


def even_share_of_text(text: str) -> float:
  """The reward: share of even ids in a completion given as token-id text."""
  ids = [int(w) for w in text.split()]
  return float(np.mean([i % 2 == 0 for i in ids])) if ids else 0.0


class StepClock:
  """Gate before each step, per-step wall time and named phase times.

  `gate()` is called where the framework is about to start a step; it closes the
  previous step's record, emits "ready", waits for "go" when gated, and opens the next.
  `phase(name)` is a context manager adding to the current step's phase time.
  """

  def __init__(self, gated: bool, total_steps: int):
    self.gated = gated
    self.total_steps = total_steps
    self.step = -1
    self.t0 = 0.0
    self.phases: Dict[str, float] = {}
    self.extra: Dict[str, float] = {}

  def gate(self) -> None:
    self.close()
    nxt = self.step + 1
    if nxt >= self.total_steps:
      return
    emit(event="ready", step=nxt)
    if self.gated:
      word = sys.stdin.readline().strip()
      if word != "go":
        emit(event="done")
        os._exit(0)
    self.step = nxt
    self.phases = {}
    self.extra = {}
    self.t0 = time.perf_counter()

  def close(self) -> None:
    if self.step >= 0 and self.t0:
      emit(event="step", step=self.step, step_s=time.perf_counter() - self.t0,
           phase_s=self.phases, **self.extra)
      self.t0 = 0.0

  def add(self, name: str, seconds: float) -> None:
    self.phases[name] = self.phases.get(name, 0.0) + seconds

  def timed(self, name: str, fn, block=None):
    """Wraps `fn` so that each call's wall time (after `block(result)`) adds to `name`."""

    def wrapper(*args, **kwargs):
      t = time.perf_counter()
      out = fn(*args, **kwargs)
      if block is not None:
        block(out)
      self.add(name, time.perf_counter() - t)
      return out

    return wrapper
