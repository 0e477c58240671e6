"""Held-out figures split by issue level."""

import numpy as np

from evotrainer.eval.heldout import by_level
from evotrainer.tasks.base import Problem


def _problem(i, level):
  meta = {} if level is None else {"level": level}
  return Problem(id=f"p{i}", prompt="", answer="", solution="", source="s", meta=meta)


def test_figures_per_level_by_hand():
  problems = [_problem(0, 0), _problem(1, 2), _problem(2, 0), _problem(3, 2)]
  correct = np.array([[1, 1], [0, 0], [0, 1], [0, 1]], dtype=float)
  # Level 0: rows 0 and 2 -> mean of (1, 1, 0, 1) = 0.75; both rows pass -> 1.0.
  # Level 2: rows 1 and 3 -> mean of (0, 0, 0, 1) = 0.25; one row of two passes -> 0.5.
  assert by_level(problems, correct) == {"avg2_level0": 0.75, "pass2_level0": 1.0,
                                         "avg2_level2": 0.25, "pass2_level2": 0.5}


def test_one_level_or_unlabelled_problems_add_nothing():
  correct = np.ones((2, 3))
  assert by_level([_problem(0, 2), _problem(1, 2)], correct) == {}
  assert by_level([_problem(0, None), _problem(1, 2)], correct) == {}
