"""The compile-depth bench on the CPU at a tiny size: it runs and writes its JSON."""

import json

import pytest

from bench import compile_depth


@pytest.mark.slow
def test_compile_depth_script_runs_tiny(tmp_path):
  out = tmp_path / "depth.json"
  result = compile_depth.main(["--layers", "1,2", "--batch", "1", "--length", "8",
                               "--json", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(result))
  rows = result["results"]
  assert [(r["num_layers"], r["scan_layers"]) for r in rows] == [
      (1, False), (1, True), (2, False), (2, True)]
  assert all(r["forward_s"] > 0 and r["grad_s"] > 0 for r in rows)
