"""The math domain: problems answered with a number or an expression, graded by answer.

  task.py      `MathTask`: procedural problems (reasoning-gym generators, a tiny built-in
               arithmetic generator for CPU-sized models) and local GSM8K / MATH JSONL,
               split into disjoint train / held-out sets.
  verify.py    `VerifierPool`: math-verify run in worker processes with a per-item
               timeout (math-verify can hang and uses signals, so it never runs in the
               trainer's own process). Answer extraction is domain-neutral:
               tasks/answers.py.
  canaries.py  canary prompts with known answers, shipped as data (data/canaries/).
  calculator.py  the calculator tool (`MathTask.calculator`: "3 + 4 =" gets " 7" written
               by the tool) and the exact arithmetic it and the gold checks share.
  diagnostics.py  `arithmetic_slip`: equations written with a wrong value, registered in
               the harness's diagnostic library.

Nothing is imported here, so a verifier worker that imports verify.py loads no more
than it needs.
"""
