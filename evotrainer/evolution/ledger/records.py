"""The ledger's SQL schema and the typed records its rows read back as (core.py).

The schema's CHECK constraints take their allowed values from VERSION_STATUSES,
ATTEMPT_STATUSES and OUTCOMES here. JSON columns hold canonical JSON (`dumps`: sorted
keys, plain values), so the stored text doubles as the equality test of an idempotent
insert; `as_record` decodes a row into its record (SQLite's NULL back to NaN for a
finding's numbers). No JAX here: `FindingRecord.to_finding` imports the records module
lazily.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from typing import Any, Mapping, Optional

SCHEMA_VERSION = 1
VERSION_STATUSES = ("running", "kept", "rejected", "merged", "pruned")
ATTEMPT_STATUSES = ("running", "done", "failed")
OUTCOMES = ("success", "failure", "partial", "dropped")  # dropped: failed its backtest
GOOD = ("kept", "merged")  # statuses a version can be the incumbent with
ROOT = "v0"  # the root version's id: the base training every lineage starts from

SCHEMA_SQL = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE harness_versions (
  id TEXT PRIMARY KEY,
  parent TEXT REFERENCES harness_versions(id),
  diagnostics TEXT NOT NULL,
  validators TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  created_time REAL NOT NULL);
CREATE TABLE versions (
  id TEXT PRIMARY KEY,
  parent TEXT REFERENCES versions(id),
  status TEXT NOT NULL CHECK (status IN {VERSION_STATUSES}),
  created_step INTEGER NOT NULL DEFAULT 0,
  created_time REAL NOT NULL,
  bindings TEXT NOT NULL,
  gin TEXT NOT NULL DEFAULT '',
  checkpoint TEXT,
  metrics TEXT NOT NULL DEFAULT '{{}}',
  heldout TEXT NOT NULL DEFAULT '{{}}',
  harness_version TEXT REFERENCES harness_versions(id),
  reason TEXT NOT NULL DEFAULT '',
  decided_seq INTEGER);
CREATE INDEX versions_parent ON versions(parent);
CREATE TABLE attempts (
  id TEXT PRIMARY KEY,
  version_id TEXT NOT NULL REFERENCES versions(id),
  parent TEXT REFERENCES versions(id),
  intervention_id TEXT,
  started REAL NOT NULL,
  finished REAL,
  status TEXT NOT NULL CHECK (status IN {ATTEMPT_STATUSES}));
CREATE TABLE findings (
  id TEXT PRIMARY KEY,
  version_id TEXT NOT NULL REFERENCES versions(id),
  stage TEXT NOT NULL,
  kind TEXT NOT NULL,
  layer TEXT NOT NULL,
  severity REAL NOT NULL,
  value REAL,
  threshold REAL,
  message TEXT NOT NULL,
  evidence TEXT NOT NULL);
CREATE INDEX findings_version ON findings(version_id);
CREATE TABLE decisions (
  id TEXT PRIMARY KEY,
  parent TEXT NOT NULL REFERENCES versions(id),
  version_id TEXT REFERENCES versions(id),
  hypothesis TEXT NOT NULL,
  intervention TEXT NOT NULL,
  backtest TEXT,
  criterion TEXT NOT NULL,
  skill TEXT,
  outcome TEXT CHECK (outcome IS NULL OR outcome IN {OUTCOMES}),
  why TEXT NOT NULL DEFAULT '');
CREATE TABLE skills_used (
  version_id TEXT NOT NULL REFERENCES versions(id),
  skill TEXT NOT NULL,
  decision_id TEXT REFERENCES decisions(id),
  domain TEXT NOT NULL DEFAULT '',
  outcome TEXT CHECK (outcome IS NULL OR outcome IN {OUTCOMES}),
  PRIMARY KEY (version_id, skill));
"""


# ------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True)
class VersionRecord:
  """One policy version. `bindings`: the gin bindings changed against the parent
  ({binding: value}; the root's holds the initial values of the search space)."""

  id: str
  parent: Optional[str]
  status: str
  created_step: int
  created_time: float
  bindings: dict
  gin: str
  checkpoint: Optional[str]
  metrics: dict
  heldout: dict  # e.g. {'avg8': .41, 'noise': .02, 'pass8': .7}
  harness_version: Optional[str]
  reason: str


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
  """One branch training: `version_id` trained from `parent` for an intervention."""

  id: str
  version_id: str
  parent: Optional[str]
  intervention_id: Optional[str]
  started: float
  finished: Optional[float]
  status: str


@dataclasses.dataclass(frozen=True)
class FindingRecord:
  """A stored `types.Finding` plus where it belongs (same field names as Finding)."""

  id: str
  version_id: str
  stage: str
  kind: str
  layer: str
  severity: float
  value: float
  threshold: float
  message: str
  evidence: tuple  # ((episode_id, snippet), ...)

  def to_finding(self):
    """The `evotrainer.types.Finding` (imports the records module, which imports JAX)."""
    from evotrainer.types import Finding
    return Finding(kind=self.kind, layer=self.layer, severity=self.severity,
                   value=self.value, threshold=self.threshold, message=self.message,
                   evidence=self.evidence)


@dataclasses.dataclass(frozen=True)
class DecisionRecord:
  """Case memory of one intervention: designed on `parent`, trained as `version_id`
  (None when it was dropped before training)."""

  id: str
  parent: str
  version_id: Optional[str]
  hypothesis: str
  intervention: dict
  backtest: Optional[dict]
  criterion: str
  skill: Optional[str]
  outcome: Optional[str]
  why: str


@dataclasses.dataclass(frozen=True)
class HarnessVersionRecord:
  """Active diagnostics and validators ({name: {threshold, ...}}) of one harness version."""

  id: str
  parent: Optional[str]
  diagnostics: dict
  validators: dict
  reason: str
  created_time: float


@dataclasses.dataclass(frozen=True)
class SkillUseRecord:
  version_id: str
  skill: str
  decision_id: Optional[str]
  domain: str
  outcome: Optional[str]


# ------------------------------------------------------------------ JSON columns


def dumps(value: Any) -> str:
  """Canonical JSON (sorted keys): stored text doubles as the equality test."""
  return json.dumps(_plain(value), sort_keys=True)


def _plain(value: Any) -> Any:
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    to_dict = getattr(value, "to_dict", None)
    return _plain(to_dict() if to_dict else dataclasses.asdict(value))
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalar
    return value.item()
  return value


def _loads(text: Optional[str]) -> Any:
  return None if text is None else json.loads(text)


def sql_real(x: Optional[float]) -> Optional[float]:
  """SQLite stores NaN as NULL; say so explicitly (and read NULL back as NaN)."""
  return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _nan(x: Optional[float]) -> float:
  return float("nan") if x is None else float(x)


_JSON_COLUMNS = ("bindings", "metrics", "heldout", "diagnostics", "validators",
                 "intervention", "backtest")


def as_record(cls: type, row: sqlite3.Row):
  """The record `cls` of a row: JSON columns decoded; findings get NaN back for NULL and
  their evidence as tuples."""
  d = {f.name: row[f.name] for f in dataclasses.fields(cls)}
  d.update({k: _loads(d[k]) for k in _JSON_COLUMNS if k in d})
  if cls is FindingRecord:
    d.update(value=_nan(d["value"]), threshold=_nan(d["threshold"]),
             evidence=tuple(tuple(e) if isinstance(e, list) else e
                            for e in _loads(d["evidence"])))
  return cls(**d)


__all__ = ["ATTEMPT_STATUSES", "AttemptRecord", "DecisionRecord", "FindingRecord", "GOOD",
           "HarnessVersionRecord", "OUTCOMES", "ROOT", "SCHEMA_SQL", "SCHEMA_VERSION",
           "SkillUseRecord", "VERSION_STATUSES", "VersionRecord", "as_record", "dumps",
           "sql_real"]
