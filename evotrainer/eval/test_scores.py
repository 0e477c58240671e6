"""Test-split scores of a run's versions: read for reports only.

A `branch` run writes its test figures to `versions/<id>/test_eval.json`
(`write_test_scores`), beside (never inside) the `branch_result.json` the controller
reads; only the summary and the report read them back, through this module, after the
controller's decisions. The evolution package never imports it but for the summary
writer (tests/evolution/test_promotion.py checks both).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Mapping, Optional

from evotrainer import paths

TEST_FILE = "test_eval.json"


def write_test_scores(directory: str | os.PathLike, version: str, figures: dict,
                      per_problem: dict) -> None:
  """Writes a branch's test figures and {task_id: mean correct} to
  `<directory>/test_eval.json` (atomically), the file `read_test_scores` reads back."""
  record = {"version": version, "final": figures, "per_problem": per_problem}
  paths.write_atomic(pathlib.Path(directory) / TEST_FILE, json.dumps(record, indent=2) + "\n")


def read_test_scores(workdir: str | os.PathLike) -> dict:
  """{version id: {'avg8', 'pass8', ..., 'per_problem'}} of every version in `workdir`
  with a readable test evaluation (an unreadable file is skipped, never an error)."""
  out = {}
  for path in sorted(pathlib.Path(workdir).glob(f"versions/*/{TEST_FILE}")):
    try:
      data = json.loads(path.read_text())
      out[data["version"]] = {**data["final"], "per_problem": data.get("per_problem", {})}
    except (OSError, ValueError, KeyError, TypeError):
      continue
  return out


def _avg(x: Optional[Mapping]) -> Optional[float]:
  """Avg@8, or the mean per-problem score when the evaluation used another k (as the
  controller's validation figure does)."""
  if x is None:
    return None
  v = x.get("avg8")
  if v is None and x.get("per_problem"):
    v = sum(x["per_problem"].values()) / len(x["per_problem"])
  return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def attach_test(summary: dict, workdir: str | os.PathLike) -> dict:
  """`summary` (the controller's) with each version's `test_avg8` beside its
  `validation_avg8`, and `selection`: the incumbent's gain over the root on validation
  and on test, and the selection gap (validation gain - test gain; > 0 = the validation
  figures flatter the lineage)."""
  test = read_test_scores(workdir)
  versions = []
  for v in summary.get("versions", []):
    versions.append({**v, "validation_avg8": v.get("heldout_avg8"),
                     "test_avg8": _avg(test.get(v["id"]))})
  out = {**summary, "versions": versions, "split_reported": "test"}
  by_id = {v["id"]: v for v in versions}
  root = next((v for v in versions if v.get("parent") is None), None)
  inc = by_id.get(summary.get("incumbent"))
  if root and inc and None not in (root["validation_avg8"], inc["validation_avg8"],
                                   root["test_avg8"], inc["test_avg8"]):
    val_gain = inc["validation_avg8"] - root["validation_avg8"]
    test_gain = inc["test_avg8"] - root["test_avg8"]
    out["selection"] = {"root": root["id"], "incumbent": inc["id"],
                        "validation_gain": val_gain, "test_gain": test_gain,
                        "selection_gap": val_gain - test_gain}
  return out


def gate_power(ledger, workdir: str | os.PathLike, n: int = 2000, alpha: float = 0.05) -> dict:
  """The promotion gate judged against the test split, a fresh set it never read: each
  decided branch of each generation against its reference (the generation's control
  when it has a test score, else the parent), paired over test problems. A branch is
  *truly better* when that interval's lower bound is > 0. `power` = kept / truly better,
  `false_rejection_rate` = 1 - power, `false_acceptance_rate` = kept among the others;
  None where a denominator is 0. `branches` lists each comparison."""
  from evotrainer.evolution.stats import paired_test
  test = read_test_scores(workdir)
  rows = []
  for gen in range(1, int(ledger.get_meta("controller/generation", 0)) + 1):
    plan = ledger.get_meta(f"controller/plan/{gen}") or {}
    control = (plan.get("control") or {}).get("version")
    ref = control if control in test else plan.get("parent")
    for b in plan.get("branches", []):
      vid = b["version"]
      if vid not in test or ref not in test:
        continue
      t = paired_test(test[vid]["per_problem"], test[ref]["per_problem"], n=n, seed=gen,
                      alpha=alpha)
      rows.append({"version": vid, "reference": ref, "test_diff": t["diff"],
                   "test_lo": t["lo"], "test_hi": t["hi"], "truly_better": t["lo"] > 0,
                   "kept": ledger.version(vid).heldout.get("verdict") == "kept"})
  better = [r for r in rows if r["truly_better"]]
  others = [r for r in rows if not r["truly_better"]]
  kept_better = sum(r["kept"] for r in better)
  rate = lambda a, b: a / b if b else None  # noqa: E731
  power = rate(kept_better, len(better))
  return {"branches": rows, "decided": len(rows), "truly_better": len(better),
          "kept_truly_better": kept_better, "power": power,
          "false_rejection_rate": None if power is None else 1 - power,
          "false_acceptance_rate": rate(sum(r["kept"] for r in others), len(others))}


__all__ = ["TEST_FILE", "attach_test", "gate_power", "read_test_scores", "write_test_scores"]
