"""Sweep mode on scripted trainers (no JAX training), and one end-to-end run."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from evotrainer import registry
from evotrainer.evolution.controller import Controller
from evotrainer.evolution.ledger import Ledger
from evotrainer.evolution.skills import SkillLibrary
from evotrainer.evolution.sweep import (Sweep, SweepError, Variant, format_table,
                                        gin_harness_builder, start_from)
from evotrainer.evolution.sweep_file import check_variants, expand_grid, parse_sweep
from tests.evolution.test_controller import VALUES, Crash, ScriptedTrainer, space

# The sweeps below name Learner, Harness, RewardComposer: their modules must be imported
# (the child of test_sigkill_and_resume imports this module too).
registry.register_builtins()

REPO = pathlib.Path(__file__).resolve().parents[2]

SWEEP = """
# three variants
[variant rloo]
Harness.estimator = 'rloo'

[variant hack]
RewardComposer.parts = {'correct': 1.0,
                        'hack': 0.5}

[variant small_lr]
Learner.learning_rate = 2e-5
"""
EFFECTS = {"'rloo'": {"delta": 0.2}, "2e-05": {"delta": 0.005},
           "'hack'": {"delta": 0.3, "hack": True}, "'partial'": {"delta": 0.2}}


class RecordingTrainer(ScriptedTrainer):
  """Records what each call was given (parent checkpoint, seed, bindings)."""

  def __init__(self, effects, crash_at=None):
    super().__init__(effects, crash_at)
    self.given = {}

  def train(self, **kw):
    r = super().train(**kw)
    self.given[kw["version"]] = kw
    return r


def make(workdir, trainer=None, skills=True, **kw):
  ledger = Ledger(pathlib.Path(workdir) / "ledger.sqlite")
  lib = SkillLibrary.seeded(pathlib.Path(workdir) / "skills") if skills else None
  c = Controller(ledger, trainer or RecordingTrainer(EFFECTS), space(), lib, workdir=workdir,
                 values=VALUES, seed=3, bootstrap_n=1000, **kw)
  return c, ledger


def snapshot(ledger):
  """Everything a sweep could write, comparable."""
  meta = ledger._q("SELECT key, value FROM meta ORDER BY key")  # noqa: SLF001
  return ([(v.id, v.parent, v.status, v.reason, json.dumps(v.heldout, sort_keys=True))
           for v in ledger.versions()],
          [(d.id, d.outcome, d.why) for d in ledger.decisions()],
          [(a.id, a.status) for a in ledger.attempts()], [tuple(m) for m in meta])


# ------------------------------------------------------------------ the file


def test_grid_expands_to_the_product_hand_checked():
  text = """
[variant alone]
Learner.clip_high = 0.3
[grid g]
Learner.learning_rate = [1e-5, 2e-5]
Harness.estimator = ['grpo', 'rloo', 'dr_grpo']
"""
  vs = parse_sweep(text)
  assert [v.name for v in vs] == ["alone"] + [f"g-{i}" for i in range(1, 7)]
  # The first line varies slowest (itertools.product order): 2 x 3 = 6.
  assert [tuple(v.bindings.values()) for v in vs[1:]] == [
      (1e-5, "grpo"), (1e-5, "rloo"), (1e-5, "dr_grpo"),
      (2e-5, "grpo"), (2e-5, "rloo"), (2e-5, "dr_grpo")]
  assert all(list(v.bindings) == ["Learner.learning_rate", "Harness.estimator"]
             for v in vs[1:])
  assert len(expand_grid("h", {"a.b": [1, 2, 3], "c.d": [4, 5], "e.f": [6]})) == 6
  with pytest.raises(SweepError, match=r"grid h.*not a list"):
    expand_grid("h", {"a.b": 1})


def test_parse_values_multiline_references_and_control():
  vs = parse_sweep(SWEEP + "\n[variant filt]\nHarness.group_filters = [@StdGroupFilter()]\n"
                   "StdGroupFilter.top_p = 0.8\n[variant control]\n")
  by = {v.name: v for v in vs}
  assert by["hack"].bindings == {"RewardComposer.parts": {"correct": 1.0, "hack": 0.5}}
  assert by["filt"].gin() == ["Harness.group_filters = [@StdGroupFilter()]",
                              "StdGroupFilter.top_p = 0.8"]
  assert by["control"].bindings == {} and by["small_lr"].version == "s-small_lr"


@pytest.mark.parametrize("text,match", [
    ("[variant a]\nLearner.nope = 1\n", r"variant 'a'.*unknown binding 'Learner.nope'"),
    ("[variant b]\nNope.x = 1\n", r"variant 'b'.*unknown binding 'Nope.x'"),
    ("[variant c]\nHarness.estimator = 'ppo'\n", r"variant 'c'.*outside the search space"),
    ("[variant d]\nLearner.learning_rate = 'fast'\n", r"variant 'd'.*outside the search"),
    ("[variant e]\nRewardComposer.parts = {'correct': 1.0, 'hack': 9.0}\n",
     r"variant 'e'.*outside the search space.*hack"),
    ("[variant f]\ntrain.steps = 5\n", r"variant 'f'.*may not vary"),
    ("[variant g]\nLearner.clip_high = 0.3\n[variant h]\nLearner.clip_high = 0.3\n",
     r"variant 'h'.*same bindings as variant 'g'"),
    ("[variant i]\nHarness.estimator = 'rloo'\n[grid j]\nHarness.estimator = ['rloo', 'grpo']\n",
     r"variant 'j-1'.*same bindings as variant 'i'"),
])
def test_bad_sweeps_name_the_variant_and_leave_the_ledger_untouched(tmp_path, text, match):
  c, ledger = make(tmp_path / "run")
  Sweep(c, parse_sweep(SWEEP)).run()
  before = snapshot(ledger)
  calls = list(c.trainer.calls)
  with pytest.raises(SweepError, match=match):
    Sweep(c, parse_sweep(text)).run()
  assert snapshot(ledger) == before and c.trainer.calls == calls
  # On a fresh workdir nothing is written either (not even the harness or the root).
  c2, ledger2 = make(tmp_path / "fresh")
  with pytest.raises(SweepError, match=match):
    Sweep(c2, parse_sweep(text)).run()
  assert ledger2.versions() == [] and ledger2.get_meta("controller/harness") is None


def test_malformed_files():
  with pytest.raises(SweepError, match=r"<sweep>:1: binding .* before any"):
    parse_sweep("Learner.clip_high = 0.3\n")
  with pytest.raises(SweepError, match=r"<sweep>:2: \[variant a\] Harness.group_filters"):
    parse_sweep("[variant a]\nHarness.group_filters = [@NoSuchFilter()]\n")
  with pytest.raises(SweepError, match="unclosed bracket"):
    parse_sweep("[variant a]\nRewardComposer.parts = {'correct': 1.0,\n")
  with pytest.raises(SweepError, match="binds Learner.clip_high twice"):
    parse_sweep("[variant a]\nLearner.clip_high = 0.3\nLearner.clip_high = 0.4\n")
  with pytest.raises(SweepError, match=r"names repeated: \['a'\]"):
    parse_sweep("[variant a]\n[variant a]\n")
  with pytest.raises(SweepError, match="section header"):
    parse_sweep("[varient a]\n")
  with pytest.raises(SweepError, match="recorded in this workdir's ledger with other"):
    check_variants([Variant("a", {"Learner.clip_high": 0.3})],
                   recorded={"a": {"Learner.clip_high": 0.4}})


# ------------------------------------------------------------------ the run


def test_three_variants_ranked_with_validator_and_noise(tmp_path):
  c, ledger = make(tmp_path / "run")
  rows = Sweep(c, parse_sweep(SWEEP), steps=10).run()
  t = c.trainer
  # All three from the same parent, with the same seed (CRN) and the same budget.
  vids = ["s-rloo", "s-hack", "s-small_lr"]
  assert t.calls == ["v0"] + vids
  assert {ledger.version(v).parent for v in vids} == {"v0"}
  assert len({t.given[v]["seed"] for v in vids}) == 1
  assert {t.given[v]["parent_checkpoint"] for v in vids} == {ledger.version("v0").checkpoint}
  assert {ledger.version(v).metrics["steps"] for v in vids} == {10}
  assert [a.status for a in ledger.attempts()] == ["done"] * 3
  # Ranked by held-out score; the hack scores highest and is rejected by the validator.
  assert [r["variant"] for r in rows] == ["hack", "rloo", "small_lr"]
  scores = [r["heldout_avg8"] for r in rows]
  assert scores == sorted(scores, reverse=True) and [r["rank"] for r in rows] == [1, 2, 3]
  hack, rloo, small = rows
  assert hack["status"] == "rejected" and "validator proxy_true_disagreement" in hack["reason"]
  assert hack["validators"]["proxy_true_disagreement"].startswith("fail")
  assert rloo["status"] == "kept" and rloo["lo"] > 0 and ledger.incumbent().id == "s-rloo"
  assert small["status"] == "rejected" and small["reason"].startswith("not beyond noise")
  assert rloo["noise"] == pytest.approx((rloo["hi"] - rloo["lo"]) / 2)
  assert ledger.version("s-rloo").heldout["noise"] == pytest.approx(rloo["noise"])
  assert ledger.decision("sweep-rloo").outcome == "success"
  assert ledger.decision("sweep-hack").outcome == "failure"
  # The same table in summary.json, the ledger and report.html; and on the terminal.
  s = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert s["mode"] == "sweep" and s["parent"] == "v0" and s["steps"] == 10
  assert [r["variant"] for r in s["sweep"]] == ["hack", "rloo", "small_lr"]
  assert ledger.get_meta("sweep/table") == json.loads(json.dumps(rows))
  page = (tmp_path / "run" / "report.html").read_text()
  assert "<h2>Sweep</h2>" in page and "s-small_lr" in page
  assert "RewardComposer.parts = {&#x27;correct&#x27;: 1.0, &#x27;hack&#x27;: 0.5}" in page
  text = format_table(rows)
  assert text.splitlines()[2].split()[:3] == ["1", "hack", "rejected"]
  assert "proxy_true_disagreement FAIL" in text


def test_two_passing_variants_are_kept_the_best_is_the_incumbent(tmp_path):
  c, ledger = make(tmp_path / "run")
  text = "[variant rloo]\nHarness.estimator = 'rloo'\n[variant partial]\n" \
         "RewardComposer.parts = {'correct': 1.0, 'partial': 0.3}\n" \
         "[variant both]\nHarness.estimator = 'rloo'\n" \
         "RewardComposer.parts = {'correct': 1.0, 'partial': 0.3}\n"
  rows = Sweep(c, parse_sweep(text)).run()
  assert [r["variant"] for r in rows][0] == "both"
  assert all(r["status"] == "kept" for r in rows)
  assert ledger.incumbent().id == "s-both"
  assert "incumbent" in ledger.version("s-both").reason


def test_skill_outcomes_recorded_for_matching_variants(tmp_path):
  c, ledger = make(tmp_path / "run")
  name = "dead_groups_add_partial_credit"  # template: add RewardComposer.parts['partial']
  before = c.skills.get(name).domains.get("math", {}).get("successes", 0)
  text = "[variant partial]\nRewardComposer.parts = {'correct': 1.0, 'partial': 0.3}\n" \
         "[variant rloo]\nHarness.estimator = 'rloo'\n"
  Sweep(c, parse_sweep(text)).run()
  used = ledger.skills_used("s-partial")
  assert [(u.skill, u.outcome) for u in used] == [(name, "success")]
  assert ledger.skills_used("s-rloo") == []
  lib = SkillLibrary(tmp_path / "run" / "skills")  # the file on disk
  assert lib.get(name).domains["math"]["successes"] == before + 1
  assert ledger.decision("sweep-partial").skill == name


def test_backtest_reported_beside_the_result(tmp_path):
  seen = []

  def backtester(store_root, version, before, after, iv):
    seen.append((version, after["Harness.estimator"]))
    return {"passed": False, "why": "2 groups die, 0 rescued", "rescued": 0,
            "newly_dead": 2}

  c, ledger = make(tmp_path / "run")
  rows = Sweep(c, parse_sweep(SWEEP), backtest=backtester).run()
  by = {r["variant"]: r for r in rows}
  assert seen == [("v0", "rloo"), ("v0", "grpo")]  # harness-side only: not small_lr
  assert by["rloo"]["backtest"]["passed"] is False and by["small_lr"]["backtest"] is None
  assert by["rloo"]["status"] == "kept"  # reported, not decisive
  assert "FAIL (rescued 0, newly_dead 2)" in format_table(rows)
  assert ledger.decision("sweep-rloo").backtest["why"] == "2 groups die, 0 rescued"


def test_gin_harness_builder_applies_the_values():
  build = gin_harness_builder()
  h = build({"RewardComposer.parts": {"correct": 1.0, "partial": 0.5},
             "Harness.estimator": "rloo", "Harness.group_filters": ["@StdGroupFilter()"],
             "StdGroupFilter.top_p": 0.5})
  assert h.estimator == "rloo" and [f.top_p for f in h.group_filters] == [0.5]
  assert build({"Harness.estimator": "grpo"}).group_filters == []  # scopes do not leak


def test_parent_from_a_model_directory_and_a_fixed_budget(tmp_path):
  model = tmp_path / "given_model"
  model.mkdir()
  c, ledger = make(tmp_path / "run")
  Sweep(c, parse_sweep(SWEEP), parent=str(model), steps=10).run()
  root = c.trainer.given["v0"]  # evaluated as is, then every variant branches from it
  assert root["parent_checkpoint"] == str(model) and root["bindings"] == ["train.steps = 0"]
  assert "evaluated as is" in ledger.version("v0").reason
  assert {ledger.version(v.version).parent for v in parse_sweep(SWEEP)} == {"v0"}
  with pytest.raises(SweepError, match="not 20: every variant gets the same budget"):
    Sweep(c, parse_sweep(SWEEP), steps=20).run()
  with pytest.raises(SweepError, match="runs from .*given_model, not s-rloo"):
    Sweep(c, parse_sweep(SWEEP), parent="s-rloo").run()
  Sweep(c, parse_sweep(SWEEP), parent="v0").run()  # the same parent, by its version id


# ------------------------------------------------------------------ resume


def test_crash_and_resume_trains_only_the_unfinished_variant(tmp_path):
  crashing = RecordingTrainer(EFFECTS, crash_at=3)  # v0, rloo, hack, then a crash
  c, ledger = make(tmp_path / "run", trainer=crashing)
  with pytest.raises(Crash):
    Sweep(c, parse_sweep(SWEEP)).run()
  assert crashing.calls == ["v0", "s-rloo", "s-hack"]
  assert ledger.attempts(status="running")[0].id == "s-small_lr/train"
  ledger.close()
  again = RecordingTrainer(EFFECTS)
  c2, ledger2 = make(tmp_path / "run", trainer=again)
  rows = Sweep(c2, parse_sweep(SWEEP)).run()
  assert again.calls == ["s-small_lr"]
  assert [r["variant"] for r in rows] == ["hack", "rloo", "small_lr"]
  assert ledger2.attempts(status="running") == []
  full, _ = make(tmp_path / "full")
  assert rows == Sweep(full, parse_sweep(SWEEP)).run()  # as if never interrupted
  third = RecordingTrainer(EFFECTS)
  c3, _ = make(tmp_path / "run", trainer=third)
  Sweep(c3, parse_sweep(SWEEP)).run()
  assert third.calls == []  # a finished sweep trains nothing again


_KILLED = """
import pathlib, sys, time
sys.path.insert(0, {repo!r})
from tests.evolution.test_sweep import EFFECTS, RecordingTrainer, make, SWEEP
from evotrainer.evolution.sweep import Sweep
from evotrainer.evolution.sweep_file import parse_sweep

class Hang(RecordingTrainer):
  def train(self, **kw):
    if kw["version"] == "s-small_lr":
      pathlib.Path({marker!r}).touch()
      time.sleep(600)
    return super().train(**kw)

c, _ = make({workdir!r}, trainer=Hang(EFFECTS))
Sweep(c, parse_sweep(SWEEP)).run()
"""


def test_sigkill_and_resume(tmp_path):
  marker, workdir = tmp_path / "third_started", tmp_path / "run"
  code = _KILLED.format(repo=str(REPO), marker=str(marker), workdir=str(workdir))
  proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  deadline = time.time() + 120
  while not marker.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.1)
  assert marker.exists(), f"the child did not reach the third variant (rc {proc.poll()})"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait(30)
  again = RecordingTrainer(EFFECTS)
  c, ledger = make(workdir, trainer=again)
  rows = Sweep(c, parse_sweep(SWEEP)).run()
  assert again.calls == ["s-small_lr"]
  assert {r["status"] for r in rows} == {"kept", "rejected"}


# ------------------------------------------------------------------ seeding an evolution


def test_a_sweep_seeds_an_evolution(tmp_path):
  c, ledger = make(tmp_path / "sweep")
  Sweep(c, parse_sweep(SWEEP)).run()
  ledger.close()
  assert start_from(tmp_path / "sweep", tmp_path / "evo")
  assert not start_from(tmp_path / "sweep", tmp_path / "evo")  # a relaunch keeps its own
  t = RecordingTrainer(EFFECTS)
  evo, l2 = make(tmp_path / "evo", trainer=t, branches=2, generations=1)
  evo.run()
  assert l2.get_meta("resumed_from") == str(tmp_path / "sweep")
  assert l2.get_meta("controller/plan/1")["parent"] == "s-rloo"  # the sweep's incumbent
  assert t.calls == ["v1.0", "v1.1", "v1.c"]  # the root is not trained again
  # The branches inherit the sweep variant's binding through the lineage (unless their
  # one change is that binding: back to the root's 'grpo', which goes unsaid).
  for v in t.calls:
    iv = l2.decisions(version=v)[0].intervention
    assert ("Harness.estimator = 'rloo'" in t.given[v]["bindings"]) == (
        iv.get("binding") != "Harness.estimator")  # the control changes nothing
  assert {v.id for v in l2.versions()} >= {"v0", "s-rloo", "s-hack", "s-small_lr"}


# ------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_sweep_mode_end_to_end(tmp_path, launch_caches):
  """`run.mode = 'sweep'` on math.gin + tiny.gin: a root and two variants as branch-mode
  child processes; the table in summary.json and the ledger; a bad file writes nothing."""
  sweep_file = tmp_path / "tiny.sweep"
  sweep_file.write_text("[variant rloo]\nHarness.estimator = 'rloo'\n"
                        "[variant clip]\nLearner.clip_high = 0.32\n")
  workdir = tmp_path / "sweep"
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  common = [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin",
            "--gin_file=gin/tiny.gin", f"--workdir={workdir}",
            "--gin_bindings=run.mode = 'sweep'", "--gin_bindings=evolve.branch_steps = 2",
            *(f"--gin_bindings={b}" for b in launch_caches)]
  bad = tmp_path / "bad.sweep"
  bad.write_text("[variant oops]\nLearner.clip_hi = 0.3\n")
  proc = subprocess.run(common + [f"--sweep_file={bad}"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "variant 'oops'" in proc.stderr
  assert "unknown binding 'Learner.clip_hi'" in proc.stderr
  assert not (workdir / "ledger.sqlite").exists()
  proc = subprocess.run(common + [f"--sweep_file={sweep_file}"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["mode"] == "sweep" and summary["parent"] == "v0" and summary["steps"] == 2
  rows = summary["sweep"]
  assert sorted(r["variant"] for r in rows) == ["clip", "rloo"]
  scores = [r["heldout_avg8"] for r in rows]
  assert scores == sorted(scores, reverse=True)
  assert all(r["status"] in ("kept", "rejected") and r["reason"] for r in rows)
  assert all(r["steps"] == 2 for r in rows)
  assert "held-out avg8" in proc.stdout and "s-rloo" not in proc.stdout.split("held-out")[0]
  with Ledger(workdir / "ledger.sqlite") as ledger:
    assert {v.id: v.parent for v in ledger.versions()} == {"v0": None, "s-rloo": "v0",
                                                           "s-clip": "v0"}
    assert [a.status for a in ledger.attempts()] == ["done", "done"]
  branch = json.loads((workdir / "versions" / "s-rloo" / "branch_result.json").read_text())
  assert branch["steps"] == 2
  assert "Harness.estimator = 'rloo'" in (workdir / "versions" / "s-rloo" /
                                          "branch.log").read_text()
  assert "<h2>Sweep</h2>" in (workdir / "report.html").read_text()
