"""Property tests: reward parts, filters and diagnostics (with their evidence snippets) are
total and bounded on any completion (issue 17). Budget: tests/fuzz_text.py."""

import math
import re

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from evotrainer.harness import diagnostics as dg
from evotrainer.harness.base import printable, snippet
from evotrainer.harness.filters import (AbandonFilter, EchoTrapFilter, StopReasonFilter,
                                        TruncationFilter, find_loop)
from evotrainer.harness.rewards import (LengthPenalty, OverlongPenalty, RepetitionPenalty,
                                        RewardComposer)
from evotrainer.types import Episode
from tests.fuzz_text import FUZZ, model_text, within

MAX_NEW_TOKENS = 64
STOPS = ("stop_token", "max_tokens", "malformed")
# Not storable as UTF-8 (surrogates) or not displayable (C0/C1 controls but \t \n \r).
UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


@st.composite
def episodes(draw, max_rows: int = 6):
  """A batch of groups of 2 (rows of a group adjacent) with any completion text."""
  n = 2 * draw(st.integers(1, max_rows // 2))
  out = []
  for i in range(n):
    length = draw(st.integers(0, MAX_NEW_TOKENS))
    ids = np.asarray(draw(st.lists(st.integers(0, 5), min_size=length, max_size=length)),
                     np.int32)
    correct = draw(st.sampled_from((0.0, 1.0)))
    info = {"stop": draw(st.sampled_from(STOPS)), "max_new_tokens": MAX_NEW_TOKENS}
    if draw(st.booleans()):
      info["turns"] = draw(st.integers(1, 4))
    out.append(Episode(
        episode_id=f"v0/train/0/{i}", group_id=i // 2, task_id=f"p{i // 2}", prompt="q",
        completion=draw(model_text()), answer="7",
        reward_parts={"correct": correct, "format": draw(st.sampled_from((0.0, 1.0))),
                      "malformed": float(info["stop"] == "malformed")},
        completion_ids=ids, logprobs=np.full(length, -0.5, np.float32),
        truncated=info["stop"] == "max_tokens", info=info))
  return out


def _storable(text: str) -> bool:
  return not UNPRINTABLE.search(text)


@FUZZ
@given(episodes())
def test_reward_parts_are_finite_and_in_range(eps):
  composer = RewardComposer(
      parts={"correct": 1.0, "format": 0.1, "overlong": 1.0, "length": 0.1,
             "repetition": 0.5, "word_repetition": 0.5},
      components=[OverlongPenalty(MAX_NEW_TOKENS, 16), LengthPenalty(32, 32.0),
                  RepetitionPenalty(4, "tokens"),
                  RepetitionPenalty(4, "words", name="word_repetition")],
      clip=(-2.0, 2.0))
  with within(what="RewardComposer"):
    out = composer(eps)
  assert out.quarantine.keep.all()  # every part is finite on any text
  assert np.isfinite(out.rewards).all() and (np.abs(out.rewards) <= 2.0).all()
  for name in ("overlong", "repetition", "word_repetition"):
    assert ((out.parts[name] >= -1.0) & (out.parts[name] <= 0.0)).all(), name
  assert (out.parts["length"] <= 0.0).all()


@FUZZ
@given(episodes())
def test_filters_are_total_and_cut_malformed_stops(eps):
  filters = [TruncationFilter("hard"), TruncationFilter("soft"),
             EchoTrapFilter(unit="tokens"), EchoTrapFilter(2, 3, unit="words"),
             AbandonFilter(), StopReasonFilter()]
  for f in filters:
    with within(what=f.name):
      result = f(eps)
    assert result.keep.shape == (len(eps),) and result.keep.dtype == bool
    for keep, reason in zip(result.keep, result.reasons):
      assert (reason is None) == bool(keep), (f.name, reason)
      assert reason is None or _storable(reason), (f.name, reason)
  malformed = [ep.info["stop"] == "malformed" for ep in eps]
  assert StopReasonFilter()(eps).keep.tolist() == [not m for m in malformed]


@FUZZ
@given(episodes(), st.integers(0, 2))
def test_diagnostics_are_total_with_storable_evidence(eps, bad):
  for ep in eps[:bad]:  # a batch where the malformed-share finding fires with evidence
    ep.info["stop"] = "malformed"
  context = {"advantages": np.zeros(len(eps)), "heldout": {"avg8": 0.5},
             "incumbent": {"avg8": 0.4}}
  diags = dg.default_diagnostics()
  with within(what="run_diagnostics"):
    metrics, findings = dg.run_diagnostics(diags, eps, context)
  assert all(isinstance(v, float) for v in metrics.values())
  share = sum(ep.info["stop"] == "malformed" for ep in eps) / len(eps)
  assert metrics["stop_malformed"] == share
  assert math.isclose(sum(v for k, v in metrics.items() if k.startswith("stop_")), 1.0)
  for f in findings:
    for episode_id, text in f.evidence:
      assert episode_id in {ep.episode_id for ep in eps}
      assert isinstance(text, str) and _storable(text) and len(text) <= 120, text
  if share > 0.05:
    (stop,) = [f for f in findings if f.kind == "stop_reasons"]
    assert {i for i, _ in stop.evidence} == {ep.episode_id for ep in eps
                                             if ep.info["stop"] == "malformed"}


@FUZZ
@given(model_text(), st.integers(4, 100), st.booleans())
@example("\x00" * 500, 80, False)
@example("a\ud800 " * 50_000, 80, True)
def test_snippet_is_short_printable_and_faithful(text, width, tail):
  with within(what="snippet"):
    out = snippet(text, width, tail=tail)
  assert len(out) <= width and _storable(out)
  collapsed = printable(" ".join(text.split()))
  if len(collapsed) <= width:  # short text: shown whole
    assert out == collapsed
  elif tail:
    assert out.startswith("...") and collapsed.endswith(out[3:])
  else:
    assert out.endswith("...") and collapsed.startswith(out[:-3])


def _loop_reference(units, n, max_repeats, max_period):
  """Brute force: the shortest period p in [n, max_period] of a block repeated back to
  back `max_repeats` times, or None."""
  for p in range(n, max_period + 1):
    for start in range(len(units) - p + 1):
      block, reps = units[start:start + p], 1
      while units[start + reps * p:start + (reps + 1) * p] == block:
        reps += 1
      if reps >= max_repeats:
        return p
  return None


@FUZZ
@given(st.lists(st.integers(0, 3), max_size=60), st.integers(1, 3), st.integers(2, 4))
def test_find_loop_matches_brute_force(units, n, max_repeats):
  got = find_loop(np.asarray(units, np.int64), n, max_repeats, 8)
  want = _loop_reference(units, n, max_repeats, 8)
  assert (got and got[0]) == want
  if got:
    p, reps, start = got
    block = units[start:start + p]
    assert reps >= max_repeats and units[start:start + reps * p] == block * reps


def test_find_loop_memory_is_linear_in_long_text():
  """400k units with a loop at the end: one period at a time, O(L) memory."""
  units = np.concatenate([np.arange(400_000) % 997, np.tile([1, 2, 3, 4, 5], 4)])
  with within(what="find_loop"):
    assert find_loop(units, 4, 3, 64) == (5, 4, 400_000)
