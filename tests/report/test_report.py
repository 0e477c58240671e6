"""The run report: content and escaping from a hand-built ledger, and a real render in
headless Chromium (Debian's chromium package, installed by .ci/run)."""

import html
import json
import os
import shutil
import subprocess
import types

import pytest

from evotrainer.evolution.ledger import Ledger
from evotrainer.report import render_report
from evotrainer.report.html import svg_chart, version_curves

SNIPPET = "<script>alert('x')</script> answer 42"
MESSAGE = "length and reward correlate (0.41 > 0.3): possible length gaming"
MESSAGE_HTML = html.escape(MESSAGE)  # as it stands in the page and the DOM


def _finding(**kw):
  base = dict(kind="length_reward_corr", layer="behaviour", severity=0.5, value=0.41,
              threshold=0.3, message=MESSAGE, evidence=(("v1/train/3/0", SNIPPET),))
  return types.SimpleNamespace(**{**base, **kw})


def _write_metrics(path, rewards, bcs, evals):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w") as f:
    for step, avg8 in evals:
      f.write(json.dumps({"step": step, "eval/avg8": avg8}) + "\n")
    for step, (r, bc) in enumerate(zip(rewards, bcs), start=1):
      f.write(json.dumps({"step": step, "reward": r, "correct": bc}) + "\n")
      f.write(json.dumps({"step": step, "diag/bc": bc, "diag/reward_mean": r}) + "\n")
    f.write('{"step": 99, "reward"')  # a torn last line: a writer in progress


@pytest.fixture
def run_dir(tmp_path):
  """Two versions (root kept, branch rejected), one finding, one decision, one skill."""
  with Ledger(tmp_path / "ledger.sqlite") as ledger:
    ledger.add_version("v0", parent=None, bindings={"Learner.clip_high": 0.28}, status="kept",
                       reason="root version")
    ledger.update_version("v0", heldout={"avg8": 0.48}, metrics={"proxy_reward": 0.56})
    ledger.promote("v0", reason="root version")
    ledger.add_version("v1", parent="v0", bindings={"Learner.clip_high": 0.32})
    ledger.update_version("v1", heldout={"avg8": 0.45, "noise": 0.05, "validators": {
        "exploit_probe": "n/a", "proxy_true_disagreement": "fail"}})
    ledger.add_decision("g1-d0", "v0", hypothesis="raising clip_high keeps entropy up",
                        intervention={"description": "Learner.clip_high: 0.28 -> 0.32"},
                        criterion="avg8 above the incumbent beyond noise", version_id="v1",
                        backtest={"fired": True}, skill="entropy_collapse_raise_clip_high")
    ledger.add_findings("v1", [_finding()])
    ledger.reject("v1", reason="not beyond noise")
    ledger.update_decision("g1-d0", outcome="failure", why="not beyond noise: avg8 -0.03")
  _write_metrics(tmp_path / "versions/v0/metrics.jsonl", [.3, .4, .5], [.3, .35, .5],
                 [(0, .33), (3, .48)])
  _write_metrics(tmp_path / "versions/v1/metrics.jsonl", [.5, .6], [.5, .45], [(0, .48)])
  (tmp_path / "skills").mkdir()
  (tmp_path / "skills/entropy_collapse_raise_clip_high.json").write_text(json.dumps(
      {"name": "entropy_collapse_raise_clip_high", "category": "loss",
       "description": "Entropy collapses: raise clip_high", "trigger": {"finding": "entropy"}}))
  return tmp_path


def test_report_content_and_escaping(run_dir):
  path = render_report(run_dir)
  assert path == run_dir / "report.html"
  page = path.read_text()
  # A validator without evidence is listed as not applicable, never as passed.
  assert "<td>exploit_probe</td><td>0</td><td>0</td><td>1</td>" in page
  assert "<td>proxy_true_disagreement</td><td>0</td><td>1 (v1)</td><td>0</td>" in page
  for text in ("v0", "v1", "rejected", "kept", "incumbent", MESSAGE_HTML, "0.4800",
               "raising clip_high keeps entropy up", "Learner.clip_high: 0.28 -&gt; 0.32",
               "not beyond noise: avg8 -0.03", "entropy_collapse_raise_clip_high"):
    assert text in page, text
  assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
  assert "<script" not in page  # no script of ours, none let through from the run
  assert page.count("<svg") == 5  # the overview and two charts per version
  assert "<polyline" in page
  assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
  assert "https://" not in page  # opens offline
  assert not [p for p in os.listdir(run_dir) if p.startswith(".report.")]  # no temp left


def test_report_shows_each_skills_pooled_effect_with_and_without_its_discovery(run_dir):
  """By hand: effects 0.3 (the keep that learned it) and 0.15, each with half-width
  0.196 (se 0.1), pool to 0.225 [0.0864, 0.3636]; the replication alone is 0.150
  [-0.046, +0.346]. The fixture's partial skill file is named as not a valid skill."""
  from evotrainer.evolution.skills import Skill, SkillLibrary
  (run_dir / "library").mkdir()  # the run's skills/ holds a partial file
  lib = SkillLibrary(run_dir / "library")
  lib.add(Skill(name="learned-x", category="reward design", description="d",
                trigger={"finding": "entropy"}, source="learned",
                intervention={"binding": "Learner.clip_high", "kind": "set", "value": 0.3},
                expected_outcome="e", validation_criterion="v"))
  for run, diff, selected in (("a", 0.3, True), ("b", 0.15, False)):
    lib.record_outcome("learned-x", "code", None, version="v1", run=run, selected=selected,
                       effect={"diff": diff, "lo": diff - 0.196, "hi": diff + 0.196,
                               "against": "control"})
  (run_dir / "skills/learned-x.json").write_text((run_dir / "library/learned-x.json")
                                                 .read_text())
  page = render_report(run_dir).read_text()
  assert ("all: +0.225 [+0.086, +0.364] (n=2); replications: +0.150 [-0.046, +0.346] "
          "(n=1)") in page
  assert "not a valid skill: " in page


def test_report_single_version_no_findings(tmp_path):
  with Ledger(tmp_path / "ledger.sqlite") as ledger:
    ledger.add_version("v0", parent=None, bindings={}, status="kept")
    ledger.promote("v0")
  page = render_report(tmp_path).read_text()
  assert "v0" in page and "No findings recorded." in page
  assert "No decision records." in page and "No metrics.jsonl" in page


def test_report_missing_ledger_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no ledger"):
    render_report(tmp_path)
  assert not (tmp_path / "ledger.sqlite").exists()


def test_version_curves_merge_rows_of_a_step():
  rows = [{"step": 1, "reward": 0.5, "correct": 0.25}, {"step": 1, "diag/bc": 0.2},
          {"step": 0, "eval/avg8": 0.4}, {"step": 2, "reward": float("nan")}]
  c = version_curves(rows)
  assert c == {"reward": [(1.0, 0.5)], "bc": [(1.0, 0.2)], "heldout avg8": [(0.0, 0.4)]}


def test_svg_chart_maps_points_to_the_plot_box():
  svg = svg_chart({"a": [(0, 0.0), (10, 1.0)]}, "t", width=160, height=100)
  # plot box: x in [48, 150], y in [22, 70]; (0, 0) -> bottom-left, (10, 1) -> top-right
  assert 'points="48.0,70.0 150.0,22.0"' in svg
  assert ">0<" in svg and ">1<" in svg  # min / max labels
  assert "no data" in svg_chart({"a": []}, "t")


def test_svg_chart_mixes_lines_dots_and_edges():
  # Plot box x in [48, 150], y in [22, 70]; the edge's far end (20, 2) widens both ranges
  # to x in [0, 20], y in [0, 2].
  svg = svg_chart({"line": [(0, 0.0), (10, 1.0)], "dots": [(10, 0.0)]}, "t", width=160,
                  height=100, points={"dots"}, edges=[((0, 0.0), (20, 2.0))])
  assert 'points="48.0,70.0 99.0,46.0"' in svg  # the line series: a polyline
  assert svg.count("<polyline") == 1  # the dot series has none
  assert '<circle cx="99.0" cy="70.0"' in svg  # (10, 0): the dot
  assert '<line x1="48.0" y1="70.0" x2="150.0" y2="22.0"' in svg  # the edge


def test_the_overview_joins_each_version_to_its_parent():
  from evotrainer.evolution.ledger.records import VersionRecord
  from evotrainer.report.html import _overview
  fields = {f: None for f in VersionRecord.__dataclass_fields__}
  v = lambda id, parent, status, val: VersionRecord(**{
      **fields, "id": id, "parent": parent, "status": status,
      "metrics": {"steps": 10}, "heldout": {"avg8": val}})
  versions = [v("v0", None, "kept", 0.2), v("v1.0", "v0", "kept", 0.4),
              v("v2.0", "v1.0", "rejected", 0.3)]
  svg = _overview(versions, {"v0": {"avg8": 0.1}, "v2.0": {"avg8": 0.5}})
  # validation: v0-v1.0, v1.0-v2.0; test: v1.0 has none, so no test edge at all
  assert svg.count("<line ") == 2
  assert svg.count("<circle") == 5  # 3 validation points, 2 test points


def test_report_renders_in_headless_chromium(run_dir, tmp_path_factory):
  chromium = shutil.which("chromium")
  if chromium is None:
    if os.environ.get("CI"):
      pytest.fail("chromium is not installed, but CI is set: .ci/run installs Debian's "
                  "chromium package (apt-get install chromium) before the tests")
    pytest.skip("chromium not installed (apt-get install chromium); CI installs it")
  from PIL import Image
  report = render_report(run_dir)
  tmp = tmp_path_factory.mktemp("chromium")
  shot = tmp / "shot.png"
  base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
          "--no-first-run", "--disable-background-networking", "--disable-component-update",
          "--disable-sync", f"--user-data-dir={tmp / 'profile'}"]
  proc = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1200,900",
                                f"file://{report}"], capture_output=True, text=True,
                        timeout=120)
  assert shot.is_file(), f"no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
  with Image.open(shot) as im:
    rgb = im.convert("RGB")
    colors = rgb.getcolors(maxcolors=1 << 20)
    pixels = rgb.width * rgb.height
  non_white = sum(n for n, c in colors if c != (255, 255, 255))
  assert len(colors) > 20, f"screenshot has {len(colors)} colors: blank?"
  assert non_white > 0.01 * pixels, f"{non_white}/{pixels} non-white pixels: blank?"
  dom = subprocess.run(base + ["--dump-dom", f"file://{report}"], capture_output=True,
                       text=True, timeout=120).stdout
  for text in ('id="lineage-v0"', 'id="lineage-v1"', MESSAGE_HTML, "&lt;script&gt;"):
    assert text in dom, text


def test_report_shows_the_gate_against_the_test_split(run_dir):
  gate = {"decided": 2, "truly_better": 2, "kept_truly_better": 1, "power": 0.5,
          "false_rejection_rate": 0.5, "false_acceptance_rate": None,
          "branches": [{"version": "v1", "reference": "v0", "test_diff": 0.1,
                        "test_lo": 0.05, "test_hi": 0.15, "truly_better": True,
                        "kept": False}]}
  (run_dir / "summary.json").write_text(json.dumps({"gate": gate}))
  page = render_report(run_dir).read_text()
  assert ("2 decided branches; 2 truly better than their reference on the test split "
          "(paired 95% interval above 0), 1 of them kept: power 50%, false rejection rate "
          "50%, false acceptance rate —.") in page
  assert "<td>v1</td><td>v0</td><td>0.1000 [0.0500, 0.1500]</td><td>yes</td>" in page
