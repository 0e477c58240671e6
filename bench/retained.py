"""What the evolution kept, per domain: the changes on each run's final lineage, by layer.

Reads finished evolution run directories (their `summary.json` and `ledger.sqlite`; it
trains nothing) and groups, per domain, the changes each run kept on its final lineage by
the layer they act on (reward, filter, data, optimisation, diagnostics:
`bench/evolve_arms.LAYERS`), beside the changes its branches tried and lost. The paper's
third finding is that these differ by domain.

  python -m bench.retained --run code=/path/to/evotrainer-s0 --run code=/path/to/evotrainer-s1 \\
      --run math=/path/to/math-evolve-s0 --json bench/results/retained_real.json

JSON keys: `domains` {domain: {`runs` {run name: {`incumbent`, `kept` [{version, change,
binding, layer}], `rejected` [{version, change, layer, reason}]}}, `kept_by_layer` {layer:
{change: runs that kept it}}, `tried_by_layer` {layer: branches that tried it}}}, `layers`.
A run is named by its directory's name; two runs of one domain must differ in name.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections import Counter
from typing import Sequence

from bench.common import write_json
from bench.evolve_arms import LAYERS, layer_of, retained

LAYER_ORDER = tuple(dict.fromkeys(layer for _, layer in LAYERS)) + ("other",)


def _parse(argv) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--run", action="append", default=[], required=True,
                  help="domain=run directory of a finished evolution (repeat it)")
  ap.add_argument("--json", default=None, help="write the result here")
  args = ap.parse_args(argv)
  runs = []
  for item in args.run:
    domain, sep, path = item.partition("=")
    wd = pathlib.Path(path).expanduser()
    if not sep or not domain or not (wd / "summary.json").is_file():
      ap.error(f"--run {item!r}: expected domain=<run directory holding summary.json>")
    runs.append((domain, wd))
  names = [(d, wd.name) for d, wd in runs]
  if len(set(names)) != len(names):
    ap.error(f"--run: two runs of one domain share a directory name: {sorted(names)}")
  args.runs = runs
  return args


def _full(entry: dict) -> str:
  """A retained entry's change with its binding in front (the ledger's descriptions may
  leave it out)."""
  b, change = entry["binding"], entry["change"]
  return change if b == "harness" or change.startswith(b) else f"{b}: {change}"


def _change(intervention: str) -> str:
  """The move an intervention makes, so that the same move counts once across runs:
  "RewardComposer.parts: add 'defines' = 0.275" -> "RewardComposer.parts: add 'defines'"
  (a weight's value dropped), 'SamplingParams.temperature: 1.0 -> 1.15' ->
  'SamplingParams.temperature -> 1.15' (the value it sets)."""
  binding, _, what = intervention.partition(": ")
  if " -> " in what:
    return f"{binding} -> {what.split(' -> ', 1)[1]}"
  return f"{binding}: {what.split(' = ')[0]}" if what else binding


def run_record(wd: pathlib.Path) -> dict:
  """One evolution run: its incumbent, the changes kept on its lineage, the ones lost."""
  summary = json.loads((wd / "summary.json").read_text())
  rejected = [{"version": v["id"], "change": v["intervention"],
               "layer": layer_of(v["intervention"]), "reason": v.get("reason", "")}
              for v in summary["versions"]
              if v.get("intervention") and v.get("status") != "kept"]
  kept = [{**e, "change": _full(e)} for e in retained(wd, summary["incumbent"])]
  return {"incumbent": summary["incumbent"], "kept": kept, "rejected": rejected}


def domain_table(records: dict) -> dict:
  """The runs of one domain, and the changes counted by layer: `kept_by_layer` (runs that
  kept each change) and `tried_by_layer` (branches that tried each change, kept or not)."""
  kept, tried = Counter(), Counter()
  for rec in records.values():
    seen = {(e["layer"], _change(e["change"])) for e in rec["kept"]}
    kept.update(seen)
    tried.update((e["layer"], _change(e["change"])) for e in rec["kept"] + rec["rejected"]
                 if e["layer"] != "diagnostics")
  by = lambda c: {layer: {ch: n for (l, ch), n in sorted(c.items()) if l == layer}
                  for layer in LAYER_ORDER if any(l == layer for l, _ in c)}
  return {"runs": records, "kept_by_layer": by(kept), "tried_by_layer": by(tried)}


def main(argv: Sequence[str] | None = None) -> dict:
  args = _parse(argv)
  domains: dict = {}
  for domain, wd in args.runs:
    domains.setdefault(domain, {})[wd.name] = run_record(wd)
  out = {"benchmark": "retained", "layers": list(LAYER_ORDER),
         "domains": {d: domain_table(recs) for d, recs in domains.items()}}
  for d, table in out["domains"].items():
    print(f"[retained] {d} ({len(table['runs'])} runs)")
    for layer, changes in table["kept_by_layer"].items():
      print(f"  {layer}: " + ", ".join(f"{c} x{n}" for c, n in changes.items()))
  write_json(args.json, out)
  return out


if __name__ == "__main__":
  main()
