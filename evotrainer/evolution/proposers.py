"""Proposers: from the incumbent's findings to ranked single-factor hypotheses.

docs/method.md steps 3-4: each proposal is one falsifiable statement, "change X, expect Y
because Z", carried by exactly one `Intervention` inside the search space.

  skills   (default) the incumbent's findings ranked by severity; interventions from the
           matching skills first (best evidence first), then the per-finding `CATALOG`,
           then exploration (`SearchSpace.neighbours`, undos of kept changes last)
  recipe   the recipe-search baseline: hyper-parameter knobs only (`RECIPE_GROUPS`),
           findings ignored; random single-factor neighbours
  random   random single-factor neighbours over the whole space
  proxy    an agent that chases the proxy reward: every single-factor neighbour; the
           controller ranks the harness-side ones by the mean reward gain a backtest
           replay predicts on the incumbent's stored rollouts (the rest come after). It
           finds a gameable reward part the way a reward-chasing agent would, so the
           validators meet it (gin/math_hackable.gin)

A proposer returns more hypotheses than branches: the controller drops those that fail
their backtest and takes the first K that remain.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping, Optional, Sequence

from evotrainer.evolution.intervention import normalize, same_value
from evotrainer.evolution.search_space import Intervention, SearchSpace, SearchSpaceError
from evotrainer.evolution.skills import SkillError, SkillLibrary

PROPOSERS = ("skills", "recipe", "random", "proxy")
_ALL = 10_000  # "every neighbour" for the proxy proposer
RECIPE_GROUPS = ("hyper",)  # knob groups the recipe-search baseline may turn
SUBTRACTIONS = ("remove",)  # intervention kinds that take something away

TURN_ON = "turn_on"  # a catalog entry's kinds: only a 'set' to a non-empty value

# Per-finding catalog: which bindings address a bottleneck, as (substring of the knob's
# binding, or of its name when it holds a bracket: "RewardComposer.parts['format']" is
# that one entry; allowed intervention kinds, TURN_ON, or None for any; what we expect
# and why). Used when no skill matches; the substrings keep it independent of a
# particular gin file.
CATALOG: dict = {
    "dead_group_ratio": [
        ("RewardComposer.parts", ("add",), "DGR falls: a continuous part separates rows "
         "of groups whose binary rewards are all equal"),
        ("group_filters", ("add",), "advantage health rises: dead groups stop diluting "
         "the update"),
        ("group_size", None, "fewer dead groups: larger groups are less often uniform"),
        ("Harness.curriculum", None, "DGR falls: the step draws the prompts whose groups "
         "were live (LiveGroupCurriculum), with no extra rollouts")],
    "reward_spread": [
        ("RewardComposer.parts", ("add",), "in-group reward spread rises with a "
         "continuous part")],
    "advantage_health": [
        ("group_filters", ("add",), "rows with a non-zero advantage dominate the batch")],
    "entropy": [
        ("clip_high", None, "entropy recovers: clip-higher lets low-probability tokens "
         "grow (DAPO)"),
        ("entropy", None, "entropy recovers under an explicit bonus"),
        ("temperature", None, "sampling explores more")],
    "kl": [("learning_rate", None, "KL drift shrinks with smaller steps"),
           ("kl", None, "the KL penalty holds the policy near its reference")],
    "clip_fraction": [("learning_rate", None, "fewer clipped tokens with smaller steps")],
    "grad_norm": [("learning_rate", None, "no gradient spikes with smaller steps"),
                  ("grad_norm", None, "clipping bounds the spikes")],
    "truncation": [("max_new_tokens", None, "fewer truncated completions"),
                   ("trajectory_filters", ("add",), "truncated rows stop training")],
    "length_reward_corr": [("RewardComposer.parts", ("remove", "add"), "length stops "
                            "paying: the part that rewards it goes or a length penalty "
                            "comes")],
    "format_failure": [("RewardComposer.parts", ("add",), "fewer unparseable answers "
                        "under a format reward")],
    # The code domain's checks of what a chat model writes (tasks/code/diagnostics.py).
    # Each names the part that addresses the finding, not any reward part.
    "prose_rate": [("RewardComposer.parts['format']", ("add",), "fewer prose answers once "
                    "a part pays for a code block (format)")],
    "broken_fence": [("RewardComposer.parts['format']", ("add",), "more closed fences "
                      "once the format part (a complete block) pays"),
                     ("max_new_tokens", None, "fewer fences cut open at the token limit")],
    "syntax_error_rate": [("RewardComposer.parts['compiles']", ("add",), "fewer syntax "
                           "errors once compiling pays (compiles)"),
                          ("temperature", None, "fewer syntax errors at another sampling "
                           "temperature")],
    "wrong_name_rate": [("RewardComposer.parts['defines']", ("add",), "fewer programs "
                         "stray from the asked name once defining it pays (defines)"),
                        ("temperature", None, "fewer programs stray from the asked name "
                         "at another sampling temperature")],
    "runaway_length": [("stop_rule", TURN_ON, "fewer completions run past their code block "
                        "once a rollout ends at the fence that closes it"),
                       ("max_new_tokens", None, "fewer completions cut at the limit"),
                       ("trajectory_filters", ("add",), "truncated rows stop training")],
    # The math domain's check of the sums a chat model writes (tasks/math/diagnostics.py).
    "arithmetic_slip": [("MathTask.calculator", TURN_ON, "fewer wrong values after '=' "
                         "once the calculator tool writes them")],
    # The SWE domain's checks of tool use (tasks/swe/diagnostics.py).
    "first_edit_turn": [("RewardComposer.parts['partial']", ("add",), "more episodes "
                         "change the code once a change that passes some of the failing "
                         "tests pays (partial)"),
                        ("RewardComposer.parts['tool_validity']", ("add",), "more episodes "
                         "reach an edit that applies once calls that run pay "
                         "(tool_validity)"),
                        ("temperature", None, "more episodes reach an edit that applies "
                         "at another sampling temperature")],
    "echo_trap_rate": [("temperature", None, "fewer episodes repeat one call at another "
                        "sampling temperature"),
                       ("RewardComposer.parts['tool_validity']", ("add",), "fewer repeated "
                        "failing calls once calls that run pay (tool_validity)")],
    "tool_mix": [("RewardComposer.parts['tested_before_submit']", ("add",), "calls spread "
                  "over more tools once running the tests before submitting pays"),
                 ("temperature", None, "calls spread over more tools at another sampling "
                  "temperature")],
    "tool_streak": [("temperature", None, "shorter same-tool loops at another sampling "
                     "temperature")],
    "proxy_true_disagreement": [("RewardComposer.parts", ("remove",), "the proxy and BC "
                                 "agree again once the gameable part is gone")],
    "bc": [("learning_rate", None, "BC moves with a different step size"),
           ("group_size", None, "more rows per prompt find a correct answer")],
    "score_trend": [("learning_rate", None, "the flat score moves with another step size")],
}


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One proposal: `intervention` with the statement that makes it falsifiable."""

  intervention: Intervention
  statement: str  # "change X, expect Y because Z"
  criterion: str  # the success criterion the verification checks
  source: str  # 'skill' | 'catalog' | 'exploration' | 'recipe' | 'random'
  group: str = ""  # the knob's group: the layer the change acts on
  skill: Optional[str] = None
  finding: Optional[str] = None  # the finding kind it addresses
  also: tuple = ()  # further finding kinds the same change answers (the catalog's)

  @property
  def is_subtraction(self) -> bool:
    return self.intervention.kind in SUBTRACTIONS

  def to_dict(self) -> dict:
    return {"intervention": self.intervention.to_dict(), "statement": self.statement,
            "criterion": self.criterion, "source": self.source, "group": self.group,
            "skill": self.skill, "finding": self.finding, "also": list(self.also)}

  @classmethod
  def from_dict(cls, d: Mapping) -> "Hypothesis":
    return cls(intervention=Intervention.from_dict(d["intervention"]),
               statement=d["statement"], criterion=d["criterion"], source=d["source"],
               group=d.get("group", ""), skill=d.get("skill"), finding=d.get("finding"),
               also=tuple(d.get("also", ())))


DEFAULT_CRITERION = ("held-out Avg@8 above the incumbent beyond noise (paired bootstrap "
                     "lower bound > 0) and every active validator passes")


def _sev(f: Any) -> float:
  v = f.get("severity") if isinstance(f, Mapping) else getattr(f, "severity", 0.0)
  return float(v or 0.0)


def _kind(f: Any) -> str:
  return f.get("kind") if isinstance(f, Mapping) else getattr(f, "kind", "")


def _group(space: SearchSpace, iv: Intervention) -> str:
  return space.knob_for(iv).group


def _wanted(iv: Intervention, kinds: Any) -> bool:
  """Whether a catalog entry's `kinds` (a tuple, TURN_ON or None) admit `iv`: TURN_ON
  admits switching a mechanism on, never off (the finding it answers persists when the
  mechanism is on, and switching it off does not address it)."""
  if kinds == TURN_ON:
    return iv.kind == "set" and iv.new is not False and iv.new not in ("", None, [], {})
  return kinds is None or iv.kind in kinds


def undoes(iv: Intervention, previous: Optional[Mapping]) -> bool:
  """Whether `iv` puts its binding back to the value it held before its last change on
  the lineage (`previous`: {binding: that value}): a kept change undone, the comparison
  its own branch already made, in reverse."""
  return bool(previous) and iv.binding in previous and same_value(
      iv.new, normalize(previous[iv.binding]))


def _exploration(space: SearchSpace, values: Mapping, rng: random.Random, k: int,
                 source: str, why: str, previous: Optional[Mapping] = None) -> list:
  """Random single-factor neighbours of `values`: `k` of them, plus one per binding in
  `previous`, with every undo of a kept change (`undoes`) last. An undo re-runs its
  branch's comparison in reverse, so it is trained only when nothing else is left. The
  first `k` draws are those without `previous`, reordered."""
  ivs = space.neighbours(values, rng, k + len(previous or ()))
  ivs.sort(key=lambda iv: undoes(iv, previous))
  return [Hypothesis(iv, f"change {iv.description}, expect held-out Avg@8 to rise, because "
                         f"{why}", DEFAULT_CRITERION, source, _group(space, iv))
          for iv in ivs]


def skill_hypotheses(findings: Sequence, values: Mapping, space: SearchSpace,
                     skills: Optional[SkillLibrary], previous: Optional[Mapping] = None
                     ) -> list:
  """Matching skills' interventions (best evidence first), then the catalog's entries for
  each finding (most severe first). A finding of severity 0 reports and diagnoses
  nothing (`ScoreTrend`'s "improving"): the catalog proposes nothing for it."""
  out = []
  for s in (skills.matching(findings, values) if skills is not None else []):
    try:
      iv = s.instantiate(values, previous, space)
    except (SkillError, SearchSpaceError):
      continue  # the skill's binding is outside this space, or it has nothing to revert
    if iv is None:
      continue
    _, matched = s.triggered(findings, values)
    kind = _kind(matched[0]) if matched else None
    out.append(Hypothesis(iv, f"change {iv.description}, expect {s.expected_outcome} "
                              f"because skill {s.name}: {s.description}",
                          s.validation_criterion, "skill", _group(space, iv), s.name, kind))
  return out + _catalog_hypotheses(findings, values, space)


def _catalog_hypotheses(findings: Sequence, values: Mapping, space: SearchSpace) -> list:
  """The catalog's entries for each finding (most severe first). A change that answers
  several findings is proposed once, at the most severe one's rank, and cites them all."""
  out, at = [], {}
  for f in sorted((f for f in findings if _sev(f) > 0), key=lambda f: (-_sev(f), _kind(f))):
    kind = _kind(f)
    message = f.get("message") if isinstance(f, Mapping) else getattr(f, "message", "")
    for knob, iv, expect in _catalog_changes(kind, values, space):
      j = at.get(iv.id)
      if j is None:
        at[iv.id] = len(out)
        out.append(Hypothesis(iv, f"change {iv.description}, expect {expect}, because "
                                  f"{kind}: {message}", DEFAULT_CRITERION, "catalog",
                              knob.group, None, kind))
      elif kind != out[j].finding and kind not in out[j].also:
        out[j] = dataclasses.replace(
            out[j], statement=f"{out[j].statement}; and {kind}: {message} (expect "
                              f"{expect})", also=(*out[j].also, kind))
  return out


def _catalog_changes(kind: str, values: Mapping, space: SearchSpace):
  """(knob, intervention, expected effect) of every change of `space` that the catalog's
  entries for finding `kind` name, in catalog order."""
  for sub, kinds, expect in CATALOG.get(kind, ()):
    for knob in space.knobs:
      if sub.lower() not in (knob.name if "[" in sub else knob.binding).lower():
        continue
      try:
        cands = knob.candidates(values)
      except SearchSpaceError:
        continue
      for iv in cands:
        if _wanted(iv, kinds):
          yield knob, iv, expect


def propose(proposer: str, *, findings: Sequence, values: Mapping, space: SearchSpace,
            skills: Optional[SkillLibrary], rng: random.Random, k: int,
            exclude: Sequence[str] = (), previous: Optional[Mapping] = None,
            prefer_subtraction: bool = False, avoid_groups: Sequence[str] = ()) -> list:
  """Ranked, de-duplicated hypotheses (more than `k` when the space allows).

  Args:
    proposer: one of PROPOSERS.
    findings: the incumbent's findings (ignored by 'recipe' and 'random').
    values: the incumbent's {binding: value} over the space.
    space: the search space (every proposal is validated by it).
    skills: the skill library ('skills' only).
    rng: the generation's random source (exploration order).
    k: branches wanted; about 4k proposals are returned.
    exclude: intervention ids already tried from this parent.
    previous: {binding: value before its last change}, for skills that revert;
      exploration draws such an undo last (`undoes`).
    prefer_subtraction: escalation: 'remove' interventions and undos first.
    avoid_groups: escalation: interventions on knobs of these groups last (switch layer).
  """
  if proposer not in PROPOSERS:
    raise ValueError(f"proposer={proposer!r}; expected one of {PROPOSERS}")
  if proposer == "skills":
    hyps = skill_hypotheses(findings, values, space, skills, previous)
    hyps += _exploration(space, values, rng, 4 * k, "exploration",
                         "no skill or catalog entry covers the remaining budget", previous)
  elif proposer == "recipe":
    sub = space.restrict(groups=RECIPE_GROUPS)
    if not len(sub):
      raise ValueError(f"proposer='recipe': the search space has no knob in groups "
                       f"{RECIPE_GROUPS} (knob groups: {sorted({k.group for k in space.knobs})})")
    hyps = _exploration(sub, values, rng, 4 * k, "recipe", "recipe search tries it",
                        previous)
  elif proposer == "proxy":
    hyps = _exploration(space, values, rng, _ALL, "proxy",
                        "it raises the proxy reward on the incumbent's rollouts the most")
  else:
    hyps = _exploration(space, values, rng, 4 * k, "random", "random search tries it",
                        previous)
  seen, out = set(exclude), []
  for h in hyps:
    if h.intervention.id not in seen:
      seen.add(h.intervention.id)
      out.append(h)
  avoid = set(avoid_groups)
  # Stable sorts: escalation reorders without losing the evidence ranking inside a class.
  if prefer_subtraction:  # a lineage in trouble: removing or reverting comes first
    out.sort(key=lambda h: not (h.is_subtraction or undoes(h.intervention, previous)))
  if avoid:
    out.sort(key=lambda h: h.group in avoid)
  return out


__all__ = ["CATALOG", "DEFAULT_CRITERION", "Hypothesis", "PROPOSERS", "RECIPE_GROUPS",
           "TURN_ON", "propose", "skill_hypotheses"]
