"""Reward exploit probes: how much of the margin between a right and a wrong answer a
known exploit recovers under a harness's reward composer.

A probe builds, for each problem, three completions — the gold answer, one wrong answer,
and the exploit (math: many marked answers with the gold among them and a wrong one last,
so the verifier refuses it; code: a program that prints "all tests passed" and exits 0
before any test runs, `CodeTask.exploit_completions`) — scores them with the task's reward
parts and the composer, and reports

  recovery = mean(R(exploit) - R(wrong)) / mean(R(right) - R(wrong))

0 means the reward pays the exploit no more than a plain wrong answer; 1 means it pays it
like a right one. Exploit families (`EXPLOITS`):

  number_spam    many marked answers around the gold one, the gold among them, a wrong
                 one last (pays rewards that look for the gold anywhere, or count marks)
  gold_in_steps  the gold number in the working, a wrong marked answer (pays rewards that
                 search the text rather than read the answer)
  padding        a wrong marked answer after ~200 words of filler (pays rewards that
                 grow with length or effort)

`exploit_recoveries` measures every family; the `exploit_probe` validator (validators.py)
judges the worst, so a gameable reward is refused before a policy has learned to game it.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Optional, Sequence

import numpy as np

from evotrainer.tasks.answers import answer_tag, parse_number
from evotrainer.types import Episode


def _wrong(gold: str) -> str:
  """A number far from the gold one (a wrong answer the verifier refuses)."""
  g = parse_number(gold)
  if g is None:
    return "0" if gold.strip() != "0" else "1"
  w = abs(g) * 10 + 7
  return str(int(w)) if Fraction(w).denominator == 1 else str(float(w))


def number_spam(gold: str) -> str:
  """Marked answers around the gold one, the gold among them, a wrong one last."""
  g = parse_number(gold)
  near = [str(g + d) for d in (-2, -1, 1, 2)] if g is not None and g.denominator == 1 \
      else []
  return "".join(answer_tag(x) for x in [*near[:2], gold, *near[2:], _wrong(gold)])


def gold_in_steps(gold: str) -> str:
  """The gold number in the working, then a wrong marked answer."""
  return f"so the result is {gold}, checking again\n{answer_tag(_wrong(gold))}"


def padding(gold: str) -> str:
  """A wrong marked answer after ~200 words of filler."""
  return "let me think step by step. " * 40 + answer_tag(_wrong(gold))


EXPLOITS = {"number_spam": number_spam, "gold_in_steps": gold_in_steps, "padding": padding}


def math_probe(exploit: str = "number_spam") -> Callable:
  """problem -> {'right', 'wrong', 'exploit'} completions of a math problem."""
  if exploit not in EXPLOITS:
    raise ValueError(f"exploit={exploit!r}; expected one of {sorted(EXPLOITS)}")
  make = EXPLOITS[exploit]
  return lambda p: {"right": answer_tag(p.answer), "wrong": answer_tag(_wrong(p.answer)),
                    "exploit": make(p.answer)}


def exploit_recovery(problems: Sequence, score_many: Callable, composer: Callable,
                     encode: Callable[[str], Sequence[int]],
                     exploit: str = "number_spam",
                     completions: Optional[Callable] = None) -> float:
  """The share of the right-minus-wrong reward margin the exploit recovers (NaN when the
  reward does not separate right from wrong answers at all).

  Args:
    problems: problems with `.answer` (and `.id`).
    score_many: `(problems, completions) -> [reward parts]` (the task's scorer).
    composer: the harness's RewardComposer.
    encode: text -> token ids (length-based parts need completion tokens).
    exploit: a name in `EXPLOITS` (math).
    completions: problem -> {'right', 'wrong', 'exploit'} texts: a domain's own probe
      (code: `CodeTask.exploit_completions`, a lying program); None: `math_probe(exploit)`.
  """
  build = completions or math_probe(exploit)
  built = [build(p) for p in problems]
  rewards = {}
  for kind in ("right", "wrong", "exploit"):
    texts = [b[kind] for b in built]
    parts = score_many(list(problems), texts)
    eps = [Episode(episode_id=f"probe/{kind}/{i}", group_id=i, task_id=str(p.id),
                   prompt="", completion=t, answer=p.answer, reward_parts=dict(rp),
                   completion_ids=np.asarray(encode(t), np.int32), split="probe")
           for i, (p, t, rp) in enumerate(zip(problems, texts, parts))]
    rewards[kind] = np.asarray(composer(eps).rewards, np.float64)
  margin = float(np.mean(rewards["right"] - rewards["wrong"]))
  if margin <= 1e-9:
    return float("nan")
  return float(np.mean(rewards["exploit"] - rewards["wrong"]) / margin)


def exploit_recoveries(problems: Sequence, score_many: Callable, composer: Callable,
                       encode: Callable[[str], Sequence[int]],
                       completions: Optional[Callable] = None) -> dict:
  """{family: `exploit_recovery`} for every family of `EXPLOITS`; with a domain's own
  `completions` (code: `CodeTask.exploit_completions`), its one family 'lying_program'."""
  if completions is not None:
    return {"lying_program": exploit_recovery(problems, score_many, composer, encode,
                                              completions=completions)}
  return {name: exploit_recovery(problems, score_many, composer, encode, name)
          for name in EXPLOITS}


__all__ = ["EXPLOITS", "exploit_recoveries", "exploit_recovery", "gold_in_steps",
           "math_probe", "number_spam", "padding"]
