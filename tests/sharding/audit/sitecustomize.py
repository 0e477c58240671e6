"""Test-only: records every file a process writes, to check who writes a run's files.

Put this directory first on PYTHONPATH and set EVO_AUDIT_LOG=path; Python imports
`sitecustomize` at start-up, and an audit hook (PEP 578) appends one line per event,
`<event>\t<path>`, for `open` in a writing mode, `os.rename`/`os.replace`, `os.link`,
`os.remove` and `sqlite3.connect` (SQLite writes natively: opening a database, e.g. a
ledger, counts as writing it). Native writers (pyarrow, tensorstore) are seen only
through the Python-level rename/link that publishes their output, which is what a
reader sees.
"""

import os
import sys

_PATH = os.environ.get("EVO_AUDIT_LOG")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

if _PATH:
  _log = open(_PATH, "a", buffering=1)  # opened before the hook: not recorded

  def _hook(event, args):
    if event == "open":
      path, mode, flags = args
      writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                 else bool((flags or 0) & _WRITE_FLAGS))
      paths = [path] if writing else []
    elif event in ("os.rename", "os.link"):
      paths = [args[1]]
    elif event in ("os.remove", "sqlite3.connect"):
      paths = [args[0]]
    else:
      return
    for p in paths:
      if isinstance(p, (str, bytes, os.PathLike)):
        _log.write(f"{event}\t{os.path.abspath(os.fsdecode(p))}\n")

  sys.addaudithook(_hook)
