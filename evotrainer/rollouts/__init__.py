"""Rollouts: the stage between sampling and the harness.

  generation.py   `Generation` (a batch of scored rollouts on the host), `stop_reason`,
                  `merge`
  single_turn.py  `Rollout`: prompt -> one sampled completion -> score
  multiturn.py    `MultiTurnRollout`: episodes of model turns and environment
                  observations under a `TurnBudget` -> score
  schema.py       episodes <-> Arrow tables; store.py: the Parquet rollout store of every
                  training and evaluation episode
"""

from evotrainer.rollouts.generation import Generation, cut_at_stop, merge, stop_reason
from evotrainer.rollouts.multiturn import (
    BUDGET_STOPS,
    STOPS,
    MultiTurnRollout,
    TurnBudget,
    rollout_for,
)
from evotrainer.rollouts.schema import (
    SCHEMA,
    episodes_to_table,
    table_to_columns,
    table_to_episodes,
)
from evotrainer.rollouts.single_turn import Rollout
from evotrainer.rollouts.store import (
    CorruptRolloutError,
    QuarantinedFile,
    RolloutExistsError,
    RolloutStore,
    RolloutStoreError,
    StepMetadata,
    StoredStep,
)
