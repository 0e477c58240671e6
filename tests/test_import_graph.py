"""The evotrainer package's import graph has no cycle.

The graph is read from the source with `ast`, never by importing it. Its nodes are the
package's modules (`evotrainer/x/__init__.py` is module `evotrainer.x`); an edge A -> B
says A's code imports B. The rules:

- Every import statement counts, wherever it stands: at the top, inside a function, a
  method or a `try`. A function-level import is a cycle that waits for the call.
- Imports under `if TYPE_CHECKING:` never run and do not count.
- `import evotrainer.a.b` and `from evotrainer.a.b import f` are edges to `evotrainer.a.b`;
  `from evotrainer.a import b`, where `evotrainer/a/b.py` (or `b/__init__.py`) exists, is
  an edge to the submodule `evotrainer.a.b`, else (a name defined in `a/__init__.py`) to
  `evotrainer.a`. Relative imports are resolved against the importing module first.
- Importing `evotrainer.a.b` first runs the package `evotrainer.a` (its `__init__.py`), so
  the import is also an edge to each enclosing package that has an `__init__.py`, except
  the packages the importing module itself lies in: their `__init__` has already begun by
  the time any of their modules runs, so a child importing a sibling does not run it
  again. A child that names its package (`from evotrainer.a import X`) is an edge to
  the package's `__init__` like any other import.
- A module importing itself is no edge.
"""

from __future__ import annotations

import ast
import collections
import pathlib
from typing import Iterator

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1] / "evotrainer"

# (importing module, imported module) -> the first line of the importer that makes it.
Edges = dict[tuple[str, str], int]


def module_files(package_dir: pathlib.Path) -> dict[str, pathlib.Path]:
  """{dotted module name: its file} for every .py file under `package_dir`."""
  out = {}
  for path in sorted(package_dir.rglob("*.py")):
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
  """Every import statement in `tree`, function bodies included, but none under
  `if TYPE_CHECKING:` (its `else:` branch runs, so it is kept)."""
  stack = [tree]
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    elif isinstance(node, ast.If) and _is_type_checking(node.test):
      stack.extend(node.orelse)
    else:
      stack.extend(ast.iter_child_nodes(node))


def _imported(name: str, node: ast.Import | ast.ImportFrom, is_package: bool,
              modules: dict) -> list[str]:
  """The modules of the package that `node` (in module `name`) names."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  base = node.module or ""
  if node.level:  # relative: against the importer's package
    package = name.split(".") if is_package else name.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    base = ".".join(package + ([base] if base else []))
  subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
  return subs if len(subs) == len(node.names) else [base, *subs]


def _with_packages(target: str, importer: str, modules: dict) -> list[str]:
  """`target`'s longest prefix that is a module, and its enclosing packages that are
  modules and do not hold `importer` (see the module docstring)."""
  parts = target.split(".")
  while parts and ".".join(parts) not in modules:
    parts.pop()
  out = [".".join(parts)] if parts else []
  for i in range(1, len(parts)):
    package = ".".join(parts[:i])
    if package in modules and not (importer + ".").startswith(package + "."):
      out.append(package)
  return out


def import_graph(package_dir: pathlib.Path) -> Edges:
  """The edges of the import graph of the package in `package_dir` (rules: module doc)."""
  modules = module_files(package_dir)
  edges: Edges = {}
  for name, path in modules.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in _imports(tree):
      for target in _imported(name, node, is_package, modules):
        for module in _with_packages(target, name, modules):
          if module != name:
            edges.setdefault((name, module), node.lineno)
  return edges


def strongly_connected(edges: Edges) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm)."""
  succ = collections.defaultdict(list)
  for a, b in sorted(edges):
    succ[a].append(b)
  nodes = sorted({m for e in edges for m in e})
  index: dict = {}
  low: dict = {}
  stack: list = []
  on_stack: set = set()
  out = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in succ[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in nodes:
    if v not in index:
      visit(v)
  return out


def shortest_cycle(start: str, component: list[str], edges: Edges) -> list[str]:
  """A shortest cycle through `start` inside `component`: [start, ..., start]."""
  inside = set(component)
  succ = collections.defaultdict(list)
  for a, b in sorted(edges):
    if a in inside and b in inside:
      succ[a].append(b)
  parent = {start: None}
  queue = collections.deque([start])
  while queue:
    v = queue.popleft()
    for w in succ[v]:
      if w == start:
        path = [v]
        while parent[path[-1]] is not None:
          path.append(parent[path[-1]])
        return [*reversed(path), start]
      if w not in parent:
        parent[w] = v
        queue.append(w)
  raise AssertionError(f"{start} is on no cycle in {component}")


def describe(components: list[list[str]], edges: Edges) -> str:
  """Each component's size and members, and one shortest cycle with the importing lines."""
  lines = []
  for component in components:
    cycle = shortest_cycle(component[0], component, edges)
    lines.append(f"{len(component)} modules import each other: {', '.join(component)}")
    lines.append("  e.g. " + " -> ".join(cycle))
    for a, b in zip(cycle, cycle[1:]):
      lines.append(f"    {a} line {edges[(a, b)]} imports {b}")
  return "\n".join(lines)


def test_the_package_has_no_import_cycle():
  edges = import_graph(PACKAGE_DIR)
  assert len(edges) > 100  # the package's graph was read, not an empty one
  components = strongly_connected(edges)
  assert not components, "import cycles:\n" + describe(components, edges)


def test_config_reaches_no_configurable_and_only_the_launcher_names_the_registry():
  edges = import_graph(PACKAGE_DIR)
  imports = collections.defaultdict(set)
  for a, b in edges:
    imports[a].add(b)
  reached, todo = set(), ["evotrainer.config"]
  while todo:
    for b in imports[todo.pop()] - reached:
      reached.add(b)
      todo.append(b)
  configurables = imports["evotrainer.registry"] - {"evotrainer.config"}
  assert len(configurables) > 10  # the registry names the modules with configurables
  assert not reached & (configurables | {"evotrainer.registry"}), sorted(reached)
  assert {a for a, b in edges if b == "evotrainer.registry"} == {"evotrainer.launch"}


def _write(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return root / "pkg"


def test_function_level_and_relative_imports_are_edges(tmp_path):
  pkg = _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/a.py": "def f():\n  from pkg import b\n",
      "pkg/b.py": "from .sub import c\n",
      "pkg/sub/__init__.py": "",
      "pkg/sub/c.py": "from ..a import f\n",
      "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  import pkg.a\n",
  })
  edges = import_graph(pkg)
  assert set(edges) == {("pkg.a", "pkg.b"), ("pkg.b", "pkg.sub.c"), ("pkg.b", "pkg.sub"),
                        ("pkg.sub.c", "pkg.a")}
  assert edges[("pkg.a", "pkg.b")] == 2
  assert strongly_connected(edges) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
  text = describe(strongly_connected(edges), edges)
  assert "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a" in text
  assert "pkg.sub.c line 1 imports pkg.a" in text


def test_a_package_init_counts_from_outside_it_only(tmp_path):
  pkg = _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/sub/__init__.py": "from pkg.sub.x import X\n",
      "pkg/sub/x.py": "import pkg.sub.y\nX = 1\n",  # a sibling: no edge to pkg.sub
      "pkg/sub/y.py": "",
      "pkg/z.py": "from pkg.sub.y import Y\n",  # from outside: runs pkg.sub first
  })
  edges = import_graph(pkg)
  assert set(edges) == {("pkg.sub", "pkg.sub.x"), ("pkg.sub.x", "pkg.sub.y"),
                        ("pkg.z", "pkg.sub.y"), ("pkg.z", "pkg.sub")}
  assert strongly_connected(edges) == []
  # A child that names its own package's __init__ closes a cycle.
  (pkg / "sub" / "y.py").write_text("from pkg.sub import X\n")
  assert strongly_connected(import_graph(pkg)) == [["pkg.sub", "pkg.sub.x", "pkg.sub.y"]]


# The domain packages: what a task knows of its own problems. The harness reads episodes
# and answers (evotrainer.tasks.answers), never a domain; a domain registers its
# diagnostics and validators in the harness's libraries instead.
DOMAINS = ("evotrainer.tasks.math", "evotrainer.tasks.code", "evotrainer.tasks.swe")


def _within(module: str, packages) -> bool:
  return any(module == p or module.startswith(p + ".") for p in packages)


def reaches(edges: Edges, sources, targets) -> list[tuple[str, ...]]:
  """Import paths from a module within `sources` to one within `targets`, one per source
  module that reaches any (the shortest, by breadth-first search), with every step."""
  succ = collections.defaultdict(list)
  for a, b in sorted(edges):
    succ[a].append(b)
  out = []
  for start in sorted({a for a, _ in edges if _within(a, sources)}):
    parent, queue = {start: None}, collections.deque([start])
    while queue:
      v = queue.popleft()
      if _within(v, targets):
        path = [v]
        while parent[path[-1]] is not None:
          path.append(parent[path[-1]])
        out.append(tuple(reversed(path)))
        break
      for w in succ[v]:
        if w not in parent:
          parent[w] = v
          queue.append(w)
  return out


def test_the_harness_imports_no_domain():
  edges = import_graph(PACKAGE_DIR)
  assert any(_within(b, DOMAINS) and a.startswith("evotrainer.tasks.")
             for a, b in edges)  # the domains are in the graph
  assert any(_within(a, DOMAINS) and b.startswith("evotrainer.harness.")
             for a, b in edges)  # and register in the harness
  paths = reaches(edges, ("evotrainer.harness",), DOMAINS)
  assert not paths, "the harness reaches a domain:\n" + "\n".join(
      " -> ".join(p) for p in paths)


def test_reaches_follows_function_level_imports_to_a_domain(tmp_path):
  pkg = _write(tmp_path, {
      "pkg/__init__.py": "",
      "pkg/harness/__init__.py": "",
      "pkg/harness/a.py": "import pkg.util\n",
      "pkg/harness/b.py": "",
      "pkg/util.py": "def f():\n  from pkg.tasks.math import verify\n",
      "pkg/tasks/__init__.py": "",
      "pkg/tasks/answers.py": "",
      "pkg/tasks/math/__init__.py": "",
      "pkg/tasks/math/verify.py": "import pkg.tasks.answers\nimport pkg.harness.b\n",
  })
  edges = import_graph(pkg)
  assert reaches(edges, ("pkg.harness",), ("pkg.tasks.math",)) == [
      ("pkg.harness.a", "pkg.util", "pkg.tasks.math")]
  (pkg / "util.py").write_text("import pkg.tasks.answers\n")
  edges = import_graph(pkg)
  assert reaches(edges, ("pkg.harness",), ("pkg.tasks.math",)) == []
  assert reaches(edges, ("pkg.harness",), ("pkg.tasks.answers",)) == [
      ("pkg.harness.a", "pkg.util", "pkg.tasks.answers")]
