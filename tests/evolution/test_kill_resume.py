"""kill -9 of a whole evolution run at random moments (mid-training, mid-checkpoint,
mid-ledger-write), relaunched with the same workdir: the run ends with the lineage of an
uninterrupted run, and no finished training is repeated."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from evotrainer.evolution.ledger import Ledger
from evotrainer.evolution.skills import SkillLibrary
from tests.evolution.test_controller import lineage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start(workdir):
  proc = subprocess.Popen([sys.executable, "-m", "tests.evolution.killable_run", str(workdir)],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "START", proc.stderr.read()
  return proc


def _finish(workdir) -> float:
  """Runs to the end; the seconds from START (imports done) to the end."""
  proc = _start(workdir)
  start = time.time()
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0 and "DONE" in out, err[-3000:]
  return time.time() - start


def _record(workdir):
  with Ledger(workdir / "ledger.sqlite") as ledger:
    decisions = [(d.id, d.version_id, d.outcome, d.why) for d in ledger.decisions()]
    return lineage(ledger), decisions, len(ledger.findings())


def _skill_counts(workdir):
  return {s.name: (s.successes, s.failures, s.domains_validated)
          for s in SkillLibrary(workdir / "skills")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("ref") / "run"
  return workdir, _finish(workdir)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_lineage(reference, tmp_path, seed):
  ref_dir, ref_time = reference
  workdir = tmp_path / "run"
  rng = random.Random(seed)
  kills = 1 + seed % 2  # odd seeds are killed twice
  for _ in range(kills):
    proc = _start(workdir)
    time.sleep(rng.uniform(0.0, 1.0) * ref_time)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
  _finish(workdir)
  assert _record(workdir) == _record(ref_dir)
  assert _skill_counts(workdir) == _skill_counts(ref_dir)
  finished = (workdir / "calls.log").read_text().split()
  assert sorted(finished) == sorted(set(finished))  # no finished training repeated
  versions = {v[0] for v in _record(ref_dir)[0][0]}
  assert set(finished) <= versions
  assert all((workdir / "versions" / v / "result.json").exists() for v in versions)
