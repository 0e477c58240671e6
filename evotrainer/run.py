"""Run modes, selected by `run.mode` in gin (the entry point is evotrainer/launch.py); each
mode lives in evotrainer/modes/, and `run` builds what they share and dispatches.

Modes:
  train    build the policy, warm-start it on solved examples (`run.warm_start`,
           cached), then GRPO with the fixed default harness (evotrainer/train.py);
           writes summary.json with held-out figures before and after RL.
  branch   one branch of the evolution: start from `branch.parent` (a model saved by a
           previous branch; none = the warm-started root), train with the operative gin
           (the controller's bindings included), save the model to <workdir>/model and
           write <workdir>/branch_result.json (evotrainer/modes/branch.py).
  evolve   the EvoTrainer loop (evotrainer/evolution/controller.py): every branch is a
           `branch`-mode child process from its parent's model, under the run's gin plus
           the branch's bindings; the ledger, skills and summary.json live in the workdir
           (a gs:// workdir: in its local mirror, uploaded with every ledger commit:
           evotrainer/evolution/ledger/mirror.py).
           Across several processes, process 0 runs the controller and every branch
           trains as one child per process (evotrainer/evolution/pod.py).
  sweep    the variants of a sweep file (`sweep.file`, evotrainer/evolution/sweep_file.py)
           as branches of one parent, verified like evolution branches, ranked in a table
           (terminal, summary.json 'sweep', report.html); same `evolve.*` knobs and ledger.
  ledger   print the ledger of the run in the workdir as a table.
  sample   build the policy, sample completions for held-out problems, score them.
  test     score a model trained earlier (`test.model`: a version's export, a run's
           checkpoints) on the test split as a run scores its own; writes
           <workdir>/test_eval.json (evotrainer/modes/scoring.py).
"""

from __future__ import annotations

import time

import gin

from evotrainer import paths
from evotrainer.config import CommandLine
from evotrainer.modes.branch import branch, train_branch
from evotrainer.modes.common import say, write_summary
from evotrainer.modes.evolve import evolve
from evotrainer.modes.ledger import print_ledger
from evotrainer.modes.sample import sample
from evotrainer.modes.scoring import model_under_test, score_model
from evotrainer.modes.train import train_and_test

MODES = ("train", "branch", "evolve", "sweep", "ledger", "sample", "test")


@gin.configurable(module="run", denylist=["command_line", "workdir"])
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
    warm_start: supervised warm start of the policy on solved training problems
      (`warm_start.*` knobs). The pretrained model files (gin/model/hf.gin,
      gin/model/smollm2-135m.gin) turn it off; a pretrained policy that must first
      learn a syntax (gin/swe_smol_warm.gin) turns it back on, usually with
      `warm_start.top_layers`.
    sampling: a `SamplingParams` (gin: `run.sampling = @SamplingParams()`).
    command_line: what the launch's command line said (launch.py); `evolve` and
      `sweep` replay it for every branch. Not a gin knob.
  """
  if mode not in MODES:
    raise ValueError(f"run.mode={mode!r}; expected one of {MODES}")
  if mode in ("evolve", "sweep"):  # the controller itself never touches JAX
    return _run_evolution(workdir, seed, mode, task, command_line)
  if mode == "ledger":
    return print_ledger(workdir)
  import jax  # after flags: XLA_FLAGS set by the user apply

  from evotrainer import config as config_lib
  from evotrainer.sampling import SamplingParams
  from evotrainer.sharding.mesh import make_mesh
  from evotrainer.sharding.multihost import is_primary
  from evotrainer.tokenizers import SentencePieceTokenizer

  start = time.time()
  sampling = sampling or SamplingParams()
  mesh = make_mesh()
  jax.set_mesh(mesh)
  say(f"[evotrainer] mode={mode} workdir={workdir} devices={jax.device_count()} "
      f"mesh={dict(mesh.shape)}")
  # The tokenizer's text does not depend on the run seed: every run and every branch of
  # an evolution must share one vocabulary, or a parent's weights would mean nothing.
  train_problems = task.train_problems(tokenizer_texts, 0)
  model, tok = _policy(task, train_problems, mesh, workdir,
                       check_built=mode in ("train", "branch"))
  c = model.config
  scratch = isinstance(tok, SentencePieceTokenizer)
  say(f"[evotrainer] policy: {c.architecture}, {c.num_layers} layers, d={c.hidden_size}, "
      f"{c.num_params() / 1e6:.2f}M parameters, tokenizer vocab {tok.vocab_size} "
      f"({'from scratch' if scratch else 'Hugging Face checkpoint'})")
  if mode in ("train", "branch"):
    _check_task(task, tok, c, sampling, train_problems)
  paths.makedirs(workdir)
  summary = {"mode": mode, "seed": seed,
             "model": {"architecture": c.architecture, "params": c.num_params(),
                       "source": "scratch" if scratch else "hf"}}
  trained = ((mode == "branch" and branch()["parent"]) or
             (mode == "test" and model_under_test() is not None))
  if warm_start and not trained:  # a trained model's parameters replace the warm start
    from evotrainer.learner.warmstart import warm_start as warm_start_fn
    t0 = time.time()
    model = warm_start_fn(model, tok, task, seed=seed, mesh=mesh)
    summary["warm_start_s"] = round(time.time() - t0, 2)
  if mode == "sample":
    summary["heldout"] = sample(model, tok, task, mesh, seed, num_problems,
                                samples_per_problem, sampling)
  elif mode == "test":
    summary.update(score_model(workdir, model, tok, task, mesh))
  elif mode == "branch":
    summary.update(train_branch(workdir, model, tok, task, mesh, seed, sampling))
  else:
    summary.update(train_and_test(workdir, task, model, tok, mesh, seed, sampling))
  summary["wall_s"] = round(time.time() - start, 2)
  if is_primary():  # the other processes of a multi-process run write no files
    config_lib.write_operative_config(workdir)
    write_summary(workdir, summary)
    say(f"[evotrainer] wrote {workdir}/summary.json and operative_config.gin")
  task.close()
  return summary


def _run_evolution(workdir: str, seed: int, mode: str, task, command_line) -> dict:
  """`evolve` or `sweep` mode: the controller's summary (modes/evolve.py), written to
  `<workdir>/summary.json` by process 0; {} on the other processes."""
  start = time.time()
  summary = evolve(workdir, seed, mode=mode, task=task, command_line=command_line)
  if summary is None:  # another process than 0 of a multi-process evolution
    return {}
  # The controller's wall time counts every invocation of a resumed run; this one's is
  # the fallback.
  summary.setdefault("wall_s", round(time.time() - start, 2))
  write_summary(workdir, summary)
  return summary


def _policy(task, train_problems, mesh, workdir: str, check_built: bool) -> tuple:
  """(model, tokenizer) of the run, the tokenizer trained or read from `train_problems`'
  text (model/source.py); every process must hold the same vocabulary, and with
  `check_built` a workdir built for another vocabulary or model shape is refused."""
  from evotrainer.model.source import policy
  from evotrainer.sharding.multihost import check_agree, is_multiprocess, is_primary
  from evotrainer.sharding.rules import LEARNER_RULES
  from evotrainer.workdir import check_built as check_workdir, tokenizer_digest
  texts = [task.format_prompt(p) + " " + p.solution for p in train_problems]
  model, tok = policy(texts, mesh, LEARNER_RULES)
  if hasattr(task, "use_tokenizer"):  # a multi-turn task renders in the tokenizer's layout
    task.use_tokenizer(tok)
  if is_multiprocess():  # each host trained or read its tokenizer: one vocabulary for all
    check_agree({"tokenizer_sha256_prefix": int(tokenizer_digest(tok)[:12], 16)},
                "the tokenizer")
  if check_built and is_primary():
    # Weights mean nothing under another vocabulary or model: refused (workdir.py).
    # Precision and remat may change on a resume (a restore casts); the shape may not.
    check_workdir(workdir, tokenizer=tokenizer_digest(tok),
                  model={k: v for k, v in model.config.__dict__.items()
                         if k not in ("param_dtype", "dtype", "remat")})
  return model, tok


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
