"""Materialized problem datasets: round trip, config hash, no rebuild, resumable stream."""

import collections
import itertools
import pathlib
import sys

import gin
import pytest

from evotrainer.tasks.base import Task, check_disjoint
from evotrainer.tasks.datasets import (DatasetTask, ProblemDataset, ProblemSource,
                                       materialize)
from evotrainer.tasks.math.task import MathTask

NUM_TRAIN, SEED = 30, 5


def _tiny(**kwargs) -> MathTask:
  return MathTask(sources=["tiny_arithmetic"], num_validation=20, **kwargs)


@pytest.fixture(scope="module")
def task():
  return _tiny()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="module")
def path(task, data_dir):
  return materialize(task, data_dir, NUM_TRAIN, SEED)


@pytest.fixture(scope="module")
def train(path):
  return ProblemSource(path, "train")


def test_reads_back_exactly_the_generated_problems(task, path, train):
  expected_train = task.train_problems(NUM_TRAIN, SEED)
  expected_held = task.heldout_problems()
  held = ProblemSource(path, "heldout")
  assert len(train) == NUM_TRAIN and len(held) == 20
  # Same order, every field (meta goes through JSON and comes back equal).
  assert [p.id for p in train] == [p.id for p in expected_train]
  assert [p.prompt for p in train] == [p.prompt for p in expected_train]
  assert [p.answer for p in train] == [p.answer for p in expected_train]
  assert list(train) == expected_train
  assert list(held) == expected_held
  assert train[-1] == expected_train[-1] and train[3] == expected_train[3]
  with pytest.raises(IndexError, match="30 problems"):
    train[NUM_TRAIN]  # pylint: disable=pointless-statement
  check_disjoint(list(train), list(held))  # raises if any prompt is in both
  assert train.config["num_train"] == NUM_TRAIN and train.config["seed"] == SEED


def test_config_hash_names_the_dataset(task, data_dir, path):
  assert path.name == "1.0.0" and path.parent.parent.name == "problem_dataset"
  assert path.parent.name.startswith(f"mathtask_n{NUM_TRAIN}_s{SEED}_")
  # Prompt presentation does not change the problems: same dataset.
  same = materialize(_tiny(prompt_template="Q: {question}"), data_dir, NUM_TRAIN, SEED)
  assert same == path
  # Problem content does: a different difficulty, held-out size, seed or size.
  others = [materialize(_tiny(difficulty=2), data_dir, NUM_TRAIN, SEED),
            materialize(MathTask(sources=["tiny_arithmetic"], num_validation=10), data_dir,
                        NUM_TRAIN, SEED),
            materialize(task, data_dir, NUM_TRAIN, SEED + 1),
            materialize(task, data_dir, NUM_TRAIN + 1, SEED)]
  assert len({path, *others}) == 5
  assert ProblemSource(others[0], "train")[0].difficulty == 2


def test_second_materialize_does_not_rebuild(path, data_dir, monkeypatch):
  files = lambda: {f: f.stat().st_mtime_ns for f in pathlib.Path(path).iterdir()}  # noqa: E731
  before = files()
  assert any("array_record" in f.name for f in before)

  def fail(*args, **kwargs):
    raise AssertionError("the dataset was generated again")

  monkeypatch.setattr(ProblemDataset, "_split_generators", fail)
  monkeypatch.setattr(ProblemDataset, "_generate_examples", fail)
  again = materialize(_tiny(), data_dir, NUM_TRAIN, SEED)  # a fresh task, same config
  assert again == path
  assert files() == before


def test_each_epoch_is_a_permutation(train):
  orders = [train.epoch_order(seed=1, epoch=e) for e in range(3)]
  for order in orders:
    assert sorted(order.tolist()) == list(range(NUM_TRAIN))
  assert orders[0].tolist() != orders[1].tolist()
  assert train.epoch_order(seed=2, epoch=0).tolist() != orders[0].tolist()
  # Two epochs of the stream hold every stored problem exactly twice.
  stream = train.problems_at(0, 2 * NUM_TRAIN, seed=1)
  assert collections.Counter(p.id for p in stream) == collections.Counter(
      p.id for p in list(train) * 2)
  assert stream[:NUM_TRAIN] == [train[int(i)] for i in orders[0]]


def test_resume_continues_the_same_sequence(path, train):
  batch, steps = 7, 12  # 84 problems: crosses two epoch boundaries of 30
  full = list(itertools.islice(train.batches(batch, seed=3), steps))
  flat = [p for b in full for p in b]
  assert all(len(b) == batch for b in full)
  # Restart in a fresh reader (as a restored process would) after 4 batches.
  restored = ProblemSource(path, "train")
  resumed = list(itertools.islice(restored.batches(batch, seed=3, start_position=4 * batch),
                                  steps - 4))
  assert resumed == full[4:]
  # Any position, not only batch boundaries.
  k = 17
  tail = [p for b in itertools.islice(restored.batches(batch, 3, start_position=k), 5)
          for p in b]
  assert tail == flat[k:k + 5 * batch]
  assert [p for b in itertools.islice(train.batches(batch, seed=4), 2) for p in b] != flat[:14]


def test_dataset_task_serves_the_stream(task, data_dir, path):
  dtask = DatasetTask(_tiny(), data_dir, NUM_TRAIN, seed=SEED)
  assert isinstance(dtask, Task) and dtask.path == path
  n = 8
  assert dtask.train_problems(n, seed=2) == dtask.train_problems(n, seed=2)
  # Consecutive seeds read consecutive windows of the stream shuffled by `seed`.
  windows = [p for s in range(6) for p in dtask.train_problems(n, seed=s)]
  assert windows == ProblemSource(path, "train").problems_at(0, 6 * n, seed=SEED)
  assert collections.Counter(p.id for p in windows[:NUM_TRAIN]) == collections.Counter(
      p.id for p in task.train_problems(NUM_TRAIN, SEED))
  assert dtask.heldout_problems(5) == task.heldout_problems(5)
  check_disjoint(windows, dtask.heldout_problems())
  p = windows[0]
  assert dtask.format_prompt(p) == task.format_prompt(p)
  dtask.close()


def test_gin_builds_dataset_task(data_dir, path):
  try:
    gin.parse_config(f"tasks.MathTask.sources = ['tiny_arithmetic']\n"
                     f"tasks.MathTask.num_validation = 20\n"
                     f"tasks.DatasetTask.task = @tasks.MathTask()\n"
                     f"tasks.DatasetTask.data_dir = '{data_dir}'\n"
                     f"tasks.DatasetTask.num_train = {NUM_TRAIN}\n"
                     f"tasks.DatasetTask.seed = {SEED}")
    assert DatasetTask().path == path
  finally:
    gin.clear_config()


def test_errors_name_the_problem(tmp_path, path):
  with pytest.raises(FileNotFoundError, match="materialize"):
    ProblemSource(tmp_path, "train")
  with pytest.raises(ValueError, match="split"):
    ProblemSource(path, "test")
  with pytest.raises(ValueError, match="num_train"):
    materialize(_tiny(), tmp_path, 0)


def test_tensorflow_is_never_imported(train):
  # TensorFlow is not installed here, so every test above ran without it; this pins
  # that tfds' array_record path does not even attempt the import.
  assert len(train.problems_at(0, 3, seed=0)) == 3
  assert "tensorflow" not in sys.modules
