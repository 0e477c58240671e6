"""Property test: the rollout store stores any model text (issue 17). Budget:
tests/fuzz_text.py."""

import re
import tempfile

import numpy as np
from hypothesis import example, given

from evotrainer.rollouts import RolloutStore
from evotrainer.types import Episode
from tests.fuzz_text import FUZZ, model_text, within

SURROGATE = re.compile("[\ud800-\udfff]")


@FUZZ
@given(model_text(), model_text())
@example("a\x00b\ud800c" * 1000, "\udfff")
def test_any_completion_round_trips(completion, answer):
  ep = Episode(episode_id="v0/train/0/0", group_id=0, task_id="t", prompt="q",
               completion=completion, answer="7", reward_parts={"correct": 0.0},
               parsed_answer=answer, info={"stop": "malformed", "raw": completion},
               completion_ids=np.arange(3, dtype=np.int32),
               logprobs=np.zeros(3, np.float32))
  with tempfile.TemporaryDirectory() as root:
    store = RolloutStore(root)
    with within(what="write + read_step"):
      store.write("v0", 0, "train", [ep])
      (back,) = store.read_step("v0", 0, "train").episodes
  # Text columns hold UTF-8: a lone surrogate becomes U+FFFD; everything else is exact.
  assert back.completion == SURROGATE.sub("\ufffd", completion)
  assert back.parsed_answer == SURROGATE.sub("\ufffd", answer)
  assert back.info == ep.info  # JSON escapes keep even surrogates exact
