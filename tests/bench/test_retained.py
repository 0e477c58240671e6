"""bench/retained.py: the kept and tried changes of evolution runs, by domain and layer."""

import json

import pytest

from evotrainer.evolution.ledger.core import Ledger


def _run(wd, kept, rejected):
  """An evolution run directory: v0 -> v1.0 -> ... each kept change in turn (the ledger
  and summary.json), plus rejected branches off the root. kept / rejected: [(binding,
  description)]."""
  wd.mkdir(parents=True)
  versions = []
  with Ledger(wd / "ledger.sqlite") as ledger:
    ledger.add_harness_version("h0", {}, {})
    ledger.add_version("v0", None, harness_version="h0", status="kept")
    parent = "v0"
    changes = [(f"v{i + 1}.0", parent if i == 0 else f"v{i}.0", c, "kept")
               for i, c in enumerate(kept)]
    changes += [(f"v9.{i}", "v0", c, "rejected") for i, c in enumerate(rejected)]
    for i, (vid, par, (binding, desc), status) in enumerate(changes):
      ledger.add_version(vid, par, harness_version="h0", status="kept")
      if status == "rejected":
        ledger.reject(vid)
      ledger.add_decision(f"d{i}", par, hypothesis="h", criterion="c", version_id=vid,
                          intervention={"binding": binding, "description": desc,
                                        "kind": "set"})
      versions.append({"id": vid, "parent": par, "status": status,
                       "intervention": f"{binding}: {desc}", "reason": status})
  incumbent = f"v{len(kept)}.0" if kept else "v0"
  (wd / "summary.json").write_text(json.dumps({"incumbent": incumbent,
                                               "versions": versions}))
  return wd


def test_kept_and_tried_changes_by_domain_and_layer(tmp_path, capsys):
  from bench import retained
  defines = ("RewardComposer.parts", "add 'defines' = 0.275")
  hot = ("SamplingParams.temperature", "1.0 -> 1.15")
  drop = ("Harness.group_filters", "add drop_dead")
  lr = ("Learner.learning_rate", "2e-05 -> 4e-05")
  a = _run(tmp_path / "code" / "s0", [defines, hot], [drop])
  b = _run(tmp_path / "code" / "s1", [("RewardComposer.parts", "add 'defines' = 0.5")],
           [hot])
  m = _run(tmp_path / "math" / "s0", [lr], [])
  out = retained.main(["--run", f"code={a}", "--run", f"code={b}", "--run", f"math={m}",
                       "--json", str(tmp_path / "out.json")])
  code = out["domains"]["code"]
  # Both code runs kept the defines part (at different weights: one move); one kept the
  # temperature 1.15 the other tried and lost; the filter was tried once and lost.
  assert code["kept_by_layer"] == {
      "reward": {"RewardComposer.parts: add 'defines'": 2},
      "optimisation": {"SamplingParams.temperature -> 1.15": 1}}
  assert code["tried_by_layer"] == {
      "reward": {"RewardComposer.parts: add 'defines'": 2},
      "filter": {"Harness.group_filters: add drop_dead": 1},
      "optimisation": {"SamplingParams.temperature -> 1.15": 2}}
  assert code["runs"]["s0"]["incumbent"] == "v2.0"
  assert [r["layer"] for r in code["runs"]["s1"]["rejected"]] == ["optimisation"]
  assert out["domains"]["math"]["kept_by_layer"] == {
      "optimisation": {"Learner.learning_rate -> 4e-05": 1}}
  assert json.loads((tmp_path / "out.json").read_text())["domains"] == out["domains"]


def test_bad_runs_are_refused(tmp_path):
  from bench import retained
  with pytest.raises(SystemExit):
    retained.main(["--run", str(tmp_path)])  # no domain=
  with pytest.raises(SystemExit):
    retained.main(["--run", f"code={tmp_path / 'missing'}"])
  a = _run(tmp_path / "x" / "s0", [], [])
  b = _run(tmp_path / "y" / "s0", [], [])
  with pytest.raises(SystemExit):
    retained.main(["--run", f"code={a}", "--run", f"code={b}"])  # one name twice
