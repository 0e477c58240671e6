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


def test_exploration_draws_the_undo_of_a_kept_change_last_and_escalation_first():
  """Seed 2 of the real math benchmark kept 'grpo' -> 'rloo' and its next generation's
  only branch, an exploration draw, was 'rloo' -> 'grpo': the same comparison in reverse.
  Given the values before the last changes, the skills and random proposers' exploration
  ranks every undo after every other draw; an escalation (a lineage in trouble) ranks
  them first."""
  import random
  from evotrainer.evolution.knobs import DictWeightKnob
  from evotrainer.evolution.proposers import propose
  est, parts = "Harness.estimator", "RewardComposer.parts"
  space = SearchSpace([ChoiceKnob(est, ["grpo", "rloo", "dr_grpo"], "optimisation"),
                       DictWeightKnob(parts, "format", 0.1, 0.9)])
  values = {est: "rloo", parts: {"correct": 1.0, "format": 0.3}}
  previous = {est: "grpo", parts: {"correct": 1.0}}  # both kept changes

  def news(proposer, seed, **kw):
    hyps = propose(proposer, findings=[], values=values, space=space, skills=None,
                   rng=random.Random(seed), k=1, **kw)
    return [(h.intervention.binding, h.intervention.new) for h in hyps]

  undo_est, undo_parts = (est, "grpo"), (parts, {"correct": 1.0})
  for proposer in ("skills", "random"):
    for seed in range(20):
      got = news(proposer, seed, previous=previous)
      undo_at = [i for i, n in enumerate(got) if n in (undo_est, undo_parts)]
      assert undo_at == [len(got) - 2, len(got) - 1], got  # both drawn, both last
      assert (est, "dr_grpo") in got and any(b == parts for b, _ in got[:-2]), got
      first = news(proposer, seed, previous=previous, prefer_subtraction=True)
      assert max(first.index(undo_est), first.index(undo_parts)) < first.index(
          (est, "dr_grpo")), first  # reverts before the untried choice
  # Without the lineage's history an undo is an ordinary draw, first for some seeds.
  assert any(news("random", s)[0] == undo_est for s in range(20))
