"""Rollout store: every training and evaluation episode, as Parquet (see store.py; the
schema and the episodes <-> Arrow table round trip are in schema.py)."""

from evotrainer.rollouts.schema import (
    SCHEMA,
    episodes_to_table,
    table_to_columns,
    table_to_episodes,
)
from evotrainer.rollouts.store import (
    CorruptRolloutError,
    QuarantinedFile,
    RolloutExistsError,
    RolloutStore,
    RolloutStoreError,
    StepMetadata,
    StoredStep,
)
