"""Sweep mode: variants listed by the user as gin bindings, run as branches and compared.

A sweep file (sweep_file.py: format and checks) names variants, each a set of gin
bindings. Every variant trains as a branch of one parent with common random numbers (the
same seed, the same step budget), is verified like an evolution branch
(`Promotion.judge`: held-out Avg@8 against the parent with the paired bootstrap, every
active validator), and lands in the run's ledger: *kept* when it beats the parent beyond
noise and passes every validator (the best kept one becomes the incumbent), *rejected*
otherwise, with the reason. A sweep's workdir can therefore seed an evolution
(`evolve.resume_from`, `start_from`), and its outcomes count as evidence for every skill
whose intervention template a variant matches.

Resume: the ledger records each variant's version, decision and attempt; a relaunch with
the same workdir trains only the variants without a stored result (a failed one stays
rejected), then verifies them all again (deterministic: same data, same resampling seed).
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import sqlite3
from typing import Any, Callable, Mapping, Optional, Sequence

from evotrainer.evolution.backtest import (HARNESS_GROUPS, HARNESS_PREFIXES,
                                           harness_backtester)
from evotrainer.evolution.controller import Controller
from evotrainer.evolution.ledger import ROOT, Ledger
from evotrainer.evolution.promotion import validator_rejection
from evotrainer.evolution.proposers import DEFAULT_CRITERION
from evotrainer.evolution.search_space import (Intervention, SearchSpace, SearchSpaceError,
                                               _lookup, _parse_binding, current_value,
                                               extra_item, format_value, make_intervention,
                                               same_value)
from evotrainer.evolution.skills import SkillError
from evotrainer.evolution.sweep_file import (SweepError, Variant, check_variants,
                                             load_sweep)

_BOOTSTRAP_SEED = 104_729  # one resampling for every variant (the problems are paired)


# ------------------------------------------------------------------ helpers


def _harness_side(binding: str, space: SearchSpace) -> bool:
  """A binding of the harness (reward parts, filters, estimator): a backtest replays it."""
  if binding.startswith(HARNESS_PREFIXES):
    return True
  if any(k.binding == binding and k.group in HARNESS_GROUPS for k in space.knobs):
    return True
  try:
    match = _lookup(_parse_binding(binding).complete_selector)
  except ValueError:
    return False
  return bool(match) and getattr(match.wrapped, "__module__", "").startswith(
      "evotrainer.harness")


def gin_harness_builder() -> Callable[[Mapping], Any]:
  """A `harness_builder` for `harness_backtester`: the Harness gin builds with
  {binding: value} bound in a scope of its own (the run's bindings apply underneath)."""
  counter = itertools.count()

  def build(values: Mapping) -> Any:
    import gin
    from evotrainer.harness.pipeline import Harness
    scope = f"sweep_backtest_{next(counter)}"
    with gin.unlock_config():
      gin.parse_config([f"{scope}/{b} = {format_value(v)}" for b, v in values.items()])
    with gin.config_scope(scope):
      return Harness()

  return build


def _same_change(skill_iv: Intervention, template_kind: str, mine: Intervention) -> bool:
  """Whether a variant's change of a binding is the one a skill's template makes."""
  if skill_iv.kind in ("add", "remove"):
    if mine.kind != skill_iv.kind:
      return False
    if isinstance(skill_iv.new, dict):
      return mine.key == skill_iv.key
    longer = (lambda iv: (iv.new, iv.old or []) if iv.kind == "add" else (iv.old or [], iv.new))
    return same_value(extra_item(*longer(mine)), extra_item(*longer(skill_iv)))
  if template_kind == "scale":  # the same direction of change
    pick = (lambda iv, x: x.get(iv.key) if isinstance(x, dict) else x)
    old, a, b = pick(skill_iv, skill_iv.old), pick(skill_iv, skill_iv.new), pick(skill_iv,
                                                                               mine.new)
    nums = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (old, a, b))
    return nums and (a - old) * (b - old) > 0
  return same_value(skill_iv.new, mine.new)


def _cell_backtest(bt: Optional[Mapping]) -> str:
  if not bt:
    return ""
  figures = ", ".join(f"{k} {bt[k]}" for k in ("rescued", "newly_dead", "violations",
                                                "correct_newly_cut") if k in bt)
  return ("pass" if bt.get("passed", True) else "FAIL") + (f" ({figures})" if figures else "")


def _cell_validators(verdicts: Mapping) -> str:
  return ", ".join(f"{k} {'pass' if v == 'pass' else 'FAIL'}" for k, v in verdicts.items())


def format_table(rows: Sequence[Mapping], width: int = 60) -> str:
  """The ranked sweep table (`Sweep.run` rows) as text for the terminal."""
  head = ["#", "variant", "status", "held-out avg8", "diff [CI]", "proxy", "validators",
          "backtest", "bindings"]
  num = (lambda x, f="{:.4f}": "" if x is None or (isinstance(x, float) and math.isnan(x))
         else f.format(x))
  out = []
  for r in rows:
    held = num(r["heldout_avg8"]) + (f"±{num(r['noise'])}" if num(r["noise"]) else "")
    ci = (f"{num(r['diff'], '{:+.4f}')} [{num(r['lo'], '{:+.4f}')}, "
          f"{num(r['hi'], '{:+.4f}')}]" if num(r["diff"]) else "")
    binds = "; ".join(r["bindings"]) or "(control)"
    out.append([str(r["rank"]), r["variant"], r["status"], held, ci, num(r["proxy_reward"]),
                _cell_validators(r["validators"]), _cell_backtest(r["backtest"]),
                binds if len(binds) <= width else binds[:width - 3] + "..."])
  widths = [max(len(x[i]) for x in out + [head]) for i in range(len(head))]
  fmt = lambda x: "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip()
  return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(x) for x in out])


def start_from(source: str | os.PathLike, workdir: str | os.PathLike) -> bool:
  """Starts the run in `workdir` from the ledger of the run in `source` (a sweep's or an
  evolution's workdir): a consistent copy of its ledger.sqlite (checkpoints and rollouts
  stay where the source's ledger points). A workdir that has a ledger already is left
  as it is (a relaunch continues it); returns whether a copy was made."""
  dst = pathlib.Path(workdir) / "ledger.sqlite"
  if dst.is_file() and dst.stat().st_size > 0:
    return False
  src = pathlib.Path(source) / "ledger.sqlite"
  if not src.is_file():
    raise FileNotFoundError(f"resume_from={source}: no ledger.sqlite there (the workdir of "
                            f"a sweep or evolution run)")
  Ledger(src).close()  # refuses another schema version or a non-ledger, untouched
  dst.parent.mkdir(parents=True, exist_ok=True)
  tmp = dst.with_name(".ledger.sqlite.copy")
  tmp.unlink(missing_ok=True)
  with sqlite3.connect(src) as s, sqlite3.connect(tmp) as d:
    s.backup(d)  # the committed state, WAL included
  s.close()
  d.close()
  os.replace(tmp, dst)
  with Ledger(dst) as ledger:
    ledger.anchor_paths(source)  # the source's checkpoints stay in the source
    ledger.set_meta("resumed_from", os.path.abspath(source))
  return True


# ------------------------------------------------------------------ the sweep


class Sweep:
  """Runs `variants` as branches of one parent over a Controller's ledger.

  Args:
    controller: the run's Controller: its ledger, trainer, space, skills, validators,
      seed, bootstrap and workdir are the sweep's.
    variants: the sweep's variants (`load_sweep`).
    parent: None: the parent recorded by an earlier launch of a sweep in this ledger,
      else its incumbent, else the root trained from the warm start; a version id of
      the ledger; or a model directory (recorded as the root, evaluated as is).
    backtest: replay each harness-side variant on the parent's stored rollouts first:
      True (the controller's backtester, else `harness_backtester(gin_harness_builder())`)
      or a backtester `(store_root, version, before, after, iv) -> dict | None`. The
      result is reported beside the variant's; it does not decide anything.
    steps: the branches' RL step budget (recorded with the sweep; the trainer applies it).
  """

  def __init__(self, controller: Controller, variants: Sequence[Variant], *,
               parent: Optional[str] = None, backtest: Any = False,
               steps: Optional[int] = None):
    self.c, self.ledger = controller, controller.ledger
    self.variants, self.parent, self.steps = list(variants), parent, steps
    if backtest is True:
      backtest = controller.backtester or harness_backtester(gin_harness_builder())
    self.backtester = backtest or None

  # ---------------------------------------------------------------- set-up

  def _parent(self) -> tuple[Optional[str], Optional[str]]:
    """(version id or None for a root still to train, model directory or None)."""
    stored = self.ledger.get_meta("sweep/parent")
    given = self.parent
    if stored is not None:
      if given is not None and given not in (stored["version"], stored["checkpoint"]):
        raise SweepError(f"this workdir's sweep runs from "
                         f"{stored['checkpoint'] or stored['version']}, not {given}; use a "
                         f"new workdir for another parent")
      return stored["version"], stored["checkpoint"]
    if given is None:
      inc = self.ledger.incumbent()
      return (inc.id if inc else None), None
    if self.ledger.has_version(given):
      return given, None
    if os.path.isdir(given):
      if self.ledger.has_version(ROOT):
        raise SweepError(f"parent {given}: a model directory becomes the root, but this "
                         f"workdir's ledger has a root already; use a new workdir")
      return None, given
    raise SweepError(f"parent {given!r} is neither a version of {self.ledger.path} nor a "
                     f"model directory")

  def _values(self, parent: Optional[str], variant: Optional[Variant] = None) -> dict:
    """The parent's {binding: value}, with gin's current value of each binding of
    `variant` that the parent's lineage does not set."""
    c = self.c
    if parent is not None and self.ledger.has_version(parent):
      values = c.results.values(parent)
    else:
      values = c.root_values()
    for b in (variant.bindings if variant else ()):
      if b not in values:
        try:
          values[b] = current_value(b)
        except SearchSpaceError:
          pass  # no value known: skills and backtests see none
    return values

  def _recorded(self) -> dict:
    out = {}
    for v in self.variants:
      if self.ledger.has_version(v.version):
        out[v.name] = self.ledger.version(v.version).bindings
    return out

  # ---------------------------------------------------------------- run

  def run(self) -> list:
    """Checks, trains the variants not yet finished, verifies all; returns the ranked
    table rows (also in summary.json 'sweep', the ledger meta 'sweep/table', report.html)."""
    c = self.c
    parent, checkpoint = self._parent()
    check_variants(self.variants, c.space, self._values(parent), self._recorded())
    c.harness.ensure()
    if parent is None:
      if checkpoint:
        c.ensure_root(checkpoint, ["train.steps = 0"],
                       reason=f"root version: the model in {checkpoint}, evaluated as is")
      else:
        c.ensure_root()
      parent = ROOT
    if self.ledger.get_meta("sweep/parent") is None:
      self.ledger.set_meta("sweep/parent", {"version": parent, "checkpoint": checkpoint,
                                            "seed": c.train_seed(1), "steps": self.steps})
    if c.results.result(parent) is None:
      raise SweepError(f"parent {parent} has no training result in {self.ledger.path}")
    cfg = self.ledger.get_meta("sweep/parent")
    if self.steps is not None and cfg["steps"] not in (None, self.steps):
      raise SweepError(f"this workdir's sweep trains {cfg['steps']} steps per variant, not "
                       f"{self.steps}: every variant gets the same budget; use a new workdir")
    for v in self.variants:
      self._train(v, parent, cfg["seed"])
    rows = self._verify(parent)
    c.write_summary({"mode": "sweep", "parent": parent, "seed": cfg["seed"],
                     "steps": cfg["steps"], "sweep": rows})
    return rows

  def _train(self, v: Variant, parent: str, seed: int) -> None:
    c, vid, did, aid = self.c, v.version, f"sweep-{v.name}", f"{v.version}/train"
    before = self._values(parent, v)
    after = {**before, **v.bindings}
    if self.ledger.has_version(vid):
      known = self.ledger.decisions(version=vid)
      bt = known[0].backtest if known else None
    else:
      bt = self._backtest(v, parent, before, after)
    iv = self._intervention(v, before)
    skills = self._skills_of(v, before)
    with self.ledger.transaction():
      self.ledger.add_version(vid, parent, bindings=v.bindings,
                              harness_version=self.ledger.get_meta("controller/harness"))
      self.ledger.add_decision(
          did, parent, hypothesis=f"sweep variant {v.name}: {iv['description']}; expect "
                                  f"held-out Avg@8 above {parent} beyond noise",
          intervention=iv, criterion=DEFAULT_CRITERION, version_id=vid, backtest=bt,
          skill=skills[0] if skills else None)
      self.ledger.add_attempt(aid, vid, parent, iv.get("id"))
      for s in skills:
        self.ledger.add_skill_use(vid, s, did, c.config.domain)
    c.train_version(vid, parent, did, aid, seed,
                    lambda: {**c.results.values(parent), **v.bindings})

  def _intervention(self, v: Variant, before: Mapping) -> dict:
    """The decision's intervention: the variant's bindings; a single binding also as an
    Intervention (so that a later evolution does not propose it again)."""
    d = {"variant": v.name, "bindings": v.bindings, "gin": v.gin(),
         "description": "; ".join(v.gin()) or "control (the parent's configuration)"}
    if len(v.bindings) == 1:
      (b, new), = v.bindings.items()
      try:
        d = {**make_intervention(b, before.get(b), new).to_dict(), **d}
      except SearchSpaceError:
        pass
    return d

  def _backtest(self, v: Variant, parent: str, before: Mapping,
                after: Mapping) -> Optional[dict]:
    if self.backtester is None or not any(_harness_side(b, self.c.space)
                                          for b in v.bindings):
      return None
    iv = None
    if len(v.bindings) == 1:
      (b, new), = v.bindings.items()
      iv = make_intervention(b, before.get(b), new)
    try:
      return self.backtester(self.c.results.result(parent).rollouts, parent, dict(before),
                             dict(after), iv)
    except Exception as e:  # pylint: disable=broad-except  (reported, not decisive)
      return {"passed": False, "why": f"backtest raised {type(e).__name__}: {e}"}

  def _skills_of(self, v: Variant, before: Mapping) -> list:
    """Skills whose intervention template makes a change this variant makes."""
    if self.c.skills is None:
      return []
    out = []
    for s in self.c.skills:
      try:
        siv = s.instantiate(before)
      except (SkillError, SearchSpaceError):
        continue
      if siv is None or siv.binding not in v.bindings:
        continue
      mine = make_intervention(siv.binding, before.get(siv.binding), v.bindings[siv.binding])
      if _same_change(siv, s.intervention["kind"], mine):
        out.append(s.name)
    return out

  # ---------------------------------------------------------------- verify

  def _verify(self, parent: str) -> list:
    c = self.c
    pev = c.results.evidence(parent)
    rows = []
    for i, v in enumerate(self.variants):
      r = c.results.result(v.version)
      x = {"variant": v, "order": i, "failed": [], "verdicts": [], "avg8": None,
           "proxy": None, "diff": None, "lo": None, "hi": None}
      if r is not None:
        x.update(c.promotion.judge(v.version, r, parent,
                                    c.config.seed * 7919 + _BOOTSTRAP_SEED, pev))
      rows.append(x)
    judged = [x for x in rows if x["avg8"] is not None]
    passing = [x for x in judged if not x["failed"] and x["lo"] > 0]
    best = max(passing, key=lambda x: (x["avg8"], x["diff"], -x["order"]), default=None)
    for x in judged:
      ci = c.promotion.ci(x, parent)
      if x["failed"]:
        x["reason"], x["outcome"] = validator_rejection(x, ci), "failure"
      elif any(x is y for y in passing):
        x["reason"] = f"kept: beats {parent} beyond noise ({ci}); validators pass" + (
            "; the best of the sweep: incumbent" if x is best else "")
        x["outcome"] = "success"
      else:
        x["reason"], x["outcome"] = f"not beyond noise: {ci}", "failure"
    uses = {(u.version_id, u.skill) for u in self.ledger.skills_used()}
    for x in judged:  # skill files first (idempotent per version), then the ledger
      for vid, skill in uses:
        if vid == x["variant"].version and c.skills is not None and skill in c.skills:
          c.skills.record_outcome(skill, c.config.domain, x["outcome"] == "success",
                                  version=vid, run=self.ledger.run_uid,
                                  effect={k: x[k] for k in ("diff", "lo", "hi")})
    with self.ledger.transaction():
      for x in sorted(judged, key=lambda x: x is best):  # the promotion last
        vid = x["variant"].version
        self.ledger.update_decision(f"sweep-{x['variant'].name}", outcome=x["outcome"],
                                    why=x["reason"])
        for uvid, skill in uses:
          if uvid == vid:
            self.ledger.set_skill_outcome(vid, skill, x["outcome"])
        if x is best:
          self.ledger.promote(vid, x["reason"])
        elif x["outcome"] == "success":
          self.ledger.set_status(vid, "kept", x["reason"])
        else:
          self.ledger.reject(vid, x["reason"])
      table = self._table(rows)
      self.ledger.set_meta("sweep/table", table)
    return table

  def _table(self, rows: Sequence[Mapping]) -> list:
    """Rows ranked by held-out Avg@8 (variants without a result last)."""
    ranked = sorted(rows, key=lambda x: (x["avg8"] is None or math.isnan(x["avg8"]),
                                         -(x["avg8"] or 0.0), x["order"]))
    out = []
    for rank, x in enumerate(ranked, 1):
      v = x["variant"]
      rec = self.ledger.version(v.version)
      d = self.ledger.decision(f"sweep-{v.name}")
      r = self.c.results.result(v.version)
      noise = None if x["lo"] is None else (x["hi"] - x["lo"]) / 2
      out.append({"rank": rank, "variant": v.name, "version": v.version,
                  "bindings": v.gin(), "status": rec.status, "heldout_avg8": x["avg8"],
                  "noise": noise, "diff": x["diff"], "lo": x["lo"], "hi": x["hi"],
                  "proxy_reward": x["proxy"], "steps": r.steps if r else None,
                  "validators": {vd.validator: "pass" if vd.passed else f"fail: {vd.reason}"
                                 for vd in x["verdicts"]},
                  "backtest": d.backtest,
                  "skills": [u.skill for u in self.ledger.skills_used(v.version)],
                  "reason": rec.reason})
    return out


__all__ = ["Sweep", "SweepError", "Variant", "check_variants", "format_table",
           "gin_harness_builder", "load_sweep", "start_from"]
