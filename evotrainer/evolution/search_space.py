"""The search space: the action boundary of the evolution (docs/method.md steps 3-4).

A *knob* is one gin binding the controller may change, with a typed domain; a
`SearchSpace` is the list of knobs. Every change the controller makes is an
`Intervention` on exactly one knob (|ΔX| = 1), and nothing outside the space changes.
An intervention is a gin binding, so a person can replay any version with
`--gin_bindings="$(intervention.to_gin())"`.

Knobs:
  FloatKnob(binding, low, high, log=False)          a float in [low, high]
  IntKnob(binding, low, high, log=False)            an int in [low, high]
  ChoiceKnob(binding, choices)                      one of a list of values
  ComponentListKnob(binding, library, max_size)     add / remove one component of a list
  DictWeightKnob(binding, key, low, high)           one entry of a {name: weight} dict

Values are plain Python (numbers, strings, lists, dicts). A string that starts with '@'
or '%' is a gin reference or macro and is written to gin unquoted: a component library
maps a short name to a reference string, e.g. {'drop_dead': '@DropZeroVarianceGroups()'}.

Declaring a space in gin (a scope per knob):

    SearchSpace.knobs = [@lr/FloatKnob(), @clip_high/FloatKnob(), @estimator/ChoiceKnob(),
                         @group_filters/ComponentListKnob(), @partial/DictWeightKnob()]
    lr/FloatKnob.binding = 'Learner.learning_rate'
    lr/FloatKnob.low = 1e-5
    lr/FloatKnob.high = 1e-3
    lr/FloatKnob.log = True
    clip_high/FloatKnob.binding = 'Learner.clip_high'
    clip_high/FloatKnob.low = 0.2
    clip_high/FloatKnob.high = 0.4
    clip_high/FloatKnob.step = 0.04
    estimator/ChoiceKnob.binding = 'Harness.estimator'
    estimator/ChoiceKnob.choices = ['grpo', 'dr_grpo', 'rloo']
    group_filters/ComponentListKnob.binding = 'Harness.group_filters'
    group_filters/ComponentListKnob.library = {
        'drop_dead': '@DropZeroVarianceGroups()', 'std': '@StdGroupFilter()'}
    group_filters/ComponentListKnob.max_size = 1
    group_filters/ComponentListKnob.group = 'filter'
    partial/DictWeightKnob.binding = 'RewardComposer.parts'
    partial/DictWeightKnob.key = 'partial'
    partial/DictWeightKnob.low = 0.05
    partial/DictWeightKnob.high = 1.0
    partial/DictWeightKnob.group = 'reward'

Each knob's `group` (free text: 'hyper', 'reward', 'filter', 'data', ...) lets a proposer
restrict itself, e.g. the recipe-search baseline to `space.restrict(groups=['hyper'])`.

The values, the Intervention and the gin look-ups live in intervention.py, the knob
classes in knobs.py; this module holds the SearchSpace and re-exports their public names.
"""

from __future__ import annotations

import random
import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import gin

from evotrainer.evolution.intervention import (KINDS, Intervention, SearchSpaceError, _REF,
                                               _REF_PARTS, _lookup, _parse_binding, _short,
                                               canonical, current_value, describe,
                                               extra_item, format_value, make_intervention,
                                               normalize, same_value)
from evotrainer.evolution.knobs import (ChoiceKnob, ComponentListKnob, DictWeightKnob,
                                        FloatKnob, IntKnob, Knob)


# ------------------------------------------------------------------ the space


@gin.configurable(module="evolution")
class SearchSpace:
  """The knobs the controller may turn; every intervention goes through `validate`.

  Args:
    knobs: FloatKnob / IntKnob / ChoiceKnob / ComponentListKnob / DictWeightKnob. Knob
      names must be unique; several DictWeightKnobs may share a dict binding (one per
      key), any other knob owns its binding alone.
  """

  def __init__(self, knobs: Sequence[Knob] = ()):
    self.knobs = list(knobs)
    names = [k.name for k in self.knobs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
      raise SearchSpaceError(f"SearchSpace: knobs repeated: {dup}")
    by_binding: dict = {}
    for k in self.knobs:
      by_binding.setdefault(k.binding, []).append(k)
    for b, ks in by_binding.items():
      if len(ks) > 1 and not all(isinstance(k, DictWeightKnob) for k in ks):
        raise SearchSpaceError(f"SearchSpace: binding {b} has several knobs "
                               f"({[k.name for k in ks]}); only DictWeightKnobs may share one")
    self._by_binding = by_binding

  @property
  def bindings(self) -> list:
    """The distinct bindings of the space, in knob order."""
    return list(self._by_binding)

  def __contains__(self, binding: str) -> bool:
    return binding in self._by_binding

  def __len__(self) -> int:
    return len(self.knobs)

  def restrict(self, groups: Optional[Iterable[str]] = None,
               bindings: Optional[Iterable[str]] = None) -> "SearchSpace":
    """The sub-space of knobs in `groups` (and/or on `bindings`)."""
    groups = None if groups is None else set(groups)
    bindings = None if bindings is None else set(bindings)
    return SearchSpace([k for k in self.knobs
                        if (groups is None or k.group in groups)
                        and (bindings is None or k.binding in bindings)])

  def knob_for(self, iv: Intervention) -> Knob:
    """The knob that owns `iv` (for a dict binding, the one for `iv.key`)."""
    ks = self._by_binding.get(iv.binding)
    if not ks:
      raise SearchSpaceError(f"binding {iv.binding} is outside the search space (knobs: "
                             f"{', '.join(k.name for k in self.knobs) or 'none'})")
    if isinstance(ks[0], DictWeightKnob):
      match = [k for k in ks if k.key == iv.key]
      if not match:
        raise SearchSpaceError(f"{iv.binding}[{iv.key!r}] is outside the search space "
                               f"(keys with a knob: {[k.key for k in ks]})")
      return match[0]
    return ks[0]

  def validate(self, iv: Intervention) -> Intervention:
    """Returns `iv` when it is inside the space; raises SearchSpaceError naming the binding."""
    self.knob_for(iv).check(iv)
    return iv

  def neighbours(self, current_values: Mapping[str, Any], rng: Union[random.Random, int],
                 k: int) -> list:
    """Up to `k` distinct single-factor interventions from `current_values`.

    Knobs take turns (in a random order) so that a knob with many choices does not
    crowd out the others; each knob's candidates are shuffled. Deterministic for a
    given `rng` seed.
    """
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    pools = []
    for knob in self.knobs:
      cands = [self.validate(iv) for iv in knob.candidates(current_values)]
      rng.shuffle(cands)
      if cands:
        pools.append(cands)
    rng.shuffle(pools)
    out, seen = [], set()
    while len(out) < k and any(pools):
      for pool in pools:
        while pool and len(out) < k:
          iv = pool.pop()
          if iv.id not in seen:
            seen.add(iv.id)
            out.append(iv)
            break
    return out

  def apply(self, bindings: Mapping[str, Any], iv: Intervention) -> dict:
    """A copy of `bindings` ({binding: value}) with `iv` applied (validated first).

    Raises when `bindings` holds a value for the binding other than `iv.old`: the
    intervention was designed for another parent.
    """
    self.validate(iv)
    if iv.binding in bindings and not same_value(normalize(bindings[iv.binding]), iv.old):
      raise SearchSpaceError(f"{iv.description}: designed for {iv.binding} = "
                             f"{_short(iv.old)}, but the bindings hold "
                             f"{_short(bindings[iv.binding])}")
    out = {b: normalize(v) for b, v in bindings.items()}
    out[iv.binding] = iv.new
    return out

  def check_bindings_exist(self) -> None:
    """Raises SearchSpaceError naming every knob binding (or component reference) that
    is no gin configurable parameter. The configurables must be registered first (a
    launch has parsed the run's gin; else registry.register_builtins())."""
    errors = []
    for knob in self.knobs:
      try:
        _parse_binding(knob.binding)
      except ValueError as e:
        errors.append(f"{knob.name}: binding {knob.binding!r} is no gin parameter ({e})")
      refs = list(getattr(knob, "library", {}).values()) + [
          c for c in getattr(knob, "choices", ()) if isinstance(c, str) and _REF.match(c)]
      for ref in refs:
        m = _REF_PARTS.fullmatch(re.sub(r"\s+", "", ref))
        if m and _lookup(m.group(2)) is None:
          errors.append(f"{knob.name}: component {ref!r} names no (unique) gin configurable")
    if errors:
      raise SearchSpaceError("search space: unknown bindings:\n  " + "\n  ".join(errors))

  def current_values(self) -> dict:
    """{binding: value} read from the parsed gin config; a binding gin has no value for
    takes its configurable's default. Call after parsing the run's gin files."""
    return {b: current_value(b) for b in self.bindings}


__all__ = ["ChoiceKnob", "ComponentListKnob", "DictWeightKnob", "FloatKnob", "IntKnob",
           "Intervention", "KINDS", "Knob", "SearchSpace", "SearchSpaceError", "canonical",
           "current_value", "describe", "extra_item", "format_value", "make_intervention",
           "normalize", "same_value"]
