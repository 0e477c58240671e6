"""The code domain: the policy writes programs, run against hidden tests in the sandbox.

  task.py         `CodeTask`: prompts, code extraction and the reward parts.
  executor.py     the in-cell driver, a batch of programs run on a `CellPool`, verdicts.
  problems.py     procedural templates with reference solutions, HumanEval, JSONL rows.
  diagnostics.py  syntax errors, timeouts, partial-pass spread and hard-coded outputs,
                  registered in the harness's diagnostic library.
"""
