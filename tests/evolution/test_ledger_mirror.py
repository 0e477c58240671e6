"""The ledger of a gs:// workdir: a local copy uploaded after every commit, never losing a
commit to a crash between the commit and its upload (tests/fake_gcs.py stands in for GCS)."""

import json
import os
import sqlite3
import subprocess
import sys

import gin
import pytest

from evotrainer import paths
from evotrainer.evolution.ledger import COMMITS_KEY, Ledger, LedgerError
from evotrainer.evolution.ledger.mirror import ledger_exists, open_ledger
from tests.fake_gcs import fake_gcs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
URL = "gs://b/run"


def _meta(path, key):
  """A meta value read straight from an SQLite file (no Ledger involved)."""
  conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
  try:
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
  finally:
    conn.close()
  return None if row is None else json.loads(row[0])


@pytest.fixture
def env(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  gin.clear_config()
  with fake_gcs(tmp_path / "bucket") as root:
    yield root, tmp_path
  gin.clear_config()
  assert not os.path.exists(tmp_path / "gs:")


def _host(tmp_path, name):
  """Acts as the host `name`: its own mirror directory."""
  gin.bind_parameter("workdir_mirror.directory", str(tmp_path / name))
  return tmp_path / name


def test_local_workdir_ledger_is_the_file_in_the_workdir(tmp_path):
  with open_ledger(tmp_path / "w") as ledger:
    ledger.set_meta("x/a", 1)
  assert ledger_exists(tmp_path / "w")
  assert _meta(tmp_path / "w" / "ledger.sqlite", "x/a") == 1
  assert _meta(tmp_path / "w" / "ledger.sqlite", COMMITS_KEY) is None  # not counted
  assert sorted(os.listdir(tmp_path)) == ["w"]


def test_every_commit_is_uploaded_and_another_host_fetches_it(env):
  root, tmp = env
  h1 = _host(tmp, "host1")
  with open_ledger(URL) as ledger:
    assert ledger.root == URL
    assert _meta(root / "b/run/ledger.sqlite", "schema_version") is not None  # new: uploaded
    ledger.set_meta("x/a", 1)
    assert _meta(root / "b/run/ledger.sqlite", "x/a") == 1
    ledger.set_meta("x/b", 2)
  assert _meta(root / "b/run/ledger.sqlite", "x/b") == 2
  assert _meta(h1 / "ledger.sqlite", COMMITS_KEY) == 3  # creation + two writes
  assert ledger_exists(URL)
  _host(tmp, "host2")  # no local copy: fetched; it continues the count
  with open_ledger(URL) as ledger:
    assert ledger.get_meta("x/b") == 2
    ledger.set_meta("x/c", 3)
  assert _meta(root / "b/run/ledger.sqlite", COMMITS_KEY) == 4
  _host(tmp, "host1")  # its copy is behind, with nothing left to upload: fetched
  with open_ledger(URL) as ledger:
    assert ledger.get_meta("x/c") == 3


_CRASH = """
import os, sys
sys.path.insert(0, {repo!r})
import gin
from evotrainer import paths
from evotrainer.evolution.ledger.mirror import open_ledger
from tests.fake_gcs import fake_gcs
gin.bind_parameter("workdir_mirror.directory", {mirror!r})
with fake_gcs({root!r}):
  ledger = open_ledger({url!r})
  ledger.set_meta("x/a", 1)
  paths.write_atomic = lambda *a, **k: os._exit(7)  # dies after the commit, before the upload
  ledger.set_meta("x/b", 2)
"""


def test_a_crash_between_commit_and_upload_loses_nothing(env):
  root, tmp = env
  mirror = _host(tmp, "host1")
  code = _CRASH.format(repo=REPO, mirror=str(mirror), root=str(root), url=URL)
  proc = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True,
                        timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 7, proc.stderr[-2000:]
  assert _meta(root / "b/run/ledger.sqlite", "x/a") == 1
  assert _meta(root / "b/run/ledger.sqlite", "x/b") is None  # never uploaded
  with open_ledger(URL) as ledger:  # the same host relaunches: its copy wins, is uploaded
    assert ledger.get_meta("x/b") == 2
  assert _meta(root / "b/run/ledger.sqlite", "x/b") == 2


def test_diverged_copies_are_refused_and_both_kept(env):
  root, tmp = env
  h1 = _host(tmp, "host1")
  with open_ledger(URL) as ledger:
    ledger.set_meta("x/a", 1)
  # host1 commits without uploading (its upload fails), and host2 advances the workdir.
  saved = paths.write_atomic
  paths.write_atomic = lambda *a, **k: (_ for _ in ()).throw(OSError("network down"))
  try:
    with open_ledger(URL) as ledger:
      ledger.set_meta("x/local", 1)  # logged, kept locally
  finally:
    paths.write_atomic = saved
  _host(tmp, "host2")
  with open_ledger(URL) as ledger:
    ledger.set_meta("x/remote", 1)
    ledger.set_meta("x/remote2", 1)
  remote_before = (root / "b/run/ledger.sqlite").read_bytes()
  _host(tmp, "host1")
  with pytest.raises(LedgerError, match=r"1 commit\(s\) never uploaded.*both were kept"):
    open_ledger(URL)
  assert (root / "b/run/ledger.sqlite").read_bytes() == remote_before
  assert _meta(h1 / "ledger.sqlite", "x/local") == 1


def test_ledger_root_keeps_relative_paths_against_the_workdir(env):
  _, tmp = env
  _host(tmp, "host1")
  with open_ledger(URL) as ledger:
    assert isinstance(ledger, Ledger) and ledger.resolve("versions/v1/model") == \
        URL + "/versions/v1/model"


def test_ledger_mode_prints_a_gs_workdirs_ledger_from_another_host(env, capsys):
  from evotrainer.run import run
  _, tmp = env
  _host(tmp, "host1")
  with open_ledger(URL) as ledger:
    ledger.add_version("v0", status="kept")
  _host(tmp, "host2")
  capsys.readouterr()
  assert run(URL, mode="ledger", task=None) == {}
  assert "v0" in capsys.readouterr().out
  with pytest.raises(FileNotFoundError, match="no ledger.sqlite in gs://b/other"):
    run("gs://b/other", mode="ledger", task=None)


def _files(directory):
  """{relative path: bytes} of every file under `directory`."""
  return {p.relative_to(directory).as_posix(): p.read_bytes()
          for p in directory.rglob("*") if p.is_file()}


def test_run_files_are_uploaded_before_the_ledger_and_fetched_on_another_host(env):
  """An evolution's mirror (open_ledger(run_files=True)): a commit uploads the changed run
  files first, so the bucket's ledger never names a file the bucket lacks; another host
  starts from the bucket alone; a host whose mirror fell behind gets the bucket's files."""
  root, tmp = env
  run = root / "b/run"
  h1 = _host(tmp, "host1")
  with open_ledger(URL, run_files=True) as ledger:
    assert ledger.root == str(h1)
    (h1 / "versions/v0/model").mkdir(parents=True)
    (h1 / "versions/v0/model/w").write_bytes(b"weights")
    ledger.add_version("v0", checkpoint=str(h1 / "versions/v0/model"))
    assert (run / "versions/v0/model/w").read_bytes() == b"weights"
    (h1 / "summary.json").write_text("{}")  # after the last commit: the end pushes it
  assert not (run / "summary.json").exists()
  from evotrainer.evolution.ledger.mirror import push_run_files
  push_run_files(URL)
  assert (run / "summary.json").read_text() == "{}"
  # The ledger's bookkeeping, the lock and the mirror's state stay local.
  assert sorted(_files(run)) == ["ledger.sqlite", "summary.json", "versions/v0/model/w"]
  uploads = (run / "summary.json").stat().st_mtime_ns
  push_run_files(URL)  # a relaunch uploads nothing unchanged (mirror_state.json)
  assert (run / "summary.json").stat().st_mtime_ns == uploads

  h2 = _host(tmp, "host2")
  with open_ledger(URL, run_files=True) as ledger:
    assert ledger.version("v0").checkpoint == str(h2 / "versions/v0/model")
    assert (h2 / "versions/v0/model/w").read_bytes() == b"weights"
    (h2 / "summary.json").write_text('{"generation": 1}')
    ledger.set_meta("controller/generation", 1)
  # Host 1 resumes: its summary is stale and replaced; its own leftovers are removed.
  (h1 / "versions/v9").mkdir()
  (h1 / "versions/v9/branch.log").write_text("stale")
  _host(tmp, "host1")
  with open_ledger(URL, run_files=True) as ledger:
    assert ledger.get_meta("controller/generation") == 1
  assert (h1 / "summary.json").read_text() == '{"generation": 1}'
  assert not (h1 / "versions/v9").exists()
  assert {k: v for k, v in _files(h1).items() if not k.startswith(("ledger", "mirror_"))} \
      == {k: v for k, v in _files(run).items() if k != "ledger.sqlite"}


def test_a_failed_run_file_upload_holds_back_the_ledger(env, monkeypatch):
  """The bucket's ledger never names a file the bucket lacks: while a run file cannot be
  uploaded, the ledger is not uploaded either; the next commit uploads both."""
  root, tmp = env
  run = root / "b/run"
  h1 = _host(tmp, "host1")
  real = paths.write_atomic

  def flaky(path, data):
    if str(path).endswith("/w"):
      raise OSError("network down")
    real(path, data)

  with open_ledger(URL, run_files=True) as ledger:
    ledger.set_meta("x/a", 1)
    before = (run / "ledger.sqlite").read_bytes()
    (h1 / "versions/v0/model").mkdir(parents=True)
    (h1 / "versions/v0/model/w").write_bytes(b"weights")
    monkeypatch.setattr(paths, "write_atomic", flaky)
    ledger.add_version("v0", checkpoint=str(h1 / "versions/v0/model"))
    assert (run / "ledger.sqlite").read_bytes() == before  # held back with its file
    assert not (run / "versions/v0/model/w").exists()
    monkeypatch.setattr(paths, "write_atomic", real)
    ledger.set_meta("x/b", 2)
  assert (run / "versions/v0/model/w").read_bytes() == b"weights"
  copy = tmp / "copy.sqlite"
  copy.write_bytes((run / "ledger.sqlite").read_bytes())
  assert _meta(copy, "x/b") == 2 and _meta(copy, "x/a") == 1
