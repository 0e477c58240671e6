"""gin/math_smol_train.gin parses and says what it runs: the pretrained policy, warm-started
on the top 4 blocks until 30% of sampled answers are right, then GRPO on rung 1."""

import gin
import pytest

from evotrainer import registry


@pytest.fixture
def parsed():
  yield lambda files: registry.parse(files, [], finalize=False)
  gin.clear_config()


def test_math_smol_train_gin_warm_starts_the_pretrained_policy(parsed):
  registry.parse(["gin/math_smol_train.gin"])  # finalized: every binding is known
  gin.clear_config()
  parsed(["gin/math_smol_train.gin"])
  assert gin.query_parameter("policy.gguf") == "smollm2-135m-instruct"
  assert gin.query_parameter("run.task").selector.endswith("MathTask")
  assert gin.query_parameter("run.warm_start") is True
  assert gin.query_parameter("warm_start.top_layers") == 4
  assert gin.query_parameter("warm_start.target_accuracy") == 0.3
  assert gin.query_parameter("MathTask.sources") == ["basic_arithmetic"]
  assert gin.query_parameter("Learner.trainable_layers") == 4
  assert gin.query_parameter("Harness.group_filters") == []  # the fixed default harness
