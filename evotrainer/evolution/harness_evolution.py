"""Harness evolution: the controller's active diagnostics and validators (docs/method.md).

The active harness is a harness version in the ledger (`controller/harness`): h0 holds the
given components (default DEFAULT_DIAGNOSTICS / DEFAULT_VALIDATORS); a relaunch rebuilds
the recorded one. After each generation the controller looks for diagnostic gaps:
  score insufficient   `gap_generations` generations without a kept version
  score unexplained    a held-out change beyond noise that no active metric explains
                       (none moved by more than `explain_tol` from the parent)
  signal ambiguous     a proxy rises while BC does not (ProxyTrueDisagreement)
On a gap it enables library diagnostics that separate kept from rejected versions (or
moved with the unexplained change) and the proxy/true validator, records a new harness
version, and re-checks every kept version under the new validators: a failing one is
demoted, its kept descendants pruned, and the incumbent rolls back.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import gin

from evotrainer.evolution.ledger import GOOD, ROOT
from evotrainer.evolution.progress import Progress
from evotrainer.evolution.results import Results

DEFAULT_DIAGNOSTICS = ("bc", "reward", "score_trend", "dead_group_ratio", "entropy",
                       "truncation", "training_drift")
DEFAULT_VALIDATORS = ("proxy_true_disagreement", "exploit_probe", "strict_verifier_agreement",
                      "training_stability", "canary_prompts")


def _config(obj: Any) -> dict:
  """The scalar public attributes of a component: its recorded configuration."""
  out = {"class": type(obj).__name__}
  for k, v in sorted(vars(obj).items()):
    if not k.startswith("_") and isinstance(v, (bool, int, float, str)) and not (
        isinstance(v, float) and math.isnan(v)):
      out[k] = v
  return out


@gin.configurable(module="evolution")
@dataclasses.dataclass(frozen=True)
class HarnessEvolutionConfig:
  """Knobs of the harness evolution (gin: `HarnessEvolutionConfig.separation = 1.0`, ...).

  Attributes:
    gap_generations: generations without a kept version that count as a diagnostic gap
      (and the least number of generations between two harness changes it triggers).
    separation: a library diagnostic is enabled when |mean(kept) - mean(rejected)| of its
      metric exceeds `separation` standard deviations over those versions.
    explain_tol: a held-out change beyond noise is unexplained (a gap) when no active
      metric moved from the parent by more than this share of its magnitude; library
      diagnostics whose metrics did move are then enabled.
  """
  gap_generations: int = 3
  separation: float = 1.0
  explain_tol: float = 0.1

  def __post_init__(self):
    if self.gap_generations < 1:
      raise ValueError(f"HarnessEvolutionConfig.gap_generations={self.gap_generations}; "
                       f"expected >= 1")
    if self.separation < 0 or self.explain_tol < 0:
      raise ValueError(f"HarnessEvolutionConfig: separation={self.separation}, "
                       f"explain_tol={self.explain_tol}; expected both >= 0")


class HarnessEvolution:
  """The controller's active harness and its evolution: `ensure` at start, `evolve` after
  each generation; `diagnostics` and `validators` are the active components.

  Args:
    config: the harness evolution's knobs.
    ledger: the run's ledger (harness versions, the active one under `controller/harness`).
    results: the versions' stored results (results.py).
    progress: where gaps and harness changes are reported (`say`).
    diagnostics / validators: the given components (None: DEFAULT_DIAGNOSTICS /
      DEFAULT_VALIDATORS from the harness libraries).
  """

  def __init__(self, config: HarnessEvolutionConfig, ledger: Any, results: Results,
               progress: Progress, diagnostics: Optional[Sequence] = None,
               validators: Optional[Sequence] = None):
    self.config, self.ledger, self.results, self.progress = config, ledger, results, progress
    self._given = {"diagnostics": diagnostics, "validators": validators}
    self.diagnostics: list = []
    self.validators: list = []

  def ensure(self) -> None:
    """Records h0 from the given components, or rebuilds the recorded active harness."""
    from evotrainer.harness.diagnostics import DIAGNOSTICS
    from evotrainer.harness.validators import VALIDATORS
    given_d = self._given["diagnostics"]
    given_v = self._given["validators"]
    if given_d is None:
      given_d = [DIAGNOSTICS[n]() for n in DEFAULT_DIAGNOSTICS]
    if given_v is None:
      given_v = [VALIDATORS[n]() for n in DEFAULT_VALIDATORS]
    hid = self.ledger.get_meta("controller/harness")
    if hid is None:
      self.ledger.add_harness_version("h0", {d.name: _config(d) for d in given_d},
                                      {v.name: _config(v) for v in given_v},
                                      reason="initial harness")
      self.ledger.set_meta("controller/harness", "h0")
      self.diagnostics, self.validators = list(given_d), list(given_v)
      return
    rec = self.ledger.harness_version(hid)  # rebuild: given instances, else library defaults
    by_d, by_v = {d.name: d for d in given_d}, {v.name: v for v in given_v}
    self.diagnostics = [by_d.get(n) or DIAGNOSTICS[n]() for n in rec.diagnostics]
    self.validators = [by_v.get(n) or VALIDATORS[n]() for n in rec.validators]

  # ---------------------------------------------------------------- gaps

  def _gaps(self, gen: int, plan: Mapping) -> list:
    """The diagnostic gaps after generation `gen` (score insufficient, score change
    unexplained, signal ambiguous), each as one line."""
    gaps = self._insufficient(gen)
    unexplained = self._unexplained(plan)
    if unexplained:
      gaps.append(unexplained)
    ambiguous = self._ambiguous(plan)
    if ambiguous:
      gaps.append(ambiguous)
    return gaps

  def _insufficient(self, gen: int) -> list:
    quiet = 0
    for g in range(gen, 0, -1):
      if (self.ledger.get_meta(f"controller/evaluated/{g}") or {}).get("promoted"):
        break
      quiet += 1
    last = self.ledger.get_meta("controller/harness_changed_gen", 0)
    n = self.config.gap_generations
    if quiet >= n and gen - last >= n:
      return [f"score insufficient: {quiet} generations without a kept version"]
    return []

  def _unexplained(self, plan: Mapping) -> Optional[str]:
    for b in plan["branches"]:
      v = self.ledger.version(b["version"])
      h = v.heldout if v is not None else {}
      if "lo" in h and (h["lo"] > 0 or h["hi"] < 0):  # a change beyond noise
        moved = self._moved(self.diagnostics, v.id, plan["parent"])
        if moved is not None and not moved:
          return (f"score change unexplained on {v.id}: held-out {h['diff']:+.4f} "
                  f"beyond noise, and no active metric moved by more than "
                  f"{self.config.explain_tol:.0%} from {plan['parent']}")
    return None

  def _ambiguous(self, plan: Mapping) -> Optional[str]:
    from evotrainer.harness.validators import ProxyTrueDisagreement
    probe = ProxyTrueDisagreement()
    inc = self.ledger.incumbent()
    ids = [b["version"] for b in plan["branches"]] + ([inc.id] if inc else [])
    for vid in ids:
      if self.results.result(vid) is not None:
        v = probe(self.results.evidence(vid))
        if not v.passed:
          return f"signal ambiguous on {vid}: {v.reason}"
    return None

  def _train_metrics(self, diags: Sequence, vid: str) -> dict:
    """The diagnostics' metrics over version `vid`'s stored training episodes ({}: none)."""
    from evotrainer.harness.diagnostics import run_diagnostics
    r = self.results.result(vid)
    eps = self.results.episodes(vid, r, "train")
    if not eps:
      return {}
    metrics, _ = run_diagnostics(list(diags), eps, {"heldout": r.final, "series": r.series})
    return {k: v for k, v in metrics.items() if not math.isnan(v)}

  def _moved(self, diags: Sequence, vid: str, parent: str) -> Optional[list]:
    """The metrics of `diags` that moved from `parent` to `vid` by more than
    `explain_tol` (relative to the larger magnitude); None when either has no episodes."""
    a, b = self._train_metrics(diags, vid), self._train_metrics(diags, parent)
    if not a or not b:
      return None
    tol = self.config.explain_tol
    return sorted(k for k in a.keys() & b.keys()
                  if abs(a[k] - b[k]) > tol * max(abs(a[k]), abs(b[k]), 1e-9))

  def _separates(self, diag, kept: list, rejected: list) -> Optional[float]:
    """Standardized |mean(kept) - mean(rejected)| of a diagnostic's metric (None: no data)."""
    vals = {}
    for vid in kept + rejected:
      metrics = self._train_metrics([diag], vid)
      if diag.name in metrics:
        vals[vid] = metrics[diag.name]
    a = [vals[v] for v in kept if v in vals]
    b = [vals[v] for v in rejected if v in vals]
    if not a or not b:
      return None
    allv = a + b
    mean = sum(allv) / len(allv)
    sd = math.sqrt(sum((x - mean) ** 2 for x in allv) / len(allv)) or 1e-12
    return abs(sum(a) / len(a) - sum(b) / len(b)) / sd

  # ---------------------------------------------------------------- evolve

  def evolve(self, gen: int, plan: Mapping) -> None:
    """After generation `gen`: on a diagnostic gap, enables the library components that
    would have seen it, records a new harness version and re-checks kept versions."""
    gaps = self._gaps(gen, plan)
    added_d, added_v, notes = self._additions(gaps, plan) if gaps else ([], [], [])
    with self.ledger.transaction():
      if added_d or added_v:
        self._record(gen, added_d, added_v, gaps + notes)
      elif gaps:
        self.ledger.set_meta("controller/harness_changed_gen", gen)  # looked; nothing new
      self.ledger.set_meta(f"controller/harness_done/{gen}", {"gaps": gaps, "notes": notes})
    for g in gaps:
      self.progress.say(f"diagnostic gap: {g}")
    for n in notes:
      self.progress.say(f"harness {self.ledger.get_meta('controller/harness')}: {n}")

  def _additions(self, gaps: Sequence[str], plan: Mapping) -> tuple[list, list, list]:
    """(diagnostics, validators, notes): the library components the gaps call for."""
    added_d, notes = self._separating()
    for g in gaps:  # diagnostics that explain a score change the active ones miss
      m = re.match(r"score change unexplained on (\S+):", g)
      if m:
        self._explaining(m.group(1), plan["parent"], added_d, notes)
    added_v = []
    if any(g.startswith("signal ambiguous") for g in gaps) and \
        "proxy_true_disagreement" not in {v.name for v in self.validators}:
      from evotrainer.harness.validators import VALIDATORS
      added_v.append(VALIDATORS["proxy_true_disagreement"]())
      notes.append("validator proxy_true_disagreement: a proxy rises while BC does not")
    return added_d, added_v, notes

  def _inactive(self, added: Sequence = ()) -> dict:
    """{name: class} of the library diagnostics neither active nor in `added`."""
    from evotrainer.harness.diagnostics import DIAGNOSTICS
    skip = {d.name for d in self.diagnostics} | {d.name for d in added} | {"domain"}
    return {n: c for n, c in DIAGNOSTICS.items() if n not in skip}

  def _separating(self) -> tuple[list, list]:
    """Library diagnostics that separate kept from rejected versions, with notes."""
    decided = [v for v in self.ledger.versions() if v.id != ROOT]
    kept = [v.id for v in decided if v.status in GOOD]
    rejected = [v.id for v in decided if v.status == "rejected"]
    added, notes = [], []
    for name, cls in self._inactive().items():
      sep = self._separates(cls(), kept, rejected)
      if sep is not None and sep > self.config.separation:
        added.append(cls())
        notes.append(f"diagnostic {name} separates kept from rejected (d={sep:.2f})")
    return added, notes

  def _explaining(self, vid: str, parent: str, added: list, notes: list) -> None:
    """Adds the library diagnostics that moved with `vid`'s unexplained score change."""
    for name, cls in self._inactive(added).items():
      if self._moved([cls()], vid, parent):
        added.append(cls())
        notes.append(f"diagnostic {name} moved with the unexplained score change of {vid}")

  def _record(self, gen: int, added_d: list, added_v: list, reasons: list) -> None:
    """Activates the additions as a new harness version; re-checks under new validators."""
    from evotrainer.harness.validators import run_validators
    cur = self.ledger.get_meta("controller/harness")
    hid = f"h{len(self.ledger.harness_versions())}"
    self.diagnostics += added_d
    self.validators += added_v
    self.ledger.add_harness_version(
        hid, {d.name: _config(d) for d in self.diagnostics},
        {v.name: _config(v) for v in self.validators}, parent=cur,
        reason="; ".join(reasons))
    self.ledger.set_meta("controller/harness", hid)
    self.ledger.set_meta("controller/harness_changed_gen", gen)
    if added_v:
      self.recheck(hid, added_v, run_validators)

  def recheck(self, hid: str, validators: list, run_validators: Callable) -> None:
    """Re-checks every kept version (the root aside) under new validators; demotes the
    ones that fail and prunes their kept descendants; the incumbent rolls back."""
    demoted = []
    for v in self.ledger.versions():
      if v.id == ROOT or v.status not in GOOD:
        continue
      parent = self.results.evidence(v.parent) if v.parent else None
      failed = [x for x in run_validators(validators, self.results.evidence(v.id, parent))
                if not x.passed]
      if failed:
        self.ledger.set_status(v.id, "rejected",
                               f"demoted under harness {hid}: validator "
                               f"{failed[0].validator}: {failed[0].reason}")
        demoted.append(v.id)
    self._prune_descendants(demoted)
    inc = self.ledger.incumbent()
    if inc is None or inc.status not in GOOD:
      back = next((a.id for a in (self.ledger.lineage(inc.id) if inc else [])
                   if a.status in GOOD), ROOT)
      self.ledger.set_incumbent(back)

  def _prune_descendants(self, demoted: Sequence[str]) -> None:
    for v in self.ledger.versions():
      lineage = self.ledger.lineage(v.id)
      if v.status in GOOD and any(a.id in demoted for a in lineage[1:]):
        self.ledger.set_status(v.id, "pruned", f"descends from demoted "
                               f"{next(a.id for a in lineage if a.id in demoted)}")


__all__ = ["DEFAULT_DIAGNOSTICS", "DEFAULT_VALIDATORS", "HarnessEvolution",
           "HarnessEvolutionConfig"]
