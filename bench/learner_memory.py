"""The compiled learner step's memory against `Learner.logprob_chunk`, for a Qwen-size
vocabulary (151,936) and 8k completion tokens per micro-batch (8 rows x 1024), from XLA's
memory analysis on the default backend (nothing is allocated, so it runs on a laptop).

  python bench/learner_memory.py [--json out.json] [--chunks none,512,128,32]
"""

from __future__ import annotations

import argparse
import time

from bench.common import machine, write_json
from evotrainer.learner.memory import step_memory


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--vocab", type=int, default=151_936)
  ap.add_argument("--rows", type=int, default=8)
  ap.add_argument("--completion", type=int, default=1024)
  ap.add_argument("--chunks", default="none,512,128,32")
  args = ap.parse_args()
  rows = []
  for c in args.chunks.split(","):
    chunk = None if c == "none" else int(c)
    t = time.perf_counter()
    m = step_memory(vocab=args.vocab, rows=args.rows, completion=args.completion, chunk=chunk)
    rows.append({"logprob_chunk": chunk, "temp_gib": m["temp_bytes"] / 2**30,
                 "logits_gib": m["logits_bytes"] / 2**30,
                 "argument_gib": m["argument_bytes"] / 2**30,
                 "compile_s": time.perf_counter() - t})
    print(rows[-1], flush=True)
  write_json(args.json, {"bench": "learner_memory", "vocab": args.vocab, "rows": args.rows,
                         "completion": args.completion, "results": rows,
                         "machine": machine()})


if __name__ == "__main__":
  main()
