"""Progress on the console: a tqdm bar on a terminal, plain lines otherwise.

A log file (a branch's `branch.log`, a redirected run) gets no carriage-return bar
fragments: `progress_bar` returns a `LineProgress` there, which prints one line every
`every` updates or `every_s` seconds (whichever comes first) and at the end.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO

import tqdm


def is_terminal(stream: Optional[TextIO] = None) -> bool:
  stream = stream or sys.stderr
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


class LineProgress:
  """The part of tqdm's interface the trainers use, as plain lines on `file`."""

  def __init__(self, total: Optional[int] = None, initial: int = 0, desc: str = "",
               unit: str = "step", every: int = 10, every_s: float = 60.0,
               file: Optional[TextIO] = None, disable: bool = False, **_: Any):
    self.total, self.n, self.desc, self.unit = total, initial, desc, unit
    self.every, self.every_s, self.disable = max(1, every), every_s, disable
    self.file = file or sys.stdout
    self._postfix = ""
    self._t0 = self._last_t = time.time()
    self._last_n = initial

  def _line(self) -> None:
    rate = (self.n - self._last_n) / max(time.time() - self._last_t, 1e-9)
    of = f"/{self.total}" if self.total is not None else ""
    print(f"[{self.desc}] {self.n}{of} {self.unit}s, {time.time() - self._t0:.0f}s, "
          f"{rate:.2f} {self.unit}/s" + (f", {self._postfix}" if self._postfix else ""),
          file=self.file, flush=True)
    self._last_t, self._last_n = time.time(), self.n

  def update(self, n: int = 1) -> None:
    self.n += n
    if self.disable:
      return
    if self.n - self._last_n >= self.every or time.time() - self._last_t >= self.every_s:
      self._line()

  def set_postfix(self, **kw: Any) -> None:
    self._postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

  def set_description(self, desc: str) -> None:
    self.desc = desc

  def write(self, message: str, file: Optional[TextIO] = None) -> None:
    print(message, file=file or self.file, flush=True)

  def close(self) -> None:
    if not self.disable and self.n != self._last_n:
      self._line()
    self.disable = True


def progress_bar(total: Optional[int] = None, *, every: int = 10, every_s: float = 60.0,
                 **kw: Any):
  """A tqdm bar when stderr is a terminal, else a LineProgress (same calls)."""
  if is_terminal(kw.get("file")):
    return tqdm.tqdm(total=total, **kw)
  return LineProgress(total=total, every=every, every_s=every_s, **kw)


__all__ = ["LineProgress", "is_terminal", "progress_bar"]
