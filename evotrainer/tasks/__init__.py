"""Domains the policy is trained on.

A task turns problems into prompts and scores completions into reward parts:

  base.py    `Problem` (the record a task hands out) and the `Task` protocol.
  verify.py  answer extraction from completion text, and `VerifierPool`: math-verify run
             in worker processes with a per-item timeout (math-verify can hang and uses
             signals, so it never runs in the trainer's own process).
  math.py    `MathTask`: procedural problems (reasoning-gym generators, a tiny built-in
             arithmetic generator for CPU-sized models) and local GSM8K / MATH JSONL,
             split into disjoint train / held-out sets.
  code.py    `CodeTask`: the policy writes programs, run against hidden tests in the
             sandbox (code_exec.py: the in-cell driver and verdicts); problems from
             templates, users' JSONL and HumanEval (code_problems.py).
"""
