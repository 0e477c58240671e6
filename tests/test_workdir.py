"""A run directory is one run: the lock, the configuration fingerprint, one-line errors.

The end-to-end tests drive `python -m evotrainer.launch` as a user would."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from evotrainer import workdir as wd
from evotrainer.evolution.ledger import Ledger, LedgerError
from evotrainer.evolution.ledger.mirror import record_segment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = ("import sys, time; from evotrainer.workdir import WorkdirLock; "
        "WorkdirLock(sys.argv[1]).acquire(); print('HELD', flush=True); time.sleep(60)")


def _env():
  path = os.environ.get("PYTHONPATH", "")
  return dict(os.environ, PYTHONPATH=REPO + (os.pathsep + path if path else ""),
              XLA_FLAGS="", JAX_PLATFORMS="cpu")


def _holder_process(workdir):
  proc = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], cwd=REPO, env=_env(),
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "HELD"
  return proc


def test_second_process_is_refused_naming_the_holder(tmp_path):
  proc = _holder_process(tmp_path)
  try:
    with pytest.raises(wd.WorkdirLocked, match=f"pid {proc.pid} on host "):
      wd.WorkdirLock(tmp_path).acquire()
    assert wd.holder(tmp_path)["pid"] == proc.pid
  finally:
    proc.kill()
    proc.wait()
  # kill -9 leaves the file naming a dead pid; the kernel dropped the flock: taken over.
  lock = wd.WorkdirLock(tmp_path).acquire()
  assert lock.took_over["pid"] == proc.pid
  assert wd.holder(tmp_path) is None or wd.holder(tmp_path)["pid"] == os.getpid()
  lock.release()
  assert wd.holder(tmp_path) is None


def test_fingerprint_refuses_a_changed_relaunch_and_records_a_segment(tmp_path):
  data = tmp_path / "d.jsonl"
  data.write_text('{"question": "1+1", "answer": "#### 2"}\n')
  first = wd.config_fingerprint(
      f"run.seed = 0\nMathTask.jsonl_files = ['{data}']\ntrain.steps = 5\n")
  assert wd.check_fingerprint(tmp_path, config=first) is None
  assert wd.check_fingerprint(tmp_path, config=first) is None  # same: resumes
  # A budget may change on a resume; a moved data file with the same bytes is no change.
  moved = tmp_path / "e.jsonl"
  moved.write_bytes(data.read_bytes())
  same = wd.config_fingerprint(
      f"run.seed = 0\nMathTask.jsonl_files = ['{moved}']\ntrain.steps = 50\n")
  assert wd.check_fingerprint(tmp_path, config=same) is None
  moved.write_text('{"question": "1+2", "answer": "#### 3"}\n')
  changed = wd.config_fingerprint(
      f"run.seed = 1\nMathTask.jsonl_files = ['{moved}']\ntrain.steps = 5\n")
  with pytest.raises(wd.FingerprintMismatch) as e:
    wd.check_fingerprint(tmp_path, config=changed)
  assert "run.seed: 0 -> 1" in str(e.value) and "MathTask.jsonl_files: " in str(e.value)
  assert "--new_segment" in str(e.value) and "another --workdir" in str(e.value)
  with Ledger(tmp_path / "ledger.sqlite") as ledger:
    pass
  changes = wd.check_fingerprint(tmp_path, config=changed, new_segment=True)
  assert "run.seed: 0 -> 1" in changes
  assert wd.check_fingerprint(tmp_path, config=changed) is None  # the new segment's config
  rows = [json.loads(l) for l in (tmp_path / wd.SEGMENTS_NAME).read_text().splitlines()]
  assert rows[0]["changes"] == changes
  record_segment(tmp_path)  # what launch.py does after an accepted new segment
  with Ledger(tmp_path / "ledger.sqlite") as ledger:
    assert ledger.get_meta("run/segments") == rows


def test_config_bindings_reads_continuation_lines():
  text = ("# Parameters for X:\nX.a = \\\n    {'k': 1,\n     'j': 2}\nX.b = 'c'  \n")
  assert wd.config_bindings(text) == {"X.a": "{'k': 1, 'j': 2}", "X.b": "'c'"}


def test_built_tokenizer_change_is_refused_while_weights_exist(tmp_path):
  wd.check_built(tmp_path, tokenizer="a" * 64, model={"hidden_size": 32})
  wd.check_built(tmp_path, tokenizer="a" * 64, model={"hidden_size": 32})
  wd.check_built(tmp_path, tokenizer="b" * 64, model={"hidden_size": 32})  # no weights yet
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  with pytest.raises(wd.FingerprintMismatch, match="tokenizer: bbbbbbbbbbbb -> cccc"):
    wd.check_built(tmp_path, tokenizer="c" * 64, model={"hidden_size": 32})
  with pytest.raises(wd.FingerprintMismatch, match="ModelConfig.hidden_size: 32 -> 64"):
    wd.check_built(tmp_path, tokenizer="b" * 64, model={"hidden_size": 64})


def test_ledger_paths_survive_a_moved_workdir(tmp_path):
  old = tmp_path / "old"
  (old / "versions" / "v0" / "model").mkdir(parents=True)
  with Ledger(old / "ledger.sqlite") as ledger:
    ledger.add_version("v0", None, checkpoint=str(old / "versions" / "v0" / "model"))
    ledger.update_version("v0", metrics={"result": {
        "checkpoint": str(old / "versions" / "v0" / "model"),
        "rollouts": str(old / "versions" / "v0" / "rollouts"), "workdir": "/elsewhere/w"}})
    ledger.add_version("v1", "v0")
    # A ledger from before relative paths: an absolute path into its own workdir.
    ledger._conn.execute("UPDATE versions SET checkpoint=? WHERE id='v1'",
                         (str(old / "versions" / "v0" / "model"),))
    raw = ledger._q("SELECT checkpoint FROM versions WHERE id='v0'")[0][0]
    assert raw == os.path.join("versions", "v0", "model")
  new = tmp_path / "new"
  os.rename(old, new)
  with Ledger(new / "ledger.sqlite") as ledger:
    v0 = ledger.version("v0")
    assert v0.checkpoint == str(new / "versions" / "v0" / "model")
    assert v0.metrics["result"]["rollouts"] == str(new / "versions" / "v0" / "rollouts")
    assert v0.metrics["result"]["workdir"] == "/elsewhere/w"  # outside: kept absolute
    assert ledger.version("v1").checkpoint == str(new / "versions" / "v0" / "model")


def test_locked_ledger_is_a_clear_error_not_a_long_wait(tmp_path, monkeypatch):
  import evotrainer.evolution.ledger.core as ledger_mod
  monkeypatch.setattr(ledger_mod, "BUSY_TIMEOUT_S", 0.2)
  a = Ledger(tmp_path / "ledger.sqlite")
  b = Ledger(tmp_path / "ledger.sqlite")
  with a.transaction():
    start = time.time()
    with pytest.raises(LedgerError, match="is locked for writing by a process outside"):
      b.set_meta("x", 1)
  assert time.time() - start < 5
  a.close()
  b.close()


def _launch(*args, workdir, timeout=300):
  return subprocess.run([sys.executable, "-m", "evotrainer.launch", f"--workdir={workdir}",
                         *args], cwd=REPO, env=_env(), capture_output=True, text=True,
                        timeout=timeout)


@pytest.mark.slow
@pytest.mark.slow
def test_two_concurrent_launches(tmp_path):
  """A first launch (sample mode, tiny) holds the workdir; a second one on it stops at
  once naming the first's pid and host, and the first finishes undisturbed."""
  w = tmp_path / "run"
  first = subprocess.Popen(
      [sys.executable, "-m", "evotrainer.launch", f"--workdir={w}",
       "--gin_file=gin/math_train.gin", "--gin_file=gin/tiny.gin",
       "--gin_bindings=run.mode = 'sample'", "--gin_bindings=run.warm_start = False",
       f"--gin_bindings=make_tokenizer.cache_dir = '{tmp_path}/tok'"],
      cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while (wd.holder(w) or {}).get("pid") != first.pid:
      assert first.poll() is None and time.time() < deadline, first.stderr.read()[-2000:]
      time.sleep(0.2)
    start = time.time()
    out = _launch("--gin_file=gin/math_train.gin", "--gin_file=gin/tiny.gin", workdir=w)
    assert time.time() - start < 60
    assert first.poll() is None  # the check was made while the first one ran
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error (lock): workdir {w} is in use by pid {first.pid} on host")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
  finally:
    first.kill()
    first.wait()
  assert wd.holder(w) is None  # released at the end


@pytest.mark.slow
def test_launch_flags_unused_by_the_mode_are_errors(tmp_path):
  out = _launch("--gin_file=gin/math.gin", "--sweep_file=gin/sweeps/math_example.gin",
                workdir=tmp_path / "w")
  assert out.returncode == 2
  assert "error (config): --sweep_file is not used by run.mode='evolve'" in out.stderr
  out = _launch("--gin_file=gin/math.gin", "--gin_bindings=run.mode = 'ledger'",
                workdir=tmp_path / "typo")
  assert out.returncode == 2 and "no ledger in" in out.stderr
  assert not (tmp_path / "typo").exists()  # no empty ledger created
  with Ledger(tmp_path / "own" / "ledger.sqlite"):
    pass
  out = _launch("--gin_file=gin/math.gin", f"--resume_from={tmp_path / 'other'}",
                workdir=tmp_path / "own")
  assert out.returncode == 2 and "already holds a run" in out.stderr


def _jsonl(path, n, long_at=None, offset=0):
  rows = []
  for i in range(n):
    a, b = i + offset, 7 * i % 13
    q = f"Tom has {a} apples and buys {b} more. How many apples does Tom have now?"
    if i + 1 == long_at:
      q = " ".join(str(1000 + j) for j in range(400)) + " What is the sum?"
    rows.append(json.dumps({"question": q, "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}))
  path.write_text("\n".join(rows) + "\n")
  return path


@pytest.mark.slow
def test_launch_refuses_long_prompts_then_a_changed_relaunch(tmp_path):
  train = _jsonl(tmp_path / "train.jsonl", 300, long_at=3)
  test = _jsonl(tmp_path / "test.jsonl", 20, offset=5000)
  w = tmp_path / "run"
  args = ["--gin_file=gin/math_train.gin", "--gin_file=gin/tiny.gin",
          "--gin_bindings=MathTask.sources = ['jsonl']",
          f"--gin_bindings=MathTask.jsonl_files = ['{train}']",
          f"--gin_bindings=MathTask.test_jsonl_files = ['{test}']",
          "--gin_bindings=MathTask.num_validation = 8", "--gin_bindings=MathTask.num_test = 8",
          "--gin_bindings=run.tokenizer_texts = 300",
          f"--gin_bindings=make_tokenizer.cache_dir = '{tmp_path}/tok'",
          f"--gin_bindings=warm_start.cache_dir = '{tmp_path}/ws'"]
  out = _launch(*args, workdir=w)
  assert out.returncode == 2, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error (data): 1 prompt(s) do not fit the model"), last
  assert f"{train}:3 (" in last and "max_position_embeddings=512" in last
  assert "Traceback" not in out.stderr and "traceback: " in last
  assert "DataError" in (w / "error.log").read_text()  # the full traceback is kept
  assert not (tmp_path / "ws").exists() and not (w / "checkpoints").exists()  # no training
  # The same workdir relaunched with another seed: refused with the change, at once.
  out = _launch(*args, "--gin_bindings=run.seed = 1", workdir=w)
  assert out.returncode == 2
  assert "error (workdir): workdir " in out.stderr and "\n  run.seed: 0 -> 1\n" in out.stderr
  assert "--new_segment" in out.stderr
  # Accepted as a new segment (it then stops at the same data error).
  out = _launch(*args, "--gin_bindings=run.seed = 1", "--new_segment", workdir=w)
  assert out.returncode == 2 and "error (data)" in out.stderr
  seg = json.loads((w / wd.SEGMENTS_NAME).read_text().splitlines()[0])
  assert seg["changes"] == ["run.seed: 0 -> 1"]


def test_a_moved_evolution_workdir_resumes(tmp_path):
  from tests.evolution.test_controller import ScriptedTrainer, make

  class CheckingTrainer(ScriptedTrainer):
    """Writes a checkpoint directory; a parent's must exist where the ledger says."""

    def __init__(self):
      super().__init__({"learning_rate": {"delta": 0.2}})
      self.parents = []

    def train(self, *, version, parent_checkpoint, bindings, seed, workdir):
      if parent_checkpoint is not None:
        assert os.path.isdir(parent_checkpoint), parent_checkpoint
        self.parents.append(parent_checkpoint)
      os.makedirs(f"{workdir}/ckpt", exist_ok=True)
      return super().train(version=version, parent_checkpoint=parent_checkpoint,
                           bindings=bindings, seed=seed, workdir=workdir)

  c, ledger, _ = make(tmp_path, {}, name="old", trainer=CheckingTrainer(), branches=2)
  c.run()
  ledger.close()
  os.rename(tmp_path / "old", tmp_path / "new")
  trainer = CheckingTrainer()
  c, ledger, _ = make(tmp_path, {}, name="new", trainer=trainer, branches=2, generations=2)
  c.run()
  assert ledger.get_meta("controller/generation") == 2
  assert trainer.parents and all(p.startswith(str(tmp_path / "new")) for p in trainer.parents)
  assert not ledger.meta_items("controller/infra/")  # nothing failed for the move
  ledger.close()
