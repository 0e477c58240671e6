"""What would have worked: the hints a tool's error observation carries (tools.py).

  missed_search  for a `search_replace` text that is not in the file: the lines it
                 matches once whitespace is ignored, else the file's closest lines
                 (`closest_windows`: difflib on whitespace-collapsed lines)
  occurrences    for an ambiguous one: the lines its occurrences start at
  close_paths    for a path that does not exist: the repository's nearest paths

Hints only point: the tools stay exact about what they change. Each bounds the work it
does on model text and what it prints (the observation cap applies after).
"""

from __future__ import annotations

import bisect
import difflib
import re
from typing import Sequence

MAX_SEARCH_CHARS = 2000   # a longer search text is compared by its start only
MAX_SCAN_LINES = 5000     # lines of a file compared with a missed search text
ANCHORS = 20              # windows scored whole, placed by the lines nearest the anchor
WINDOW_LINES = 6          # lines of a window compared and shown at most
MAX_LINE_CHARS = 160      # a shown line is cut here
NEAR_WINDOWS = 3          # closest windows shown
CUTOFF = 0.6              # the difflib ratio a near miss needs (get_close_matches')
MARGIN = 0.1              # a near miss shown is within this ratio of the nearest one
MAX_PATH_CHARS = 300      # a longer missing path gets no suggestions
CLOSE_PATHS = 5           # paths suggested at most
SHOWN_LINES = 10          # occurrence line numbers listed at most
NUMBERED = re.compile(r"^ *\d+\| ?", re.M)  # read_file's line prefix, "    5| "


def _squash(line: str) -> str:
  return " ".join(line.split())


def _shown(lines: Sequence[str], first: int, last: int) -> list[str]:
  """Lines `first..last` (1-based) under a "line N:" / "lines N-M:" header, as they are
  in the file (no number prefix: the text to copy), each cut, at most WINDOW_LINES."""
  head = f"line {first}:" if first == last else f"lines {first}-{last}:"
  return [head] + [line[:MAX_LINE_CHARS] for line in lines[first - 1:last][:WINDOW_LINES]]


def spaceless_matches(text: str, search: str) -> list[tuple[int, int]]:
  """(first, last) 1-based lines of each place `search` occurs in `text` once all
  whitespace is removed from both (at most NEAR_WINDOWS places)."""
  needle = "".join(search.split())
  if not needle:
    return []
  ends, total = [], 0
  parts = []
  for line in text.splitlines():
    part = "".join(line.split())
    parts.append(part)
    total += len(part)
    ends.append(total)
  hay, found = "".join(parts), []
  at = hay.find(needle)
  while at != -1 and len(found) < NEAR_WINDOWS:
    found.append((bisect.bisect_right(ends, at) + 1,
                  bisect.bisect_right(ends, at + len(needle) - 1) + 1))
    at = hay.find(needle, at + len(needle))
  return found


def _ratio(matcher: difflib.SequenceMatcher, text: str) -> float:
  """difflib's ratio of `text` to the matcher's second sequence; 0 below CUTOFF."""
  matcher.set_seq1(text)
  if matcher.real_quick_ratio() < CUTOFF or matcher.quick_ratio() < CUTOFF:
    return 0.0
  ratio = matcher.ratio()
  return ratio if ratio >= CUTOFF else 0.0


def closest_windows(text: str, search: str) -> list[tuple[int, int]]:
  """(first, last) 1-based lines of the windows of `text` nearest `search`, best first.

  Lines are compared whitespace-collapsed. The search text's longest line is the
  anchor: the ANCHORS file lines nearest it (a difflib ratio >= CUTOFF) place windows of
  as many lines as the search text has non-blank ones (at most WINDOW_LINES), each
  scored against the search text; shown: ratio >= CUTOFF and within MARGIN of the best,
  non-overlapping, at most NEAR_WINDOWS. The work is bounded by MAX_SCAN_LINES short
  comparisons and ANCHORS window ones."""
  wanted = [_squash(line)[:MAX_LINE_CHARS]
            for line in search[:MAX_SEARCH_CHARS].splitlines()]
  wanted = [line for line in wanted if line][:WINDOW_LINES]
  squashed = [_squash(line)[:MAX_LINE_CHARS]
              for line in text.splitlines()[:MAX_SCAN_LINES]]
  if not wanted or not squashed:
    return []
  k = min(len(wanted), len(squashed))
  offset = max(range(len(wanted)), key=lambda j: len(wanted[j]))
  anchor = difflib.SequenceMatcher(autojunk=False, b=wanted[offset])
  near = sorted((-r, i) for i, line in enumerate(squashed) if (r := _ratio(anchor, line)))
  whole = difflib.SequenceMatcher(autojunk=False, b="\n".join(wanted))
  scored = set()
  for _, i in near[:ANCHORS]:
    first = min(max(i - offset, 0), len(squashed) - k)
    ratio = _ratio(whole, "\n".join(squashed[first:first + k]))
    if ratio:
      scored.add((-ratio, first))
  ranked = sorted(scored)
  picked: list[int] = []
  for ratio, first in ranked:
    if ratio > ranked[0][0] + MARGIN or len(picked) == NEAR_WINDOWS:
      break
    if all(abs(first - j) >= k for j in picked):
      picked.append(first)
  return [(first + 1, first + k) for first in picked]


def missed_search(text: str, search: str) -> str:
  """The hint for a search text that is not in `text` ("" when nothing is near)."""
  notes = []
  if NUMBERED.search(search):
    search = NUMBERED.sub("", search)
    notes.append("the search text holds read_file's line-number prefixes (like "
                 "'    5| '); search the file's own text")
  windows = spaceless_matches(text, search)
  if windows:
    notes.append("it matches once whitespace is ignored; the file's exact text there "
                 "(spaces and indentation must match):")
  else:
    windows = closest_windows(text, search)
    if windows:
      notes.append("the closest lines in the file; search for their exact text:")
  lines = text.splitlines()
  for first, last in windows:
    notes += _shown(lines, first, last)
  return "\n".join(notes)


def occurrences(text: str, search: str) -> str:
  """"lines a, b, ..." where the occurrences of `search` in `text` start."""
  starts, at = [], text.find(search)
  while at != -1 and len(starts) < SHOWN_LINES:
    starts.append(text.count("\n", 0, at) + 1)
    at = text.find(search, at + len(search))
  more = ", ..." if at != -1 else ""
  return "lines " + ", ".join(map(str, starts)) + more


def close_paths(path: str, candidates: Sequence[str]) -> list[str]:
  """The candidates nearest `path` (folders end with "/"): the ones with its file name
  first, then difflib's close matches; at most CLOSE_PATHS."""
  want = path.strip().strip("/")
  if not want or len(want) > MAX_PATH_CHARS:
    return []
  name = want.rsplit("/", 1)[-1]
  same = [c for c in candidates if c.rstrip("/").rsplit("/", 1)[-1] == name]
  close = difflib.get_close_matches(want, candidates, CLOSE_PATHS, CUTOFF)
  return list(dict.fromkeys(same + close))[:CLOSE_PATHS]
