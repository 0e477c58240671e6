"""Progress output: a bar only on a terminal, plain periodic lines in a log file."""

import io

from evotrainer.console import LineProgress, is_terminal, progress_bar


def test_log_file_gets_plain_lines_every_n_steps():
  out = io.StringIO()
  bar = progress_bar(total=25, desc="RL", every=10, file=out)
  assert isinstance(bar, LineProgress) and not is_terminal(out)
  for _ in range(25):
    bar.update(1)
    bar.set_postfix(reward="0.50")
  bar.write("[train] step 25: held-out ...")
  bar.close()
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue()
  assert [l.split()[1] for l in lines if l.startswith("[RL]")] == ["10/25", "20/25", "25/25"]
  assert "reward=0.50" in lines[0] and lines[2] == "[train] step 25: held-out ..."


def test_disabled_progress_prints_nothing():
  out = io.StringIO()
  bar = progress_bar(total=5, desc="RL", disable=True, file=out)
  for _ in range(5):
    bar.update(1)
  bar.close()
  assert out.getvalue() == ""
