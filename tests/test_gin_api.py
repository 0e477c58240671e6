"""gin_api: the two look-ups gin has no public function for, and the rule that no other
module reads a private gin attribute."""

import ast
import inspect
import pathlib

import gin
import pytest

from evotrainer import gin_api

REPO = pathlib.Path(__file__).resolve().parents[1]


@gin.configurable(module="gin_api_test_a")
def gin_api_probe(x: int = 1, y: str = "a") -> tuple:
  return x, y


@gin.configurable(module="gin_api_test_a")
def gin_api_twin() -> None:
  """Registered under the same name in two modules: a bare selector is ambiguous."""


gin_api_twin_a = gin_api_twin


@gin.configurable("gin_api_twin", module="gin_api_test_b")
def gin_api_twin_b() -> None:
  pass


@pytest.fixture(autouse=True)
def _clean_config():
  gin.clear_config()
  yield
  gin.clear_config()


def test_find_configurable_by_partial_or_complete_selector():
  for selector in ("gin_api_probe", "gin_api_test_a.gin_api_probe"):
    found = gin_api.find_configurable(selector)
    assert found.selector == "gin_api_test_a.gin_api_probe"
    assert found.wrapped(2, "b") == (2, "b")  # the undecorated function: no gin bindings
  assert gin_api.find_configurable("no_such_configurable") is None
  assert gin_api.find_configurable("gin_api_twin") is None  # two match
  assert gin_api.find_configurable("gin_api_test_b.gin_api_twin").wrapped is gin_api_twin_b.__wrapped__


def test_bound_parameters_lists_every_parsed_binding_with_its_scope():
  assert list(gin_api.bound_parameters()) == []
  gin.parse_config("gin_api_probe.x = 3\ngin_api_probe.y = 'b'\nouter/gin_api_probe.x = 4")
  probe = "gin_api_test_a.gin_api_probe"
  assert sorted(gin_api.bound_parameters()) == [("", probe, {"x": 3, "y": "b"}),
                                                ("outer", probe, {"x": 4})]


def _private_gin_reads(path: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  """`gin.<...>._name` attributes and `from gin... import _name` in a file."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
      base = node.value
      while isinstance(base, ast.Attribute):
        base = base.value
      if isinstance(base, ast.Name) and base.id == "gin" and not node.attr.startswith("__"):
        out.append(f"{path.relative_to(root)}:{node.lineno}: .{node.attr}")
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gin":
      out += [f"{path.relative_to(root)}:{node.lineno}: import {a.name}"
              for a in node.names if a.name.startswith("_")]
  return sorted(out)


def test_the_scan_finds_private_reads(tmp_path):
  path = tmp_path / "probe.py"
  path.write_text("import gin\nx = gin.config._REGISTRY.get_match\n"
                  "from gin.config import _CONFIG\ny = gin.config.ParsedBindingKey\n")
  assert _private_gin_reads(path, tmp_path) == ["probe.py:2: ._REGISTRY",
                                                "probe.py:3: import _CONFIG"]


def test_no_module_but_gin_api_reads_a_private_gin_attribute():
  files = [p for d in ("evotrainer", "tests", "bench") for p in (REPO / d).rglob("*.py")]
  assert len(files) > 100
  found = [hit for p in files if p != REPO / "evotrainer" / "gin_api.py"
           for hit in _private_gin_reads(p)]
  assert found == []
  assert _private_gin_reads(REPO / "evotrainer" / "gin_api.py")  # the one that does


class _External:
  def __init__(self, a: int = 1, *, b: str = "x"):
    self.a, self.b = a, b


gin.external_configurable(_External, name="GinApiExternal", module="gin_api_test_c")


def test_registered_lists_the_configurables_and_parameters_reads_their_signatures():
  found = {c.selector: c for c in gin_api.registered()}
  probe = found["gin_api_test_a.gin_api_probe"]
  assert list(gin_api.parameters(probe.wrapped)) == ["x", "y"]
  assert gin_api.parameters(probe.wrapped)["x"].default == 1
  # An external configurable: gin wraps the class in a subclass whose __init__ is
  # (*args, **kwargs); the parameters are the original class's.
  external = found["gin_api_test_c.GinApiExternal"]
  assert inspect.signature(gin.get_configurable("GinApiExternal")).parameters.keys() == \
      {"args", "kwargs"}
  params = gin_api.parameters(gin.get_configurable("GinApiExternal"))
  assert {k: v.default for k, v in params.items()} == {"a": 1, "b": "x"}
  assert gin_api.parameters(external.wrapped) == params
