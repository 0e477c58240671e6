"""The SWE domain's gin files parse and declare the task, the search space and the
validators."""

import gin
import pytest

from evotrainer import config as config_lib
from evotrainer.tasks.swe.episode import Budget
from evotrainer.tasks.swe.tools import ToolConfig


@pytest.fixture
def parsed():
  yield lambda files: config_lib.parse(files, [], finalize=False)
  gin.clear_config()


def test_swe_train_gin_binds_the_task_tools_and_budgets(parsed):
  parsed(["gin/swe_train.gin"])
  assert gin.query_parameter("run.mode") == "train"
  assert gin.query_parameter("run.task").selector.endswith("SweDomain")
  assert gin.query_parameter("ModelConfig.max_position_embeddings") == 2048
  assert gin.query_parameter("warm_start.target_accuracy") is None
  # The configurables build the records the task reads.
  tool_config = gin.get_configurable("tasks.swe.ToolConfig")()
  budget = gin.get_configurable("tasks.swe.Budget")()
  assert isinstance(tool_config, ToolConfig) and tool_config.max_output_chars == 600
  assert isinstance(budget, Budget) and budget.max_turns == 6


def test_swe_gin_declares_the_space_the_domain_and_the_validators(parsed):
  parsed(["gin/swe.gin"])
  assert gin.query_parameter("run.mode") == "evolve"
  assert gin.query_parameter("evolve.domain") == "swe"
  knobs = gin.query_parameter("SearchSpace.knobs")
  assert len(knobs) == 8
  validators = str(gin.query_parameter("evolve.validators"))
  assert "TestTampering" in validators and "LeakDetector" in validators
