"""The SWE episode report, bench/swe_real.py's samples, overlap and summary, against
hand-computed figures."""

import argparse
import dataclasses

import numpy as np

from bench import swe_real
from evotrainer.tasks.base import Problem
from evotrainer.tasks.swe.diagnostics import episode_report
from evotrainer.types import Episode


def _ep(i, calls, stop, turns, correct=0.0):
  return Episode(episode_id=f"v0/0/{i}", group_id=0, task_id="t", prompt="", completion="",
                 answer="resolved", reward_parts={"correct": correct},
                 info={"tool_calls": calls, "stop": stop, "turns": turns})


EPISODES = [
    # first turn parses and runs; edits at turn 2; submits
    _ep(0, [{"name": "read_file", "turn": 0, "ok": True},
            {"name": "search_replace", "turn": 2, "ok": True},
            {"name": "submit", "turn": 3, "ok": True}], "submitted", 4, 1.0),
    # first turn parses but fails (a missing path); a failed edit does not count
    _ep(1, [{"name": "read_file", "turn": 0, "ok": False},
            {"name": "search_replace", "turn": 1, "ok": False}], "tool_error", 3),
    # no call parses at all
    _ep(2, [], "tool_error", 3),
    # the first call is at turn 1; edits at turn 1
    _ep(3, [{"name": "search_replace", "turn": 1, "ok": True}], "max_turns", 6),
]


def test_episode_report_by_hand():
  got = episode_report(EPISODES)
  assert got["first_turn"] == {"parsed": 0.5, "ran": 0.25}
  assert got["stops"] == {"max_turns": 0.25, "submitted": 0.25, "tool_error": 0.5}
  assert got["tools"] == {"read_file": 2, "search_replace": 3, "submit": 1}
  assert got["first_edit_turn"] == 1.5 and got["edited_share"] == 0.5  # turns 2 and 1
  assert got["mean_turns"] == 4.0  # (4 + 3 + 3 + 6) / 4
  assert got["history_read_share"] == 0.0
  # One episode of five reads the history (`git log`); a `git status` does not.
  git = [{"name": "git", "turn": 0, "args": {"command": "status"}, "ok": True},
         {"name": "git", "turn": 1, "args": {"command": "log -p"}, "ok": True}]
  reader = _ep(4, git, "max_turns", 2)
  looker = _ep(5, git[:1], "max_turns", 2)
  assert episode_report([*EPISODES, reader])["history_read_share"] == 0.2
  assert episode_report([*EPISODES, looker])["history_read_share"] == 0.0
  # An episode the engine stopped before any turn (no info): counted, with no calls.
  bare = episode_report([*EPISODES, dataclasses.replace(EPISODES[2], info={})])
  assert bare["first_turn"] == {"parsed": 0.4, "ran": 0.2}
  assert bare["edited_share"] == 0.4 and bare["stops"]["None"] == 0.2
  assert episode_report([])["first_edit_turn"] is None


def test_samples_prefer_a_resolved_episode_per_level():
  problems = [Problem("t-L0", "issue zero", "resolved", "", "r", 0, {"level": 0}),
              Problem("u-L0", "issue one", "resolved", "", "r", 0, {"level": 0}),
              Problem("t", "x" * 3000, "resolved", "", "r", 0, {"level": 2})]
  eps = [_ep(0, [], "tool_error", 1), _ep(1, [], "max_turns", 6),  # t-L0: none resolved
         _ep(2, [], "tool_error", 1), _ep(3, [], "submitted", 2, 1.0),  # u-L0: the 2nd
         _ep(4, [], "max_turns", 6), _ep(5, [], "max_turns", 6)]  # t: the first
  eps = [dataclasses.replace(e, completion=f"turns of {i}") for i, e in enumerate(eps)]
  got = swe_real.sample_episodes(problems, eps, k=2)
  assert list(got) == ["0", "2"]
  assert got["0"] == {"task": "u-L0", "resolved": True, "stop": "submitted",
                      "issue": "issue one", "transcript": "turns of 3"}
  assert got["2"]["task"] == "t" and not got["2"]["resolved"]
  assert got["2"]["transcript"] == "turns of 4"
  # A long text keeps its first 1500 and last 500 characters around a marker.
  issue = got["2"]["issue"]
  assert issue.startswith("x" * 1500 + "\n[... 1000 characters cut ...]\n")
  assert issue.endswith("\n" + "x" * 500) and len(issue) < 3000


def test_summary_keeps_systems_apart():
  args = argparse.Namespace(levels=[0, 2], k=2, tasks=None, system="default",
                            gin=swe_real.GIN)
  level = lambda r, p: {"resolve": r, "episodes": 2, "first_turn": {"parsed": p}}
  runs = {"default/seed0": {"settings": swe_real.settings(args), "result": {"per_level": {
              "0": level(0.5, 1.0), "2": level(0.0, 0.5)}}},
          "default/seed1": {"settings": swe_real.settings(args), "result": {"per_level": {
              "0": level(0.0, 0.0), "2": level(0.0, 0.5)}}}}
  other = argparse.Namespace(**{**vars(args), "system": "example"})
  runs["example/seed0"] = {"settings": swe_real.settings(other), "result": {"per_level": {
      "0": level(1.0, 1.0), "2": level(1.0, 1.0)}}}
  mine = {k: r for k, r in runs.items() if k.startswith("default")}
  assert swe_real.summary(mine)["resolve"] == {
      "0": {"base": 0.25, "episodes": 4, "seeds": 2, "first_turn_parsed": 0.5},
      "2": {"base": 0.0, "episodes": 4, "seeds": 2, "first_turn_parsed": 0.5}}
  by = swe_real.by_system(runs, args)
  assert set(by) == {"default", "example"}
  assert by["example"]["0"]["base"] == 1.0 and by["default"]["0"]["base"] == 0.25


def test_resolve_table_puts_warm_beside_base():
  args = argparse.Namespace(levels=[0], k=2, tasks=None, system="default", gin=swe_real.GIN)
  warm = argparse.Namespace(**{**vars(args), "gin": swe_real.WARM_GIN})
  level = lambda r, p: {"0": {"resolve": r, "episodes": 2, "first_turn": {"parsed": p}}}
  runs = {swe_real.run_key(args, 0): {"settings": swe_real.settings(args),
                                      "result": {"per_level": level(0.0, 0.0)}},
          swe_real.run_key(warm, 0): {"settings": swe_real.settings(warm),
                                      "result": {"per_level": level(0.5, 1.0)}},
          swe_real.run_key(warm, 1): {"settings": swe_real.settings(warm),
                                      "result": {"per_level": level(0.0, 0.5)}}}
  assert set(runs) == {"default/seed0", "swe_smol_warm/default/seed0",
                       "swe_smol_warm/default/seed1"}
  table = swe_real.resolve_table(runs, warm)  # the same whichever gin ran last
  assert table == swe_real.resolve_table(runs, args)
  assert table["resolve"] == {"0": {"base": 0.0, "episodes": 2, "seeds": 1,
                                    "first_turn_parsed": 0.0, "warm": 0.25,
                                    "warm_episodes": 4, "warm_first_turn_parsed": 0.75}}
  assert table["warm_settings"]["gin"] == swe_real.WARM_GIN
  assert table["base_settings"]["gin"] == swe_real.GIN


def test_a_stored_run_is_measured_again_only_without_samples_or_under_new_settings():
  args = argparse.Namespace(levels=[0], k=2, tasks=None, system="default", gin=swe_real.GIN)
  other = argparse.Namespace(**{**vars(args), "k": 4})
  done = {"settings": swe_real.settings(args), "result": {"per_level": {}, "samples": {}}}
  assert swe_real.is_stored(done, args)
  assert not swe_real.is_stored(done, other)
  assert not swe_real.is_stored({**done, "result": {"per_level": {}}}, args)
  assert not swe_real.is_stored({}, args)


def test_overlap_times_each_engine_after_a_warm_up_batch(monkeypatch):
  built, measured = [], []
  clock = iter([100.0, 130.0, 200.0, 220.0])  # lock-step 30 s, two waves 20 s
  monkeypatch.setattr(swe_real.time, "time", lambda: next(clock))
  monkeypatch.setattr(swe_real, "Sampler", lambda model, pad_id: "sampler")
  monkeypatch.setattr(swe_real.nnx, "state", lambda model: "params")

  def engine(task, tok, sampler, overlap_waves):
    built.append(overlap_waves)
    return f"engine{overlap_waves}"

  def measure(rollout, params, problems, k, seed, keep=False):
    measured.append((rollout, len(problems), keep))
    eps = [dataclasses.replace(EPISODES[0], completion_ids=np.zeros(5, np.int32))] * 6
    return ({"avg4": 0.5, "mean_turns": 3.0}, eps) if keep else {}
  monkeypatch.setattr(swe_real, "MultiTurnEngine", engine)
  monkeypatch.setattr(swe_real, "measure", measure)
  tok = argparse.Namespace(pad_id=0)
  got = swe_real.overlap("task", tok, "model", list(range(5)), k=4, seed=0)
  assert built == [1, 2]
  # Each engine: one warm-up batch (16 rows = 4 problems of k=4), then all 5 problems.
  assert measured == [("engine1", 4, False), ("engine1", 5, True),
                      ("engine2", 4, False), ("engine2", 5, True)]
  assert got["1"] == {"seconds": 30.0, "episodes_per_s": 0.2, "model_tokens_per_s": 1.0,
                      "resolve": 0.5, "mean_turns": 3.0}
  assert got["2"]["seconds"] == 20.0 and got["2"]["episodes_per_s"] == 0.3
  assert got["speedup"] == 1.5


def _leak_result(kept_resolve, cleared_resolve, read_share, episodes=8):
  level = {"1": {"episodes": episodes}}
  return {"kept": {"avg4": kept_resolve, "avg4_level1": kept_resolve,
                   "history_read_share": read_share, "per_level": level},
          "cleared": {"avg4": cleared_resolve, "history_read_share": 0.0,
                      "per_level": level}}


def test_leak_summary_averages_seeds_by_hand():
  runs = {"a": {"result": _leak_result(0.25, 0.125, 0.5)},
          "b": {"result": _leak_result(0.75, 0.125, 0.0)}}
  got = swe_real.leak_summary(runs)
  assert got == {"history_read_share": 0.25, "history_read_share_cleared": 0.0,
                 "resolve_history_kept": 0.5, "resolve_history_cleared": 0.125,
                 "episodes": 16, "seeds": 2, "rejected_by": None}


def test_leak_summary_refuses_runs_of_different_k():
  other = _leak_result(0.5, 0.5, 0.0)
  other["kept"]["avg2"] = other["kept"].pop("avg4")
  import pytest
  with pytest.raises(ValueError, match="different k"):
    swe_real.leak_summary({"a": {"result": _leak_result(0.5, 0.5, 0.0)},
                           "b": {"result": other}})


def test_measure_leak_resumes_per_seed_and_redoes_a_changed_hint(monkeypatch, tmp_path):
  args = argparse.Namespace(levels=[1], k=4, tasks=None, system="default", gin=swe_real.GIN,
                            seeds=[0, 1])
  calls = []

  def leak(args, sampler, params, tok, tool_config, seed):
    calls.append(seed)
    return _leak_result(0.5, 0.25, 0.5 * seed)
  monkeypatch.setattr(swe_real, "leak", leak)
  path = str(tmp_path / "swe.json")
  payload = {"leak_runs": {"default/seed0": {"settings": swe_real.settings(args),
                                             "git_hint": swe_real.GIT_HINT,
                                             "result": _leak_result(1.0, 0.0, 1.0)}}}
  swe_real.measure_leak(args, payload, path, "sampler", "params", "tok", "tools")
  assert calls == [1]  # seed 0 was stored under the same settings and hint
  assert payload["leak"]["resolve_history_kept"] == 0.75  # (1.0 + 0.5) / 2
  assert payload["leak"]["history_read_share"] == 0.75  # (1.0 + 0.5) / 2
  assert swe_real.load_json(path)["leak"] == payload["leak"]
  monkeypatch.setattr(swe_real, "GIT_HINT", "another hint")
  swe_real.measure_leak(args, payload, path, "sampler", "params", "tok", "tools")
  assert calls == [1, 0, 1]
  assert payload["leak"]["history_read_share"] == 0.25  # (0.0 + 0.5) / 2
