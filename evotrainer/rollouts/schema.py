"""The rollout store's Parquet schema, and episodes <-> Arrow tables (store.py writes them).

Schema (`SCHEMA`): one column per `Episode` field plus two optional per-row columns the
harness produced, `advantage` (float64; float32 advantages are stored exactly) and `kept`
(bool; False = cut by a filter). Choices that make the round trip exact and replay fast:

  reward_parts    map<string, double>: keys in the dict's order, values as float64 (a bool
                  or int part reads back as a float that compares equal; None stays None).
                  A map rather than JSON so a replay pulls one part for a whole step
                  without parsing text: `table_to_columns` flattens it into one float64 column
                  per part name.
  info            JSON text (varied and nested). Numpy scalars / arrays are written as
                  numbers / lists; tuples read back as lists, non-string keys as strings.
                  Anything else is refused at write time, naming the episode. Strings
                  with lone surrogates round-trip exactly (written as JSON escapes).
  text columns    any string exactly (NUL, control characters, any length), except lone
                  surrogates: model text can hold them but UTF-8 cannot, so each is
                  stored as U+FFFD instead of refusing the step.
  completion_ids  list<int32>; None is stored as null (distinct from an empty array);
                  integer arrays of other dtypes are range-checked and cast.
  logprobs        list<float32> (what the sampler produces; float64 input is rounded).

`episodes_to_table` refuses, naming the episode, what it cannot store exactly;
`table_to_episodes` is its inverse, and `table_to_columns` reads a table as numpy columns
(ragged arrays padded, one float64 column per reward part) for vectorized replay.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from evotrainer.types import Episode

SCHEMA = pa.schema([
    ("episode_id", pa.string()),
    ("group_id", pa.int64()),
    ("task_id", pa.string()),
    ("prompt", pa.string()),
    ("completion", pa.string()),
    ("answer", pa.string()),
    ("reward_parts", pa.map_(pa.string(), pa.float64())),
    ("reward", pa.float64()),
    ("parsed_answer", pa.string()),
    ("info", pa.string()),  # JSON text
    ("version", pa.string()),
    ("step", pa.int64()),
    ("split", pa.string()),
    ("completion_ids", pa.list_(pa.int32())),  # [N_i] per row
    ("logprobs", pa.list_(pa.float32())),  # [N_i] per row
    ("truncated", pa.bool_()),
    ("advantage", pa.float64()),  # harness output, null when not recorded
    ("kept", pa.bool_()),  # harness output, null when not recorded
])
_STRINGS = ("episode_id", "task_id", "prompt", "completion", "answer", "version", "split")
_SURROGATE = re.compile("[\ud800-\udfff]")  # not encodable as UTF-8
_EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(Episode))
assert set(_EPISODE_FIELDS) <= set(SCHEMA.names), "every Episode field needs a column"


# ----------------------------------------------------------------------------- encoding


def _json_default(x: Any) -> Any:
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  raise TypeError(f"{type(x).__name__} is not JSON-serializable")


def to_json(value: Any, what: str) -> str:
  """`value` as JSON text (numpy scalars and arrays as numbers and lists); a TypeError
  naming `what` when it cannot be."""
  try:
    text = json.dumps(value, default=_json_default, ensure_ascii=False)
    if _SURROGATE.search(text):  # not UTF-8; as \u escapes they read back exactly
      text = json.dumps(value, default=_json_default)
    return text
  except (TypeError, ValueError) as e:
    raise TypeError(f"{what} must be JSON-serializable (str keys; numbers, strings, lists, "
                    f"dicts, numpy scalars/arrays): {e}") from None


def _column(episodes: Sequence[Episode], name: str, values: list, typ: pa.DataType) -> pa.Array:
  try:
    return pa.array(values, typ)
  except UnicodeEncodeError:  # lone surrogates in a text column: stored as U+FFFD
    return pa.array([_SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v
                     for v in values], typ)
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
    for ep, v in zip(episodes, values):  # find the row to name it
      try:
        pa.array([v], typ)
      except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        raise TypeError(f"episode {ep.episode_id!r}: {name}={v!r} cannot be stored as "
                        f"{typ}") from None
    raise TypeError(f"column {name}: {e}") from None


def _ragged(episodes: Sequence[Episode], name: str, kind: str,
            dtype: np.dtype) -> tuple[pa.Array, np.ndarray]:
  """A list column from per-episode 1-D arrays (None → null). Returns (array, lengths)."""
  parts, lengths, nulls = [], np.zeros(len(episodes), np.int64), np.zeros(len(episodes), bool)
  for i, ep in enumerate(episodes):
    x = getattr(ep, name)
    if x is None:
      nulls[i] = True
      continue
    x = np.asarray(x)
    if x.ndim != 1 or (x.size and x.dtype.kind not in kind):
      raise TypeError(f"episode {ep.episode_id!r}: {name} must be a 1-D array of kind "
                      f"{kind!r}; got shape {x.shape} dtype {x.dtype}")
    parts.append(x)
    lengths[i] = x.size
  if lengths.sum() > np.iinfo(np.int32).max:
    raise ValueError(f"{name}: over 2**31 - 1 values in one step; store it as several steps")
  flat = np.concatenate(parts) if parts else np.zeros(0, dtype)
  if flat.dtype != dtype and flat.size and dtype.kind == "i":
    info = np.iinfo(dtype)
    if flat.min() < info.min or flat.max() > info.max:
      raise ValueError(f"{name}: token ids outside the {dtype} range")
  flat = flat.astype(dtype, copy=False)
  offsets = np.zeros(len(episodes) + 1, np.int32)
  np.cumsum(lengths, out=offsets[1:])
  arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat),
                                 type=pa.list_(pa.from_numpy_dtype(dtype)),
                                 mask=pa.array(nulls) if nulls.any() else None)
  return arr, lengths


def episodes_to_table(episodes: Sequence[Episode], advantages: Optional[np.ndarray] = None,
                      kept: Optional[np.ndarray] = None) -> pa.Table:
  """Episodes (+ optional per-row advantage [B] and kept [B]) → an Arrow table of `SCHEMA`."""
  n = len(episodes)
  ids = [e.episode_id for e in episodes]
  if len(set(ids)) != n:
    dup = next(i for i in ids if ids.count(i) > 1)
    raise ValueError(f"episode_id {dup!r} occurs more than once in one step")
  cols: dict[str, pa.Array] = {}
  for name in _STRINGS:
    cols[name] = _column(episodes, name, [getattr(e, name) for e in episodes], pa.string())
  cols["parsed_answer"] = _column(episodes, "parsed_answer",
                                  [e.parsed_answer for e in episodes], pa.string())
  cols["group_id"] = _column(episodes, "group_id", [e.group_id for e in episodes], pa.int64())
  cols["step"] = _column(episodes, "step", [e.step for e in episodes], pa.int64())
  cols["reward"] = _column(episodes, "reward", [e.reward for e in episodes], pa.float64())
  cols["truncated"] = _column(episodes, "truncated", [e.truncated for e in episodes],
                              pa.bool_())

  keys, vals, offsets = [], [], np.zeros(n + 1, np.int32)
  for i, e in enumerate(episodes):
    if not isinstance(e.reward_parts, dict):
      raise TypeError(f"episode {e.episode_id!r}: reward_parts must be a dict, got "
                      f"{type(e.reward_parts).__name__}")
    keys.extend(e.reward_parts.keys())
    vals.extend(e.reward_parts.values())
    offsets[i + 1] = len(keys)
  try:
    cols["reward_parts"] = pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys, pa.string()),
                                                   pa.array(vals, pa.float64()))
  except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
    raise TypeError(f"reward_parts must map str to float: {e}") from None

  cols["info"] = pa.array(
      [None if e.info is None else "{}" if isinstance(e.info, dict) and not e.info else
       to_json(e.info, f"episode {e.episode_id!r}: info") for e in episodes], pa.string())

  cols["completion_ids"], n_ids = _ragged(episodes, "completion_ids", "iu", np.dtype(np.int32))
  cols["logprobs"], n_lp = _ragged(episodes, "logprobs", "f", np.dtype(np.float32))
  both = np.array([e.completion_ids is not None and e.logprobs is not None for e in episodes],
                  bool)
  bad = np.flatnonzero(both & (n_ids != n_lp))
  if bad.size:
    e = episodes[bad[0]]
    raise ValueError(f"episode {e.episode_id!r}: {n_ids[bad[0]]} completion_ids but "
                     f"{n_lp[bad[0]]} logprobs")

  for name, x, typ in (("advantage", advantages, pa.float64()), ("kept", kept, pa.bool_())):
    if x is None:
      cols[name] = pa.nulls(n, typ)
      continue
    x = np.asarray(x)
    if x.shape != (n,):
      raise ValueError(f"{name}s must have shape [{n}] (one per episode); got {x.shape}")
    if name == "kept" and x.dtype != bool:
      raise TypeError(f"kept must be a bool array; got {x.dtype}")
    cols[name] = pa.array(x.astype(np.float64) if name == "advantage" else x, typ)
  return pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)


# ----------------------------------------------------------------------------- decoding


def read_column(table: pa.Table, name: str) -> pa.Array:
  """Column `name` of `table` as one Arrow array (chunks concatenated)."""
  col = table.column(name)
  if col.num_chunks == 0:
    return pa.array([], col.type)
  return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)


def _ragged_numpy(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A list column → (offsets [B+1] into values, values (private, writable copy), null mask)."""
  offsets = arr.offsets.to_numpy()
  values = np.array(arr.values.to_numpy(zero_copy_only=False))
  return offsets, values, np.asarray(arr.is_null().to_numpy(zero_copy_only=False))


def table_to_episodes(table: pa.Table) -> list[Episode]:
  """The inverse of `episodes_to_table` (episodes only; see `StoredStep` for the rest)."""
  n = table.num_rows
  if n == 0:
    return []
  py = {name: read_column(table, name).to_pylist()
        for name in (*_STRINGS, "parsed_answer", "group_id", "step", "reward", "truncated",
                     "info")}
  parts = read_column(table, "reward_parts")
  p_off = parts.offsets.to_numpy()
  p_keys, p_vals = parts.keys.to_pylist(), parts.items.to_pylist()
  i_off, i_val, i_null = _ragged_numpy(read_column(table, "completion_ids"))
  l_off, l_val, l_null = _ragged_numpy(read_column(table, "logprobs"))
  out = []
  for r in range(n):
    a, b = p_off[r], p_off[r + 1]
    info = py["info"][r]
    out.append(Episode(
        episode_id=py["episode_id"][r], group_id=py["group_id"][r], task_id=py["task_id"][r],
        prompt=py["prompt"][r], completion=py["completion"][r], answer=py["answer"][r],
        reward_parts=dict(zip(p_keys[a:b], p_vals[a:b])), reward=py["reward"][r],
        parsed_answer=py["parsed_answer"][r],
        info=None if info is None else {} if info == "{}" else json.loads(info),
        version=py["version"][r], step=py["step"][r], split=py["split"][r],
        completion_ids=None if i_null[r] else i_val[i_off[r]:i_off[r + 1]],
        logprobs=None if l_null[r] else l_val[l_off[r]:l_off[r + 1]],
        truncated=py["truncated"][r]))
  return out


def _padded(arr: pa.Array, width: int, dtype: np.dtype) -> np.ndarray:
  """A list column → [B, width] right-padded with zeros (null rows are all zeros)."""
  offsets, values, _ = _ragged_numpy(arr)
  lengths = np.diff(offsets)
  out = np.zeros((len(lengths), width), dtype)
  rows = np.repeat(np.arange(len(lengths)), lengths)
  cols = np.arange(lengths.sum()) - np.repeat(offsets[:-1] - offsets[0], lengths)
  out[rows, cols] = values[offsets[0]:offsets[-1]]
  return out


def table_to_columns(table: pa.Table) -> dict[str, np.ndarray]:
  """Columns for vectorized replay: no per-row Python objects except the text columns.

  Returns:
    the `Episode` text fields as object arrays [B] (`info` as JSON text), `group_id`,
    `step` int64 [B], `reward` float64 [B], `truncated` bool [B], `length` int32 [B]
    (completion tokens, 0 when None), `completion_ids` int32 [B, N] and `logprobs`
    float32 [B, N] right-padded with 0, `advantage` float64 [B] (NaN where not recorded),
    `kept` int8 [B] (1 kept, 0 cut, -1 not recorded), and `reward_parts/<name>` float64 [B]
    for every part name seen (NaN where a row lacks the part).
  """
  cols: dict[str, np.ndarray] = {}
  for name in (*_STRINGS, "parsed_answer", "info"):
    cols[name] = np.asarray(read_column(table, name).to_pylist() if table.num_rows else [],
                            dtype=object)
  for name, dtype in (("group_id", np.int64), ("step", np.int64), ("reward", np.float64),
                      ("truncated", bool)):
    cols[name] = np.asarray(read_column(table, name).to_numpy(zero_copy_only=False), dtype)
  adv = read_column(table, "advantage").fill_null(np.nan)
  cols["advantage"] = np.asarray(adv.to_numpy(zero_copy_only=False), np.float64)
  kept = read_column(table, "kept").cast(pa.int8()).fill_null(-1)
  cols["kept"] = np.asarray(kept.to_numpy(zero_copy_only=False), np.int8)
  ids, lps = read_column(table, "completion_ids"), read_column(table, "logprobs")
  lengths = np.diff(ids.offsets.to_numpy()).astype(np.int32)
  width = int(max(lengths.max(initial=0), np.diff(lps.offsets.to_numpy()).max(initial=0)))
  cols["length"] = lengths
  cols["completion_ids"] = _padded(ids, width, np.int32)
  cols["logprobs"] = _padded(lps, width, np.float32)
  parts = read_column(table, "reward_parts")
  p_off = parts.offsets.to_numpy()
  rows = np.repeat(np.arange(table.num_rows), np.diff(p_off))
  keys = parts.keys.slice(p_off[0], p_off[-1] - p_off[0]).dictionary_encode()
  vals = np.asarray(parts.items.slice(p_off[0], p_off[-1] - p_off[0]).fill_null(np.nan)
                    .to_numpy(zero_copy_only=False), np.float64)
  codes = keys.indices.to_numpy(zero_copy_only=False)
  for k, name in enumerate(keys.dictionary.to_pylist()):
    col = np.full(table.num_rows, np.nan)
    sel = codes == k
    col[rows[sel]] = vals[sel]
    cols[f"reward_parts/{name}"] = col
  return cols


__all__ = ["SCHEMA", "episodes_to_table", "read_column", "table_to_columns",
           "table_to_episodes", "to_json"]
