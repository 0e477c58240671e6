"""bench/perf_real.py: its whole path on the tiny `--quick` model (child processes
included), and its summaries checked against the raw runs they come from."""

import importlib.util
import inspect
import json
import os
import subprocess
import sys

import pytest

from bench import perf_real
from evotrainer.learner.step import Learner
from tests.tiny_models import tiny_config

ROWS, TOKENS = 2, 8  # --quick: batch 2, 8-token prompts, 8 new tokens


def _quick(tmp_path, parts: str):
  argv = ["--quick", "--parts", parts, "--json", str(tmp_path / "quick.json"),
          "--cache_dir", str(tmp_path / "cache")]
  return perf_real.main(argv), argv


def test_learner_flops_per_token():
  cfg = tiny_config()
  f = cfg.flops_per_token((16 + 1) / 2)
  head = 2.0 * cfg.hidden_size * cfg.vocab_size
  assert perf_real.learner_flops_per_token(cfg, 16, None) == 3 * f
  # Every block trained, the head frozen: backward through the head once (to its input).
  assert perf_real.learner_flops_per_token(cfg, 16, cfg.num_layers) == pytest.approx(3 * f - head)
  one_block = perf_real.learner_flops_per_token(cfg, 16, 1)
  assert one_block == pytest.approx(f + head + 2 * (f - head) / cfg.num_layers)


# A decode step's matmul FLOPs per row for QUICK_SIZES, by hand (E 64, M 128, L 2, H 4,
# KV 2, D 16, V 512): per layer q and o 2 x E x H x D, k and v 2 x E x KV x D, the MLP
# 3 x E x M; then the head E x V; two FLOPs per multiply-add.
QUICK_M, QUICK_LAYERS = 128, 2
QUICK_MATMUL_FLOPS = 2 * (QUICK_LAYERS * (2 * 64 * 4 * 16 + 2 * 64 * 2 * 16 + 3 * 64 * 128)
                          + 64 * 512)


def test_decode_matmul_program_does_the_counted_matmuls(tmp_path):
  """XLA's own count of the program's FLOPs is the hand count the split divides by (the
  gate x up product adds E x M per row and layer, nothing else)."""
  source = perf_real.model_source(True, str(tmp_path / "cache"))
  f, args = perf_real.decode_matmul_program(perf_real.ours_model(source, "float32"), 3)
  cost = f.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  assert cost["flops"] == pytest.approx(3 * (QUICK_MATMUL_FLOPS + QUICK_LAYERS * QUICK_M),
                                        rel=0.01)


def test_decode_attention_program_attends_over_every_slot_of_every_layer(tmp_path):
  """Against a naive numpy attention: each block's query heads (head h reads kv head
  h // G) over all S cached keys and values; and the FLOPs the split divides by."""
  import numpy as np
  source = perf_real.model_source(True, str(tmp_path / "cache"))
  model = perf_real.ours_model(source, "float32")
  f, (caches, q, mask) = perf_real.decode_attention_program(model, 3, 5)
  outs = f(caches, q, mask)
  assert len(outs) == len(caches) == QUICK_LAYERS
  q = np.asarray(q)  # [B, KV, G, 1, D]
  for out, (k, v) in zip(outs, caches):
    k, v = np.asarray(k), np.asarray(v)  # [B, KV, D, S], [B, KV, S, D]
    for b in range(3):
      for h in range(4):  # quick model: 4 heads over 2 kv heads
        kv, g = divmod(h, 2)
        scores = q[b, kv, g, 0] @ k[b, kv] / 4.0  # sqrt(D = 16)
        p = np.exp(scores - scores.max())
        np.testing.assert_allclose(out[b, 0, h], (p / p.sum()) @ v[b, kv], rtol=1e-5,
                                   atol=1e-5)
  _, flops = perf_real.decode_attention(model, 3, 5)
  assert flops == 2 * 2 * 3 * 4 * 5 * 16 * QUICK_LAYERS  # q.k, p.v: B H S D per layer


@pytest.mark.slow
def test_quick_sampler_and_learner(tmp_path, capsys):
  payload, argv = _quick(tmp_path, "sampler,learner")
  runs = payload["runs"]
  ours = runs["sampler/ours/float32/b2"]["result"]["modes"]["greedy"]
  theirs = runs["sampler/transformers/float32/b2"]["result"]["modes"]["greedy"]
  # The same weights and prompts: greedy decoding gives the same tokens on both sides.
  assert ours["row_digests"] == theirs["row_digests"]
  assert len(ours["row_digests"]) == ROWS
  assert payload["sampler_greedy_agreement"] == {"float32_b2": 1.0}
  for side in (ours, theirs):
    assert side["tokens_per_s"] > 0
    assert side["tokens_per_s"] == pytest.approx(ROWS * TOKENS / side["steady_s"])
  ratio = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3)
  assert payload["sampler_vs_transformers"] == {"greedy_b2": ratio}
  assert payload["sampler_by_dtype"] == {"float32": {"greedy_b2": ratio}}
  split = payload["sampler_time_split"]["float32_b2"]
  assert split["prefill_s"] > 0 and split["lm_head_ms_per_step"] > 0
  assert split["prefill_s"] + split["decode_s"] == pytest.approx(ours["steady_s"])
  flops = QUICK_MATMUL_FLOPS * ROWS
  seconds = split["matmul_ms_per_step"] / 1000
  assert split["matmul_gflops_per_s"] == pytest.approx(flops / seconds / 1e9)
  # The tiny model's decode time is a difference of two noisy timings: it can be <= 0.
  decode = split["decode_s"]
  share = seconds * (TOKENS - 1) / decode if decode > 0 else None
  assert split["matmul_share"] == (pytest.approx(share) if share else None)
  assert split["matmul_peak_gflops_per_s"] > 0
  # Attention over the whole cache of 8 + 8 slots: q.k and p.v, 2 x S x D FLOPs per head
  # (4), row and layer.
  attention = split["attention_ms_per_step"] / 1000
  assert split["attention_gflops_per_s"] == pytest.approx(
      2 * 2 * ROWS * 4 * 2 * TOKENS * 16 * QUICK_LAYERS / attention / 1e9)
  share = attention * (TOKENS - 1) / decode if decode > 0 else None
  assert split["attention_share"] == (pytest.approx(share) if share else None)

  config = perf_real.model_config(perf_real.model_source(True, str(tmp_path / "cache")))
  full = runs["learner/float32/full"]["result"]
  whole = runs["learner/float32/full_whole"]["result"]
  top = runs["learner/float32/top1"]["result"]
  # --quick: micro-batches of 1 row, but for the whole-batch arm.
  assert [runs[f"learner/float32/{arm}"]["settings"]["micro_batch"]
          for arm in ("full", "full_whole", "top1")] == [1, None, 1]
  assert payload["learner_mfu"] == {"float32": round(full["mfu"], 4)}
  for r, layers in ((full, None), (whole, None), (top, 1)):
    assert r["tokens_per_s"] == pytest.approx(ROWS * 2 * TOKENS / r["step_s"])
    assert r["flops_per_token"] == perf_real.learner_flops_per_token(config, 2 * TOKENS, layers)
    assert r["mfu"] == pytest.approx(
        r["flops_per_token"] * r["tokens_per_s"] / 1e9 / r["peak_gflops_per_s"])
    assert 0 < r["mfu"] < 1
  assert 0 < top["trainable_params"] < full["trainable_params"] == config.num_params()
  load = payload["machine"]["load_by_part"]
  assert set(load) == {"sampler", "learner"} and len(load["sampler"]["before"]) == 3

  # Resumable: a rerun with the same settings measures nothing and keeps the runs.
  capsys.readouterr()
  again = perf_real.main(argv)
  out = capsys.readouterr().out
  assert "running" not in out and out.count("skipped") == len(runs) == 5
  assert again["runs"] == json.loads(json.dumps(runs))
  # --force measures the chosen runs again, and only those.
  forced = perf_real.main(argv[:2] + ["learner", "--dtypes", "float32", "--force"] + argv[3:])
  out = capsys.readouterr().out
  assert out.count("running") == 3 and out.count("skipped") == 0
  assert forced["runs"]["sampler/ours/float32/b2"] == again["runs"]["sampler/ours/float32/b2"]
  assert forced["runs"]["learner/float32/full"] != again["runs"]["learner/float32/full"]


def test_trl_command_runs_the_driver_with_our_settings(tmp_path):
  spec = {"source": {"dir": "/models", "gguf_file": "m.gguf", "name": "m"},
          "prompts_path": "/p.json", "group": 8, "new_tokens": 128}
  cmd = perf_real.trl_command(spec, "/work")
  assert cmd[0] == sys.executable and os.path.isfile(cmd[1])
  # The driver's own parser reads it as meant (protocol.py needs numpy only).
  probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import protocol; "
           "sys.argv = sys.argv[2:]; print(json.dumps(vars(protocol.parse_args('x'))), "
           "file=sys.stderr)")
  proc = subprocess.run([sys.executable, "-c", probe, os.path.dirname(cmd[1]), *cmd[1:]],
                        capture_output=True, text=True, check=True)
  args = json.loads(proc.stderr.strip().splitlines()[-1])
  assert args == {"ckpt": "/models", "gguf_file": "m.gguf", "prompts": "/p.json",
                  "group_size": 8, "new_tokens": 128, "learning_rate": perf_real.LEARNING_RATE,
                  "kl_coef": 0.0, "epsilon_high": perf_real.CLIP_HIGH,
                  "exact_new_tokens": True, "gated": False, "workdir": "/work",
                  "micro_batch": None}
  micro = perf_real.trl_command({**spec, "micro_batch": 8}, "/work")
  assert micro[micro.index("--micro_batch") + 1] == "8"
  # TRL's upper clip is the one our Learner uses by default.
  assert inspect.signature(Learner).parameters["clip_high"].default == perf_real.CLIP_HIGH
  hf_dir = perf_real.trl_command({**spec, "source": {"dir": "/d", "gguf_file": None}}, "/w")
  assert "--gguf_file" not in hf_dir


@pytest.mark.slow
def test_quick_rl_step_against_trl(tmp_path):
  if importlib.util.find_spec("trl") is None:
    pytest.skip("trl is not installed: pip install -e '.[bench]' (setup.py's bench extra)")
  payload, _ = _quick(tmp_path, "rl")
  rl = payload["rl_step_vs_trl"]
  for side in ("ours", "ours_top1", "trl", "trl_mb1"):
    # 2 prompts x 2 samples: the same prompt tokens, exactly 8 new tokens on both sides.
    assert rl[side]["prompt_tokens_per_step"] == 2 * 2 * TOKENS
    assert rl[side]["completion_tokens_per_step"] == 2 * 2 * TOKENS
    assert rl[side]["tokens_per_s"] > 0 and rl[side]["steps_timed"] == 1
    assert rl[side]["generation_s"] > 0 and rl[side]["training_s"] > 0
  assert "reference" not in rl["trl"]["phase_s"]  # KL off: TRL builds no reference model
  best = max(("trl", "trl_mb1"), key=lambda side: rl[side]["tokens_per_s"])
  assert rl["trl_best"] == best
  for side in ("ours", "ours_top1"):
    assert rl[f"{side}_over_trl"] == round(rl[side]["tokens_per_s"] / rl[best]["tokens_per_s"], 3)


def _rl_run(step_s, round_=0, warmup=1):
  # A warm-up record (never timed), then the timed ones: 100 prompt + 300 completion tokens.
  records = [{"step_s": 99.0, "phase_s": {"rollout": 1.0, "update": 2.0},
              "prompt_tokens": 100, "completion_tokens": 300}]
  records += [{"step_s": s, "phase_s": {"rollout": s / 4, "update": 3 * s / 4},
               "prompt_tokens": 100, "completion_tokens": 300} for s in step_s]
  return {"settings": {"part": "rl", "warmup": warmup, **({"round": round_} if round_ else {})},
          "result": {"records": records}}


def test_rl_rounds_pool_the_timed_steps_and_report_each_rounds_ratio():
  runs = {"rl/ours": _rl_run([2.0, 4.0]), "rl/trl": _rl_run([8.0, 8.0]),
          "rl/trl_mb8": _rl_run([10.0, 10.0]),
          "rl/ours@1": _rl_run([4.0, 4.0], 1), "rl/trl@1": _rl_run([10.0, 10.0], 1),
          "rl/trl_mb8@1": _rl_run([5.0, 5.0], 1)}
  got = perf_real.rl_summary(runs)
  rl = got["rl_step_vs_trl"]
  # Pooled timed steps: ours 2, 4, 4, 4 (median 4 s: 100 tokens/s); trl 8, 8, 10, 10 (9 s);
  # trl_mb8 10, 10, 5, 5 (7.5 s: 53.33 tokens/s, the faster arm).
  assert rl["ours"]["s_per_step"] == 4.0 and rl["ours"]["tokens_per_s"] == 100.0
  assert rl["ours"]["steps_timed"] == 4 and rl["ours"]["first_step_s"] == 99.0
  assert rl["ours"]["generation_s"] == 1.0 and rl["ours"]["training_s"] == 3.0
  assert rl["trl"]["s_per_step"] == 9.0 and rl["trl_mb8"]["s_per_step"] == 7.5
  assert rl["trl_best"] == "trl_mb8" and rl["ours_over_trl"] == round(7.5 / 4.0, 3)
  # Within each round: round 0 ours 3 s against trl's 8 (2.667); round 1 4 s against
  # trl_mb8's 5 (1.25).
  assert got["rl_rounds"] == {"ours_over_trl": {"rounds": 2, "min": 1.25, "max": 2.667}}
  one = perf_real.rl_summary({k: v for k, v in runs.items() if "@" not in k})
  assert "rl_rounds" not in one and one["rl_step_vs_trl"]["ours_over_trl"] == round(8 / 3, 3)


def _sampler_run(side, dtype, rates, round_=0):
  settings = {"part": "sampler", "side": side, "dtype": dtype, "batch": 16,
              **({"round": round_} if round_ else {})}
  return {"settings": settings,
          "result": {"modes": {m: {"tokens_per_s": r} for m, r in rates.items()}}}


def test_sampler_rounds_take_each_cells_median_and_report_the_spread():
  runs = {}
  # Three rounds of greedy at batch 16: ours 300 / 200 / 250, transformers (bfloat16, its
  # best) 150 / 125 / 100; transformers' float32 always slower (90).
  for n, (ours, theirs) in enumerate(((300.0, 150.0), (200.0, 125.0), (250.0, 100.0))):
    tag = f"@{n}" if n else ""
    runs[f"sampler/ours/float32/b16{tag}"] = _sampler_run("ours", "float32", {"greedy": ours}, n)
    runs[f"sampler/transformers/bfloat16/b16{tag}"] = _sampler_run(
        "transformers", "bfloat16", {"greedy": theirs}, n)
    runs[f"sampler/transformers/float32/b16{tag}"] = _sampler_run(
        "transformers", "float32", {"greedy": 90.0}, n)
  got = perf_real.sampler_summary(runs)
  # Medians 250 and 125: 2.0; within each round 2.0, 1.6, 2.5.
  assert got["sampler_vs_transformers"] == {"greedy_b16": 2.0}
  assert got["sampler_best_dtype"] == {"greedy_b16": {"ours": "float32",
                                                      "transformers": "bfloat16"}}
  assert got["sampler_rounds"] == {"greedy_b16": {"rounds": 3, "min": 1.6, "max": 2.5}}
  assert got["sampler_tokens_per_s"]["ours/float32/greedy_b16"] == 250.0
  assert got["sampler_by_dtype"] == {"float32": {"greedy_b16": round(250 / 90, 3)}}
  one = {k: v for k, v in runs.items() if "@" not in k}  # round 0 alone: no spread
  assert perf_real.sampler_summary(one)["sampler_rounds"] == {}
  assert perf_real.sampler_summary(one)["sampler_vs_transformers"] == {"greedy_b16": 2.0}


def test_a_round_is_a_repeat_of_the_sampler_or_rl_part(tmp_path):
  args = perf_real.parse_args(["--parts", "sampler", "--round", "2"])
  names = [name for name, _ in perf_real.plan(args, {"name": "m"}, 100)]
  assert names and all(n.endswith("@2") for n in names)
  assert perf_real.plan(args, {"name": "m"}, 100)[0][1]["round"] == 2
  base = perf_real.parse_args(["--parts", "sampler"])
  assert "round" not in perf_real.plan(base, {"name": "m"}, 100)[0][1]  # stored rows match
  rl = perf_real.plan(perf_real.parse_args(["--parts", "rl", "--round", "1"]), {"name": "m"}, 100)
  assert [name for name, _ in rl] == ["rl/ours@1", "rl/ours_top4@1", "rl/trl@1", "rl/trl_mb8@1"]
  assert all(spec["round"] == 1 for _, spec in rl)
  for bad in (["--round", "1"], ["--parts", "sampler,learner", "--round", "1"],
              ["--parts", "sampler", "--round", "-1"]):
    with pytest.raises(SystemExit):
      perf_real.parse_args(bad)
