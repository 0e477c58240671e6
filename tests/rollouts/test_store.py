"""Rollout store: exact round trips, no overwrites, quarantine of damaged files, listings."""

import dataclasses
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from evotrainer.rollouts import (SCHEMA, CorruptRolloutError, RolloutExistsError,
                                 RolloutStore)
from evotrainer.rollouts.store import QUARANTINE
from evotrainer.types import Episode


def make_episodes(version="v0", step=0, split="train", n=6, seed=0):
  """Episodes covering the awkward cases: unicode, empty and missing arrays, None fields."""
  rng = np.random.default_rng(seed)
  eps = []
  for i in range(n):
    length = [0, 1, 5, 32, 17, 3][i % 6]
    ids = rng.integers(0, 50_000, length).astype(np.int32)
    lps = (-rng.exponential(2.0, length)).astype(np.float32)
    if i == 2:  # int32 extremes and float32 extremes / denormals, all finite
      ids[:2] = [np.iinfo(np.int32).max, np.iinfo(np.int32).min]
      lps[:3] = [np.finfo(np.float32).min, -np.finfo(np.float32).tiny / 4, -0.0]
    eps.append(Episode(
        episode_id=f"{version}/{step}/{i}", group_id=i // 3, task_id=f"task-{i // 3}",
        prompt=f"Solve: {i} + 7 = ?\n日本語 ✓ é (e\u0301) \U0001F600",
        completion="" if length == 0 else f"think… {i}\t\"quoted\" \\ answer: {i + 7}",
        answer=str(i + 7),
        # key order is part of the record; values are arbitrary finite doubles
        reward_parts={"correct": float(i % 2), "format": 0.1 * i, "length_penalty": -1 / 3}
        if i != 4 else {},
        reward=float(rng.normal()), parsed_answer=None if i == 1 else str(i + 7),
        info={"stop_reason": "eos" if i % 2 else "length", "tool_calls": [{"name": "py",
              "args": {"code": "print(1)"}}], "errors": [], "note": "ü\n", "t": 0.25}
        if i != 3 else {},
        version=version, step=step, split=split,
        completion_ids=None if i == 5 else ids, logprobs=None if i == 5 else lps,
        truncated=bool(i % 3 == 0)))
  return eps


def assert_same(got: Episode, want: Episode):
  for f in dataclasses.fields(Episode):
    a, b = getattr(got, f.name), getattr(want, f.name)
    if f.name in ("completion_ids", "logprobs"):
      if b is None:
        assert a is None, f.name
        continue
      assert a.dtype == b.dtype and a.shape == b.shape, (f.name, a.dtype, a.shape)
      # bit-exact, so -0.0 and denormals count
      np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f.name)
    elif f.name == "reward_parts":
      assert list(a.items()) == list(b.items())
    else:
      assert a == b and type(a) is type(b), (f.name, a, b)


def test_schema_has_every_episode_field():
  assert {f.name for f in dataclasses.fields(Episode)} <= set(SCHEMA.names)


def test_round_trip_exact(tmp_path):
  store = RolloutStore(tmp_path)
  eps = make_episodes()
  store.write("v0", 0, "train", eps)
  got = store.read("v0", 0, "train")
  assert len(got) == len(eps)
  for g, w in zip(got, eps):
    assert_same(g, w)
  assert got[5].completion_ids is None and got[0].completion_ids.shape == (0,)
  got[0].logprobs[:] = 1  # writable, and not shared with another episode
  assert store.problems == []


def test_numpy_scalars_and_other_dtypes_are_stored_as_their_values(tmp_path):
  store = RolloutStore(tmp_path)
  ep = make_episodes(n=1)[0]
  ep = dataclasses.replace(ep, group_id=np.int64(3), reward=np.float32(0.5),
                           completion_ids=np.array([1, 2, 3], np.int64),
                           logprobs=np.array([-1.5, -0.25, 0.0], np.float64),
                           info={"n": np.int32(4), "v": np.array([1, 2])})
  store.write("v0", 0, "train", [ep])
  got, = store.read()
  assert got.group_id == 3 and got.reward == 0.5
  assert got.completion_ids.dtype == np.int32 and list(got.completion_ids) == [1, 2, 3]
  assert got.logprobs.dtype == np.float32 and list(got.logprobs) == [-1.5, -0.25, 0.0]
  assert got.info == {"n": 4, "v": [1, 2]}


def test_refuses_to_overwrite(tmp_path):
  store = RolloutStore(tmp_path)
  path = store.write("v0", 3, "train", make_episodes(step=3))
  before = path.read_bytes()
  with pytest.raises(RolloutExistsError, match="never overwritten"):
    store.write("v0", 3, "train", make_episodes(step=3, seed=1))
  assert path.read_bytes() == before
  assert os.listdir(path.parent) == [path.name]  # no temp file left behind
  store.write("v0", 3, "heldout", make_episodes(step=3, split="heldout"))  # other key: fine


def damage(path, how):
  data = path.read_bytes()
  if how == "truncated":
    data = data[: len(data) // 2]
  elif how == "empty":
    data = b""
  elif how == "garbage":
    data = np.random.default_rng(0).bytes(len(data))
  elif how == "flipped":  # same size, one byte changed inside a data page
    i = len(data) // 3
    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
  path.write_bytes(data)
  return data


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage", "flipped"])
def test_damaged_file_is_quarantined_and_the_rest_still_reads(tmp_path, caplog, how):
  store = RolloutStore(tmp_path)
  for step in range(3):
    store.write("v0", step, "train", make_episodes(step=step, n=40, seed=step))
  bad = store.path("v0", 1, "train")
  damaged = damage(bad, how)

  with caplog.at_level(logging.WARNING):
    got = store.read("v0")
  assert [e.step for e in got] == [0] * 40 + [2] * 40
  assert any("unreadable" in r.getMessage() for r in caplog.records)
  problem, = store.problems
  assert problem.path == str(bad) and problem.reason
  # moved, not deleted, byte for byte, with the reason next to it
  moved = tmp_path / QUARANTINE / "v0" / "train" / "step-00000001.parquet"
  assert problem.moved_to == str(moved) and moved.read_bytes() == damaged
  reason = json.loads((moved.parent / (moved.name + ".reason.json")).read_text())
  assert reason["reason"] == problem.reason and reason["original_path"] == str(bad)
  assert not bad.exists() and not store.exists("v0", 1, "train")
  assert store.steps("v0", "train") == [0, 2] and store.versions() == ["v0"]
  # the step can be produced again, and a second quarantine never replaces the first
  store.write("v0", 1, "train", make_episodes(step=1, n=40, seed=1))
  damage(bad, "truncated")
  with pytest.raises(CorruptRolloutError):
    store.read_step("v0", 1, "train")
  assert moved.read_bytes() == damaged
  assert (moved.parent / (moved.name + ".1")).exists()
  assert len(store.problems) == 2


def test_unreadable_footer_in_step_metadata(tmp_path):
  store = RolloutStore(tmp_path)
  store.write("v0", 0, "train", make_episodes())
  damage(store.path("v0", 0, "train"), "truncated")
  with pytest.raises(CorruptRolloutError):
    store.step_metadata("v0", 0, "train")
  with pytest.raises(FileNotFoundError):
    store.step_metadata("v0", 0, "train")  # gone from the store, kept in quarantine


def test_stray_temp_files_are_ignored(tmp_path):
  store = RolloutStore(tmp_path)
  path = store.write("v0", 0, "train", make_episodes())
  # what a writer killed before publishing leaves behind: a partial file under a temp name
  tmp = path.with_name(".step-00000001.parquet.4242-deadbeef.tmp")
  tmp.write_bytes(path.read_bytes()[:100])
  assert store.steps("v0", "train") == [0]
  assert not store.exists("v0", 1, "train")
  assert len(store.read()) == 6 and store.problems == []
  assert tmp.exists()
  store.write("v0", 1, "train", make_episodes(step=1))  # the redo publishes normally
  assert store.steps("v0", "train") == [0, 1]


def test_listings(tmp_path):
  store = RolloutStore(tmp_path / "missing")
  assert store.versions() == [] and store.steps("v0", "train") == [] and store.read() == []
  store = RolloutStore(tmp_path)
  for v, s, sp in [("v1", 20, "train"), ("v0", 3, "train"), ("v0", 1, "train"),
                   ("v0", 10, "heldout"), ("v0", -1, "heldout")]:
    store.write(v, s, sp, make_episodes(v, s, sp, n=2))
  (tmp_path / QUARANTINE).mkdir()
  assert store.versions() == ["v0", "v1"]
  assert store.splits("v0") == ["heldout", "train"]
  assert store.steps("v0", "train") == [1, 3]
  assert store.steps("v0", "heldout") == [-1, 10]
  assert store.exists("v0", 10, "heldout") and not store.exists("v0", 10, "train")
  keys = [(e.version, e.step, e.split) for e in store.read()[::2]]
  assert keys == [("v0", -1, "heldout"), ("v0", 1, "train"), ("v0", 3, "train"),
                  ("v0", 10, "heldout"), ("v1", 20, "train")]
  assert {e.step for e in store.read(split="train")} == {1, 3, 20}
  assert {e.version for e in store.read(step=3)} == {"v0"}


def test_harness_state_meta_advantages_kept_round_trip(tmp_path):
  store = RolloutStore(tmp_path)
  eps = make_episodes()
  adv = np.array([0.5, -1.25, 1 / 3, 0.0, 2.0, -0.1], np.float32)
  kept = np.array([True, False, True, True, False, True])
  state = {"std_filter": {"ema_threshold": 0.1234567890123, "steps": 7},
           "names": ["correct", "format"], "nested": {"a": [1, 2.5, None]}}
  store.write("v0", 5, "train", eps, advantages=adv, kept=kept, harness_state=state,
              meta={"seed": 17, "note": "résumé"})
  md = store.step_metadata("v0", 5, "train")
  assert md.harness_state == state and md.meta == {"seed": 17, "note": "résumé"}
  assert (md.version, md.step, md.split, md.num_episodes) == ("v0", 5, "train", 6)
  # the footer is readable by any Parquet reader
  assert b"evotrainer.harness_state" in pq.read_metadata(md.path).metadata
  stored = store.read_step("v0", 5, "train")
  assert stored.metadata == md
  np.testing.assert_array_equal(stored.advantages.astype(np.float32), adv)
  np.testing.assert_array_equal(stored.kept, kept)
  for g, w in zip(stored.episodes, eps):
    assert_same(g, w)

  store.write("v0", 6, "train", eps)
  bare = store.read_step("v0", 6, "train")
  assert bare.advantages is None and bare.kept is None and bare.metadata.harness_state is None


def test_read_columns_for_replay(tmp_path):
  store = RolloutStore(tmp_path)
  eps = make_episodes()
  store.write("v0", 0, "train", eps, advantages=np.arange(6.0))
  store.write("v0", 1, "train", make_episodes(step=1, n=3), kept=np.array([1, 0, 1], bool))
  cols = store.read_columns("v0")
  assert cols["completion_ids"].shape == (9, 32) and cols["logprobs"].shape == (9, 32)
  assert list(cols["length"]) == [0, 1, 5, 32, 17, 0, 0, 1, 5]
  for r, e in enumerate(eps):
    n = e.length
    np.testing.assert_array_equal(cols["completion_ids"][r, :n], e.completion_ids if n else [])
    assert not cols["completion_ids"][r, n:].any() and not cols["logprobs"][r, n:].any()
  np.testing.assert_array_equal(cols["advantage"][:6], np.arange(6.0))
  assert np.isnan(cols["advantage"][6:]).all()
  assert list(cols["kept"]) == [-1] * 6 + [1, 0, 1]
  correct = cols["reward_parts/correct"]
  assert list(correct[:4]) == [0.0, 1.0, 0.0, 1.0] and np.isnan(correct[4])  # row 4: no parts
  assert list(cols["episode_id"][:2]) == ["v0/0/0", "v0/0/1"]
  assert cols["reward"].dtype == np.float64 and cols["truncated"].dtype == bool
  assert store.read_table("nope").num_rows == 0


@pytest.mark.parametrize("change, error, match", [
    (lambda e: dataclasses.replace(e[1], episode_id=e[0].episode_id), ValueError,
     "more than once"),
    (lambda e: dataclasses.replace(e[1], logprobs=e[1].logprobs[:0]), ValueError,
     "1 completion_ids but 0 logprobs"),
    (lambda e: dataclasses.replace(e[1], info={"bad": object()}), TypeError, "v0/0/1.*info"),
    (lambda e: dataclasses.replace(e[1], completion_ids=np.zeros((1, 1), np.int32)),
     TypeError, "v0/0/1.*1-D"),
    (lambda e: dataclasses.replace(e[1], completion_ids=np.array([2.0**40])), TypeError,
     "v0/0/1"),
    (lambda e: dataclasses.replace(e[1], task_id=7), TypeError, "v0/0/1.*task_id"),
])
def test_bad_episodes_are_refused_and_nothing_is_published(tmp_path, change, error, match):
  store = RolloutStore(tmp_path)
  eps = make_episodes()
  eps[1] = change(eps)
  with pytest.raises(error, match=match):
    store.write("v0", 0, "train", eps)
  assert not store.exists("v0", 0, "train")
  assert not (tmp_path / "v0").exists() or os.listdir(tmp_path / "v0" / "train") == []


def test_bad_keys_and_arguments(tmp_path):
  store = RolloutStore(tmp_path)
  eps = make_episodes()
  for version in ["", "../x", "a/b", "_quarantine", ".hidden"]:
    with pytest.raises(ValueError, match="version"):
      store.write(version, 0, "train", eps)
  with pytest.raises(TypeError, match="step"):
    store.write("v0", "3", "train", eps)
  with pytest.raises(ValueError, match="advantages must have shape"):
    store.write("v0", 0, "train", eps, advantages=np.zeros((6, 2)))
  with pytest.raises(TypeError, match="harness_state"):
    store.write("v0", 0, "train", eps, harness_state={"f": print})
  assert store.versions() == [] or store.steps("v0", "train") == []


def test_a_concurrent_writer_of_the_same_step_cannot_replace_it(tmp_path, monkeypatch):
  store = RolloutStore(tmp_path)
  real_link = os.link

  def other_writer_wins(src, dst):  # publishes between our existence check and our link
    monkeypatch.setattr(os, "link", real_link)
    RolloutStore(tmp_path).write("v0", 0, "train", make_episodes(n=2))
    return real_link(src, dst)

  monkeypatch.setattr(os, "link", other_writer_wins)
  with pytest.raises(RolloutExistsError, match="another writer"):
    store.write("v0", 0, "train", make_episodes(n=6))
  assert len(store.read()) == 2  # the first writer's file, intact
  assert os.listdir(store.path("v0", 0, "train").parent) == ["step-00000000.parquet"]


def test_a_writer_killed_before_publishing_leaves_no_step(tmp_path):
  # The child process dies (no cleanup, like kill -9) right before the atomic publish.
  code = ("import os, sys; from tests.rollouts.test_store import make_episodes; "
          "from evotrainer.rollouts import RolloutStore; os.link = lambda *a: os._exit(9); "
          f"RolloutStore({str(tmp_path)!r}).write('v0', 0, 'train', make_episodes())")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 9, proc.stderr.decode()[-2000:]
  store = RolloutStore(tmp_path)
  leftovers = os.listdir(tmp_path / "v0" / "train")
  assert len(leftovers) == 1 and leftovers[0].endswith(".tmp")
  assert store.steps("v0", "train") == [] and not store.exists("v0", 0, "train")
  assert store.read() == [] and store.problems == []
  store.write("v0", 0, "train", make_episodes())  # the resumed run redoes the step
  assert len(store.read("v0", 0, "train")) == 6
