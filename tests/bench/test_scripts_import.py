"""Every benchmark script imports: a helper it names still exists where it looks."""

import importlib
import pathlib

import pytest

SCRIPTS = sorted(p.stem for p in (pathlib.Path(__file__).resolve().parents[2] / "bench").glob(
    "*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports(name):
  module = importlib.import_module(f"bench.{name}")
  assert module.__file__.endswith(f"{name}.py")
