"""The metrics writer: JSON lines, findings and TensorBoard event files."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_metric_writer_writes_tensorboard_without_importing_torch(tmp_path):
  """tensorboardX is imported with torch hidden (torch costs every training process 2-3 s
  of CPU): the scalars still reach the event file, and no stub is left in sys.modules.
  A fresh process, since this one may have imported torch already."""
  code = ("import sys; from evotrainer.metric_writer import MetricWriter; "
          "w = MetricWriter(sys.argv[1]); w.write(1, {'reward': 0.5}); "
          "assert w.tb is not None; "
          "assert 'torch' not in sys.modules, sys.modules.get('torch', 'stub')")
  proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (events,) = os.listdir(tmp_path / "tensorboard")
  assert events.startswith("events.out.tfevents")
  assert b"reward" in (tmp_path / "tensorboard" / events).read_bytes()
