"""`report.html`: the run directory as one self-contained page (ISSUE 5, item 10).

What it shows, all read from the run directory:
  - the lineage tree (ledger versions) with status, intervention, held-out Avg@8 and the
    incumbent marked;
  - per-version curves from `versions/<id>/metrics.jsonl`: proxy reward and BC (the
    verifier's correctness) per training step, held-out Avg@8 per eval;
  - findings with evidence snippets: the ledger's, and the training-time ones in
    `versions/<id>/findings.jsonl`;
  - decision records (hypothesis, intervention, backtest, criterion, outcome, why);
  - skills used (ledger) and the skill library in `skills/*.json`;
  - a sweep's ranked table (ledger meta 'sweep/table', else summary.json 'sweep'), when
    the run is or was a sweep (evotrainer/evolution/sweep.py).

The page opens offline: no scripts, no external CSS or fonts, plots are inline SVG
polylines drawn here. Every piece of run text (completions in evidence snippets above
all) is HTML-escaped, its control characters and lone surrogates written as escapes. The
file is written atomically (`evotrainer/atomic.py`), so a reader never sees a
half-written report while the run regenerates it.
"""

from __future__ import annotations

import html
import json
import math
import os
import pathlib
import time
from typing import Any, Collection, Iterable, Mapping, Optional, Sequence

from evotrainer import atomic
from evotrainer.eval.test_scores import read_test_scores
from evotrainer.evolution.ledger import Ledger, VersionRecord
from evotrainer.evolution.skills import Skill, SkillError
from evotrainer.evolution.stats import score_label
from evotrainer.harness.base import printable

REPORT_NAME = "report.html"
MAX_FILE_FINDINGS = 20  # training-time findings shown per version (the file can be long)
MAX_EVIDENCE = 5  # evidence snippets shown per finding
MAX_SNIPPET = 400  # characters per snippet

# metrics.jsonl keys, first present wins: train.py writes `reward` / `correct` on the
# step line and `diag/reward_mean` / `diag/bc` on the diagnostics line of the same step.
_REWARD_KEYS = ("reward", "diag/reward_mean")
_BC_KEYS = ("diag/bc", "correct")
_HELDOUT_KEY = "eval/avg8"

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
_CSS = """
body{font-family:sans-serif;margin:24px;color:#222;background:#fff;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#f0f0f0}
ul.tree,ul.tree ul{list-style:none;padding-left:20px;margin:0}
ul.tree li{margin:3px 0;font-size:13px}
.st{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:12px}
.st-kept{background:#2ca02c}.st-merged{background:#17becf}.st-rejected{background:#d62728}
.st-pruned{background:#7f7f7f}.st-running{background:#ff7f0e}
.inc{font-weight:bold;color:#b8860b}
code,pre{font-family:monospace;font-size:12px;background:#f6f6f6}
pre{white-space:pre-wrap;margin:2px 0;padding:2px 4px}
.curves{display:flex;flex-wrap:wrap;gap:12px}
.muted{color:#777}
"""


def _e(x: Any) -> str:
  """HTML-escaped text of any value (quotes included: safe inside attributes too), with
  control characters and lone surrogates as visible escapes (`printable`), so a page
  holding any model text is valid UTF-8."""
  return html.escape(printable("" if x is None else str(x)), quote=True)


def _num(x: Any, digits: int = 4) -> str:
  if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x):
    return ""
  return f"{x:.{digits}f}"


def _jsonl(path: pathlib.Path) -> list:
  """Rows of a JSON-lines file; missing file -> []; a torn last line (a writer in
  progress) or any bad line is skipped."""
  rows = []
  try:
    with open(path, encoding="utf-8") as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:
          continue
        if isinstance(row, dict):
          rows.append(row)
  except FileNotFoundError:
    pass
  return rows


# ------------------------------------------------------------------ curves


def _finite(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def version_curves(metrics_rows: Iterable[Mapping]) -> dict:
  """{'reward': [(step, y)], 'bc': [...], 'heldout avg8': [...]} from metrics.jsonl rows.

  Rows of the same step are merged first; per step the first key of `_REWARD_KEYS` /
  `_BC_KEYS` present is used.
  """
  by_step: dict = {}
  for row in metrics_rows:
    if _finite(row.get("step")):
      by_step.setdefault(row["step"], {}).update(row)
  curves: dict = {"reward": [], "bc": [], "heldout avg8": []}
  for step in sorted(by_step):
    row = by_step[step]
    for name, keys in (("reward", _REWARD_KEYS), ("bc", _BC_KEYS),
                       ("heldout avg8", (_HELDOUT_KEY,))):
      y = next((row[k] for k in keys if _finite(row.get(k))), None)
      if y is not None:
        curves[name].append((float(step), float(y)))
  return curves


def svg_chart(series: Mapping[str, Sequence[tuple]], title: str, width: int = 360,
              height: int = 200, points: bool | Collection[str] = False,
              edges: Sequence[tuple] = ()) -> str:
  """An inline SVG line chart: one polyline per series, axes labelled with min/max.

  Args:
    series: {name: [(x, y), ...]}; empty series are left out.
    title: the chart's caption.
    points: True: a dot per point and no lines (a scatter); a collection of series
      names: those series as dots, the others as lines.
    edges: [((x0, y0), (x1, y1)), ...] drawn as thin grey segments under the series
      (e.g. each version joined to its parent).
  """
  series = {k: list(v) for k, v in series.items() if v}
  dots = set(series) if points is True else set(points or ())
  left, right, top, bottom = 48, 10, 22, 30
  pw, ph = width - left - right, height - top - bottom
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
         f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
         f'<text x="{left}" y="14" font-size="12" font-family="sans-serif">{_e(title)}</text>',
         f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" '
         f'stroke="#888"/>']
  if not series:
    out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" font-size="12" '
               f'text-anchor="middle" fill="#777">no data</text></svg>')
    return "".join(out)
  ends = [p for edge in edges for p in edge]
  xs = [p[0] for s in series.values() for p in s] + [p[0] for p in ends]
  ys = [p[1] for s in series.values() for p in s] + [p[1] for p in ends]
  x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
  if x1 == x0:
    x0, x1 = x0 - 1, x1 + 1
  if y1 == y0:
    y0, y1 = y0 - 0.5, y1 + 0.5
  sx = lambda x: left + (x - x0) / (x1 - x0) * pw
  sy = lambda y: top + ph - (y - y0) / (y1 - y0) * ph
  font = 'font-size="10" font-family="sans-serif" fill="#444"'
  out += [f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {font}>{y1:.3g}</text>',
          f'<text x="{left - 4}" y="{top + ph}" text-anchor="end" {font}>{y0:.3g}</text>',
          f'<text x="{left}" y="{top + ph + 12}" {font}>{x0:g}</text>',
          f'<text x="{left + pw}" y="{top + ph + 12}" text-anchor="end" {font}>{x1:g}</text>',
          f'<text x="{left + pw / 2}" y="{top + ph + 24}" text-anchor="middle" {font}>'
          f'step</text>']
  out += [f'<line x1="{sx(a[0]):.1f}" y1="{sy(a[1]):.1f}" x2="{sx(b[0]):.1f}" '
          f'y2="{sy(b[1]):.1f}" stroke="#bbb" stroke-width="1"/>' for a, b in edges]
  for i, (name, pts) in enumerate(series.items()):
    color = _COLORS[i % len(_COLORS)]
    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    if name not in dots:
      out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                 f'points="{coords}"/>')
    if name in dots or len(pts) == 1:  # a one-point polyline is invisible: a dot
      out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>'
              for x, y in pts]
    lx = width - right - (110 if dots else 70) * i  # legend on the title line
    out.append(f'<text x="{lx}" y="14" text-anchor="end" '
               f'font-size="10" font-family="sans-serif" fill="{color}">{_e(name)}</text>')
  out.append("</svg>")
  return "".join(out)


# ------------------------------------------------------------------ sections


def _heldout_text(heldout: Mapping) -> str:
  avg8 = _num(heldout.get("avg8"))
  noise = _num(heldout.get("noise"))
  return avg8 + (f" ± {noise}" if avg8 and noise else "")


def _status(status: str) -> str:
  return f'<span class="st st-{_e(status)}">{_e(status)}</span>'


def _lineage(versions: Sequence[VersionRecord], changes: Mapping[str, str],
             incumbent: Optional[str], test: Mapping[str, Mapping]) -> str:
  by_parent: dict = {}
  known = {v.id for v in versions}
  for v in versions:
    by_parent.setdefault(v.parent if v.parent in known else None, []).append(v)

  def node(v: VersionRecord) -> str:
    change = changes.get(v.id) or ("(root)" if v.parent is None else
                                   "; ".join(f"{b} = {json.dumps(x)}"
                                             for b, x in v.bindings.items()))
    held = _heldout_text(v.heldout)
    proxy = _num(v.metrics.get("proxy_reward"))
    parts = [f'<li id="lineage-{_e(v.id)}"><code>{_e(v.id)}</code> {_status(v.status)}']
    if v.id == incumbent:
      parts.append(' <span class="inc">&#9733; incumbent</span>')
    parts.append(f" {_e(change)}")
    if held:
      parts.append(f" &middot; validation {_e(score_label(v.heldout))} <b>{_e(held)}</b>")
    if v.id in test:
      parts.append(f" &middot; test {_e(score_label(v.heldout))} <b>{_e(_num(test[v.id].get('avg8')))}</b>")
    if proxy:
      parts.append(f" &middot; proxy {_e(proxy)}")
    if v.reason:
      parts.append(f' <span class="muted">&mdash; {_e(v.reason)}</span>')
    kids = by_parent.get(v.id, [])
    if kids:
      parts.append("<ul>" + "".join(node(c) for c in kids) + "</ul>")
    return "".join(parts) + "</li>"

  if not versions:
    return '<p class="muted">No versions recorded yet.</p>'
  return '<ul class="tree">' + "".join(node(v) for v in by_parent.get(None, [])) + "</ul>"


def _evidence(evidence: Iterable) -> str:
  items = []
  for e in list(evidence)[:MAX_EVIDENCE]:
    episode, snippet = (e[0], e[1]) if isinstance(e, (list, tuple)) and len(e) >= 2 else ("", e)
    snippet = str(snippet)
    if len(snippet) > MAX_SNIPPET:
      snippet = snippet[:MAX_SNIPPET] + "…"
    items.append(f"<div><span class=\"muted\">{_e(episode)}</span><pre>{_e(snippet)}</pre>"
                 f"</div>")
  return "".join(items)


def _findings_table(rows: Sequence[Mapping]) -> str:
  head = ("where", "kind", "layer", "severity", "value / threshold", "message", "evidence")
  body = []
  for f in rows:
    body.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
        _e(f.get("where", "")), _e(f.get("kind")), _e(f.get("layer")),
        _e(_num(f.get("severity"), 2)),
        _e(f"{_num(f.get('value'))} / {_num(f.get('threshold'))}"),
        _e(f.get("message")), _evidence(f.get("evidence") or ()))) + "</tr>")
  return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(body)
          + "</table>")


def _findings(ledger: Ledger, versions: Sequence[VersionRecord],
              workdir: pathlib.Path) -> str:
  out = []
  for v in versions:
    rows = [{"where": f"ledger: {f.stage}", "kind": f.kind, "layer": f.layer,
             "severity": f.severity, "value": f.value, "threshold": f.threshold,
             "message": f.message, "evidence": f.evidence}
            for f in ledger.findings(version=v.id)]
    during = _jsonl(workdir / "versions" / v.id / "findings.jsonl")
    rows += [dict(f, where=f"training step {f.get('step', '?')}")
             for f in during[:MAX_FILE_FINDINGS]]
    if rows:
      more = len(during) - MAX_FILE_FINDINGS
      out.append(f"<h3>{_e(v.id)}</h3>" + _findings_table(rows) +
                 (f'<p class="muted">{more} more training-time findings in '
                  f'versions/{_e(v.id)}/findings.jsonl</p>' if more > 0 else ""))
  return "".join(out) or '<p class="muted">No findings recorded.</p>'


def _json_cell(value: Any) -> str:
  if value is None:
    return '<span class="muted">none</span>'
  return f"<pre>{_e(json.dumps(value, indent=1, sort_keys=True))}</pre>"


def _decisions(ledger: Ledger) -> str:
  decisions = ledger.decisions()
  if not decisions:
    return '<p class="muted">No decision records.</p>'
  head = ("id", "parent → version", "hypothesis", "intervention", "backtest", "criterion",
          "skill", "outcome", "why")
  body = []
  for d in decisions:
    iv = d.intervention if isinstance(d.intervention, Mapping) else {}
    body.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
        _e(d.id), _e(f"{d.parent} → {d.version_id or '(not trained)'}"), _e(d.hypothesis),
        _e(iv.get("description") or json.dumps(d.intervention)), _json_cell(d.backtest),
        _e(d.criterion), _e(d.skill or ""), _e(d.outcome or "pending"), _e(d.why))) + "</tr>")
  return ("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" +
          "".join(body) + "</table>")


def _skills(ledger: Ledger, workdir: pathlib.Path) -> str:
  used = ledger.skills_used()
  from_decisions = [d for d in ledger.decisions() if d.skill]
  out = ["<h3>Used</h3>"]
  if used or from_decisions:
    out.append("<table><tr><th>skill</th><th>version</th><th>decision</th><th>domain</th>"
               "<th>outcome</th></tr>")
    seen = set()
    for s in used:
      seen.add((s.skill, s.decision_id))
      out.append(f"<tr><td>{_e(s.skill)}</td><td>{_e(s.version_id)}</td>"
                 f"<td>{_e(s.decision_id or '')}</td><td>{_e(s.domain)}</td>"
                 f"<td>{_e(s.outcome or 'pending')}</td></tr>")
    for d in from_decisions:
      if (d.skill, d.id) not in seen:
        out.append(f"<tr><td>{_e(d.skill)}</td><td>{_e(d.version_id or '')}</td>"
                   f"<td>{_e(d.id)}</td><td></td><td>{_e(d.outcome or 'pending')}</td></tr>")
    out.append("</table>")
  else:
    out.append('<p class="muted">No skill proposed a version in this run.</p>')
  out.append("<h3>Library (skills/)</h3>")
  files = sorted((workdir / "skills").glob("*.json")) if (workdir / "skills").is_dir() else []
  rows = []
  for path in files:
    try:
      skill = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
      rows.append(f"<tr><td>{_e(path.name)}</td><td colspan=\"3\">unreadable: {_e(e)}</td></tr>")
      continue
    if not isinstance(skill, Mapping):
      continue
    trigger = skill.get("trigger")
    rows.append(f"<tr><td>{_e(skill.get('name', path.stem))}</td>"
                f"<td>{_e(skill.get('category', ''))}</td>"
                f"<td>{_e(skill.get('description', ''))}</td>"
                f"<td><code>{_e(json.dumps(trigger) if trigger is not None else '')}</code>"
                f"</td><td>{_e(_skill_effects(skill, path.name))}</td></tr>")
  if rows:
    out.append("<table><tr><th>name</th><th>category</th><th>description</th>"
               "<th>trigger</th><th>pooled effect</th></tr>" + "".join(rows) + "</table>")
  else:
    out.append('<p class="muted">No skills in the library.</p>')
  return "".join(out)


def _skill_effects(skill: Mapping, where: str) -> str:
  """A skill file's pooled effect over every measurement, then over the replications
  only (`Skill.effect_in`: without the keeps that learned it, which adoption leaves
  out by default); what is wrong with the file when it is not a valid skill."""
  try:
    s = Skill.from_dict(skill, where=where)
  except SkillError as e:
    return f"not a valid skill: {e}"
  figures = (("all", s.effect), ("replications", s.effect_in(None, discoveries=False)))
  return "; ".join(f"{label}: no measurement" if not e["n"] else
                   f"{label}: {e['mean']:+.3f} [{e['lo']:+.3f}, {e['hi']:+.3f}] (n={e['n']})"
                   for label, e in figures)


def _curves(versions: Sequence[VersionRecord], workdir: pathlib.Path) -> str:
  out = []
  for v in versions:
    c = version_curves(_jsonl(workdir / "versions" / v.id / "metrics.jsonl"))
    if not any(c.values()):
      continue
    out.append(f'<h3>{_e(v.id)} {_status(v.status)}</h3><div class="curves">' +
               svg_chart({"reward": c["reward"], "BC": c["bc"]},
                         f"{v.id}: proxy reward and BC per step") +
               svg_chart({"held-out avg8": c["heldout avg8"]},
                         f"{v.id}: held-out Avg@8 per eval") + "</div>")
  return "".join(out) or '<p class="muted">No metrics.jsonl under versions/ yet.</p>'


def _summary(workdir: pathlib.Path) -> Mapping:
  try:
    summary = json.loads((workdir / "summary.json").read_text(encoding="utf-8"))
  except (OSError, json.JSONDecodeError, UnicodeDecodeError):
    return {}
  return summary if isinstance(summary, Mapping) else {}


def _sweep_rows(ledger: Ledger, workdir: pathlib.Path) -> list:
  rows = ledger.get_meta("sweep/table") or _summary(workdir).get("sweep") or []
  return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def _sweep(rows: Sequence[Mapping]) -> str:
  """The sweep's variants ranked by held-out Avg@8, with the verdicts behind each status."""
  head = ("#", "variant", "status", "held-out avg8", "diff vs parent [CI]", "proxy",
          "validators", "backtest", "bindings", "reason")
  body = []
  for r in rows:
    held = _heldout_text({"avg8": r.get("heldout_avg8"), "noise": r.get("noise")})
    ci = (f"{_num(r.get('diff'))} [{_num(r.get('lo'))}, {_num(r.get('hi'))}]"
          if _num(r.get("diff")) else "")
    validators = r.get("validators") if isinstance(r.get("validators"), Mapping) else {}
    body.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
        _e(r.get("rank")), f"<code>{_e(r.get('variant'))}</code>",
        _status(str(r.get("status", ""))), _e(held), _e(ci), _e(_num(r.get("proxy_reward"))),
        "<br>".join(_e(f"{k}: {v}") for k, v in validators.items()),
        _json_cell(r.get("backtest")) if r.get("backtest") else "",
        "<br>".join(f"<code>{_e(b)}</code>" for b in r.get("bindings") or ()) or
        '<span class="muted">control</span>', _e(r.get("reason")))) + "</tr>")
  return ("<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" +
          "".join(body) + "</table>")


def _header(workdir: pathlib.Path, versions: Sequence, incumbent: Optional[str]) -> str:
  summary = _summary(workdir)
  facts = [("run directory", str(workdir)), ("versions", len(versions)),
           ("incumbent", incumbent or "none"),
           ("generated", time.strftime("%Y-%m-%d %H:%M:%S"))]
  facts += [(k, summary[k]) for k in ("mode", "wall_s", "generations", "harness", "parent",
                                      "steps")
            if k in summary]
  return ("<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
          + "</table>")


def _overview(versions: Sequence[VersionRecord], test: Mapping[str, Mapping]) -> str:
  """Every version's score against the cumulative RL steps of its lineage: validation
  (what the controller selected on) and test (reported only), kept and rejected."""
  by_id = {v.id: v for v in versions}

  def cumulative(v: VersionRecord) -> float:
    total, seen = 0.0, set()
    while v is not None and v.id not in seen:
      seen.add(v.id)
      total += float(v.metrics.get("steps") or 0)
      v = by_id.get(v.parent)
    return total

  series: dict = {"validation, kept": [], "validation, rejected": [],
                  "test, kept": [], "test, rejected": []}
  at: dict = {}  # (version, 'validation' | 'test') -> its point
  for v in versions:
    side = "kept" if v.status in ("kept", "merged") else "rejected"
    x = cumulative(v)
    val = v.heldout.get("avg8")
    if isinstance(val, (int, float)) and val == val:
      at[v.id, "validation"] = (x, float(val))
    t = (test.get(v.id) or {}).get("avg8")
    if isinstance(t, (int, float)):
      at[v.id, "test"] = (x, float(t))
    for split in ("validation", "test"):
      if (v.id, split) in at:
        series[f"{split}, {side}"].append(at[v.id, split])
  edges = [(at[v.parent, split], at[v.id, split]) for v in versions
           for split in ("validation", "test")
           if (v.id, split) in at and (v.parent, split) in at]
  return svg_chart(series, "avg8 vs cumulative RL steps (every version, joined to its "
                   "parent)", width=720, height=260, points=True, edges=edges)


def _infra(rows: Mapping[str, list]) -> str:
  """Training attempts that failed for infrastructure reasons (evotrainer/infra.py)."""
  out = ["<table><tr><th>version</th><th>attempt</th><th>kind</th><th>message</th></tr>"]
  for key, failures in rows.items():
    for i, f in enumerate(failures):
      out.append(f"<tr><td><code>{_e(key.rsplit('/', 1)[-1])}</code></td><td>{i + 1}</td>"
                 f"<td>{_e(str(f.get('kind', '')))}</td>"
                 f"<td>{_e(str(f.get('message', ''))[:300])}</td></tr>")
  return "".join(out) + "</table>"


# ------------------------------------------------------------------ entry point


def _validators(versions: Sequence[VersionRecord]) -> str:
  """Per active validator, the versions it passed, failed, and could not judge for lack
  of evidence ('not applicable': never counted as passed)."""
  counts: dict = {}
  for v in versions:
    for name, state in (v.heldout.get("validators") or {}).items():
      counts.setdefault(name, {"pass": [], "fail": [], "n/a": []}).setdefault(
          state, []).append(v.id)
  if not counts:
    return "<p>No version was judged by a validator.</p>"
  rows = "".join(
      f"<tr><td>{_e(name)}</td><td>{len(c['pass'])}</td><td>{len(c['fail'])}"
      f"{' (' + _e(', '.join(c['fail'])) + ')' if c['fail'] else ''}</td>"
      f"<td>{len(c['n/a'])}</td></tr>" for name, c in sorted(counts.items()))
  return ("<table><tr><th>validator</th><th>passed</th><th>failed</th>"
          "<th>not applicable (no evidence)</th></tr>" + rows + "</table>")


def _gate(summary: Mapping) -> str:
  """The promotion gate against the test split (summary.json `gate`)."""
  g = summary.get("gate") if isinstance(summary.get("gate"), Mapping) else None
  if not g or not g.get("decided"):
    return "<p>No decided branch has test scores to judge the gate with.</p>"
  pct = lambda x: "—" if x is None else f"{100 * x:.0f}%"  # noqa: E731
  rows = "".join(
      f"<tr><td>{_e(b.get('version'))}</td><td>{_e(b.get('reference'))}</td>"
      f"<td>{_num(b.get('test_diff'))} [{_num(b.get('test_lo'))}, {_num(b.get('test_hi'))}]</td>"
      f"<td>{'yes' if b.get('truly_better') else 'no'}</td>"
      f"<td>{'kept' if b.get('kept') else 'not kept'}</td></tr>"
      for b in g.get("branches", []) if isinstance(b, Mapping))
  return (f"<p>{g['decided']} decided branches; {g['truly_better']} truly better than their "
          f"reference on the test split (paired 95% interval above 0), "
          f"{g['kept_truly_better']} of them kept: power {pct(g.get('power'))}, false "
          f"rejection rate {pct(g.get('false_rejection_rate'))}, false acceptance rate "
          f"{pct(g.get('false_acceptance_rate'))}.</p>"
          "<table><tr><th>branch</th><th>reference</th><th>test diff [95% CI]</th>"
          "<th>truly better</th><th>gate</th></tr>" + rows + "</table>")


def render_html(workdir: str | os.PathLike, ledger: Ledger) -> str:
  """The report page of the run in `workdir` as a string."""
  workdir = pathlib.Path(workdir)
  versions = ledger.versions()
  inc = ledger.incumbent()
  incumbent = inc.id if inc else None
  changes = {d.version_id: (d.intervention or {}).get("description", "")
             for d in ledger.decisions()
             if d.version_id and isinstance(d.intervention, Mapping)}
  sweep = _sweep_rows(ledger, workdir)
  test = read_test_scores(workdir)
  sections = [("Overview", _overview(versions, test)),
              ("Run", _header(workdir, versions, incumbent)),
              ("Lineage", _lineage(versions, changes, incumbent, test)),
              *([("Sweep", _sweep(sweep))] if sweep else []),
              ("Metric curves", _curves(versions, workdir)),
              ("Findings", _findings(ledger, versions, workdir)),
              ("Validators", _validators(versions)),
              ("Promotion gate against the test split", _gate(_summary(workdir))),
              ("Decision records", _decisions(ledger)),
              ("Skills", _skills(ledger, workdir))]
  infra_rows = ledger.meta_items("controller/infra/")
  if infra_rows:  # apart from the verdicts: these attempts say nothing about their change
    sections.insert(3, ("Infrastructure failures (not evidence)", _infra(infra_rows)))
  return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          f"<title>EvoTrainer report: {_e(workdir.name)}</title><style>{_CSS}</style>"
          "</head><body><h1>EvoTrainer run report</h1>" +
          "".join(f"<h2>{_e(t)}</h2>{body}" for t, body in sections) + "</body></html>\n")


def render_report(workdir: str | os.PathLike, ledger: Optional[Ledger] = None) -> pathlib.Path:
  """Writes `<workdir>/report.html` (atomically) and returns its path.

  Args:
    workdir: the run directory (`ledger.sqlite`, `summary.json`, `versions/`, `skills/`).
    ledger: the run's open ledger (the controller passes its own); by default
      `<workdir>/ledger.sqlite` is opened and closed here.

  Raises:
    FileNotFoundError: `workdir` has no ledger.sqlite (and none was given).
    LedgerError: the ledger cannot be read (another schema version, not a ledger).
  """
  workdir = pathlib.Path(workdir)
  own = ledger is None
  if own:
    path = workdir / "ledger.sqlite"
    if not path.is_file():
      raise FileNotFoundError(f"{path}: no ledger, so no report; is {workdir} an "
                              f"EvoTrainer run directory (--workdir of an evolve run)?")
    ledger = Ledger(path)
  try:
    page = render_html(workdir, ledger)
  finally:
    if own:
      ledger.close()
  out = workdir / REPORT_NAME
  atomic.write_text(out, page)
  return out


__all__ = ["REPORT_NAME", "render_html", "render_report", "svg_chart", "version_curves"]
