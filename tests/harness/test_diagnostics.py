"""Diagnostics on crafted episodes whose right answers are computed by hand."""

from typing import Optional

import gin
import numpy as np
import pytest

from evotrainer.harness import diagnostics as dg
from evotrainer.harness.base import Diagnostic, Report
from evotrainer.types import Episode
from tests.harness import make_episode


def ep(i: int, group: int = 0, completion: str = "", reward: float = 0.0,
       length: Optional[int] = None, logprobs=None, truncated: bool = False,
       info: Optional[dict] = None, **parts) -> Episode:
  """`make_episode` with reward parts as keywords, and sampler log-probs."""
  e = make_episode(row=i, group=group, completion=completion or f"completion {i}",
                   reward_parts=parts, length=length, truncated=truncated, info=info,
                   reward=reward, answer="5")
  if logprobs is not None:
    e.logprobs = np.asarray(logprobs, np.float32)
  return e


def ids(finding) -> list:
  return [e[0] for e in finding.evidence]


# ------------------------------------------------------------------ score


def test_bc_is_mean_correct_and_flags_sparse_reward():
  eps = [ep(i, correct=float(i == 0)) for i in range(25)]  # 1 of 25 = 0.04
  rep = dg.CorrectnessRate(threshold=0.05)(eps, {})
  assert rep.metrics == {"bc": pytest.approx(0.04)}
  (f,) = rep.findings
  assert f.kind == "bc" and f.layer == "score" and f.value == pytest.approx(0.04)
  assert ids(f) == [f"v0/0/{i}" for i in range(1, 6)]  # failures illustrate, k = 5
  assert dg.CorrectnessRate(threshold=0.04)(eps, {}).findings == ()  # strictly below


def test_reward_mean_parts_and_gap():
  eps = [ep(0, reward=1.5, correct=1.0, format=1.0), ep(1, reward=0.5, correct=0.0,
                                                         format=1.0)]
  rep = dg.RewardMean(threshold=0.4)(eps, {})
  assert rep.metrics["reward_mean"] == pytest.approx(1.0)
  assert rep.metrics["part/correct"] == pytest.approx(0.5)
  assert rep.metrics["part/format"] == pytest.approx(1.0)
  assert rep.metrics["reward_minus_bc"] == pytest.approx(0.5)
  assert len(rep.findings) == 1
  assert dg.RewardMean()(eps, {}).findings == ()  # threshold None: metrics only


@pytest.mark.parametrize("incumbent,word,trend", [(0.38, "improving", 1.0),
                                                  (0.415, "flat", 0.0),
                                                  (0.50, "regressing", -1.0)])
def test_score_trend_against_incumbent(incumbent, word, trend):
  eps = [ep(0, correct=1.0), ep(1, correct=0.0)]
  ctx = {"heldout": {"avg8": 0.42, "pass8": 0.7, "tag": "x"},
         "incumbent": {"avg8": incumbent}}
  rep = dg.ScoreTrend(metric="avg8", flat_band=0.01)(eps, ctx)
  assert rep.metrics["avg8"] == 0.42 and rep.metrics["pass8"] == 0.7
  assert "tag" not in rep.metrics
  assert rep.metrics["trend"] == trend
  assert rep.metrics["trend_delta"] == pytest.approx(0.42 - incumbent)
  (f,) = rep.findings
  assert f.message.startswith(word)
  # an improvement is illustrated with successes, flat and regressing with failures
  assert ids(f) == (["v0/0/0"] if trend > 0 else ["v0/0/1"])


def test_score_trend_falls_back_to_bc_and_needs_an_incumbent():
  eps = [ep(0, correct=1.0), ep(1, correct=1.0), ep(2, correct=0.0), ep(3, correct=0.0)]
  rep = dg.ScoreTrend(metric="bc")(eps, {"incumbent": {"bc": 0.25}})
  assert rep.metrics["trend_delta"] == pytest.approx(0.25)
  assert dg.ScoreTrend()(eps, {"heldout": {"avg8": 0.5}}).findings == ()


# ------------------------------------------------------------------ signal


def _dgr_batch():
  """8 groups of 4; groups 1, 4 and 6 have constant rewards (dead)."""
  eps, i = [], 0
  for g in range(8):
    for row in range(4):
      if g == 1:
        c = 1.0  # all solved
      elif g in (4, 6):
        c = 0.0  # none solved
      else:
        c = float(row < 2)
      eps.append(ep(i, group=g, reward=c, correct=c))
      i += 1
  return eps


def test_dead_group_ratio_three_of_eight():
  eps = _dgr_batch()
  rep = dg.DeadGroupRatio(threshold=0.3)(eps, {})
  assert rep.metrics["dead_group_ratio"] == 0.375
  assert rep.metrics["dead_groups"] == 3 and rep.metrics["num_groups"] == 8
  assert rep.metrics["dead_all_correct"] == 1 / 8
  assert rep.metrics["dead_all_wrong"] == 2 / 8
  (f,) = rep.findings
  assert f.kind == "dead_group_ratio" and f.layer == "signal" and f.threshold == 0.3
  # one episode of each dead group: the first row of groups 1, 4, 6
  assert ids(f) == ["v0/0/4", "v0/0/16", "v0/0/24"]
  assert dg.DeadGroupRatio()(eps, {}).findings == ()  # default 0.5


def test_reward_spread_mean_std():
  # group 0 rewards [1, 0]: std 0.5; group 1 [0.2, 0.2]: std 0  -> mean 0.25
  eps = [ep(0, 0, reward=1.0), ep(1, 0, reward=0.0), ep(2, 1, reward=0.2),
         ep(3, 1, reward=0.2)]
  rep = dg.RewardSpread(threshold=0.3)(eps, {})
  assert rep.metrics["reward_spread"] == pytest.approx(0.25)
  assert rep.metrics["reward_spread_min"] == 0.0
  assert ids(rep.findings[0])[0] == "v0/0/2"  # the flattest group first


def test_advantage_health_share_nonzero():
  eps = [ep(i) for i in range(8)]
  adv = np.array([0, 0, 1, -1, 0, 0, 0.5, -0.5])
  rep = dg.AdvantageHealth(threshold=0.6)(eps, {"advantages": adv})
  assert rep.metrics["nonzero_advantage"] == 0.5
  assert ids(rep.findings[0]) == ["v0/0/0", "v0/0/1", "v0/0/4", "v0/0/5"]
  # token-level [n, T] advantages: a row counts when any token is non-zero
  tok = np.zeros((8, 3))
  tok[1, 2] = 0.1
  assert dg.AdvantageHealth()(eps, {"advantages": tok}).metrics["nonzero_advantage"] == 1 / 8
  assert dg.AdvantageHealth()(eps, {}).metrics == {}


# ------------------------------------------------------------------ behaviour


def test_length_reward_correlation_matches_numpy_and_hand_value():
  lengths = [10, 20, 30, 40, 50, 60]
  rewards = [0, 0, 1, 0, 1, 1]
  eps = [ep(i, group=i // 3, reward=r, length=n) for i, (n, r) in
         enumerate(zip(lengths, rewards))]
  rep = dg.LengthRewardCorrelation()(eps, {})
  corr = rep.metrics["length_reward_corr"]
  # by hand: sum dx*dy = 35, sum dx^2 = 1750, sum dy^2 = 1.5 -> 35 / sqrt(2625)
  assert corr == pytest.approx(35 / np.sqrt(2625))
  assert corr == pytest.approx(np.corrcoef(lengths, rewards)[0, 1])
  (f,) = rep.findings
  assert f.kind == "length_reward_corr" and f.value > 0.3
  # the longest episodes with reward >= the mean (0.5): lengths 60, 50, 30
  assert ids(f) == ["v0/0/5", "v0/0/4", "v0/0/2"]
  # within groups: [10,20,30]/[0,0,1] and [40,50,60]/[0,1,1] both give sqrt(3)/2
  assert rep.metrics["length_reward_corr_within"] == pytest.approx(np.sqrt(3) / 2)


def test_right_answers_that_are_longer_are_not_length_gaming():
  # A BC-only reward where the correct completions are the long ones (wrong ones were cut
  # short): the plain correlation is high, but inside each class the reward is constant.
  lengths, correct = [10, 12, 14, 40, 42, 44], [0, 0, 0, 1, 1, 1]
  eps = [ep(i, reward=c, length=n, correct=c) for i, (n, c) in enumerate(zip(lengths, correct))]
  rep = dg.LengthRewardCorrelation()(eps, {})
  assert rep.metrics["length_reward_corr"] == pytest.approx(np.corrcoef(lengths, correct)[0, 1])
  assert rep.metrics["length_reward_corr"] > 0.9
  assert np.isnan(rep.metrics["length_reward_corr_given_correct"]) and rep.findings == ()


def test_a_reward_that_pays_length_among_equally_correct_answers_fires():
  # reward = correct + 0.01 * length: inside each class reward and length are collinear.
  lengths, correct = [10, 20, 30, 15, 25, 35], [0, 0, 0, 1, 1, 1]
  eps = [ep(i, reward=c + 0.01 * n, length=n, correct=c)
         for i, (n, c) in enumerate(zip(lengths, correct))]
  rep = dg.LengthRewardCorrelation()(eps, {})
  assert rep.metrics["length_reward_corr_given_correct"] == pytest.approx(1.0)
  (f,) = rep.findings
  assert f.value == pytest.approx(1.0) and "equally correct" in f.message


def test_length_gaming_needs_varying_reward():
  eps = [ep(i, reward=1.0, length=10 * (i + 1)) for i in range(5)]
  rep = dg.LengthRewardCorrelation()(eps, {})
  assert np.isnan(rep.metrics["length_reward_corr"]) and rep.findings == ()


def test_format_failure_threshold_is_strict():
  three = [ep(i, format=float(i >= 3)) for i in range(10)]  # 3 of 10 fail
  rep = dg.FormatFailureRate()(three, {})
  assert rep.metrics["format_failure"] == pytest.approx(0.3)
  assert rep.findings == ()  # 0.3 is not strictly above the 0.3 threshold
  four = [ep(i, format=float(i >= 4)) for i in range(10)]
  (f,) = dg.FormatFailureRate()(four, {}).findings
  assert f.value == pytest.approx(0.4) and ids(f) == [f"v0/0/{i}" for i in range(4)]


def test_answer_spamming_counts_candidates():
  texts = ["<answer>3</answer>", r"\boxed{3} so <answer>4</answer>",
           "<answer>3</answer> <answer>3.0</answer>", r"\boxed{1} \boxed{2} \boxed{5}",
           "no numbers here"]  # candidates 1, 2, 1, 3, 0
  eps = [ep(i, completion=t) for i, t in enumerate(texts)]
  rep = dg.AnswerSpammingRate()(eps, {})
  assert rep.metrics["answer_spamming"] == pytest.approx(2 / 5)
  assert rep.metrics["candidates_mean"] == pytest.approx(7 / 5)
  (f,) = rep.findings
  assert ids(f) == ["v0/0/3", "v0/0/1"]  # most candidates first
  assert f.evidence[0][1].startswith("[3 answers]")


def test_repetition_rate_finds_loops():
  loop = "so the answer is maybe five or six " * 5  # an 8-word phrase, 5 times
  eps = [ep(0, completion=loop), ep(1, completion="one two three four five six"),
         ep(2, completion="we add 2 and 3 to get 5. <answer>5</answer>"),
         ep(3, completion="think " + loop)]
  rep = dg.RepetitionRate()(eps, {})
  assert rep.metrics["repetition_rate"] == 0.5
  assert ids(rep.findings[0]) == ["v0/0/0", "v0/0/3"]
  assert dg.has_loop("a b " * 3, n=2, min_repeats=3)  # "a b" x3 (and "b a" x2)
  assert not dg.has_loop("a b " * 3, n=2, min_repeats=4)


def _share_of_long(episodes, context):
  return {"long_share": float(np.mean([e.length > 2 for e in episodes]))}


def test_domain_diagnostic_from_a_path():
  d = dg.DomainDiagnostic(fn=f"{__name__}:_share_of_long", name="long", metric="long_share",
                          threshold=0.4)
  eps = [ep(0, length=1), ep(1, length=3), ep(2, length=5), ep(3, length=2)]
  rep = d(eps, {})
  assert rep.metrics == {"long_share": 0.5}
  (f,) = rep.findings
  assert f.kind == "long" and f.layer == "behaviour"
  assert isinstance(d, Diagnostic)
  with pytest.raises(ValueError, match="cannot be loaded"):
    dg.DomainDiagnostic(fn=f"{__name__}:nope")
  with pytest.raises(ValueError, match="LAYERS|one of"):
    dg.DomainDiagnostic(fn=_share_of_long, layer="vibes")


# ------------------------------------------------------------------ model state


def test_entropy_collapse_from_learner_context():
  eps = [ep(0, logprobs=[-0.5, -1.5]), ep(1, logprobs=[-0.01, -0.03, -0.02])]
  rep = dg.EntropyCollapse(threshold=0.1)(eps, {"learner": {"entropy": 0.05}})
  assert rep.metrics["entropy"] == 0.05
  assert rep.metrics["mean_logprob"] == pytest.approx(-2.06 / 5)  # token-weighted
  (f,) = rep.findings
  assert f.kind == "entropy" and f.layer == "model" and f.value == pytest.approx(0.05)
  assert ids(f)[0] == "v0/0/1"  # the most deterministic episode first
  assert dg.EntropyCollapse()(eps, {"learner/entropy": 0.5}).findings == ()


def test_entropy_estimate_from_logprobs_when_learner_has_none():
  eps = [ep(0, logprobs=[-0.02, -0.04])]
  rep = dg.EntropyCollapse(threshold=0.1)(eps, {})
  assert rep.metrics["entropy_estimate"] == pytest.approx(0.03)
  assert len(rep.findings) == 1


def test_learner_metrics_kl_clip_and_grad_spike():
  eps = [ep(i) for i in range(3)]
  ctx = {"learner": {"approx_kl": np.float32(0.2), "kl": 0.01, "clip_frac_low": 0.1,
                     "clip_frac_high": 0.15, "grad_norm": 5.0},
         "series": {"grad_norm": [1.0, 1.2, 0.8, 1.0]}, "advantages": [0.1, -2.0, 1.0]}
  kl = dg.KLDrift()(eps, ctx)
  assert kl.metrics == {"approx_kl": pytest.approx(0.2), "kl": 0.01}
  assert ids(kl.findings[0]) == ["v0/0/1", "v0/0/2", "v0/0/0"]  # by |advantage|
  clip = dg.ClipFraction(threshold=0.2)(eps, ctx)
  assert clip.metrics["clip_frac"] == pytest.approx(0.25) and len(clip.findings) == 1
  gn = dg.GradNormSpike(threshold=3.0)(eps, ctx)
  assert gn.metrics["grad_norm_ratio"] == pytest.approx(5.0)  # median of history is 1
  assert gn.findings[0].kind == "grad_norm"
  assert dg.GradNormSpike()(eps, {"learner": {"grad_norm": 5.0}}).findings == ()


# ------------------------------------------------------------------ efficiency


def test_length_percentiles_match_numpy():
  lengths = [3, 17, 5, 40, 8, 1, 22, 9, 13, 2, 31]
  eps = [ep(i, length=n) for i, n in enumerate(lengths)]
  rep = dg.LengthPercentiles(threshold=30)(eps, {})
  assert rep.metrics["length_p50"] == np.percentile(lengths, 50) == 9.0
  assert rep.metrics["length_p90"] == pytest.approx(np.percentile(lengths, 90))
  assert rep.metrics["length_p90"] == pytest.approx(31.0)  # sorted[9] = 31, sorted[10] = 40
  assert dg.LengthPercentiles(threshold=31)(eps, {}).findings == ()
  (f,) = dg.LengthPercentiles(threshold=30)(eps, {}).findings
  assert ids(f)[0] == "v0/0/3"  # the longest one
  # hand: 1..10 -> P50 5.5, P90 9.1
  r = dg.LengthPercentiles()([ep(i, length=i + 1) for i in range(10)], {}).metrics
  assert (r["length_p50"], r["length_p90"]) == (5.5, pytest.approx(9.1))


def test_truncation_and_turns():
  eps = [ep(i, truncated=i < 2, info={"turns": t}) for i, t in enumerate([1, 3, 2, 6])]
  rep = dg.TruncationRate(threshold=0.25)(eps, {})
  assert rep.metrics["truncation_rate"] == 0.5
  assert ids(rep.findings[0]) == ["v0/0/0", "v0/0/1"]
  t = dg.TurnCount(threshold=2.5)(eps, {})
  assert t.metrics["turns_mean"] == 3.0 and t.metrics["turns_max"] == 6.0
  assert t.metrics["turns_p90"] == pytest.approx(np.percentile([1, 3, 2, 6], 90))
  assert ids(t.findings[0])[0] == "v0/0/3"
  assert dg.TurnCount()([ep(0)], {}).metrics == {}


# ------------------------------------------------------------------ library and runner


class _Const:
  layer = "behaviour"

  def __init__(self, name, metrics):
    self.name, self.metrics = name, metrics

  def __call__(self, episodes, context):
    return Report(dict(self.metrics))


def test_run_diagnostics_prefixes_only_ambiguous_names():
  metrics, findings = dg.run_diagnostics(
      [_Const("a", {"x": 1, "y": 2}), _Const("b", {"x": 3}),
       dg.DeadGroupRatio(threshold=0.3)], _dgr_batch(), {})
  assert metrics["a/x"] == 1 and metrics["b/x"] == 3 and metrics["y"] == 2
  assert "x" not in metrics and metrics["dead_group_ratio"] == 0.375
  assert [f.kind for f in findings] == ["dead_group_ratio"]
  with pytest.raises(ValueError, match="unique"):
    dg.run_diagnostics([_Const("a", {}), _Const("a", {})], [], {})


def test_run_diagnostics_names_a_failing_diagnostic():
  def boom(episodes, context):
    raise KeyError("missing part")
  with pytest.raises(RuntimeError, match="'mine'"):
    dg.run_diagnostics([dg.DomainDiagnostic(fn=boom, name="mine")], [ep(0)], {})


def test_default_library_runs_with_unique_metric_names():
  eps = [ep(i, group=i // 2, reward=float(i % 3 == 0), length=5 + i,
            logprobs=[-0.5] * 3, correct=float(i % 3 == 0), format=1.0,
            info={"turns": 1}) for i in range(8)]
  ctx = {"heldout": {"avg8": 0.5, "pass8": 0.9}, "incumbent": {"avg8": 0.4},
         "advantages": np.ones(8), "learner": {"entropy": 1.0, "approx_kl": 0.01,
                                               "clip_frac_low": 0.0,
                                               "clip_frac_high": 0.0, "grad_norm": 1.0}}
  diags = dg.default_diagnostics()
  assert {d.name for d in diags} == set(dg.DIAGNOSTICS) - {"domain"}
  assert all(isinstance(d, Diagnostic) for d in diags)
  metrics, findings = dg.run_diagnostics(diags, eps, ctx)
  assert not [m for m in metrics if "/" in m and not m.startswith("part/")]
  assert {"bc", "dead_group_ratio", "length_p90", "entropy", "avg8"} <= set(metrics)
  assert [f.kind for f in findings] == ["score_trend"]  # improving


def test_gin_binds_thresholds():
  gin.clear_config()
  try:
    gin.parse_config("harness.DeadGroupRatio.threshold = 0.2\n"
                     "harness.FormatFailureRate.threshold = 0.1")
    assert dg.DeadGroupRatio().threshold == 0.2
    assert dg.FormatFailureRate().threshold == 0.1
  finally:
    gin.clear_config()


def test_bad_direction_is_rejected():
  with pytest.raises(ValueError, match="direction"):
    dg.DeadGroupRatio(direction="sideways")


def test_a_user_class_registers_and_binds_like_a_builtin():
  @dg.register
  @gin.configurable(module="harness_test")
  class LongAnswers:
    name, layer = "long_answers", "behaviour"

    def __init__(self, threshold: float = 10.0):
      self.threshold = threshold

    def __call__(self, episodes, context):
      return Report({"long_answers": float(sum(e.length > self.threshold for e in episodes))})

  try:
    assert dg.DIAGNOSTICS["long_answers"] is LongAnswers
    gin.clear_config()
    gin.parse_config("harness_test.LongAnswers.threshold = 2")
    metrics, _ = dg.run_diagnostics([dg.DIAGNOSTICS["long_answers"]()],
                                    [ep(0, length=1), ep(1, length=3)], {})
    assert metrics == {"long_answers": 1.0}
    with pytest.raises(ValueError, match="taken"):
      dg.register(type("Other", (), {"name": "long_answers"}))
  finally:
    dg.DIAGNOSTICS.pop("long_answers", None)
    gin.clear_config()
