"""CodeTask: problems, splits, JSONL, extraction and execution-based reward parts, all
through the real sandbox."""

import json
import re

import pytest

from evotrainer import sandbox
from evotrainer import tokenizers as tk
from evotrainer.tasks.base import Problem, check_disjoint, normalize_prompt
from evotrainer.tasks.code import executor
from evotrainer.tasks.code.problems import (TEMPLATES, fence, humaneval_problems,
                                            procedural_code_problem)
from evotrainer.tasks.code.task import (CHAT_INSTRUCTIONS, STOP_PARTS, CodeTask, defines,
                                        extract_code, hardcoded, load_jsonl,
                                        reaches_for_harness, read_code)
from evotrainer.rollouts import stop_reason
from tests.test_tokenizers import save_hf

ADD7 = Problem("p/add7", "Write a Python function f(x) that returns x plus 7.",
               "def f(x):\n    return x + 7\n", fence("def f(x):\n    return x + 7\n"),
               "test", 1, {"kind": "function", "entry_point": "f",
                           "tests": [{"args": [1], "expected": 8},
                                     {"args": [2], "expected": 9},
                                     {"args": [10], "expected": 17}]})
ECHO = Problem("p/echo", "Read an integer x and print x times 2.",
               "x = int(input())\nprint(x * 2)\n", fence("x = int(input())\nprint(x * 2)\n"),
               "test", 1, {"kind": "stdio", "entry_point": None,
                           "tests": [{"stdin": "3\n", "expected": "6"},
                                     {"stdin": "0\n", "expected": "0"}]})


@pytest.fixture(scope="module")
def task():
  with CodeTask(num_validation=40, num_test=40, timeout_s=3.0, per_test_s=0.5) as t:
    yield t


def test_extract_code_hand_cases():
  assert extract_code("```python\ndef f(x):\n    return x\n```") == "def f(x):\n    return x\n"
  assert extract_code("text ```\nprint(1)\n``` more ```python\nprint(2)\n```") == "print(1)\n"
  assert extract_code("```js\nno\n```\n```py\nyes\n```") == "yes\n"  # other languages skipped
  assert extract_code("no code at all") is None
  assert extract_code("```python") is None
  assert extract_code("```python\n" + "x" * 30_000 + "\n```") is None  # over MAX_PROGRAM_CHARS


def test_read_code_says_how_the_program_was_found():
  fn = "def f(x):\n    return x + 7\n"
  cases = {  # completion -> (program, how)
      f"```python\n{fn}```": (fn, "fenced"),
      f"Sure!\n```py\n{fn}```\nThis adds 7.": (fn, "fenced"),
      f"```\n{fn}```": (fn, "fenced"),
      f"```Python\n{fn}```": (fn, "fenced"),
      f"Here it is:\n```python\n{fn}    # cut at the lim": (fn + "    # cut at the lim",
                                                          "unclosed"),
      f"```js\nno\n```\n```python\n{fn}": (fn, "unclosed"),  # the Python one, unclosed
      "```python\nnever closed": ("never closed", "unclosed"),
      fn: (fn, "bare"),
      f"{fn}```\nThis adds 7.": (fn, "bare"),  # the opening fence skipped, the closing one not
      "x = int(input())\nprint(x * 2)": ("x = int(input())\nprint(x * 2)", "bare"),
      "Yes": (None, "none"),  # parses, as a bare name: prose
      "42": (None, "none"),
      "The function adds 7 to x.": (None, "none"),
      "Here is the code:\ndef f(x):\n    return x + 7": (None, "none"),  # does not parse
      "```js\nconsole.log(1)\n```": (None, "other"),
      "```python": (None, "other"),
      "```python\n" + "x" * 30_000 + "\n```": (None, "other"),
  }
  for text, want in cases.items():
    assert read_code(text) == want, text[:40]


def test_defines_reads_the_syntax_tree():
  assert defines("def f(x):\n    return x\n", "f")
  assert defines("async def f(x):\n    return x\n", "f")
  assert defines("f = lambda x: x + 7\n", "f")
  assert defines("from math import factorial as f\n", "f")
  assert defines("class Solution:\n    def f(self, x):\n        return x\n", "f")
  assert not defines("def g(x):\n    return x\n", "f")
  assert not defines("def ff(x):\n    return f\n", "f")  # a use is not a definition
  assert defines("def f(x)\n    return x\n", "f")  # no parse: the def line
  assert not defines("def g(x)\n    return f(x)\n", "f")


def test_parts_and_stop_reasons_by_hand(task):
  completions = {
      "passed": fence("def f(x):\n    return x + 7\n"),
      "wrong_answer": fence("def f(x):\n    return 8 if x == 1 else x + 6\n"),  # 1 of 3
      "syntax_error": fence("def f(x)\n    return x\n"),
      "runtime_error": fence("def f(x):\n    return [][x]\n"),
      "load_error": fence("undefined_name\n"),  # raises before any test (a runtime error)
      "timeout": fence("def f(x):\n    while True:\n        pass\n"),
      "no_code": "It returns x plus 7.",
  }
  scores = task.score_many([ADD7] * len(completions), list(completions.values()))
  for (stop, _), s in zip(completions.items(), scores):
    stop = "runtime_error" if stop == "load_error" else stop
    assert s[f"stop_{stop}"] == 1.0 and sum(s[k] for k in STOP_PARTS) == 1.0, (stop, s)
    assert stop_reason(s, truncated=False) == stop
  passed, wrong, syntax, runtime, load, timeout, no_code = scores
  assert [s["tamper"] for s in scores] == [0.0] * 7  # failing honestly is not tampering
  assert [s["self_report"] for s in scores] == [1.0] + [0.0] * 6
  assert (load["compiles"], load["partial"]) == (1.0, 0.0)
  assert (passed["correct"], passed["partial"], passed["format"], passed["compiles"]) == (
      1.0, 1.0, 1.0, 1.0)
  assert (wrong["correct"], wrong["partial"]) == (0.0, pytest.approx(1 / 3))
  assert (syntax["compiles"], syntax["format"], syntax["partial"]) == (0.0, 1.0, 0.0)
  assert (runtime["compiles"], runtime["partial"]) == (1.0, 0.0)
  assert (no_code["format"], no_code["compiles"]) == (0.0, 0.0)
  assert timeout["correct"] == 0.0


def test_stdio_program_and_sys_exit(task):
  ok, exits, wrong = task.score_many([ECHO] * 3, [
      ECHO.solution, fence("import sys\nprint(int(input()) * 2)\nsys.exit(0)\n"),
      fence("print(int(input()) + 3)\n")])  # right on "3" only
  assert ok["correct"] == exits["correct"] == 1.0
  assert (wrong["correct"], wrong["partial"], wrong["stop_wrong_answer"]) == (0.0, 0.5, 1.0)


def test_the_shape_parts_of_what_a_chat_model_writes(task):
  fn = "def f(x):\n    return x + 7\n"
  completions = [
      f"```python\n{fn}```",  # fenced, right
      f"Sure:\n```python\n{fn}",  # cut before the closing fence: still run
      fn,  # no fence, parses
      "To add 7, return x + 7.",  # prose
      fence("def add_seven(x):\n    return x + 7\n"),  # the wrong name
      fence("def add(x)\n    return x + 7\n"),  # wrong name, does not parse
      "```js\nconst f = x => x + 7\n```"]  # a fence, but not Python
  keys = ("correct", "format", "unclosed_fence", "bare_code", "prose", "wrong_name",
          "defines")
  got = [tuple(s[k] for k in keys) for s in task.score_many([ADD7] * 7, completions)]
  assert got == [(1, 1, 0, 0, 0, 0, 1), (1, 0, 1, 0, 0, 0, 1), (1, 0, 0, 1, 0, 0, 1),
                 (0, 0, 0, 0, 1, 0, 0), (0, 1, 0, 0, 0, 1, 0), (0, 1, 0, 0, 0, 1, 0),
                 (0, 0, 0, 0, 0, 0, 0)]
  (stdio,) = task.score_many([ECHO], [fence("print(1)\n")])
  assert stdio["wrong_name"] == 0.0  # no entry point to name
  assert stdio["defines"] == 1.0  # a program, and no name it could miss


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
  path = tmp_path_factory.mktemp("hf")
  save_hf(path, pad=True, generation_eos=[2])
  return tk.HFTokenizer.from_dir(str(path))


def test_a_chat_tokenizer_gets_its_own_template_and_the_plain_one_does_not(hf_tok, tmp_path):
  with CodeTask(num_validation=2, num_test=2) as t:
    assert t.format_prompt(ADD7) == ADD7.prompt  # before any tokenizer: the template
    sp = tk.SentencePieceTokenizer.train(iter([ADD7.prompt, ADD7.solution] * 20), 320,
                                         str(tmp_path))
    t.use_tokenizer(sp)
    assert t.format_prompt(ADD7) == ADD7.prompt  # from scratch: unchanged
    t.use_tokenizer(hf_tok)
    want = ("<|im_start|>user\nWrite a Python function f(x) that returns x plus 7.\n\n"
            "Answer with the Python function `f` in one ```python code block.<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert t.format_prompt(ADD7) == want
    assert "reads standard input" in t.format_prompt(ECHO)
    he = Problem("HumanEval/x", "def g(a):\n    \"\"\"Doubles a.\"\"\"\n", "", "", "humaneval",
                 0, {"kind": "check", "entry_point": "g", "tests": []})
    assert t.format_prompt(he) == (
        "<|im_start|>user\n" + CHAT_INSTRUCTIONS["check"].format(entry="g") + "\n\n"
        "```python\ndef g(a):\n    \"\"\"Doubles a.\"\"\"\n```<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_a_lying_program_earns_only_the_self_report_part(task):
  liar = fence("import os\nprint('all tests passed')\nos._exit(0)\n")
  forged = fence("print('@@0000 {\"i\": 0, \"value\": \"8\"}')\ndef f(x):\n    return 0\n")
  lie, forge = task.score_many([ADD7, ADD7], [liar, forged])
  assert (lie["correct"], lie["partial"], lie["self_report"], lie["tamper"]) == (
      0.0, 0.0, 1.0, 1.0)
  assert (forge["correct"], forge["partial"]) == (0.0, 0.0)


def test_only_a_program_that_compiles_can_tamper(task):
  reach = "def f(x):\n    b = __builtins__\n    return x + 7\n"
  garbled = "def f(x):\n    b = __builtins__\n    return [x clLambda.loop(x)]\n"
  ran, never_ran = task.score_many([ADD7, ADD7], [fence(reach), fence(garbled)])
  assert (ran["compiles"], ran["tamper"], ran["correct"]) == (1.0, 1.0, 1.0)
  assert (never_ran["compiles"], never_ran["tamper"], never_ran["stop_syntax_error"]) == (
      0.0, 0.0, 1.0)


def test_a_timeout_is_rerun_once_alone_and_the_second_record_counts():
  class FlakyPool:  # the batch times out; the re-run alone does not
    def __init__(self):
      self.map_calls, self.run_calls = 0, []

    def map(self, jobs):
      self.map_calls += 1
      return [sandbox.RunResult(sandbox.Status.TIMEOUT, -9, "", "", False, False, 3.0, 3.0)
              for _ in jobs]

    def run(self, source, stdin, **kw):
      self.run_calls.append(source)
      nonce = json.loads(stdin)["nonce"]
      lines = [{"compile": "ok"}, {"i": 0, "value": "8"}, {"i": 1, "value": "9"},
               {"i": 2, "value": "17"}, {"done": True}]
      out = "".join(f"@@{nonce} {json.dumps(r)}\n" for r in lines)
      return sandbox.RunResult(sandbox.Status.OK, 0, out, "", False, False, 0.1, 0.1)

  pool = FlakyPool()
  (out,) = executor.run_programs(pool, [("def f(x): return x+7", "function",
                                          ADD7.meta["tests"], "f")], 3.0, 1.0)
  assert pool.map_calls == 1 and len(pool.run_calls) == 1
  assert (out.stop, out.passed) == ("passed", 3)


def test_every_template_reference_passes_and_its_tests_are_not_trivial(task):
  problems = []
  for tpl in TEMPLATES:
    for key in range(3):
      for _ in range(50):  # the key picks a template at random within a level
        p = procedural_code_problem(tpl.level, (tpl.kind,), key)
        key += 1000
        if p.source == f"code_{tpl.name}":
          problems.append(p)
          break
  assert {p.source for p in problems} == {f"code_{t.name}" for t in TEMPLATES}
  scores = task.score_many(problems, [p.solution for p in problems])
  assert [p.id for p, s in zip(problems, scores) if s["correct"] != 1.0] == []
  assert not any(s["hardcoded"] or s["tamper"] for s in scores)
  wrong = task.score_many(problems, [task.exploit_completions(p)["wrong"] for p in problems])
  assert all(s["correct"] == 0.0 for s in wrong)


def test_splits_are_disjoint_by_normalized_prompt(task):
  train = task.train_problems(400, seed=3)
  val, test = task.heldout_problems(split="validation"), task.heldout_problems(split="test")
  assert len(val) == 40 and len(test) == 40
  check_disjoint(train, val)
  check_disjoint(train, test)
  check_disjoint(val, test)
  assert len({normalize_prompt(p.prompt) for p in val}) == 40
  assert task.train_problems(5, seed=3) == train[:5]  # a function of the seed
  with pytest.raises(ValueError, match="raise CodeTask.num_validation"):
    task.heldout_problems(41)


def _write(path, rows):
  path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
  return path


def test_jsonl_refuses_a_failing_or_hanging_reference_with_file_and_line(tmp_path):
  good = {"prompt": "Read n, print n squared.", "solution": "n = int(input())\nprint(n * n)",
          "tests": [{"input": "3\n", "output": "9"}, {"input": "-2", "output": "4"}]}
  apps = {"question": "Read a and b, print a + b.",
          "solutions": ["a, b = map(int, input().split())\nprint(a + b)"],
          "input_output": {"inputs": ["1 2\n"], "outputs": ["3\n"]}}
  func = {"prompt": "square(n)", "kind": "function", "entry_point": "square",
          "solution": "def square(n):\n    return n * n", "tests": [{"args": [4], "expected": 16}]}
  wrong = {**good, "prompt": "wrong", "solution": "print(1)"}
  hangs = {**good, "prompt": "hangs", "solution": "while True:\n    pass"}
  path = _write(tmp_path / "mine.jsonl", [good, apps, func, wrong, "{not json", hangs,
                                          {"prompt": "no tests", "solution": "print(1)"}])
  data = load_jsonl(path, timeout_s=2.0, per_test_s=1.0)
  assert [p.prompt for p in data.problems] == [good["prompt"], apps["question"], func["prompt"]]
  assert data.problems[2].meta["tests"] == [{"args": [4], "expected": 16}]
  assert data.bad_rows == [
      f"{path}:5: not valid JSON (Expecting property name enclosed in double quotes at "
      f"column 2)",
      f"{path}:7: 'tests' must be a non-empty list (or APPS 'input_output')",
      f"{path}:4: reference solution fails its own tests (wrong_answer, 0/2 passed)",
      f"{path}:6: reference solution fails its own tests (timeout, 0/2 passed)"]
  only_wrong = _write(tmp_path / "wrong.jsonl", [good, wrong])
  with pytest.raises(ValueError, match=re.escape(f"{only_wrong}:2: reference solution fails")):
    load_jsonl(only_wrong, on_bad_row="error")


def test_jsonl_task_and_bad_config(tmp_path):
  rows = [{"prompt": f"Read n, print n plus {i}.", "solution": f"print(int(input()) + {i})",
           "tests": [{"input": "1", "output": str(1 + i)}]} for i in range(30)]
  path = _write(tmp_path / "p.jsonl", rows)
  with CodeTask(jsonl_files=[str(path)], num_validation=5, num_test=5) as t:
    assert t.sources == ("jsonl",)
    train = t.train_problems(20, 0)
    assert all(p.source == "jsonl" for p in train)
    check_disjoint(train, t.heldout_problems(split="test"))
  for bad, match in ((dict(difficulty=4), "difficulty"), (dict(kinds=["sql"]), "kinds"),
                     (dict(sources=["humaneval"]), "sources"),
                     (dict(prompt_template="{q}"), "prompt_template"),
                     (dict(timeout_s=0), "timeout_s")):
    with pytest.raises(ValueError, match=match):
      CodeTask(**bad)


def test_tamper_and_hardcoded_detection():
  assert reaches_for_harness("import os\nos._exit(0)")
  assert reaches_for_harness("import sys\nf = sys._getframe(1)")
  assert not reaches_for_harness("import sys\nprint(sys.stdin.read())\nsys.exit(0)")
  # dup2 only as the os module's (or imported from it): an attribute of some other name
  # is no redirect of the verdict's descriptor (a garbled `resol.dup2(args)` once vetoed a
  # branch).
  assert reaches_for_harness("import os\nos.dup2(3, 1)")
  assert reaches_for_harness("import posix\nposix . dup2(3, 1)")
  assert reaches_for_harness("from os import dup2\ndup2(3, 1)")
  assert not reaches_for_harness("def f(args):\n    return resol.dup2(args)")
  special = "def f(x):\n    if x == 1:\n        return 8\n    if x == 2:\n        return 9\n"
  assert hardcoded(special, ADD7)
  leaked = "def f(x):\n    return {1: 8, 2: 9}.get(x, 0)\n"  # 8 and 9 are hidden outputs
  assert hardcoded(leaked, ADD7)
  assert not hardcoded(ADD7.answer, ADD7)
  assert not hardcoded("def f(x):\n    return x + 7 if x != 99 else 106\n", ADD7)
  assert not hardcoded("def f(x) oops", ADD7)


def test_humaneval_sample_canonical_passes_and_broken_fails(task):
  problems = humaneval_problems()
  assert len(problems) == 164
  _check_humaneval(task, problems[::16])


@pytest.mark.slow
def test_humaneval_all_164_canonical_pass_and_broken_fail():
  with CodeTask(timeout_s=20.0, per_test_s=15.0) as t:
    _check_humaneval(t, humaneval_problems())


def _broken(p: Problem) -> str:
  """The canonical solution with its return value changed (wrapped in a list; None -> 0)."""
  e = p.meta["entry_point"]
  return fence(p.answer + f"\n\n_right = {e}\n\ndef {e}(*args, **kwargs):\n"
               f"    r = _right(*args, **kwargs)\n    return [r] if r is not None else 0\n")


def _check_humaneval(t, problems):
  right = t.score_many(problems, [p.solution for p in problems])
  assert [p.id for p, s in zip(problems, right) if s["correct"] != 1.0] == []
  broken = t.score_many(problems, [_broken(p) for p in problems])
  assert [p.id for p, s in zip(problems, broken) if s["correct"] != 0.0] == []
  # A body-only completion continues the prompt (the HumanEval convention).
  p = problems[0]
  body = p.answer[len(p.prompt):]
  assert t.score(p, fence(body))["correct"] == 1.0


def test_humaneval_joins_the_test_split_only():
  with CodeTask(num_validation=10, num_test=10, humaneval_test=True) as t:
    test = t.heldout_problems(split="test")
    assert len(test) == 10 + 164 and test[-1].source == "humaneval"
    assert not any(p.source == "humaneval" for p in t.train_problems(200, 0))
    assert not any(p.source == "humaneval" for p in t.heldout_problems(split="validation"))


def test_stop_reason_order():
  assert stop_reason({"malformed": 1.0, "stop_passed": 0.0}, truncated=True) == "malformed"
  assert stop_reason({"correct": 0.0, "stop_timeout": 1.0}, truncated=True) == "timeout"
  assert stop_reason({"correct": 1.0}, truncated=True) == "max_tokens"  # math: no stop_ part
  assert stop_reason({"correct": 1.0, "stop_passed": 0.0}, truncated=False) == "stop_token"


def test_the_evaluation_pipeline_check_passes_on_code_and_catches_a_lenient_verifier(task):
  from evotrainer.eval.pipeline_check import task_eval_check
  ok, why = task_eval_check(task, probes=6, train_draws=300)()
  assert ok, why
  cases = task.probe_completions(task.heldout_problems(2))
  assert [ok for _, _, ok in cases] == [True, False, True, False]

  class Lenient(CodeTask):  # pays every program that compiles
    def score_many(self, problems, completions):
      return [{**s, "correct": s["compiles"]} for s in super().score_many(problems, completions)]

  with Lenient(num_validation=6, num_test=6) as lenient:
    ok, why = task_eval_check(lenient, probes=4, train_draws=100)()
  assert not ok and "accepts known-wrong answers on 4 of 4" in why
