"""An evolution across processes: one controller, each branch trained on every host.

`run.mode='evolve'` or `'sweep'` launched as several processes (a TPU pod's workers with
`EVO_TPU_POD=1`, or `launch/multihost_local.sh`) runs one controller, process 0's (a
sweep's driver runs over it: its root and variants are the branches):

* **One voice.** Process 0 (the *leader*) is the single-process controller, unchanged:
  it alone opens the ledger and the skills, proposes, reads scores, decides, and writes
  summary.json and report.html. Its trainer is a `PodTrainer`. The other processes
  (*followers*) run no controller and open no ledger: they `follow` the leader's
  requests, so no decision can differ between hosts (there is only one).
* **Every branch on every host.** For each training the leader posts a request: the
  branch's gin bindings, seed and workdir, plus a coordinator address for a fresh
  jax.distributed run (the leader's host, a port free there). Every process then starts
  its `branch` child (trainer.py's command line) as process i of that run, so a branch
  spans all hosts' devices like `run.mode='train'` does. The children read the parent's
  checkpoint from the shared workdir; the leader's child writes branch_result.json (and
  every child its part of the Orbax checkpoints: run.py, docs/multihost.md).
* **One failure fails the branch everywhere.** Each process posts its child's outcome
  (exit code, end time, log tail). While its child runs, every process checks the others'
  outcomes once a second and kills its own child when another one failed or another
  process left, so no child waits for a dead peer in a collective. The leader waits for
  every outcome (at most the branch timeout plus `grace_s`) and raises BranchFailed with
  the earliest failure's log tail; infra.py classifies it as for one process (a crash
  is retried once, a timeout is evidence).
* **Leaving.** Each process posts when it leaves the run (launch.py, also on an error):
  the followers stop when the leader has left (exit 0 after a finished run; the leader's
  one-line error otherwise, `LeaderStopped`), and a follower's departure fails the branch
  in flight.

The channel is the key-value store of the coordination service the processes joined
(`jax.distributed`; no devices involved). The parents' own JAX backend is CPU-only
(`join`): accelerators stay free for the children, and host-side JAX the controller
uses (a backtest's harness replay) runs locally on the leader. Creating a backend is
itself collective in a multi-process run, so every process creates it at once, there.

Why children rather than training in-process on the global mesh: the same reasons as for
one process (trainer.py): a crash or hang costs one branch, every branch compiles under
its own gin, and each is a command a person can replay.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import sys
import time
from typing import Any, Optional, Sequence

from evotrainer.evolution.branch_result import BranchResult
from evotrainer.evolution.trainer import SubprocessTrainer, log_tail, run_child

_PREFIX = "evotrainer/pod/"  # keys: request/<n>, status/<n>/<process>, exit/<process>


class LeaderStopped(RuntimeError):
  """Process 0 left a multi-process evolution with an error (`kind` as errors.py names
  known failures; '' for an unknown one); a follower stops with it."""

  def __init__(self, kind: str, message: str):
    super().__init__(f"process 0 stopped the run: {message}")
    self.kind = kind


class Hosts:
  """This process's place in a multi-process evolution, and the channel between them.

  Args:
    process_id, num_processes: as jax.distributed numbers the processes.
    coordinator: the run's coordinator `host:port` (its host is the leader's).
    client: the coordination service's key-value client (`key_value_set`,
      `key_value_try_get`, `key_value_dir_get`).
    poll_s: how often a waiting process looks at the channel.
  """

  def __init__(self, process_id: int, num_processes: int, coordinator: str, client: Any,
               poll_s: float = 1.0):
    self.process_id, self.num_processes = process_id, num_processes
    self.coordinator, self.client, self.poll_s = coordinator, client, poll_s

  @property
  def leader(self) -> bool:
    return self.process_id == 0

  def post(self, key: str, value: Any) -> None:
    self.client.key_value_set(_PREFIX + key, json.dumps(value))

  def get(self, key: str) -> Any:
    """The value posted under `key`, None when nothing is."""
    try:
      return json.loads(self.client.key_value_try_get(_PREFIX + key))
    except Exception as e:  # pylint: disable=broad-except  (jax raises one error type)
      if "NOT_FOUND" in str(e):
        return None
      raise

  def posted(self, key: str) -> dict:
    """{process: value} of everything posted under `key/<process>`."""
    return {int(k.rsplit("/", 1)[1]): json.loads(v)
            for k, v in self.client.key_value_dir_get(_PREFIX + key + "/")}

  def others_failed(self, n: int) -> bool:
    """True when, for request `n`, another process's child failed or a process left."""
    mine = self.process_id
    return (any(i != mine and o["rc"] != 0 for i, o in self.posted(f"status/{n}").items())
            or any(i != mine for i in self.posted("exit")))

  def leave(self, error: Optional[Sequence[str]] = None) -> None:
    """Tells the others that this process leaves: `error` (kind, message) or None after a
    finished run. Best effort: the service may already be gone."""
    try:
      self.post(f"exit/{self.process_id}", None if error is None else list(error))
    except Exception:  # pylint: disable=broad-except
      pass

  def child_env(self, coordinator: str) -> dict:
    """This process's environment for its part of a branch run coordinated at
    `coordinator` (the parent's own coordinator and TPU pod detection dropped)."""
    env = {k: v for k, v in os.environ.items() if k != "EVO_TPU_POD"}
    env.update(EVO_COORDINATOR=coordinator, EVO_NUM_PROCESSES=str(self.num_processes),
               EVO_PROCESS_ID=str(self.process_id))
    return env


def current() -> Optional[Hosts]:
  """The Hosts of this process when it joined a run of several processes, else None."""
  if "jax" not in sys.modules:  # nothing joined: spare a controller the JAX import
    return None
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  s = distributed.global_state  # no public API exposes the key-value client
  if s.client is None or (s.num_processes or 1) <= 1:
    return None
  return Hosts(s.process_id, s.num_processes, s.coordinator_address, s.client)


def join() -> Hosts:
  """Sets up the controller processes of a multi-process evolution (after
  `jax.distributed.initialize`): a CPU-only backend, created by every process now."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  jax.devices()
  hosts = current()
  assert hosts is not None, "join() needs a multi-process jax.distributed run"
  return hosts


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("", 0))
    return s.getsockname()[1]


def _request(n: int, request: dict, local: SubprocessTrainer, hosts: Hosts) -> None:
  """Runs this process's child of request `n` and posts its outcome (also when this
  process fails to run it, so that the others stop theirs)."""
  workdir = pathlib.Path(request["workdir"])
  log = workdir / ("branch.log" if hosts.leader else f"branch.process{hosts.process_id}.log")
  rc, tail = "error", ""
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = local.command(**{k: request[k] for k in ("version", "parent_checkpoint",
                                                    "bindings", "seed", "workdir")})
    rc = run_child(cmd, log, env={**hosts.child_env(request["coordinator"]), **local.env},
                   timeout_s=local.timeout_s, stop=lambda: hosts.others_failed(n),
                   poll_s=hosts.poll_s)
    tail = log_tail(log)
  except BaseException as e:
    tail = f"process {hosts.process_id} could not run its child: {type(e).__name__}: {e}"
    raise
  finally:
    hosts.post(f"status/{n}/{hosts.process_id}",
               {"rc": rc, "end": time.time(), "log": str(log), "tail": tail})


class PodTrainer:
  """The leader's Trainer: each branch as one run of a child per process (module doc).

  Args:
    local: builds the child's command line, environment and time limit.
    hosts: the leader's Hosts.
    grace_s: how long past the branch timeout the leader waits for a process's outcome
      before counting it lost.
  """

  def __init__(self, local: SubprocessTrainer, hosts: Hosts, grace_s: float = 300):
    assert hosts.leader
    self.local, self.hosts, self.grace_s = local, hosts, grace_s
    self._n = 0  # requests posted in this launch (followers count them the same)

  def train(self, *, version: str, parent_checkpoint: Optional[str], bindings: Sequence[str],
            seed: int, workdir: str) -> BranchResult:
    done = self.local.finished(workdir)
    if done is not None:
      return done
    self._n += 1
    host = self.hosts.coordinator.rsplit(":", 1)[0]
    request = {"version": version, "parent_checkpoint": parent_checkpoint,
               "bindings": list(bindings), "seed": int(seed), "workdir": str(workdir),
               "coordinator": f"{host}:{_free_port()}"}
    start = time.time()
    self.hosts.post(f"request/{self._n}", request)
    _request(self._n, request, self.local, self.hosts)
    outcomes = self._outcomes(self._n, start + self.local.timeout_s + self.grace_s)
    failed = {i: o for i, o in outcomes.items() if o["rc"] != 0}
    if not failed:
      return self.local.collect(version, workdir, 0, start, outcomes[0]["log"])
    # The cause: the earliest failure that was not a stop caused by another one.
    causes = {i: o for i, o in failed.items() if o["rc"] != "stopped"} or failed
    i = min(causes, key=lambda j: (causes[j]["end"], j))
    return self.local.collect(version, workdir, causes[i]["rc"], start, causes[i]["log"],
                              tail=causes[i]["tail"],
                              where=f" on process {i} of {self.hosts.num_processes}")

  def _outcomes(self, n: int, deadline: float) -> dict:
    """{process: outcome} of request `n` from every process; a process that left or
    posted nothing by `deadline` counts as failed."""
    while True:
      outcomes = self.hosts.posted(f"status/{n}")
      left = self.hosts.posted("exit")
      missing = [i for i in range(self.hosts.num_processes) if i not in outcomes]
      if not missing:
        return outcomes
      if all(i in left for i in missing) or time.time() > deadline:
        for i in missing:
          why = (f"process {i} left the run: {left[i]}" if i in left else
                 f"process {i} posted no outcome by the deadline (branch timeout + "
                 f"{self.grace_s:.0f}s)")
          outcomes[i] = {"rc": "left" if i in left else "lost", "end": time.time(),
                         "log": "", "tail": why}
        return outcomes
      time.sleep(self.hosts.poll_s)


def follow(local: SubprocessTrainer, hosts: Hosts) -> None:
  """A follower's whole evolution: trains its part of each branch the leader requests
  until the leader leaves. Raises LeaderStopped when the leader left with an error."""
  assert not hosts.leader
  n = 1
  while True:
    request = hosts.get(f"request/{n}")
    if request is not None:
      _request(n, request, local, hosts)
      n += 1
      continue
    left = hosts.posted("exit")
    if 0 in left:
      if left[0] is not None:
        raise LeaderStopped(*left[0])
      return
    time.sleep(hosts.poll_s)


__all__ = ["Hosts", "LeaderStopped", "PodTrainer", "current", "follow", "join"]
