"""Progress of an evolution run on the terminal: one bar over the branch trainings (the
root included; ETA from the trainings so far; only on a terminal) and one line per event (generation start,
proposals, each training's result, each verdict, harness changes)."""

from __future__ import annotations

import sys
from typing import Optional

import tqdm

from evotrainer.console import is_terminal


class Progress:
  """A tqdm bar over `total` trainings, `done` of them finished before (a resume).

  Args:
    total: trainings the run will do (1 + generations x branches).
    done: trainings already finished.
    enabled: False prints nothing (library use, tests).
  """

  def __init__(self, total: int, done: int = 0, enabled: bool = True):
    self.enabled = enabled
    self.bar: Optional[tqdm.tqdm] = None
    self.restart(total, done, enabled)

  def restart(self, total: int, done: int = 0, enabled: bool = True) -> None:
    """Starts over: a new bar over `total` trainings, `done` of them finished before."""
    self.close()
    self.enabled = enabled
    if enabled and is_terminal():  # a log file gets the event lines only
      self.bar = tqdm.tqdm(total=total, initial=min(done, total), desc="evolve",
                           unit="branch", file=sys.stderr, dynamic_ncols=True)

  def say(self, message: str) -> None:
    """One line above the bar."""
    if self.enabled:
      tqdm.tqdm.write(f"[evolve] {message}", file=sys.stdout)
      sys.stdout.flush()

  def training(self, version: str, what: str) -> None:
    if self.bar is not None:
      self.bar.set_description(f"evolve: training {version}")
    self.say(f"training {version}: {what}")

  def trained(self, version: str, message: str) -> None:
    if self.bar is not None:
      self.bar.update(1)
      self.bar.set_description("evolve")
    self.say(f"{version} {message}")

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
      self.bar = None


__all__ = ["Progress"]
