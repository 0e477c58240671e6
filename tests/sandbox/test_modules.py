"""`Cell(modules=...)`: host modules bound read-only for the runs (the SWE domain runs
a repository's pytest suite in a cell), and nothing else of site-packages."""

from __future__ import annotations

import pytest

from evotrainer import sandbox
from evotrainer.sandbox import cell as cell_lib

PYTEST = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "pygments")


def test_bound_modules_import_and_stay_read_only(namespaces):
  probe = (
      "import os, pytest, pluggy\n"
      "print(pytest.__file__)\n"
      "try:\n  import numpy\n  print('numpy visible')\nexcept ImportError:\n"
      "  print('numpy hidden')\n"
      "try:\n  open(os.path.join(os.path.dirname(pytest.__file__), 'x.py'), 'w')\n"
      "  print('lib writable')\nexcept OSError:\n  print('lib read-only')\n")
  with sandbox.Cell(modules=PYTEST) as cell:
    result = cell.run(probe)
  assert result.ok, result.stderr
  lines = result.stdout.split()
  assert lines[0] == f"{cell_lib.CELL_LIB}/pytest/__init__.py"
  assert lines[1:] == ["numpy", "hidden", "lib", "read-only"]


def test_runs_a_pytest_suite_on_files(namespaces):
  files = {"mod.py": "def inc(x):\n  return x + 1\n",
           "tests/test_mod.py": "from mod import inc\n"
                                "def test_ok():\n  assert inc(1) == 2\n"
                                "def test_bad(tmp_path):\n  (tmp_path / 'f').write_text('x')\n"
                                "  assert inc(2) == 4\n"}
  driver = ("import sys\nsys.dont_write_bytecode = True\nimport pytest\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests']))\n")
  with sandbox.CellPool(1, modules=PYTEST) as pool:
    result = pool.run(driver, files=files, timeout_s=30)
  assert result.exit_code == 1  # pytest: some tests failed
  assert "1 failed, 1 passed" in result.stdout
  assert "assert 3 == 4" in result.stdout


def test_unknown_module_is_refused():
  with pytest.raises(sandbox.SandboxError, match="no_such_module_xyz"):
    sandbox.Cell(modules=("no_such_module_xyz",))
  with pytest.raises(sandbox.SandboxError, match="top-level"):
    sandbox.Cell(modules=("os.path",))


def test_rlimits_only_fallback_finds_bound_modules(tmp_path, monkeypatch):
  # A module of our own, world-readable (as root, the fallback's runs cannot read an
  # interpreter installed under /root, so pytest itself is no probe here).
  (tmp_path / "evo_probe_mod.py").write_text("VALUE = 42\n")
  tmp_path.chmod(0o755)
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.warns(RuntimeWarning, match="WITHOUT namespaces"):
    with sandbox.Cell(rlimits_only=True, modules=("evo_probe_mod",)) as cell:
      result = cell.run("import sys, evo_probe_mod\n"
                        "print(sys.path[1].endswith('_lib'), evo_probe_mod.VALUE)")
  assert result.ok, result.stderr
  assert result.stdout.split() == ["True", "42"]
