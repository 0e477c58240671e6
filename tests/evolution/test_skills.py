"""Skills: the trigger language, ranking, evidence files, seeds, instantiation."""

import json
import re

import gin
import pytest

from evotrainer.evolution import skills as sk
from evotrainer.evolution.search_space import (ComponentListKnob, DictWeightKnob, FloatKnob,
                                               SearchSpace, SearchSpaceError,
                                               make_intervention)
from evotrainer.evolution.skills import Skill, SkillError, SkillLibrary, evaluate
from evotrainer.types import Finding


def F(kind, value, severity=0.5, layer="signal", threshold=0.5):
  return Finding(kind=kind, layer=layer, severity=severity, value=value, threshold=threshold,
                 message=kind)


def skill(name="s", trigger=None, intervention=None, domains=None, category="reward design"):
  return Skill(name=name, category=category, description="d",
               trigger=trigger or {"finding": "dead_group_ratio", "op": ">", "value": 0.5},
               intervention=intervention or {"binding": "Learner.clip_high", "kind": "set",
                                             "value": 0.3},
               expected_outcome="e", validation_criterion="v", domains=domains or {})


DGR = F("dead_group_ratio", 0.6, severity=0.4)
ENT = F("entropy", 0.05, severity=0.9, layer="model", threshold=0.1)
BIND = {"RewardComposer.parts": {"correct": 1.0},
        "Harness.group_filters": ["@DropZeroVarianceGroups()"], "Learner.clip_high": 0.28,
        "Harness.estimator": "grpo"}


# ------------------------------------------------------------------ the trigger language


@pytest.mark.parametrize("cond, expected", [
    ({"finding": "dead_group_ratio"}, True),
    ({"finding": "truncation"}, False),
    ({"finding": "dead_group_ratio", "op": ">", "value": 0.5}, True),
    ({"finding": "dead_group_ratio", "op": ">", "value": 0.6}, False),  # strict
    ({"finding": "dead_group_ratio", "op": ">=", "value": 0.6}, True),
    ({"finding": "entropy", "field": "severity", "op": ">=", "value": 0.9}, True),
    ({"finding": "entropy", "field": "threshold", "op": "<", "value": 0.1}, False),
    ({"finding": "dead_group_ratio", "op": ">", "value": 0.5,
      "and": [{"finding": "entropy"}]}, True),
    ({"finding": "dead_group_ratio", "op": ">", "value": 0.5,
      "and": [{"finding": "truncation"}]}, False),
    ({"all": [{"finding": "dead_group_ratio"}, {"not": {"finding": "truncation"}}]}, True),
    ({"any": [{"finding": "truncation"}, {"finding": "entropy"}]}, True),
    ({"not": {"finding": "entropy"}}, False),
    ({"binding": "RewardComposer.parts", "op": "lacks", "value": "partial"}, True),
    ({"binding": "RewardComposer.parts", "op": "contains", "value": "correct"}, True),
    ({"binding": "Harness.group_filters", "op": "contains",
      "value": "@DropZeroVarianceGroups()"}, True),
    ({"binding": "Harness.group_filters", "op": "lacks", "value": "@StdGroupFilter()"}, True),
    ({"binding": "Learner.clip_high", "op": "<", "value": 0.3}, True),
    ({"binding": "Learner.clip_high", "op": ">", "value": 0.3}, False),
    ({"binding": "Harness.estimator", "op": "in", "value": ["grpo", "rloo"]}, True),
    ({"binding": "Harness.estimator", "op": "!=", "value": "grpo"}, False),
    ({"binding": "Learner.kl_coef", "op": "<=", "value": 0.0}, False),  # not given: false
])
def test_conditions(cond, expected):
  sk.check_condition(cond)
  ok, matched = evaluate(cond, [DGR, ENT], BIND)
  assert ok is expected
  if not ok:
    assert matched == []


def test_matched_findings_and_dict_findings():
  cond = {"any": [{"finding": "dead_group_ratio"}, {"finding": "entropy"},
                  {"finding": "truncation"}]}
  assert evaluate(cond, [DGR, ENT])[1] == [DGR, ENT]
  assert evaluate({"not": {"finding": "truncation"}}, [DGR])[1] == []
  as_dict = {"kind": "dead_group_ratio", "value": 0.7, "severity": 0.2}
  assert evaluate({"finding": "dead_group_ratio", "op": ">", "value": 0.5}, [as_dict])[0]
  nan = F("dead_group_ratio", float("nan"))
  assert not evaluate({"finding": "dead_group_ratio", "op": "<", "value": 0.5}, [nan])[0]


@pytest.mark.parametrize("cond, match", [
    ("__import__('os').system('true')", "a JSON object"),
    ({"finding": "x", "op": "=~", "value": 1}, r"trigger.op: '=~'"),
    ({"finding": "x", "op": ">"}, "'op' and 'value' go together"),
    ({"finding": "x", "op": ">", "value": "0.5"}, "trigger.value: a number"),
    ({"finding": "x", "exec": "y"}, r"unknown keys \['exec'\]"),
    ({"finding": "x", "binding": "y"}, "exactly one of"),
    ({"all": []}, "non-empty list"),
    ({"all": [{"finding": "x"}, {"any": [{"finding": 3}]}]}, r"trigger.all\[1\].any\[0\]"),
    ({"binding": "A.b"}, "a binding condition needs both"),
    ({"binding": "A.b", "op": "in", "value": "x"}, "'in' takes a list"),
    ({"finding": "x", "field": "message", "op": "==", "value": 1}, "trigger.field"),
])
def test_bad_conditions_are_named(cond, match):
  with pytest.raises(SkillError, match=match):
    sk.check_condition(cond)


# ------------------------------------------------------------------ ranking


def test_matching_ranks_by_evidence_then_severity(tmp_path):
  lib = SkillLibrary(tmp_path)
  lib.add(skill("a_dgr", domains={"math": {"successes": 1, "failures": 1}}))  # evidence 0
  lib.add(skill("b_entropy", trigger={"finding": "entropy"},
                domains={"math": {"successes": 1, "failures": 1}}))  # evidence 0, sev .9
  lib.add(skill("c_proven", domains={"math": {"successes": 3, "failures": 1}}))  # 2, sev .4
  lib.add(skill("d_failed", trigger={"finding": "entropy"},
                domains={"math": {"successes": 0, "failures": 2}}))  # -2
  lib.add(skill("e_silent", trigger={"finding": "truncation"}))  # does not match
  lib.add(skill("f_tie", domains={"code": {"successes": 2, "failures": 2}}))  # 0, sev .4
  names = [s.name for s in lib.matching([DGR, ENT], BIND)]
  assert names == ["c_proven", "b_entropy", "a_dgr", "f_tie", "d_failed"]
  assert lib.matching([]) == []


# ------------------------------------------------------------------ evidence on disk


def test_record_outcome_counts_and_rewrites_the_file(tmp_path):
  lib = SkillLibrary(tmp_path)
  lib.add(skill("s1"))
  s = lib.record_outcome("s1", "math", True, version="v3")
  assert (s.successes, s.failures, s.domains_validated, s.cross_domain) == (1, 0, ["math"], False)
  assert lib.record_outcome("s1", "math", True, version="v3") == s  # resumed: counted once
  with pytest.raises(SkillError, match="v3 in math is recorded as success"):
    lib.record_outcome("s1", "math", False, version="v3")
  lib.record_outcome(s, "code", False, version="v9")
  assert not lib.get("s1").cross_domain  # code has no success yet
  s = lib.record_outcome("s1", "code", True, version="v10")
  # code: 1 success vs 1 failure is not net positive evidence.
  assert s.domains == {"math": {"successes": 1, "failures": 0},
                       "code": {"successes": 1, "failures": 1}}
  assert s.domains_validated == ["math"] and not s.cross_domain
  s = lib.record_outcome("s1", "code", True)
  assert s.domains_validated == ["code", "math"] and s.cross_domain
  data = json.loads((tmp_path / "s1.json").read_text())
  assert data["domains"]["code"] == {"successes": 2, "failures": 1}
  assert data["summary"] == {"successes": 3, "failures": 1,
                             "domains_validated": ["code", "math"], "cross_domain": True}
  assert len(data["history"]) == 3  # outcomes without a version are counted, not listed
  assert SkillLibrary(tmp_path).get("s1") == s  # reload equals what was written
  assert sorted(p.name for p in tmp_path.iterdir()) == ["s1.json"]  # no temp files left


def test_summary_in_a_file_is_never_trusted(tmp_path):
  d = skill("s2").to_dict()
  d["summary"]["cross_domain"] = True
  (tmp_path / "s2.json").write_text(json.dumps(d))
  assert SkillLibrary(tmp_path).get("s2").cross_domain is False


def test_add_is_idempotent(tmp_path):
  lib = SkillLibrary(tmp_path)
  s = skill("new_skill")
  lib.add(s)
  lib.add(s)
  with pytest.raises(SkillError, match="already exists"):
    lib.add(skill("new_skill", trigger={"finding": "entropy"}))
  text = (tmp_path / "new_skill.json").read_text()
  assert text.startswith("{\n  \"name\": \"new_skill\"")  # indented, human-readable
  with pytest.raises(SkillError, match="name 'Bad Name!'"):
    lib.add(skill("Bad Name!"))


@pytest.mark.parametrize("content, match", [
    ("{not json", "Expecting property name"),
    (json.dumps({**skill("broken").to_dict(), "category": "vibes"}), "category 'vibes'"),
    (json.dumps({**skill("broken").to_dict(), "name": "other"}), "differs from the file name"),
    (json.dumps({**skill("broken").to_dict(), "trigger": {"finding": "x", "op": "~", "value": 1}}),
     "trigger.op"),
    (json.dumps({**skill("broken").to_dict(),
                 "intervention": {"binding": "A.b", "kind": "scale"}}), r"needs \['factor'\]"),
    (json.dumps({**skill("broken").to_dict(), "domains": {"math": {"successes": -1}}}),
     r"domains\['math'\]"),
    (json.dumps({**skill("broken").to_dict(), "extra": 1}), r"unknown fields \['extra'\]"),
])
def test_a_bad_file_is_named(tmp_path, content, match):
  (tmp_path / "broken.json").write_text(content)
  with pytest.raises(SkillError, match=match) as e:
    SkillLibrary(tmp_path)
  assert "broken.json" in str(e.value)


# ------------------------------------------------------------------ seeds


def test_seeded_copies_without_overwriting(tmp_path):
  run1 = tmp_path / "run1" / "skills"
  lib = SkillLibrary.seeded(run1)
  seeds = sorted(p.name for p in sk.SEED_DIR.glob("*.json"))
  assert len(lib) == len(seeds) >= 5
  assert sorted(p.name for p in run1.iterdir()) == seeds
  learned = lib.record_outcome("entropy_collapse_raise_clip_high", "math", True, version="v2")
  lib.add(skill("learned_one"))
  # The same directory again: learned counts survive, seeds are not re-copied over them.
  again = SkillLibrary.seeded(run1)
  assert again.get("entropy_collapse_raise_clip_high") == learned
  assert "learned_one" in again
  # A second run seeded from the first run's directory (then from the package seeds).
  run2 = SkillLibrary.seeded(tmp_path / "run2" / "skills", sources=[run1, sk.SEED_DIR])
  assert run2.get("entropy_collapse_raise_clip_high").successes == 1
  assert "learned_one" in run2 and len(run2) == len(seeds) + 1


def test_seed_skills_name_real_diagnostics_validators_and_bindings():
  from evotrainer import gin_api, registry
  from evotrainer.harness.diagnostics import DIAGNOSTICS
  from evotrainer.harness.validators import VALIDATORS
  registry.register_builtins()
  lib = SkillLibrary(sk.SEED_DIR)
  assert {s.category for s in lib} <= set(sk.CATEGORIES)
  names = set(DIAGNOSTICS) | set(VALIDATORS)

  def leaves(cond):
    for key in ("all", "any"):
      for c in cond.get(key, ()):
        yield from leaves(c)
    if "not" in cond:
      yield from leaves(cond["not"])
    if "finding" in cond or "binding" in cond:
      yield cond
    for c in cond.get("and", ()):
      yield from leaves(c)

  for s in lib:
    assert all(not v for v in s.domains.values()) and s.source == "seed"
    for leaf in leaves(s.trigger):
      if "finding" in leaf:
        assert leaf["finding"] in names, (s.name, leaf)
      else:
        gin.config.ParsedBindingKey.parse(leaf["binding"])
    assert set(s.harness.get("enable", [])) <= names, s.name
    gin.config.ParsedBindingKey.parse(s.intervention["binding"])
    if "component" in s.intervention:
      ref = re.sub(r"^@(?:\w+/)*", "", s.intervention["component"]).removesuffix("()")
      assert gin_api.find_configurable(ref) is not None, s.name


def test_seed_skills_fire_on_the_paper_examples():
  lib = SkillLibrary(sk.SEED_DIR)
  bindings = {"RewardComposer.parts": {"correct": 1.0}, "Harness.group_filters": [],
              "Learner.entropy_coef": 0.0}
  names = [s.name for s in lib.matching([F("dead_group_ratio", 0.62)], bindings)]
  assert names[:2] == ["dead_groups_add_partial_credit", "dead_groups_drop_zero_variance"]
  with_partial = {**bindings, "RewardComposer.parts": {"correct": 1.0, "partial": 0.3}}
  assert "dead_groups_add_partial_credit" not in [
      s.name for s in lib.matching([F("dead_group_ratio", 0.62)], with_partial)]
  fmt = [s.name for s in lib.matching([F("format_failure", 0.35, layer="behaviour")], bindings)]
  assert fmt == ["format_failure_add_format_reward"]
  assert not lib.matching([F("format_failure", 0.3, layer="behaviour")], bindings)  # not > .3
  gaming = lib.matching([F("length_reward_corr", 0.45, layer="behaviour")], bindings)
  assert [s.name for s in gaming] == ["length_gaming_overlong_penalty"]
  ent = {s.name for s in lib.matching([ENT], bindings)}
  assert ent == {"entropy_collapse_raise_clip_high", "entropy_collapse_entropy_bonus"}
  trunc = {s.name for s in lib.matching([F("truncation", 0.4, layer="efficiency")], bindings)}
  assert trunc == {"truncation_soft_filter", "truncation_more_tokens"}
  proxy = lib.matching([F("proxy_true_disagreement", 0.2, layer="integrity")], bindings)
  assert [s.name for s in proxy] == ["proxy_rising_bc_flat_subtract"]


# ------------------------------------------------------------------ instantiation


def space():
  return SearchSpace([
      FloatKnob("Learner.clip_high", 0.2, 0.4),
      ComponentListKnob("Harness.group_filters",
                        {"drop_dead": "@DropZeroVarianceGroups()", "std": "@StdGroupFilter()"}),
      DictWeightKnob("RewardComposer.parts", "partial", 0.05, 1.0),
  ])


def test_instantiate_each_template_kind():
  lib = SkillLibrary(sk.SEED_DIR)
  values = {"RewardComposer.parts": {"correct": 1.0}, "Harness.group_filters": [],
            "Learner.clip_high": 0.28}
  iv = lib.get("dead_groups_add_partial_credit").instantiate(values, space=space())
  assert (iv.kind, iv.key, iv.new) == ("add", "partial", {"correct": 1.0, "partial": 0.3})
  assert iv.to_gin() == "RewardComposer.parts = {'correct': 1.0, 'partial': 0.3}"
  iv = lib.get("entropy_collapse_raise_clip_high").instantiate(values, space=space())
  assert (iv.kind, iv.old, iv.new) == ("set", 0.28, 0.35)  # 0.28 * 1.25
  iv = lib.get("dead_groups_drop_zero_variance").instantiate(values, space=space())
  assert (iv.kind, iv.key, iv.new) == ("add", "drop_dead", ["@DropZeroVarianceGroups()"])
  # Already there: nothing to do.
  done = {**values, "Harness.group_filters": ["@DropZeroVarianceGroups()"]}
  assert lib.get("dead_groups_drop_zero_variance").instantiate(done) is None
  # The subtraction: back to the value before the last change of the binding.
  hacked = {**values, "RewardComposer.parts": {"correct": 1.0, "partial": 0.3}}
  revert = lib.get("proxy_rising_bc_flat_subtract")
  iv = revert.instantiate(hacked, previous={"RewardComposer.parts": {"correct": 1.0}},
                          space=space())
  assert (iv.kind, iv.key, iv.new) == ("remove", "partial", {"correct": 1.0})
  with pytest.raises(SkillError, match="'revert' needs"):
    revert.instantiate(hacked)
  # Outside the space: the space says so, naming the binding.
  big = skill("big", intervention={"binding": "Learner.clip_high", "kind": "scale",
                                   "factor": 2.0})
  with pytest.raises(SearchSpaceError, match="Learner.clip_high"):
    big.instantiate(values, space=space())
  with pytest.raises(SkillError, match="no current value for Learner.clip_high"):
    big.instantiate({})
  group = skill("g", intervention={"binding": "train.group_size", "kind": "scale",
                                   "factor": 1.5})
  assert group.instantiate({"train.group_size": 8}).new == 12  # ints stay ints


@pytest.mark.parametrize("old, new", [
    (0.28, 0.35),
    ({"correct": 1.0}, {"correct": 1.0, "partial": 0.3}),
    ({"correct": 1.0, "partial": 0.3}, {"correct": 1.0, "partial": 0.5}),
    ({"correct": 1.0, "partial": 0.3}, {"correct": 1.0}),
    ([], ["@StdGroupFilter()"]),
    (["@StdGroupFilter()"], []),
])
def test_template_of_reproduces_the_intervention(old, new):
  iv = make_intervention("X.y", old, new)
  learned = skill("learned", intervention=sk.template_of(iv))
  sk.check_template(learned.intervention)
  again = learned.instantiate({"X.y": old})
  assert (again.binding, again.kind, again.old, again.new) == ("X.y", iv.kind, iv.old, iv.new)


# ------------------------------------------------------------------ evidence across runs


def _m(diff, half=0.196):
  return {"diff": diff, "lo": diff - half, "hi": diff + half}


def test_the_same_version_name_in_two_runs_is_two_outcomes(tmp_path):
  """Every run restarts its version names: v1.0 of run A and v1.0 of run B are two
  branches (before runs were told apart, B's failure was refused as a contradiction)."""
  lib = SkillLibrary(tmp_path)
  lib.add(skill("s1"))
  lib.record_outcome("s1", "code", True, version="v1.0", run="a")
  s = lib.record_outcome("s1", "code", False, version="v1.0", run="b")
  assert s.domains == {"code": {"successes": 1, "failures": 1}}
  assert lib.record_outcome("s1", "code", False, version="v1.0", run="b") == s  # resumed
  with pytest.raises(SkillError, match=r"v1.0 in code is recorded as failure.*\(run b\)"):
    lib.record_outcome("s1", "code", True, version="v1.0", run="b")


def test_an_effect_keeps_what_it_was_measured_against(tmp_path):
  lib = SkillLibrary(tmp_path)
  lib.add(skill("s1"))
  lib.record_outcome("s1", "code", None, version="v1.0", run="a",
                     effect={**_m(0.04), "against": "parent"})
  lib.record_outcome("s1", "code", True, version="v2.0", run="a", effect=_m(0.06))
  with pytest.raises(SkillError, match="'against' is 'sibling'"):
    lib.record_outcome("s1", "code", True, version="v3.0", run="a",
                       effect={**_m(0.06), "against": "sibling"})
  s = SkillLibrary(tmp_path).get("s1")  # what the file holds
  assert [h["effect"].get("against") for h in s.history] == ["parent", None]
  assert s.effect["n"] == 2 and s.effect["mean"] == pytest.approx(0.05)
  bad = {**s.to_dict(), "history": [{**s.history[0], "effect": {**_m(0.1), "against": 1}}]}
  with pytest.raises(SkillError, match=r"history\[0\] must be"):
    Skill.from_dict(bad, where="s1")


def test_a_measurement_alone_counts_nothing_and_pools_into_the_effect(tmp_path):
  lib = SkillLibrary(tmp_path)
  lib.add(skill("s1"))
  with pytest.raises(SkillError, match="needs the measured effect"):
    lib.record_outcome("s1", "code", None, version="v1.0", run="a")
  with pytest.raises(SkillError, match="needs the measured effect"):
    lib.record_outcome("s1", "code", None, version="v1.0", run="a",
                       effect={"diff": float("nan"), "lo": 0.0, "hi": 1.0})
  lib.record_outcome("s1", "code", None, version="v1.0", run="a", effect=_m(0.04))
  s = lib.record_outcome("s1", "code", None, version="v2.0", run="b", effect=_m(0.06))
  assert (s.successes, s.failures, s.evidence) == (0, 0, 0)
  assert s.effect["n"] == 2 and s.effect["mean"] == pytest.approx(0.05)
  # Each alone is inside the noise; the two pooled are not (se 0.1 / sqrt(2)).
  assert s.effect["lo"] == pytest.approx(0.05 - 1.96 * 0.1 / 2 ** 0.5)
  again = SkillLibrary(tmp_path).get("s1")  # what the file holds
  assert again.effect == s.effect and [h["run"] for h in again.history] == ["a", "b"]


def test_a_history_entry_that_is_malformed_is_refused_on_load(tmp_path):
  d = skill("s1").to_dict()
  d["history"] = [{"run": "a", "version": "v1", "domain": "code", "success": "yes"}]
  (tmp_path / "s1.json").write_text(json.dumps(d))
  with pytest.raises(SkillError, match=r"history\[0\]"):
    SkillLibrary(tmp_path)
  d["history"] = [{"run": "a", "version": "v1", "domain": "code", "success": None,
                   "effect": {"diff": 0.1}}]
  (tmp_path / "s1.json").write_text(json.dumps(d))
  with pytest.raises(SkillError, match=r"history\[0\]"):
    SkillLibrary(tmp_path)


def test_matching_ranks_by_pooled_effect_and_drops_what_is_harmful_over_runs(tmp_path):
  lib = SkillLibrary(tmp_path)
  for name in ("a-none", "b-up", "c-down", "d-harmful"):
    lib.add(skill(name, intervention={"binding": "Learner.clip_high", "kind": "set",
                                      "value": 0.3}))
  lib.record_outcome("b-up", "code", None, version="v1", run="r", effect=_m(0.05))
  lib.record_outcome("c-down", "code", None, version="v1", run="r", effect=_m(-0.05))
  for run in ("r", "s"):  # pooled: -0.15 +- 0.139, entirely below 0
    lib.record_outcome("d-harmful", "code", False, version="v1", run=run, effect=_m(-0.15))
  assert lib.get("d-harmful").harmful and not lib.get("c-down").harmful
  # Evidence first (d-harmful's -2 would rank it last; it is dropped), then the effect.
  lib.record_outcome("a-none", "code", True, version="v9", run="r")
  assert [s.name for s in lib.matching([DGR], BIND)] == ["a-none", "b-up", "c-down"]


def test_merge_pools_runs_without_counting_an_outcome_twice(tmp_path):
  pool = SkillLibrary.seeded(tmp_path / "pool", sources=[])
  run_a = SkillLibrary.seeded(tmp_path / "a", sources=[])
  run_b = SkillLibrary.seeded(tmp_path / "b", sources=[])
  for lib in (run_a, run_b):
    lib.add(skill("s1"))
  run_a.record_outcome("s1", "code", True, version="v1.0", run="a", effect=_m(0.2))
  run_b.record_outcome("s1", "code", None, version="v1.0", run="b", effect=_m(0.02))
  run_b.add(skill("s2"))
  assert pool.merge(tmp_path / "a") == ["s1"]
  assert sorted(pool.merge(tmp_path / "b")) == ["s1", "s2"]
  assert pool.merge(tmp_path / "a") == [] and pool.merge(tmp_path / "b") == []  # again
  s = SkillLibrary(tmp_path / "pool").get("s1")
  assert s.domains == {"code": {"successes": 1, "failures": 0}}
  assert [h["run"] for h in s.history] == ["a", "b"] and s.effect["n"] == 2
  assert s.effect["mean"] == pytest.approx(0.11)
  # A later run that started from the pool brings the pool's outcomes back: no double count.
  run_c = SkillLibrary.seeded(tmp_path / "c", sources=[tmp_path / "pool"])
  run_c.record_outcome("s1", "code", False, version="v1.0", run="c", effect=_m(-0.3))
  pool.merge(tmp_path / "c")
  assert pool.get("s1").domains == {"code": {"successes": 1, "failures": 1}}
  other = SkillLibrary.seeded(tmp_path / "other", sources=[])
  other.add(skill("s1", intervention={"binding": "Learner.clip_high", "kind": "set",
                                      "value": 0.4}))
  with pytest.raises(SkillError, match="another trigger or intervention"):
    pool.merge(tmp_path / "other")


def test_the_committed_skills_pool_loads_and_names_its_runs():
  """bench/results/skills_pool_code_smol (written by bench.evolve_arms.pool_skills): every
  file is a valid skill, and every recorded outcome names its run."""
  import pathlib
  pool = pathlib.Path(__file__).resolve().parents[2] / "bench/results/skills_pool_code_smol"
  lib = SkillLibrary(pool)
  assert {s.name for s in lib} >= {p.stem for p in sk.SEED_DIR.glob("*.json")}
  outcomes = [h for s in lib for h in s.history]
  assert outcomes and all(h["run"] and h["version"] for h in outcomes)


def _c(diff, half=0.196):
  """An effect measured against a control branch."""
  return {**_m(diff, half), "against": "control"}


def test_proven_needs_a_pooled_effect_beyond_noise_in_the_domain(tmp_path):
  """Hand-worked: one measurement has se 0.1 (half-width 0.196); two pooled have se
  0.1 / sqrt(2), half-width 0.139."""
  lib = SkillLibrary(tmp_path)
  for name in ("two-runs", "one-big", "other-domain", "inside-noise", "reverts"):
    lib.add(skill(name, intervention={"binding": "Learner.clip_high", "kind": "revert"}
                  if name == "reverts" else None))
  for run in ("a", "b"):
    lib.record_outcome("two-runs", "code", None, version="v1", run=run, effect=_c(0.15))
    lib.record_outcome("other-domain", "math", None, version="v1", run=run, effect=_c(0.15))
    lib.record_outcome("inside-noise", "code", None, version="v1", run=run, effect=_c(0.05))
    lib.record_outcome("reverts", "code", True, version="v1", run=run, effect=_c(0.3))
  lib.record_outcome("one-big", "code", True, version="v1", run="a", effect=_c(0.3))
  assert lib.get("two-runs").effect_in("code")["lo"] == pytest.approx(0.15 - 0.1386, abs=1e-3)
  assert lib.get("two-runs").effect_in("math")["n"] == 0
  assert [s.name for s in lib.proven("code", 2)] == ["two-runs"]
  assert [s.name for s in lib.proven("code", 1)] == ["one-big", "two-runs"]  # by mean
  assert [s.name for s in lib.proven("math", 2)] == ["other-domain"]
  assert lib.proven("code", 3) == []


def test_proven_leaves_out_the_keeps_that_learned_a_skill_unless_told(tmp_path):
  """A keep learned as a skill is recorded because it was good (`selected`), so its
  effect is biased upward; the branches the skill proposed later are recorded whatever
  their outcome. By hand: the replication 0.15 alone (se 0.1) has lo 0.15 - 0.196 < 0;
  pooled with the discovery 0.3 (se 0.1) the mean is 0.225, lo 0.225 - 0.1386 = 0.0864."""
  lib = SkillLibrary(tmp_path)
  lib.add(skill("learned-x"))
  lib.record_outcome("learned-x", "code", True, version="v1", run="a", effect=_c(0.3),
                     selected=True)
  lib.record_outcome("learned-x", "code", None, version="v1", run="b", effect=_c(0.15))
  assert [h["selected"] for h in lib.get("learned-x").history] == [True, False]
  assert lib.get("learned-x").effect_in("code", discoveries=False)["n"] == 1
  assert lib.get("learned-x").effect_in("code")["lo"] == pytest.approx(0.0864, abs=1e-3)
  assert lib.proven("code", 1) == []
  assert [s.name for s in lib.proven("code", 1, discoveries=True)] == ["learned-x"]
  lib.record_outcome("learned-x", "code", None, version="v2", run="b", effect=_c(0.15))
  assert [s.name for s in lib.proven("code", 2)] == ["learned-x"]  # lo 0.0114
  assert lib.proven("code", 3) == []
  assert SkillLibrary(tmp_path).get("learned-x").selected(0)  # written to the file


def test_an_entry_from_before_selected_counts_as_selected_when_it_opens_a_learned_skill(
    tmp_path):
  """Legacy histories say nothing: the first entry of a learned skill is the keep that
  learned it; a seed skill's entries were all proposed by the skill."""
  history = [{"run": r, "version": "v1", "domain": "code", "success": None,
              "effect": _c(0.15)} for r in ("a", "b")]
  learned = Skill.from_dict({**skill("learned-y").to_dict(), "source": "learned",
                             "history": history}, where="test")
  seeded = Skill.from_dict({**skill("seed-y").to_dict(), "history": history}, where="test")
  assert [learned.selected(i) for i in range(2)] == [True, False]
  assert [seeded.selected(i) for i in range(2)] == [False, False]
  assert learned.effect_in("code", discoveries=False)["n"] == 1
  assert seeded.effect_in("code", discoveries=False)["n"] == 2
  with pytest.raises(SkillError, match=re.escape("'selected': true | false")):
    Skill.from_dict({**skill("bad").to_dict(), "history": [{**history[0], "selected": 1}]},
                    where="test")


def test_proven_counts_effects_against_a_control_unless_told_otherwise(tmp_path):
  """An effect measured against the parent (or recorded without `against`, from before
  it existed) proves nothing by default: it holds the gain of the branch's steps too.
  Pooled by hand: two measurements of 0.15 (half-width 0.196, se 0.1) have lo 0.0114; a
  third against a control (half-width 0.1, se 0.051) adds weight 384.2 to 100 + 100: se
  0.0414, lo 0.0689."""
  lib = SkillLibrary(tmp_path)
  lib.add(skill("uncontrolled"))
  lib.record_outcome("uncontrolled", "code", None, version="v1", run="a",
                     effect={**_m(0.15), "against": "parent"})
  lib.record_outcome("uncontrolled", "code", None, version="v1", run="b", effect=_m(0.15))
  assert lib.proven("code", 1) == []
  assert lib.get("uncontrolled").effect_in("code", ("control",))["n"] == 0
  assert [s.name for s in lib.proven("code", 2, sk.AGAINST)] == ["uncontrolled"]
  assert lib.get("uncontrolled").effect_in("code")["lo"] == pytest.approx(0.0114, abs=1e-3)
  # Less a step gain of 0.02 each effect against the parent: 0.13, 0.13 with se 0.1 pool
  # to lo 0.13 - 0.1386 < 0; less nothing, lo 0.0114 (above).
  assert lib.proven("code", 2, sk.AGAINST, step_gain=0.02) == []
  assert lib.get("uncontrolled").effect_in("code", sk.AGAINST, 0.02)["mean"] == \
      pytest.approx(0.13)
  lib.record_outcome("uncontrolled", "code", None, version="v1", run="c", effect=_c(0.15, 0.1))
  assert lib.proven("code", 2) == []  # one measurement against a control
  assert [s.name for s in lib.proven("code", 1)] == ["uncontrolled"]
  assert lib.get("uncontrolled").effect_in("code")["lo"] == pytest.approx(0.0689, abs=1e-3)
  # The gain is taken off the two effects against the parent only: (100 * 0.13 * 2 +
  # 384.2 * 0.15) / 584.2 = 0.1432.
  assert lib.get("uncontrolled").effect_in("code", sk.AGAINST, 0.02)["mean"] == \
      pytest.approx(0.1432, abs=1e-3)
