"""What every run mode shares: its progress lines and its JSON files."""

from __future__ import annotations

import json

from evotrainer import paths


def say(msg: str = "") -> None:
  """Prints one progress line at once (a child's output is read as it comes)."""
  print(msg, flush=True)


def write_json(path, data: dict) -> None:
  paths.write_atomic(path, json.dumps(data, indent=2) + "\n")


def write_summary(workdir: str, summary: dict) -> None:
  write_json(paths.as_path(workdir) / "summary.json", summary)
