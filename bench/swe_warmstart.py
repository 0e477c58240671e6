r"""SWE warm start: task set, tokenizer fit, warm-start time, and the warm-started model's
resolve rate on held-out tasks.

  python bench/swe_warmstart.py --json swe_warmstart.json [--gin_file=gin/swe_train.gin] \
      [--gin_bindings='warm_start.steps = 300'] [--k 2]

Builds `run.task` as the gin files bind it (the cached task set; `build_s` is the load
or the build), trains the tokenizer as `run` does (format_prompt + " " + solution of
`run.tokenizer_texts` training draws), reports tokens per oracle episode and byte-fallback
pieces, warm-starts (`warm_start.*`; `warm_start_s`), then plays `--k` episodes per
validation and test task with the warm-started policy and grades them in the sandbox.

`--cleared` plays the held-out tasks again on checkouts without history (with
gin/swe_leaky.gin and `SweDomain.demonstrations = 'history'`: the leak's worth).

Episodes are played by the multi-turn engine (`rollouts.multiturn.MultiTurnEngine`,
its budgets from gin's `TurnBudget`), as training and evaluation play them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from evotrainer import config as config_lib  # noqa: E402
from evotrainer import registry  # noqa: E402
from evotrainer.learner.warmstart import _completion_row, warm_start  # noqa: E402
from evotrainer.model.source import policy  # noqa: E402
from evotrainer.rollouts.multiturn import MultiTurnEngine  # noqa: E402
from evotrainer.sampling import Sampler, SamplingParams  # noqa: E402
from evotrainer.sharding.mesh import make_mesh  # noqa: E402
from evotrainer.sharding.rules import LEARNER_RULES  # noqa: E402
from evotrainer.tasks.swe.task import SweDomain  # noqa: E402


def play(model, tok, task, problems, k: int, seed: int, temperature: float):
  """k episodes per problem through the multi-turn engine (gin's `TurnBudget`)."""
  sampler = Sampler(model, pad_id=tok.pad_id, vocab_limit=tok.vocab_size
                    if tok.vocab_size < model.config.vocab_size else None)
  gen = MultiTurnEngine(task, tok, sampler)(
      nnx.state(model), problems, k, jax.random.key(seed),
      SamplingParams(temperature=temperature))
  parts = [{name: float(gen.part(name)[i]) for name in ("correct", "partial", "format",
                                                        "tool_validity")}
           for i in range(len(gen.infos))]
  return gen.infos, parts


def summarize(infos, parts) -> dict:
  n = len(parts)
  calls = [c for info in infos for c in info["tool_calls"]]
  turns = sum(info["turns"] for info in infos)
  return {"episodes": n,
          "resolved": sum(p["correct"] for p in parts) / n,
          "f2p_fraction": sum(p["partial"] for p in parts) / n,
          "format": sum(p["format"] for p in parts) / n,
          "tool_validity": sum(p["tool_validity"] for p in parts) / n,
          "valid_calls_per_turn": sum(c["ok"] for c in calls) / max(turns, 1),
          "parsed_calls_per_turn": len(calls) / max(turns, 1),
          # The first turn: its call parsed (`tools.parse_call`), and it also ran.
          "first_turn_parsed": sum(any(c["turn"] == 0 for c in info["tool_calls"])
                                   for info in infos) / n,
          "first_turn_valid": sum(any(c["turn"] == 0 and c["ok"] for c in info["tool_calls"])
                                  for info in infos) / n,
          "turns_mean": turns / n,
          "stops": dict(collections.Counter(str(info.get("stop")) for info in infos)),
          "tools": dict(collections.Counter(c["name"] for c in calls if c["ok"]))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--json", default="swe_warmstart.json")
  parser.add_argument("--gin_file", action="append", default=None)
  parser.add_argument("--gin_bindings", action="append", default=[])
  parser.add_argument("--k", type=int, default=2, help="episodes per held-out task")
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--cleared", action="store_true",
                      help="also play the held-out tasks on checkouts whose history is "
                           "cleared (SweDomain.checkout_options = {}): with "
                           "gin/swe_leaky.gin, the same policy without the leak")
  args = parser.parse_args()
  registry.parse(args.gin_file or ["gin/swe_train.gin"], args.gin_bindings)
  result: dict = {"config": vars(args)}
  start = time.monotonic()
  task = SweDomain()
  result["build_s"] = round(time.monotonic() - start, 1)
  result["tasks"] = {s: len(v) for s, v in task.splits.items()}
  result["task_set"] = task.task_set.stats
  texts = [task.format_prompt(p) + " " + p.solution
           for p in task.train_problems(config_lib.gin.query_parameter("run.tokenizer_texts"),
                                        0)]
  mesh = make_mesh()  # as `run` builds the policy: its warm-start cache entry is reused
  jax.set_mesh(mesh)
  model, tok = policy(texts, mesh, LEARNER_RULES)
  every = [p for ps in task.splits.values() for p in ps]
  lengths = [len(tok.encode(task.format_prompt(p), add_bos=True)) +
             len(_completion_row(tok, task.solution_segments(p))[0]) for p in every]
  pieces = [tok._sp.id_to_piece(i) for p in every for i in tok.encode(p.solution)]
  result["tokenizer"] = {
      "vocab": tok.vocab_size, "episode_tokens": {
          "min": min(lengths), "median": int(np.median(lengths)), "max": max(lengths)},
      "chars_per_token": round(sum(len(task.format_prompt(p)) + len(p.solution)
                                   for p in every) / sum(lengths), 2),
      "byte_fallback_share": round(sum(x.startswith("<0x") for x in pieces) / len(pieces), 4)}
  print(json.dumps(result), flush=True)
  steps = config_lib.gin.query_parameter("warm_start.steps")
  start = time.monotonic()
  model = warm_start(model, tok, task, seed=args.seed, mesh=mesh)
  result["warm_start"] = {"steps": steps, "seconds": round(time.monotonic() - start, 1)}
  print(json.dumps(result["warm_start"]), flush=True)
  passes = [""] + (["_cleared"] if args.cleared else [])
  for suffix in passes:
    if suffix:
      task.checkout_options = {}  # the same tasks, the history cleared
    for split in ("validation", "test"):
      start = time.monotonic()
      infos, parts = play(model, tok, task, task.heldout_problems(None, split), args.k,
                          args.seed, args.temperature)
      result[split + suffix] = {**summarize(infos, parts),
                                "seconds": round(time.monotonic() - start, 1)}
      print(split + suffix, json.dumps(result[split + suffix]), flush=True)
  task.close()
  with open(args.json, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
