"""The version ledger: what the evolution did, in one SQLite file (docs/method.md, "Memory").

Tables (schema `SCHEMA_VERSION`):
  versions          one row per policy version: parent, status, bindings diff, operative
                    gin, checkpoint, metrics, held-out figures (with a noise estimate),
                    harness version, why it was kept or rejected
  attempts          branch trainings (a version trained from a parent for an intervention)
  findings          diagnostics' verdicts on a version, with evidence
  decisions         case memory: hypothesis, intervention, backtest, success criterion,
                    outcome and why — failures and backtest drops included
  harness_versions  which diagnostics / validators were active, with their thresholds
  skills_used       which skill proposed which version, and how it turned out
  meta              schema version, the incumbent, and the controller's own keys

Paths (a version's checkpoint, its branch result's checkpoint / rollouts / workdir) are
stored relative to the ledger's directory when inside it and read back absolute, so a
run directory that was moved resumes; an absolute path from an older ledger that no
longer exists is looked for by its `versions/...` tail (`resolve`).

Crash safety: WAL journal with `synchronous=FULL`, and every write inside a transaction,
so a kill -9 at any moment leaves the last committed state. Resume safety: every `add_*`
is idempotent by id — re-adding a record with the same content is a no-op, with other
content an error — so a resumed run can redo its last step without duplicating it.

An existing file with another schema version (or not a ledger at all) is refused with
an error and never written to: open it with the EvoTrainer version that wrote it, or use
a new workdir.

This module holds the `Ledger` (connection, transactions, idempotent writes, queries);
records.py holds the SQL schema and the typed records rows read back as, table.py the
printable lineage table. The package's __init__ re-exports the ledger and its records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
import uuid
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from evotrainer.evolution.ledger.records import (ATTEMPT_STATUSES, GOOD, OUTCOMES,
                                                 SCHEMA_SQL, SCHEMA_VERSION,
                                                 VERSION_STATUSES, AttemptRecord,
                                                 DecisionRecord, FindingRecord,
                                                 HarnessVersionRecord, SkillUseRecord,
                                                 VersionRecord, as_record, dumps, sql_real)
from evotrainer.evolution.ledger.table import lineage_table

# Commits counted by a ledger with an `on_commit` hook (a remote workdir's local copy):
# mirror.py compares the count of the local copy and the workdir's.
COMMITS_KEY = "mirror_commits"
_RESERVED_META = ("schema_version", "incumbent", "incumbent_seq", "clock", "run_uid",
                  COMMITS_KEY)
# How long a write waits for another process's write transaction before a LedgerError
# naming the holder (one run's controller is the only writer; a wait means a stranger).
BUSY_TIMEOUT_S = 10.0
_PATH_KEYS = ("checkpoint", "rollouts", "workdir")  # paths in a version's metrics['result']


class LedgerError(RuntimeError):
  """The ledger cannot be opened, or a write contradicts what is recorded."""


# ------------------------------------------------------------------ the ledger


class Ledger:
  """The run's ledger at `path` (created when absent).

  Usage:
    ledger = Ledger(workdir / "ledger.sqlite")
    with ledger.transaction():          # several rows, all or nothing
      ledger.add_version("v1", parent="v0", bindings={"Learner.clip_high": 0.32})
      ledger.add_attempt("v1-a", version_id="v1", parent="v0", intervention_id=iv.id)
    ledger.promote("v1", reason="avg8 +0.05 > noise 0.02")
  """

  def __init__(self, path: str | os.PathLike, *, root: Optional[str] = None,
               on_commit: Optional[Callable[["Ledger"], None]] = None):
    """Opens (or creates) the ledger file `path`.

    Args:
      path: the SQLite file (always on a local disk).
      root: the directory paths are stored relative to (default: the file's own); the
        workdir when the file is a local copy of a remote workdir's ledger.
      on_commit: called after every outermost commit (mirror.py uploads the
        copy); each such commit also counts up the meta key `COMMITS_KEY`.
    """
    self.path = os.fspath(path)
    # Paths are stored relative to the root (a gs:// root is used as is).
    self.root = root or os.path.dirname(os.path.abspath(self.path))
    self._on_commit = on_commit
    self._lock = threading.RLock()
    self._depth = 0
    existing = (os.path.exists(self.path) and os.path.getsize(self.path) > 0
                and self._check_existing())
    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
    self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                 timeout=BUSY_TIMEOUT_S)
    self._conn.row_factory = sqlite3.Row
    mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
      raise LedgerError(f"ledger {self.path}: SQLite refused WAL mode (got {mode!r})")
    self._conn.execute("PRAGMA synchronous=FULL")
    self._conn.execute("PRAGMA foreign_keys=ON")
    if not existing:
      with self.transaction():
        # One statement at a time: executescript() would commit the open transaction.
        for statement in SCHEMA_SQL.split(";"):
          if statement.strip():
            self._conn.execute(statement)
        self._put_meta("schema_version", SCHEMA_VERSION)
        self._put_meta("clock", 0)
        self._put_meta("run_uid", uuid.uuid4().hex)

  def _check_existing(self) -> bool:
    """Reads the schema version through a read-only connection (the file is never
    written). False for an empty SQLite file (no tables: a creation that never committed)."""
    uri = "file:" + os.path.abspath(self.path) + "?mode=ro"
    try:
      conn = sqlite3.connect(uri, uri=True, timeout=60.0)
    except sqlite3.Error as e:
      raise LedgerError(f"ledger {self.path}: cannot open: {e}") from None
    try:
      tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
      if not tables:
        return False
      if "meta" not in tables:
        raise LedgerError(f"{self.path} is an SQLite file but not an EvoTrainer ledger (no "
                          f"meta table; tables: {sorted(tables)}); use a new workdir")
      row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    except sqlite3.DatabaseError as e:
      raise LedgerError(f"ledger {self.path} is not a readable SQLite database ({e}); it "
                        f"was left untouched") from None
    finally:
      conn.close()
    found = None if row is None else json.loads(row[0])
    if found != SCHEMA_VERSION:
      raise LedgerError(f"ledger {self.path} has schema version {found}, this EvoTrainer "
                        f"reads version {SCHEMA_VERSION}; the file was left untouched: open "
                        f"it with the EvoTrainer version that wrote it, or use a new workdir")
    return True

  def close(self) -> None:
    with self._lock:
      self._conn.close()

  def __enter__(self) -> "Ledger":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _begin(self) -> None:
    """BEGIN IMMEDIATE, or a LedgerError naming who holds the ledger after BUSY_TIMEOUT_S."""
    try:
      self._conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as e:
      if "locked" not in str(e) and "busy" not in str(e):
        raise
      from evotrainer.workdir import holder
      h = holder(self.root)
      if h and h.get("pid") != os.getpid():
        who = f"pid {h.get('pid')} (host {h.get('host')}), which holds the workdir"
      else:  # no run, or this one, holds the workdir: someone outside EvoTrainer
        who = "a process outside EvoTrainer (an sqlite3 shell, a backup or copy tool?)"
      raise LedgerError(f"ledger {self.path} is locked for writing by {who}; waited "
                        f"{BUSY_TIMEOUT_S:.0f}s: stop that process or wait for it, then "
                        f"relaunch") from None

  @contextlib.contextmanager
  def transaction(self) -> Iterator["Ledger"]:
    """All writes inside commit together or not at all (nested: a savepoint)."""
    with self._lock:
      if self._depth:
        name = f"sp{self._depth}"
        self._conn.execute(f"SAVEPOINT {name}")
        self._depth += 1
        try:
          yield self
        except BaseException:
          self._conn.execute(f"ROLLBACK TO {name}")
          self._conn.execute(f"RELEASE {name}")
          raise
        else:
          self._conn.execute(f"RELEASE {name}")
        finally:
          self._depth -= 1
        return
      self._begin()
      self._depth = 1
      try:
        yield self
      except BaseException:
        self._conn.execute("ROLLBACK")
        raise
      else:
        if self._on_commit is not None:
          self._put_meta(COMMITS_KEY, self.get_meta(COMMITS_KEY, 0) + 1)
        self._conn.execute("COMMIT")
      finally:
        self._depth = 0
      if self._on_commit is not None:
        self._on_commit(self)

  def snapshot(self, path: str | os.PathLike) -> None:
    """Writes a consistent copy of the committed ledger to the file `path` (SQLite's
    backup API: what the WAL holds is included, which copying the file would miss)."""
    with self._lock:
      dst = sqlite3.connect(os.fspath(path))
      try:
        self._conn.backup(dst)
      finally:
        dst.close()

  # ---------------------------------------------------------------- paths

  def relative(self, path: Optional[str]) -> Optional[str]:
    """How a path is stored: relative to the ledger's directory when inside it (so a moved
    run directory still resolves), else absolute."""
    if not path:
      return path
    full = os.path.abspath(os.path.expanduser(os.fspath(path)))
    rel = os.path.relpath(full, self.root)
    return full if rel == ".." or rel.startswith(".." + os.sep) else rel

  def resolve(self, path: Optional[str]) -> Optional[str]:
    """An absolute path for a stored one. An absolute path written by a ledger before
    relative paths (or in a run directory since moved) that no longer exists is looked
    for under this directory by its `versions/...` tail."""
    if not path:
      return path
    if not os.path.isabs(path):
      return os.path.join(self.root, path)
    if not os.path.exists(path):
      parts = path.split(os.sep)
      for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "versions":
          moved = os.path.join(self.root, *parts[i:])
          if os.path.exists(moved):
            return moved
          break
    return path

  def _paths(self, metrics: Optional[Mapping], how) -> Optional[Mapping]:
    """`metrics` with the paths of its stored branch result ('result') mapped by `how`."""
    if not metrics or not isinstance(metrics.get("result"), Mapping):
      return metrics
    result = dict(metrics["result"])
    for k in _PATH_KEYS:
      if isinstance(result.get(k), str):
        result[k] = how(result[k])
    return {**metrics, "result": result}

  def _record(self, row) -> VersionRecord:
    v = as_record(VersionRecord, row)
    return dataclasses.replace(v, checkpoint=self.resolve(v.checkpoint),
                               metrics=self._paths(v.metrics, self.resolve))

  def anchor_paths(self, base: str | os.PathLike) -> None:
    """Makes every stored relative path absolute against `base` (the directory of the
    ledger this one was copied from: its checkpoints stay there)."""
    base = os.path.abspath(os.fspath(base))
    absolute = lambda p: p if os.path.isabs(p) else os.path.join(base, p)
    with self.transaction():
      for row in self._select("versions"):
        metrics = self._paths(json.loads(row["metrics"]), absolute)
        self._conn.execute("UPDATE versions SET checkpoint=?, metrics=? WHERE id=?",
                           (row["checkpoint"] and absolute(row["checkpoint"]), dumps(metrics),
                            row["id"]))

  # ---------------------------------------------------------------- meta

  def _put_meta(self, key: str, value: Any) -> None:
    self._conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO "
                       "UPDATE SET value=excluded.value", (key, dumps(value)))

  def get_meta(self, key: str, default: Any = None) -> Any:
    """A JSON value stored under `key` (the controller's own state, e.g. an rng seed)."""
    rows = self._q("SELECT value FROM meta WHERE key=?", (key,))
    return default if not rows else json.loads(rows[0][0])

  def meta_items(self, prefix: str) -> dict:
    """{key: JSON value} of the meta keys starting with `prefix`."""
    rows = self._q("SELECT key, value FROM meta WHERE substr(key, 1, ?) = ? ORDER BY key",
                   (len(prefix), prefix))
    return {k: json.loads(v) for k, v in rows}

  def set_meta(self, key: str, value: Any) -> None:
    if key in _RESERVED_META:
      raise LedgerError(f"meta key {key!r} is managed by the ledger itself")
    with self.transaction():
      self._put_meta(key, value)

  @property
  def schema_version(self) -> int:
    return self.get_meta("schema_version")

  @property
  def run_uid(self) -> str:
    """The run's identity: a random hex id drawn when the ledger is created (and on first
    use in a ledger written before it existed), kept across resumes and by a copy
    (`sweep.start_from`, which continues the same lineage). Skill outcomes carry it, so
    that version ids, which every run restarts, name one branch across runs."""
    uid = self.get_meta("run_uid")
    if uid is None:
      with self.transaction():
        uid = self.get_meta("run_uid") or uuid.uuid4().hex
        self._put_meta("run_uid", uid)
    return uid

  def _tick(self) -> int:
    """The next value of the ledger's logical clock (orders status decisions)."""
    clock = self.get_meta("clock", 0) + 1
    self._put_meta("clock", clock)
    return clock

  # ---------------------------------------------------------------- idempotent insert

  def _q(self, sql: str, args: Sequence = ()) -> list:
    """All rows of a query, read under the lock (one connection serves every thread)."""
    with self._lock:
      return self._conn.execute(sql, tuple(args)).fetchall()

  def _select(self, table: str, **where: Any) -> list:
    """Rows of `table` in insertion order where each non-None keyword column matches."""
    where = {k: v for k, v in where.items() if v is not None}
    cond = " AND ".join(f"{k}=?" for k in where)
    return self._q(f"SELECT * FROM {table}" + (f" WHERE {cond}" if cond else "") +
                   " ORDER BY rowid", tuple(where.values()))

  def _row(self, table: str, key: Mapping[str, Any]) -> Optional[sqlite3.Row]:
    rows = self._select(table, **key)
    return rows[0] if rows else None

  def _add(self, table: str, key: Mapping[str, Any], fixed: Mapping[str, Any],
           optional: Mapping[str, Any] = (), extra: Mapping[str, Any] = ()) -> bool:
    """Inserts a row, or checks it against the stored one. Returns True when inserted.

    `fixed` columns must equal the stored ones; `optional` ones (None: not given) must
    equal them when both are set, and fill them when the stored one is NULL; `extra`
    columns (timestamps, initial status) are written on insert only.
    """
    optional, extra = dict(optional), dict(extra)
    what = f"{table} {'/'.join(str(v) for v in key.values())}"
    with self.transaction():
      row = self._row(table, key)
      if row is None:
        cols = {**key, **fixed, **{k: v for k, v in optional.items() if v is not None},
                **extra}
        try:
          self._conn.execute(
              f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
              tuple(cols.values()))
        except sqlite3.IntegrityError as e:
          raise LedgerError(f"{what}: {e} (is every referenced version / harness version / "
                            f"decision recorded first?)") from None
        return True
      diff = [c for c, v in fixed.items() if row[c] != v]
      diff += [c for c, v in optional.items() if v is not None and row[c] is not None
               and row[c] != v]
      if diff:
        detail = "; ".join(f"{c}: recorded {row[c]!r}, given {({**fixed, **optional})[c]!r}"
                           for c in diff)
        raise LedgerError(f"{what} is already recorded with other content ({detail})")
      fill = {c: v for c, v in optional.items() if v is not None and row[c] is None}
      if fill:
        self._update(table, key, fill)
      return False

  def _update(self, table: str, key: Mapping[str, Any], cols: Mapping[str, Any]) -> None:
    with self.transaction():
      if self._row(table, key) is None:
        raise LedgerError(f"{table} {'/'.join(map(str, key.values()))} is not in the ledger")
      sets = ", ".join(f"{c}=?" for c in cols)
      where = " AND ".join(f"{k}=?" for k in key)
      try:
        self._conn.execute(f"UPDATE {table} SET {sets} WHERE {where}",
                           (*cols.values(), *key.values()))
      except sqlite3.IntegrityError as e:
        raise LedgerError(f"{table} {'/'.join(map(str, key.values()))}: {e}") from None

  # ---------------------------------------------------------------- harness versions

  def add_harness_version(self, id: str, diagnostics: Mapping, validators: Mapping,
                          parent: Optional[str] = None, reason: str = "") -> None:
    """Records a harness version: {name: config} of active diagnostics and validators."""
    self._add("harness_versions", {"id": id},
              {"parent": parent, "diagnostics": dumps(diagnostics),
               "validators": dumps(validators), "reason": reason},
              extra={"created_time": time.time()})

  def harness_version(self, id: str) -> HarnessVersionRecord:
    row = self._row("harness_versions", {"id": id})
    if row is None:
      raise LedgerError(f"harness version {id!r} is not in the ledger")
    return as_record(HarnessVersionRecord, row)

  def harness_versions(self) -> list:
    return [as_record(HarnessVersionRecord, r) for r in self._select("harness_versions")]

  # ---------------------------------------------------------------- versions

  def add_version(self, id: str, parent: Optional[str] = None, *, bindings: Mapping = (),
                  gin: str = "", created_step: int = 0,
                  harness_version: Optional[str] = None, checkpoint: Optional[str] = None,
                  status: str = "running", reason: str = "") -> None:
    """Records a version (status 'running' while it trains). Re-adding checks parent,
    bindings, gin, step and harness version; the status of a recorded version is kept."""
    if status not in VERSION_STATUSES:
      raise LedgerError(f"version {id}: status {status!r}; expected one of {VERSION_STATUSES}")
    with self.transaction():
      inserted = self._add(
          "versions", {"id": id},
          {"parent": parent, "bindings": dumps(dict(bindings)), "gin": gin,
           "created_step": int(created_step), "harness_version": harness_version},
          {"checkpoint": self.relative(checkpoint)},
          {"created_time": time.time(), "status": status, "reason": reason})
      if inserted and status != "running":
        self._conn.execute("UPDATE versions SET decided_seq=? WHERE id=?", (self._tick(), id))

  def update_version(self, id: str, *, checkpoint: Optional[str] = None,
                     metrics: Optional[Mapping] = None, heldout: Optional[Mapping] = None,
                     gin: Optional[str] = None) -> None:
    """Sets the given fields (whole values: `metrics` replaces the stored dict)."""
    cols = {"checkpoint": self.relative(checkpoint), "gin": gin,
            "metrics": None if metrics is None else dumps(self._paths(metrics, self.relative)),
            "heldout": None if heldout is None else dumps(heldout)}
    cols = {c: v for c, v in cols.items() if v is not None}
    if cols:
      self._update("versions", {"id": id}, cols)

  def set_status(self, id: str, status: str, reason: str = "") -> None:
    """Sets a version's status. Demoting the incumbent (to anything but kept / merged)
    rolls the incumbent back to its nearest kept ancestor, in the same transaction."""
    if status not in VERSION_STATUSES:
      raise LedgerError(f"version {id}: status {status!r}; expected one of {VERSION_STATUSES}")
    with self.transaction():
      v = self.version(id)
      if v.status == status and v.reason == reason:
        return
      self._conn.execute("UPDATE versions SET status=?, reason=?, decided_seq=? WHERE id=?",
                         (status, reason, self._tick(), id))
      if status not in GOOD and self.get_meta("incumbent") == id:
        back = next((a.id for a in self.lineage(id)[1:] if a.status in GOOD), None)
        self._put_meta("incumbent", back)
        self._put_meta("incumbent_seq", self._tick())

  def promote(self, id: str, reason: str = "") -> None:
    """Keeps `id` and makes it the incumbent (one transaction)."""
    with self.transaction():
      if (self.get_meta("incumbent") == id and self.version(id).status == "kept"
          and self.version(id).reason == reason):
        return
      self.set_status(id, "kept", reason)
      self._put_meta("incumbent", id)
      self._put_meta("incumbent_seq", self._tick())

  def reject(self, id: str, reason: str = "") -> None:
    """Rejects `id` (negative evidence; the incumbent rolls back if it was `id`)."""
    self.set_status(id, "rejected", reason)

  def set_incumbent(self, id: str) -> None:
    """Rolls the incumbent to `id`, which must be kept or merged."""
    with self.transaction():
      v = self.version(id)
      if v.status not in GOOD:
        raise LedgerError(f"version {id} is {v.status}; only a kept or merged version can "
                          f"be the incumbent")
      if self.get_meta("incumbent") != id:
        self._put_meta("incumbent", id)
        self._put_meta("incumbent_seq", self._tick())

  def version(self, id: str) -> VersionRecord:
    row = self._row("versions", {"id": id})
    if row is None:
      raise LedgerError(f"version {id!r} is not in the ledger")
    return self._record(row)

  def has_version(self, id: str) -> bool:
    return self._row("versions", {"id": id}) is not None

  def versions(self, status: Optional[str] = None) -> list:
    """Versions in creation order, optionally only those with `status`."""
    return [self._record(r) for r in self._select("versions", status=status)]

  def lineage(self, id: str) -> list:
    """[version, parent, ..., root]: the path from `id` to the root."""
    out, seen = [], set()
    cur: Optional[str] = id
    while cur is not None:
      if cur in seen:
        raise LedgerError(f"version {id}: the parent chain loops at {cur}")
      seen.add(cur)
      v = self.version(cur)
      out.append(v)
      cur = v.parent
    return out

  def children(self, id: str) -> list:
    return [self._record(r) for r in self._select("versions", parent=id)]

  def incumbent(self) -> Optional[VersionRecord]:
    """The current best kept version (set by `promote`, rolled back by demotions)."""
    id = self.get_meta("incumbent")
    return None if id is None else self.version(id)

  def consecutive_rejections(self) -> int:
    """Rejected branches of the incumbent decided since it became the incumbent
    (all rejected versions when there is none): the escalation counter."""
    inc = self.get_meta("incumbent")
    if inc is None:
      return len(self._select("versions", status="rejected"))
    return self._q("SELECT COUNT(*) FROM versions WHERE status='rejected' AND parent=? AND "
                   "decided_seq > ?", (inc, self.get_meta("incumbent_seq", 0)))[0][0]

  def binding_history(self, id: str, binding: str) -> list:
    """[(version_id, value), ...], root first: where the lineage of `id` set `binding`."""
    return [(v.id, v.bindings[binding]) for v in reversed(self.lineage(id))
            if binding in v.bindings]

  # ---------------------------------------------------------------- attempts

  def add_attempt(self, id: str, version_id: str, parent: Optional[str] = None,
                  intervention_id: Optional[str] = None) -> None:
    """Records a branch training that starts now (status 'running')."""
    self._add("attempts", {"id": id},
              {"version_id": version_id, "parent": parent, "intervention_id": intervention_id},
              extra={"started": time.time(), "status": "running"})

  def finish_attempt(self, id: str, status: str = "done") -> None:
    if status not in ATTEMPT_STATUSES[1:]:
      raise LedgerError(f"attempt {id}: status {status!r}; expected 'done' or 'failed'")
    with self.transaction():
      row = self._row("attempts", {"id": id})
      if row is not None and row["status"] == status:
        return
      self._update("attempts", {"id": id}, {"status": status, "finished": time.time()})

  def attempts(self, version: Optional[str] = None, status: Optional[str] = None) -> list:
    """Attempts in start order; a resumed run looks for status='running' ones."""
    return [as_record(AttemptRecord, r)
            for r in self._select("attempts", version_id=version, status=status)]

  # ---------------------------------------------------------------- findings

  def add_findings(self, version_id: str, findings: Sequence, stage: str = "diagnose") -> None:
    """Records `findings` (`types.Finding` or anything with its fields) of a version.

    Ids are f"{version_id}/{stage}/{i}": re-adding the same list is a no-op; a list of
    another length or content for the same (version, stage) is an error.
    """
    with self.transaction():
      n = len(self._select("findings", version_id=version_id, stage=stage))
      if n and n != len(findings):
        raise LedgerError(f"findings of {version_id}/{stage}: {n} recorded, {len(findings)} "
                          f"given")
      for i, f in enumerate(findings):
        self._add("findings", {"id": f"{version_id}/{stage}/{i}"},
                  {"version_id": version_id, "stage": stage, "kind": f.kind,
                   "layer": f.layer, "severity": sql_real(f.severity), "value": sql_real(f.value),
                   "threshold": sql_real(f.threshold), "message": f.message,
                   "evidence": dumps(list(f.evidence))})

  def findings(self, version: Optional[str] = None, stage: Optional[str] = None) -> list:
    return [as_record(FindingRecord, r)
            for r in self._select("findings", version_id=version, stage=stage)]

  # ---------------------------------------------------------------- decisions

  def add_decision(self, id: str, parent: str, *, hypothesis: str, intervention: Any,
                   criterion: str, version_id: Optional[str] = None,
                   backtest: Optional[Mapping] = None, skill: Optional[str] = None) -> None:
    """Records a decision (hypothesis, intervention, success criterion) made on `parent`.

    `intervention`: a search_space.Intervention or its dict. `version_id` and `backtest`
    may come later through `update_decision`.
    """
    self._add("decisions", {"id": id},
              {"parent": parent, "hypothesis": hypothesis,
               "intervention": dumps(intervention), "criterion": criterion, "skill": skill},
              {"version_id": version_id,
               "backtest": None if backtest is None else dumps(backtest)})

  def update_decision(self, id: str, *, version_id: Optional[str] = None,
                      backtest: Optional[Mapping] = None, outcome: Optional[str] = None,
                      why: Optional[str] = None) -> None:
    if outcome is not None and outcome not in OUTCOMES:
      raise LedgerError(f"decision {id}: outcome {outcome!r}; expected one of {OUTCOMES}")
    cols = {"version_id": version_id, "outcome": outcome, "why": why,
            "backtest": None if backtest is None else dumps(backtest)}
    cols = {c: v for c, v in cols.items() if v is not None}
    if cols:
      self._update("decisions", {"id": id}, cols)

  def decision(self, id: str) -> DecisionRecord:
    row = self._row("decisions", {"id": id})
    if row is None:
      raise LedgerError(f"decision {id!r} is not in the ledger")
    return as_record(DecisionRecord, row)

  def decisions(self, version: Optional[str] = None, parent: Optional[str] = None) -> list:
    """Decisions in order; `version`: those trained as that version; `parent`: those
    designed on that version (dropped ones included)."""
    return [as_record(DecisionRecord, r)
            for r in self._select("decisions", version_id=version, parent=parent)]

  # ---------------------------------------------------------------- skills used

  def add_skill_use(self, version_id: str, skill: str, decision_id: Optional[str] = None,
                    domain: str = "") -> None:
    self._add("skills_used", {"version_id": version_id, "skill": skill},
              {"decision_id": decision_id, "domain": domain})

  def set_skill_outcome(self, version_id: str, skill: str, outcome: str) -> None:
    if outcome not in OUTCOMES:
      raise LedgerError(f"skill {skill} on {version_id}: outcome {outcome!r}; expected one "
                        f"of {OUTCOMES}")
    self._update("skills_used", {"version_id": version_id, "skill": skill},
                 {"outcome": outcome})

  def skills_used(self, version: Optional[str] = None) -> list:
    return [as_record(SkillUseRecord, r) for r in self._select("skills_used", version_id=version)]

  # ---------------------------------------------------------------- the table

  def table(self, width: int = 48) -> str:
    """The lineage as a printable text table (a tree by indentation; '*' = incumbent)."""
    return lineage_table(self, width)


__all__ = ["BUSY_TIMEOUT_S", "COMMITS_KEY", "Ledger", "LedgerError"]
