"""Rollout store: every training and evaluation episode, as Parquet (see store.py)."""

from evotrainer.rollouts.store import (
    SCHEMA,
    CorruptRolloutError,
    QuarantinedFile,
    RolloutExistsError,
    RolloutStore,
    RolloutStoreError,
    StepMetadata,
    StoredStep,
    episodes_to_table,
    table_to_columns,
    table_to_episodes,
)

