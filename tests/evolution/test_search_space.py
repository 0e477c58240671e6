"""Search space: knob domains, single-factor proposals, gin round trips, clear errors."""

import random

import gin
import pytest

from evotrainer.evolution import search_space as ss
from evotrainer.evolution.search_space import (ChoiceKnob, ComponentListKnob, DictWeightKnob,
                                               FloatKnob, IntKnob, Intervention, SearchSpace,
                                               SearchSpaceError)


# Stand-ins for the real configurables (whose modules import JAX): same parameter names.
@gin.configurable(module="evo_test")
class EvoTestLearner:
  def __init__(self, learning_rate=3e-4, clip_high=0.28):
    pass


@gin.configurable(module="evo_test")
class EvoTestHarness:
  def __init__(self, group_filters=(), estimator="grpo"):
    pass


@gin.configurable(module="evo_test")
class EvoTestComposer:
  def __init__(self, parts=None):
    pass


@gin.configurable(module="evo_test")
def evo_test_train(group_size=8):
  pass


@gin.configurable(module="evo_test")
class EvoTestDropDead:
  pass


@gin.configurable(module="evo_test")
class EvoTestStd:
  pass


LIB = {"drop_dead": "@EvoTestDropDead()", "std": "@EvoTestStd()"}


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def space() -> SearchSpace:
  return SearchSpace([
      FloatKnob("EvoTestLearner.learning_rate", 1e-5, 1e-3, log=True),
      FloatKnob("EvoTestLearner.clip_high", 0.2, 0.4, step=0.04),
      IntKnob("evo_test_train.group_size", 2, 16, log=True),
      ChoiceKnob("EvoTestHarness.estimator", ["grpo", "dr_grpo", "rloo"]),
      ComponentListKnob("EvoTestHarness.group_filters", LIB, max_size=1),
      DictWeightKnob("EvoTestComposer.parts", "partial", 0.05, 1.0),
      DictWeightKnob("EvoTestComposer.parts", "format", 0.05, 0.5, removable=False),
  ])


CURRENT = {"EvoTestLearner.learning_rate": 3e-4, "EvoTestLearner.clip_high": 0.28,
           "evo_test_train.group_size": 8, "EvoTestHarness.estimator": "grpo",
           "EvoTestHarness.group_filters": [], "EvoTestComposer.parts": {"correct": 1.0}}


def news(knob, values):
  return sorted(ss.canonical(iv.new) for iv in knob.candidates(values))


# ------------------------------------------------------------------ declaring in gin


def test_space_declared_in_gin():
  gin.parse_config("""
      SearchSpace.knobs = [@lr/FloatKnob(), @gf/ComponentListKnob(), @w/DictWeightKnob(),
                           @est/ChoiceKnob(), @g/IntKnob()]
      lr/FloatKnob.binding = 'EvoTestLearner.learning_rate'
      lr/FloatKnob.low = 1e-5
      lr/FloatKnob.high = 1e-3
      lr/FloatKnob.log = True
      gf/ComponentListKnob.binding = 'EvoTestHarness.group_filters'
      gf/ComponentListKnob.library = {'drop_dead': '@EvoTestDropDead()'}
      gf/ComponentListKnob.max_size = 1
      w/DictWeightKnob.binding = 'EvoTestComposer.parts'
      w/DictWeightKnob.key = 'partial'
      w/DictWeightKnob.low = 0.05
      w/DictWeightKnob.high = 1.0
      est/ChoiceKnob.binding = 'EvoTestHarness.estimator'
      est/ChoiceKnob.choices = ['grpo', 'rloo']
      g/IntKnob.binding = 'evo_test_train.group_size'
      g/IntKnob.low = 2
      g/IntKnob.high = 16
  """)
  s = gin.get_configurable(SearchSpace)()
  assert [k.name for k in s.knobs] == [
      "EvoTestLearner.learning_rate", "EvoTestHarness.group_filters",
      "EvoTestComposer.parts['partial']", "EvoTestHarness.estimator",
      "evo_test_train.group_size"]
  assert s.knobs[0] == FloatKnob("EvoTestLearner.learning_rate", 1e-5, 1e-3, log=True)
  assert s.knobs[1].library == {"drop_dead": "@EvoTestDropDead()"}  # strings, not objects
  s.check_bindings_exist()


def test_bad_space_declarations():
  with pytest.raises(SearchSpaceError, match="low <= high"):
    FloatKnob("EvoTestLearner.clip_high", 0.4, 0.2)
  with pytest.raises(SearchSpaceError, match="low > 0"):
    FloatKnob("EvoTestLearner.learning_rate", 0.0, 1.0, log=True)
  with pytest.raises(SearchSpaceError, match="gin references"):
    ComponentListKnob("EvoTestHarness.group_filters", {"x": "EvoTestStd"})
  with pytest.raises(SearchSpaceError, match="repeated"):
    SearchSpace([ChoiceKnob("EvoTestHarness.estimator", ["a", "b"])] * 2)
  with pytest.raises(SearchSpaceError, match="only DictWeightKnobs may share"):
    SearchSpace([ChoiceKnob("EvoTestComposer.parts", [{"correct": 1.0}, {"partial": 1.0}]),
                 DictWeightKnob("EvoTestComposer.parts", "partial", 0.0, 1.0)])


# ------------------------------------------------------------------ proposals, by hand


def test_float_knob_steps():
  lr = FloatKnob("EvoTestLearner.learning_rate", 1e-5, 1e-3, log=True)
  assert news(lr, CURRENT) == sorted(ss.canonical(x) for x in (6e-4, 1.5e-4))  # x2, /2
  clip = FloatKnob("EvoTestLearner.clip_high", 0.2, 0.4, step=0.04)
  assert news(clip, CURRENT) == sorted(ss.canonical(x) for x in (0.32, 0.24))
  # At the top of the range only the step down remains (0.44 clips to 0.4 = current).
  assert news(clip, {"EvoTestLearner.clip_high": 0.4}) == [ss.canonical(0.36)]
  # Default linear step: a quarter of the range, (0.4 - 0.2) / 4 = 0.05.
  clip4 = FloatKnob("EvoTestLearner.clip_high", 0.2, 0.4)
  assert news(clip4, CURRENT) == sorted(ss.canonical(x) for x in (0.33, 0.23))


def test_int_and_choice_knobs():
  g = IntKnob("evo_test_train.group_size", 2, 16, log=True)
  assert [iv.new for iv in g.candidates(CURRENT)] == [16, 4]
  assert [iv.new for iv in g.candidates({"evo_test_train.group_size": 16})] == [8]
  lin = IntKnob("evo_test_train.group_size", 2, 16, step=3)
  assert [iv.new for iv in lin.candidates(CURRENT)] == [11, 5]
  est = ChoiceKnob("EvoTestHarness.estimator", ["grpo", "dr_grpo", "rloo"])
  assert [iv.new for iv in est.candidates(CURRENT)] == ["dr_grpo", "rloo"]


def test_component_list_knob_add_remove():
  k = ComponentListKnob("EvoTestHarness.group_filters", LIB, max_size=1)
  adds = k.candidates(CURRENT)
  assert [(iv.kind, iv.key, iv.new) for iv in adds] == [
      ("add", "drop_dead", ["@EvoTestDropDead()"]), ("add", "std", ["@EvoTestStd()"])]
  full = {"EvoTestHarness.group_filters": ["@EvoTestDropDead()"]}
  # max_size reached: only the removal is proposed.
  assert [(iv.kind, iv.key, iv.new) for iv in k.candidates(full)] == [
      ("remove", "drop_dead", [])]
  # A component outside the library is never touched, and a module-qualified reference
  # is recognised as the same component.
  other = {"EvoTestHarness.group_filters": ["@Foreign()", "@evo_test.EvoTestDropDead()"]}
  k2 = ComponentListKnob("EvoTestHarness.group_filters", LIB)
  assert [(iv.kind, iv.key, iv.new) for iv in k2.candidates(other)] == [
      ("add", "std", ["@Foreign()", "@evo_test.EvoTestDropDead()", "@EvoTestStd()"]),
      ("remove", "drop_dead", ["@Foreign()"])]


def test_dict_weight_knob():
  k = DictWeightKnob("EvoTestComposer.parts", "partial", 0.05, 1.0)
  (add,) = k.candidates(CURRENT)
  # Absent: added at the middle of the range, (0.05 + 1.0) / 2 = 0.525.
  assert (add.kind, add.key, add.new) == ("add", "partial", {"correct": 1.0, "partial": 0.525})
  have = {"EvoTestComposer.parts": {"correct": 1.0, "partial": 0.5}}
  got = [(iv.kind, iv.new.get("partial")) for iv in k.candidates(have)]
  # step (1.0 - 0.05) / 4 = 0.2375: 0.7375 and 0.2625; then the subtraction.
  assert got == [("set", 0.7375), ("set", 0.2625), ("remove", None)]
  assert all(iv.new["correct"] == 1.0 for iv in k.candidates(have))
  fixed = DictWeightKnob("EvoTestComposer.parts", "partial", 0.05, 1.0, removable=False)
  assert "remove" not in [iv.kind for iv in fixed.candidates(have)]


def test_neighbours_are_single_factor_distinct_and_deterministic():
  s = space()
  ivs = s.neighbours(CURRENT, random.Random(3), k=len(s.knobs))
  # One per knob while every knob has a candidate (knobs take turns).
  assert sorted(s.knob_for(iv).name for iv in ivs) == sorted(k.name for k in s.knobs)
  for iv in ivs:
    after = s.apply(CURRENT, iv)
    changed = [b for b in CURRENT if ss.canonical(after[b]) != ss.canonical(CURRENT[b])]
    assert changed == [iv.binding]
    if isinstance(iv.new, dict):  # one entry of a dict
      keys = set(iv.old) | set(iv.new)
      assert [k for k in keys if iv.old.get(k) != iv.new.get(k)] == [iv.key]
  assert len({iv.id for iv in ivs}) == len(ivs)
  again = s.neighbours(CURRENT, 3, k=len(s.knobs))
  assert [iv.id for iv in again] == [iv.id for iv in ivs]
  many = s.neighbours(CURRENT, 0, k=100)
  # Every candidate once: lr 2 + clip 2 + group 2 + estimator 2 + filters 2 + 2 dict adds.
  assert len(many) == 12 and len({iv.id for iv in many}) == 12
  assert len(s.neighbours(CURRENT, 0, k=3)) == 3


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("iv, match", [
    (Intervention("EvoTestLearner.momentum", 0.9, 0.8), "EvoTestLearner.momentum is outside"),
    (Intervention("EvoTestLearner.clip_high", 0.28, 0.5), r"clip_high.*outside \[0.2, 0.4\]"),
    (Intervention("EvoTestLearner.clip_high", 0.28, True), "clip_high"),
    (Intervention("EvoTestLearner.clip_high", 0.28, "0.3"), "clip_high"),
    (Intervention("evo_test_train.group_size", 8, 8.5), "group_size.*not an int"),
    (Intervention("EvoTestHarness.estimator", "grpo", "ppo"), "estimator.*not one of"),
    (Intervention("EvoTestHarness.group_filters", [], ["@EvoTestOther()"], "add"),
     "group_filters.*not in the library"),
    (Intervention("EvoTestHarness.group_filters", ["@EvoTestDropDead()"],
                  ["@EvoTestDropDead()", "@EvoTestStd()"], "add"), "max_size=1"),
    (Intervention("EvoTestHarness.group_filters", [], ["@EvoTestStd()"], "set"),
     "'add' or 'remove' only"),
    (Intervention("EvoTestComposer.parts", {"correct": 1.0},
                  {"correct": 0.5, "partial": 0.5}, "add", "partial"), "other than 'partial'"),
    (Intervention("EvoTestComposer.parts", {"correct": 1.0}, {"correct": 1.0, "x": 0.5},
                  "add", "x"), r"EvoTestComposer.parts\['x'\] is outside"),
    (Intervention("EvoTestComposer.parts", {"correct": 1.0, "format": 0.1},
                  {"correct": 1.0}, "remove", "format"), "may not be removed"),
    (Intervention("EvoTestComposer.parts", {"correct": 1.0}, {"correct": 1.0, "partial": 2.0},
                  "add", "partial"), r"outside \[0.05, 1.0\]"),
])
def test_validate_rejects_outside_the_space(iv, match):
  with pytest.raises(SearchSpaceError, match=match):
    space().validate(iv)


def test_validate_accepts_proposals():
  s = space()
  for iv in s.neighbours(CURRENT, 1, k=100):
    assert s.validate(iv) is iv


def test_apply_copies_and_refuses_a_stale_intervention():
  s = space()
  iv = ss.make_intervention("EvoTestLearner.clip_high", 0.28, 0.32)
  out = s.apply(CURRENT, iv)
  assert out["EvoTestLearner.clip_high"] == 0.32 and CURRENT["EvoTestLearner.clip_high"] == 0.28
  with pytest.raises(SearchSpaceError, match="designed for EvoTestLearner.clip_high = 0.28"):
    s.apply({**CURRENT, "EvoTestLearner.clip_high": 0.3}, iv)


# ------------------------------------------------------------------ gin round trip


def test_to_gin_parses_and_binds_the_new_value():
  s = space()
  for iv in s.neighbours(CURRENT, 5, k=100):
    gin.clear_config()
    gin.parse_config(iv.to_gin())
    assert ss.normalize(gin.query_parameter(iv.binding)) == iv.new, iv.to_gin()
  iv = ss.make_intervention("EvoTestHarness.group_filters", [], ["@EvoTestStd()"], key="std")
  assert iv.to_gin() == "EvoTestHarness.group_filters = [@EvoTestStd()]"
  iv = ss.make_intervention("EvoTestComposer.parts", {"correct": 1.0},
                            {"correct": 1.0, "partial": 0.5})
  assert iv.to_gin() == "EvoTestComposer.parts = {'correct': 1.0, 'partial': 0.5}"
  assert (iv.kind, iv.key) == ("add", "partial")
  assert iv.description == "EvoTestComposer.parts: add 'partial' = 0.5"


def test_current_values_read_from_gin_with_defaults():
  s = SearchSpace([FloatKnob("EvoTestLearner.clip_high", 0.2, 0.4),
                   ComponentListKnob("EvoTestHarness.group_filters", LIB),
                   ChoiceKnob("EvoTestHarness.estimator", ["grpo", "rloo"])])
  gin.parse_config("EvoTestLearner.clip_high = 0.3\n"
                   "EvoTestHarness.group_filters = [@EvoTestDropDead()]")
  assert s.current_values() == {"EvoTestLearner.clip_high": 0.3,
                                "EvoTestHarness.group_filters": ["@EvoTestDropDead()"],
                                "EvoTestHarness.estimator": "grpo"}  # the default


def test_make_intervention_reads_the_kind():
  assert ss.make_intervention("a.b", [1], [1, 2]).kind == "add"
  assert ss.make_intervention("a.b", [1, 2], [2]).kind == "remove"
  iv = ss.make_intervention("a.b", {"x": 1.0, "y": 2.0}, {"x": 1.0, "y": 3.0})
  assert (iv.kind, iv.key) == ("set", "y")
  assert iv.description == "a.b['y']: 2.0 -> 3.0"
  iv = ss.make_intervention("a.b", {"x": 1.0, "y": 2.0}, {"x": 1.0})
  assert (iv.kind, iv.key, iv.description) == ("remove", "y", "a.b: remove 'y' (was 2.0)")


def test_intervention_record_round_trip_and_id():
  iv = ss.make_intervention("EvoTestHarness.group_filters", [], ["@EvoTestStd()"], key="std")
  d = iv.to_dict()
  assert d["gin"] == iv.to_gin() and d["id"] == iv.id
  back = Intervention.from_dict(d)
  assert back == iv and back.id == iv.id and hash(back) == hash(iv)
  assert ss.make_intervention("EvoTestLearner.clip_high", 0.28, 0.32).id != \
      ss.make_intervention("EvoTestLearner.clip_high", 0.28, 0.24).id
  with pytest.raises(SearchSpaceError, match="kind='swap'"):
    Intervention("EvoTestLearner.clip_high", 0.28, 0.3, "swap")


# ------------------------------------------------------------------ bindings exist


def test_unknown_binding_is_named():
  s = SearchSpace([FloatKnob("EvoTestLearner.clip_high", 0.2, 0.4),
                   FloatKnob("EvoTestLearner.not_a_param", 0.0, 1.0),
                   FloatKnob("NoSuchConfigurable.x", 0.0, 1.0),
                   ComponentListKnob("EvoTestHarness.group_filters", {"x": "@NoSuchFilter()"})])
  with pytest.raises(SearchSpaceError) as e:
    s.check_bindings_exist()
  msg = str(e.value)
  assert "EvoTestLearner.not_a_param" in msg and "NoSuchConfigurable.x" in msg
  assert "@NoSuchFilter()" in msg and "clip_high" not in msg


def test_real_bindings_of_the_math_domain_exist():
  """The bindings the issue names, against the real configurables (imports, no compute)."""
  s = SearchSpace([
      FloatKnob("Learner.learning_rate", 1e-5, 1e-3, log=True),
      FloatKnob("Learner.clip_high", 0.2, 0.4),
      FloatKnob("SamplingParams.temperature", 0.6, 1.2),
      IntKnob("train.group_size", 2, 16, log=True),
      IntKnob("MathTask.difficulty", 1, 5),
      ChoiceKnob("Harness.estimator", ["grpo", "dr_grpo", "rloo"]),
      ComponentListKnob("Harness.group_filters",
                        {"drop_dead": "@DropZeroVarianceGroups()", "std": "@StdGroupFilter()"}),
      DictWeightKnob("RewardComposer.parts", "partial", 0.05, 1.0),
  ])
  from evotrainer import registry
  registry.register_builtins()  # the real configurables
  s.check_bindings_exist()
  bad = SearchSpace([FloatKnob("Learner.clip_higher", 0.2, 0.4)])
  with pytest.raises(SearchSpaceError, match="Learner.clip_higher"):
    bad.check_bindings_exist()
  for iv in s.neighbours({"Learner.learning_rate": 3e-4, "Learner.clip_high": 0.28,
                          "SamplingParams.temperature": 1.0, "train.group_size": 8,
                          "MathTask.difficulty": 1, "Harness.estimator": "grpo",
                          "Harness.group_filters": [],
                          "RewardComposer.parts": {"correct": 1.0}}, 0, k=100):
    gin.parse_config(iv.to_gin())  # each one is a valid --gin_bindings


def test_the_module_docstring_example_parses():
  import textwrap
  doc = ss.__doc__
  example = doc[doc.index("SearchSpace.knobs"):doc.index("Each knob's")]
  from evotrainer import registry
  registry.register_builtins()
  gin.parse_config(textwrap.dedent("    " + example))
  s = gin.get_configurable(SearchSpace)()
  assert len(s) == 5 and s.restrict(groups=["hyper"]).bindings == [
      "Learner.learning_rate", "Learner.clip_high", "Harness.estimator"]
  s.check_bindings_exist()
