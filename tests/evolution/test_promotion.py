"""Honest promotion: Holm's correction by hand, the point-estimate mutant, a family-wise
correction that can reject, distinct failure verdicts, a suspect incumbent rolled back
and its subtraction learned as a skill that a later run prefers, and a controller that never reads the test split."""

import ast
import dataclasses
import json
import pathlib
import random

import pytest

from evotrainer.eval.test_scores import TEST_FILE, attach_test
from evotrainer.evolution import stats
from evotrainer.evolution.branch_result import BranchResult
from evotrainer.evolution.skills import SEED_DIR, SkillLibrary
from tests.evolution.test_controller import (PROBLEMS, VALUES, ScriptedTrainer, changes,
                                             make)

EVOLUTION = pathlib.Path(__file__).resolve().parents[2] / "evotrainer" / "evolution"


def test_holm_by_hand():
  # Sorted 0.01 <= 0.05/3 rejects; then 0.03 > 0.05/2 stops (0.04 is not reached).
  assert stats.holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]
  assert stats.holm([0.02, 0.01], 0.05) == [True, True]  # 0.01 <= .025, 0.02 <= .05
  assert stats.holm([0.03, 0.03], 0.05) == [False, False]  # 0.03 > 0.025
  assert stats.holm([], 0.05) == []


def test_paired_test_p_value_by_hand():
  # Every difference is +1: no resample mean is <= 0, p = 1 / (n + 1).
  t = stats.paired_test({"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 0.0}, n=99, seed=0)
  assert t["p"] == pytest.approx(0.01) and t["diff"] == 1.0 and t["problems"] == 2
  # Every difference is 0: every resample mean is 0, p = (1 + n) / (n + 1) = 1.
  assert stats.paired_test({"a": 0.5}, {"a": 0.5}, n=99)["p"] == 1.0


class ShiftTrainer(ScriptedTrainer):
  """Per-problem validation scores = the parent's + a fixed per-problem shift for the
  bindings that match `shifts` (no jitter: the test controls the statistics exactly)."""

  def __init__(self, shifts, base=None):
    super().__init__({})
    self.shifts = shifts
    self.base = base or {p: 0.2 + 0.5 * (i % 10) / 10 for i, p in enumerate(PROBLEMS)}

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    self.calls.append(version)
    per = dict(self.base)
    for b in bindings:
      for key, shift in self.shifts.items():
        if key in b:
          per = {p: v + shift[p] for p, v in per.items()}
    avg = sum(per.values()) / len(per)
    return BranchResult(version=version, checkpoint=f"{workdir}/ckpt", final={"avg8": avg},
                        initial={}, per_problem=per, series={"correct": [0.3] * 5,
                                                             "reward": [0.3] * 5},
                        rollouts="", steps=10, workdir=workdir)


def _shift(gain_share: float, up: float, down: float) -> dict:
  """+up on the first `gain_share` of problems, -down on the rest."""
  k = int(len(PROBLEMS) * gain_share)
  return {p: (up if i < k else -down) for i, p in enumerate(PROBLEMS)}


def test_point_estimate_gain_inside_the_noise_is_not_kept(tmp_path):
  """Kills the mutant that promotes on diff > 0: the only change has a positive mean
  (+0.002) whose interval contains 0."""
  shift = _shift(0.5, 0.05, 0.046)
  assert sum(shift.values()) > 0
  c, ledger, _ = make(tmp_path, {}, trainer=ShiftTrainer({"'rloo'": shift}),
                      branches=1, proposer="random")
  # Force the one proposal to be the estimator change.
  c.space.knobs = [k for k in c.space.knobs if k.binding == "Harness.estimator"]
  c.run()
  v = ledger.version("v1.0")
  assert v.heldout["diff"] > 0 and v.heldout["lo"] < 0 < v.heldout["hi"]
  assert v.status == "rejected" and v.reason.startswith("not beyond noise")
  assert v.heldout["verdict"] == "not_beyond_noise"
  assert ledger.incumbent().id == "v0"


def test_keep_on_mean_keeps_a_gain_inside_the_noise_and_records_only_its_effect(tmp_path):
  """`VerifyConfig.keep_on='mean'`: the same +0.002 within noise is kept (its steps are
  not thrown away), said so in its reason, and is learned as a skill with no success,
  only its measured effect (the ledger's paired figures, under the run's identity); a
  -0.002 is not kept and teaches nothing."""
  for name, up, down, kept in (("gain", 0.05, 0.046, True), ("loss", 0.046, 0.05, False)):
    shift = _shift(0.5, up, down)
    c, ledger, _ = make(tmp_path, {}, name=name, trainer=ShiftTrainer({"'rloo'": shift}),
                        branches=1, proposer="random", keep_on="mean")
    _one_knob(c, "Harness.estimator").run()
    v = ledger.version("v1.0")
    assert v.heldout["lo"] < 0 < v.heldout["hi"]
    if kept:
      assert v.status == "kept" and v.heldout["verdict"] == "kept"
      assert v.reason.startswith("kept on the mean (keep_on='mean'), not beyond noise")
      assert ledger.incumbent().id == "v1.0"
      (learned,) = _learned(tmp_path, name)
      skill = SkillLibrary(tmp_path / name / "skills").get(learned[:-len(".json")])
      assert (skill.successes, skill.failures) == (0, 0)
      (h,) = skill.history
      assert h["success"] is None and h["run"] == ledger.run_uid and h["version"] == "v1.0"
      assert h["effect"] == {**{k: pytest.approx(v.heldout[k]) for k in ("diff", "lo", "hi")},
                             "against": "control"}
    else:
      # Rejected on the rule that decided it: the mean, not the interval.
      assert v.status == "rejected" and v.heldout["verdict"] == "behind_on_mean"
      assert v.reason.startswith("not ahead on the validation mean (keep_on='mean'), "
                                 "within noise")
      assert ledger.incumbent().id == "v0" and _learned(tmp_path, name) == []


def test_keep_on_not_worse_keeps_a_tie_that_mean_rejects(tmp_path):
  """A branch whose validation mean equals its control's (+1/8 on half the problems,
  -1/8 on the rest: exact in floating point, as Avg@8 scores are): `keep_on='mean'`
  rejects it (its steps are lost), `'not_worse'` keeps it; both reject a loss."""
  base = {p: (i % 8) / 8 for i, p in enumerate(PROBLEMS)}
  tie, loss = _shift(0.5, 0.125, 0.125), _shift(0.5, 0.125, 0.25)
  for name, keep_on, shift, kept in (("mean", "mean", tie, False),
                                     ("tie", "not_worse", tie, True),
                                     ("loss", "not_worse", loss, False)):
    c, ledger, _ = make(tmp_path, {}, name=name, trainer=ShiftTrainer({"'rloo'": shift}, base),
                        branches=1, proposer="random", keep_on=keep_on)
    _one_knob(c, "Harness.estimator").run()
    v = ledger.version("v1.0")
    assert v.heldout["diff"] == (0.0 if shift is tie else -0.0625)
    assert (v.status == "kept") is kept, (name, v.reason)
    assert ledger.incumbent().id == ("v1.0" if kept else "v0")
    if name == "mean":
      assert v.heldout["verdict"] == "behind_on_mean"
    if kept:
      assert v.reason.startswith("kept on the mean (keep_on='not_worse'), not beyond noise")
      assert _learned(tmp_path, name) == []


def test_keep_on_unless_worse_keeps_a_loss_inside_the_noise_not_beyond_it(tmp_path):
  """`keep_on='unless_worse'`: the -0.002 that 'mean' rejects is kept (inside the noise:
  its steps stay on the lineage), said so, and teaches no skill; -1/8 on every problem
  is worse beyond noise and rejected."""
  everywhere = {p: -0.125 for p in PROBLEMS}
  for name, shift, kept in (("inside", _shift(0.5, 0.046, 0.05), True),
                            ("beyond", everywhere, False)):
    c, ledger, _ = make(tmp_path, {}, name=name, trainer=ShiftTrainer({"'rloo'": shift}),
                        branches=1, proposer="random", keep_on="unless_worse")
    _one_knob(c, "Harness.estimator").run()
    v = ledger.version("v1.0")
    assert v.heldout["diff"] < 0
    assert (v.status == "kept") is kept, (name, v.reason)
    if kept:
      assert v.heldout["lo"] < 0 < v.heldout["hi"]
      assert v.reason.startswith("kept for not being worse beyond noise "
                                 "(keep_on='unless_worse'), not beyond noise")
      assert ledger.incumbent().id == "v1.0" and _learned(tmp_path, name) == []
    else:
      assert v.heldout["hi"] < 0 and v.heldout["verdict"] == "worse_beyond_noise"
      assert ledger.incumbent().id == "v0"


def test_keep_on_mean_still_credits_a_change_against_its_control(tmp_path):
  # Continuing gains +0.15; 'rloo' loses 0.002 on average against the control: not kept.
  c, ledger, _ = make(tmp_path, {}, trainer=ContinueTrainer(
      {"'rloo'": _shift(0.5, 0.046, 0.05)}, 0.15), branches=1, control=True, keep_on="mean")
  _one_knob(c, "Harness.estimator").run()
  v = ledger.version("v1.0")
  assert v.heldout["diff"] > 0.1 and v.heldout["control_diff"] < 0
  assert v.status == "rejected" and ledger.incumbent().id == "v1.c"


def test_an_effect_without_a_control_is_recorded_as_against_the_parent(tmp_path):
  """With no control, a branch is compared with its parent, which has trained its steps
  fewer: a change that does nothing beats it by what continuing gains (+0.15 here). The
  skill it teaches says so (`against: 'parent'`), so its effect is not read as the
  change's own."""
  c, ledger, _ = make(tmp_path, {}, trainer=ContinueTrainer({}, 0.15), branches=1,
                      control=False)
  _one_knob(c, "Harness.estimator").run()
  v = ledger.version("v1.0")
  assert v.status == "kept" and v.heldout["diff"] == pytest.approx(0.15)
  (learned,) = _learned(tmp_path)
  (h,) = SkillLibrary(tmp_path / "run" / "skills").get(learned[:-len(".json")]).history
  assert h["success"] is True and h["effect"]["against"] == "parent"
  assert h["effect"]["diff"] == pytest.approx(0.15)


def test_an_unknown_keep_on_is_a_clear_error():
  from evotrainer.evolution.promotion import VerifyConfig
  with pytest.raises(ValueError, match="keep_on='always'.*beyond_noise"):
    VerifyConfig(keep_on="always")


def _borderline_shift(seed: int) -> dict:
  """A shift whose one-sided bootstrap p lies between alpha/4 and alpha/2 (0.0125 and
  0.025): beyond noise for one test, not after Holm over two."""
  for down in [0.05 - 0.0005 * i for i in range(80)]:
    shift = _shift(0.5, 0.05, down)
    t = stats.paired_test({p: 0.5 + s for p, s in shift.items()},
                          {p: 0.5 for p in PROBLEMS}, n=1000, seed=seed)
    if 0.014 < t["p"] < 0.023 and t["lo"] > 0:
      return shift
  raise AssertionError("no borderline shift found")


def test_holm_correction_rejects_borderline_gains_over_two_branches(tmp_path):
  # The controller's bootstrap seed for generation 1 (Controller: seed * 7919 + gen).
  shift = _borderline_shift(3 * 7919 + 1)
  effects = {"'rloo'": shift, "2e-05": shift}
  two, ledger, _ = make(tmp_path, {}, name="two", trainer=ShiftTrainer(effects), branches=2)
  two.space.knobs = [k for k in two.space.knobs
                     if k.binding in ("Harness.estimator", "Learner.learning_rate")]
  two.run()
  rows = [ledger.version(v) for v in ("v1.0", "v1.1")]
  assert all(v.heldout["lo"] > 0 for v in rows)  # each beyond noise on its own
  assert all(v.status == "rejected" and v.heldout["verdict"] == "not_beyond_noise_corrected"
             for v in rows)
  assert "Holm" in rows[0].reason and ledger.incumbent().id == "v0"
  # The same gain as the only branch of its generation is kept.
  one, ledger1, _ = make(tmp_path, {}, name="one", trainer=ShiftTrainer(effects), branches=1)
  one.space.knobs = [k for k in one.space.knobs if k.binding == "Harness.estimator"]
  one.run()
  assert ledger1.version("v1.0").status == "kept" and ledger1.incumbent().id == "v1.0"


class ContinueTrainer(ShiftTrainer):
  """ShiftTrainer where training on from a parent gains `gain` on every problem whatever
  the bindings: continuing helps by itself."""

  def __init__(self, shifts, gain):
    super().__init__(shifts)
    self.gain = gain

  def train(self, **kw):
    r = super().train(**kw)
    if kw["parent_checkpoint"] is None:
      return r
    per = {p: v + self.gain for p, v in r.per_problem.items()}
    return dataclasses.replace(r, per_problem=per, final={"avg8": sum(per.values()) / len(per)})


def _one_knob(c, binding):
  c.space.knobs = [k for k in c.space.knobs if k.binding == binding]
  return c


def _learned(tmp_path, name="run"):
  return sorted(p.name for p in (tmp_path / name / "skills").glob("learned-*.json"))


def test_a_change_is_credited_against_continuing_not_standing_still(tmp_path):
  # Continuing gains +0.15 everywhere; 'rloo' adds only +-0.05 problem-level noise on top.
  noise = _shift(0.5, 0.05, 0.05)
  c, ledger, trainer = make(tmp_path, {}, trainer=ContinueTrainer({"'rloo'": noise}, 0.15),
                            branches=1)
  _one_knob(c, "Harness.estimator").run()
  assert trainer.calls == ["v0", "v1.0", "v1.c"]
  v, ctl = ledger.version("v1.0"), ledger.version("v1.c")
  assert v.heldout["lo"] > 0.1  # far beyond noise against the parent ...
  assert v.heldout["control_lo"] < 0 < v.heldout["control_hi"]  # ... not against continuing
  assert v.status == "rejected" and v.heldout["verdict"] == "not_beyond_noise"
  assert "vs v1.c" in v.reason
  # Continuing itself beats the parent: the control becomes the incumbent, and no skill
  # is learned from the change.
  assert ctl.status == "kept" and ctl.heldout["verdict"] == "continued"
  assert ledger.incumbent().id == "v1.c" and _learned(tmp_path) == []
  assert ledger.decisions(version="v1.c")[0].intervention["control"] is True
  # Without a control branch the same change is kept and learned as a skill: the credit
  # for continuing goes to the change.
  old, ledger2, _ = make(tmp_path, {}, name="old", control=False, branches=1,
                         trainer=ContinueTrainer({"'rloo'": noise}, 0.15))
  _one_knob(old, "Harness.estimator").run()
  assert ledger2.incumbent().id == "v1.0" and len(_learned(tmp_path, "old")) == 1


def test_a_change_equal_to_the_control_is_inert(tmp_path):
  # The trainer ignores the learning rate: the branch's results equal the control's.
  c, ledger, _ = make(tmp_path, {}, trainer=ContinueTrainer({}, 0.15), branches=1)
  _one_knob(c, "Learner.learning_rate").run()
  v = ledger.version("v1.0")
  assert v.heldout["inert"] is True and v.heldout["verdict"] == "inert"
  assert v.status == "rejected" and v.reason.startswith("inert")
  assert ledger.incumbent().id == "v1.c" and _learned(tmp_path) == []


def test_a_change_that_beats_the_control_is_kept_and_the_control_pruned(tmp_path):
  c, ledger, _ = make(tmp_path, {}, branches=1,
                      trainer=ContinueTrainer({"'rloo'": _shift(1.0, 0.1, 0.0)}, 0.15))
  _one_knob(c, "Harness.estimator").run()
  v, ctl = ledger.version("v1.0"), ledger.version("v1.c")
  assert v.status == "kept" and v.heldout["control_diff"] == pytest.approx(0.1)
  assert "beats v1.c beyond noise" in v.reason and ledger.incumbent().id == "v1.0"
  assert ctl.status == "pruned" and ctl.heldout["verdict"] == "control"
  assert len(_learned(tmp_path)) == 1


class PoisonedIncumbentTrainer(ScriptedTrainer):
  """Children of a generation-1 version collapse whatever they change."""

  poisoned = "/v1."  # a parent checkpoint path with this in it poisons the child

  def __init__(self, effects):
    super().__init__(effects)
    self.rewards = {}  # version -> the reward series it trained with

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    if parent_checkpoint and self.poisoned in parent_checkpoint:
      per = {p: v * 0.2 for p, v in r.per_problem.items()}
      r = dataclasses.replace(r, per_problem=per,
                              final={"avg8": sum(per.values()) / len(per)})
    self.rewards[version] = r.series["reward"]
    return r


def test_collapsing_children_demote_the_incumbent_and_say_so(tmp_path):
  effects = {"'rloo'": {"delta": 0.2}, "2e-05": {"delta": 0.2}, "'hack'": {"delta": 0.2},
             "train.group_size": {"delta": 0.2}}
  trainer = PoisonedIncumbentTrainer(effects)
  c, ledger, _ = make(tmp_path, {}, trainer=trainer, branches=2, generations=2)
  c.run()
  kept = [d.version_id for d in ledger.decisions() if d.outcome == "success"]
  assert len(kept) == 1 and kept[0].startswith("v1.")
  v1 = ledger.version(kept[0])
  gen2 = [v for v in ledger.versions() if v.id.startswith("v2.")]
  assert [v.id for v in gen2] == ["v2.0", "v2.1", "v2.c"]  # two changes and the control
  for v in gen2:
    assert v.heldout["verdict"] == "collapsed" and v.reason.startswith("collapsed")
  assert ledger.version("v2.c").status == "pruned"  # a control is never rejected
  # Each collapse is a finding with its evidence (here: the reward curve's two ends).
  (f,) = ledger.findings(version="v2.0", stage="verify")
  assert f.kind == "collapse" and f.severity == 1.0 and f.value < f.threshold
  first, last = trainer.rewards["v2.0"][0], trainer.rewards["v2.0"][-1]
  assert first == 0.3  # the scripted reward starts at 0.3 and rises 0.01 x delta a step
  assert [list(e) for e in f.evidence] == [["series:reward",
                                            f"0.3 -> {last:.4g} over 10 steps"]]
  assert v1.status == "rejected" and v1.reason.startswith("unstable: 3 of 3")
  assert ledger.incumbent().id == "v0"
  d = [d for d in ledger.decisions() if d.id == "g2-suspect"]
  assert d and d[0].outcome == "failure"
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  verdicts = {v["id"]: v["verdict"] for v in s["versions"]}
  assert all(verdicts[v.id] == "collapsed" for v in gen2)


class PoisonedContinuationTrainer(PoisonedIncumbentTrainer):
  """Children of the generation-1 continuation v1.x collapse whatever they change."""

  poisoned = "/v1.x/"


def test_a_suspect_continuation_is_kept_with_its_finding(tmp_path):
  # Generation 1 keeps a change and continues it as v1.x; every generation-2 branch from
  # v1.x collapses. v1.x changed nothing: demoting it would remove no change, only its
  # training, so it stays the incumbent and carries the finding.
  c, ledger, _ = make(tmp_path, {}, trainer=PoisonedContinuationTrainer(
      {"'rloo'": {"delta": 0.2}}), branches=2, generations=2, continue_steps=10)
  c.run()
  assert ledger.version("v1.x").parent in {"v1.0", "v1.1"}  # the kept change, continued
  gen2 = [v for v in ledger.versions() if v.id.startswith("v2.") and v.id != "v2.x"]
  assert len(gen2) == 3 and all(v.heldout["verdict"] == "collapsed" for v in gen2)
  assert ledger.version("v1.x").status == "kept" and ledger.incumbent().id == "v1.x"
  (f,) = ledger.findings(version="v1.x", stage="g2-suspect")
  assert f.kind == "unstable_incumbent" and f.value == 1.0
  assert "v1.x carries no change of its own (continued training), kept" in (
      ledger.get_meta("controller/evaluated/2")["suspected"])
  assert not [d for d in ledger.decisions() if d.id == "g2-suspect"]


class UnstableRootTrainer(ScriptedTrainer):
  """A later run whose root carries the change found unstable (lr 2e-5): every branch
  from v0 collapses unless it sets the learning rate back to 1e-5."""

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    undone = any("Learner.learning_rate = 1e-05" in b for b in bindings)
    if parent_checkpoint and "/v0/" in parent_checkpoint and not undone:
      per = {p: v * 0.2 for p, v in r.per_problem.items()}
      r = dataclasses.replace(r, per_problem=per,
                              final={"avg8": sum(per.values()) / len(per)})
    return r


SUBTRACT = "learned-unstable-learner-learning-rate-set"


def test_a_suspect_incumbent_teaches_a_subtraction_that_a_later_run_prefers(tmp_path):
  # Run 1, one knob (lr 1e-5: its only candidate is 2e-5): generation 1 keeps lr 2e-5
  # (+0.2); in generation 2 its two branches (lr 4e-5, lr 1e-5) and the control collapse.
  c, ledger, _ = make(tmp_path, {}, name="first", branches=2, generations=2,
                      trainer=PoisonedIncumbentTrainer({"2e-05": {"delta": 0.2}}))
  _one_knob(c, "Learner.learning_rate").run()
  assert ledger.version("v1.0").bindings == {"Learner.learning_rate": 2e-5}
  assert ledger.version("v1.0").status == "rejected" and ledger.incumbent().id == "v0"
  (f,) = ledger.findings(version="v1.0", stage="g2-suspect")
  assert f.kind == "unstable_incumbent" and f.value == 1.0  # 3 of 3 branches
  assert [e[0] for e in f.evidence] == ["v2.0", "v2.1", "v2.c"]
  assert all(e[1].startswith("collapsed: avg8 -") for e in f.evidence)
  # The skill: trigger = that finding while lr is the unstable 2e-5; action = set it
  # back to 1e-5 (the inverse of v1.0's change); one observation, v1.0.
  (name,) = [p.stem for p in (tmp_path / "first" / "skills").glob(f"{SUBTRACT}-*.json")]
  learned = c.skills.get(name)
  assert learned.category == "training stability" and learned.source == "learned"
  assert learned.trigger == {"finding": "unstable_incumbent", "and": [
      {"binding": "Learner.learning_rate", "op": "==", "value": 2e-5}]}
  assert learned.intervention == {"binding": "Learner.learning_rate", "kind": "set",
                                  "value": 1e-5}
  assert learned.domains == {"math": {"successes": 1, "failures": 0}}
  assert [h["version"] for h in learned.history] == ["v1.0"]
  assert f"skill {name} learned its subtraction" in (
      ledger.get_meta("controller/evaluated/2")["suspected"])

  # Run 2 (and a baseline without run 1's skills): the root carries lr 2e-5. Its only
  # branch and its control collapse in generation 1: the root cannot be rolled back, so
  # it keeps its unstable_incumbent finding into generation 2.
  def later(name, sources):
    SkillLibrary.seeded(tmp_path / name / "skills", sources=sources)
    # seed 0: generation 1 explores 'train.group_size: 8 -> 12' (seed 3 would explore
    # the subtraction itself and never make the root suspect).
    c, ledger, _ = make(tmp_path, {}, name=name, branches=1, generations=2, seed=0,
                        values={**VALUES, "Learner.learning_rate": 2e-5},
                        trainer=UnstableRootTrainer({"1e-05": {"delta": 0.2}}))
    c.run()
    return c, ledger

  c2, ledger2 = later("later", [tmp_path / "first" / "skills", SEED_DIR])
  _, base = later("baseline", [SEED_DIR])
  for lg in (ledger2, base):
    (g1,) = [d for d in changes(lg) if d.parent == "v0" and d.version_id == "v1.0"]
    assert g1.intervention["binding"] != "Learner.learning_rate" or (
        g1.intervention["new"] != 1e-5)  # generation 1 did not undo it by chance
    assert [f.kind for f in lg.findings(version="v0", stage="g1-suspect")] == [
        "unstable_incumbent"]
    assert lg.version("v0").status == "kept"
  # With the skill, generation 2's branch is the subtraction; it is kept (the control
  # still collapses) and the skill gains its second success.
  (d,) = [d for d in changes(ledger2) if d.version_id == "v2.0"]
  assert d.skill == name and d.intervention["new"] == 1e-5 and d.outcome == "success"
  assert ledger2.incumbent().id == "v2.0"
  assert c2.skills.get(name).domains == {"math": {"successes": 2, "failures": 0}}
  # Without it, the proposer explores something else and the root stays unstable.
  (d,) = [d for d in changes(base) if d.version_id == "v2.0"]
  assert d.skill is None and d.intervention["new"] != 1e-5 and d.outcome == "failure"


class PoisonedTestTrainer(ScriptedTrainer):
  """Also writes a test evaluation that ranks the branches the other way round."""

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    test_avg = 1.0 - r.final["avg8"]  # poisoned: if read, it would flip every decision
    (pathlib.Path(workdir) / TEST_FILE).write_text(json.dumps(
        {"version": version, "final": {"avg8": test_avg}, "per_problem": {}}))
    return r


def test_the_controller_never_reads_the_test_split(tmp_path):
  effects = {"'rloo'": {"delta": 0.2}, "2e-05": {"delta": -0.2}}
  c, ledger, _ = make(tmp_path, effects, trainer=PoisonedTestTrainer(effects), branches=5)
  c.run()
  # Decisions follow validation (rloo kept) although test says the opposite.
  inc = ledger.incumbent()
  assert inc.bindings == {"Harness.estimator": "rloo"}
  # The summary shows both splits side by side, and the selection gap by hand.
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  by = {v["id"]: v for v in s["versions"]}
  root, best = by["v0"], by[inc.id]
  assert best["test_avg8"] == pytest.approx(1 - best["validation_avg8"])
  val_gain = best["validation_avg8"] - root["validation_avg8"]
  test_gain = best["test_avg8"] - root["test_avg8"]
  assert s["selection"]["selection_gap"] == pytest.approx(val_gain - test_gain)
  assert s["selection"]["selection_gap"] == pytest.approx(2 * val_gain)
  # By construction: what a trainer returns has no test field, and no module of the
  # evolution package names the test file or imports the test reader, except the one
  # line of the summary writer that joins test scores after the decisions.
  assert not any("test" in f.name for f in dataclasses.fields(BranchResult))
  for path in EVOLUTION.rglob("*.py"):
    text = path.read_text()
    assert "test_eval" not in text and TEST_FILE not in text, path
    tree = ast.parse(text)
    users = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and n.module == "evotrainer.eval.test_scores"]
    if path.name == "controller.py":
      fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == "write_summary")
      assert len(users) == 1 and users[0] in list(ast.walk(fn))
    else:
      assert not users, path


def test_attach_test_without_test_files_reports_none():
  s = attach_test({"versions": [{"id": "v0", "parent": None, "heldout_avg8": 0.5}],
                   "incumbent": "v0"}, "/nonexistent")
  assert s["versions"][0]["test_avg8"] is None and "selection" not in s


class LenientLabelsTrainer(ShiftTrainer):
  """A planted fault: the 'rloo' branch gains +0.1 on validation, and its stored training
  episodes were labelled correct by a lenient verifier although their tagged answer is
  wrong (gold 7, answer 8, the 7 in the worked steps)."""

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    from evotrainer.rollouts import RolloutStore
    from tests.harness import make_episode
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    lenient = any("'rloo'" in b for b in bindings)
    eps = [make_episode(row=i, group=i // 4, answer="7", reward_parts={"correct": 1.0},
                        completion="3+4 = 7\n<answer>" + ("8" if lenient else "7") + "</answer>")
           for i in range(16)]
    RolloutStore(f"{workdir}/rollouts").write(version, 0, "train", eps,
                                              meta={"group_size": 4})
    return dataclasses.replace(r, rollouts=f"{workdir}/rollouts")


def test_the_strict_verifier_rejects_a_branch_trained_on_lenient_labels(tmp_path):
  from evotrainer.tasks.math.task import MathTask
  shifts = {"'rloo'": _shift(1.0, 0.1, 0.0)}
  with MathTask(num_validation=10, num_test=10) as task:
    c, ledger, _ = make(tmp_path, {}, trainer=LenientLabelsTrainer(shifts), branches=1,
                        strict_verify=task.strict_verify)
    _one_knob(c, "Harness.estimator").run()
  v = ledger.version("v1.0")
  assert v.heldout["control_lo"] > 0  # beyond noise, and yet:
  assert v.status == "rejected" and v.heldout["verdict"] == "validator"
  assert "strict_verifier_agreement" in v.reason and "agrees on 0.000 of 16" in v.reason
  assert v.heldout["validators"]["strict_verifier_agreement"] == "fail"
  assert ledger.version("v1.c").heldout["validators"]["strict_verifier_agreement"] == "pass"
  # Without a strict verifier the validator cannot judge, says so, and the branch is kept.
  c2, ledger2, _ = make(tmp_path, {}, name="blind", trainer=LenientLabelsTrainer(shifts),
                        branches=1)
  _one_knob(c2, "Harness.estimator").run()
  v2 = ledger2.version("v1.0")
  assert v2.status == "kept"
  assert v2.heldout["validators"]["strict_verifier_agreement"] == "n/a"


def test_math_strict_verify_by_hand():
  from evotrainer.tasks.math.task import MathTask
  with MathTask(num_validation=10, num_test=10) as task:
    assert task.strict_verify("7", "3+4 = 7\n<answer>7</answer>")
    assert task.strict_verify("7", "<answer>7.0</answer>")
    assert not task.strict_verify("7", "3+4 = 7\n<answer>8</answer>")
    assert not task.strict_verify("7", "the answer is 7")  # no tag: no answer
    assert task.strict_verify("\\frac{1}{2}", "<answer>\\frac{1}{2}</answer>")


class DriftTrainer(ShiftTrainer):
  """The 'rloo' branch gains +0.1 on validation while its training drifts: entropy
  0.13 -> 0.22 and length 9.9 -> 14.4 over 50 steps (the shape of a collapse's start)."""

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    import numpy as np
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    drift = any("'rloo'" in b for b in bindings)
    series = {"correct": [0.3] * 50, "reward": [0.3] * 50,
              "entropy": list(np.linspace(0.13, 0.22 if drift else 0.13, 50)),
              "length": list(np.linspace(9.9, 14.4 if drift else 9.9, 50))}
    return dataclasses.replace(r, series=series)


def test_a_version_drifting_toward_collapse_is_not_kept(tmp_path):
  c, ledger, _ = make(tmp_path, {}, branches=1,
                      trainer=DriftTrainer({"'rloo'": _shift(1.0, 0.1, 0.0)}))
  _one_knob(c, "Harness.estimator").run()
  v = ledger.version("v1.0")
  assert v.heldout["control_lo"] > 0 and v.status == "rejected"
  assert v.reason.startswith("rejected by validator training_stability")
  assert "entropy rose" in v.reason and "length crept" in v.reason
  assert ledger.version("v1.c").heldout["validators"]["training_stability"] == "pass"
  # The training_drift diagnostic runs on the branch too (not only on incumbents): its
  # finding, stored at verification, carries the means of the first and last 5 steps
  # (linspace 0.13 -> 0.22 over 50 steps: 0.13 + 0.09 * 2/49 and 0.22 - 0.09 * 2/49).
  (f,) = ledger.findings(version="v1.0", stage="verify")
  assert f.kind == "training_drift" and f.value == 2.0
  assert [list(e) for e in f.evidence] == [["series:entropy", "0.1337 -> 0.2163"],
                                           ["series:length", "10.08 -> 14.22"]]
  assert ledger.findings(version="v1.c", stage="verify") == []


class FreshSetTrainer(ShiftTrainer):
  """Also writes a test evaluation: the base scores plus `test_shift` for the bindings
  that match (how each branch truly does on fresh problems)."""

  def __init__(self, shifts, test_shift):
    super().__init__(shifts)
    self.test_shift = test_shift

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    shift = sum(v for key, v in self.test_shift.items() for b in bindings if key in b)
    per = {p: v + shift for p, v in self.base.items()}
    pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
    (pathlib.Path(workdir) / TEST_FILE).write_text(json.dumps(
        {"version": version, "final": {"avg8": sum(per.values()) / len(per)},
         "per_problem": per}))
    return r


def test_gate_power_against_the_test_split_by_hand(tmp_path):
  # Validation: rloo +0.1 (kept), lr +0.0 (noise, rejected). Test: rloo +0.1 and lr
  # +0.05: both truly better than the control (= the parent here); the gate kept one.
  trainer = FreshSetTrainer({"'rloo'": _shift(1.0, 0.1, 0.0)},
                             {"'rloo'": 0.1, "2e-05": 0.05})
  c, ledger, _ = make(tmp_path, {}, trainer=trainer, branches=2)
  c.space.knobs = [k for k in c.space.knobs
                   if k.binding in ("Harness.estimator", "Learner.learning_rate")]
  c.run()
  g = json.loads((tmp_path / "run" / "summary.json").read_text())["gate"]
  rows = {r["version"]: r for r in g["branches"]}
  assert {r["reference"] for r in rows.values()} == {"v1.c"}
  kept = ledger.incumbent().id
  assert rows[kept]["kept"] and rows[kept]["test_diff"] == pytest.approx(0.1)
  assert g["decided"] == 2 and g["truly_better"] == 2 and g["kept_truly_better"] == 1
  assert g["power"] == 0.5 and g["false_rejection_rate"] == 0.5
  assert g["false_acceptance_rate"] is None  # no branch that was not truly better


def test_a_rejection_names_every_failed_validator_with_its_reason():
  from evotrainer.evolution.promotion import validator_rejection
  from evotrainer.harness.base import Verdict
  failed = [Verdict("training_stability", False, 3.0, 1.0, "training_stability: fail, 3 drift"),
            Verdict("canary_prompts", False, 0.0, 0.0, "canary_prompts: fail, -0.5 below")]
  assert validator_rejection({"failed": failed}, "avg8 -0.3") == (
      "rejected by validator training_stability, canary_prompts: training_stability: fail, "
      "3 drift; canary_prompts: fail, -0.5 below (avg8 -0.3)")


# ------------------------------------------------------------------ continuation


class RecordingShiftTrainer(ContinueTrainer):
  """ContinueTrainer that records each training's bindings and seed."""

  def __init__(self, shifts, gain):
    super().__init__(shifts, gain)
    self.seen = {}

  def train(self, **kw):
    self.seen[kw["version"]] = (list(kw["bindings"]), kw["seed"])
    return super().train(**kw)


def test_the_continuation_trains_the_winner_further_and_becomes_the_incumbent(tmp_path):
  # 'rloo' beats the control by +0.1 everywhere: kept; then v1.x continues v1.0.
  trainer = RecordingShiftTrainer({"'rloo'": _shift(1.0, 0.1, 0.0)}, 0.15)
  c, ledger, _ = make(tmp_path, {}, branches=1, generations=2, trainer=trainer,
                      continue_steps=7)
  _one_knob(c, "Harness.estimator").run()
  assert trainer.calls == ["v0", "v1.0", "v1.c", "v1.x", "v2.0", "v2.c", "v2.x"]
  x = ledger.version("v1.x")
  assert x.parent == "v1.0" and x.bindings == {}
  # It trains under its parent's values, its own step count and its own seed.
  bindings, seed = trainer.seen["v1.x"]
  assert bindings == ["Harness.estimator = 'rloo'", "train.steps = 7"]
  assert seed == trainer.seen["v1.0"][1] + 500
  # Equal scores to its parent (this trainer's gain does not compound): not worse beyond
  # noise, so promoted; generation 2 starts from it. There 'grpo' again loses to the
  # control, the control equals its parent (pruned), and v2.x continues v1.x.
  assert x.heldout["diff"] == 0 and x.heldout["hi"] == 0
  assert x.status == "kept" and x.heldout["verdict"] == "continued"
  assert ledger.version("v2.0").status == "rejected"
  assert ledger.version("v2.c").parent == "v1.x" and ledger.version("v2.c").status == "pruned"
  assert ledger.version("v2.x").parent == "v1.x" and ledger.incumbent().id == "v2.x"
  d = ledger.decisions(version="v1.x")[0]
  assert d.outcome == "success" and d.intervention["continuation"] is True
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert {v["id"]: v["steps"] for v in s["versions"]}["v1.x"] == 10  # the trainer's count


def test_a_continuation_that_keeps_its_best_state_asks_its_trainer_for_it(tmp_path):
  trainer = RecordingShiftTrainer({"'rloo'": _shift(1.0, 0.1, 0.0)}, 0.15)
  c, _, _ = make(tmp_path, {}, branches=1, generations=1, trainer=trainer,
                 continue_steps=7, continue_keeps_best=True)
  _one_knob(c, "Harness.estimator").run()
  assert trainer.seen["v1.x"][0] == ["Harness.estimator = 'rloo'", "train.steps = 7",
                                     "train.keep_best = True"]
  for vid in ("v0", "v1.0", "v1.c"):  # trials and controls end on their last state
    assert "train.keep_best = True" not in trainer.seen[vid][0]


@pytest.mark.parametrize("effect,verdict", [
    ({"delta": -0.15}, "worse_beyond_noise"),
    ({"delta": -0.5}, "collapsed"),
    ({"delta": 0.3, "hack": True}, "validator")])
def test_a_continuation_that_regresses_or_fails_a_validator_is_rejected(tmp_path, effect,
                                                                         verdict):
  c, ledger, _ = make(tmp_path, {"train.steps = 7": effect}, branches=1, continue_steps=7)
  _one_knob(c, "Harness.estimator").run()
  x = ledger.version("v1.x")
  assert x.status == "rejected" and x.heldout["verdict"] == verdict
  assert ledger.incumbent().id != "v1.x" and ledger.incumbent().id == x.parent
  assert ledger.decisions(version="v1.x")[0].outcome == "failure"
  if verdict == "validator":
    assert "proxy_true_disagreement" in x.reason
  else:
    assert x.heldout["hi"] < 0


@pytest.mark.parametrize("crash_at", [4, 5])
def test_resume_after_a_crash_around_the_continuation(tmp_path, crash_at):
  from evotrainer.evolution.controller import Controller
  from evotrainer.evolution.ledger import Ledger
  from tests.evolution.test_controller import lineage, space
  effects = {"'rloo'": {"delta": 0.2}}
  full, lf, _ = make(tmp_path, effects, name="full", branches=2, generations=2,
                     continue_steps=5)
  full.run()
  # Trainings v0, v1.0, v1.1, v1.c, v1.x, v2.0, ...: 4 crashes in v1.x, 5 right after it.
  trainer = ScriptedTrainer(effects, crash_at=crash_at)
  c, _, _ = make(tmp_path, effects, name="crash", trainer=trainer, branches=2,
                 generations=2, continue_steps=5)
  with pytest.raises(BaseException):
    c.run()
  ledger2 = Ledger(tmp_path / "crash" / "ledger.sqlite")
  t2 = ScriptedTrainer(effects)
  Controller(ledger2, t2, space(), SkillLibrary(tmp_path / "crash" / "skills"),
             workdir=tmp_path / "crash", values=VALUES, seed=3, bootstrap_n=1000,
             branches=2, generations=2, continue_steps=5).run()
  assert lineage(ledger2) == lineage(lf)
  assert sorted(trainer.calls + t2.calls) == sorted(v.id for v in lf.versions())


def test_continue_steps_must_not_be_negative(tmp_path):
  with pytest.raises(ValueError, match="continue_steps"):
    make(tmp_path, {}, continue_steps=-1)


class SharedDriftTrainer(ScriptedTrainer):
  """ScriptedTrainer whose versions named in `drifting` drift toward collapse in
  training (completion length 8 -> 15 tokens, truncation 0.05 -> 0.6: two signals of
  `training_stability`), and whose versions named in `planted` carry a series that the
  integrity validator `Planted` fails on."""

  def __init__(self, effects, drifting=(), planted=()):
    super().__init__(effects)
    self.drifting, self.planted = set(drifting), set(planted)

  def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
    r = super().train(version=version, parent_checkpoint=parent_checkpoint,
                      bindings=bindings, seed=seed, workdir=workdir)
    series = dict(r.series)
    if version in self.drifting:
      series.update(length=[8.0] * 5 + [15.0] * 5, truncated=[0.05] * 5 + [0.6] * 5)
    if version in self.planted:
      series["planted"] = [1.0] * 10
    return dataclasses.replace(r, series=series)


class Planted:
  """An integrity validator (no `kind`): fails a version whose series carry 'planted'."""

  name = "planted"

  def __call__(self, evidence):
    from evotrainer.harness.base import Verdict
    bad = "planted" in (evidence.series or {})
    return Verdict(self.name, not bad, float(bad), 0.0, f"planted: {'fail' if bad else 'pass'}")


def _drift_run(tmp_path, name, relative, **trainer_kw):
  from evotrainer.harness.validators import TrainingStability
  c, ledger, _ = make(tmp_path, {}, name=name, branches=1, continue_steps=10,
                      trainer=SharedDriftTrainer({"'rloo'": {"delta": 0.2}}, **trainer_kw),
                      validators=[TrainingStability(), Planted()], relative_health=relative)
  c.space.knobs = [k for k in c.space.knobs if k.binding == "Harness.estimator"]
  c.run()
  return ledger


def test_relative_health_waives_drift_shared_with_the_control_and_on_changeless_versions(
    tmp_path):
  # Every trained version drifts (the common training does it, not the change): the
  # change v1.0 (+0.2) drifts as its control v1.c does, and the continuation v1.x
  # changes nothing.
  every = {"v1.0", "v1.c", "v1.x"}
  absolute = _drift_run(tmp_path, "absolute", False, drifting=every)
  assert [absolute.version(v).heldout["verdict"] for v in ("v1.0", "v1.c", "v1.x")] == [
      "validator"] * 3
  assert absolute.incumbent().id == "v0"
  relative = _drift_run(tmp_path, "relative", True, drifting=every)
  v10, v1c, v1x = (relative.version(v) for v in ("v1.0", "v1.c", "v1.x"))
  assert v10.status == "kept" and v10.heldout["verdict"] == "kept"
  assert v1x.parent == "v1.0" and v1x.heldout["verdict"] == "continued"
  assert relative.incumbent().id == "v1.x"
  assert v1c.status == "pruned" and v1c.heldout["verdict"] == "control"
  for v in (v10, v1c, v1x):  # the failure stays on the version and in its reason
    assert v.heldout["validators"]["training_stability"] == "fail"
    assert v.heldout["waived"] == ["training_stability"]
    assert "health validator training_stability failed, not a veto" in v.reason
    assert "completion length crept 8.0 -> 15.0" in v.reason
  assert "(its control failed it too)" in v10.reason
  assert "(changed nothing)" in v1x.reason and "(changed nothing)" in v1c.reason


def test_relative_health_still_vetoes_a_change_s_own_drift_and_integrity_failures(tmp_path):
  # Only the change drifts; the continuation fails an integrity validator.
  ledger = _drift_run(tmp_path, "own", True, drifting={"v1.0"}, planted={"v1.x"})
  v10, v1x = ledger.version("v1.0"), ledger.version("v1.x")
  assert v10.status == "rejected" and v10.heldout["verdict"] == "validator"
  assert v10.reason.startswith("rejected by validator training_stability")
  assert "waived" not in v10.heldout
  assert v1x.parent == "v0" and v1x.status == "rejected"
  assert v1x.heldout["verdict"] == "validator" and "validator planted" in v1x.reason
  assert ledger.incumbent().id == "v0"
