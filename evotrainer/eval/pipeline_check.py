"""The evaluation pipeline's own check: run before an evolution trains anything and again
on every escalation (evolution/escalation.py). A failure stops the run with
`EvaluationPipelineError`: promotion statistics over a broken pipeline are meaningless.

`task_eval_check(task)` checks the domain's side, in the controller process (no JAX):
  verifier     every probe's known-correct completion scores `correct` 1, every
               known-wrong one 0. Probes come from `task.probe_completions(problems)`
               when the task has it, else `math_probes` (the reference solution, and the
               same solution with its tagged answer replaced by gold + 1).
  splits       train, validation and test are disjoint by normalized prompt (the whole
               validation and test sets against `train_draws` training draws).
The controller adds `repeatability` (evolution/controller.py): a branch's evaluation of
its parent at step 0, in another process, must equal the parent's own final evaluation.
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Callable, Optional, Sequence

from evotrainer.tasks.base import normalize_prompt
from evotrainer.tasks.answers import answer_tag


def _plus_one(gold: str) -> Optional[str]:
  """gold + 1 as text when gold is a plain number (None otherwise)."""
  try:
    v = Fraction(gold.strip().replace(",", "")) + 1
  except (ValueError, ZeroDivisionError):
    return None
  return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def math_probes(problems: Sequence) -> list[tuple]:
  """(problem, completion, is_correct) probes: each reference solution, and for numeric
  golds the same solution whose tagged answer is gold + 1 (its worked steps still show
  the right number: a verifier must read the answer, not search the text)."""
  out = []
  for p in problems:
    out.append((p, p.solution, True))
    wrong = _plus_one(p.answer)
    if wrong is not None:
      right_tag, wrong_tag = answer_tag(p.answer), answer_tag(wrong)
      out.append((p, p.solution.replace(right_tag, wrong_tag) if right_tag in p.solution
                  else wrong_tag, False))
  return out


def _verifier_problems(task, probes: int) -> list[str]:
  problems = task.heldout_problems(None, "validation")[:probes]
  hook = getattr(task, "probe_completions", None)
  cases = hook(problems) if hook is not None else math_probes(problems)
  if not cases:
    return ["no verifier probes (the task gave none)"]
  scores = task.score_many([p for p, _, _ in cases], [c for _, c, _ in cases])
  accepted = [p.id for (p, _, ok), s in zip(cases, scores)
              if not ok and s.get("correct", 0.0) >= 0.5]
  refused = [p.id for (p, _, ok), s in zip(cases, scores)
             if ok and s.get("correct", 0.0) < 0.5]
  n_wrong = sum(1 for _, _, ok in cases if not ok)
  out = []
  if accepted:
    out.append(f"the verifier accepts known-wrong answers on {len(accepted)} of {n_wrong} "
               f"probes (e.g. {accepted[0]})")
  if refused:
    out.append(f"the verifier refuses known-correct solutions on {len(refused)} of "
               f"{len(cases) - n_wrong} probes (e.g. {refused[0]})")
  return out


def _split_problems(task, train_draws: int, seed: int) -> tuple[list[str], dict]:
  sets = {"train": task.train_problems(train_draws, seed),
          "validation": task.heldout_problems(None, "validation"),
          "test": task.heldout_problems(None, "test")}
  prompts = {k: {normalize_prompt(p.prompt): p.id for p in v} for k, v in sets.items()}
  out = []
  for a, b in itertools.combinations(prompts, 2):
    shared = prompts[a].keys() & prompts[b].keys()
    if shared:
      example = min(shared)
      out.append(f"{len(shared)} prompts are in both {a} and {b} (e.g. {prompts[b][example]}: "
                 f"{example[:60]!r})")
  return out, {k: len(v) for k, v in prompts.items()}


def task_eval_check(task, *, probes: int = 16, train_draws: int = 1000,
                    seed: int = 12345) -> Callable[[], tuple[bool, str]]:
  """An `eval_check` (`() -> (ok, why)`) over `task`'s verifier and splits."""

  def check() -> tuple[bool, str]:
    problems = _verifier_problems(task, probes)
    split_problems, sizes = _split_problems(task, train_draws, seed)
    problems += split_problems
    if problems:
      return False, "; ".join(problems)
    return True, (f"verifier right on every known-correct and known-wrong probe of "
                  f"{probes} validation problems; "
                  f"train/validation/test disjoint over {sizes['train']}/"
                  f"{sizes['validation']}/{sizes['test']} distinct prompts")

  return check


def repeatability(pairs: Sequence[tuple[str, dict, dict]], tol: float = 1e-6) -> tuple[bool, str]:
  """(ok, why) over (version, its evaluation of the parent at step 0, the parent's own
  final evaluation): the same checkpoint, problems and sampling keys must give the same
  figures (keys avg*, pass*, greedy) within `tol`."""
  bad = []
  for vid, initial, final in pairs:
    for k in sorted(set(initial) & set(final)):
      if k.startswith(("avg", "pass", "greedy")) and abs(float(initial[k]) -
                                                         float(final[k])) > tol:
        bad.append(f"{vid} re-evaluated its parent's {k} as {float(initial[k]):.6f}, the "
                   f"parent's own evaluation gave {float(final[k]):.6f}")
  if bad:
    return False, f"evaluation not repeatable: {bad[0]} ({len(bad)} mismatches)"
  return True, f"evaluation repeatable on {len(pairs)} re-evaluated parents"


__all__ = ["math_probes", "repeatability", "task_eval_check"]
