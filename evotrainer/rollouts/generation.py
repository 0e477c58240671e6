"""`Generation`: one sampled, scored batch on the host, whatever engine produced it.

Both rollout engines return it (`single_turn.SingleTurnEngine`,
`multiturn.MultiTurnEngine`); the trainer reads it into a `TrainBatch` and `Generation.episodes` into the harness's
`Episode` records. `stop_reason` names why each row ended; `merge` concatenates the
rounds of dynamic sampling.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from evotrainer.types import Episode


@dataclasses.dataclass
class Generation:
  """The sampled, scored rows of one batch of problems (rows grouped: G per problem).

  Single-turn: `tokens` is the sampled completion and every token up to `lengths` is
  trained. Multi-turn (`multiturn.MultiTurnEngine`): `tokens` is the whole trajectory
  after the prompt (model turns and observations), `logprobs` are 0 at observation
  tokens, and `loss_mask` marks the sampled ids, the only ones trained.
  """

  problems: list  # [B] Problem, each repeated G times in a row
  prompt_tokens: np.ndarray  # [B, P] left-padded
  prompt_lengths: np.ndarray  # [B]
  tokens: np.ndarray  # [B, N] completion ids
  logprobs: np.ndarray  # [B, N]
  lengths: np.ndarray  # [B]
  truncated: np.ndarray  # [B] bool
  texts: list  # [B] decoded completions
  scores: list  # [B] dicts of reward parts from the task
  loss_mask: Optional[np.ndarray] = None  # [B, N] bool; None: the first `lengths` tokens
  infos: Optional[list] = None  # [B] dicts merged into `Episode.info` (multi-turn)

  def completion_mask(self) -> np.ndarray:
    """[B, N] bool: the tokens the policy is trained on (`loss_mask`, else the first
    `lengths` tokens of every row)."""
    if self.loss_mask is not None:
      return self.loss_mask
    return np.arange(self.tokens.shape[1])[None, :] < self.lengths[:, None]

  def part(self, name: str) -> np.ndarray:
    return np.array([s.get(name, 0.0) for s in self.scores], np.float32)

  def episodes(self, task, *, version: str, step: int, split: str, group: int,
               first_row: int = 0) -> list:
    """One `Episode` per row; ids `version/split/step/row`, groups numbered per step.

    `info` is the row's `infos` entry (multi-turn: the environment's record and the turn
    spans) with `stop` set to `stop_reason` of its scores."""
    out = []
    for i, p in enumerate(self.problems):
      row = first_row + i
      n = int(self.lengths[i])
      out.append(Episode(
          episode_id=f"{version}/{split}/{step}/{row}", group_id=row // group, task_id=p.id,
          prompt=task.format_prompt(p), completion=self.texts[i], answer=p.answer,
          reward_parts=dict(self.scores[i]), version=version, step=step, split=split,
          completion_ids=self.tokens[i, :n].copy(), logprobs=self.logprobs[i, :n].copy(),
          truncated=bool(self.truncated[i]),
          info={**(self.infos[i] if self.infos is not None else {}),
                "stop": stop_reason(self.scores[i], bool(self.truncated[i]))}))
    return out


def stop_reason(score: dict, truncated: bool) -> str:
  """Why a completion ended: 'malformed' (refused unread), else the task's own verdict
  when it reports one as a one-hot `stop_<reason>` part (code: 'syntax_error',
  'timeout', ...), else 'max_tokens' or 'stop_token'."""
  if score.get("malformed"):
    return "malformed"
  for key, value in score.items():
    if key.startswith("stop_") and value:
      return key[len("stop_"):]
  return "max_tokens" if truncated else "stop_token"


def merge(gens: Sequence[Generation]) -> Generation:
  """Concatenates generation rounds: prompts re-padded on the left and completions on
  the right to one width (multi-turn rounds differ in width; the padding is masked)."""
  if len(gens) == 1:
    return gens[0]
  width = max(g.prompt_tokens.shape[1] for g in gens)
  n = max(g.tokens.shape[1] for g in gens)
  # Left padding is masked by prompt_lengths, right padding by lengths and the loss
  # mask, so the padding id does not matter.
  pad = lambda g: np.pad(g.prompt_tokens, ((0, 0), (width - g.prompt_tokens.shape[1], 0)))
  right = lambda x: np.pad(x, ((0, 0), (0, n - x.shape[1])))
  cat = lambda name: np.concatenate([getattr(g, name) for g in gens])
  multi = any(g.loss_mask is not None for g in gens)
  return Generation(
      problems=[p for g in gens for p in g.problems],
      prompt_tokens=np.concatenate([pad(g) for g in gens]), prompt_lengths=cat("prompt_lengths"),
      tokens=np.concatenate([right(g.tokens) for g in gens]),
      logprobs=np.concatenate([right(g.logprobs) for g in gens]), lengths=cat("lengths"),
      truncated=cat("truncated"), texts=[t for g in gens for t in g.texts],
      scores=[s for g in gens for s in g.scores],
      loss_mask=(np.concatenate([right(g.completion_mask()) for g in gens]) if multi
                 else None),
      infos=([i for g in gens for i in (g.infos or [{}] * len(g.problems))]
             if any(g.infos is not None for g in gens) else None))


def cut_at_stop(ids: np.ndarray, stop_ids: Sequence[int]) -> list:
  """`ids` [N] as a list without its last id when that is a stop id (the text to decode)."""
  ids = ids.tolist()
  if ids and ids[-1] in stop_ids:
    ids = ids[:-1]
  return ids
