"""skill_hypotheses: what the catalog proposes for each finding, by hand."""

from evotrainer.evolution.proposers import skill_hypotheses
from evotrainer.evolution.search_space import ChoiceKnob, FloatKnob, SearchSpace
from evotrainer.harness.diagnostics.score import ScoreTrend
from evotrainer.types import Episode, Finding

SPACE = SearchSpace([FloatKnob("Learner.learning_rate", 1e-5, 1e-4, log=True)])
VALUES = {"Learner.learning_rate": 2e-5}


def _trend(avg8: float) -> list:
  """ScoreTrend's finding for a held-out avg8 against an incumbent's 0.30."""
  ep = Episode(episode_id="v0/1/0", group_id=0, task_id="t", prompt="p", completion="c",
               answer="a", reward_parts={"correct": 1.0})
  report = ScoreTrend()([ep], {"heldout": {"avg8": avg8}, "incumbent": {"avg8": 0.30}})
  return list(report.findings)


def test_an_improving_score_proposes_nothing_a_flat_one_a_learning_rate():
  improving, flat = _trend(0.35), _trend(0.30)
  assert [f.severity for f in improving] == [0.0] and [f.severity for f in flat] == [0.3]
  assert skill_hypotheses(improving, VALUES, SPACE, None) == []
  hyps = skill_hypotheses(flat, VALUES, SPACE, None)
  assert hyps and {h.finding for h in hyps} == {"score_trend"}
  assert {h.intervention.binding for h in hyps} == {"Learner.learning_rate"}


def test_runaway_length_turns_the_stop_rule_on_and_never_off():
  """The catalog answers runaway length with the stop rule when it is off; with the rule
  on, the finding can persist (completions whose block never closes), and switching the
  rule off is no answer to it: seed 13 of the stop-rule benchmark tried exactly that."""
  space = SearchSpace([ChoiceKnob("SamplingParams.stop_rule", ["", "code_block"], "filter"),
                       FloatKnob("SamplingParams.max_new_tokens", 64, 256)])
  runaway = [Finding("runaway_length", "efficiency", 0.5, 0.43, 0.25, "0.43 run long")]
  off = {"SamplingParams.stop_rule": "", "SamplingParams.max_new_tokens": 128}
  first = skill_hypotheses(runaway, off, space, None)[0].intervention
  assert (first.binding, first.old, first.new) == ("SamplingParams.stop_rule", "",
                                                   "code_block")
  on = {**off, "SamplingParams.stop_rule": "code_block"}
  hyps = skill_hypotheses(runaway, on, space, None)
  assert hyps and all(h.intervention.binding == "SamplingParams.max_new_tokens"
                      for h in hyps)


def test_a_change_that_answers_two_findings_is_proposed_once_and_cites_both():
  """`tool_validity` answers dead groups (any reward part) and episodes that never edit
  (the SWE catalog): one hypothesis, at the more severe finding's rank, citing both;
  `partial` answers both too; `format` only the dead groups."""
  from evotrainer.evolution.knobs import DictWeightKnob
  parts = "RewardComposer.parts"
  space = SearchSpace([DictWeightKnob(parts, "partial", 0.1, 0.9),
                       DictWeightKnob(parts, "format", 0.1, 0.9),
                       DictWeightKnob(parts, "tool_validity", 0.1, 0.9)])
  findings = [Finding("first_edit_turn", "behaviour", 0.4, 0.53, 0.5, "0.53 never edit"),
              Finding("dead_group_ratio", "signal", 0.9, 0.62, 0.5, "10 of 16 dead")]
  hyps = skill_hypotheses(findings, {parts: {"correct": 1.0}}, space, None)
  keys = [h.intervention.key for h in hyps]
  assert keys == ["partial", "format", "tool_validity"]  # each once, in the DGR entry's order
  assert {h.finding for h in hyps} == {"dead_group_ratio"}
  by = {h.intervention.key: h.statement for h in hyps}
  for key in ("partial", "tool_validity"):
    assert "because dead_group_ratio: 10 of 16 dead" in by[key]
    assert "; and first_edit_turn: 0.53 never edit" in by[key]
  assert "first_edit_turn" not in by["format"]
  assert [h.also for h in hyps] == [("first_edit_turn",), (), ("first_edit_turn",)]
