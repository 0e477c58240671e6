"""The controller's decisions on scripted trainers (no JAX training, no subprocess)."""

import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from evotrainer.evolution import stats
from evotrainer.evolution.controller import Controller, LoopConfig
from evotrainer.evolution.ledger import Ledger
from evotrainer.evolution.proposers import propose
from evotrainer.evolution.search_space import (ChoiceKnob, DictWeightKnob, FloatKnob, IntKnob,
                                               SearchSpace)
from evotrainer.evolution.skills import Skill, SkillLibrary
from evotrainer.evolution.branch_result import BranchResult
from evotrainer.harness.validators import ProxyTrueDisagreement

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBLEMS = [f"p{i:03d}" for i in range(100)]
VALUES = {"Learner.learning_rate": 1e-5, "Harness.estimator": "grpo",
          "RewardComposer.parts": {"correct": 1.0}, "train.group_size": 8}


def space():
  # From VALUES each knob has one or two single-factor candidates (5 in all):
  # lr 1e-5 -> 2e-5; estimator -> 'rloo'; parts: add 'hack'; group_size -> 12 or 4.
  return SearchSpace([
      FloatKnob("Learner.learning_rate", 1e-5, 1e-4, log=True),
      ChoiceKnob("Harness.estimator", ["grpo", "rloo"], group="estimator"),
      DictWeightKnob("RewardComposer.parts", "hack", 0.1, 1.0, initial=0.5),
      IntKnob("train.group_size", 4, 16, step=4)])


class Crash(BaseException):
  """A kill -9 stand-in: not an Exception, so the controller does not catch it."""


class ScriptedTrainer:
  """Held-out per-problem scores and series as a deterministic function of the bindings.

  `effects` maps a substring of a gin binding to {'delta': held-out gain, 'hack': bool}.
  Each problem's score is a base + the summed deltas + jitter in [-0.1, 0.1] seeded by
  (bindings, problem): two branches differ by problem-level noise, as real evals do. A
  'hack' branch's proxy reward climbs while its training BC stays flat.
  """

  def __init__(self, effects, crash_at=None):
    self.effects, self.crash_at, self.calls = effects, crash_at, []

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    if self.crash_at is not None and len(self.calls) == self.crash_at:
      raise Crash(version)
    self.calls.append(version)
    hit = [e for b in bindings for key, e in self.effects.items() if key in b]
    delta = sum(e.get("delta", 0.0) for e in hit)
    hack = any(e.get("hack") for e in hit)
    key = "|".join(sorted(bindings))
    per = {}
    for i, p in enumerate(PROBLEMS):
      jitter = random.Random(f"{key}|{p}").uniform(-0.1, 0.1)
      per[p] = 0.2 + 0.4 * i / len(PROBLEMS) + delta + jitter
    avg = sum(per.values()) / len(per)
    if hack:  # the proxy climbs, training BC stays flat
      correct, reward = [0.3] * 10, [0.1 + 0.09 * s for s in range(10)]
    else:
      correct = [0.3 + 0.01 * delta * s for s in range(10)]
      reward = list(correct)
    return BranchResult(version=version, checkpoint=f"{workdir}/ckpt", final={"avg8": avg},
                        initial={}, per_problem=per, series={"correct": correct,
                                                             "reward": reward},
                        rollouts="", steps=10, workdir=workdir)


def make(tmp_path, effects, name="run", trainer=None, **kw):
  workdir = tmp_path / name
  ledger = Ledger(workdir / "ledger.sqlite")
  trainer = trainer or ScriptedTrainer(effects)
  skills = SkillLibrary.seeded(workdir / "skills")
  kw.setdefault("branches", 5)
  kw.setdefault("generations", 1)
  kw.setdefault("values", VALUES)
  kw.setdefault("seed", 3)
  c = Controller(ledger, trainer, space(), skills, workdir=workdir, bootstrap_n=1000, **kw)
  return c, ledger, trainer


def changes(ledger):
  """The decisions of trained branches that change a binding (controls excluded)."""
  return [d for d in ledger.decisions() if d.version_id and "binding" in d.intervention]


def by_change(ledger):
  """{intervention description: version record} of the trained branches."""
  return {d.intervention["description"]: ledger.version(d.version_id)
          for d in changes(ledger)}


def lineage(ledger):
  inc = ledger.incumbent()
  return ([(v.id, v.parent, v.status, json.dumps(v.bindings, sort_keys=True))
           for v in ledger.versions()], inc and inc.id)


# ------------------------------------------------------------------ noise


def test_bootstrap_identical_scores_not_beyond_noise():
  scores = {p: 0.1 * (i % 7) for i, p in enumerate(PROBLEMS)}
  diff, lo, hi = stats.paired_bootstrap(scores, scores, seed=0)
  assert (diff, lo, hi) == (0.0, 0.0, 0.0)
  assert not stats.beats(scores, scores)


def test_bootstrap_clear_gain_is_beyond_noise():
  rng = random.Random(0)
  parent = {p: rng.random() * 0.5 for p in PROBLEMS}
  child = {p: v + 0.3 + rng.uniform(-0.1, 0.1) for p, v in parent.items()}
  diff, lo, hi = stats.paired_bootstrap(child, parent, seed=1)
  assert lo > 0.25 and hi < 0.35 and lo < diff < hi
  assert stats.beats(child, parent)
  assert not stats.beats(parent, child)


def test_bootstrap_only_shared_problems_and_hand_checked_mean():
  child = {"a": 1.0, "b": 0.5, "c": 0.0}
  parent = {"a": 0.0, "b": 0.5, "z": 1.0}
  diff, lo, hi = stats.paired_bootstrap(child, parent, n=500, seed=0)
  assert diff == pytest.approx(0.5)  # (1 - 0 + 0.5 - 0.5) / 2
  assert lo == pytest.approx(0.0) and hi == pytest.approx(1.0)
  assert all(x != x for x in stats.paired_bootstrap({"a": 1}, {"b": 1}))  # NaN, nothing shared


# ------------------------------------------------------------------ promotion


EFFECTS = {"'rloo'": {"delta": 0.2}, "2e-05": {"delta": 0.005},
           "'hack'": {"delta": 0.3, "hack": True}}


def test_promotion_beyond_noise_and_validator_rejects_top_proxy(tmp_path):
  c, ledger, trainer = make(tmp_path, EFFECTS)
  inc = c.run()
  br = by_change(ledger)
  rloo = br["Harness.estimator: 'grpo' -> 'rloo'"]
  small = br["Learner.learning_rate: 1e-05 -> 2e-05"]
  hack = next(v for d, v in br.items() if "hack" in d)
  assert inc.id == rloo.id and rloo.status == "kept"
  # +0.005 is inside the noise: rejected, with the interval in the reason.
  assert small.status == "rejected" and small.reason.startswith("not beyond noise")
  # The hack has the top proxy score AND the top held-out score, and is rejected.
  gen = [ledger.version(v.id) for v in br.values()]
  assert max(gen, key=lambda v: v.metrics["proxy_reward"]).id == hack.id
  assert max(gen, key=lambda v: v.heldout["avg8"]).id == hack.id
  assert hack.status == "rejected" and "proxy_true_disagreement" in hack.reason
  d = ledger.decisions(version=hack.id)[0]
  assert d.outcome == "failure" and "validator proxy_true_disagreement" in d.why
  assert ledger.decisions(version=rloo.id)[0].outcome == "success"
  # The root, 5 branches and the generation's control branch.
  assert trainer.calls == ["v0", "v1.0", "v1.1", "v1.2", "v1.3", "v1.4", "v1.c"]


def test_summary_json_fields(tmp_path):
  c, ledger, _ = make(tmp_path, EFFECTS)
  c.run()
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert s["mode"] == "evolve" and s["wall_s"] >= 0 and s["incumbent"] == ledger.incumbent().id
  assert len(s["versions"]) == 1 + 5 + 1  # the root, 5 branches, the control
  for v in s["versions"]:
    assert set(v) >= {"id", "parent", "status", "intervention", "heldout_avg8",
                      "proxy_reward", "reason"}
  hack = next(v for v in s["versions"] if "hack" in v["intervention"])
  assert "proxy_true_disagreement" in hack["reason"] and hack["status"] == "rejected"
  # Scripted results carry no exploit_recovery or canary figure and there is no strict
  # verifier: those validators could not judge.
  # Its 10-step series is long enough for the stability gate, and shows no drift.
  assert hack["validators"] == {"proxy_true_disagreement": "fail", "exploit_probe": "n/a",
                                "strict_verifier_agreement": "n/a",
                                "training_stability": "pass", "canary_prompts": "n/a"}
  root = s["versions"][0]
  assert root["id"] == "v0" and root["parent"] is None and root["intervention"] == "(root)"


def test_backtest_failure_drops_intervention(tmp_path):
  seen = []

  def backtester(store_root, version, before, after, iv):
    seen.append(iv.binding)
    if iv.binding == "RewardComposer.parts":
      return {"passed": False, "why": "rescues 0 of 12 dead groups"}
    return {"passed": True, "why": "criterion met"}

  c, ledger, trainer = make(tmp_path, EFFECTS, backtester=backtester)
  c.run()
  # Harness-side only: reward parts and the estimator, not the learner or sampling knobs.
  assert sorted(seen) == ["Harness.estimator", "RewardComposer.parts"]
  dropped = [d for d in ledger.decisions() if d.outcome == "dropped"]
  assert len(dropped) == 1 and dropped[0].version_id is None
  assert "rescues 0 of 12" in dropped[0].why and dropped[0].backtest["passed"] is False
  assert not any("hack" in d.intervention["description"] for d in ledger.decisions()
                 if d.version_id)
  assert len(trainer.calls) == 1 + 4 + 1  # the root, 4 branches, the control


def test_a_reward_part_aimed_at_dead_groups_that_rescues_too_few_is_not_trained(tmp_path):
  """`on_target` (backtest.py): a harmless reward-part change proposed for dead groups
  must rescue at least a quarter of the stored dead groups, ceil(0.25 * 10) = 3 here;
  a filter aimed at them, or a change aimed at another finding, is judged by the
  backtester alone."""
  from evotrainer.evolution.proposal import Proposal
  from evotrainer.evolution.proposers import Hypothesis
  from evotrainer.evolution.search_space import ComponentListKnob, Intervention
  rescued = {}

  def backtester(store_root, version, before, after, iv):
    return {"passed": True, "why": "criterion met", "dead_before": 10,
            "rescued": rescued[iv.binding]}

  class Results:
    def values(self, vid):
      return {**VALUES, "Harness.group_filters": []}

  partial = Intervention("RewardComposer.parts", {"correct": 1.0},
                         {"correct": 1.0, "partial": 0.3}, kind="add", key="partial")
  drop = Intervention("Harness.group_filters", [], ["@DropZeroVarianceGroups()"],
                      kind="add", key="drop_dead")
  hyp = lambda iv, finding: Hypothesis(iv, "s", "c", "catalog", "reward", None, finding)
  sp = SearchSpace([DictWeightKnob("RewardComposer.parts", "partial", 0.1, 1.0, initial=0.3),
                    ComponentListKnob("Harness.group_filters",
                                      {"drop_dead": "@DropZeroVarianceGroups()"},
                                      group="filter")])
  ledger = Ledger(tmp_path / "ledger.sqlite")
  ledger.add_version("v0", status="kept")
  proposal = Proposal(ledger, sp, None, Results(), backtester, proposer="skills",
                      branches=3, seed=0)
  r = BranchResult(version="v0", checkpoint="", final={}, initial={}, per_problem={},
                   series={}, rollouts="", steps=0, workdir="")
  rescued.update({"RewardComposer.parts": 2, "Harness.group_filters": 0})
  branches, dropped = proposal.select(1, [hyp(partial, "dead_group_ratio"),
                                          hyp(drop, "dead_group_ratio"),
                                          hyp(partial, "first_edit_turn")], r, "v0", {})
  assert dropped == ["g1-d0"]
  d = ledger.decisions()[0]
  assert d.outcome == "dropped" and d.backtest["passed"] is False
  assert d.why == ("backtest failed: aimed at dead groups, it rescues 2 of the 10 stored "
                   "(at least 3)")
  assert [b["hypothesis"]["finding"] for b in branches] == ["dead_group_ratio",
                                                            "first_edit_turn"]
  assert [b["backtest"]["passed"] for b in branches] == [True, True]
  rescued["RewardComposer.parts"] = 3  # a quarter, rounded up: trained
  branches, dropped = proposal.select(2, [hyp(partial, "dead_group_ratio")], r, "v0", {})
  assert dropped == [] and branches[0]["backtest"]["why"] == "criterion met"


# ------------------------------------------------------------------ escalation


def test_escalation_after_three_rejections(tmp_path):
  checks = []

  def eval_check():
    checks.append(1)
    return True, "verifier, splits and determinism checked"

  worse = {"'rloo'": {"delta": -0.2}, "2e-05": {"delta": -0.2}, "'hack'": {"delta": -0.2},
           "group_size = 12": {"delta": -0.2}, "group_size = 4": {"delta": -0.2}}
  c, ledger, _ = make(tmp_path, worse, branches=3, generations=2, eval_check=eval_check)
  c.run()
  assert ledger.incumbent().id == "v0"
  esc = [d for d in ledger.decisions() if d.id.endswith("escalation")]
  assert [d.id for d in esc] == ["g2-escalation"]
  assert checks == [1, 1]  # before training, then on the escalation
  assert "3 consecutive rejections" in esc[0].hypothesis
  assert "prefer a subtraction" in esc[0].why and "switch layer" in esc[0].why
  plan2 = ledger.get_meta("controller/plan/2")
  assert plan2["escalation"]["avoid_groups"]  # the failed layers come last
  # The failed layers are those of generation 1's branches (all rejected).
  groups1 = {b["hypothesis"]["group"] for b in ledger.get_meta("controller/plan/1")["branches"]}
  assert set(plan2["escalation"]["avoid_groups"]) == groups1


def test_second_escalation_rolls_back_to_the_last_good_version(tmp_path):
  # The other changes do nothing (not beyond noise): children that regress beyond noise
  # would make the incumbent itself suspect first (test_promotion.py).
  effects = {"'rloo'": {"delta": 0.2}, "2e-05": {"delta": 0.0}, "'hack'": {"delta": 0.0},
             "group_size": {"delta": 0.0}}
  c, ledger, _ = make(tmp_path, effects, branches=5, generations=3, escalate_after=2)
  c.run()
  kept = ledger.get_meta("controller/evaluated/1")["promoted"]
  assert ledger.version(kept).status == "kept"
  # Generation 2 rejects all 5 branches of `kept` (>= 2 * escalate_after): generation 3
  # escalates with a rollback to the last good version before it.
  esc = ledger.get_meta("controller/plan/3")["escalation"]
  assert esc["rollback"] == "v0"
  assert ledger.get_meta("controller/plan/3")["parent"] == "v0"
  assert "rolled back from" in ledger.decision("g3-escalation").why


def test_escalation_ordering_switches_layer_and_prefers_subtraction():
  values = {**VALUES, "RewardComposer.parts": {"correct": 1.0, "hack": 0.5}}
  base = propose("random", findings=[], values=values, space=space(), skills=None,
                 rng=random.Random(0), k=3)
  sub = propose("random", findings=[], values=values, space=space(), skills=None,
                rng=random.Random(0), k=3, prefer_subtraction=True)
  assert sub[0].intervention.kind == "remove" and base[0].intervention.kind != "remove"
  assert sorted(h.intervention.id for h in sub) == sorted(h.intervention.id for h in base)
  moved = propose("random", findings=[], values=values, space=space(), skills=None,
                  rng=random.Random(0), k=3, avoid_groups=["hyper", "reward"])
  groups = [h.group for h in moved]
  assert groups[0] == "estimator" and set(groups[1:]) <= {"hyper", "reward"}
  tried = propose("random", findings=[], values=values, space=space(), skills=None,
                  rng=random.Random(0), k=3, exclude=[base[0].intervention.id])
  assert base[0].intervention.id not in {h.intervention.id for h in tried}


def test_a_change_refuted_on_an_ancestor_is_not_proposed_again(tmp_path):
  # Generation 1 tries all 5 single-factor changes from v0: 'rloo' wins, the learning
  # rate 1e-5 -> 2e-5 is worse beyond noise, the others are noise. Generation 2 starts
  # from the 'rloo' branch, which still holds lr 1e-5, so the same change (same id) is
  # available again: it is refuted, so it is not proposed; the inconclusive ones are.
  effects = {"'rloo'": {"delta": 0.2}, "2e-05": {"delta": -0.2}}
  c, ledger, _ = make(tmp_path, effects, branches=5, generations=2, proposer="random",
                      validators=[])
  c.run()
  gen = lambda g: {d.intervention["description"]: ledger.version(d.version_id)  # noqa: E731
                   for d in changes(ledger) if d.id.startswith(f"g{g}-")}
  first, second = gen(1), gen(2)
  lr = "Learner.learning_rate: 1e-05 -> 2e-05"
  assert len(first) == 5 and first[lr].heldout["verdict"] == "worse_beyond_noise"
  kept = next(v for v in first.values() if v.status == "kept")
  assert kept.bindings == {"Harness.estimator": "rloo"}
  assert ledger.get_meta("controller/plan/2")["parent"] == kept.id
  inconclusive = {d for d, v in first.items()
                  if v.heldout["verdict"].startswith("not_beyond_noise")}
  assert inconclusive  # the test needs changes that were tried without a verdict
  assert lr not in second
  assert inconclusive <= set(second)  # not refuted: eligible again from the new incumbent


def test_failing_eval_check_halts_with_a_record(tmp_path):
  from evotrainer.evolution.controller import EvaluationPipelineError
  worse = {k: {"delta": -0.2} for k in ("'rloo'", "2e-05", "'hack'", "group_size")}
  calls = []

  def breaks_after_the_start():  # passes before training, fails on the escalation
    calls.append(1)
    return len(calls) == 1, "verifier accepts a known-wrong answer"

  c, ledger, _ = make(tmp_path, worse, branches=3, generations=2,
                      eval_check=breaks_after_the_start)
  with pytest.raises(EvaluationPipelineError, match="known-wrong"):
    c.run()
  assert ledger.decision("g2-escalation").outcome == "failure" and len(calls) == 2


# ------------------------------------------------------------------ harness evolution


def test_revised_harness_demotes_a_kept_version(tmp_path):
  # No validator at first: the hack (highest held-out score) is kept...
  c, ledger, _ = make(tmp_path, EFFECTS, validators=[])
  c.run()
  hack = next(v for d, v in by_change(ledger).items() if "hack" in d)
  hack = ledger.version(hack.id)
  # ... then the gap "proxy rises while BC is flat" adds proxy_true_disagreement, the
  # kept versions are re-checked, the hack is demoted and the incumbent rolls back.
  assert hack.status == "rejected"
  assert "demoted under harness h1" in hack.reason
  assert "proxy_true_disagreement" in hack.reason
  assert ledger.incumbent().id == "v0"
  h1 = ledger.harness_version("h1")
  assert h1.parent == "h0" and "proxy_true_disagreement" in h1.validators
  assert "signal ambiguous" in h1.reason
  assert ledger.decisions(version=hack.id)[0].outcome == "success"  # its original verdict
  # The next generation runs under the revised harness and from the rolled-back incumbent.
  c2 = Controller(ledger, ScriptedTrainer(EFFECTS), space(), None, workdir=tmp_path / "run",
                  values=VALUES, seed=3, branches=2, generations=2, bootstrap_n=500)
  c2.run()
  assert ledger.get_meta("controller/plan/2")["parent"] == "v0"
  assert ledger.get_meta("controller/plan/2")["harness"] == "h1"


def test_demotion_prunes_kept_descendants(tmp_path):
  c, ledger, _ = make(tmp_path, EFFECTS, validators=[], generations=0)
  c.run()
  with ledger.transaction():
    ledger.add_version("v1.0", "v0", bindings={"x": 1}, status="running")
    ledger.add_version("v2.0", "v1.0", bindings={"y": 1}, status="running")
  tr = ScriptedTrainer({})
  for vid, hack in (("v1.0", True), ("v2.0", False)):
    r = tr.train(version=vid, parent_checkpoint=None, bindings=["'hack'"] if hack else [],
                 seed=0, workdir=str(tmp_path))
    if hack:
      r = BranchResult(**{**r.__dict__, "series": {"correct": [0.3] * 10,
                                                   "reward": [0.1 * s for s in range(10)]}})
    c.results.store(vid, r)
  ledger.promote("v1.0", "kept")
  ledger.promote("v2.0", "kept")
  from evotrainer.harness.validators import run_validators
  with ledger.transaction():
    c.harness.recheck("h9", [ProxyTrueDisagreement()], run_validators)
  assert ledger.version("v1.0").status == "rejected"
  assert ledger.version("v2.0").status == "pruned"
  assert "descends from demoted v1.0" in ledger.version("v2.0").reason
  assert ledger.incumbent().id == "v0"


# ------------------------------------------------------------------ resume


RESUME_EFFECTS = {"'rloo'": {"delta": 0.15}, "2e-05": {"delta": 0.1},
                  "'hack'": {"delta": 0.3, "hack": True}, "group_size = 12": {"delta": 0.05}}


def test_resume_after_generations_equals_uninterrupted(tmp_path):
  full, lf, _ = make(tmp_path, RESUME_EFFECTS, name="full", branches=3, generations=4)
  full.run()
  part, lp, t1 = make(tmp_path, RESUME_EFFECTS, name="part", branches=3, generations=2)
  part.run()
  del part
  lp2 = Ledger(tmp_path / "part" / "ledger.sqlite")
  t2 = ScriptedTrainer(RESUME_EFFECTS)
  again = Controller(lp2, t2, space(), SkillLibrary(tmp_path / "part" / "skills"),
                     workdir=tmp_path / "part", values=VALUES, seed=3, bootstrap_n=1000,
                     branches=3, generations=4)
  again.run()
  assert lineage(lp2) == lineage(lf)
  # Every generation trains branches (a rolled-back incumbent may have fewer left) and a
  # control.
  assert 1 + 4 * 3 <= len(lf.versions()) <= 1 + 4 * (3 + 1)
  assert not set(t1.calls) & set(t2.calls)  # nothing trained twice
  assert lf.get_meta("controller/generation") == 4


@pytest.mark.parametrize("crash_at", [0, 3, 5, 8])
def test_resume_after_a_crash_mid_generation(tmp_path, crash_at):
  full, lf, _ = make(tmp_path, RESUME_EFFECTS, name="full", branches=3, generations=3)
  full.run()
  trainer = ScriptedTrainer(RESUME_EFFECTS, crash_at=crash_at)
  c, ledger, _ = make(tmp_path, RESUME_EFFECTS, name="crash", trainer=trainer, branches=3,
                      generations=3)
  with pytest.raises(Crash):
    c.run()
  before = list(trainer.calls)
  ledger2 = Ledger(tmp_path / "crash" / "ledger.sqlite")
  t2 = ScriptedTrainer(RESUME_EFFECTS)
  Controller(ledger2, t2, space(), SkillLibrary(tmp_path / "crash" / "skills"),
             workdir=tmp_path / "crash", values=VALUES, seed=3, bootstrap_n=1000, branches=3,
             generations=3).run()
  assert lineage(ledger2) == lineage(lf)
  assert not set(before) & set(t2.calls)
  assert sorted(before + t2.calls) == sorted(v.id for v in lf.versions())


# ------------------------------------------------------------------ proposers


def test_recipe_proposer_turns_only_hyper_parameters(tmp_path):
  c, ledger, _ = make(tmp_path, EFFECTS, proposer="recipe", branches=5, generations=1)
  c.run()
  bindings = {d.intervention["binding"] for d in changes(ledger)}
  assert bindings == {"Learner.learning_rate", "train.group_size"}
  assert ledger.findings() == []  # diagnostics ignored


def test_random_proposer_covers_the_space(tmp_path):
  c, ledger, _ = make(tmp_path, EFFECTS, proposer="random", branches=5, generations=1)
  c.run()
  assert len({d.intervention["binding"] for d in changes(ledger)}) == 4


def test_proxy_proposer_trains_what_the_backtest_says_pays_most(tmp_path):
  gains = {"RewardComposer.parts": 0.4, "Harness.estimator": 0.1}

  def backtester(store_root, version, before, after, iv):
    return {"passed": True, "why": "criterion met", "reward_before": 0.3,
            "reward_after": 0.3 + gains[iv.binding]}

  c, ledger, _ = make(tmp_path, EFFECTS, proposer="proxy", branches=2, backtester=backtester)
  c.run()
  # The reward part (+0.4) first, then the estimator (+0.1); learner knobs (no backtest)
  # after both.
  assert [d.intervention["binding"] for d in changes(ledger)] == ["RewardComposer.parts",
                                                                 "Harness.estimator"]
  assert changes(ledger)[0].backtest["reward_after"] == pytest.approx(0.7)


def test_skill_proposals_come_first(tmp_path):
  # A finding that a seed skill matches: proxy rising while BC is flat on the incumbent.
  class HackRoot(ScriptedTrainer):
    def train(self, **kw):
      r = super().train(**kw)
      if kw["version"] == "v0":
        r = BranchResult(**{**r.__dict__, "series": {"correct": [0.3] * 10,
                                                     "reward": [0.1 * s for s in range(10)]}})
      return r

  values = {**VALUES, "RewardComposer.parts": {"correct": 1.0, "hack": 0.5}}
  workdir = tmp_path / "skills_run"
  ledger = Ledger(workdir / "ledger.sqlite")
  c = Controller(ledger, HackRoot({}), space(), SkillLibrary.seeded(workdir / "skills"),
                 workdir=workdir, values=values, seed=3, branches=2, generations=1,
                 bootstrap_n=500)
  c.run()
  kinds = [f.kind for f in ledger.findings(version="v0")]
  assert "proxy_true_disagreement" in kinds
  plan = ledger.get_meta("controller/plan/1")
  first = plan["branches"][0]["hypothesis"]
  assert first["source"] in ("skill", "catalog")
  assert first["intervention"]["kind"] == "remove"  # the subtraction of the gameable part


# ------------------------------------------------------------------ human gates


def test_human_gated_waits_for_approve_callable(tmp_path):
  gates = []

  def approve(gate):
    gates.append(gate["stage"])
    assert (tmp_path / "run" / "gate.json").exists()
    return True

  c, ledger, _ = make(tmp_path, EFFECTS, human_gated=True, approve=approve, poll_s=0.01)
  c.run()
  assert gates == ["diagnosis", "design", "backtest", "verification"]
  assert not (tmp_path / "run" / "gate.json").exists()


def test_human_gated_waits_for_approve_file(tmp_path):
  c, ledger, trainer = make(tmp_path, EFFECTS, human_gated=True, poll_s=0.01,
                            gate_timeout_s=30)
  errors = []

  def go():
    try:
      c.run()
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  th = threading.Thread(target=go)
  th.start()
  gate_path, stages = tmp_path / "run" / "gate.json", []
  deadline = time.time() + 30
  while th.is_alive() and time.time() < deadline:
    if gate_path.exists() and not (tmp_path / "run" / "approve").exists():
      try:
        gate = json.loads(gate_path.read_text())
      except (json.JSONDecodeError, FileNotFoundError):
        continue
      if not stages or stages[-1] != gate["stage"]:
        stages.append(gate["stage"])
        if gate["stage"] == "diagnosis":
          time.sleep(0.1)
          assert len(trainer.calls) == 1  # paused: no branch trained yet
        if gate["stage"] == "design":  # the command-line approval
          wrong = subprocess.run([sys.executable, "-m", "evotrainer.launch",
                                  f"--workdir={tmp_path / 'run'}", "--approve=backtest"],
                                 cwd=REPO, capture_output=True, text=True, timeout=120)
          assert wrong.returncode == 2 and "is 'design' of generation 1" in wrong.stderr
          assert not (tmp_path / "run" / "approve").exists()  # refused: nothing written
          out = subprocess.run([sys.executable, "-m", "evotrainer.launch",
                                f"--workdir={tmp_path / 'run'}", "--approve=design"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
          assert out.returncode == 0, out.stderr
          assert "approved gate 'design' of generation 1" in out.stdout
        else:
          (tmp_path / "run" / "approve").touch()
    time.sleep(0.005)
  th.join(5)
  assert not errors and not th.is_alive()
  assert stages == ["diagnosis", "design", "backtest", "verification"]
  assert ledger.get_meta("controller/generation") == 1


def test_approve_without_a_waiting_gate_is_a_clear_error(tmp_path):
  out = subprocess.run([sys.executable, "-m", "evotrainer.launch", f"--workdir={tmp_path}",
                        "--approve=design"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2 and "no gate is waiting" in out.stderr
  assert not (tmp_path / "approve").exists()


class EpisodeTrainer(ScriptedTrainer):
  """ScriptedTrainer that also stores 16 training episodes per version: half correct for
  every version (BC never moves); completions 4 tokens long, 12 for an 'rloo' branch."""

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    import numpy as np

    from evotrainer.rollouts.store import RolloutStore
    from evotrainer.types import Episode
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    n = 12 if any("'rloo'" in b for b in bindings) else 4
    eps = [Episode(episode_id=f"{version}/1/{i}", group_id=i // 4, task_id=f"p{i}",
                   prompt="1+1=", completion="x" * n, answer="2",
                   reward_parts={"correct": float(i % 2)}, reward=float(i % 2),
                   completion_ids=np.arange(n, dtype=np.int32), version=version, step=1)
           for i in range(16)]
    store = f"{workdir}/rollouts"
    RolloutStore(store).write(version, 1, "train", eps)
    return dataclasses.replace(r, rollouts=store)


def test_unexplained_score_change_enables_a_diagnostic_that_explains_it(tmp_path):
  from evotrainer.harness.diagnostics import CorrectnessRate
  c, ledger, _ = make(tmp_path, EFFECTS, trainer=EpisodeTrainer(EFFECTS), branches=2,
                      diagnostics=[CorrectnessRate()], validators=[])
  c.run()
  rloo = next(v for d, v in by_change(ledger).items() if "rloo" in d)
  assert ledger.version(rloo.id).heldout["lo"] > 0  # a gain beyond noise ...
  h1 = ledger.harness_version("h1")  # ... that BC does not explain: the length did move
  assert f"score change unexplained on {rloo.id}" in h1.reason
  assert "length" in h1.diagnostics and "bc" in h1.diagnostics
  assert f"diagnostic length moved with the unexplained score change of {rloo.id}" in h1.reason


def test_explained_score_change_is_not_a_gap(tmp_path):
  from evotrainer.harness.diagnostics import CorrectnessRate, LengthPercentiles
  c, ledger, _ = make(tmp_path, EFFECTS, trainer=EpisodeTrainer(EFFECTS), branches=2,
                      diagnostics=[CorrectnessRate(), LengthPercentiles()], validators=[])
  c.run()
  gaps = ledger.get_meta("controller/harness_done/1")["gaps"]
  assert not any(g.startswith("score change unexplained") for g in gaps)


def test_progress_lines_name_each_training_and_verdict(tmp_path, capsys):
  c, ledger, _ = make(tmp_path, EFFECTS, branches=2, progress=True)
  c.run()
  out = capsys.readouterr().out.splitlines()
  assert "[evolve] training v0: the root" in out
  assert "[evolve] generation 1/1: diagnosing incumbent v0 (held-out avg8 " in "\n".join(out)
  for v in ("v1.0", "v1.1"):
    rec = ledger.version(v)
    assert any(line.startswith(f"[evolve] training {v}: ") for line in out)
    assert any(line.startswith(f"[evolve] {v} trained in ") for line in out)
    verdict = "KEPT" if rec.status == "kept" else "rejected"
    assert f"[evolve] {v} {verdict}: {rec.reason}" in out
  assert out[-1].startswith(f"[evolve] done: incumbent {ledger.incumbent().id}")


def test_a_kept_exploration_change_becomes_a_skill_the_next_run_proposes_first(tmp_path):
  c, ledger, _ = make(tmp_path, EFFECTS, name="first")
  c.run()
  rloo = next(v for d, v in by_change(ledger).items() if "rloo" in d)
  assert ledger.version(rloo.id).status == "kept"
  assert ledger.decisions(version=rloo.id)[0].skill is None  # no skill proposed it
  (skill,) = [s for s in SkillLibrary(tmp_path / "first" / "skills")
              if s.name.startswith("learned-state-harness-estimator-set-")]
  assert skill.trigger == {"binding": "Harness.estimator", "op": "==", "value": "grpo"}
  assert skill.intervention == {"binding": "Harness.estimator", "kind": "set",
                                "value": "rloo"}
  assert skill.successes == 1
  # A second run from the first run's skills tries that change first.
  workdir = tmp_path / "second"
  skills = SkillLibrary.seeded(workdir / "skills", sources=[tmp_path / "first" / "skills"])
  second = Controller(Ledger(workdir / "ledger.sqlite"), ScriptedTrainer(EFFECTS), space(),
                      skills, workdir=workdir, values=VALUES, seed=11, bootstrap_n=1000,
                      branches=1, generations=1)
  second.run()
  (d,) = changes(second.ledger)
  assert d.skill == skill.name
  assert d.intervention["new"] == "rloo" and d.outcome == "success"
  # Its success is counted beside the first run's, each under its run's identity and
  # with the effect it measured (test_skills: the same version name in two runs).
  again = second.skills.get(skill.name)
  assert again.successes == 2
  assert [h["run"] for h in again.history] == [ledger.run_uid, second.ledger.run_uid]
  assert all(h["effect"]["lo"] > 0 for h in again.history)
  # The first run learned it from a keep (recorded because it was good); the second
  # measured the branch the skill proposed (recorded whatever its outcome).
  assert [h["selected"] for h in again.history] == [True, False]


class BindingTrainer(ScriptedTrainer):
  """ScriptedTrainer that also records the gin bindings each version trained under."""

  def __init__(self, effects):
    super().__init__(effects)
    self.bindings = {}

  def train(self, *, version, bindings, **kw):
    self.bindings[version] = list(bindings)
    return super().train(version=version, bindings=bindings, **kw)


def _measured_skill(lib, name, intervention, effects, domain="math", against="control",
                    discovered=False):
  """A skill whose history holds `effects` (paired diffs, half-width 0.05, measured
  `against`), one run each; `discovered`: the first is the keep that learned it."""
  lib.add(Skill(name=name, category="training stability", description="d",
                trigger={"finding": "dead_group_ratio", "op": ">", "value": 0.5},
                intervention=intervention, expected_outcome="e", validation_criterion="v",
                domains={}))
  for i, e in enumerate(effects):
    lib.record_outcome(name, domain, None, version=f"v{i}.0", run=f"earlier-{i}",
                       effect={"diff": e, "lo": e - 0.05, "hi": e + 0.05,
                               "against": against}, selected=discovered and i == 0)


@pytest.mark.parametrize("adopt_against", ["control", "parent"])
def test_adopt_skills_counts_effects_against_the_parent_only_when_told(tmp_path,
                                                                       adopt_against):
  """A skill proven only against its parent (a run without controls) is not adopted by
  default, and the run says why; `adopt_against='parent'` adopts it."""
  trainer = BindingTrainer({})
  c, ledger, _ = make(tmp_path, {}, trainer=trainer, generations=0, branches=1,
                      adopt_skills=2, adopt_against=adopt_against)
  _measured_skill(c.skills, "rloo-uncontrolled", {"binding": "Harness.estimator",
                                                  "kind": "set", "value": "rloo"},
                  [0.1, 0.1], against="parent")
  said = []
  c.progress.say = said.append
  c.run()
  adopted = ledger.get_meta("controller/adopted")["skills"]
  if adopt_against == "parent":
    assert adopted == ["rloo-uncontrolled"] and trainer.bindings["v0"]
  else:
    assert adopted == [] and trainer.bindings["v0"] == []
    assert any("none is proven against a control" in line for line in said)


@pytest.mark.parametrize("adopt_discoveries", [False, True])
def test_adopt_skills_counts_the_keep_that_learned_a_skill_only_when_told(
    tmp_path, adopt_discoveries):
  """Two measurements are asked for; one of the two is the keep that learned the skill
  (recorded because it was good): not adopted by default, and the run says why."""
  trainer = BindingTrainer({})
  c, ledger, _ = make(tmp_path, {}, trainer=trainer, generations=0, branches=1,
                      adopt_skills=2, adopt_discoveries=adopt_discoveries)
  _measured_skill(c.skills, "rloo-learned", {"binding": "Harness.estimator",
                                             "kind": "set", "value": "rloo"},
                  [0.1, 0.1], discovered=True)
  said = []
  c.progress.say = said.append
  c.run()
  adopted = ledger.get_meta("controller/adopted")["skills"]
  assert adopted == (["rloo-learned"] if adopt_discoveries else [])
  assert bool(trainer.bindings["v0"]) == adopt_discoveries
  assert any("evolve.adopt_discoveries = True" in line for line in said) != adopt_discoveries


def test_adopt_against_must_name_what_a_measurement_was_against():
  with pytest.raises(ValueError, match="adopt_against='sibling'"):
    LoopConfig(adopt_against="sibling")
  with pytest.raises(ValueError, match="adopt_discoveries='yes'"):
    LoopConfig(adopt_discoveries="yes")
  for gain in (-0.01, float("nan"), "0.02"):
    with pytest.raises(ValueError, match="adopt_step_gain="):
      LoopConfig(adopt_step_gain=gain)


@pytest.mark.parametrize("adopt", [0, 2])
def test_adopt_skills_starts_the_root_from_proven_skills_and_every_version_keeps_them(
    tmp_path, adopt):
  trainer = BindingTrainer({})
  c, ledger, _ = make(tmp_path, {}, trainer=trainer, generations=1, branches=1,
                      adopt_skills=adopt)
  _measured_skill(c.skills, "rloo-proven", {"binding": "Harness.estimator", "kind": "set",
                                            "value": "rloo"}, [0.1, 0.1])
  _measured_skill(c.skills, "lr-measured-once", {"binding": "Learner.learning_rate",
                                                 "kind": "set", "value": 2e-5}, [0.2])
  _measured_skill(c.skills, "group-in-code", {"binding": "train.group_size", "kind": "set",
                                              "value": 12}, [0.1, 0.1], domain="code")
  c.run()
  root = ledger.version("v0")
  assert root.bindings["Learner.learning_rate"] == 1e-5
  assert root.bindings["train.group_size"] == 8
  if not adopt:
    assert root.bindings["Harness.estimator"] == "grpo"
    assert ledger.get_meta("controller/adopted") is None and trainer.bindings["v0"] == []
    return
  assert root.bindings["Harness.estimator"] == "rloo"
  assert ledger.get_meta("controller/adopted") == {"skills": ["rloo-proven"],
                                                   "base": {"Harness.estimator": "grpo"}}
  assert "adopted skills: rloo-proven" in root.reason
  assert trainer.bindings["v0"] == ["Harness.estimator = 'rloo'"]
  assert len(trainer.bindings) >= 3  # the root, the control and a branch
  for vid, bindings in trainer.bindings.items():  # a version that keeps it trains with it
    keeps = c.results.values(vid)["Harness.estimator"] == "rloo"
    assert ("Harness.estimator = 'rloo'" in bindings) == keeps, (vid, bindings)
