"""Rollouts: the stage between sampling and the harness.

Two data names, two engines:
  `Generation`        a sampled batch: what a rollout engine returns (host side, scored,
                      rows grouped G per problem)
  `types.Episode`     an episode record: one row of a `Generation` as the harness,
                      diagnostics and the store see it (`Generation.episodes`)
  `SingleTurnEngine`  the engine for single-turn tasks: prompt -> one sampled
                      completion -> score
  `MultiTurnEngine`   the engine for multi-turn tasks: model turns and environment
                      observations under a `TurnBudget` -> score
`rollout_for` picks a task's engine. (The sampler's own output, `types.SamplerOutput`,
is one sampler call's tokens on the device, before decoding and scoring.)

  generation.py   `Generation`, `stop_reason`, `merge`
  single_turn.py  `SingleTurnEngine`
  multiturn.py    `MultiTurnEngine`, `TurnBudget`, `rollout_for`
  schema.py       episodes <-> Arrow tables; store.py: `RolloutStore`, the Parquet store of
                  every training and evaluation episode
"""

from evotrainer.rollouts.generation import Generation, cut_at_stop, merge, stop_reason
from evotrainer.rollouts.multiturn import (
    BUDGET_STOPS,
    STOPS,
    MultiTurnEngine,
    TurnBudget,
    rollout_for,
)
from evotrainer.rollouts.schema import (
    SCHEMA,
    episodes_to_table,
    table_to_columns,
    table_to_episodes,
)
from evotrainer.rollouts.single_turn import SingleTurnEngine
from evotrainer.rollouts.store import (
    CorruptRolloutError,
    QuarantinedFile,
    RolloutExistsError,
    RolloutStore,
    RolloutStoreError,
    StepMetadata,
    StoredStep,
)
