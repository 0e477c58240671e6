"""MathTask: procedural and JSONL sources, splits, prompts and scoring."""

import json
import logging
import re
import statistics
from fractions import Fraction

import gin
import pytest

from evotrainer.tasks.base import Problem, Task, check_disjoint, split_of
from evotrainer.tasks.math.task import (HELDOUT_KEYS, PROCEDURAL_SOURCES, MathTask, load_jsonl,
                                        procedural_problem)
from evotrainer.tasks.math.verify import VerifierPool



@pytest.fixture(scope="module")
def pool():
  with VerifierPool(num_workers=1, timeout_s=10.0) as p:
    yield p


def _fraction_eval(expression: str) -> Fraction:
  """Reference evaluator for the tests: Python's own arithmetic on Fractions."""
  fractions_only = re.sub(r"(\d+)", r"Fraction(\1)", expression)
  return eval(fractions_only, {"Fraction": Fraction})  # pylint: disable=eval-used


def _write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


# ------------------------------------------------------------------ procedural sources


@pytest.mark.parametrize("source", PROCEDURAL_SOURCES)
@pytest.mark.parametrize("difficulty", [1, 3])
def test_gold_scores_correct_and_gold_plus_one_wrong(source, difficulty, pool):
  task = MathTask(sources=[source], difficulty=difficulty, num_validation=6, verifier=pool)
  assert isinstance(task, Task)
  problems = task.heldout_problems() + task.train_problems(6, seed=1)
  assert len(problems) == 12
  gold = task.score_many(problems, [f"<answer>{p.answer}</answer>" for p in problems])
  assert all(g == {"correct": 1.0, "format": 1.0, "partial": 1.0, "contains": 1.0,
                  "n_candidates": 1.0, "malformed": 0.0} for g in gold), gold
  # The warm-start solution ends in the same format and is graded correct too.
  assert all(s["correct"] == 1.0 and s["format"] == 1.0
             for s in task.score_many(problems, [p.solution for p in problems]))
  plus_one = [str(Fraction(p.answer) + 1) for p in problems]
  wrong = task.score_many(problems, [f"<answer>{a}</answer>" for a in plus_one])
  for p, w in zip(problems, wrong):
    assert w["correct"] == 0.0 and w["format"] == 1.0 and w["contains"] == 0.0
    assert w["partial"] == pytest.approx(1 / (1 + 1 / max(1, abs(float(p.answer)))))


def test_tiny_arithmetic_gold_matches_prompt():
  for difficulty, n_ops in ((1, 1), (2, 1), (3, 2)):
    for key in range(50):
      p = procedural_problem("tiny_arithmetic", difficulty, key)
      assert p.prompt.endswith("=") and len(p.prompt) <= 10
      expr = p.prompt[:-1]
      assert len(re.findall(r"[+-]", expr)) == n_ops
      assert int(p.answer) == eval(expr)  # pylint: disable=eval-used
      assert p.solution == f"<answer>{p.answer}</answer>"
      if difficulty == 1:
        assert "+" in expr
      if difficulty == 2:
        assert int(p.answer) >= 0


@pytest.mark.parametrize("source", ["basic_arithmetic", "chain_sum"])
def test_arithmetic_gold_matches_expression_in_prompt(source):
  for difficulty in (1, 2, 3):
    for key in range(HELDOUT_KEYS, HELDOUT_KEYS + 30):
      p = procedural_problem(source, difficulty, key)
      if p is None:  # inexact division: rejected by the source's own check
        continue
      expr = re.search(r"(?:Calculate|problem:)\s*(.*?)\s*[.=]?$", p.prompt).group(1)
      assert _fraction_eval(expr) == Fraction(p.answer), p


def test_simple_equations_gold_solves_equation():
  for difficulty in (1, 2, 3):
    for key in range(20):
      p = procedural_problem("simple_equations", difficulty, key)
      var = re.search(r"(?:for|of) ([a-z])\b", p.prompt).group(1)
      lhs, rhs = p.meta["equation"].split("=")
      plug = lambda side: _fraction_eval(re.sub(rf"\b{var}\b", f"({p.answer})", side))  # noqa: E731
      assert plug(lhs) == plug(rhs), p


def test_difficulty_changes_the_problems():
  def heldout(source, d, n=30):
    return MathTask(sources=[source], difficulty=d, num_validation=n).heldout_problems()

  def magnitudes(problems):
    return max(abs(int(x)) for p in problems for x in re.findall(r"\d+", p.prompt))

  def n_terms(problems):
    return [len(re.findall(r"\d+", p.prompt)) for p in problems]

  for source in PROCEDURAL_SOURCES:
    one, three = heldout(source, 1), heldout(source, 3)
    assert {p.prompt for p in one}.isdisjoint({p.prompt for p in three}), source
  assert all(n == 2 for n in n_terms(heldout("tiny_arithmetic", 1)))
  assert all(n == 3 for n in n_terms(heldout("tiny_arithmetic", 3)))
  assert all(n == 2 for n in n_terms(heldout("chain_sum", 1)))
  assert min(n_terms(heldout("chain_sum", 3))) >= 4
  assert magnitudes(heldout("chain_sum", 1)) <= 9
  assert magnitudes(heldout("chain_sum", 3)) >= 100
  assert magnitudes(heldout("basic_arithmetic", 1)) <= 9
  assert magnitudes(heldout("basic_arithmetic", 3)) >= 100
  # gsm_symbolic: disjoint template tiers, longer worked solutions at level 3.
  g1, g3 = heldout("gsm_symbolic", 1), heldout("gsm_symbolic", 3)
  assert {p.meta["template"] for p in g1}.isdisjoint({p.meta["template"] for p in g3})
  steps = lambda ps: statistics.mean(p.solution.count("\n") for p in ps)  # noqa: E731
  assert steps(g1) + 1 < steps(g3)


# ------------------------------------------------------------------ splits


def test_train_validation_test_disjoint_by_prompt_and_deterministic():
  task = MathTask(sources=["tiny_arithmetic"], difficulty=1, num_validation=300,
                  num_test=300)
  held = task.heldout_problems()
  test = task.heldout_problems(split="test")
  assert len(held) == 300 and len({p.prompt for p in held}) == 300
  assert len(test) == 300 and len({p.prompt for p in test}) == 300
  assert all(p.meta["key"] < HELDOUT_KEYS for p in held + test)
  check_disjoint(held, test)
  # 6000 draws from 10k possible sums: a key-based split would train on ~20% of all
  # validation and test prompts, selected or not; by prompt hash none is ever drawn.
  train = task.train_problems(6000, seed=7)
  assert all(p.meta["key"] >= HELDOUT_KEYS for p in train)
  check_disjoint(train, held)
  check_disjoint(train, test)
  # Not just the selected problems: no training prompt hashes to validation or test.
  assert {split_of(p.prompt, 0.1, 0.1) for p in train} == {"train"}
  reserved = {p.prompt for p in (procedural_problem("tiny_arithmetic", 1, k)
                                 for k in range(3000, 4000))
              if split_of(p.prompt, 0.1, 0.1) != "train"}
  assert 100 < len(reserved) < 300 and not reserved & {p.prompt for p in train}
  again = MathTask(sources=["tiny_arithmetic"], difficulty=1, num_validation=300)
  assert again.heldout_problems(10) == held[:10]
  assert again.train_problems(20, seed=7) == train[:20]
  assert again.train_problems(20, seed=8) != train[:20]


def test_check_disjoint_catches_overlap_modulo_case_and_spaces():
  a = Problem("a", "What is  2+2?", "4", "", "x")
  b = Problem("b", "what is 2+2? ", "4", "", "x")
  c = Problem("c", "What is 3+3?", "6", "", "x")
  check_disjoint([c], [a])
  with pytest.raises(ValueError, match="'b'.*'a'"):
    check_disjoint([c, b], [a])


def test_mixture_heldout_uses_every_source_and_train_weights():
  task = MathTask(sources=["tiny_arithmetic", "chain_sum"], weights=[3, 1], num_validation=80)
  held = task.heldout_problems()
  assert {p.source for p in held} == {"tiny_arithmetic", "chain_sum"}
  train = task.train_problems(400, seed=0)
  share = sum(p.source == "tiny_arithmetic" for p in train) / 400
  assert 0.68 < share < 0.82
  check_disjoint(train, held)
  with pytest.raises(ValueError, match="num_validation"):
    task.heldout_problems(81)
  with pytest.raises(ValueError, match="split must be one of"):
    task.heldout_problems(1, split="train")


# ------------------------------------------------------------------ JSONL


GSM_GOOD = {"question": "Natalia sold 48 clips in April and half as many in May. "
                        "How many in total?",
            "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n"
                      "In total 48+24 = <<48+24=72>>72 clips.\n#### 72"}
GSM_COMMA = {"question": "A car costs 1,000 dollars. What does it cost?",
             "answer": "It costs 1,000.\n#### 1,000"}


def test_gsm8k_jsonl_skip_reports_file_and_line(tmp_path, caplog):
  path = _write(tmp_path / "gsm.jsonl", [
      GSM_GOOD,
      '{"question": "broken", ',                       # line 2: not JSON
      {"question": "No hashes?", "answer": "42"},     # line 3: no ####
      "",                                             # line 4: blank, ignored
      GSM_COMMA,                                      # line 5
      {"foo": 1},                                     # line 6: neither form
  ])
  with caplog.at_level(logging.WARNING):
    data = load_jsonl(path, on_bad_row="skip")
  assert [p.answer for p in data.problems] == ["72", "1000"]
  assert [p.id for p in data.problems] == ["gsm.jsonl:1", "gsm.jsonl:5"]
  assert len(data.bad_rows) == 3
  assert data.bad_rows[0].startswith(f"{path}:2: not valid JSON")
  assert data.bad_rows[1].startswith(f"{path}:3: GSM8K row")
  assert data.bad_rows[2].startswith(f"{path}:6: expected GSM8K fields")
  assert f"{path}:3:" in caplog.text
  first = data.problems[0]
  assert first.source == "gsm8k" and first.meta["line"] == 1
  assert first.solution == ("In May she sold 48/2 = 24 clips.\nIn total 48+24 = 72 clips.\n"
                            "<answer>72</answer>")


def test_jsonl_error_mode_raises_with_file_and_line(tmp_path):
  path = _write(tmp_path / "gsm.jsonl", [GSM_GOOD, GSM_GOOD, {"question": "q", "answer": 5}])
  with pytest.raises(ValueError, match=re.escape(f"{path}:3: field 'answer'")):
    load_jsonl(path, on_bad_row="error")
  with pytest.raises(ValueError, match="on_bad_row"):
    load_jsonl(path, on_bad_row="ignore")


def test_math_jsonl_rows(tmp_path):
  path = _write(tmp_path / "math.jsonl", [
      {"problem": "Compute $\\frac{2}{4}$.", "level": "Level 3", "type": "Algebra",
       "solution": "Reduce: $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$."},
      {"problem": "What is $2^{10}$?", "solution": "It is 1024.", "answer": "1024"},
      {"problem": "Unanswered?", "solution": "No box here."},
  ])
  with pytest.raises(ValueError, match=re.escape(f"{path}:3: MATH row: no \\boxed")):
    load_jsonl(path, on_bad_row="error")
  data = load_jsonl(path)
  assert [(p.answer, p.difficulty, p.source) for p in data.problems] == [
      ("\\frac{1}{2}", 3, "math"), ("1024", 0, "math")]
  assert data.problems[0].meta["type"] == "Algebra"
  assert data.problems[0].solution.endswith("\n<answer>\\frac{1}{2}</answer>")
  assert data.bad_rows == [f"{path}:3: MATH row: no \\boxed{{...}} answer in 'solution' "
                           f"and no 'answer' field"]


def test_empty_or_all_bad_jsonl_is_a_clear_error(tmp_path):
  empty = _write(tmp_path / "empty.jsonl", ["", "  "])
  with pytest.raises(ValueError, match=re.escape(f"{empty}: no usable problems") + ".*empty"):
    load_jsonl(empty)
  bad = _write(tmp_path / "bad.jsonl", ["[1, 2]"])
  with pytest.raises(ValueError, match=re.escape(f"first: {bad}:1: expected a JSON object")):
    load_jsonl(bad)
  with pytest.raises(ValueError, match="no usable problems"):
    MathTask(jsonl_files=[str(empty)])
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    load_jsonl(tmp_path / "nope.jsonl")


def test_jsonl_task_test_file_and_hash_split(tmp_path):
  rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i}+{i}\n#### {2 * i}"}
          for i in range(40)]
  train_path = _write(tmp_path / "train.jsonl", rows)
  # The test file repeats train row 5 with other case and spacing.
  held_path = _write(tmp_path / "test.jsonl", [
      {"question": "WHAT is 5   plus 5?", "answer": "#### 10"},
      {"question": "What is 100 plus 100?", "answer": "#### 200"}])
  task = MathTask(jsonl_files=[str(train_path)], test_jsonl_files=[str(held_path)],
                  validation_fraction=0.01, test_fraction=0.01)
  held = task.heldout_problems(split="test")
  assert {"10", "200"} <= {p.answer for p in held}
  train = task.train_problems(500, seed=0)
  assert "What is 5 plus 5?" not in {p.prompt for p in train}
  assert len({p.prompt for p in train}) + len(held) - 1 + len(task.heldout_problems()) == 40
  check_disjoint(train, held)

  # Hash split; every row also appears shouted, and both copies must land on one side.
  dup_path = _write(tmp_path / "dup.jsonl",
                    rows + [dict(r, question=r["question"].upper()) for r in rows])
  split = MathTask(jsonl_files=[str(dup_path)], validation_fraction=0.3, test_fraction=0.3)
  held, test = split.heldout_problems(), split.heldout_problems(split="test")
  train = split.train_problems(2000, seed=0)
  assert 3 <= len(held) <= 21 and 3 <= len(test) <= 21  # one copy of each question
  assert len(held) + len(test) + len({p.prompt.lower() for p in train}) == 40
  check_disjoint(train, held)
  check_disjoint(train, test)
  check_disjoint(held, test)
  assert split.heldout_problems() == MathTask(
      jsonl_files=[str(dup_path)], validation_fraction=0.3,
      test_fraction=0.3).heldout_problems()


def test_jsonl_scoring_uses_math_verify(tmp_path, pool):
  path = _write(tmp_path / "math.jsonl", [
      {"problem": f"Problem {i}", "solution": "\\boxed{\\frac{1}{2}}"} for i in range(4)])
  task = MathTask(jsonl_files=[str(path)], validation_fraction=0.01, test_fraction=0.01,
                  verifier=pool)
  p = task.train_problems(1, seed=0)[0]
  parts = task.score_many([p, p, p], ["<answer>0.5</answer>", "<answer>\\frac{1}{3}</answer>",
                                      "so \\boxed{1/2}"])
  assert [s["correct"] for s in parts] == [1.0, 0.0, 1.0]
  assert [s["format"] for s in parts] == [1.0, 1.0, 0.0]
  assert parts[1]["partial"] == 0.0  # non-numeric gold: no closeness credit


# ------------------------------------------------------------------ scoring and prompts


def test_score_parts_by_hand(pool):
  task = MathTask(verifier=pool)
  p = Problem("t", "7+3=", "10", "<answer>10</answer>", "tiny_arithmetic", 1)
  assert task.score(p, "<answer>12</answer>") == {
      "correct": 0.0, "format": 1.0, "partial": pytest.approx(1 / 1.2), "contains": 0.0,
      "n_candidates": 1.0, "malformed": 0.0}
  assert task.score(p, "10") == {"correct": 1.0, "format": 0.0, "partial": 1.0,
                                 "contains": 1.0, "n_candidates": 1.0, "malformed": 0.0}
  assert task.score(p, "no idea") == {"correct": 0.0, "format": 0.0, "partial": 0.0,
                                      "contains": 0.0, "n_candidates": 0.0, "malformed": 0.0}
  spam = task.score(p, "<answer>9</answer><answer>11</answer><answer>10</answer>")
  assert spam["correct"] == 1.0 and spam["n_candidates"] == 3.0
  # `contains` pays the gold anywhere: a wrong last answer, 110 and 1.0 do not count.
  assert task.score(p, "<answer>10</answer><answer>9</answer>")["contains"] == 1.0
  assert task.score(p, "110 1.0 -10 <answer>9</answer>")["contains"] == 0.0
  assert task.score(p, "7+3 = 10.0, so <answer>9</answer>")["contains"] == 1.0
  strict = MathTask(verifier=pool, answer_methods=("answer_tag",))
  assert strict.score(p, "10")["correct"] == 0.0
  with pytest.raises(ValueError, match="2 problems but 1"):
    task.score_many([p, p], ["x"])


def test_format_prompt_templates():
  p = procedural_problem("tiny_arithmetic", 1, 0)
  prompt = MathTask().format_prompt(p)
  assert prompt.startswith(p.prompt + "\n") and "<answer></answer>" in prompt
  assert MathTask(prompt_template="{question}").format_prompt(p) == p.prompt
  with pytest.raises(ValueError, match="prompt_template"):
    MathTask(prompt_template="{q}")


@pytest.mark.parametrize("kwargs, match", [
    (dict(sources=["nope"]), "unknown source 'nope'"),
    (dict(difficulty=4), "difficulty must be 1, 2 or 3"),
    (dict(sources=["jsonl"]), "jsonl_files"),
    (dict(sources=["chain_sum"], weights=[1, 2]), "weights"),
    (dict(answer_methods=["guess"]), "unknown extraction method"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    MathTask(**kwargs)


def test_gin_binds_math_task():
  try:
    gin.parse_config("tasks.MathTask.difficulty = 2\n"
                     "tasks.MathTask.sources = ['chain_sum']")
    task = MathTask()
    assert task.difficulty == 2 and task.sources == ("chain_sum",)
  finally:
    gin.clear_config()


def test_a_chat_tokenizer_gets_the_question_as_a_user_turn(tmp_path):
  from evotrainer import tokenizers as tk
  from tests.test_tokenizers import save_hf
  save_hf(tmp_path, pad=True, generation_eos=[2])
  with MathTask(num_validation=2, num_test=2, canary_file=None) as t:
    (p,) = t.heldout_problems(1, split="test")
    plain = f"{p.prompt}\nGive the final answer inside <answer></answer> tags."
    assert t.format_prompt(p) == plain  # before any tokenizer: the template
    t.use_tokenizer(tk.HFTokenizer.from_dir(str(tmp_path)))
    assert t.format_prompt(p) == (
        f"<|im_start|>user\n{plain}<|im_end|>\n<|im_start|>assistant\n")
