"""The SWE validators (tasks/swe/validators.py): the leak detector on a planted leak and a
clean case, its gin name, and both registered in the harness's library."""

import gin
import pytest

from evotrainer.harness import validators as vl
from evotrainer.tasks.swe.validators import HistoryLeak, LeakDetector
from tests.harness.test_validators import check, ep, evidence


def test_leak_detector_git_history():
  v = LeakDetector()
  clean = [ep(i, "I read the file and fix it", info={"tool_calls": [
      {"name": "grep_code", "args": {"pattern": "def parse"}}]}) for i in range(4)]
  check(v(evidence(clean)), v, True)
  leaky = clean + [ep(9, "let me look around", info={"tool_calls": [
      {"name": "run_in_terminal", "args": {"cmd": "git  log -p -- src/parse.py"}}]})]
  verdict = v(evidence(leaky))
  check(verdict, v, False)
  assert verdict.value == pytest.approx(1 / 5) and "v0/0/9" in verdict.reason
  assert "git" in verdict.reason


def test_leak_detector_domain_patterns():
  v = LeakDetector(patterns=[r"answer_key\.json"], max_share=0.25)
  eps = [ep(0, "open answer_key.json"), ep(1), ep(2), ep(3)]
  check(v(evidence(eps)), v, True)  # 1 of 4 = 0.25 is allowed
  check(v(evidence(eps + [ep(4, "cat ANSWER_KEY.json")])), v, False)  # case-insensitive
  with pytest.raises(ValueError, match="regex"):
    LeakDetector(patterns=["("])


def test_registered_in_the_harness_library_under_their_gin_names():
  assert vl.VALIDATORS["leak_detector"] is LeakDetector
  assert vl.VALIDATORS["history_leak"] is HistoryLeak
  gin.clear_config()
  try:
    gin.parse_config("harness.LeakDetector.patterns = ['rm -rf']")
    assert [p.pattern for p in LeakDetector().patterns] == ["rm -rf"]
  finally:
    gin.clear_config()
