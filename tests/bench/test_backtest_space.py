"""bench/backtest_space.py: every harness-side change of a space replayed on stored steps,
its dead-group rescues against a count by hand from the stored episodes."""

import pytest

from bench import backtest_space
from bench.replay import build_store
from evotrainer.evolution.backtest import harness_backtester
from evotrainer.evolution.knobs import ChoiceKnob, DictWeightKnob, FloatKnob
from evotrainer.evolution.search_space import SearchSpace
from evotrainer.harness.pipeline import Harness
from evotrainer.harness.rewards import RewardComposer

PARTS = "RewardComposer.parts"


def _builder(values):
  return Harness(composer=RewardComposer(parts=dict(values[PARTS])))


def _by_hand(store, weight: float, key: str) -> tuple[int, int]:
  """(dead groups under 'correct' alone, those whose rewards differ once `key` is added
  at `weight`), over every stored step and group."""
  dead = rescued = 0
  for step in store.steps("v0", "train"):
    groups: dict = {}
    for e in store.read_step("v0", step, "train").episodes:
      groups.setdefault(e.group_id, []).append(e.reward_parts)
    for parts in groups.values():
      if len({p["correct"] for p in parts}) == 1:
        dead += 1
        rescued += len({p["correct"] + weight * p[key] for p in parts}) > 1
  return dead, rescued


def test_each_reward_part_rescues_what_the_stored_episodes_say(tmp_path):
  store = build_store(str(tmp_path / "rollouts"), steps=3, groups=8, group_size=4)
  space = SearchSpace([
      DictWeightKnob(PARTS, "partial", 0.1, 0.9),  # wrong answers' closeness: varies
      DictWeightKnob(PARTS, "format", 0.1, 0.9),  # 1.0 on every row: rescues nothing
      FloatKnob("SamplingParams.temperature", 0.7, 1.3, group="hyper"),  # not replayable
      ChoiceKnob("Harness.estimator", ["grpo", "rloo"], group="estimator")])
  values = {PARTS: {"correct": 1.0}, "SamplingParams.temperature": 1.0,
            "Harness.estimator": "grpo"}
  rows = backtest_space.backtest_all(str(tmp_path / "rollouts"), "v0", space, values,
                                     harness_backtester(_builder))
  by = {r["change"]: r for r in rows}
  assert list(by) == ["RewardComposer.parts: add 'partial' = 0.5",
                      "RewardComposer.parts: add 'format' = 0.5",
                      "Harness.estimator: 'grpo' -> 'rloo'"]  # no temperature row
  dead, rescued = _by_hand(store, 0.5, "partial")
  assert 0 < rescued < dead  # the store has both kinds of dead group
  partial, fmt = by["RewardComposer.parts: add 'partial' = 0.5"], by[
      "RewardComposer.parts: add 'format' = 0.5"]
  assert (partial["dead_before"], partial["rescued"]) == (dead, rescued)
  assert (fmt["dead_before"], fmt["rescued"]) == (dead, 0)
  assert partial["on_target_dead_groups"] is (rescued >= -(-dead // 4))
  # `format` adds the same reward to every row: no advantage moves, the change is inert
  # (it would train its branch exactly like its parent) and fails the backtest.
  assert fmt["on_target_dead_groups"] is False and fmt["passed"] is False
  assert fmt["changed"] == 0 and fmt["why"].startswith("inert on the 3 stored steps")
  assert partial["changed"] > 0 and "inert" not in partial["why"]
  # `evolve.backtest_drops_inert = False` (the hackable demo) keeps an inert change.
  kept = backtest_space.backtest_all(str(tmp_path / "rollouts"), "v0", space, values,
                                     harness_backtester(_builder, drop_inert=False))
  # (`_builder` ignores the estimator: under it, that change is inert too.)
  assert [r["why"] for r in rows if not r["passed"]] == [
      "inert on the 3 stored steps: every row would train with the keep and advantage it "
      "had"] * 2
  assert [r["why"] for r in kept] == ["criterion met"] * 3
  assert by["Harness.estimator: 'grpo' -> 'rloo'"]["on_target_dead_groups"] is None


def test_a_missing_ledger_or_version_is_a_clear_error(tmp_path):
  with pytest.raises(SystemExit, match="no ledger.sqlite"):
    backtest_space.version_values(str(tmp_path), "v0")


SPACE_GIN = """
evolve.space = @SearchSpace()
SearchSpace.knobs = [@partial/DictWeightKnob(), @format/DictWeightKnob()]
partial/DictWeightKnob.binding = 'RewardComposer.parts'
partial/DictWeightKnob.key = 'partial'
partial/DictWeightKnob.low = 0.1
partial/DictWeightKnob.high = 0.9
format/DictWeightKnob.binding = 'RewardComposer.parts'
format/DictWeightKnob.key = 'format'
format/DictWeightKnob.low = 0.1
format/DictWeightKnob.high = 0.9
RewardComposer.parts = {'correct': 1.0, 'format': 0.3}
"""


def test_main_replays_the_version_of_the_ledger_as_the_run_configured_it(tmp_path):
  """Through the command line: the version's values come from the ledger (it holds no
  `format`, which the gin file's default has), so both parts are proposed as adds."""
  import gin
  import json
  from evotrainer.evolution.ledger.mirror import open_ledger
  run = tmp_path / "run"
  store = build_store(str(run / "versions" / "v0" / "rollouts"), steps=2, groups=8,
                      group_size=4, seed=3)
  with open_ledger(str(run)) as ledger:
    ledger.add_version("v0", bindings={PARTS: {"correct": 1.0}})
  (tmp_path / "space.gin").write_text(SPACE_GIN)
  out = tmp_path / "out.json"

  def changes(*bindings):
    try:
      backtest_space.main(["--run", str(run), "--gin_file", str(tmp_path / "space.gin"),
                           "--json", str(out), *bindings])
    finally:
      gin.clear_config()
    return {r["change"]: r for r in json.loads(out.read_text())["changes"]}

  rows = changes()
  assert set(rows) == {"RewardComposer.parts: add 'partial' = 0.5",
                       "RewardComposer.parts: add 'format' = 0.5"}
  dead, rescued = _by_hand(store, 0.5, "partial")
  assert rows["RewardComposer.parts: add 'partial' = 0.5"]["rescued"] == rescued > 0
  assert rows["RewardComposer.parts: add 'format' = 0.5"]["dead_before"] == dead
  # `format` is inert (1.0 on every row): the run's backtester drops it unless the run's
  # gin says `evolve.backtest_drops_inert = False`, as the controller's would.
  assert rows["RewardComposer.parts: add 'format' = 0.5"]["passed"] is False
  kept = changes("--gin_bindings", "evolve.backtest_drops_inert = False")
  assert kept["RewardComposer.parts: add 'format' = 0.5"]["passed"] is True
  with pytest.raises(SystemExit, match="no version 'v9'"):
    backtest_space.version_values(str(run), "v9")
