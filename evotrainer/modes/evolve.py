"""`evolve` and `sweep` modes: the EvoTrainer loop (evotrainer/evolution/controller.py), or
the variants of a sweep file, every branch a `branch`-mode child process."""

from __future__ import annotations

import json
import os
import pathlib

import gin

from evotrainer import paths
from evotrainer.config import CommandLine, ConfigError
from evotrainer.modes.common import say
from evotrainer.modes.sweep import sweep


def loop_config(**knobs):
  """The controller's LoopConfig from the `evolve.*` knobs, checked before anything is
  written to the workdir: a bad value is a ConfigError (one line from the launcher)."""
  from evotrainer.evolution.controller import LoopConfig
  try:
    return LoopConfig(**knobs)
  except ValueError as e:
    raise ConfigError(f"evolve: {e}") from None


@gin.configurable(module="run",
                  denylist=["command_line", "workdir", "seed", "mode", "task"])
def evolve(workdir: str, seed: int, *, space=gin.REQUIRED, generations: int = 4,
           branches: int = 2, branch_steps: int = 30, proposer: str = "skills",
           skills_dir: str | None = None, human_gated: bool = False,
           branch_timeout_s: float = 1800, resume_from: str | None = None,
           backtest: bool = True, backtest_drops_inert: bool = True,
           control: bool = True, mode: str = "evolve",
           task=None, domain: str = "math", validators: list | None = None,
           diagnostics: list | None = None, continue_steps: int = 0,
           continue_keeps_best: bool = False, relative_health: bool = False,
           adopt_skills: int = 0, adopt_against: str = "control",
           adopt_step_gain: float = 0.0, adopt_discoveries: bool = False,
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
      criterion of `backtest.harness_backtester` is dropped.
    backtest_drops_inert: the backtest also drops a change that is inert on those
      rollouts (no stored row's keep or advantage moves: its branch would start training
      exactly like its parent). False keeps such changes, for a run that must train
      them (gin/math_hackable.gin: its gameable reward pays the tiny policy's stored
      completions like correctness does, and is only gamed once trained).
    control: train a control branch per generation (the parent continued unchanged for
      the same steps) and credit each change against it (promotion.py).
    continue_steps: after each generation's verification, the incumbent trains this many
      more RL steps unchanged as version `v<g>.x`, promoted unless it is worse than its
      parent beyond noise or a validator fails (0: no continuation). The generation's
      trials (`branch_steps`) decide what to keep; the continuation deepens the lineage.
    continue_keeps_best: the continuation ends on its best validated state, not its last
      (`train.keep_best` in its child; its evaluations every `train.eval_every` steps).
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
    adopt_skills: 0 (off), or N: the root starts from the skills (of `skills_dir` and the
      seed skills) whose effect in `domain`, pooled over at least N measurements from
      earlier runs, is better beyond noise, one per binding (Controller's LoopConfig).
    adopt_against: which of those measurements count: 'control' (measured against a
      control branch) or 'parent' (also against the branch's parent, a run with
      `control=False`: such an effect holds the gain of the branch's steps too).
    adopt_step_gain: taken off each effect measured against the parent before pooling:
      what the steps gain unchanged, from fixed-harness runs (`bench/step_gain.py`).
    adopt_discoveries: also count the keeps that learned a skill, recorded because they
      were good and so biased upward (default False: only measurements recorded
      whatever their outcome count).
    command_line: what the launch's command line said (launch.py), replayed for every
      branch (None: no gin file, binding or flag); not a gin knob.

  The controller's other knobs are gin knobs of its parts' configs
  (evolution/controller.py): `VerifyConfig.alpha`, `.bootstrap_n`, `.collapse_fraction`,
  `.learn_skills`; `EscalationConfig.escalate_after`; `HarnessEvolutionConfig.
  gap_generations`, `.separation`, `.explain_tol`; `GateConfig.poll_s`, `.gate_timeout_s`.
  """
  from evotrainer.eval.pipeline_check import task_eval_check
  from evotrainer.evolution import pod
  from evotrainer.evolution.backtest import harness_backtester
  from evotrainer.evolution.controller import Controller, no_eval_check
  from evotrainer.evolution.ledger.mirror import ledger_exists, open_ledger, push_run_files
  from evotrainer.evolution.skills import SEED_DIR, SkillLibrary
  from evotrainer.evolution.sweep import gin_harness_builder

  if skills_dir and not pathlib.Path(skills_dir).is_dir():
    raise ConfigError(f"evolve: skills_dir={skills_dir!r} is not a directory (a relative "
                      f"path is read from {os.getcwd()})")
  loop = loop_config(domain=domain, branches=branches, generations=generations, seed=seed,
                     proposer=proposer, control=control, continue_steps=continue_steps,
                     continue_keeps_best=continue_keeps_best, progress=True,
                     adopt_skills=adopt_skills, adopt_against=adopt_against,
                     adopt_step_gain=adopt_step_gain,
                     adopt_discoveries=adopt_discoveries)
  trainer = branch_trainer(command_line or CommandLine(), branch_steps, branch_timeout_s)
  hosts = pod.current()
  if hosts is not None and not hosts.leader:  # process 0 alone runs the controller
    pod.follow(trainer, hosts)
    return None
  if hosts is not None:  # every branch trains on all processes together
    trainer = pod.PodTrainer(trainer, hosts)
  # The controller works in a local directory: the workdir itself, or the local mirror
  # of a gs:// workdir, uploaded with every ledger commit (evolution/ledger/mirror.py).
  local = paths.mirror_dir(workdir)
  local.mkdir(parents=True, exist_ok=True)
  space.check_bindings_exist()
  if mode == "sweep":  # checked before the ledger is opened: a bad file writes nothing
    from evotrainer.evolution import sweep as sweep_lib
    cfg, variants = checked_sweep(space)
  if resume_from and not (paths.is_remote(workdir) and ledger_exists(workdir)):
    from evotrainer.evolution.sweep import start_from
    start_from(resume_from, local)
  backtester = (harness_backtester(gin_harness_builder(), drop_inert=backtest_drops_inert)
                if backtest else None)
  with open_ledger(workdir, run_files=True) as ledger:
    sources = [s for s in (resume_from and pathlib.Path(resume_from) / "skills", skills_dir)
               if s] + [SEED_DIR]
    skills = SkillLibrary.seeded(local / "skills", sources=sources)
    controller = Controller(ledger, trainer, space, skills, workdir=local, loop_config=loop,
                            validators=validators, diagnostics=diagnostics,
                            values=space.current_values(), human_gated=human_gated,
                            eval_check=task_eval_check(task) if task is not None
                            else no_eval_check,
                            strict_verify=getattr(task, "strict_verify", None),
                            relative_health=relative_health,
                            backtester=backtester)
    try:
      if mode == "sweep":
        rows = sweep_lib.Sweep(controller, variants, parent=cfg["parent"],
                               backtest=cfg["backtest"], steps=branch_steps).run()
        say(sweep_lib.format_table(rows))
      else:
        controller.run()
        say(ledger.table())
    finally:  # what came after the last commit (the summary, the report, a failed log)
      push_run_files(workdir)
    incumbent = ledger.incumbent()
    summary = json.loads((local / "summary.json").read_text())
  say(f"[evotrainer] incumbent {incumbent.id if incumbent else None}; "
      f"{len(summary.get('versions', []))} versions")
  return summary


def checked_sweep(space) -> tuple:
  """(the `sweep.*` knobs, the sweep file's variants), each variant checked against
  `space`: a missing or bad file is a SweepError before anything is written."""
  from evotrainer.evolution import sweep as sweep_lib
  cfg = sweep()
  if not cfg["file"]:
    raise sweep_lib.SweepError("run.mode='sweep' needs a sweep file: --sweep_file=PATH "
                               "or sweep.file")
  variants = sweep_lib.load_sweep(cfg["file"])
  sweep_lib.check_variants(variants, space, space.current_values())
  return cfg, variants


def branch_trainer(cli: CommandLine, branch_steps: int, timeout_s: float):
  """The trainer whose child processes see the parent's command line: its gin files, gin
  search paths, imports and flags, its bindings and then `train.steps = branch_steps`.
  A bad `branch_steps` or `timeout_s` is a ConfigError; a `train.steps` binding on the
  command line, which every branch overrides, is said once."""
  from evotrainer.evolution.trainer import SubprocessTrainer
  if isinstance(branch_steps, bool) or not isinstance(branch_steps, int) or branch_steps < 0:
    raise ConfigError(f"evolve: branch_steps={branch_steps!r}; expected a whole number "
                      f">= 0 (the RL steps of each branch; 0: evaluated and saved only)")
  if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
    raise ConfigError(f"evolve: branch_timeout_s={timeout_s!r}; expected seconds > 0")
  if any(_binds_train_steps(b) for b in cli.gin_bindings):
    say(f"[evolve] note: the command line's train.steps is replaced in every branch by "
        f"evolve.branch_steps = {branch_steps}")
  flags = [*cli.flags, *(f"--gin_search_paths={p}" for p in cli.gin_search_paths)]
  return SubprocessTrainer(
      list(cli.gin_files), [*cli.gin_bindings, f"train.steps = {int(branch_steps)}"],
      imports=list(cli.imports), timeout_s=timeout_s, flags=flags)


def _binds_train_steps(binding: str) -> bool:
  """Whether a `--gin_bindings` string sets `train.steps` (on any of its lines)."""
  return any(line.split("=", 1)[0].strip() == "train.steps"
             for line in binding.splitlines() if "=" in line)
