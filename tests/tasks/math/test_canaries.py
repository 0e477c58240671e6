"""Canary prompts: the shipped sets are right by an independent computation, never trained
on, and scored greedily by the strict verifier against the file's answer."""

import json
import re

import numpy as np
import pytest

from evotrainer.tasks.base import DataError, split_of
from evotrainer.tasks.math import canaries
from evotrainer.tasks.math.task import MathTask


def _by_hand(expr: str) -> int:
  """a±b±c left to right, by tokens (independent of the generator's `ast` evaluation)."""
  tokens = re.findall(r"[+-]|\d+", expr)
  total = int(tokens[0])
  for op, num in zip(tokens[1::2], tokens[2::2]):
    total = total + int(num) if op == "+" else total - int(num)
  return total


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_shipped_canaries_are_right_and_never_trained_on(difficulty):
  task = MathTask(sources=["tiny_arithmetic"], difficulty=difficulty, num_validation=500)
  rows = task.canary_problems()
  assert len(rows) == canaries.SIZE == 128
  assert len({r.prompt for r in rows}) == 128
  for r in rows:
    assert r.prompt.endswith("=") and int(r.answer) == _by_hand(r.prompt[:-1]), r
    assert split_of(r.prompt, 0.1, 0.1) == "validation"
  prompts = {r.prompt for r in rows}
  # disjoint from the main job's 500 validation problems and from training draws
  assert not prompts & {p.prompt for p in task.heldout_problems(500)}
  assert not prompts & {p.prompt for p in task.train_problems(20000, seed=0)}


def test_canary_knob_and_other_sources():
  assert MathTask(sources=["tiny_arithmetic"], canary_file=None).canary_problems() == []
  assert MathTask(sources=["chain_sum"]).canary_problems() == []
  # at other split fractions, canaries that would fall in train are dropped
  task = MathTask(sources=["tiny_arithmetic"], validation_fraction=0.05, test_fraction=0.1)
  kept = task.canary_problems()
  assert 0 < len(kept) < 128
  assert all(split_of(p.prompt, 0.05, 0.1) != "train" for p in kept)


def test_user_canary_file_and_bad_rows(tmp_path):
  good = tmp_path / "mine.jsonl"
  good.write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n\n" +
                  json.dumps({"prompt": "3+4=", "answer": " 7 "}) + "\n")
  task = MathTask(sources=["tiny_arithmetic"], canary_file=str(good), validation_fraction=0.4,
                  test_fraction=0.4)  # both prompts held out here
  assert [(p.prompt, p.answer) for p in task.canary_problems()] == [("2+2=", "4"), ("3+4=", "7")]
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n" +
                 json.dumps({"prompt": "3+4="}) + "\n")
  with pytest.raises(DataError, match=r"bad.jsonl:2: field 'answer'"):
    canaries.load_canaries(bad)


class _Gen:
  def __init__(self, texts):
    self.texts = texts


class _EchoRollout:
  """Answers each canary with `answer_for(problem)`; records the sampling it was given."""

  def __init__(self, answer_for):
    self.answer_for, self.calls = answer_for, []

  def __call__(self, params, problems, group, key, sampling, pad_rows_to=None):
    self.calls.append((group, sampling))
    return _Gen([self.answer_for(p) for p in problems])


def test_canary_evaluation_is_greedy_and_strict(tmp_path):
  from evotrainer.eval.heldout import canary_evaluation
  task = MathTask(sources=["tiny_arithmetic"], difficulty=1)
  rows = task.canary_problems()
  # right in tags for even rows; odd rows give the right number untagged (lenient
  # extraction would accept it: the strict check does not)
  texts = {p.id: (f"<answer>{p.answer}</answer>" if i % 2 == 0 else f"it is {p.answer}")
           for i, p in enumerate(rows)}
  rollout = _EchoRollout(lambda p: texts[p.id])
  figures, per = canary_evaluation(rollout, None, task)
  assert figures == {"canary_accuracy": 0.5, "canary_n": 128.0}
  assert [per[p.id] for p in rows[:4]] == [1.0, 0.0, 1.0, 0.0]
  assert all(group == 1 and sampling.greedy for group, sampling in rollout.calls)
  # graded against the file, not the problem generator: a corrupted answer in the
  # file makes a right completion wrong
  assert task.score(rows[1], texts[rows[1].id])["correct"] == 1.0  # the reward's lenience
  assert canary_evaluation(_EchoRollout(lambda p: "x"), None,
                           MathTask(sources=["chain_sum"])) == ({}, {})
