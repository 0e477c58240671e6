"""What a multi-process run needs besides the mesh: host copies, one voice, agreement.

Every process runs the same program (SPMD). Three rules keep the processes in step:

* **Device → host** goes through `to_host`: an array sharded over several processes is
  gathered (`process_allgather`, itself a collective: every process calls it).
* **Host decisions** that are not a pure function of data every process already holds
  (a verifier with a wall-clock timeout, the clock itself, the file system) are taken by
  process 0 and sent to the others (`broadcast_json`, `all_true`), so that no process
  can branch differently and leave the others waiting in a collective.
* **Files** of the run (metrics, rollouts, summaries, reports) are written by process 0
  only (`is_primary`); checkpoints go through Orbax, where every process calls save.

With one process each helper is the identity (no collective, no cost).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import jax
import numpy as np


class DivergedError(RuntimeError):
  """Processes of one run computed different values where they must agree."""


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def is_primary() -> bool:
  """True on process 0, the one that writes the run's files and takes host decisions."""
  return jax.process_index() == 0


def to_host(tree: Any) -> Any:
  """The full value of every (possibly multi-process) array of `tree`, as numpy.

  Collective when an array spans several processes: all processes must call it.
  """
  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:  # every process holds all of it
      return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree.map(one, tree)


def broadcast_json(value: Any) -> Any:
  """Process 0's `value` (anything JSON can carry, NaN included) on every process.

  The other processes' `value` is ignored (pass None). Two broadcasts: the length of
  the encoded text, then the text as bytes, since a broadcast needs one shape on every
  process. Floats survive exactly (JSON writes `repr`).
  """
  if not is_multiprocess():
    return value
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  raw = json.dumps(value).encode() if is_primary() else b""
  n = int(multihost_utils.broadcast_one_to_all(np.int64(len(raw))))
  buf = np.zeros(n, np.uint8)
  if is_primary():
    buf[:] = np.frombuffer(raw, np.uint8)
  return json.loads(multihost_utils.broadcast_one_to_all(buf).tobytes().decode())


def all_true(flag: bool) -> bool:
  """True when `flag` holds on every process (e.g. a cache file every host can read)."""
  if not is_multiprocess():
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.all(multihost_utils.process_allgather(np.int32(bool(flag)))))


def check_agree(values: Mapping[str, float], what: str) -> None:
  """Raises DivergedError unless every process holds the same `values` (bit for bit).

  A cheap guard (one small all-gather) against the silent failure of SPMD code: a
  process that computed another batch would still feed the collectives, and the run
  would train on a mixture.
  """
  if not is_multiprocess():
    return
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  names = sorted(values)
  mine = np.asarray([values[k] for k in names], np.float64)
  every = np.asarray(multihost_utils.process_allgather(mine))  # [P, len(names)]
  same = np.all((every == every[0]) | (np.isnan(every) & np.isnan(every[0])), axis=0)
  if not same.all():
    bad = {names[i]: every[:, i].tolist() for i in np.flatnonzero(~same)}
    raise DivergedError(f"{what}: the processes disagree on {bad} (one value per "
                        f"process); a host computation is not identical everywhere")


__all__ = ["DivergedError", "all_true", "broadcast_json", "check_agree", "is_multiprocess",
           "is_primary", "to_host"]
