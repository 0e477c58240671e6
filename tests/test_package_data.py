"""A non-editable install finds every data file the code reads.

The package is installed with pip into a temporary `--target` directory from a copy of
the source tree, then a script runs in a fresh interpreter whose working directory is
outside the repository and whose `sys.path` puts that directory first (ahead of the
editable install). It loads the SWE sources manifest, the canaries, the seed skills and
gin/math.gin through the package's own search paths, and builds a math, a code and a
SWE task the way a run does (nothing fetched, nothing run in the sandbox).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""\
    import json, pathlib, sys, tempfile

    import gin

    import evotrainer
    from evotrainer import registry
    from evotrainer.evolution import skills
    from evotrainer.tasks.code.task import CodeTask
    from evotrainer.tasks.math import canaries
    from evotrainer.tasks.math.task import MathTask
    from evotrainer.tasks.swe import sources, synth, task as swe_task

    out = {"package": evotrainer.__file__}
    out["manifest"] = [s.name for s in sources.load_manifest()]
    out["tinydb"] = sources.find_source("tinydb").version
    path = canaries.default_canary_file(["tiny_arithmetic"], 1)
    out["canaries"] = [str(path), len(canaries.load_canaries(path))]
    with tempfile.TemporaryDirectory() as d:
      library = skills.SkillLibrary.seeded(d)
      out["skills"] = [str(skills.SEED_DIR), len(library)]
    registry.parse(["math.gin"], finalize=False)
    out["gin_mode"] = gin.query_parameter("run.mode")
    math = MathTask(sources=["tiny_arithmetic"], difficulty=1, num_validation=4)
    problem = math.heldout_problems()[0]
    out["math"] = math.score(problem, "\\boxed{" + problem.answer + "}")["correct"]
    out["code"] = len(CodeTask(num_validation=2, num_test=2).heldout_problems())
    try:
      swe_task.build_task_set(["not_a_source"], synth.SynthConfig(), suite=None,
                              cache_dir=tempfile.mkdtemp())
    except ValueError as e:
      out["swe"] = str(e)
    print(json.dumps(out))
    """)


def _copy_source(dst: pathlib.Path) -> None:
  """The files pip builds from (a copy: the build writes build/ and *.egg-info)."""
  skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
  dst.mkdir()
  for name in ("setup.py", "README.md"):
    if (REPO / name).exists():
      shutil.copy(REPO / name, dst / name)
  for name in ("evotrainer", "gin"):
    shutil.copytree(REPO / name, dst / name, ignore=skip)


def _data_files(root: pathlib.Path) -> set:
  """The files under `root` that are not Python code, relative to it."""
  return {p.relative_to(root).as_posix() for p in root.rglob("*")
          if p.is_file() and p.suffix not in (".py", ".pyc")}


def _install(tmp_path: pathlib.Path) -> pathlib.Path:
  src, target = tmp_path / "src", tmp_path / "site"
  _copy_source(src)
  done = subprocess.run(
      [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
       "--no-build-isolation", "--target", str(target), str(src)],
      capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-4000:]
  return target


def test_non_editable_install_finds_every_data_file(tmp_path):
  target = _install(tmp_path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {**os.environ, "PYTHONPATH": str(target), "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=elsewhere, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-4000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  installed = str(target / "evotrainer")
  assert out["package"].startswith(installed), out["package"]
  assert out["manifest"] == ["xmltodict", "parse", "tinydb"]
  assert out["tinydb"] == "4.9.0"
  assert out["canaries"][0].startswith(installed) and out["canaries"][1] == 128
  seeds = sorted((REPO / "evotrainer" / "evolution" / "seed_skills").glob("*.json"))
  assert out["skills"] == [str(target / "evotrainer" / "evolution" / "seed_skills"),
                           len(seeds)]
  assert out["gin_mode"] == "evolve"
  assert out["math"] == 1.0
  assert out["code"] == 2
  assert "not_a_source" in out["swe"] and "tinydb" in out["swe"], out["swe"]
  # Every data file of the source tree is installed (a new one must be package data).
  src = tmp_path / "src"
  assert not _data_files(src / "evotrainer") - _data_files(target / "evotrainer")
  assert not _data_files(src / "gin") - _data_files(target / "evotrainer" / "_gin")
