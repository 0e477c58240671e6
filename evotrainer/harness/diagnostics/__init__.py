"""Diagnostics: metrics per layer (docs/method.md, step 2) with thresholds that emit Findings.

Each diagnostic is a gin-configurable class (`module="harness"`) with a `name`, a `layer`
(one of `types.LAYERS`), a `threshold` and a `direction` ('above': a finding when the
value is strictly above the threshold; 'below': strictly below; `threshold=None`: metrics
only). `__call__(episodes, context) -> Report(metrics, findings)`; each Finding carries
up to `max_evidence` `(episode_id, snippet)` pairs chosen to illustrate it. Diagnostics
are pure functions of their inputs, so any of them can be replayed on stored rollouts.

Layers and the library names (`DIAGNOSTICS`):
  score       bc, reward, score_trend
  signal      dead_group_ratio, reward_spread, advantage_health
  behaviour   length_reward_corr, format_failure, answer_spamming, repetition, domain
  model       entropy, kl, clip_fraction, grad_norm, training_drift (stability.py: drift
              toward collapse over a training segment's series)
  efficiency  length, truncation, turns, stop_reasons
A domain registers its own diagnostics here when its module is imported (the domain
imports the harness, never the reverse; registry.py imports them before gin parses):
  code        syntax_error_rate, timeout_rate (efficiency), pass_fraction_spread (signal),
              hardcoded_outputs, prose_rate, broken_fence, wrong_name_rate (behaviour),
              runaway_length (efficiency): tasks/code/diagnostics.py, over CodeTask's
              parts
  swe         tool_mix, first_edit_turn, tool_streak, echo_trap_rate, git_usage (behaviour):
              tasks/swe/diagnostics.py, over the tool calls of tasks/swe/episode.py
  math        arithmetic_slip (behaviour): tasks/math/diagnostics.py, over the equations
              math completions write

`context` keys read (all optional; a diagnostic whose input is missing reports nothing):
  'heldout':    {name: value} held-out figures, e.g. {'avg8': .4, 'pass8': .7, 'greedy': .5}.
  'incumbent':  {name: value} the incumbent version's figures, same names ('avg8', 'bc').
  'advantages': [n] or [n, T] advantages aligned with `episodes`.
  'learner':    the learner's step metrics {'entropy', 'approx_kl', 'kl', 'clip_frac_low',
                'clip_frac_high', 'grad_norm', ...}; flat 'learner/<k>' keys (as train.py
                writes them) are read too.
  'series':     {name: [earlier values]}, e.g. 'grad_norm', for spike detection.

A per-domain analyzer is either `DomainDiagnostic(fn="my.module:fn", ...)`, or a class of
your own: give it `name`, `layer` and `__call__(episodes, context) -> Report`, decorate
it with `@gin.configurable(module="harness")` and `@register`, load its module with
`--import=my.module`, and name it in gin like a built-in one.

This package's `__init__` holds the library (`DIAGNOSTICS`, `register`,
`default_diagnostics`) and the runner (`run_diagnostics`); the diagnostics live by layer
in its modules, their diagnostics and metric functions re-exported here:
  score.py      score and signal layers
  behaviour.py  behaviour layer, and the per-domain hook
  model.py      model and efficiency layers
  stability.py  training_drift, and the drift signals the stability validator reads
  base.py       the shared metric functions and `ThresholdDiagnostic`, the base class
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import gin

from evotrainer.harness.base import registrar
from evotrainer.harness.diagnostics.base import (DIRECTIONS, has_loop, is_dead,
                                                 learner_metric, lengths_of, pearson,
                                                 rewards_of)
from evotrainer.harness.diagnostics.behaviour import (AnswerSpammingRate, DomainDiagnostic,
                                                      FormatFailureRate,
                                                      LengthRewardCorrelation,
                                                      RepetitionRate)
from evotrainer.harness.diagnostics.model import (ClipFraction, EntropyCollapse,
                                                  GradNormSpike, KLDrift,
                                                  LengthPercentiles, StopReasons,
                                                  TruncationRate, TurnCount)
from evotrainer.harness.diagnostics.score import (AdvantageHealth, CorrectnessRate,
                                                  DeadGroupRatio, RewardMean, RewardSpread,
                                                  ScoreTrend)
from evotrainer.harness.diagnostics.stability import TrainingDrift, drift_signals
from evotrainer.types import Episode


# ------------------------------------------------------------------ library and runner

DIAGNOSTICS: dict = {}


register = registrar(DIAGNOSTICS, "diagnostic")


for _cls in (CorrectnessRate, RewardMean, ScoreTrend, DeadGroupRatio, RewardSpread,
             AdvantageHealth, LengthRewardCorrelation, FormatFailureRate,
             AnswerSpammingRate, RepetitionRate, EntropyCollapse, KLDrift, ClipFraction,
             GradNormSpike, LengthPercentiles, TruncationRate, TurnCount, StopReasons,
             TrainingDrift):
  register(_cls)
DIAGNOSTICS["domain"] = DomainDiagnostic  # needs `fn`; not in `default_diagnostics`


@gin.configurable(module="harness")
def default_diagnostics() -> list:
  """One instance, default knobs, of every library diagnostic except `domain`."""
  return [cls() for name, cls in DIAGNOSTICS.items() if name != "domain"]


def run_diagnostics(diags: Sequence, episodes: Sequence[Episode],
                    context: Optional[dict] = None) -> tuple[dict, list]:
  """Runs diagnostics and merges their reports.

  A metric keeps its own name (`dead_group_ratio`, `length_p90`) unless several
  diagnostics report the same name; then each of them is prefixed with its diagnostic's
  name (`"<diagnostic>/<metric>"`). Findings keep the order of `diags`.

  Returns:
    `(metrics, findings)`: {name: float} and a list of `Finding`.
  """
  context = context or {}
  names = [d.name for d in diags]
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"run_diagnostics: diagnostic names must be unique, repeated: {dup}")
  reports = []
  for d in diags:
    try:
      reports.append(d(episodes, context))
    except Exception as e:
      raise RuntimeError(f"diagnostic {d.name!r} ({type(d).__name__}) failed: "
                         f"{type(e).__name__}: {e}") from e
  seen = collections.Counter(m for r in reports for m in r.metrics)
  metrics, findings = {}, []
  for d, r in zip(diags, reports):
    for m, v in r.metrics.items():
      metrics[f"{d.name}/{m}" if seen[m] > 1 else m] = float(v)
    findings.extend(r.findings)
  return metrics, findings


__all__ = ["DIAGNOSTICS", "DIRECTIONS", "AdvantageHealth", "AnswerSpammingRate",
           "ClipFraction", "CorrectnessRate", "DeadGroupRatio", "DomainDiagnostic",
           "EntropyCollapse", "FormatFailureRate", "GradNormSpike", "KLDrift",
           "LengthPercentiles", "LengthRewardCorrelation", "RepetitionRate", "RewardMean",
           "RewardSpread", "ScoreTrend", "StopReasons", "TruncationRate", "TurnCount",
           "default_diagnostics", "has_loop", "is_dead", "learner_metric", "lengths_of",
           "pearson", "register", "rewards_of", "run_diagnostics"]
