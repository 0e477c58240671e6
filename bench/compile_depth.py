"""Compile time against depth, layers unrolled vs `ModelConfig.scan_layers`: the
jitted forward (logits) and forward + backward (gradient of the mean log-likelihood,
the learner's shape of work) of a small decoder at 2, 8 and 16 layers, on the default
backend. Width barely matters to compile time; depth is what scan flattens.

  python bench/compile_depth.py [--json out.json] [--layers 2,8,16] [--remat]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from bench.common import machine, write_json
from evotrainer.model import ModelConfig, Transformer

BASE = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=32, architecture="qwen3",
                   qk_norm=True)


def compile_seconds(config: ModelConfig, batch: int, length: int) -> dict:
  """Seconds to lower + compile the forward and the forward + backward of `config`
  (abstract parameters: nothing is initialized or run)."""
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)

  def forward(s, t):
    return nnx.merge(graphdef, s).forward_logits(t)

  def loss(s, t):
    logp = jax.nn.log_softmax(forward(s, t)[:, :-1], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, t[:, 1:, None], axis=-1))

  out = {}
  for name, fn in (("forward_s", forward), ("grad_s", jax.grad(loss))):
    t0 = time.perf_counter()
    jax.jit(fn).lower(state, tokens).compile()
    out[name] = round(time.perf_counter() - t0, 3)
  return out


def main(argv: Optional[Sequence[str]] = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--layers", default="2,8,16")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--length", type=int, default=64)
  ap.add_argument("--remat", action="store_true")
  args = ap.parse_args(argv)
  rows = []
  for n in map(int, args.layers.split(",")):
    for scan in (False, True):
      config = dataclasses.replace(BASE, num_layers=n, scan_layers=scan, remat=args.remat)
      rows.append({"num_layers": n, "scan_layers": scan,
                   **compile_seconds(config, args.batch, args.length)})
      print(rows[-1], flush=True)
  result = {"bench": "compile_depth", "remat": args.remat, "batch": args.batch,
            "length": args.length, "backend": jax.default_backend(),
            "results": rows, "machine": machine()}
  write_json(args.json, result)
  return result


if __name__ == "__main__":
  main()
