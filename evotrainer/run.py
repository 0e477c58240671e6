"""Run modes, selected by `run.mode` in gin (the entry point is evotrainer/launch.py).

Modes:
  train    build the policy, warm-start a from-scratch model on solved examples
           (cached), then GRPO with the fixed default harness (evotrainer/train.py);
           writes summary.json with held-out figures before and after RL.
  branch   one branch of the evolution: start from `branch.parent` (a model saved by a
           previous branch; none = the warm-started root), train with the operative gin
           (the controller's bindings included), save the model to <workdir>/model and
           write <workdir>/branch_result.json (see `_branch_result`).
  evolve   the EvoTrainer loop (evotrainer/evolution/controller.py): every branch is a
           `branch`-mode child process from its parent's model, under the run's gin plus
           the branch's bindings; the ledger, skills and summary.json live in the workdir
           (a gs:// workdir: in its local mirror, uploaded with every ledger commit:
           evotrainer/evolution/ledger_mirror.py).
           Across several processes, process 0 runs the controller and every branch
           trains as one child per process (evotrainer/evolution/pod.py).
  sweep    the variants of a sweep file (`sweep.file`, evotrainer/evolution/sweep_file.py)
           as branches of one parent, verified like evolution branches, ranked in a table
           (terminal, summary.json 'sweep', report.html); same `evolve.*` knobs and ledger.
  ledger   print the ledger of the run in the workdir as a table.
  sample   build the policy, sample completions for held-out problems, score them.
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import gin

from evotrainer import paths
from evotrainer.config import CommandLine
from evotrainer.evolution.branch_result import BranchResult

MODES = ("train", "branch", "evolve", "sweep", "ledger", "sample")


def _print(msg: str = "") -> None:
  print(msg, flush=True)


def _write_summary(workdir: str, summary: dict) -> None:
  _write_json(paths.as_path(workdir) / "summary.json", summary)


@gin.configurable(module="run")
def branch(parent: str | None = None, version: str = "v0") -> dict:
  """gin knobs of `branch` mode: the parent model directory and this version's name."""
  return {"parent": parent, "version": version}


@gin.configurable(module="run")
def sweep(file: str | None = None, parent: str | None = None, backtest: bool = False) -> dict:
  """gin knobs of `sweep` mode (`--sweep_file` sets `sweep.file`).

  Args:
    file: the sweep file (format: evotrainer/evolution/sweep_file.py).
    parent: None: the parent of an earlier sweep in the workdir, else the ledger's
      incumbent, else the root trained from the warm start; a version id of the
      workdir's ledger; or a model directory (the root, evaluated as is).
    backtest: replay harness-side variants on the parent's stored rollouts first.
  """
  return {"file": file, "parent": parent, "backtest": backtest}


@gin.configurable(module="run", denylist=["command_line"])
def evolve(workdir: str, seed: int, *, space=gin.REQUIRED, generations: int = 4,
           branches: int = 2, branch_steps: int = 30, proposer: str = "skills",
           skills_dir: str | None = None, human_gated: bool = False,
           branch_timeout_s: float = 1800, resume_from: str | None = None,
           backtest: bool = True, control: bool = True, mode: str = "evolve",
           task=None, domain: str = "math", validators: list | None = None,
           diagnostics: list | None = None, continue_steps: int = 0, relative_health: bool = False,
           command_line: CommandLine | None = None) -> dict | None:
  """The evolution run (gin knobs `evolve.*`), or a sweep (`mode='sweep'`, `sweep.*`).

  Across several processes (evolution/pod.py) process 0 runs the controller and returns
  the summary; the others train their part of each branch and return None.

  Args:
    workdir: the run directory (ledger.sqlite, skills/, versions/<id>/, summary.json).
    seed: the run's seed (every branch of a generation uses the same one: common random
      numbers).
    space: the SearchSpace (gin/evolution/*.gin): the only bindings that may change.
    generations, branches: generations after the root, branches (K) per generation.
    branch_steps: RL steps of each branch (`train.steps` in the child).
    proposer: 'skills' (default), 'recipe' (hyper-parameters only), 'random', or 'proxy'
      (chases the proxy reward: harness-side changes ranked by the reward gain their
      backtest predicts; the hackable demo's proposer).
    skills_dir: a skills directory from an earlier run to start from (its skills are
      copied into this run's skills/ first), else the seed skills shipped with the package.
    human_gated: pause at the gates until <workdir>/approve exists.
    branch_timeout_s: wall-clock limit of one branch.
    resume_from: the workdir of an earlier sweep or evolution: a new workdir starts from
      a copy of its ledger (lineage, incumbent, harness) and its skills (`--resume_from`).
    backtest: replay each harness-side intervention (reward parts, filters, estimator)
      on the incumbent's stored rollouts before training it; one that fails the
      criterion of `controller.harness_backtester` is dropped.
    control: train a control branch per generation (the parent continued unchanged for
      the same steps) and credit each change against it (promotion.py).
    continue_steps: after each generation's verification, the incumbent trains this many
      more RL steps unchanged as version `v<g>.x`, promoted unless it is worse than its
      parent beyond noise or a validator fails (0: no continuation). The generation's
      trials (`branch_steps`) decide what to keep; the continuation deepens the lineage.
    mode: 'evolve', or 'sweep' (run.mode).
    task: the run's task (`run.task`, passed by `run`): its verifier and splits are
      checked before anything trains and on every escalation (eval/pipeline_check.py).
    domain: the domain skill outcomes are recorded under ('math', 'code').
    validators: the promotion gates (None: `harness_evolution.DEFAULT_VALIDATORS`).
    diagnostics: what diagnoses each generation's incumbent, whose findings the
      proposer acts on (None: `harness_evolution.DEFAULT_DIAGNOSTICS`).
    relative_health: health validators (training_stability, canary_prompts) veto a
      change only when its control did not fail them too, and never veto a control or
      continuation; every other validator always vetoes (Controller).
    command_line: what the launch's command line said (launch.py), replayed for every
      branch (None: no gin file, binding or flag); not a gin knob.

  The controller's other knobs are gin knobs of its parts' configs
  (evolution/controller.py): `VerifyConfig.alpha`, `.bootstrap_n`, `.collapse_fraction`,
  `.learn_skills`; `EscalationConfig.escalate_after`; `HarnessEvolutionConfig.
  gap_generations`, `.separation`, `.explain_tol`; `GateConfig.poll_s`, `.gate_timeout_s`.
  """
  from evotrainer.eval.pipeline_check import task_eval_check
  from evotrainer.evolution import pod
  from evotrainer.evolution.controller import Controller, no_eval_check
  from evotrainer.evolution.ledger_mirror import ledger_exists, open_ledger, push_run_files
  from evotrainer.evolution.skills import SEED_DIR, SkillLibrary
  from evotrainer.evolution.sweep import gin_harness_builder
  from evotrainer.evolution.trainer import SubprocessTrainer

  cli = command_line or CommandLine()
  trainer = SubprocessTrainer(
      list(cli.gin_files), [*cli.gin_bindings, f"train.steps = {int(branch_steps)}"],
      imports=list(cli.imports), timeout_s=branch_timeout_s, flags=list(cli.flags))
  hosts = pod.current()
  if hosts is not None and not hosts.leader:  # process 0 alone runs the controller
    pod.follow(trainer, hosts)
    return None
  if hosts is not None:  # every branch trains on all processes together
    trainer = pod.PodTrainer(trainer, hosts)
  # The controller works in a local directory: the workdir itself, or the local mirror
  # of a gs:// workdir, uploaded with every ledger commit (ledger_mirror.py).
  local = paths.mirror_dir(workdir)
  local.mkdir(parents=True, exist_ok=True)
  space.check_bindings_exist()
  if mode == "sweep":  # checked before the ledger is opened: a bad file writes nothing
    from evotrainer.evolution import sweep as sweep_lib
    cfg = sweep()
    if not cfg["file"]:
      raise sweep_lib.SweepError("run.mode='sweep' needs a sweep file: --sweep_file=PATH "
                                 "or sweep.file")
    variants = sweep_lib.load_sweep(cfg["file"])
    sweep_lib.check_variants(variants, space, space.current_values())
  if resume_from and not (paths.is_remote(workdir) and ledger_exists(workdir)):
    from evotrainer.evolution.sweep import start_from
    start_from(resume_from, local)
  with open_ledger(workdir, run_files=True) as ledger:
    sources = [s for s in (resume_from and pathlib.Path(resume_from) / "skills", skills_dir)
               if s] + [SEED_DIR]
    skills = SkillLibrary.seeded(local / "skills", sources=sources)
    controller = Controller(ledger, trainer, space, skills, workdir=local, domain=domain,
                            validators=validators, diagnostics=diagnostics,
                            branches=branches, generations=generations, seed=seed,
                            values=space.current_values(), proposer=proposer,
                            human_gated=human_gated, progress=True,
                            eval_check=task_eval_check(task) if task is not None
                            else no_eval_check,
                            strict_verify=getattr(task, "strict_verify", None),
                            control=control, continue_steps=continue_steps,
                            relative_health=relative_health,
                            harness_builder=gin_harness_builder() if backtest else None)
    try:
      if mode == "sweep":
        rows = sweep_lib.Sweep(controller, variants, parent=cfg["parent"],
                               backtest=cfg["backtest"], steps=branch_steps).run()
        _print(sweep_lib.format_table(rows))
      else:
        controller.run()
        _print(ledger.table())
    finally:  # what came after the last commit (the summary, the report, a failed log)
      push_run_files(workdir)
    incumbent = ledger.incumbent()
    summary = json.loads((local / "summary.json").read_text())
  _print(f"[evotrainer] incumbent {incumbent.id if incumbent else None}; "
         f"{len(summary.get('versions', []))} versions")
  return summary


@gin.configurable(module="run", denylist=["command_line"])
def run(workdir: str, *, mode: str = "train", seed: int = 0, task=gin.REQUIRED,
        num_problems: int = 16, samples_per_problem: int = 4, tokenizer_texts: int = 2000,
        warm_start: bool = True, sampling=None,
        command_line: CommandLine | None = None) -> dict:
  """Runs one mode and returns its summary (also written to `<workdir>/summary.json`).

  Args:
    workdir: run directory.
    mode: one of MODES.
    seed: seed of everything random in the run (model init, warm start, data, sampling).
    task: the domain (e.g. `@MathTask()`).
    num_problems, samples_per_problem: what `sample` mode shows.
    tokenizer_texts: training problems whose text trains a from-scratch tokenizer.
    warm_start: supervised warm start of a from-scratch model (`warm_start.*` knobs);
      ignored for a Hugging Face checkpoint.
    sampling: a `SamplingParams` (gin: `run.sampling = @SamplingParams()`).
    command_line: what the launch's command line said (launch.py); `evolve` and
      `sweep` replay it for every branch. Not a gin knob.
  """
  if mode not in MODES:
    raise ValueError(f"run.mode={mode!r}; expected one of {MODES}")
  if mode in ("evolve", "sweep"):  # the controller itself never touches JAX
    start = time.time()
    summary = evolve(workdir, seed, mode=mode, task=task, command_line=command_line)
    if summary is None:  # another process than 0 of a multi-process evolution
      return {}
    summary["wall_s"] = round(time.time() - start, 2)
    _write_summary(workdir, summary)
    return summary
  if mode == "ledger":
    from evotrainer.evolution.ledger_mirror import ledger_exists, open_ledger
    if not ledger_exists(workdir):  # never create one here
      raise FileNotFoundError(f"run.mode='ledger': no ledger.sqlite in {workdir}")
    with open_ledger(workdir) as ledger:
      _print(ledger.table())
    return {}
  import jax  # after flags: XLA_FLAGS set by the user apply

  from evotrainer import config as config_lib
  from evotrainer.model.source import policy
  from evotrainer.sampling import SamplingParams
  from evotrainer.sharding.mesh import make_mesh
  from evotrainer.sharding.multihost import check_agree, is_multiprocess, is_primary
  from evotrainer.sharding.rules import LEARNER_RULES
  from evotrainer.tokenizers import SentencePieceTokenizer

  start = time.time()
  sampling = sampling or SamplingParams()
  mesh = make_mesh()
  jax.set_mesh(mesh)
  _print(f"[evotrainer] mode={mode} workdir={workdir} devices={jax.device_count()} "
         f"mesh={dict(mesh.shape)}")
  # The tokenizer's text does not depend on the run seed: every run and every branch of
  # an evolution must share one vocabulary, or a parent's weights would mean nothing.
  train_problems = task.train_problems(tokenizer_texts, 0)
  texts = [task.format_prompt(p) + " " + p.solution for p in train_problems]
  model, tok = policy(texts, mesh, LEARNER_RULES)
  if hasattr(task, "use_tokenizer"):  # a multi-turn task renders in the tokenizer's layout
    task.use_tokenizer(tok)
  c = model.config
  if is_multiprocess():  # each host trained or read its tokenizer: one vocabulary for all
    from evotrainer.workdir import tokenizer_digest
    check_agree({"tokenizer_sha256_prefix": int(tokenizer_digest(tok)[:12], 16)},
                "the tokenizer")
  if mode in ("train", "branch") and is_primary():
    from evotrainer.workdir import check_built, tokenizer_digest
    # Weights mean nothing under another vocabulary or model: refused (workdir.py).
    # Precision and remat may change on a resume (a restore casts); the shape may not.
    check_built(workdir, tokenizer=tokenizer_digest(tok),
                model={k: v for k, v in c.__dict__.items()
                       if k not in ("param_dtype", "dtype", "remat")})
  scratch = isinstance(tok, SentencePieceTokenizer)
  _print(f"[evotrainer] policy: {c.architecture}, {c.num_layers} layers, d={c.hidden_size}, "
         f"{c.num_params() / 1e6:.2f}M parameters, tokenizer vocab {tok.vocab_size} "
         f"({'from scratch' if scratch else 'Hugging Face checkpoint'})")
  if mode in ("train", "branch"):
    _check_task(task, tok, c, sampling, train_problems)
  paths.makedirs(workdir)
  summary = {"mode": mode, "seed": seed,
             "model": {"architecture": c.architecture, "params": c.num_params(),
                       "source": "scratch" if scratch else "hf"}}
  if scratch and warm_start and not (mode == "branch" and branch()["parent"]):
    from evotrainer.learner.warmstart import warm_start as warm_start_fn
    t0 = time.time()
    model = warm_start_fn(model, tok, task, seed=seed, mesh=mesh)
    summary["warm_start_s"] = round(time.time() - t0, 2)
  if mode == "sample":
    summary["heldout"] = _sample(model, tok, task, mesh, seed, num_problems,
                                 samples_per_problem, sampling)
  elif mode == "branch":
    summary.update(_branch(workdir, model, tok, task, mesh, seed, sampling))
  else:
    from flax import nnx

    from evotrainer.eval.heldout import evaluate_test_split
    from evotrainer.train import train
    result = train(workdir, task, model, tok, mesh, seed=seed, sampling=sampling)
    summary.update({k: result[k] for k in ("steps", "initial", "final", "history")})
    i, f = result["initial"], result["final"]
    _print("[evotrainer] validation before -> after RL: " + ", ".join(
        f"{k} {i[k]:.3f} -> {f[k]:.3f}" for k in i))
    # The test split, reported only: the warm start (the model's own parameters are
    # untouched by training) and the trained policy, with the same keys.
    ti, _ = evaluate_test_split(result["rollout"], nnx.state(model), task)
    tf, tper = evaluate_test_split(result["rollout"], result["state"].params, task)
    if tf:
      summary["test"] = {"initial": ti, "final": tf, "per_problem": tper}
      _print("[evotrainer] test before -> after RL: " + ", ".join(
          f"{k} {ti[k]:.3f} -> {tf[k]:.3f}" for k in ti))
  summary["wall_s"] = round(time.time() - start, 2)
  if is_primary():  # the other processes of a multi-process run write no files
    config_lib.write_operative_config(workdir)
    _write_summary(workdir, summary)
    _print(f"[evotrainer] wrote {workdir}/summary.json and operative_config.gin")
  task.close()
  return summary


def _check_task(task, tok, config, sampling, train_problems) -> None:
  """Before any training: the splits the run reads are large enough, and every prompt
  it can see fits the model's positions with the completion budget (tasks/checks.py)."""
  from evotrainer.eval.heldout import EvalConfig
  from evotrainer.tasks.checks import check_prompt_lengths
  ev = EvalConfig()
  problems = [*getattr(task, "data_problems", list)(), *train_problems,
              *task.heldout_problems(ev.num_problems, split="validation")]
  if ev.num_test > 0:
    problems += task.heldout_problems(ev.num_test, split="test")
  check_prompt_lengths(problems, task.format_prompt, tok.encode,
                       max_positions=config.max_position_embeddings,
                       max_new_tokens=max(sampling.max_new_tokens, ev.max_new_tokens))


def _sample(model, tok, task, mesh, seed, num_problems, samples_per_problem, sampling) -> dict:
  """Samples and scores completions for held-out problems; prints a few."""
  import jax
  from flax import nnx

  from evotrainer.rollouts import rollout_for
  from evotrainer.sampling import Sampler

  vocab_limit = tok.vocab_size if tok.vocab_size < model.config.vocab_size else None
  rollout = rollout_for(task, tok, Sampler(model, pad_id=tok.pad_id, mesh=mesh,
                                           vocab_limit=vocab_limit))
  heldout = task.heldout_problems(num_problems)
  t0 = time.time()
  gen = rollout(nnx.state(model), heldout, samples_per_problem, jax.random.key(seed), sampling)
  correct, fmt = gen.part("correct"), gen.part("format")
  _print(f"[evotrainer] sampled {len(gen.texts)} completions ({int(gen.lengths.sum())} "
         f"tokens) in {time.time() - t0:.1f}s incl. compile")
  for i in range(0, min(len(gen.texts), 4 * samples_per_problem), samples_per_problem):
    _print(f"  prompt {task.format_prompt(gen.problems[i])!r} -> {gen.texts[i]!r} "
           f"(gold {gen.problems[i].answer}, {'correct' if correct[i] else 'wrong'})")
  _print(f"[evotrainer] held-out accuracy {correct.mean():.3f}, format rate {fmt.mean():.3f}")
  return {"problems": len(heldout), "samples_per_problem": samples_per_problem,
          "avg_correct": float(correct.mean()), "format_rate": float(fmt.mean()),
          "mean_length": float(gen.lengths.mean())}


def _branch(workdir, model, tok, task, mesh, seed, sampling) -> dict:
  """Trains one branch from its parent; returns (and writes) branch_result.json."""
  from flax import nnx

  from evotrainer import checkpoint
  from evotrainer.eval.heldout import canary_evaluation, evaluate_test_split
  from evotrainer.eval.test_scores import write_test_scores
  from evotrainer.rollouts.store import RolloutStore
  from evotrainer.sharding.multihost import is_primary
  from evotrainer.train import train

  cfg = branch()
  result_path = pathlib.Path(workdir) / "branch_result.json"
  if result_path.exists():  # finished before a crash of the caller: idempotent
    return BranchResult.read(workdir).to_json()
  parent_checkpoints = None
  if cfg["parent"]:
    checkpoint.restore_params_into(cfg["parent"], model)
    candidate = pathlib.Path(cfg["parent"]).parent / "checkpoints"
    parent_checkpoints = str(candidate) if candidate.is_dir() else None
  out = train(workdir, task, model, tok, mesh, seed=seed, sampling=sampling,
              version=cfg["version"], parent_checkpoints=parent_checkpoints)
  model_dir = pathlib.Path(workdir) / "model"
  if not model_dir.exists():
    nnx.update(model, out["state"].params)
    checkpoint.save_model(model_dir, model, metadata={"version": cfg["version"]})
  result = _branch_result(workdir, cfg["version"], out, str(model_dir),
                          RolloutStore(pathlib.Path(workdir) / "rollouts"))
  result.final.update(_exploit_recovery(task, tok))
  canary_figures, canary = canary_evaluation(out["rollout"], out["state"].params, task)
  result.final.update(canary_figures)
  result.canary.update(canary)
  figures, per_problem = evaluate_test_split(out["rollout"], out["state"].params, task)
  if not is_primary():  # process 0 writes the files of a multi-process branch
    return result.to_json()
  if figures:  # beside the result, never in it: the controller reads branch_result.json
    write_test_scores(workdir, cfg["version"], figures, per_problem)
  _write_json(result_path, result.to_json())
  return result.to_json()


def _write_json(path, data: dict) -> None:
  paths.write_atomic(path, json.dumps(data, indent=2) + "\n")


def _exploit_recovery(task, tok, num_problems: int = 64) -> dict:
  """What this branch's reward pays each exploit family (harness/probes.py; a task with
  `exploit_completions` brings its own, code's lying program): `exploit_recovery/<family>`,
  and `exploit_recovery`, the worst (NaN when the reward does not separate right from
  wrong), judged by the `exploit_probe` validator."""
  from evotrainer.harness.pipeline import Harness
  from evotrainer.harness.probes import exploit_recoveries
  each = exploit_recoveries(task.heldout_problems(num_problems), task.score_many,
                            Harness().composer, tok.encode,
                            completions=getattr(task, "exploit_completions", None))
  finite = [v for v in each.values() if not math.isnan(v)]
  return {"exploit_recovery": max(finite) if finite else math.nan,
          **{f"exploit_recovery/{k}": v for k, v in each.items()}}


# A branch's training series: {name: metrics.jsonl keys summed}, one value per step.
_SERIES = {"correct": ("correct",), "reward": ("reward",),
           "entropy": ("learner/entropy",), "length": ("length_mean",),
           "truncated": ("truncated",),
           "clip_frac": ("learner/clip_frac_low", "learner/clip_frac_high")}


def _branch_result(workdir, version, out, model_dir, store) -> BranchResult:
  """What the controller reads back: held-out figures with the per-problem scores a
  paired bootstrap needs, the training series (`_SERIES`: BC, proxy reward, entropy,
  length, truncation, clip fraction per step; None where a step lacks one), paths."""
  from evotrainer.eval.heldout import per_problem
  steps = store.steps(version, "heldout")
  final = store.read(version=version, step=steps[-1], split="heldout") if steps else []
  series: dict = {k: [] for k in _SERIES}
  metrics_path = pathlib.Path(workdir) / "metrics.jsonl"
  if metrics_path.exists():
    for line in metrics_path.read_text().splitlines():
      row = json.loads(line)
      if "reward" in row:  # a training step's row
        for name, keys in _SERIES.items():
          vals = [row.get(k) for k in keys]
          series[name].append(None if None in vals else float(sum(vals)))
  return BranchResult(version=version, steps=out["steps"], initial=out["initial"],
                      final=out["final"], checkpoint=model_dir,
                      rollouts=str(pathlib.Path(workdir) / "rollouts"),
                      per_problem=per_problem(final), series=series)
