"""Property tests: code-block extraction and the static program checks are total and
bounded on any completion (issue 17's rule for every reader of model text). Budget:
tests/fuzz_text.py."""

from hypothesis import example, given
from hypothesis import strategies as st

from evotrainer.tasks.answers import MAX_TEXT_CHARS
from evotrainer.tasks.code.task import (MAX_PROGRAM_CHARS, CodeTask, extract_code, hardcoded,
                                        reaches_for_harness)
from tests.fuzz_text import FUZZ, model_text, within
from tests.tasks.code.test_task import ADD7

OPEN_FENCES = "```python\n" * 20_000
NESTED = "```python\n" + "(" * 5_000 + "\n```"
TASK = CodeTask(num_validation=1, num_test=1)  # programs() only: no sandbox is started


@FUZZ
@given(model_text())
@example(OPEN_FENCES)
@example("```" * 50_000)
@example(NESTED)
@example("```python\n" + "x = 1\n" * 5_000 + "```")
@example("x" * (MAX_TEXT_CHARS + 1))
def test_extraction_and_static_checks_are_total_and_bounded(text):
  with within(what="code extraction"):
    code = extract_code(text)
    (program,) = TASK.programs([ADD7], [text])
  assert code is None or (isinstance(code, str) and len(code) <= MAX_PROGRAM_CHARS)
  assert program == (None if len(text) > MAX_TEXT_CHARS else code)
  if code is not None:
    with within(what="static checks"):
      assert isinstance(hardcoded(code, ADD7), bool)
      assert isinstance(reaches_for_harness(code), bool)


@FUZZ
@given(st.lists(st.sampled_from(["```", "```python\n", "\n", "print(1)\n", "x"]),
                max_size=30).map("".join))
def test_the_first_closed_block_is_returned(text):
  code = extract_code(text)
  if code is not None:
    assert "```" not in code and code in text
