"""Ledger: idempotent records, promotion and rollback, the escalation counter, crash safety."""

import hashlib
import math
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from evotrainer.evolution.ledger import SCHEMA_VERSION, Ledger, LedgerError
from evotrainer.evolution.search_space import make_intervention

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger(tmp_path):
  with Ledger(tmp_path / "ledger.sqlite") as led:
    yield led


def finding(kind="dead_group_ratio", value=0.6, severity=0.5, layer="signal", threshold=0.5,
            evidence=(("v0/0/1", "2 + 2 = 5"),)):
  from evotrainer.types import Finding
  return Finding(kind=kind, layer=layer, severity=severity, value=value,
                 threshold=threshold, message=f"{kind} {value}", evidence=tuple(evidence))


def root(led, id="v0"):
  led.add_harness_version("h0", {"dead_group_ratio": {"threshold": 0.5}},
                          {"proxy_true_disagreement": {"threshold": 0.05}}, reason="default")
  led.add_version(id, None, bindings={"Learner.clip_high": 0.28}, gin="X = 1",
                  harness_version="h0", status="kept", reason="base")
  led.promote(id, "base")


# ------------------------------------------------------------------ opening


def test_new_ledger_settings(ledger):
  c = ledger._conn
  assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
  assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
  assert c.execute("PRAGMA foreign_keys").fetchone()[0] == 1
  assert ledger.schema_version == SCHEMA_VERSION
  tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
  assert {"meta", "versions", "attempts", "findings", "decisions", "harness_versions",
          "skills_used"} <= tables
  assert ledger.incumbent() is None and ledger.versions() == []


def test_reopen_keeps_everything(tmp_path):
  path = tmp_path / "l.sqlite"
  with Ledger(path) as led:
    root(led)
    led.set_meta("rng", {"seed": 7})
  with Ledger(path) as led:
    assert led.incumbent().id == "v0"
    assert led.get_meta("rng") == {"seed": 7}


def test_run_uid_is_drawn_once_kept_on_reopen_and_differs_between_runs(tmp_path):
  with Ledger(tmp_path / "a.sqlite") as a, Ledger(tmp_path / "b.sqlite") as b:
    uid = a.run_uid
    assert len(uid) == 32 and int(uid, 16) >= 0 and uid != b.run_uid
  with Ledger(tmp_path / "a.sqlite") as a:
    assert a.run_uid == uid
    with pytest.raises(LedgerError, match="managed by the ledger"):
      a.set_meta("run_uid", "mine")


def test_a_ledger_written_before_run_uid_gets_one_on_first_use(tmp_path):
  path = tmp_path / "old.sqlite"
  with Ledger(path) as led:
    led._conn.execute("DELETE FROM meta WHERE key='run_uid'")
    assert led.get_meta("run_uid") is None
  with Ledger(path) as led:
    uid = led.run_uid
  with Ledger(path) as led:
    assert led.run_uid == uid


def _digest(path):
  return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def test_other_schema_version_is_refused_and_untouched(tmp_path):
  path = tmp_path / "l.sqlite"
  with Ledger(path) as led:
    root(led)
  c = sqlite3.connect(path)
  c.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
  c.commit()
  c.close()
  before, mtime = _digest(path), os.stat(path).st_mtime_ns
  with pytest.raises(LedgerError, match=r"schema version 99.*reads version 1.*untouched"):
    Ledger(path)
  assert _digest(path) == before and os.stat(path).st_mtime_ns == mtime


def test_not_a_ledger_is_refused_and_untouched(tmp_path):
  other = tmp_path / "other.sqlite"
  c = sqlite3.connect(other)
  c.execute("CREATE TABLE t (x)")
  c.commit()
  c.close()
  before = _digest(other)
  with pytest.raises(LedgerError, match="not an EvoTrainer ledger"):
    Ledger(other)
  assert _digest(other) == before
  junk = tmp_path / "junk.sqlite"
  junk.write_bytes(b"this is not sqlite at all" * 100)
  with pytest.raises(LedgerError, match="junk.sqlite"):
    Ledger(junk)
  assert junk.read_bytes() == b"this is not sqlite at all" * 100


# ------------------------------------------------------------------ versions and lineage


def test_add_version_is_idempotent_by_id(ledger):
  root(ledger)
  ledger.add_version("v1", "v0", bindings={"Learner.clip_high": 0.32}, created_step=100,
                     harness_version="h0")
  ledger.add_version("v1", "v0", bindings={"Learner.clip_high": 0.32}, created_step=100,
                     harness_version="h0")  # a resumed run redoing the step
  assert [v.id for v in ledger.versions()] == ["v0", "v1"]
  with pytest.raises(LedgerError, match=r"versions v1 is already recorded.*bindings"):
    ledger.add_version("v1", "v0", bindings={"Learner.clip_high": 0.24}, created_step=100,
                       harness_version="h0")
  with pytest.raises(LedgerError, match="parent"):
    ledger.add_version("v1", None, bindings={"Learner.clip_high": 0.32}, created_step=100,
                       harness_version="h0")
  # Once decided, re-adding does not reset the status.
  ledger.reject("v1", "below the incumbent")
  ledger.add_version("v1", "v0", bindings={"Learner.clip_high": 0.32}, created_step=100,
                     harness_version="h0")
  assert ledger.version("v1").status == "rejected"


def test_foreign_keys_and_statuses(ledger):
  with pytest.raises(LedgerError, match="referenced"):
    ledger.add_version("v1", "missing-parent")
  with pytest.raises(LedgerError, match="status 'great'"):
    ledger.add_version("v1", status="great")
  with pytest.raises(LedgerError, match="not in the ledger"):
    ledger.version("nope")


def test_update_version_fields(ledger):
  root(ledger)
  ledger.update_version("v0", checkpoint="/ck/v0", metrics={"proxy_reward": 0.5},
                        heldout={"avg8": 0.25, "noise": 0.01, "per_problem": [1, 0]})
  v = ledger.version("v0")
  assert (v.checkpoint, v.metrics, v.heldout) == (
      "/ck/v0", {"proxy_reward": 0.5}, {"avg8": 0.25, "noise": 0.01, "per_problem": [1, 0]})
  assert v.gin == "X = 1" and v.bindings == {"Learner.clip_high": 0.28}


def test_lineage_children_and_binding_history(ledger):
  root(ledger)
  ledger.add_version("v1", "v0", bindings={"RewardComposer.parts": {"correct": 1.0,
                                                                    "partial": 0.3}})
  ledger.add_version("v2", "v0", bindings={"Learner.clip_high": 0.24})
  ledger.add_version("v3", "v1", bindings={"Learner.clip_high": 0.35})
  assert [v.id for v in ledger.lineage("v3")] == ["v3", "v1", "v0"]
  assert [v.id for v in ledger.children("v0")] == ["v1", "v2"]
  assert ledger.children("v3") == []
  assert ledger.binding_history("v3", "Learner.clip_high") == [("v0", 0.28), ("v3", 0.35)]
  assert ledger.binding_history("v2", "RewardComposer.parts") == []


def test_promotion_rejection_and_rollback(ledger):
  root(ledger)
  ledger.add_version("v1", "v0")
  ledger.add_version("v2", "v0")
  with ledger.transaction():
    ledger.reject("v2", "validator proxy_true_disagreement")
    ledger.promote("v1", "avg8 +0.05 beyond noise 0.02")
  assert ledger.incumbent().id == "v1"
  assert ledger.version("v2").reason == "validator proxy_true_disagreement"
  ledger.add_version("v3", "v1")
  ledger.promote("v3", "avg8 +0.03")
  # A revised harness demotes v3: the incumbent rolls back to its nearest kept ancestor.
  ledger.reject("v3", "demoted: length_gaming under harness h1")
  assert ledger.incumbent().id == "v1"
  ledger.set_status("v1", "pruned", "superseded")
  assert ledger.incumbent().id == "v0"
  with pytest.raises(LedgerError, match="only a kept or merged"):
    ledger.set_incumbent("v3")
  ledger.set_incumbent("v0")
  assert ledger.versions(status="kept") == [ledger.version("v0")]
  assert [v.id for v in ledger.versions(status="rejected")] == ["v2", "v3"]


def test_consecutive_rejections(ledger):
  root(ledger)
  assert ledger.consecutive_rejections() == 0
  for i in (1, 2):
    ledger.add_version(f"v{i}", "v0")
    ledger.reject(f"v{i}", "below incumbent")
  assert ledger.consecutive_rejections() == 2
  # A generation of three branches: the winner is promoted, its siblings rejected after.
  for i in (3, 4, 5):
    ledger.add_version(f"v{i}", "v0")
  with ledger.transaction():
    ledger.promote("v3", "beyond noise")
    ledger.reject("v4", "below v3")
    ledger.reject("v5", "below v3")
  assert ledger.consecutive_rejections() == 0  # siblings are not branches of v3
  for i in (6, 7, 8):
    ledger.add_version(f"v{i}", "v3")
    ledger.reject(f"v{i}", "no gain")
  assert ledger.consecutive_rejections() == 3
  ledger.reject("v8", "no gain")  # same status and reason: a no-op, not a 4th rejection
  assert ledger.consecutive_rejections() == 3
  ledger.set_incumbent("v0")  # escalation: roll back; the counter restarts
  assert ledger.consecutive_rejections() == 0


def test_transaction_rolls_back_on_error(ledger):
  root(ledger)
  with pytest.raises(RuntimeError):
    with ledger.transaction():
      ledger.add_version("v1", "v0")
      ledger.promote("v1")
      raise RuntimeError("boom")
  assert not ledger.has_version("v1") and ledger.incumbent().id == "v0"
  # A nested failure undoes only its own savepoint.
  with ledger.transaction():
    ledger.add_version("v2", "v0")
    with pytest.raises(LedgerError):
      with ledger.transaction():
        ledger.add_version("v3", "v0")
        ledger.add_version("v2", "v1")  # contradicts v2
  assert ledger.has_version("v2") and not ledger.has_version("v3")


# ------------------------------------------------------------------ the other records


def test_findings_round_trip(ledger):
  root(ledger)
  fs = [finding(), finding("entropy", value=float("nan"), layer="model", evidence=())]
  ledger.add_findings("v0", fs)
  ledger.add_findings("v0", fs)  # again: no-op
  got = ledger.findings("v0")
  assert [f.id for f in got] == ["v0/diagnose/0", "v0/diagnose/1"]
  assert got[0].to_finding() == fs[0]
  assert got[0].evidence == (("v0/0/1", "2 + 2 = 5"),)
  assert math.isnan(got[1].value) and got[1].kind == "entropy"
  with pytest.raises(LedgerError, match="2 recorded, 1 given"):
    ledger.add_findings("v0", fs[:1])
  with pytest.raises(LedgerError, match="value"):
    ledger.add_findings("v0", [finding(value=0.7), fs[1]])
  ledger.add_findings("v0", [finding("truncation", layer="efficiency")], stage="replay/h1")
  assert len(ledger.findings("v0")) == 3 and len(ledger.findings("v0", stage="replay/h1")) == 1


def test_decisions_attempts_skills_harness(ledger):
  root(ledger)
  iv = make_intervention("RewardComposer.parts", {"correct": 1.0},
                         {"correct": 1.0, "partial": 0.3})
  ledger.add_decision("d1", "v0", hypothesis="if partial credit then DGR falls because ...",
                      intervention=iv, criterion="avg8 > incumbent + noise",
                      skill="dead_groups_add_partial_credit")
  ledger.add_decision("d1", "v0", hypothesis="if partial credit then DGR falls because ...",
                      intervention=iv.to_dict(), criterion="avg8 > incumbent + noise",
                      skill="dead_groups_add_partial_credit")  # same content as a dict
  ledger.update_decision("d1", backtest={"rescued": 9, "dead": 20})
  ledger.add_version("v1", "v0", bindings={"RewardComposer.parts": iv.new})
  ledger.update_decision("d1", version_id="v1")
  ledger.add_attempt("a1", "v1", "v0", iv.id)
  ledger.add_attempt("a1", "v1", "v0", iv.id)
  assert [a.status for a in ledger.attempts(status="running")] == ["running"]
  ledger.finish_attempt("a1")
  a = ledger.attempts("v1")[0]
  assert a.status == "done" and a.finished >= a.started and a.intervention_id == iv.id
  ledger.update_decision("d1", outcome="success", why="avg8 0.31 vs 0.25 ± 0.02")
  d = ledger.decisions("v1")[0]
  assert (d.parent, d.version_id, d.outcome, d.backtest) == ("v0", "v1", "success",
                                                             {"rescued": 9, "dead": 20})
  assert d.intervention["gin"] == iv.to_gin() and d.intervention["id"] == iv.id
  assert ledger.decisions(parent="v0") == [d]
  with pytest.raises(LedgerError, match="outcome 'great'"):
    ledger.update_decision("d1", outcome="great")
  with pytest.raises(LedgerError, match="backtest"):  # recorded, then contradicted
    ledger.add_decision("d1", "v0", hypothesis=d.hypothesis, intervention=iv,
                        criterion=d.criterion, skill=d.skill, backtest={"rescued": 3})
  # A decision dropped at its backtest has no version.
  ledger.add_decision("d2", "v0", hypothesis="h", intervention=iv, criterion="c")
  ledger.update_decision("d2", outcome="dropped", why="rescued 1 of 20 dead groups")
  assert ledger.decision("d2").version_id is None
  ledger.add_skill_use("v1", "dead_groups_add_partial_credit", "d1", domain="math")
  ledger.set_skill_outcome("v1", "dead_groups_add_partial_credit", "success")
  (use,) = ledger.skills_used("v1")
  assert (use.skill, use.decision_id, use.domain, use.outcome) == (
      "dead_groups_add_partial_credit", "d1", "math", "success")
  ledger.add_harness_version("h1", {"dead_group_ratio": {"threshold": 0.5},
                                    "length_reward_corr": {"threshold": 0.3}},
                             {"proxy_true_disagreement": {"threshold": 0.05}}, parent="h0",
                             reason="length gaming suspected")
  assert [h.id for h in ledger.harness_versions()] == ["h0", "h1"]
  assert ledger.harness_version("h1").diagnostics["length_reward_corr"] == {"threshold": 0.3}
  with pytest.raises(LedgerError, match="harness_versions h1"):
    ledger.add_harness_version("h1", {}, {}, parent="h0")


def test_meta_keys(ledger):
  root(ledger)
  with pytest.raises(LedgerError, match="managed by the ledger"):
    ledger.set_meta("incumbent", "v9")
  assert ledger.get_meta("missing", 3) == 3


def test_table(ledger):
  root(ledger)
  ledger.update_version("v0", heldout={"avg8": 0.25, "noise": 0.02},
                        metrics={"proxy_reward": 0.25})
  iv = make_intervention("Learner.clip_high", 0.28, 0.35)
  ledger.add_version("v1", "v0", bindings={"Learner.clip_high": 0.35}, created_step=100)
  ledger.add_decision("d1", "v0", hypothesis="h", intervention=iv, criterion="c",
                      version_id="v1")
  ledger.update_version("v1", heldout={"avg8": 0.31, "noise": 0.02})
  ledger.promote("v1", "avg8 +0.06 beyond noise")
  ledger.add_version("v2", "v1", bindings={"Harness.estimator": "rloo"}, created_step=200)
  ledger.reject("v2", "validator length_gaming: corr 0.41 > 0.3")
  lines = ledger.table().splitlines()
  assert lines[0].split() == ["version", "status", "step", "heldout", "proxy", "change",
                              "reason"]
  row0, row1, row2 = lines[2:]
  assert row0.startswith("  v0 ") and "avg8 0.2500±0.0200" in row0 and "0.2500" in row0
  assert row1.startswith("*   v1 ") and "Learner.clip_high: 0.28 -> 0.35" in row1
  assert row2.startswith("      v2 ") and "rejected" in row2
  assert 'Harness.estimator="rloo"' in row2 and "validator length_gaming" in row2


# ------------------------------------------------------------------ crash safety


_CHILD = textwrap.dedent("""
    import sys, time
    from evotrainer.evolution.ledger import Ledger
    led = Ledger(sys.argv[1])
    led.add_version("v0", None, bindings={"a.b": 1}, status="kept")
    led.promote("v0", "base")
    with led.transaction():  # committed
      led.add_version("v1", "v0", bindings={"a.b": 2})
    with led.transaction():  # killed inside
      led.add_version("v2", "v0", bindings={"a.b": 3})
      led.add_findings("v2", [])
      led.add_attempt("a2", "v2", "v0", "iv2")
      led.promote("v2", "should never be visible")
      led.set_meta("step", 2)
      print("inside", flush=True)
      time.sleep(60)
""")


def test_kill_9_inside_a_transaction_leaves_the_previous_state(tmp_path):
  path = tmp_path / "ledger.sqlite"
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
  try:
    line = proc.stdout.readline()
    assert line.strip() == "inside", proc.stderr.read()
    os.kill(proc.pid, signal.SIGKILL)
  finally:
    proc.wait(timeout=30)
  assert proc.returncode == -signal.SIGKILL
  with Ledger(path) as led:
    assert [v.id for v in led.versions()] == ["v0", "v1"]
    assert led.incumbent().id == "v0"
    assert led.attempts() == [] and led.get_meta("step") is None
    led.add_version("v2", "v0", bindings={"a.b": 3})  # the resumed run redoes the step
    assert [v.id for v in led.versions()] == ["v0", "v1", "v2"]


def test_score_labels_follow_the_evaluation_k(tmp_path):
  from evotrainer.evolution.stats import score_label
  assert score_label({"avg2": 0.3, "pass2": 0.5, "avg8": 0.3}) == "avg@2"
  assert score_label({"avg8": 0.3, "pass8": 0.5}) == "avg@8"
  with Ledger(tmp_path / "l.sqlite") as ledger:
    ledger.add_version("v0", None)
    ledger.update_version("v0", heldout={"avg2": 0.3, "pass2": 0.5, "avg8": 0.3,
                                         "noise": 0.02})
    row = [l for l in ledger.table().splitlines() if l.split()[:1] == ["v0"]][0]
    assert "avg@2 0.3000±0.0200" in row and "avg8" not in row
