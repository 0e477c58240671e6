"""`sweep` mode's knobs: the variants of a sweep file as branches of one parent (the
controller runs them: evotrainer/modes/evolve.py)."""

from __future__ import annotations

import gin


@gin.configurable(module="run")
def sweep(file: str | None = None, parent: str | None = None, backtest: bool = False) -> dict:
  """gin knobs of `sweep` mode (`--sweep_file` sets `sweep.file`).

  Args:
    file: the sweep file (format: evotrainer/evolution/sweep_file.py).
    parent: None: the parent of an earlier sweep in the workdir, else the ledger's
      incumbent, else the root trained from the warm start; a version id of the
      workdir's ledger; or a model directory (the root, evaluated as is).
    backtest: replay harness-side variants on the parent's stored rollouts first.
  """
  return {"file": file, "parent": parent, "backtest": backtest}
