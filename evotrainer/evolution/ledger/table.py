"""The ledger's lineage as a printable text table (`Ledger.table`, `run --mode=ledger`).

One row a version, children indented under their parent ('*' marks the incumbent): status,
creation step, held-out score with its noise, proxy reward, the change that made it and
why it was kept or rejected.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

from evotrainer.evolution.ledger.records import VersionRecord
from evotrainer.evolution.stats import score_label

if TYPE_CHECKING:
  from evotrainer.evolution.ledger.core import Ledger


def lineage_table(ledger: Ledger, width: int = 48) -> str:
  """The lineage of `ledger` as a text table (a tree by indentation; '*' = incumbent);
  long changes and reasons are clipped to `width` characters."""
  versions = ledger.versions()
  if not versions:
    return "(empty ledger)"
  inc = ledger.get_meta("incumbent")
  changes = {d.version_id: d.intervention.get("description", "")
             for d in ledger.decisions() if d.version_id}
  by_parent: dict = {}
  for v in versions:
    by_parent.setdefault(v.parent, []).append(v)
  known = {v.id for v in versions}
  roots = [v for v in versions if v.parent is None or v.parent not in known]
  rows = []

  def walk(v: VersionRecord, depth: int) -> None:
    change = changes.get(v.id) or ("; ".join(f"{b}={json.dumps(x)}" for b, x in
                                              v.bindings.items()) if v.parent else "(root)")
    rows.append(["*" if v.id == inc else "", "  " * depth + v.id, v.status,
                 str(v.created_step), _heldout_cell(v.heldout),
                 _num_cell(v.metrics.get("proxy_reward")), _clip(change, width),
                 _clip(v.reason, width)])
    for c in by_parent.get(v.id, []):
      walk(c, depth + 1)

  for r in roots:
    walk(r, 0)
  head = ["", "version", "status", "step", "heldout", "proxy", "change", "reason"]
  widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
  fmt = lambda r: " ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
  return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _clip(text: str, width: int) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= width else text[:width - 3] + "..."


def _num_cell(x: Any) -> str:
  return f"{x:.4f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else ""


def _heldout_cell(heldout: Mapping) -> str:
  """'avg8 0.4120±0.0200' from {'avg8': .412, 'noise': .02} (first numeric key if no avg8)."""
  nums = {k: v for k, v in heldout.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)}
  key = "avg8" if "avg8" in nums else next((k for k in nums if "noise" not in k), None)
  if key is None:
    return ""
  noise = nums.get("noise", nums.get(f"{key}_noise"))
  label = score_label(heldout) if key == "avg8" else key
  return f"{label} {nums[key]:.4f}" + (f"±{noise:.4f}" if noise is not None else "")


__all__ = ["lineage_table"]
