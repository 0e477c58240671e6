"""The ledger of a workdir, local or `gs://`.

SQLite needs a local disk (file locks, a WAL, fsync); an object store offers none of it.
So the ledger of a `gs://` workdir is a local file in the workdir's mirror
(evotrainer/paths.py, `workdir_mirror.directory`), and after every commit a consistent
snapshot of it (SQLite's backup API) is uploaded to `<workdir>/ledger.sqlite` in one
object write, which is atomic. The local commit comes first: a crash between a commit
and its upload loses nothing, and the next open on this host uploads it. A local
workdir's ledger is the file in the workdir, as always.

Which copy is newer. Every commit of a mirrored ledger counts up its meta key
`mirror_commits` (core.COMMITS_KEY); `ledger.sqlite.pushed` beside the local copy
records the count last uploaded. On open:

  no local copy                          the workdir's is fetched (or a new one created)
  local count >= the workdir's           the local copy is used (uploaded when ahead)
  the workdir's ahead, nothing of the
    local copy left to upload            the workdir's is fetched (a run on another host)
  both ahead of the last upload          LedgerError (diverged): both kept, none replaced

An upload that fails (network) is logged and retried with the next commit's snapshot; the
local file holds every commit meanwhile.

The run files of an evolution or a sweep (`open_ledger(workdir, run_files=True)`). Its
controller works in the mirror as in a local workdir: skills, summary.json, report.html
and every branch's `versions/<id>/` (the child's checkpoints, model, rollouts, logs and
branch_result.json) are written there, and the ledger stores their paths relative to it
(so that they name the same files in the workdir). Two rules keep the workdir whole:

* Before each ledger upload, every mirror file changed since its last upload is uploaded
  (`push_run_files`): the workdir's ledger never names a file the workdir lacks (a
  version's result is recorded only after its checkpoint exists). What is written after
  the last commit (the final summary and report) is uploaded at the end of the run.
* On open, after the ledger is settled as above, the mirror gets every workdir file it
  lacks: on a new host (an empty mirror) the whole run, checkpoints included. When the
  workdir's ledger was fetched as the newer copy (another host ran on; marked by
  `ledger.sqlite.stale` until the run files follow), the mirror's run files are stale
  and are replaced by the workdir's. The mirror's `mirror_state.json` records what
  was uploaded, so a relaunch uploads only what changed.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sqlite3
from evotrainer import paths
from evotrainer.evolution.ledger.core import COMMITS_KEY, Ledger, LedgerError
from evotrainer.workdir import LOCK_NAME, SEGMENTS_NAME

log = logging.getLogger(__name__)

LEDGER = "ledger.sqlite"
RUN_STATE = "mirror_state.json"  # what a run's mirror uploaded or fetched (paths.Mirror)


def ledger_exists(workdir: paths.PathLike) -> bool:
  """Whether `workdir` (local or gs://) holds a ledger."""
  return (paths.as_path(workdir) / LEDGER).is_file()


def record_segment(workdir: paths.PathLike) -> None:
  """Appends the newest row of `<workdir>/segments.jsonl` (a relaunch accepted as a new
  segment: workdir.check_fingerprint) to the ledger's `run/segments` meta, when the
  workdir holds a ledger (a local one that is not empty)."""
  wd = paths.as_path(workdir)
  ledger_path = wd / LEDGER
  if ledger_path.is_file() and (paths.is_remote(workdir) or ledger_path.stat().st_size > 0):
    row = json.loads((wd / SEGMENTS_NAME).read_text().splitlines()[-1])
    with open_ledger(workdir) as ledger:
      ledger.set_meta("run/segments", [*ledger.get_meta("run/segments", []), row])


def open_ledger(workdir: paths.PathLike, *, run_files: bool = False) -> Ledger:
  """The ledger of `workdir` (created when absent); see the module docstring.

  Args:
    workdir: a local directory or a gs:// URL.
    run_files: the ledger of an evolution or a sweep whose controller works in the
      mirror of a gs:// workdir: its paths are stored relative to the mirror, the mirror
      is completed from the workdir first, and every commit uploads the changed run files
      before the ledger (module docstring). Nothing changes for a local workdir.
  """
  if not paths.is_remote(workdir):
    return Ledger(pathlib.Path(os.path.expanduser(os.fspath(workdir))) / LEDGER)
  mirror = paths.Mirror(workdir, state=RUN_STATE if run_files else None)
  local, remote = mirror.local(LEDGER), mirror.target(LEDGER)
  pushed_file = mirror.local(LEDGER + ".pushed")
  pushed = json.loads(pushed_file.read_text())["commits"] if pushed_file.exists() else 0
  here = _commits(local) if local.exists() else None
  there = None
  stale = mirror.local(LEDGER + ".stale")  # run files behind the ledger: replace them
  if remote.exists():
    fetched = mirror.local(LEDGER + ".fetched")
    fetched.write_bytes(remote.read_bytes())
    there = _commits(fetched)
    if here is None or there > here:
      if here is not None and here > pushed:
        raise LedgerError(
            f"ledger of {workdir}: the local copy {local} holds {here - pushed} commit(s) "
            f"never uploaded, and the workdir's copy was advanced meanwhile (by a run on "
            f"another host?) to {there} commits; both were kept ({local}, {remote}): "
            f"choose one and remove the other (or use a new workdir)")
      for suffix in ("-wal", "-shm"):  # a stale WAL must never be applied to the new file
        local.with_name(local.name + suffix).unlink(missing_ok=True)
      os.replace(fetched, local)
      pushed_file.write_text(json.dumps({"commits": there}))
      stale.touch()
      log.info("ledger of %s: fetched the workdir's copy (%d commits)", workdir, there)
      here = there
    else:
      fetched.unlink()
  if run_files:
    n = mirror.pull(_local_only, replace=stale.exists())
    stale.unlink(missing_ok=True)
    if n:
      log.info("run files of %s: fetched %d file(s) into %s", workdir, n, mirror.dir)

  def upload(ledger: Ledger) -> None:
    if run_files and not _push(mirror):
      return  # the ledger waits for its files (retried with the next commit)
    _upload(ledger, mirror, pushed_file)

  ledger = Ledger(local, root=str(mirror.dir) if run_files else paths.resolve(workdir),
                  on_commit=upload)
  if here is not None and (there is None or here > there):
    upload(ledger)  # a crash came between a commit and its upload (a new file: uploaded)
  return ledger


def push_run_files(workdir: paths.PathLike) -> None:
  """Uploads the run files of `workdir`'s mirror changed since their last upload (the
  end of a run; every ledger commit does it too); nothing for a local workdir."""
  if paths.is_remote(workdir):
    _push(paths.Mirror(workdir, state=RUN_STATE))


def _local_only(name: str) -> bool:
  """Mirror files that are not run files: the ledger and its bookkeeping (uploaded by
  their own rule), the workdir lock, the mirror's state and half-fetched files."""
  top = name.split("/", 1)[0]
  return (top.startswith((LEDGER, "." + LEDGER, RUN_STATE)) or name.endswith(".fetch")
          or name.rsplit("/", 1)[-1] == LOCK_NAME)


def _push(mirror: paths.Mirror) -> bool:
  """Uploads the mirror's changed run files; False (logged) when an upload failed."""
  names = [p.name for p in mirror.dir.iterdir() if not _local_only(p.name)]
  try:
    mirror.push(*names, skip=_local_only)
  except Exception as e:  # pylint: disable=broad-except  (retried with the next commit)
    log.warning("run files of %s: upload failed (%s); the mirror %s keeps them: the next "
                "commit uploads them, or a relaunch of the same command on this host",
                mirror.workdir, e, mirror.dir)
    return False
  return True


def _commits(path: pathlib.Path) -> int:
  """The `mirror_commits` count of a ledger file (0 when absent or not counted)."""
  conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
  try:
    row = conn.execute("SELECT value FROM meta WHERE key=?", (COMMITS_KEY,)).fetchone()
  except sqlite3.DatabaseError as e:
    raise LedgerError(f"{path} is not a readable ledger ({e})") from None
  finally:
    conn.close()
  return 0 if row is None else int(json.loads(row[0]))


def _upload(ledger: Ledger, mirror: paths.Mirror, pushed_file: pathlib.Path) -> None:
  """Uploads a snapshot of `ledger` to the workdir and records its commit count."""
  snap = mirror.local(LEDGER + ".upload")
  snap.unlink(missing_ok=True)
  ledger.snapshot(snap)
  count = _commits(snap)
  try:
    paths.write_atomic(mirror.target(LEDGER), snap.read_bytes())
  except Exception as e:  # pylint: disable=broad-except  (retried with the next commit)
    log.warning("ledger of %s: upload failed (%s); the local copy %s holds the commit, "
                "the next commit uploads it", mirror.workdir, e, ledger.path)
    return
  pushed_file.write_text(json.dumps({"commits": count}))


__all__ = ["LEDGER", "RUN_STATE", "ledger_exists", "open_ledger", "push_run_files"]
