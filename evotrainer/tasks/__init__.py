"""Domains the policy is trained on.

A task turns problems into prompts and scores completions into reward parts. Each domain
is a package with its task, its verifier or executor, its diagnostics and its data; the
modules here are shared by all of them:

  base.py     `Problem` (the record a task hands out), the `Task` protocol, JSONL reading
              and the train / validation / test split.
  answers.py  answer extraction from completion text (tags, boxes, `####`, the last
              number), candidates, numbers, and the exact verdict: domain-neutral, read
              by the harness.
  chat.py     the multi-turn chat layout.
  checks.py   build-time checks of a task's data against the model.
  datasets.py a task's problems materialized into a TFDS dataset (`DatasetTask`).
  math/       `MathTask`, math-verify in worker processes, the canaries.
  code/       `CodeTask`, the in-sandbox driver and verdicts, problems, code diagnostics.
  swe/        SWE tasks synthesized in real repositories, their episodes and tools, SWE
              diagnostics and leak validators.
"""
