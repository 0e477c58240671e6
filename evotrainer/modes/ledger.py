"""`ledger` mode: print the ledger of the run in the workdir as a table."""

from __future__ import annotations

from evotrainer.modes.common import say


def print_ledger(workdir: str) -> dict:
  """Prints the workdir's ledger; a workdir without one is an error (none is created)."""
  from evotrainer.evolution.ledger.mirror import ledger_exists, open_ledger
  if not ledger_exists(workdir):  # never create one here
    raise FileNotFoundError(f"run.mode='ledger': no ledger.sqlite in {workdir}")
  with open_ledger(workdir) as ledger:
    say(ledger.table())
  return {}
