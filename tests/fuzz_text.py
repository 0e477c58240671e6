"""Generated model text for the property-based suites (tests/*/test_fuzz_*.py).

Completions are untrusted input (issue 17): every function that reads them must take
any string without raising, within a time bound. `model_text()` draws the text those
suites feed them: arbitrary Unicode (lone surrogates, NUL, control characters included),
fragments of the markup the parsers look for (answer tags, boxes, `####`, braces,
numbers), and long repetitions of a fragment, which is where quadratic parsers hang.

The example budget is fixed and deterministic (`FUZZ`, the "evotrainer-fuzz" profile):
`derandomize=True`, no example database, `max_examples` from EVOTRAINER_FUZZ_EXAMPLES
(default 60). Raise it locally for a deeper search; CI runs the default.

A new parser of model text (code blocks, tool calls, file paths, test selectors) joins
by adding its fragments to `FRAGMENTS` and a property test next to its module's tests.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

settings.register_profile(
    "evotrainer-fuzz", derandomize=True, database=None, deadline=None,
    max_examples=int(os.environ.get("EVOTRAINER_FUZZ_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.large_base_example])
FUZZ = settings.get_profile("evotrainer-fuzz")

# A per-call bound that catches a hang or a quadratic parse, not a speed goal: every
# in-process reader here takes well under 0.1 s on the texts drawn below.
CALL_BOUND_S = 5.0

FRAGMENTS = (
    "<answer>", "</answer>", "<ANSWER>", "\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "(",
    ")", "[", "]", "####", "\\frac{", "^", "$", ",", ".", "-", "/", "\n", " ", "\t", "\x00",
    "\x1b", "\x7f", "\ud800", "\udfff", "\u2028", "\ufeff", "0", "7", "19", "1,000",
    "-0.5", "3/4", "٣", "𝟕", "x^2+1", "\\sqrt{2}", "e", "&lt;", "<script>", "\"", "'",
    # code blocks (tasks/code/task.py)
    "```", "```python\n", "```py\n", "```\n", "def f(x):\n", "    return x\n", "if x == 1:")

_chars = st.characters(codec=None)  # any code point, surrogates included
_fragment = st.one_of(st.sampled_from(FRAGMENTS), st.text(_chars, max_size=8),
                      st.integers(0, 10**30).map(str))
_run = st.builds(lambda f, k: f * k, st.sampled_from(FRAGMENTS + ("7", "1,")),
                 st.integers(1, 30_000))


def model_text() -> st.SearchStrategy[str]:
  """Any string, biased to what parsers of completions find hard."""
  return st.one_of(
      st.text(_chars, max_size=200),
      st.lists(_fragment, max_size=60).map("".join),
      st.lists(st.one_of(_fragment, _run), min_size=1, max_size=4).map("".join))


@contextmanager
def within(seconds: float = CALL_BOUND_S, what: str = "call"):
  """Asserts that the body returns within `seconds` of wall-clock time."""
  start = time.monotonic()
  yield
  took = time.monotonic() - start
  assert took < seconds, f"{what} took {took:.2f} s (bound {seconds} s)"
