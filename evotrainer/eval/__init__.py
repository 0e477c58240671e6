"""Evaluation, in one package:

  heldout.py         the held-out figures (Avg@k, pass@k, greedy) on the validation split
                     every `train.eval_every` steps, the test split at the end of a run,
                     and the greedy canary check (`EvalConfig`, gin module `train`).
  test_scores.py     the test split's scores of a run's versions: written beside a
                     branch's result, read back by the summary and the report only.
  pipeline_check.py  the evaluation pipeline's own check (verifier probes, disjoint
                     splits, repeatable re-evaluation) that an evolution runs before it
                     trains and on every escalation.

This module imports nothing: the controller reads `test_scores` and `pipeline_check`
without JAX, `heldout` brings JAX in.
"""
