"""A toy library with its own pytest tests, written in tmp (fast SWE tests), a suite
runner on sandbox cells shared by the session, and the toy library's synthesized tasks."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from evotrainer import sandbox
from evotrainer.tasks.swe import runner as runner_lib
from evotrainer.tasks.swe import synth
from evotrainer.tasks.swe.records import Mutation, SweTask
from evotrainer.tasks.swe.sources import Source

TOY_LIB = textwrap.dedent('''\
    """A toy library."""


    def add(a, b):
        return a + b


    def clamp(x, lo, hi):
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x


    def total(items):
        s = 0
        for item in items:
            s += item
        return s


    def scale(values, factor):
        return [v * factor for v in values]
    ''')

TOY_TESTS = textwrap.dedent('''\
    from toylib import add, clamp, scale, total


    def test_add():
        assert add(2, 3) == 5


    def test_add_negative():
        assert add(-1, 1) == 0


    def test_clamp_low():
        assert clamp(-5, 0, 10) == 0


    def test_clamp_high():
        assert clamp(50, 0, 10) == 10


    def test_clamp_mid():
        assert clamp(5, 0, 10) == 5


    def test_total():
        assert total([1, 2, 3]) == 6


    def test_scale():
        assert scale([1, 2], 3) == [3, 6]
    ''')

TOY = Source("toylib", "0.1.0", "toylib-0.1.0.tar.gz", "0" * 64, ("toylib",), ("tests",))
TOY_TEST_IDS = {f"tests/test_toylib.py::{name}" for name in (
    "test_add", "test_add_negative", "test_clamp_low", "test_clamp_high", "test_clamp_mid",
    "test_total", "test_scale")}
# A bug planted by hand in the toy library: `add` subtracts. test_add (2 - 3 != 5) and
# test_add_negative (-1 - 1 != 0) fail; nothing else calls `add`.
ADD_F2P = ("tests/test_toylib.py::test_add", "tests/test_toylib.py::test_add_negative")
ADD_TASK = SweTask(
    instance_id="toylib-add", repo="toylib==0.1.0", base="", problem_statement="add is wrong",
    FAIL_TO_PASS=ADD_F2P, PASS_TO_PASS=tuple(sorted(TOY_TEST_IDS - set(ADD_F2P))),
    mutation=Mutation("toylib/__init__.py", "add", "operator_swap", 5, "return a + b",
                      "return a - b"))


def write_toy(root: pathlib.Path) -> pathlib.Path:
  (root / "toylib").mkdir(parents=True)
  (root / "toylib" / "__init__.py").write_text(TOY_LIB)
  (root / "tests").mkdir()
  (root / "tests" / "test_toylib.py").write_text(TOY_TESTS)
  (root / "pyproject.toml").write_text('[project]\nname = "toylib"\nversion = "0.1.0"\n')
  return root


def write_toy_manifest(path: pathlib.Path) -> str:
  """A sources manifest naming only the toy library (its tree is given, never fetched)."""
  path.write_text(json.dumps({"sources": [{
      "name": TOY.name, "version": TOY.version, "sdist": TOY.sdist, "sha256": TOY.sha256,
      "package": list(TOY.package), "tests": list(TOY.tests)}]}))
  return str(path)


def launch_on_toy(tmp_path: pathlib.Path, gin_file: str, *bindings: str,
                  timeout: int = 900, tiny: bool = True) -> subprocess.CompletedProcess:
  """`python -m evotrainer.launch --gin_file=<gin_file> --gin_file=gin/tiny.gin` on the
  toy library (its tree and manifest written in `tmp_path`, caches there too; 8 tasks
  split 4/2/2), workdir `tmp_path/run`; `bindings` are added last. `tiny=False` keeps
  the gin file's own policy (no gin/tiny.gin)."""
  tree = write_toy(tmp_path / "toylib-0.1.0")
  manifest = write_toy_manifest(tmp_path / "manifest.json")
  toy = [
      "SweDomain.sources = ['toylib']", f"SweDomain.manifest = '{manifest}'",
      f"SweDomain.trees = {{'toylib': '{tree}'}}", "SweDomain.max_tasks = 8",
      "SweDomain.max_candidates = 16", "SweDomain.fractions = (0.5, 0.25, 0.25)",
      f"SweDomain.cache_dir = '{tmp_path}/swe'",
      f"make_tokenizer.cache_dir = '{tmp_path}/tok'",
      f"warm_start.cache_dir = '{tmp_path}/ws'", "warm_start.batch_size = 4"]
  repo = pathlib.Path(__file__).resolve().parents[3]
  return subprocess.run(
      [sys.executable, "-m", "evotrainer.launch", f"--gin_file={gin_file}",
       *(["--gin_file=gin/tiny.gin"] if tiny else []), f"--workdir={tmp_path / 'run'}",
       *[f"--gin_bindings={b}" for b in (*toy, *bindings)]],
      cwd=repo, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def toy_tree(tmp_path_factory) -> pathlib.Path:
  return write_toy(tmp_path_factory.mktemp("toy") / "toylib-0.1.0")


@pytest.fixture(scope="session")
def suite():
  try:
    sandbox.check_namespaces()
  except sandbox.SandboxUnavailable as e:
    pytest.skip(str(e))
  with runner_lib.SuiteRunner(workers=2, timeout_s=60) as s:
    yield s


@pytest.fixture(scope="module")
def toy_tasks(toy_tree, suite):
  """Tasks synthesized on the toy library (at least 6; a few seconds)."""
  tasks, stats = synth.synthesize(TOY, toy_tree, suite,
                                  synth.SynthConfig(max_tasks=12, max_candidates=40))
  assert len(tasks) >= 6, stats
  return tasks
