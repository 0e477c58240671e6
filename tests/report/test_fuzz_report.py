"""Property test: the run report renders any model text in findings, escaped and valid
UTF-8 (issue 17). Budget: tests/fuzz_text.py."""

import html
import json
import pathlib
import re
import tempfile

from hypothesis import example, given

from evotrainer.evolution.ledger import Ledger
from evotrainer.harness.base import printable
from evotrainer.report.html import render_html
from tests.fuzz_text import FUZZ, model_text, within

CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")


@FUZZ
@given(model_text(), model_text())
@example("<script>alert(1)</script>\x00\ud800", "\x1b[31m</pre>")
def test_findings_with_any_text_render(evidence, message):
  with tempfile.TemporaryDirectory() as tmp:
    workdir = pathlib.Path(tmp)
    with Ledger(workdir / "ledger.sqlite") as ledger:
      ledger.add_version("v0", parent=None, bindings={}, status="kept", reason="root")
      findings = workdir / "versions/v0/findings.jsonl"
      findings.parent.mkdir(parents=True)
      row = {"step": 1, "kind": "repetition", "layer": "behaviour", "severity": 0.5,
             "value": 0.2, "threshold": 0.05, "message": message,
             "evidence": [["v0/train/1/0", evidence]]}
      findings.write_text(json.dumps(row) + "\n")  # JSON escapes hold any text
      with within(what="render_html"):
        page = render_html(workdir, ledger)
  page.encode("utf-8")  # a lone surrogate would raise here, and in render_report's write
  assert "<script" not in page  # the page has no scripts; the text's markup is escaped
  assert not CONTROL.search(page)
  assert html.escape(printable(message), quote=True) in page  # shown, escaped
