"""Canary prompts: a fixed set of questions with known answers, shipped as data.

A canary's answer is written in its file, not produced by the task's generator or graded
by the task's verifier, so a change of the reward, the verifier, the answer extraction or
the data pipeline cannot move it: every version is scored on the canaries by greedy
decoding and an exact check of the `<answer>` tag against the file's answer (the
`canary_prompts` validator compares a child with its parent on them). Canary prompts are
validation-split prompts (`base.split_of`), so no version ever trains on them.

File schema (JSONL, one object a line): `{"prompt": "12+7=", "answer": "19"}`; both
non-empty strings. A malformed row is an error naming file:line.

Shipped sets (`data/canaries/`): `tiny_arithmetic_d{1,2,3}.jsonl`, 128 prompts each,
written by `python -m evotrainer.tasks.math.task` (`write_default_canaries`, beside the
generator) from validation-split prompts beyond the first 500 validation problems (the
main job's validation set); once written, a file's answers no longer depend on the
generator, and tests/tasks/math/test_canaries.py re-checks each by an independent sum.
"""

from __future__ import annotations

import pathlib
from typing import Optional, Sequence

from evotrainer.tasks.base import BadRow, Problem, json_object, read_jsonl

DATA = pathlib.Path(__file__).resolve().parent / "data" / "canaries"
SIZE = 128
SKIP_VALIDATION = 500  # shipped canaries lie beyond the first 500 validation prompts

def _parse_row(line: str, path: pathlib.Path, lineno: int) -> Problem:
  row = json_object(line)
  for field in ("prompt", "answer"):
    if not isinstance(row.get(field), str) or not row[field].strip():
      raise BadRow(f"field {field!r} must be a non-empty string, got {row.get(field)!r:.60}")
  return Problem(f"canary/{path.stem}/{lineno}", row["prompt"], row["answer"].strip(),
                 row["answer"].strip(), "canary", 0, {"file": str(path), "line": lineno})


def load_canaries(path: str | pathlib.Path) -> list[Problem]:
  """The canaries of a JSONL file (schema above); a bad row raises DataError."""
  return read_jsonl(path, _parse_row, "error", "canary").problems


def default_canary_file(sources: Sequence[str], difficulty: int) -> Optional[pathlib.Path]:
  """The shipped canary file for a task made of `sources` alone, else None."""
  if tuple(sources) == ("tiny_arithmetic",):
    path = DATA / f"tiny_arithmetic_d{difficulty}.jsonl"
    return path if path.is_file() else None
  return None
