"""gin/swe_leaky.gin parses and turns on the leak (a checkout keeping history, the git
tool) and the validator that rejects it; gin/swe.gin keeps both off."""

import os

import gin
import pytest

from evotrainer import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(REPO, "gin", "swe.gin")),
    reason="gin/swe.gin (the SWE task's launcher config) is not in this tree yet")


@pytest.fixture
def parsed():
  yield lambda files: config_lib.parse(files, [], finalize=False)
  gin.clear_config()


def test_swe_leaky_gin_opens_the_leak_and_gates_it(parsed):
  parsed(["gin/swe_leaky.gin"])
  assert gin.query_parameter("run.mode") == "evolve"
  assert gin.query_parameter("SweDomain.checkout_options") == {"keep_history": True}
  tool_config = gin.get_configurable("tasks.swe.ToolConfig")()
  assert tool_config.git and tool_config.git_timeout_s == 10.0
  validators = str(gin.query_parameter("evolve.validators"))
  assert "HistoryLeak" in validators and "LeakDetector" in validators
  assert gin.query_parameter("HistoryLeak.max_share") == 0.0


def test_swe_gin_clears_the_history_by_default(parsed):
  parsed(["gin/swe.gin"])
  with pytest.raises(ValueError):
    gin.query_parameter("SweDomain.checkout_options")
  assert not gin.get_configurable("tasks.swe.ToolConfig")().git
