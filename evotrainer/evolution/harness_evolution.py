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

import math
import re
from typing import Any, Callable, Mapping, Optional, Sequence

from evotrainer.evolution.ledger import GOOD, ROOT

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


class HarnessEvolution:
  """The Controller's harness steps (a mixin): `_ensure_harness` at start, and
  `_evolve_harness` after each generation. Uses the host's `ledger`, `_given`,
  `_diagnostics`, `_validators`, `gap_generations`, `separation`, `explain_tol`, and its
  `result`, `evidence` and `_episodes` methods."""

  def _ensure_harness(self) -> None:
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
      self._diagnostics, self._validators = list(given_d), list(given_v)
      return
    rec = self.ledger.harness_version(hid)  # rebuild: given instances, else library defaults
    by_d, by_v = {d.name: d for d in given_d}, {v.name: v for v in given_v}
    self._diagnostics = [by_d.get(n) or DIAGNOSTICS[n]() for n in rec.diagnostics]
    self._validators = [by_v.get(n) or VALIDATORS[n]() for n in rec.validators]

  def _gaps(self, gen: int, plan: Mapping) -> list:
    gaps = []
    quiet = 0
    for g in range(gen, 0, -1):
      if (self.ledger.get_meta(f"controller/evaluated/{g}") or {}).get("promoted"):
        break
      quiet += 1
    last = self.ledger.get_meta("controller/harness_changed_gen", 0)
    if quiet >= self.gap_generations and gen - last >= self.gap_generations:
      gaps.append(f"score insufficient: {quiet} generations without a kept version")
    for b in plan["branches"]:
      v = self.ledger.version(b["version"])
      h = v.heldout if v is not None else {}
      if "lo" in h and (h["lo"] > 0 or h["hi"] < 0):  # a change beyond noise
        moved = self._moved(self._diagnostics, v.id, plan["parent"])
        if moved is not None and not moved:
          gaps.append(f"score change unexplained on {v.id}: held-out {h['diff']:+.4f} "
                      f"beyond noise, and no active metric moved by more than "
                      f"{self.explain_tol:.0%} from {plan['parent']}")
          break
    from evotrainer.harness.validators import ProxyTrueDisagreement
    probe = ProxyTrueDisagreement()
    inc = self.ledger.incumbent()
    ids = [b["version"] for b in plan["branches"]] + ([inc.id] if inc else [])
    for vid in ids:
      if self.result(vid) is not None:
        v = probe(self.evidence(vid))
        if not v.passed:
          gaps.append(f"signal ambiguous on {vid}: {v.reason}")
          break
    return gaps

  def _train_metrics(self, diags: Sequence, vid: str) -> dict:
    """The diagnostics' metrics over version `vid`'s stored training episodes ({}: none)."""
    from evotrainer.harness.diagnostics import run_diagnostics
    r = self.result(vid)
    eps = self._episodes(vid, r, "train")
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
    return sorted(k for k in a.keys() & b.keys()
                  if abs(a[k] - b[k]) > self.explain_tol * max(abs(a[k]), abs(b[k]), 1e-9))

  def _separates(self, diag, kept: list, rejected: list) -> Optional[float]:
    """Standardized |mean(kept) - mean(rejected)| of a diagnostic's metric (None: no data)."""
    from evotrainer.harness.diagnostics import run_diagnostics
    vals = {}
    for vid in kept + rejected:
      r = self.result(vid)
      eps = self._episodes(vid, r, "train")
      if not eps:
        continue
      metrics, _ = run_diagnostics([diag], eps, {"heldout": r.final, "series": r.series})
      if diag.name in metrics and not math.isnan(metrics[diag.name]):
        vals[vid] = metrics[diag.name]
    a = [vals[v] for v in kept if v in vals]
    b = [vals[v] for v in rejected if v in vals]
    if not a or not b:
      return None
    allv = a + b
    mean = sum(allv) / len(allv)
    sd = math.sqrt(sum((x - mean) ** 2 for x in allv) / len(allv)) or 1e-12
    return abs(sum(a) / len(a) - sum(b) / len(b)) / sd

  def _evolve_harness(self, gen: int, plan: Mapping) -> None:
    from evotrainer.harness.diagnostics import DIAGNOSTICS
    from evotrainer.harness.validators import VALIDATORS, run_validators
    gaps = self._gaps(gen, plan)
    added_d, added_v, notes = [], [], []
    if gaps:
      active_d = {d.name for d in self._diagnostics}
      active_v = {v.name for v in self._validators}
      decided = [v for v in self.ledger.versions() if v.id != ROOT]
      kept = [v.id for v in decided if v.status in GOOD]
      rejected = [v.id for v in decided if v.status == "rejected"]
      for name, cls in DIAGNOSTICS.items():
        if name in active_d or name == "domain":
          continue
        sep = self._separates(cls(), kept, rejected)
        if sep is not None and sep > self.separation:
          added_d.append(cls())
          notes.append(f"diagnostic {name} separates kept from rejected (d={sep:.2f})")
      for g in gaps:  # diagnostics that explain a score change the active ones miss
        m = re.match(r"score change unexplained on (\S+):", g)
        if not m:
          continue
        for name, cls in DIAGNOSTICS.items():
          if name in active_d or name == "domain" or any(d.name == name for d in added_d):
            continue
          if self._moved([cls()], m.group(1), plan["parent"]):
            added_d.append(cls())
            notes.append(f"diagnostic {name} moved with the unexplained score change of "
                         f"{m.group(1)}")
      if any(g.startswith("signal ambiguous") for g in gaps) and \
          "proxy_true_disagreement" not in active_v:
        added_v.append(VALIDATORS["proxy_true_disagreement"]())
        notes.append("validator proxy_true_disagreement: a proxy rises while BC does not")
    with self.ledger.transaction():
      if added_d or added_v:
        cur = self.ledger.get_meta("controller/harness")
        hid = f"h{len(self.ledger.harness_versions())}"
        self._diagnostics += added_d
        self._validators += added_v
        self.ledger.add_harness_version(
            hid, {d.name: _config(d) for d in self._diagnostics},
            {v.name: _config(v) for v in self._validators}, parent=cur,
            reason="; ".join(gaps + notes))
        self.ledger.set_meta("controller/harness", hid)
        self.ledger.set_meta("controller/harness_changed_gen", gen)
        if added_v:
          self._recheck(hid, added_v, run_validators)
      elif gaps:
        self.ledger.set_meta("controller/harness_changed_gen", gen)  # looked; nothing new
      self.ledger.set_meta(f"controller/harness_done/{gen}", {"gaps": gaps, "notes": notes})
    for g in gaps:
      self.progress.say(f"diagnostic gap: {g}")
    for n in notes:
      self.progress.say(f"harness {self.ledger.get_meta('controller/harness')}: {n}")

  def _recheck(self, hid: str, validators: list, run_validators: Callable) -> None:
    """Re-checks every kept version (the root aside) under new validators; demotes the
    ones that fail and prunes their kept descendants; the incumbent rolls back."""
    demoted = []
    for v in self.ledger.versions():
      if v.id == ROOT or v.status not in GOOD:
        continue
      parent = self.evidence(v.parent) if v.parent else None
      failed = [x for x in run_validators(validators, self.evidence(v.id, parent))
                if not x.passed]
      if failed:
        self.ledger.set_status(v.id, "rejected",
                               f"demoted under harness {hid}: validator "
                               f"{failed[0].validator}: {failed[0].reason}")
        demoted.append(v.id)
    for v in self.ledger.versions():
      if v.status in GOOD and any(a.id in demoted for a in self.ledger.lineage(v.id)[1:]):
        self.ledger.set_status(v.id, "pruned", f"descends from demoted "
                               f"{next(a.id for a in self.ledger.lineage(v.id) if a.id in demoted)}")
    inc = self.ledger.incumbent()
    if inc is None or inc.status not in GOOD:
      back = next((a.id for a in (self.ledger.lineage(inc.id) if inc else [])
                   if a.status in GOOD), ROOT)
      self.ledger.set_incumbent(back)


__all__ = ["DEFAULT_DIAGNOSTICS", "DEFAULT_VALIDATORS", "HarnessEvolution"]
