"""An evolution across processes (evotrainer/evolution/pod.py).

The protocol first, without JAX: a leader (`PodTrainer`) and a follower (`follow`) in
two threads share an in-memory stand-in for the coordination service's key-value store,
and their children are planted Python processes: each branch runs one child per process
with the same request, one failure stops the other child and fails the branch with the
failing process's log, and the leader's departure ends the follower.

Then the product end to end (slow): `python -m evotrainer.launch --gin_file=gin/math.gin`
shrunk to one generation of one branch (1 RL step, 2-layer model, no warm start, 8
validation problems x 2 samples), once as 1 process x 4 CPU devices and once as 2 local
processes x 2 devices. The 2-process run must write one ledger (process 0's; process 1
writes nothing but its part of the branches' Orbax checkpoints and its children's logs)
and end with the 1-process run's lineage: the same versions, parents, bindings, statuses,
decisions and incumbent, and the same scores (held-out figures and proxy rewards within
rtol 1e-5, the tolerance of tests/sharding/test_multihost_train.py and for the same
reason). Its branches must have trained across both processes (process 1's child logs
its step figures). Relaunched with a second generation, both runs resume from their
ledgers (generation 1 is not trained again) and still end alike. A sweep across
processes is held to the same standard.
"""

import json
import math
import pathlib
import sys
import threading

import pytest

from evotrainer import errors, infra
from evotrainer.evolution import pod
from evotrainer.evolution.ledger import Ledger
from evotrainer.evolution.trainer import BranchFailed, SubprocessTrainer
from tests.evolution.test_controller import lineage
from tests.sharding.spawn import TINY_RL_BINDINGS, one_and_two, writes

# ------------------------------------------------------------------ the protocol


class FakeStore:
  """The coordination service's key-value calls pod.py makes, in memory, with its errors."""

  def __init__(self):
    self.data, self.lock = {}, threading.Lock()

  def key_value_set(self, key, value):
    with self.lock:
      if key in self.data:
        raise RuntimeError(f"ALREADY_EXISTS: key {key} already exists.")
      self.data[key] = value

  def key_value_try_get(self, key):
    with self.lock:
      if key not in self.data:
        raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
      return self.data[key]

  def key_value_dir_get(self, key):
    with self.lock:
      return sorted((k, v) for k, v in self.data.items() if k.startswith(key))


# A planted branch child: `CHILD WORKDIR PLAN_JSON`; PLAN maps its process id to 'ok'
# (process 0 writes branch_result.json), 'fail' (launch.py's one-line disk error, exit 2)
# or 'hang' (sleeps until stopped).
CHILD = """
import json, os, pathlib, sys, time
workdir, plan = pathlib.Path(sys.argv[1]), json.loads(sys.argv[2])
me = os.environ["EVO_PROCESS_ID"]
print(f"child {me} of {os.environ['EVO_NUM_PROCESSES']} at {os.environ['EVO_COORDINATOR']}"
      f" pod={os.environ.get('EVO_TPU_POD')}", flush=True)
if plan[me] == "fail":
  print(f"error (disk): disk full writing {workdir}/checkpoints/1", flush=True)
  sys.exit(2)
if plan[me] == "hang":
  time.sleep(120)
if me == "0":
  result = {"version": "v1.0", "checkpoint": str(workdir / "model"), "final": {"avg8": 0.5},
            "initial": {"avg8": 0.25}, "per_problem": {"p0": 0.5}, "series": {},
            "rollouts": ""}
  (workdir / "branch_result.json").write_text(json.dumps(result))
"""


class PlantedTrainer(SubprocessTrainer):

  def __init__(self, plan):
    super().__init__([], timeout_s=60)
    self.plan = json.dumps(plan)

  def command(self, *, version, parent_checkpoint, bindings, seed, workdir):
    return [sys.executable, "-c", CHILD, workdir, self.plan]


def _pair(plan, monkeypatch):
  monkeypatch.setenv("EVO_TPU_POD", "1")  # the parents' own: never the children's
  store = FakeStore()
  hosts = [pod.Hosts(i, 2, "localhost:1234", store, poll_s=0.05) for i in range(2)]
  return store, pod.PodTrainer(PlantedTrainer(plan), hosts[0]), hosts[1]


def _follow(trainer, hosts, out):
  try:
    pod.follow(trainer, hosts)
    out.append("returned")
  except Exception as e:  # pylint: disable=broad-except
    out.append(e)


def _train(leader, tmp_path, n=1):
  return leader.train(version="v1.0", parent_checkpoint=None, bindings=["x.y = 1"],
                      seed=3, workdir=str(tmp_path / f"v{n}"))


def test_each_branch_trains_on_every_process_and_the_follower_ends_with_the_leader(
    tmp_path, monkeypatch):
  store, leader, follower = _pair({"0": "ok", "1": "ok"}, monkeypatch)
  out = []
  thread = threading.Thread(target=_follow, args=(leader.local, follower, out))
  thread.start()
  for n in (1, 2):
    r = _train(leader, tmp_path, n)
    assert r.final == {"avg8": 0.5} and r.workdir == str(tmp_path / f"v{n}")
    logs = [(tmp_path / f"v{n}" / name).read_text()
            for name in ("branch.log", "branch.process1.log")]
    # One run of two processes, at the leader's host and a port of its own.
    port = logs[0].split("localhost:")[1].split()[0]
    assert f"child 0 of 2 at localhost:{port} pod=None" in logs[0]
    assert f"child 1 of 2 at localhost:{port} pod=None" in logs[1]
    assert port != "1234"
    request = json.loads(store.data[f"evotrainer/pod/request/{n}"])
    assert request["bindings"] == ["x.y = 1"] and request["seed"] == 3
  leader.hosts.leave(None)
  thread.join(timeout=30)
  assert out == ["returned"]


def test_one_failing_child_fails_the_branch_on_every_process(tmp_path, monkeypatch):
  store, leader, follower = _pair({"0": "hang", "1": "fail"}, monkeypatch)
  out = []
  thread = threading.Thread(target=_follow, args=(leader.local, follower, out))
  thread.start()
  with pytest.raises(BranchFailed) as e:
    _train(leader, tmp_path)
  # The cause is process 1's own failure; process 0's child was stopped, not timed out.
  assert e.value.rc == 2 and "failed on process 1 of 2 (2)" in str(e.value)
  assert "error (disk): disk full" in e.value.log_tail
  assert infra.as_failure(e.value).kind == "disk full"  # retried once, as for one process
  status = {i: json.loads(store.data[f"evotrainer/pod/status/1/{i}"])["rc"] for i in (0, 1)}
  assert status == {0: "stopped", 1: 2}
  leader.hosts.leave(["disk", "disk full writing x"])
  thread.join(timeout=30)
  assert len(out) == 1 and isinstance(out[0], pod.LeaderStopped)
  assert errors.explain(out[0]) == ("disk", "process 0 stopped the run: disk full writing x")


class Unlaunchable(PlantedTrainer):

  def command(self, **kw):
    raise OSError("no python here")


def test_a_follower_that_cannot_start_its_child_fails_the_branch(tmp_path, monkeypatch):
  _, leader, follower = _pair({"0": "hang", "1": "ok"}, monkeypatch)
  out = []
  thread = threading.Thread(target=_follow, args=(Unlaunchable({}), follower, out))
  thread.start()
  with pytest.raises(BranchFailed, match="on process 1 of 2 \\(error\\)") as e:
    _train(leader, tmp_path)
  assert "process 1 could not run its child: OSError: no python here" in e.value.log_tail
  thread.join(timeout=30)
  assert len(out) == 1 and isinstance(out[0], OSError)


def test_a_follower_that_left_fails_the_branch(tmp_path, monkeypatch):
  _, leader, follower = _pair({"0": "hang", "1": "ok"}, monkeypatch)
  follower.leave(["memory", "out of memory"])  # e.g. died before its first request
  with pytest.raises(BranchFailed, match="on process 1 of 2 \\(left\\)") as e:
    _train(leader, tmp_path)
  assert "process 1 left the run: ['memory', 'out of memory']" in e.value.log_tail


def test_a_sweep_runs_on_process_0_and_trains_each_variant_on_every_process(
    tmp_path, monkeypatch):
  """`run.mode='sweep'` across processes (run.evolve): process 0 runs the sweep driver
  with a PodTrainer, the other process follows; the root and the variant each train as
  one request that both processes run."""
  import gin

  import evotrainer.train  # noqa: F401  (registers the gin configurables the space names)
  from evotrainer.modes import evolve as evolve_mode
  from tests.evolution.test_controller import space
  monkeypatch.setenv("EVO_TPU_POD", "1")
  store, plan = FakeStore(), json.dumps({"0": "ok", "1": "ok"})
  monkeypatch.setattr(SubprocessTrainer, "command",
                      lambda self, workdir, **kw: [sys.executable, "-c", CHILD, workdir, plan])
  hosts = [pod.Hosts(i, 2, "localhost:1234", store, poll_s=0.05) for i in range(2)]
  mine = threading.local()
  monkeypatch.setattr(pod, "current", lambda: mine.hosts)
  sweep_file = tmp_path / "one.sweep"
  sweep_file.write_text("[variant rloo]\nHarness.estimator = 'rloo'\n")
  gin.clear_config()
  gin.bind_parameter("sweep.file", str(sweep_file))
  workdir = tmp_path / "sweep"
  out = []

  def follower():
    mine.hosts = hosts[1]
    try:
      out.append(evolve_mode.evolve(str(workdir), 3, space=space(), mode="sweep"))
    except Exception as e:  # pylint: disable=broad-except
      out.append(e)

  thread = threading.Thread(target=follower)
  thread.start()
  mine.hosts = hosts[0]
  try:
    summary = evolve_mode.evolve(str(workdir), 3, space=space(), mode="sweep", backtest=False)
  finally:
    hosts[0].leave(None)
    thread.join(timeout=30)
    gin.clear_config()
  assert out == [None]  # the follower ran no driver and wrote no summary
  assert summary["mode"] == "sweep" and [r["variant"] for r in summary["sweep"]] == ["rloo"]
  requests = sorted(k for k in store.data if k.startswith("evotrainer/pod/request/"))
  assert len(requests) == 2  # the root, then the variant
  for vid in ("v0", "s-rloo"):
    log1 = (workdir / "versions" / vid / "branch.process1.log").read_text()
    assert "child 1 of 2" in log1
  with Ledger(workdir / "ledger.sqlite") as ledger:
    assert {v.id: v.parent for v in ledger.versions()} == {"v0": None, "s-rloo": "v0"}


# ------------------------------------------------------------------ end to end

TIMEOUT_S = 1200  # per run; a hang guard, generous for 2 shared cores and 2 test workers
RTOL = 1e-5


def _argv(workdir: pathlib.Path, cache: pathlib.Path, extra: tuple = (),
          generations: int = 1) -> list:
  bindings = [f"evolve.generations = {generations}", "evolve.branches = 1",
              "evolve.branch_steps = 1",
              "evolve.control = False", *TINY_RL_BINDINGS,
              f"make_tokenizer.cache_dir = '{cache}'"]
  return [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin",
          "--gin_file=gin/tiny.gin", "--gin_file=gin/mesh/data.gin",
          f"--workdir={workdir}", *[f"--gin_bindings={b}" for b in bindings], *extra]


def _record(workdir: pathlib.Path) -> tuple:
  """(lineage, decisions, {version: scores}) of a run's ledger."""
  with Ledger(workdir / "ledger.sqlite") as ledger:
    decisions = [(d.id, d.parent, d.version_id, d.outcome, d.why,
                  json.dumps(d.intervention, sort_keys=True)) for d in ledger.decisions()]
    scores = {v.id: {**{k: x for k, x in v.heldout.items() if isinstance(x, float)},
                     "proxy_reward": v.metrics["proxy_reward"],
                     "train_reward": v.metrics["result"]["series"]["reward"]}
              for v in ledger.versions()}
    return lineage(ledger), decisions, scores


def _close(a, b) -> bool:
  if isinstance(a, list):
    return len(a) == len(b) and all(map(_close, a, b))
  return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-7)


def _orbax_or_own_log(p: pathlib.Path) -> bool:
  """What process 1 may write: its part of a branch's checkpoints and model export
  (Orbax saves collectively), and its own child's log."""
  return (len(p.parts) >= 3 and p.parts[0] == "versions" and
          (p.parts[2].startswith(("checkpoints", "model")) or
           p.parts[2] == "branch.process1.log"))


def _same_record(one: pathlib.Path, two: pathlib.Path) -> tuple:
  """The two runs' `_record`s, asserted equal (scores within RTOL); returns the first."""
  ref, got = _record(one), _record(two)
  assert got[0] == ref[0] and got[1] == ref[1], (ref, got)
  assert got[2].keys() == ref[2].keys()
  for vid, s in ref[2].items():
    assert s.keys() == got[2][vid].keys(), vid
    for k in s:
      assert _close(s[k], got[2][vid][k]), (vid, k, s[k], got[2][vid][k])
    print(f"{vid}: " + ", ".join(f"{k} {s[k]} vs {got[2][vid][k]}" for k in s))
  return ref


def _trained_across_processes(two: pathlib.Path, versions: tuple, w1: set) -> None:
  """Every version trained across both processes (process 1's child logged its step);
  process 1 wrote only Orbax files and its children's logs."""
  for vid in versions:
    log1 = (two / "versions" / vid / "branch.process1.log").read_text()
    assert "[train] process 1 step 1:" in log1, log1[-3000:]
    assert "devices=4" in (two / "versions" / vid / "branch.log").read_text()
  assert not [p for p in w1 if not _orbax_or_own_log(p)], sorted(map(str, w1))
  assert any(p.parts[2] == "checkpoints" for p in w1)  # the branches did span process 1


@pytest.mark.slow
def test_evolve_two_processes_match_one(tmp_path):
  cache = tmp_path / "tokenizers"
  one, two = tmp_path / "one", tmp_path / "two"
  one_and_two(lambda workdir: _argv(workdir, cache), tmp_path, TIMEOUT_S)

  # The same lineage, decisions and scores.
  ref = _same_record(one, two)
  # ... a lineage with a decision in it, and proxy rewards far from zero (their equality
  # says something).
  versions, incumbent = ref[0]
  assert [v[:2] for v in versions] == [("v0", None), ("v1.0", "v0")] and incumbent
  assert [d[3] for d in ref[1]] and all(d[3] for d in ref[1]), ref[1]
  assert all(s["proxy_reward"] < -0.05 for s in ref[2].values()), ref[2]

  # Every branch trained across both processes; one ledger, one summary: process 0's.
  w0, w1 = writes(tmp_path / "writes0.txt", two), writes(tmp_path / "writes1.txt", two)
  _trained_across_processes(two, ("v0", "v1.0"), w1)
  for name in ("ledger.sqlite", "summary.json", "report.html"):
    assert pathlib.Path(name) in w0, (name, sorted(map(str, w0))[:50])
  summary = json.loads((two / "summary.json").read_text())
  assert [v["id"] for v in summary["versions"]] == ["v0", "v1.0"]

  # Relaunched with a second generation, both runs resume from their ledger (nothing
  # trained again) and the 2-process run still ends as the 1-process run does.
  logs = one_and_two(lambda workdir: _argv(workdir, cache, generations=2), tmp_path,
                     TIMEOUT_S, phase="-resume")
  assert "training v2.0" in logs[0] and "training v1.0" not in logs[0], logs[0][-3000:]
  resumed = _same_record(one, two)
  assert [v[:2] for v in resumed[0][0]] == [("v0", None), ("v1.0", "v0"), ("v2.0", incumbent)]
  assert resumed[0][0][:2] == versions  # generation 1 as it was
  w1 = writes(tmp_path / "writes1-resume.txt", two)
  _trained_across_processes(two, ("v2.0",), w1)


@pytest.mark.slow
def test_sweep_two_processes_match_one(tmp_path):
  """`run.mode='sweep'` through the launcher as 2 processes x 2 devices: process 0 runs
  the sweep driver, the root and the variant train across both processes, and the run
  ends as the 1-process sweep does (one ledger, the same versions and scores)."""
  cache = tmp_path / "tokenizers"
  one, two = tmp_path / "one", tmp_path / "two"
  sweep_file = tmp_path / "one.sweep"
  sweep_file.write_text("[variant rloo]\nHarness.estimator = 'rloo'\n")
  extra = ("--gin_bindings=run.mode = 'sweep'", f"--sweep_file={sweep_file}")
  one_and_two(lambda workdir: _argv(workdir, cache, extra), tmp_path, TIMEOUT_S)
  ref = _same_record(one, two)
  assert [v[:2] for v in ref[0][0]] == [("v0", None), ("s-rloo", "v0")]
  w0, w1 = writes(tmp_path / "writes0.txt", two), writes(tmp_path / "writes1.txt", two)
  _trained_across_processes(two, ("v0", "s-rloo"), w1)
  assert pathlib.Path("ledger.sqlite") in w0 and pathlib.Path("summary.json") in w0
  summary = json.loads((two / "summary.json").read_text())
  assert summary["mode"] == "sweep" and [r["variant"] for r in summary["sweep"]] == ["rloo"]
  single = json.loads((one / "summary.json").read_text())["sweep"]
  assert [(r["variant"], r["status"]) for r in summary["sweep"]] == [
      (r["variant"], r["status"]) for r in single]
  assert _close([r["heldout_avg8"] for r in summary["sweep"]],
                [r["heldout_avg8"] for r in single])
