"""The version ledger: what the evolution did, in one SQLite file (core.py has the detail).

  core.py     the `Ledger` (connection, transactions, idempotent writes, queries) and
              `LedgerError`; crash- and resume-safe
  records.py  its SQL schema and the typed records rows read back as
  table.py    its lineage as a printable text table
  mirror.py   the ledger of a workdir, local or `gs://` (a local copy uploaded after
              every commit), and a run's files beside it; imported by name, not here

`Ledger`, `LedgerError`, `COMMITS_KEY`, and the records, statuses and schema version are
re-exported here.
"""

from __future__ import annotations

from evotrainer.evolution.ledger.core import COMMITS_KEY, Ledger, LedgerError
from evotrainer.evolution.ledger.records import (ATTEMPT_STATUSES, GOOD, OUTCOMES, ROOT,
                                                 SCHEMA_VERSION, VERSION_STATUSES,
                                                 AttemptRecord, DecisionRecord,
                                                 FindingRecord, HarnessVersionRecord,
                                                 SkillUseRecord, VersionRecord)

__all__ = ["ATTEMPT_STATUSES", "AttemptRecord", "COMMITS_KEY", "DecisionRecord",
           "FindingRecord", "GOOD", "HarnessVersionRecord", "Ledger", "LedgerError",
           "OUTCOMES", "ROOT", "SCHEMA_VERSION", "SkillUseRecord", "VERSION_STATUSES",
           "VersionRecord"]
