"""registry.register_builtins: every built-in configurable module is loaded, the domains'
diagnostics and validators among them, in the harness libraries' order."""

import json
import subprocess
import sys

import gin

from evotrainer import registry

# What a fresh process (a launch) holds after registering the built-ins. Read in a child:
# in a test worker, modules other tests imported earlier (a user's diagnostic, the SWE
# package before code's) would change the library this process holds.
_FRESH_LIBRARY = ("import json; from evotrainer import registry; registry.register_builtins(); "
                  "from evotrainer.harness.diagnostics import DIAGNOSTICS; "
                  "print(json.dumps([n for n in DIAGNOSTICS if n != 'domain']))")


def test_builtins_register_the_domains_in_the_harness_libraries():
  registry.register_builtins()
  from evotrainer.harness.diagnostics import DIAGNOSTICS  # pylint: disable=import-outside-toplevel
  from evotrainer.harness.validators import VALIDATORS  # pylint: disable=import-outside-toplevel
  fresh = subprocess.run([sys.executable, "-c", _FRESH_LIBRARY], capture_output=True,
                         text=True, check=True, timeout=300)
  # The library's order (the controller's gap search walks it): the harness's own, then
  # code's, then SWE's, then math's.
  assert json.loads(fresh.stdout.strip().splitlines()[-1]) == [
      "bc", "reward", "score_trend", "dead_group_ratio", "reward_spread", "advantage_health",
      "length_reward_corr", "format_failure", "answer_spamming", "repetition", "entropy",
      "kl", "clip_fraction", "grad_norm", "length", "truncation", "turns", "stop_reasons",
      "training_drift", "syntax_error_rate", "timeout_rate", "pass_fraction_spread",
      "hardcoded_outputs", "prose_rate", "broken_fence", "wrong_name_rate", "runaway_length",
      "tool_mix", "first_edit_turn", "tool_streak", "echo_trap_rate", "git_usage",
      "arithmetic_slip"]
  assert {"leak_detector", "history_leak", "test_tampering"} <= set(VALIDATORS)
  gin.clear_config()
  try:  # gin knows the moved classes under their old names
    gin.parse_config("harness.ToolMix.threshold = 0.1\n"
                     "harness.SyntaxErrorRate.threshold = 0.3\n"
                     "harness.HistoryLeak.max_share = 0.5\n"
                     "tasks.MathTask.num_validation = 3\n"
                     "tasks.CodeTask.num_validation = 3")
    assert DIAGNOSTICS["tool_mix"]().threshold == 0.1
    assert DIAGNOSTICS["syntax_error_rate"]().threshold == 0.3
    assert VALIDATORS["history_leak"]().max_share == 0.5
  finally:
    gin.clear_config()
