"""Stop rules: a row also ends at the n-th token of a named kind, not only at a stop id.

A rule names a piece of text and a count. The tokens whose text, stripped of whitespace,
is that piece are the rule's ids; a row stops right after it has emitted `count` of
them (the last one included). `code_block` stops a completion at the fence that closes
its first code block (the opening fence is the first ```, the closing one the second),
so the words a chat model writes after its program are never sampled or trained on.

`SamplingParams.stop_rule` names the rule ('' for none); the rollout engine resolves its
ids against the policy's tokenizer with `rule_ids` and hands them to the sampler.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class StopRule:
  """Stop after the `count`-th token whose stripped text is `text`."""

  text: str
  count: int


STOP_RULES = {
    "code_block": StopRule(text="```", count=2),
}

# At most this many token ids per rule (a tokenizer spells a piece a few ways: '```'
# and ' ```' in SmolLM2's); the sampler's id array has this fixed width.
MAX_RULE_IDS = 8


def check_rule(name: str) -> None:
  """Raises ValueError unless `name` is '' or a rule of `STOP_RULES`."""
  if name and name not in STOP_RULES:
    raise ValueError(f"unknown stop rule {name!r}: expected '' (none) or one of "
                     f"{sorted(STOP_RULES)}")


@functools.lru_cache(maxsize=16)
def _ids_of(tokenizer, text: str) -> tuple[int, ...]:
  ids = tuple(i for i in range(tokenizer.vocab_size)
              if tokenizer.decode([i]).strip() == text)
  if not ids:
    raise ValueError(f"no token of this tokenizer reads {text!r}: the stop rule cannot "
                     "fire with it")
  if len(ids) > MAX_RULE_IDS:
    raise ValueError(f"{len(ids)} tokens read {text!r}, more than a rule holds "
                     f"({MAX_RULE_IDS})")
  return ids


def rule_ids(tokenizer, name: str) -> Optional[tuple[np.ndarray, int]]:
  """(the rule's token ids [MAX_RULE_IDS], padded with -1; its count), or None for ''."""
  check_rule(name)
  if not name:
    return None
  rule = STOP_RULES[name]
  ids = _ids_of(tokenizer, rule.text)
  out = np.full((MAX_RULE_IDS,), -1, np.int32)
  out[:len(ids)] = ids
  return out, rule.count
