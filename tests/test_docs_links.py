"""The README and docs/ stay a map that resolves: every relative link names an existing
file (and, with `#anchor`, an existing heading of it), the README stays short, and no
code or config file points at a document outside the repository."""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
OUTSIDE_DOCS = ("METHOD.md", "DESIGN.md", "DOMAINS.md", "STACK.md", "STYLE.md")
CODE_DIRS = ("evotrainer", "gin", "bench", "launch", "third_party", "tests")
CODE_SUFFIXES = {".py", ".gin", ".sh", ".md", ".json", ".txt", ".cfg", ".toml", ".ini"}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_INLINE_CODE = re.compile(r"(`+).*?\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def markdown_files() -> list[pathlib.Path]:
  """README.md, every page under docs/, and the READMEs of launch/ and third_party/."""
  files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
  files += [p for p in (REPO / "launch" / "README.md", REPO / "third_party" / "README.md")
            if p.exists()]
  return files


def prose_lines(text: str, keep_code: bool = False) -> list[tuple[int, str]]:
  """(line number, line) outside fenced code blocks; inline code spans removed unless
  `keep_code` (a heading's anchor keeps their text)."""
  lines, fence = [], ""  # the open fence's marker, e.g. "````"
  for number, line in enumerate(text.splitlines(), start=1):
    m = _FENCE.match(line)
    if m and not fence:
      fence = m.group(1)
      continue
    closes = m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
    if closes and not m.group(2).strip():
      fence = ""
      continue
    if not fence:
      lines.append((number, line if keep_code else _INLINE_CODE.sub("", line)))
  return lines


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed,
  spaces to hyphens (`Remote workdirs (`gs://`)` -> `remote-workdirs-gs`)."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
  text = text.replace("`", "").strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
  """Every heading anchor of a markdown file, with GitHub's -1, -2 for repeats."""
  seen: dict[str, int] = {}
  found = set()
  for _, line in prose_lines(path.read_text(), keep_code=True):
    m = _HEADING.match(line)
    if not m:
      continue
    base = slug(m.group(2))
    count = seen.get(base, 0)
    seen[base] = count + 1
    found.add(base if count == 0 else f"{base}-{count}")
  return found


def broken_links(path: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  """`file:line: target (why)` for each relative link of `path` that does not resolve
  (`file` relative to `root`)."""
  problems = []
  for number, line in prose_lines(path.read_text()):
    for target in _LINK.findall(line):
      if _EXTERNAL.match(target):
        continue
      file_part, _, anchor = target.partition("#")
      dest = (path.parent / file_part).resolve() if file_part else path
      where = f"{path.relative_to(root)}:{number}: {target}"
      if not dest.exists():
        problems.append(f"{where} (no such file)")
      elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        problems.append(f"{where} (no heading with anchor #{anchor})")
  return problems


def test_slug_matches_github_anchors():
  assert slug("Remote workdirs (`gs://`)") == "remote-workdirs-gs"
  assert slug("5. Backtest") == "5-backtest"
  assert slug("Code, 5 seeds, all three arms on one install") == (
      "code-5-seeds-all-three-arms-on-one-install")
  assert slug("Multi-host `train`") == "multi-host-train"


def test_checker_reports_a_broken_link_and_a_broken_anchor(tmp_path):
  (tmp_path / "there.md").write_text("# A heading\n")
  page = tmp_path / "page.md"
  page.write_text("[ok](there.md) [ok](there.md#a-heading) [web](https://example.com)\n"
                  "`[in code](missing.md)`\n````\n```x\n[fenced](missing.md)\n```\n````\n"
                  "[gone](missing.md) [bad anchor](there.md#nope) [self](#nowhere)\n")
  assert broken_links(page, root=tmp_path) == [
      "page.md:8: missing.md (no such file)",
      "page.md:8: there.md#nope (no heading with anchor #nope)",
      "page.md:8: #nowhere (no heading with anchor #nowhere)",
  ]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path):
  assert broken_links(path) == []


def test_readme_is_a_short_map():
  lines = (REPO / "README.md").read_text().splitlines()
  assert len(lines) <= README_MAX_LINES, (
      f"README.md has {len(lines)} lines; keep it <= {README_MAX_LINES} and move detail "
      f"into docs/")


def test_docs_index_links_every_page():
  index = (REPO / "docs" / "README.md").read_text()
  pages = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md"))
  missing = [p for p in pages if p != "README.md" and f"({p})" not in index]
  assert missing == []


def test_code_points_only_into_the_repository():
  this = pathlib.Path(__file__).resolve()
  hits = []
  paths = [REPO / "setup.py"]
  for d in CODE_DIRS:
    paths += [p for p in (REPO / d).rglob("*") if p.suffix in CODE_SUFFIXES]
  for p in paths:
    if p.resolve() == this or not p.is_file():
      continue
    for number, line in enumerate(p.read_text(errors="replace").splitlines(), start=1):
      if any(name in line for name in OUTSIDE_DOCS):
        hits.append(f"{p.relative_to(REPO)}:{number}: {line.strip()}")
  assert hits == [], "point these at docs/ instead:\n" + "\n".join(hits)
