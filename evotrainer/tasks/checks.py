"""Checks of a task's data against the model, at build time, before any training.

A prompt longer than the model's positions once failed after minutes of training (the
warm start trained on it and cached the result) naming no row. `check_prompt_lengths`
tokenizes every prompt the run can see up front — every row read from files (file:line),
the validation and test sets, a sample of generated training problems — and refuses the
run when a prompt plus the completion budget exceeds `max_position_embeddings`.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from evotrainer.tasks.base import DataError, Problem


def _where(p: Problem) -> str:
  meta = p.meta or {}
  if "file" in meta and "line" in meta:
    return f"{meta['file']}:{meta['line']}"
  return p.id


def check_prompt_lengths(problems: Iterable[Problem], format_prompt: Callable[[Problem], str],
                         encode: Callable[[str], Sequence[int]], *, max_positions: int,
                         max_new_tokens: int, show: int = 3) -> int:
  """Raises DataError naming the first offenders (file:line) when a prompt's tokens plus
  `max_new_tokens` exceed `max_positions`; returns the longest prompt in tokens."""
  longest, bad, seen = 0, [], set()
  for p in problems:
    if p.id in seen:
      continue
    seen.add(p.id)
    n = len(encode(format_prompt(p))) + 1  # + a bos the sampler may add
    longest = max(longest, n)
    if n + max_new_tokens > max_positions:
      bad.append((p, n))
  if bad:
    first = ", ".join(f"{_where(p)} ({n} tokens)" for p, n in bad[:show])
    raise DataError(
        f"{len(bad)} prompt(s) do not fit the model: prompt tokens + {max_new_tokens} new "
        f"tokens > max_position_embeddings={max_positions}; first: {first}. Drop or "
        f"shorten those rows, lower the new-token budget (SamplingParams.max_new_tokens, "
        f"EvalConfig.max_new_tokens), or use a model with more positions")
  return longest


__all__ = ["check_prompt_lengths"]
