"""Skills: what worked before, as trigger -> intervention rules (docs/method.md, "Memory").

A skill is one human-readable JSON file: a *trigger* (a condition over the incumbent's
findings and current bindings), an *intervention template* (one gin binding change),
the expected outcome, the validation criterion, and the evidence — successes and
failures per domain. A skill counts as cross-domain only once it was validated in two
domains. Seed skills ship in `seed_skills/`; a run works on its own skills directory
(`SkillLibrary.seeded(workdir / 'skills')`), records outcomes there, and a later run can
start from that directory. The controller learns skills two ways (promotion.py): a kept
change that no skill proposed (`learned-*`: the same change from the same state), and
the change of an incumbent whose branches mostly failed badly (`learned-unstable-*`:
on its `unstable_incumbent` finding while the change is in place, the inverse change).

Trigger language (JSON; evaluated here, never with eval()):

  {"finding": KIND}                              a finding of that kind is present
  {"finding": KIND, "op": OP, "value": X}        ... whose `field` (default "value";
  {"finding": KIND, "field": "severity", ...}    also "severity", "threshold") OP X
  {"binding": NAME, "op": OP, "value": X}        the current value of a gin binding
  {"all": [C, ...]}, {"any": [C, ...]}, {"not": C}
  any leaf may carry "and": [C, ...] (the leaf and all of those)

  OP for numbers: > >= < <= == !=; for bindings also "contains" / "lacks" (a dict key or
  a list element, e.g. a reward part or a '@Filter()' component) and "in" (the value is
  one of a list). A binding condition is false when the caller passed no value for it.

Intervention template (JSON), instantiated against the current bindings:

  {"binding": B, "kind": "set", "value": X}             B = X
  {"binding": B, "kind": "set", "key": K, "value": X}   dict entry K of B = X
  {"binding": B, "kind": "scale", "factor": F [, "key": K]}   B (or entry K) times F
  {"binding": B, "kind": "add", "component": "@C()"}    append a component to list B
  {"binding": B, "kind": "add", "key": K, "value": X}   add dict entry K = X
  {"binding": B, "kind": "remove", "component": "@C()" | "key": K}
  {"binding": B, "kind": "revert"}                      B back to its value before its
                                                        last change (a subtraction)
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import os
import pathlib
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from evotrainer import atomic
from evotrainer.evolution.search_space import (ComponentListKnob, Intervention, SearchSpace,
                                               same_value, extra_item, canonical,
                                               make_intervention, normalize)
from evotrainer.evolution.stats import pooled_effect

SEED_DIR = pathlib.Path(__file__).resolve().parent / "seed_skills"
CATEGORIES = ("reward design", "filter mechanism", "training stability",
              "evaluation protocol", "cross-domain transfer")
TEMPLATE_KINDS = ("set", "scale", "add", "remove", "revert")
FINDING_FIELDS = ("value", "severity", "threshold")
AGAINST = ("control", "parent")  # what a recorded effect was measured against
_NUM_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
            "==": operator.eq, "!=": operator.ne}
_BINDING_OPS = tuple(_NUM_OPS) + ("contains", "lacks", "in")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class SkillError(ValueError):
  """A skill file or skill is malformed, or an update contradicts it; names which."""


# ------------------------------------------------------------------ the trigger language


def _get(f: Any, name: str) -> Any:
  """A finding's field: `types.Finding`, a ledger FindingRecord, or a dict."""
  return f.get(name) if isinstance(f, Mapping) else getattr(f, name, None)


def check_condition(cond: Any, where: str = "trigger") -> None:
  """Raises SkillError at the first malformed node, naming its path (e.g. 'trigger.all[1]')."""
  if not isinstance(cond, Mapping):
    raise SkillError(f"{where}: a condition is a JSON object, got {cond!r}")
  combos = [k for k in ("all", "any", "not") if k in cond]
  leaves = [k for k in ("finding", "binding") if k in cond]
  if len(combos) + len(leaves) != 1:
    raise SkillError(f"{where}: needs exactly one of all / any / not / finding / binding, "
                     f"got keys {sorted(cond)}")
  if combos:
    key = combos[0]
    if set(cond) != {key}:
      raise SkillError(f"{where}: '{key}' takes no other keys, got {sorted(cond)}")
    if key == "not":
      check_condition(cond["not"], f"{where}.not")
      return
    if not isinstance(cond[key], list) or not cond[key]:
      raise SkillError(f"{where}.{key}: a non-empty list of conditions")
    for i, c in enumerate(cond[key]):
      check_condition(c, f"{where}.{key}[{i}]")
    return
  leaf = leaves[0]
  allowed = {leaf, "op", "value", "and"} | ({"field"} if leaf == "finding" else set())
  extra = set(cond) - allowed
  if extra:
    raise SkillError(f"{where}: unknown keys {sorted(extra)} (allowed: {sorted(allowed)})")
  if not isinstance(cond[leaf], str) or not cond[leaf]:
    raise SkillError(f"{where}.{leaf}: a name, got {cond[leaf]!r}")
  if ("op" in cond) != ("value" in cond) or (leaf == "binding" and "op" not in cond):
    raise SkillError(f"{where}: 'op' and 'value' go together"
                     + (" (a binding condition needs both)" if leaf == "binding" else ""))
  if "op" in cond:
    ops = _BINDING_OPS if leaf == "binding" else tuple(_NUM_OPS)
    if cond["op"] not in ops:
      raise SkillError(f"{where}.op: {cond['op']!r}; expected one of {list(ops)}")
    if leaf == "finding" and not _is_number(cond["value"]):
      raise SkillError(f"{where}.value: a number, got {cond['value']!r}")
    if cond["op"] == "in" and not isinstance(cond["value"], list):
      raise SkillError(f"{where}.value: 'in' takes a list, got {cond['value']!r}")
  if cond.get("field", "value") not in FINDING_FIELDS:
    raise SkillError(f"{where}.field: {cond['field']!r}; expected one of {FINDING_FIELDS}")
  if "and" in cond:
    if not isinstance(cond["and"], list) or not cond["and"]:
      raise SkillError(f"{where}.and: a non-empty list of conditions")
    for i, c in enumerate(cond["and"]):
      check_condition(c, f"{where}.and[{i}]")


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _binding_test(op: str, have: Any, want: Any) -> bool:
  if op in ("contains", "lacks"):
    if isinstance(have, dict):
      found = want in have
    elif isinstance(have, list):
      found = any(same_value(x, want) for x in have)
    elif isinstance(have, str):
      found = str(want) in have
    else:
      found = False
    return found if op == "contains" else not found
  if op == "in":
    return any(same_value(have, w) for w in want)
  if op in ("==", "!="):
    return same_value(have, want) == (op == "==")
  return _is_number(have) and _is_number(want) and _NUM_OPS[op](have, want)


def evaluate(cond: Mapping, findings: Sequence, bindings: Optional[Mapping] = None
             ) -> tuple[bool, list]:
  """(whether `cond` holds, the findings that made its finding-conditions true)."""
  if "all" in cond:
    matched = []
    for c in cond["all"]:
      ok, m = evaluate(c, findings, bindings)
      if not ok:
        return False, []
      matched += m
    return True, matched
  if "any" in cond:
    results = [evaluate(c, findings, bindings) for c in cond["any"]]
    return any(ok for ok, _ in results), [f for ok, m in results if ok for f in m]
  if "not" in cond:
    return not evaluate(cond["not"], findings, bindings)[0], []
  if "finding" in cond:
    field = cond.get("field", "value")
    matched = [f for f in findings if _get(f, "kind") == cond["finding"]]
    if "op" in cond:
      matched = [f for f in matched if _is_number(_get(f, field))
                 and not math.isnan(_get(f, field))
                 and _NUM_OPS[cond["op"]](_get(f, field), cond["value"])]
    ok = bool(matched)
  else:
    bindings = bindings or {}
    ok = cond["binding"] in bindings and _binding_test(
        cond["op"], normalize(bindings[cond["binding"]]), normalize(cond["value"]))
    matched = []
  for c in cond.get("and", ()):
    if not ok:
      break
    sub_ok, m = evaluate(c, findings, bindings)
    ok, matched = sub_ok, matched + m
  return ok, (matched if ok else [])


# ------------------------------------------------------------------ intervention templates


def check_template(t: Any, where: str = "intervention") -> None:
  """Raises SkillError when an intervention template is malformed."""
  if not isinstance(t, Mapping):
    raise SkillError(f"{where}: a JSON object, got {t!r}")
  kind = t.get("kind")
  if kind not in TEMPLATE_KINDS:
    raise SkillError(f"{where}.kind: {kind!r}; expected one of {TEMPLATE_KINDS}")
  if not isinstance(t.get("binding"), str) or not t["binding"]:
    raise SkillError(f"{where}.binding: a gin binding like 'Learner.clip_high'")
  need = {"set": {"value"}, "scale": {"factor"}, "revert": set(),
          "add": {"component"} if "component" in t else {"key", "value"},
          "remove": {"component"} if "component" in t else {"key"}}[kind]
  allowed = {"binding", "kind", "key"} | need
  missing, extra = need - set(t), set(t) - allowed
  if missing or extra:
    raise SkillError(f"{where}: kind {kind!r} needs {sorted(need)}; missing "
                     f"{sorted(missing)}, unexpected {sorted(extra)}")
  if kind == "scale" and not (_is_number(t["factor"]) and t["factor"] > 0):
    raise SkillError(f"{where}.factor: a positive number, got {t['factor']!r}")
  if "component" in t and not (isinstance(t["component"], str)
                               and t["component"].strip().startswith("@")):
    raise SkillError(f"{where}.component: a gin reference like '@DropZeroVarianceGroups()'")


def template_of(iv: Intervention) -> dict:
  """The template that reproduces `iv` (for a skill learned from a successful change)."""
  t = {"binding": iv.binding, "kind": iv.kind}
  if isinstance(iv.new, dict) or isinstance(iv.old, dict):
    t["key"] = iv.key
    if iv.kind != "remove":
      t["value"] = iv.new[iv.key]
  elif iv.kind in ("add", "remove"):
    longer, shorter = (iv.new, iv.old or []) if iv.kind == "add" else (iv.old, iv.new)
    t["component"] = extra_item(longer, shorter)
  else:
    t["value"] = iv.new
  return t


def state_of(iv: Intervention) -> dict:
  """The binding state `iv` starts from, as a trigger condition: a learned skill then
  fires where the change it learned applies again (the same weight missing, the same
  value set), even when no finding motivated it."""
  if isinstance(iv.new, dict) or isinstance(iv.old, dict):
    op = "lacks" if iv.kind == "add" else "contains"
    return {"binding": iv.binding, "op": op, "value": iv.key}
  if iv.kind in ("add", "remove"):
    longer, shorter = (iv.new, iv.old or []) if iv.kind == "add" else (iv.old, iv.new)
    op = "lacks" if iv.kind == "add" else "contains"
    return {"binding": iv.binding, "op": op, "value": extra_item(longer, shorter)}
  return {"binding": iv.binding, "op": "==", "value": iv.old}


def _scaled(x: Any, factor: float) -> Any:
  if not _is_number(x):
    raise SkillError(f"cannot scale the non-number {x!r}")
  if isinstance(x, int):
    return max(1, int(round(x * factor)))
  return float(f"{x * factor:.6g}")


# ------------------------------------------------------------------ the skill record


@dataclasses.dataclass(frozen=True)
class Skill:
  """One skill (a file `<name>.json`).

  `domains` holds the evidence: {domain: {"successes": n, "failures": m}}; `history`
  the outcomes that produced it ({"run", "version", "domain", "success", "selected",
  "effect"}): the run's identity (`Ledger.run_uid`) and the version name one branch
  across runs, so that recording the same outcome twice (a resumed run, a merged
  library) counts once.
  `effect` is the branch's measured paired effect {diff, lo, hi} on the validation
  split, with `against` ('control' or 'parent'; one recorded without it counts as
  'parent'): an effect against the parent also holds what the branch's steps would have
  gained unchanged. `success` is None for a measurement that decided nothing beyond
  noise (a keep inside the noise), which adds to `effect` and to no count. `selected`
  is True for an outcome recorded because it was good (`Skill.selected`).
  """

  name: str
  category: str
  description: str
  trigger: dict
  intervention: dict
  expected_outcome: str
  validation_criterion: str
  domains: dict = dataclasses.field(default_factory=dict)
  harness: dict = dataclasses.field(default_factory=dict)  # {"enable": [names]}
  history: tuple = ()
  source: str = "seed"  # 'seed' or 'learned'

  def __hash__(self) -> int:
    return hash(self.name)

  @property
  def successes(self) -> int:
    return sum(d.get("successes", 0) for d in self.domains.values())

  @property
  def failures(self) -> int:
    return sum(d.get("failures", 0) for d in self.domains.values())

  @property
  def evidence(self) -> int:
    """successes - failures: the first ranking key of `SkillLibrary.matching`."""
    return self.successes - self.failures

  @property
  def effect(self) -> dict:
    """The change's effect pooled over every measurement in the history, across runs
    (`stats.pooled_effect`): {mean, lo, hi, n}. Runs too short to show an effect of this
    size one by one can show it together."""
    return self.effect_in(None)

  def effect_in(self, domain: Optional[str], against: Sequence[str] = AGAINST,
                step_gain: float = 0.0, discoveries: bool = True) -> dict:
    """`effect`, pooled over the measurements made in `domain` only (None: every one)
    and measured against one of `against` (`against_of`), each measured against the
    parent less `step_gain` (what the branch's steps gain unchanged). `discoveries`
    False leaves out the measurements recorded because they were good (`selected`):
    their effects are biased upward by that choice, the winner's curse."""
    return pooled_effect([_net(h["effect"], step_gain) for i, h in enumerate(self.history)
                          if h.get("effect") and (domain is None or h.get("domain") == domain)
                          and against_of(h["effect"]) in against
                          and (discoveries or not self.selected(i))])

  def selected(self, i: int) -> bool:
    """Whether history[i] was recorded because its outcome was good: a keep of a change
    no skill proposed, learned (`SkillLearner`), which a rejection of the same change
    would not have recorded; a branch the skill proposed is recorded whatever its
    outcome. An entry from before `selected` existed counts as selected when it opens a
    learned skill's history (the keep that learned it)."""
    h = self.history[i]
    if "selected" in h:
      return bool(h["selected"])
    return self.source == "learned" and i == 0

  @property
  def harmful(self) -> bool:
    """Worse beyond noise over two or more measurements pooled: no longer proposed."""
    return _harmful(self.effect)

  @property
  def domains_validated(self) -> list:
    """Domains with at least one success and more successes than failures."""
    return sorted(d for d, c in self.domains.items()
                  if c.get("successes", 0) >= 1 and c.get("successes", 0) > c.get("failures", 0))

  @property
  def cross_domain(self) -> bool:
    """True only once the skill was validated in two domains (docs/method.md)."""
    return len(self.domains_validated) >= 2

  def triggered(self, findings: Sequence, bindings: Optional[Mapping] = None
                ) -> tuple[bool, list]:
    """(whether the trigger holds, the findings it matched)."""
    return evaluate(self.trigger, findings, bindings)

  def instantiate(self, values: Mapping[str, Any], previous: Optional[Mapping] = None,
                  space: Optional[SearchSpace] = None) -> Optional[Intervention]:
    """The concrete Intervention from the current `values` ({binding: value}).

    `previous`: {binding: value before its last change} (`Ledger.binding_history`), for
    'revert'. Returns None when there is nothing to change (the component is already
    there, the key already gone, ...). With `space`, the result is validated
    (SearchSpaceError when it is outside the space).
    """
    t = self.intervention
    b = t["binding"]
    if b not in values:
      raise SkillError(f"skill {self.name}: no current value for {b}")
    cur, kind, key = normalize(values[b]), t["kind"], t.get("key")
    if kind == "revert":
      if not previous or b not in previous:
        raise SkillError(f"skill {self.name}: 'revert' needs the value of {b} before its "
                         f"last change")
      new = normalize(previous[b])
    elif "component" in t:
      comp = t["component"]
      items = list(cur or [])
      present = any(same_value(comp, x) for x in items)
      if kind == "add" and present or kind == "remove" and not present:
        return None
      new = items + [comp] if kind == "add" else [x for x in items if not same_value(x, comp)]
      knob = space and next((k for k in space.knobs if k.binding == b), None)
      if isinstance(knob, ComponentListKnob):
        key = knob.name_of(comp)
      cur = items
    elif key is not None:
      cur = dict(cur or {})
      if kind == "remove":
        if key not in cur:
          return None
        new = {k: v for k, v in cur.items() if k != key}
      elif kind == "add" and key in cur:
        return None
      elif kind == "scale":
        if key not in cur:
          raise SkillError(f"skill {self.name}: cannot scale absent entry {b}[{key!r}]")
        new = {**cur, key: _scaled(cur[key], t["factor"])}
      else:
        new = {**cur, key: normalize(t["value"])}
    elif kind == "scale":
      new = _scaled(cur, t["factor"])
    else:
      new = normalize(t["value"])
    if canonical(new) == canonical(cur):
      return None
    iv = make_intervention(b, cur, new, key=key)
    if space is not None:
      space.validate(iv)
    return iv

  def to_dict(self) -> dict:
    d = {"name": self.name, "category": self.category, "description": self.description,
         "trigger": self.trigger, "intervention": self.intervention,
         "expected_outcome": self.expected_outcome,
         "validation_criterion": self.validation_criterion, "harness": self.harness,
         "domains": self.domains, "history": list(self.history), "source": self.source}
    # Written for people; recomputed on load, never read back.
    d["summary"] = {"successes": self.successes, "failures": self.failures,
                    "domains_validated": self.domains_validated,
                    "cross_domain": self.cross_domain}
    return d

  @classmethod
  def from_dict(cls, d: Any, where: str = "skill") -> "Skill":
    """Builds and checks a skill; every error names `where` (the file) and the field."""
    if not isinstance(d, Mapping):
      raise SkillError(f"{where}: a skill is a JSON object")
    fields = {f.name for f in dataclasses.fields(cls)}
    extra = set(d) - fields - {"summary"}
    if extra:
      raise SkillError(f"{where}: unknown fields {sorted(extra)}")
    required = ("name", "category", "description", "trigger", "intervention",
                "expected_outcome", "validation_criterion")
    missing = [k for k in required if k not in d]
    if missing:
      raise SkillError(f"{where}: missing fields {missing}")
    if not isinstance(d["name"], str) or not _NAME.match(d["name"]):
      raise SkillError(f"{where}: name {d['name']!r} must match {_NAME.pattern}")
    if d["category"] not in CATEGORIES:
      raise SkillError(f"{where}: category {d['category']!r}; expected one of {CATEGORIES}")
    try:
      check_condition(d["trigger"])
      check_template(d["intervention"])
    except SkillError as e:
      raise SkillError(f"{where}: {e}") from None
    domains = d.get("domains", {}) or {}
    for dom, c in domains.items():
      if not (isinstance(c, Mapping) and set(c) <= {"successes", "failures"}
              and all(isinstance(v, int) and v >= 0 for v in c.values())):
        raise SkillError(f"{where}: domains[{dom!r}] must be {{'successes': n, "
                         f"'failures': m}} with counts >= 0, got {c!r}")
    _check_history(d.get("history", ()), where)
    harness = d.get("harness", {}) or {}
    if set(harness) - {"enable"} or not all(isinstance(n, str)
                                            for n in harness.get("enable", [])):
      raise SkillError(f"{where}: harness must be {{'enable': [diagnostic or validator "
                       f"names]}}, got {harness!r}")
    return cls(name=d["name"], category=d["category"], description=d["description"],
               trigger=dict(d["trigger"]), intervention=dict(d["intervention"]),
               expected_outcome=d["expected_outcome"],
               validation_criterion=d["validation_criterion"],
               domains={k: {"successes": int(v.get("successes", 0)),
                            "failures": int(v.get("failures", 0))}
                        for k, v in domains.items()},
               harness=dict(harness), history=tuple(d.get("history", ())),
               source=d.get("source", "seed"))


def against_of(effect: Mapping) -> str:
  """What `effect` was measured against: its `against`, or 'parent' for an effect recorded
  before `against` existed (the weaker claim: it may hold the steps' own gain)."""
  return effect.get("against", "parent")


def _net(effect: Mapping, step_gain: float) -> Mapping:
  """`effect` less `step_gain` when it was measured against the parent."""
  if not step_gain or against_of(effect) != "parent":
    return effect
  return {k: effect[k] - step_gain for k in ("diff", "lo", "hi")}


def _valid_effect(effect: Any) -> bool:
  if effect is None:
    return True
  return (isinstance(effect, Mapping) and against_of(effect) in AGAINST
          and all(_is_number(effect.get(k)) for k in ("diff", "lo", "hi")))


def _check_history(history: Any, where: str) -> None:
  if not isinstance(history, (list, tuple)):
    raise SkillError(f"{where}: history must be a list, got {history!r}")
  for i, h in enumerate(history):
    if not (isinstance(h, Mapping) and h.get("success") in (True, False, None) and
            isinstance(h.get("selected", False), bool) and _valid_effect(h.get("effect"))):
      raise SkillError(f"{where}: history[{i}] must be {{'run', 'version', 'domain', "
                       f"'success': true | false | null, 'selected': true | false, "
                       f"'effect': {{diff, lo, hi[, against: {' | '.join(AGAINST)}]}}}}, "
                       f"got {h!r}")


def _harmful(effect: Mapping) -> bool:
  return effect["n"] >= 2 and effect["hi"] < 0


def _key(h: Mapping) -> tuple:
  """What names one outcome: the run, the version, the domain."""
  return (h.get("run"), h.get("version"), h.get("domain"))


# ------------------------------------------------------------------ the library


def _text(skill: Skill) -> str:
  return json.dumps(skill.to_dict(), indent=2) + "\n"


def load_skill(path: str | os.PathLike) -> Skill:
  """Reads one skill file; SkillError names the file and what is wrong."""
  path = pathlib.Path(path)
  try:
    data = json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise SkillError(f"skill file {path}: {e}") from None
  skill = Skill.from_dict(data, where=f"skill file {path}")
  if skill.name != path.stem:
    raise SkillError(f"skill file {path}: name {skill.name!r} differs from the file name "
                     f"(expected {path.stem!r})")
  return skill


class SkillLibrary:
  """The skills of one directory (`*.json`, one skill per file)."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = pathlib.Path(directory)
    if not self.directory.is_dir():
      raise SkillError(f"skills directory {self.directory} does not exist")
    self._skills = {}
    for path in sorted(self.directory.glob("*.json")):
      skill = load_skill(path)
      self._skills[skill.name] = skill

  @classmethod
  def seeded(cls, directory: str | os.PathLike,
             sources: Iterable[str | os.PathLike] = (SEED_DIR,)) -> "SkillLibrary":
    """The library at `directory` (created), after copying in every skill file of
    `sources` (default: the seed skills) whose name it does not hold yet. Pass an
    earlier run's skills directory as a source, or as `directory`, to reuse what it learned.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for src in sources:
      for path in sorted(pathlib.Path(src).glob("*.json")):
        dest = directory / path.name
        if not dest.exists():
          load_skill(path)  # refuse to spread a broken file
          atomic.write_bytes(dest, path.read_bytes())
    return cls(directory)

  def __len__(self) -> int:
    return len(self._skills)

  def __iter__(self):
    return iter(self._skills.values())

  def __contains__(self, name: str) -> bool:
    return name in self._skills

  @property
  def skills(self) -> list:
    return list(self._skills.values())

  def get(self, name: str) -> Skill:
    if name not in self._skills:
      raise SkillError(f"no skill {name!r} in {self.directory} (have: {sorted(self._skills)})")
    return self._skills[name]

  def matching(self, findings: Sequence, bindings: Optional[Mapping] = None) -> list:
    """Skills whose trigger holds and that are not `harmful`, best first: by evidence
    (successes - failures), then by the pooled effect's mean (0 when none is measured),
    then by the largest severity among the findings that triggered it, then by name."""
    ranked = []
    for s in self._skills.values():
      ok, matched = s.triggered(findings, bindings)
      effect = s.effect
      if ok and not _harmful(effect):
        severity = max([float(_get(f, "severity") or 0.0) for f in matched], default=0.0)
        mean = effect["mean"] if effect["n"] else 0.0
        ranked.append((-s.evidence, -mean, -severity, s.name, s))
    return [r[-1] for r in sorted(ranked, key=lambda r: r[:4])]

  def proven(self, domain: str, min_n: int, against: Sequence[str] = ("control",),
             step_gain: float = 0.0, discoveries: bool = False) -> list:
    """Skills whose effect in `domain`, pooled over at least `min_n` measurements made
    against one of `against`, is better beyond noise (its interval above 0), largest
    pooled mean first; 'revert' skills are left out (they need a lineage). Read by
    `evolve.adopt_skills`, which applies them to a new run's root whatever its findings:
    by default only effects measured against a control count, since one against the
    parent also holds what the branch's steps gain unchanged (`step_gain`, taken off
    each such effect when they count), and only measurements recorded whatever their
    outcome (`discoveries` True counts the keeps that learned a skill too)."""
    ranked = []
    for s in self._skills.values():
      e = s.effect_in(domain, against, step_gain, discoveries)
      if e["n"] >= max(1, min_n) and e["lo"] > 0 and s.intervention["kind"] != "revert":
        ranked.append((-e["mean"], s.name, s))
    return [r[-1] for r in sorted(ranked, key=lambda r: r[:2])]

  def add(self, skill: Skill) -> Skill:
    """Writes a new skill file. The same skill again is a no-op; another skill under a
    name that exists is an error."""
    Skill.from_dict(skill.to_dict(), where=f"skill {skill.name!r}")  # validate
    if skill.name in self._skills:
      if _text(self._skills[skill.name]) != _text(skill):
        raise SkillError(f"skill {skill.name!r} already exists in {self.directory} with "
                         f"other content")
      return self._skills[skill.name]
    atomic.write_text(self.directory / f"{skill.name}.json", _text(skill))
    self._skills[skill.name] = skill
    return skill

  def record_outcome(self, skill: Skill | str, domain: str, success: Optional[bool],
                     version: Optional[str] = None, run: Optional[str] = None,
                     effect: Optional[Mapping] = None, selected: bool = False) -> Skill:
    """Records one outcome of `skill` in `domain` and rewrites its file atomically: a
    success or a failure counts one; `success=None` records only the measured `effect`
    ({diff, lo, hi}, then required). With `version`, recording the same (run, version,
    domain) again is a no-op (and with another result an error), so a resumed run does
    not count twice; `run` is the run's identity (`Ledger.run_uid`). `selected`: the
    outcome is recorded because it was good (`Skill.selected`)."""
    name = skill if isinstance(skill, str) else skill.name
    s = self.get(name)
    measured = _finite(effect)
    if success is None and measured is None:
      raise SkillError(f"skill {name}: an outcome that is neither success nor failure "
                       f"needs the measured effect")
    entry = {"run": run, "version": version, "domain": domain,
             "success": None if success is None else bool(success),
             "selected": bool(selected)}
    if measured is not None:
      entry["effect"] = measured
    if version is not None:
      for h in s.history:
        if _key(h) == _key(entry):
          if h.get("success") != entry["success"]:
            raise SkillError(f"skill {name}: {version} in {domain} is recorded as "
                             f"{_word(h.get('success'))}, not {_word(entry['success'])}"
                             + (f" (run {run})" if run else ""))
          return s
    return self._write(dataclasses.replace(
        s, domains=_counted(s.domains, [entry]),
        history=s.history + ((entry,) if version is not None else ())))

  def merge(self, source: str | os.PathLike) -> list:
    """Adds what the library at `source` (another run's skills directory) knows: the
    skills it lacks, and for a skill both hold the outcomes of its history this one
    lacks (by run, version and domain), counted. So several runs' libraries pool into
    one, and a change's `effect` is measured over all of them. Returns the names added
    or changed; a skill of the same name with another trigger or intervention is an
    error."""
    changed = []
    for other in SkillLibrary(source):
      if other.name not in self._skills:
        self.add(other)
        changed.append(other.name)
        continue
      mine = self._skills[other.name]
      if (mine.trigger, mine.intervention) != (other.trigger, other.intervention):
        raise SkillError(f"skill {other.name}: {source} holds another trigger or "
                         f"intervention than {self.directory}")
      have = {_key(h) for h in mine.history}
      new = [h for h in other.history if _key(h) not in have]
      if new:
        self._write(dataclasses.replace(mine, domains=_counted(mine.domains, new),
                                        history=mine.history + tuple(new)))
        changed.append(other.name)
    return changed

  def _write(self, skill: Skill) -> Skill:
    atomic.write_text(self.directory / f"{skill.name}.json", _text(skill))
    self._skills[skill.name] = skill
    return skill


def _finite(effect: Optional[Mapping]) -> Optional[dict]:
  """{diff, lo, hi} as floats (and its `against`, if given), or None when absent or not
  all finite."""
  if not effect:
    return None
  out = {k: float(effect[k]) for k in ("diff", "lo", "hi")}
  if not all(math.isfinite(v) for v in out.values()):
    return None
  if "against" not in effect:
    return out
  if effect["against"] not in AGAINST:
    raise SkillError(f"an effect's 'against' is {effect['against']!r}; expected one of "
                     f"{AGAINST}")
  return {**out, "against": effect["against"]}


def _word(success: Optional[bool]) -> str:
  return {True: "success", False: "failure", None: "a measurement"}[success]


def _counted(domains: Mapping, entries: Iterable[Mapping]) -> dict:
  """`domains` plus the successes and failures of `entries`."""
  out = {d: dict(c) for d, c in domains.items()}
  for h in entries:
    if h.get("success") is not None:
      c = out.setdefault(h["domain"], {"successes": 0, "failures": 0})
      c["successes" if h["success"] else "failures"] += 1
  return out


__all__ = ["AGAINST", "CATEGORIES", "SEED_DIR", "Skill", "SkillError", "SkillLibrary",
           "TEMPLATE_KINDS", "against_of", "check_condition", "check_template", "evaluate",
           "load_skill", "state_of", "template_of"]
