"""bench.common: the versions every benchmark JSON records, stored runs, child processes."""

from __future__ import annotations

import json
import os
import platform
import sys

import flax
import jax
import numpy as np
import optax
import pytest

from bench import common


def test_packages_are_the_installed_versions():
  got = common.packages()
  assert got["python"] == platform.python_version()
  assert got["jax"] == jax.__version__ and got["numpy"] == np.__version__
  assert got["flax"] == flax.__version__ and got["optax"] == optax.__version__
  assert set(got) == {"python", *common.PACKAGES}


def test_a_package_that_is_not_installed_is_none(monkeypatch):
  monkeypatch.setattr(common, "PACKAGES", ("jax", "no-such-package-evotrainer"))
  got = common.packages()
  assert got["no-such-package-evotrainer"] is None and got["jax"] == jax.__version__


def test_extra_packages_are_recorded_too():
  got = common.packages(("no-such-package-evotrainer", "numpy"))
  assert got["no-such-package-evotrainer"] is None and got["numpy"] == np.__version__
  assert set(got) == {"python", *common.PACKAGES, "no-such-package-evotrainer"}


def _gin_repo(tmp_path, monkeypatch, base="x.y = 1\n"):
  from bench import common
  (tmp_path / "gin" / "model").mkdir(parents=True)
  (tmp_path / "gin" / "base.gin").write_text(base)
  (tmp_path / "gin" / "model" / "m.gin").write_text("m.n = 2\n")
  (tmp_path / "gin" / "arm.gin").write_text(
      "# an arm\ninclude 'base.gin'\ninclude 'model/m.gin'\n\narm.k = 3\n")
  monkeypatch.setattr(common, "REPO", tmp_path)
  return common


def test_gin_digest_hashes_each_file_and_its_includes_without_comments(tmp_path, monkeypatch):
  import hashlib
  common = _gin_repo(tmp_path, monkeypatch)
  sha = lambda text: hashlib.sha256(text.encode()).hexdigest()  # noqa: E731
  assert common.gin_digest(["gin/arm.gin"]) == {
      "gin/arm.gin": sha("include 'base.gin'\ninclude 'model/m.gin'\narm.k = 3"),
      "gin/base.gin": sha("x.y = 1"), "gin/model/m.gin": sha("m.n = 2")}
  before = common.gin_digest(["gin/arm.gin"])
  (tmp_path / "gin" / "base.gin").write_text("# reworded\nx.y = 1\n")
  assert common.gin_digest(["gin/arm.gin"]) == before
  with pytest.raises(FileNotFoundError, match="gin/none.gin"):
    common.gin_digest(["gin/none.gin"])


def test_a_stored_run_of_since_changed_gin_files_is_refused(tmp_path, monkeypatch):
  common = _gin_repo(tmp_path, monkeypatch)
  launched = []

  def fake_launch(gin_files, bindings, wd, log):
    launched.append(wd.name)
    return {"steps": 1}
  monkeypatch.setattr(common, "launch_run", fake_launch)
  wd = tmp_path / "runs" / "static-s0"
  assert common.run_or_read(["gin/arm.gin"], ["run.seed = 0"], wd, tmp_path / "l") == {
      "steps": 1}
  (wd / "summary.json").write_text(json.dumps({"steps": 1}))
  common.run_or_read(["gin/arm.gin"], ["run.seed = 0"], wd, tmp_path / "l")  # read back
  assert launched == ["static-s0"]
  (tmp_path / "gin" / "base.gin").write_text("x.y = 5\n")  # the method changed
  with pytest.raises(RuntimeError, match="gin files changed since: gin/base.gin"):
    common.run_or_read(["gin/arm.gin"], ["run.seed = 0"], wd, tmp_path / "l")
  # A record from before digests were kept is compared on the command alone.
  (wd / "bench_launch.json").write_text(json.dumps(
      {"gin_files": ["gin/arm.gin"], "bindings": ["run.seed = 0"]}))
  common.run_or_read(["gin/arm.gin"], ["run.seed = 0"], wd, tmp_path / "l")
  with pytest.raises(RuntimeError, match="another command"):
    common.run_or_read(["gin/arm.gin"], ["run.seed = 1"], wd, tmp_path / "l")


def test_merge_json_sets_keys_and_keeps_the_others(tmp_path):
  path = tmp_path / "sub" / "results.json"
  common.merge_json(path, {"a": 1})  # absent: created
  common.merge_json(path, {"b": {"x": 2.5}, "a": 3})
  assert json.loads(path.read_text()) == {"a": 3, "b": {"x": 2.5}}
  assert not (tmp_path / "sub" / "results.json.tmp").exists()


def test_cpu_model_reads_the_first_model_name(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 2.0GHz\n\n"
                  "processor\t: 1\nmodel name\t: Other\n")
  assert common.cpu_model(str(info)) == "Some CPU @ 2.0GHz"
  assert common.cpu_model(str(tmp_path / "absent")) == (platform.processor() or None)


def test_timed_each_compiles_all_first_then_rotates_the_timed_rounds(monkeypatch):
  """A fake clock: each call of f advances it by f's own durations, in call order."""
  clock = [0.0]
  monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
  durations = {"a": iter([10.0, 1.0, 3.0, 2.0]), "b": iter([20.0, 5.0, 4.0, 6.0])}
  calls = []

  def fn(name):
    def go():
      calls.append(name)
      clock[0] += next(durations[name])
      return name.upper()
    return go

  got = common.timed_each({"a": fn("a"), "b": fn("b")}, repeats=3)
  # First calls in order, then rounds a-b, b-a, a-b.
  assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
  assert got["a"] == (2.0, 10.0, "A")  # median of 1, 3, 2
  assert got["b"] == (5.0, 20.0, "B")  # median of 5, 4, 6


def test_a_long_child_shows_its_progress_line_every_heartbeat(tmp_path, capsys):
  child = ("import sys, time\n"
           "print('loading', flush=True); time.sleep(0.7)\n"
           "sys.stdout.write('[RL] 1/4 steps\\r[RL] 2/4 steps'); sys.stdout.flush()\n"
           "time.sleep(0.7); sys.exit(3)\n")
  log = tmp_path / "run.log"
  rc = common.run_logged([sys.executable, "-c", child], log, env=dict(os.environ),
                         label="static-s0", heartbeat_s=0.3)
  assert rc == 3
  beats = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[bench]")]
  assert "[bench] static-s0: 0 min, loading" in beats
  assert beats[-1] == "[bench] static-s0: 0 min, [RL] 2/4 steps"  # the bar's last redraw
  assert log.read_text().startswith("$ ") and "\nloading\n" in log.read_text()


def test_last_line_of_a_missing_or_empty_log_is_empty(tmp_path):
  assert common.last_line(tmp_path / "none.log") == ""
  (tmp_path / "empty.log").write_text("\n \n")
  assert common.last_line(tmp_path / "empty.log") == ""
