"""The Controller's knobs: its parts' config dataclasses, set from gin or by keyword."""

from __future__ import annotations

import gin
import pytest

from evotrainer.evolution.controller import (Controller, EscalationConfig, GateConfig,
                                             HarnessEvolutionConfig, LoopConfig, VerifyConfig,
                                             with_knobs)
from evotrainer.evolution.ledger import Ledger

GIN = """
VerifyConfig.alpha = 0.01
VerifyConfig.bootstrap_n = 77
VerifyConfig.collapse_fraction = 0.25
VerifyConfig.learn_skills = False
EscalationConfig.escalate_after = 9
HarnessEvolutionConfig.gap_generations = 5
HarnessEvolutionConfig.separation = 2.5
HarnessEvolutionConfig.explain_tol = 0.3
GateConfig.poll_s = 0.5
GateConfig.gate_timeout_s = 60.0
"""


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _controller(tmp_path, **kw):
  return Controller(Ledger(tmp_path / "ledger.sqlite"), trainer=None, space=None,
                    workdir=tmp_path / "run", **kw)


def test_every_part_knob_is_read_from_gin(tmp_path, clean_gin):
  gin.parse_config(GIN)
  c = _controller(tmp_path)
  assert c.promotion.config == VerifyConfig(alpha=0.01, bootstrap_n=77, collapse_fraction=0.25,
                                            learn_skills=False, relative_health=False)
  assert c.promotion.learner.enabled is False
  assert c.escalation.config.escalate_after == 9
  assert (c.harness.config.gap_generations, c.harness.config.separation,
          c.harness.config.explain_tol) == (5, 2.5, 0.3)
  assert (c.gates.config.poll_s, c.gates.config.gate_timeout_s) == (0.5, 60.0)


def test_a_keyword_knob_overrides_gin_and_the_defaults_hold_without_gin(tmp_path, clean_gin):
  c = _controller(tmp_path)
  assert (c.promotion.config.alpha, c.promotion.config.bootstrap_n) == (0.05, 2000)
  assert (c.escalation.config.escalate_after, c.gates.config.poll_s) == (3, 2.0)
  gin.parse_config(GIN)
  c = _controller(tmp_path, bootstrap_n=500, branches=2, relative_health=True,
                  human_gated=True)
  assert c.promotion.config.bootstrap_n == 500 and c.promotion.config.alpha == 0.01
  assert c.promotion.config.relative_health and c.gates.config.human_gated
  assert c.config.branches == 2 and c.proposal.k == 2


def test_the_evolve_knobs_are_not_bound_twice(clean_gin):
  # `evolve.relative_health` and `evolve.human_gated` name these; a second gin name would
  # let two bindings disagree.
  with pytest.raises(ValueError, match="denylisted"):
    gin.parse_config("VerifyConfig.relative_health = True")
  with pytest.raises(ValueError, match="denylisted"):
    gin.parse_config("GateConfig.human_gated = True")


def test_with_knobs_sets_each_knob_in_its_config_and_refuses_unknown_ones():
  loop, verify = with_knobs([LoopConfig(), VerifyConfig()], {"seed": 4, "alpha": 0.1})
  assert loop == LoopConfig(seed=4) and verify == VerifyConfig(alpha=0.1)
  with pytest.raises(TypeError, match="unknown knob bootstrap=5; expected a field of "
                                      "LoopConfig, VerifyConfig"):
    with_knobs([LoopConfig(), VerifyConfig()], {"bootstrap": 5})


@pytest.mark.parametrize("make,match", [
    (lambda: VerifyConfig(alpha=1.5), "alpha=1.5"),
    (lambda: VerifyConfig(bootstrap_n=0), "bootstrap_n=0"),
    (lambda: EscalationConfig(escalate_after=0), "escalate_after=0"),
    (lambda: HarnessEvolutionConfig(separation=-1), "separation=-1"),
    (lambda: GateConfig(poll_s=0), "poll_s=0"),
    (lambda: LoopConfig(continue_steps=-1), "continue_steps=-1")])
def test_a_bad_knob_is_a_one_line_error_naming_it(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_the_registry_names_the_modules_of_the_part_configs():
  # A gin file can bind `VerifyConfig.alpha` only once its module is imported, and the
  # launcher imports the modules the registry names (read from its source: this process
  # has imported them all already).
  import ast
  import inspect
  from evotrainer import registry
  tree = ast.parse(inspect.getsource(registry))
  named = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
  for cls in (VerifyConfig, EscalationConfig, HarnessEvolutionConfig, GateConfig):
    assert cls.__module__ in named, cls
