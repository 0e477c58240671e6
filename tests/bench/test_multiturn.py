"""bench/multiturn.py at a tiny size: the figures it reports add up."""

import json

import pytest

from bench import multiturn

MS_HALF = 0.00005  # half of the JSON's 0.1 ms rounding step


def _within_rounding(ratio, num, num_half, den, ratio_half, den_half=MS_HALF):
  """Whether a rounded `ratio` of num / den can come from values that round to the
  recorded ones (num within +-num_half, den within +-den_half; the ratio itself within
  +-ratio_half)."""
  lo = (num - num_half) / (den + den_half) - ratio_half
  hi = (num + num_half) / (den - den_half) + ratio_half
  return lo <= ratio <= hi


@pytest.mark.slow  # compiles 4 small sampler programs: about a minute on 2 shared cores
def test_multiturn_bench_runs_and_its_figures_add_up(tmp_path):
  out = tmp_path / "multiturn.json"
  payload = multiturn.main(["--batch", "2", "--turns", "2", "--tokens_per_turn", "4",
                            "--max_context", "40", "--repeats", "1", "--json", str(out)])
  assert json.loads(out.read_text()) == payload
  (row,) = payload["results"]
  assert row["batch"] == 2 and row["turns"] == 2
  # Two turns of 1..4 sampled tokens per episode, and one observation between them of
  # at least 5 tokens ('<0:>' and a newline).
  assert 2 * 2 <= row["model_tokens"] <= 2 * 2 * 4
  assert row["trajectory_tokens"] >= row["model_tokens"] + 2 * 5
  # Times are rounded to 0.1 ms in the JSON (a few ms here, so a few percent), rates to
  # 0.1 and shares to 0.001: each ratio must lie between the ratios of the rounding
  # intervals' ends.
  assert _within_rounding(row["model_tokens_per_s"], row["model_tokens"], 0.0,
                          row["wall_s"], 0.05)
  assert row["sampler_prefill_s"] > 0 and row["sampler_turn_s"] > 0
  assert _within_rounding(row["prefill_share"], row["sampler_prefill_s"], MS_HALF,
                          row["sampler_turn_s"], 0.0005)
  # Both engines sampled the same tokens (the same keys); the speedup is their ratio.
  assert row["same_tokens"] is True
  assert _within_rounding(row["speedup_continuation"], row["wall_s"], MS_HALF,
                          row["continuation"]["wall_s"], 0.0005)
  # Context widths are buckets below 40 - 4 = 36: (16, 32, 36), each compiled for the
  # 4-token turns and for the 1-token prefill probe at most; the continuation's second
  # turn adds one (width, chunk) program per width at most.
  assert 1 <= row["sampler_programs"] <= 9


@pytest.mark.slow  # a few small sampler programs (batches of 4 and 2 rows)
def test_multiturn_bench_overlap_mode_reports_both_arms(tmp_path):
  out = tmp_path / "overlap.json"
  payload = multiturn.main(["--batch", "4", "--turns", "2", "--tokens_per_turn", "4",
                            "--max_context", "40", "--repeats", "1", "--env_latency_s",
                            "0.05", "--json", str(out)])
  assert json.loads(out.read_text()) == payload and len(payload["load"]) == 3
  (row,) = payload["results"]
  assert row["overlap_waves"] == 2 and row["env_s_lock_step"] == pytest.approx(0.1)
  for arm in ("lock_step", "overlap"):
    # Every episode takes both turns, each followed by its 0.05 s tool: a wave, like
    # the lock-step batch, waits for its own two steps.
    assert row[arm]["wall_s"] >= 0.1
    assert row[arm]["episodes_per_s"] == pytest.approx(4 / row[arm]["wall_s"], rel=0.01)
  assert row["speedup_overlap"] == pytest.approx(
      row["lock_step"]["wall_s"] / row["overlap"]["wall_s"], rel=0.01)
