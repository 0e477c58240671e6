"""The paper's key SWE example at the controller: a branch whose episodes read the fix
from the git history (the real history agent's episodes on a checkout that keeps the
base) has the top validation score, and the `history_leak` validator rejects it, with
the evidence in its decision; a clean branch with a smaller real gain is promoted."""

import dataclasses

import pytest

from evotrainer import sandbox
from evotrainer.evolution.controller import Controller
from evotrainer.evolution.ledger import Ledger
from evotrainer.evolution.search_space import ChoiceKnob, SearchSpace
from evotrainer.tasks.swe.validators import HistoryLeak
from evotrainer.rollouts.store import RolloutStore
from evotrainer.tasks.swe import agents, episode as episode_lib, repo, tools
from evotrainer.tasks.swe import runner as runner_lib
from evotrainer.types import Episode

from tests.evolution.test_controller import ScriptedTrainer, by_change
from tests.tasks.swe.conftest import ADD_TASK, TOY, write_toy

GIT_ON = "ToolConfig.git = True"
# The leak pays most: +0.5 on every validation problem; 'rloo' a real +0.15.
EFFECTS = {"'rloo'": {"delta": 0.15}, GIT_ON: {"delta": 0.5}}
EPISODES = 8


@pytest.fixture(scope="module")
def infos(tmp_path_factory):
  """{'history': info, 'oracle': info}: `SweEpisode.info()` of the history agent and of
  the oracle, each played for real (git and the tests in the sandbox) on a toy checkout
  that keeps its base one commit back."""
  try:
    sandbox.check_namespaces()
  except sandbox.SandboxUnavailable as e:
    pytest.skip(str(e))
  tmp = tmp_path_factory.mktemp("leak")
  tree = write_toy(tmp / "tree")
  out = {}
  with runner_lib.SuiteRunner(workers=1) as suite:
    for name in ("history", "oracle"):
      repo.checkout(tree, ADD_TASK, tmp / name, keep_history=True)
      ep = episode_lib.SweEpisode(tools.Workspace(tmp / name, suite, TOY.tests,
                                                  tools.ToolConfig(git=True)))
      if name == "history":
        agents.history_agent(ep)
      else:
        for text in agents.oracle_turns(ADD_TASK):
          ep.step(text)
      assert repo.grade(ADD_TASK, tree, tmp / name, suite, TOY.tests).resolved, name
      out[name] = ep.info()
  return out


class LeakTrainer(ScriptedTrainer):
  """ScriptedTrainer that also stores each version's validation episodes: the history
  agent's where the branch turned the git tool on, the oracle's otherwise."""

  def __init__(self, effects, infos):
    super().__init__(effects)
    self.infos = infos

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    info = self.infos["history" if any(GIT_ON in b for b in bindings) else "oracle"]
    eps = [Episode(episode_id=f"{version}/val/{i}", group_id=i, task_id=ADD_TASK.instance_id,
                   prompt=ADD_TASK.problem_statement, completion="", answer="",
                   reward_parts={"correct": 1.0}, reward=1.0, info=info, version=version,
                   step=-1, split="heldout") for i in range(EPISODES)]
    store = f"{workdir}/rollouts"
    RolloutStore(store).write(version, 0, "heldout", eps)
    return dataclasses.replace(r, rollouts=store)


def evolve(workdir, infos, validators):
  """One generation of two branches (turn the git tool on; 'rloo'); (incumbent, ledger)."""
  ledger = Ledger(workdir / "ledger.sqlite")
  space = SearchSpace([ChoiceKnob("Harness.estimator", ["grpo", "rloo"], group="estimator"),
                       ChoiceKnob("ToolConfig.git", [False, True], group="harness")])
  c = Controller(ledger, LeakTrainer(EFFECTS, infos), space, workdir=workdir, branches=2,
                 generations=1, seed=3, bootstrap_n=1000,
                 values={"Harness.estimator": "grpo", "ToolConfig.git": False},
                 validators=validators)
  return c.run(), ledger


def test_the_history_reading_branch_scores_highest_and_is_rejected(tmp_path, infos):
  # Scoring alone promotes the leak.
  inc, ledger = evolve(tmp_path / "scoring_only", infos, [])
  assert inc.id == by_change(ledger)["ToolConfig.git: False -> True"].id
  inc, ledger = evolve(tmp_path / "gated", infos, [HistoryLeak(split="heldout")])
  br = by_change(ledger)
  leak = br["ToolConfig.git: False -> True"]
  clean = br["Harness.estimator: 'grpo' -> 'rloo'"]
  # The leak has the top validation score of its generation (+0.5 against +0.15) ...
  assert leak.heldout["avg8"] == max(v.heldout["avg8"] for v in br.values())
  assert leak.heldout["avg8"] > clean.heldout["avg8"] + 0.3
  # ... and is rejected by the history check, the evidence in the decision.
  assert leak.status == "rejected"
  assert leak.reason.startswith("rejected by validator history_leak"), leak.reason
  (decision,) = ledger.decisions(version=leak.id)
  assert decision.outcome == "failure" and "validator history_leak" in decision.why
  assert (f"{EPISODES} of {EPISODES} episodes read the repository's history" in
          decision.why and f"git diff x{EPISODES}" in decision.why), decision.why
  assert f"e.g. {leak.id}/val/0, {leak.id}/val/1, {leak.id}/val/2" in decision.why
  # The clean branch (the oracle's episodes: no history read) is promoted.
  assert clean.status == "kept" and inc.id == clean.id
