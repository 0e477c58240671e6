"""A task's problems materialized into a versioned TFDS dataset, read back by random access.

Generators are cheap, but a run that trains for days wants its prompts fixed on disk: one
dataset a run and its restarts (and other runs, and other hosts) read identically,
whose held-out split can be inspected, and whose train split can be walked epoch by
epoch. This module has three parts:

  materialize(task, data_dir, num_train, seed)   writes `train` (`task.train_problems(
      num_train, seed)`) and `heldout` (`task.heldout_problems()`) as a TFDS dataset in
      array_record files, once: a later call with the same task config finds it and
      returns its path without generating anything.
  ProblemSource(path, split)   random access over one split (`tfds.data_source`), as
      `Problem` records, plus a resumable epoch-shuffled stream of them.
  DatasetTask(task, data_dir, num_train)   a gin-configurable task that serves
      `train_problems` from that stream and delegates everything else to `task`.

Why array_record: TFDS reads it through `tfds.data_source` without TensorFlow (tfrecord,
`as_dataset` and `as_numpy` need TensorFlow, which this project does not install), and it
gives O(1) random access, which is what makes the stream resumable at any position.

Dataset layout: `<data_dir>/problem_dataset/<config name>/<version>/`. The version is the
schema version of the records below (bumped when the features change; TFDS wants an
ordered `x.y.z`, which a hash is not). The config name carries the content hash: it is
`<task class>_n<num_train>_s<seed>_<12 hex digits>` where the digits hash the task's
configuration (its public attributes that are plain data, minus those that only shape
prompts or scoring, `PRESENTATION_FIELDS`), its class, `num_train`, `seed`, and a digest
of the problems themselves (the whole held-out split and the first `_PROBE` training
problems), so a change in a generator's code shows up as a new dataset as well. A
changed JSONL row that is in neither is not detected: delete the dataset directory after
editing a training file in place. The full description is stored in the dataset's
`metadata.json` (`ProblemSource.config`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from typing import Any, Iterator, Optional, Sequence

import gin
import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from evotrainer.tasks.base import Problem, check_disjoint

__all__ = ["materialize", "dataset_config", "ProblemDataset", "ProblemSource", "DatasetTask",
           "SPLITS", "SCHEMA_VERSION", "PRESENTATION_FIELDS"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1.0.0"
SPLITS = ("train", "heldout")
# Task attributes that change how a problem is shown or scored, never which problems
# there are; two tasks differing only in these share a dataset.
PRESENTATION_FIELDS = frozenset({"prompt_template", "answer_methods", "format_methods"})
_PROBE = 16  # training problems hashed into the config name
_LOG_EVERY, _LOG_MIN = 10, 10_000  # progress lines per split, problems between lines


# ------------------------------------------------------------------ records <-> examples


def _features() -> tfds.features.FeaturesDict:
  text = tfds.features.Text
  return tfds.features.FeaturesDict({
      "id": text(doc="Problem.id, unique within the task"),
      "prompt": text(doc="the question alone (Task.format_prompt adds instructions)"),
      "answer": text(doc="gold answer"),
      "solution": text(doc="worked solution ending in the formatted answer"),
      "source": text(doc="generator or file the problem came from"),
      "difficulty": tfds.features.Scalar(dtype=np.int32, doc="difficulty level, 0 unknown"),
      "meta": text(doc="Problem.meta as a JSON object"),
  })


def _encode(problem: Problem) -> dict[str, Any]:
  """A `Problem` as a TFDS example; raises ValueError if its meta is not JSON data."""
  try:
    meta = json.dumps(dict(problem.meta), sort_keys=True, ensure_ascii=False)
  except (TypeError, ValueError) as e:
    raise ValueError(f"problem {problem.id!r}: meta must be JSON-serializable to be "
                     f"stored in a dataset ({e}); got {dict(problem.meta)!r:.200}") from None
  return {"id": problem.id, "prompt": problem.prompt, "answer": problem.answer,
          "solution": problem.solution, "source": problem.source,
          "difficulty": int(problem.difficulty), "meta": meta}


def _decode(example: dict[str, Any]) -> Problem:
  """A decoded TFDS example (text as bytes) back into a `Problem`."""
  text = lambda k: example[k].decode("utf-8")  # noqa: E731
  return Problem(id=text("id"), prompt=text("prompt"), answer=text("answer"),
                 solution=text("solution"), source=text("source"),
                 difficulty=int(example["difficulty"]), meta=json.loads(text("meta")))


# ------------------------------------------------------------------ config and its hash


def _digest(problems: Sequence[Problem]) -> str:
  h = hashlib.sha256()
  for p in problems:
    h.update(json.dumps(_encode(p), sort_keys=True, ensure_ascii=False).encode())
    h.update(b"\n")
  return h.hexdigest()


def _plain_data(value: Any) -> bool:
  try:
    json.dumps(value, sort_keys=True)
    return True
  except (TypeError, ValueError):
    return False


def dataset_config(task: Any, num_train: int, seed: int) -> dict[str, Any]:
  """What identifies the dataset of (`task`, `num_train`, `seed`), and its hash.

  Generates the held-out split and `_PROBE` training problems (the task caches the
  held-out split, so a later `heldout_problems()` call costs nothing).

  Returns:
    A JSON-serializable dict: `task` (module.class), `task_config` (public plain-data
    attributes minus `PRESENTATION_FIELDS`), `num_train`, `seed`, `heldout_digest`,
    `train_probe_digest`, `num_heldout`, and `hash`, the sha256 of all of them.
  """
  cls = type(task)
  config = {
      "task": f"{cls.__module__}.{cls.__qualname__}",
      "task_config": {k: v for k, v in sorted(vars(task).items())
                      if not k.startswith("_") and k not in PRESENTATION_FIELDS
                      and _plain_data(v)},
      "num_train": num_train,
      "seed": seed,
  }
  heldout = task.heldout_problems()
  config["num_heldout"] = len(heldout)
  config["heldout_digest"] = _digest(heldout)
  config["train_probe_digest"] = _digest(task.train_problems(min(num_train, _PROBE), seed))
  config["hash"] = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
  return config


def _config_name(config: dict[str, Any]) -> str:
  cls = config["task"].rsplit(".", 1)[-1].lower()
  return f"{cls}_n{config['num_train']}_s{config['seed']}_{config['hash'][:12]}"


# ------------------------------------------------------------------ the builder


class ProblemDataset(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """TFDS builder of one task's problems: splits `train` and `heldout`, in task order.

  Built by `materialize`; readers never need this class (`tfds.data_source` reads the
  files), which is why it is not registered with TFDS. Shuffling on write is disabled:
  example `i` of a split is the `i`-th problem the task returned.
  """

  VERSION = tfds.core.Version(SCHEMA_VERSION)
  RELEASE_NOTES = {"1.0.0": "id, prompt, answer, solution, source, difficulty, meta (JSON)."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:  # pylint: disable=invalid-overridden-method
    # No code directory, as for a builder defined in a notebook: TFDS would look there
    # for checksums and metadata files we do not have, and its package lookup needs
    # `importlib_resources`, which TFDS does not declare as a dependency.
    return None

  def __init__(self, *, task: Any, num_train: int, seed: int, config: dict[str, Any],
               **kwargs: Any):
    self._task, self._num_train, self._seed, self._config = task, num_train, seed, config
    builder_config = tfds.core.BuilderConfig(
        name=_config_name(config), version=SCHEMA_VERSION,
        description=f"{config['task']}: {num_train} train problems (seed {seed}) and "
                    f"{config['num_heldout']} held-out; config hash {config['hash']}")
    self._builder_config_made = builder_config
    super().__init__(config=builder_config, file_format="array_record", **kwargs)

  def get_builder_config(self, name: str, version: Any = None) -> Optional[Any]:
    """The one config, made per task; TFDS otherwise warns it is a 'custom' config."""
    del version  # one version per config
    made = self._builder_config_made
    return made if name == made.name else None

  def _info(self) -> tfds.core.DatasetInfo:
    # Built directly: `dataset_info_from_configs` looks for metadata files in a package.
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__.split("\n", 1)[0], features=_features(),
        disable_shuffling=True, metadata=tfds.core.MetadataDict(config=self._config))

  def _split_generators(self, dl_manager):  # pylint: disable=unused-argument
    t0 = time.perf_counter()
    train = self._task.train_problems(self._num_train, self._seed)
    heldout = self._task.heldout_problems()
    log.info("generated %d train and %d held-out problems in %.1f s", len(train),
             len(heldout), time.perf_counter() - t0)
    if len(train) != self._num_train:
      raise RuntimeError(f"{self._config['task']}.train_problems({self._num_train}, "
                         f"{self._seed}) returned {len(train)} problems")
    check_disjoint(train, heldout)
    return {"train": self._generate_examples(train, "train"),
            "heldout": self._generate_examples(heldout, "heldout")}

  def _generate_examples(self, problems: Sequence[Problem], split: str):
    every = max(_LOG_MIN, len(problems) // _LOG_EVERY)
    for i, p in enumerate(problems):
      if i % every == 0 and i:
        log.info("%s: wrote %d / %d problems", split, i, len(problems))
      yield i, _encode(p)  # integer keys: with shuffling off, files keep this order


def materialize(task: Any, data_dir: str | os.PathLike, num_train: int,
                seed: int = 0) -> epath.Path:
  """Writes the task's problems as a TFDS dataset under `data_dir` unless already there.

  Args:
    task: a `Task` (e.g. `MathTask`).
    data_dir: TFDS root directory (local or any path `etils.epath` opens, e.g. gs://).
    num_train: size of the `train` split, `task.train_problems(num_train, seed)`.
    seed: the generation seed of the train split.

  Returns:
    The dataset directory `<data_dir>/problem_dataset/<config>/<version>`, for
    `ProblemSource`.

  Idempotent: the config name hashes the task config (module docstring), so a second
  call finds the finished directory and writes nothing. TFDS writes into a temporary
  directory and renames it when done, so an interrupted build is simply redone. On
  several hosts, materialize on one first (or give each host its own `data_dir`).
  """
  if num_train < 1:
    raise ValueError(f"materialize: num_train must be >= 1, got {num_train}")
  if seed < 0:
    raise ValueError(f"materialize: seed must be >= 0, got {seed}")
  config = dataset_config(task, num_train, seed)
  builder = ProblemDataset(task=task, num_train=num_train, seed=seed, config=config,
                           data_dir=os.fspath(data_dir))
  if builder.is_prepared():
    log.info("problem dataset %s already materialized; reusing it", builder.data_path)
    return builder.data_path
  log.info("materializing %d train + %d held-out problems of %s into %s", num_train,
           config["num_heldout"], config["task"], builder.data_path)
  t0 = time.perf_counter()
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  log.info("materialized %s in %.1f s", builder.data_path, time.perf_counter() - t0)
  return builder.data_path


# ------------------------------------------------------------------ the reader


class ProblemSource:
  """Random access to one split of a materialized dataset, as `Problem` records.

  The stream: position `q` (the number of problems consumed before it) is problem
  `perm(seed, epoch)[q % len]` with `epoch = q // len`, where `perm(seed, epoch)` is a
  permutation drawn from `SeedSequence([seed, epoch])`. Every epoch visits each problem
  once, and a reader restored at position `q` continues with exactly the problems an
  uninterrupted reader would have seen: the position is the whole resume state.

  Args:
    path: a dataset directory returned by `materialize`.
    split: "train" or "heldout".
  """

  def __init__(self, path: str | os.PathLike, split: str):
    path = epath.Path(path)
    if not (path / "dataset_info.json").exists():
      raise FileNotFoundError(
          f"{path} is not a materialized problem dataset (expected <data_dir>/"
          f"problem_dataset/<config>/<version>/dataset_info.json); build it with "
          f"evotrainer.tasks.datasets.materialize(...)")
    if split not in SPLITS:
      raise ValueError(f"ProblemSource: split must be one of {SPLITS}, got {split!r}")
    self.path, self.split = path, split
    name = f"{path.parent.parent.name}/{path.parent.name}:{path.name}"
    self._source = tfds.data_source(name, split=split, data_dir=path.parent.parent.parent,
                                    download=False)
    self._perms: dict[tuple[int, int], np.ndarray] = {}

  @property
  def config(self) -> dict[str, Any]:
    """The `dataset_config` the dataset was built from (task, num_train, seed, hash)."""
    return json.loads((self.path / "metadata.json").read_text())["config"]

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> Problem:
    n = len(self)
    if not -n <= index < n:
      raise IndexError(f"{self.split} has {n} problems; index {index} is out of range")
    return _decode(self._source[index % n])

  def __iter__(self) -> Iterator[Problem]:
    """The split in stored order (the order the task generated it)."""
    for i in range(len(self)):
      yield self[i]

  def _read(self, indices: np.ndarray) -> list[Problem]:  # indices: [K]
    return [_decode(e) for e in self._source.__getitems__([int(i) for i in indices])]

  def epoch_order(self, seed: int, epoch: int) -> np.ndarray:  # [len]
    """The permutation of the split that epoch `epoch` of stream `seed` visits."""
    key = (seed, epoch)
    if key not in self._perms:
      if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
      if len(self._perms) >= 2:  # readers move forward: keep this epoch and the next
        self._perms.pop(next(iter(self._perms)))
      rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
      self._perms[key] = rng.permutation(len(self))
    return self._perms[key]

  def problems_at(self, start_position: int, count: int, seed: int) -> list[Problem]:
    """Stream positions `[start_position, start_position + count)` of stream `seed`."""
    if start_position < 0 or count < 0:
      raise ValueError(f"start_position and count must be >= 0, got {start_position}, "
                       f"{count}")
    n, out, q, end = len(self), [], start_position, start_position + count
    while q < end:
      epoch, i = divmod(q, n)
      take = min(n - i, end - q)
      out += self._read(self.epoch_order(seed, epoch)[i:i + take])
      q += take
    return out

  def batches(self, batch_size: int, seed: int,
              start_position: int = 0) -> Iterator[list[Problem]]:
    """Endless batches of the stream from `start_position`; batches span epoch ends.

    After `k` batches the position is `start_position + k * batch_size`; save that to
    resume.
    """
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    q = start_position
    while True:
      yield self.problems_at(q, batch_size, seed)
      q += batch_size


# ------------------------------------------------------------------ the task


@gin.configurable(module="tasks")
class DatasetTask:
  """A task whose training problems come from its materialized dataset.

  Materializes `task` on construction (a no-op when the dataset exists), then serves
  `train_problems(n, seed)` as stream positions `[seed * n, (seed + 1) * n)` of the
  train split's stream shuffled with `seed` of this class (`ProblemSource`). With a
  fixed `n`, consecutive seeds read consecutive windows, so a trainer asking for
  `train_problems(n, data_seed(seed, step))` (train.py) walks the dataset epoch by epoch
  and sees each problem once per epoch, and resuming at a step resumes the data.
  `heldout_problems`, `format_prompt`, `score`, `score_many` and `close` are the
  wrapped task's.

      tasks.DatasetTask.task = @tasks.MathTask()
      tasks.DatasetTask.data_dir = "/data/evotrainer"
      tasks.DatasetTask.num_train = 100000
      run.task = @tasks.DatasetTask()

  Args:
    task: the task to materialize and to delegate to.
    data_dir: TFDS root directory.
    num_train: size of the stored train split.
    seed: generation seed of the train split, and the stream's shuffle seed.
  """

  def __init__(self, task: Any, data_dir: str | os.PathLike, num_train: int, seed: int = 0):
    self.task, self.num_train, self.seed = task, num_train, seed
    self.path = materialize(task, data_dir, num_train, seed)
    self.train = ProblemSource(self.path, "train")

  def train_problems(self, n: int, seed: int) -> list[Problem]:
    """Stream positions `[seed * n, (seed + 1) * n)`; deterministic, never held-out."""
    if n < 0 or seed < 0:
      raise ValueError(f"DatasetTask.train_problems: n and seed must be >= 0, got "
                       f"n={n}, seed={seed}")
    return self.train.problems_at(seed * n, n, self.seed)

  def heldout_problems(self, n: Optional[int] = None,
                       split: str = "validation") -> list[Problem]:
    return self.task.heldout_problems(n, split=split)

  def format_prompt(self, problem: Problem) -> str:
    return self.task.format_prompt(problem)

  def score(self, problem: Problem, completion: str) -> dict[str, float]:
    return self.task.score(problem, completion)

  def score_many(self, problems: Sequence[Problem],
                 completions: Sequence[str]) -> list[dict[str, float]]:
    return self.task.score_many(problems, completions)

  def close(self) -> None:
    if hasattr(self.task, "close"):
      self.task.close()

  def __enter__(self) -> "DatasetTask":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
