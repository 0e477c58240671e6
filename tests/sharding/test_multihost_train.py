"""The RL loop of `run.mode='train'` as 2 processes × 2 devices, through the real launcher.

The same command (`python -m evotrainer.launch --gin_file=gin/math_train.gin`, the tiny
model and a 2-step budget) runs once as 1 process × 4 CPU devices and once as 2 local
processes × 2 devices (localhost coordinator, gloo): the same `data=4` mesh, so the
same programs, with rows (and their gradient reduction) split across processes.

What must hold:
* both processes exit 0 and print the same per-step figures, bit for bit (train.py
  also checks this itself every step);
* those figures equal the 1-process run's: exactly for what depends only on the sampled
  tokens and their scores (reward, correctness, length), and within rtol 1e-5 for the
  learner's floats. Why a tolerance at all: the gradient all-reduce crosses processes
  through gloo instead of XLA's in-process reduction, which may sum in another order
  (a few float32 ulps, ~1e-7 relative; we have seen 1.7e-7 on the loss); two steps of
  Adam cannot grow that to 1e-5. A wrong gather or placement (local rows only, rows
  doubled or permuted against their advantages) changes these by percents;
* only process 0 wrote the run's files (metrics, rollouts, summary, operative config):
  an audit hook (tests/sharding/audit/sitecustomize.py) lists every file each process
  writes; process 1 may write only inside checkpoints/, which Orbax saves collectively;
* relaunched with one more step, both runs resume from their step-2 checkpoint and the
  2-process step 3 equals the 1-process step 3 in the same way.

The model is not warm-started (saves a minute of CPU): its reward is a length penalty
plus the task's partial-credit part, which vary between completions, so the advantages,
loss and gradients are far from zero.
"""

import json
import math
import pathlib
import re
import sys

import pytest

from tests.sharding.spawn import (TINY_RL_BINDINGS, format_logs, free_port, one_and_two,
                                  process_env, run_processes, writes)

TIMEOUT_S = 900  # per run; a hang guard, generous for 2 shared cores and 2 test workers
STEPS = 2
EXACT = ("reward", "correct", "length_mean")
LEARNER = ("learner/loss", "learner/pg_loss", "learner/grad_norm", "learner/entropy",
           "learner/approx_kl")
RTOL, ATOL = 1e-5, 1e-6
STEP_LINE = re.compile(r"^\[train\] process (\d+) step (\d+): (\{.*\})$", re.M)


def _argv(workdir: pathlib.Path, cache: pathlib.Path, steps: int = STEPS) -> list:
  bindings = [f"train.steps = {steps}", "train.checkpoint_every = 2", *TINY_RL_BINDINGS,
              f"make_tokenizer.cache_dir = '{cache}'"]
  return [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math_train.gin",
          "--gin_file=gin/tiny.gin", "--gin_file=gin/mesh/data.gin",
          f"--workdir={workdir}", *[f"--gin_bindings={b}" for b in bindings]]


def _train_rows(workdir: pathlib.Path) -> list:
  """The training steps' rows of metrics.jsonl (evaluation and diagnostics rows skipped)."""
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if "reward" in r]


def _assert_same_step(a: dict, b: dict) -> None:
  """One step's figures of the 1- and 2-process runs: EXACT equal, LEARNER within RTOL."""
  for k in EXACT:
    assert a[k] == b[k], (a["step"], k, a[k], b[k])
  for k in LEARNER:
    assert math.isclose(a[k], b[k], rel_tol=RTOL, abs_tol=ATOL), (a["step"], k, a[k], b[k])


@pytest.mark.slow
def test_train_two_processes_match_one_and_resume_as_one(tmp_path):
  cache = tmp_path / "tokenizers"
  one, two = tmp_path / "one", tmp_path / "two"
  logs = one_and_two(lambda workdir: _argv(workdir, cache), tmp_path, TIMEOUT_S)
  single = _train_rows(one)

  # Both processes logged every step, the same figures bit for bit.
  printed = [{int(s): json.loads(d) for p, s, d in STEP_LINE.findall(log) if int(p) == i}
             for i, log in enumerate(logs)]
  assert sorted(printed[0]) == list(range(1, STEPS + 1)), format_logs([0, 0], logs)
  assert printed[0] == printed[1]

  # Process 0's metrics.jsonl holds each step once, as printed.
  multi = _train_rows(two)
  assert [r["step"] for r in multi] == [r["step"] for r in single] == list(range(1, STEPS + 1))
  for row in multi:
    assert {k: row[k] for k in printed[0][row["step"]]} == printed[0][row["step"]]

  # The 2-process run is the 1-process run.
  for a, b in zip(single, multi):
    _assert_same_step(a, b)
    print(f"step {a['step']}: " + ", ".join(
        f"{k} {a[k]:.9g} vs {b[k]:.9g}" for k in (*EXACT, *LEARNER)))
  # ... and a non-trivial one: a real gradient on every step, rewards that vary.
  assert all(r["learner/grad_norm"] > 0.1 for r in single)
  assert any(abs(r["learner/loss"]) > 1e-3 for r in single)
  assert all(r["harness/dead_group_ratio/raw"] < 1.0 for r in single)

  # Only process 0 wrote the run's files; process 1 only its part of the checkpoints.
  w0 = writes(tmp_path / "writes0.txt", two)
  w1 = writes(tmp_path / "writes1.txt", two)
  for name in ("metrics.jsonl", "summary.json", "operative_config.gin"):
    assert any(p.name == name for p in w0), (name, sorted(map(str, w0)))
  assert any(p.suffix == ".parquet" for p in w0), sorted(map(str, w0))
  assert not [p for p in w1 if p.parts[0] != "checkpoints"], sorted(map(str, w1))
  assert (two / "checkpoints" / str(STEPS)).is_dir()
  assert json.loads((two / "summary.json").read_text())["steps"] == STEPS

  # A relaunch with one more step resumes both runs from their Orbax step-2 checkpoint
  # (every process restores its shards) and trains step 3: the 2-process resume equals
  # the 1-process resume as the first steps did, and only process 0 writes again.
  logs = one_and_two(lambda workdir: _argv(workdir, cache, STEPS + 1), tmp_path, TIMEOUT_S,
                     phase="-resume")
  for i, log in enumerate(logs):
    assert f"[train] resumed from step {STEPS} " in log, format_logs([0, 0], logs)
    assert [int(s) for p, s, _ in STEP_LINE.findall(log) if int(p) == i] == [STEPS + 1]
  single, multi = _train_rows(one), _train_rows(two)
  assert [r["step"] for r in multi] == [r["step"] for r in single] == list(range(1, STEPS + 2))
  _assert_same_step(single[-1], multi[-1])
  assert single[-1]["learner/grad_norm"] > 0.1
  w1 = writes(tmp_path / "writes1-resume.txt", two)
  assert not [p for p in w1 if p.parts[0] != "checkpoints"], sorted(map(str, w1))
  assert json.loads((two / "summary.json").read_text())["steps"] == STEPS + 1


_NO_FILE = "run.mode='sweep' needs a sweep file: --sweep_file=PATH or sweep.file"


@pytest.mark.slow
@pytest.mark.parametrize("workdir,expected", [
    ("sweep", [f"error (sweep): {_NO_FILE}",
               f"error (sweep): process 0 stopped the run: {_NO_FILE}"]),
    ("gs://b/sweep", ["error (config): run.mode='sweep' across processes needs a --workdir "
                      "every host shares"] * 2),
])
def test_a_sweep_across_processes_runs_its_driver_on_process_0(tmp_path, workdir, expected):
  """`sweep` runs across processes as `evolve` does (tests/evolution/test_pod.py, with
  planted children): process 0 runs the driver, process 1 follows it. Here process 0
  refuses a sweep without a sweep file before anything trains, and process 1 stops with
  process 0's error (no training: the launcher's wiring only). A gs:// workdir is refused
  by every process (tests/fake_gcs_launch.py stands in for GCS)."""
  port = free_port()
  envs = [process_env(1, port=port, process_id=i, num_processes=2,
                      extra={"EVO_FAKE_GCS_ROOT": str(tmp_path / "bucket")})
          for i in range(2)]
  local = not workdir.startswith("gs://")
  argv = [sys.executable, "-m", "evotrainer.launch", "--gin_file=gin/math.gin",
          "--gin_file=gin/tiny.gin", "--gin_bindings=run.mode = 'sweep'",
          "--import=tests.fake_gcs_launch",
          f"--workdir={tmp_path / workdir if local else workdir}"]
  codes, logs = run_processes(argv, envs, tmp_path, TIMEOUT_S)
  assert codes == [2, 2], format_logs(codes, logs)
  for log, want in zip(logs, expected):
    errors = [line for line in log.splitlines() if line.startswith("error (")]
    assert len(errors) == 1 and errors[0].startswith(want), format_logs(codes, logs)
  assert not (tmp_path / "sweep" / "ledger.sqlite").exists()
  assert not any((tmp_path / "bucket").rglob("*"))  # nothing written to the bucket
