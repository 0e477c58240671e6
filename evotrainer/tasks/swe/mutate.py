"""Bug injection with libcst: the sites a file offers, and the mutant of one site.

Kinds (SWE-smith's procedural modifiers, reduced to the ones that change one thing):

  operator_swap        a binary, comparison or boolean operator for its usual mistake
                       (`+`/`-`, `<`/`<=`, `==`/`!=`, `in`/`not in`, `and`/`or`, ...)
  constant_change      an integer n -> n + 1 (0 <-> 1), True <-> False
  inverted_condition   `if c:` -> `if not c:` (and `while`, conditional expressions)
  removed_statement    a simple statement of a function body with siblings is dropped
  swapped_arguments    the first two positional arguments of a call trade places

Only code inside functions (or methods) is mutated, so every mutant names the function
it lives in (`Site.function`), which the splits keep apart. One-token kinds are the
easy difficulty. libcst round-trips source exactly, so a mutant differs from its base
only at the site.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

ONE_TOKEN = ("operator_swap", "constant_change")
KINDS = ONE_TOKEN + ("inverted_condition", "removed_statement", "swapped_arguments")

_BINARY = {cst.Add: cst.Subtract, cst.Subtract: cst.Add, cst.Multiply: cst.FloorDivide,
           cst.FloorDivide: cst.Multiply, cst.Divide: cst.Multiply, cst.Modulo: cst.FloorDivide,
           cst.BitAnd: cst.BitOr, cst.BitOr: cst.BitAnd, cst.LeftShift: cst.RightShift,
           cst.RightShift: cst.LeftShift}
_COMPARE = {cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
            cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
            cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.In: cst.NotIn,
            cst.NotIn: cst.In, cst.Is: cst.IsNot, cst.IsNot: cst.Is}
_BOOLEAN = {cst.And: cst.Or, cst.Or: cst.And}


@dataclasses.dataclass(frozen=True)
class Site:
  """One place a file can be mutated.

  Attributes:
    index: its position in `sites(...)`'s list for this source (how `mutate` finds it).
    kind: one of `KINDS`.
    function: the enclosing function's qualified name, e.g. "Table.insert".
    line: 1-based line of the site in the base file.
  """
  index: int
  kind: str
  function: str
  line: int


class _Collect(cst.CSTVisitor):
  METADATA_DEPENDENCIES = (PositionProvider,)

  def __init__(self):
    self.found: list[tuple[cst.CSTNode, str, str, int]] = []
    self.scope: list[str] = []
    self.functions = 0

  def _add(self, node: cst.CSTNode, kind: str) -> None:
    if self.functions:
      line = self.get_metadata(PositionProvider, node).start.line
      self.found.append((node, kind, ".".join(self.scope), line))

  def visit_ClassDef(self, node):
    self.scope.append(node.name.value)

  def leave_ClassDef(self, node):
    self.scope.pop()

  def visit_FunctionDef(self, node):
    self.scope.append(node.name.value)
    self.functions += 1
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    if len(body) > 1:
      for stmt in body:
        if (isinstance(stmt, cst.SimpleStatementLine) and
            not _is_docstring(stmt) and
            not any(isinstance(s, (cst.Return, cst.Raise, cst.Pass, cst.Global, cst.Nonlocal))
                    for s in stmt.body)):
          self._add(stmt, "removed_statement")

  def leave_FunctionDef(self, node):
    self.scope.pop()
    self.functions -= 1

  def visit_Decorator(self, node):
    return False

  def visit_Annotation(self, node):
    return False

  def visit_BinaryOperation(self, node):
    if type(node.operator) in _BINARY:
      self._add(node, "operator_swap")

  def visit_Comparison(self, node):
    if len(node.comparisons) == 1 and type(node.comparisons[0].operator) in _COMPARE:
      self._add(node, "operator_swap")

  def visit_BooleanOperation(self, node):
    self._add(node, "operator_swap")

  def visit_Integer(self, node):
    self._add(node, "constant_change")

  def visit_Name(self, node):
    if node.value in ("True", "False"):
      self._add(node, "constant_change")

  def visit_If(self, node):
    self._add(node, "inverted_condition")

  def visit_While(self, node):
    self._add(node, "inverted_condition")

  def visit_IfExp(self, node):
    self._add(node, "inverted_condition")

  def visit_Call(self, node):
    positional = [a for a in node.args if a.keyword is None and not a.star]
    if len(positional) >= 2 and node.args[0] is positional[0] and node.args[1] is positional[1]:
      self._add(node, "swapped_arguments")


def _is_docstring(stmt: cst.SimpleStatementLine) -> bool:
  return (len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr) and
          isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _collect(source: str) -> tuple[cst.Module, list]:
  wrapper = MetadataWrapper(cst.parse_module(source))
  visitor = _Collect()
  wrapper.visit(visitor)
  return wrapper.module, visitor.found


def sites(source: str) -> list[Site]:
  """Every mutable site of a Python file, in source order."""
  _, found = _collect(source)
  return [Site(i, kind, function, line) for i, (_, kind, function, line) in enumerate(found)]


def _negate(test: cst.BaseExpression) -> cst.BaseExpression:
  if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
    return test.expression  # `not c` -> `c`
  needs_parens = not isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
  inner = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) \
      if needs_parens and not test.lpar else test
  return cst.UnaryOperation(cst.Not(), inner)


def _replacement(node: cst.CSTNode, kind: str) -> Optional[cst.CSTNode]:
  """The mutated node, or cst.RemovalSentinel.REMOVE for a removed statement."""
  if kind == "removed_statement":
    return cst.RemovalSentinel.REMOVE
  if kind == "operator_swap":
    if isinstance(node, cst.BinaryOperation):
      return node.with_changes(operator=_BINARY[type(node.operator)]())
    if isinstance(node, cst.Comparison):
      target = node.comparisons[0]
      op = target.operator
      new = _COMPARE[type(op)]()
      if hasattr(op, "whitespace_before") and hasattr(new, "whitespace_before"):
        new = new.with_changes(whitespace_before=op.whitespace_before,
                               whitespace_after=op.whitespace_after)
      return node.with_changes(comparisons=[target.with_changes(operator=new)])
    if isinstance(node, cst.BooleanOperation):
      return node.with_changes(operator=_BOOLEAN[type(node.operator)]())
  if kind == "constant_change":
    if isinstance(node, cst.Name):
      return node.with_changes(value="False" if node.value == "True" else "True")
    try:
      value = int(node.value.replace("_", ""), 0)
    except ValueError:
      return None
    return node.with_changes(value=str(1 if value == 0 else 0 if value == 1 else value + 1))
  if kind == "inverted_condition":
    return node.with_changes(test=_negate(node.test))
  if kind == "swapped_arguments":
    args = list(node.args)
    first, second = args[0], args[1]
    args[0] = second.with_changes(comma=first.comma)
    args[1] = first.with_changes(comma=second.comma)
    return node.with_changes(args=args)
  return None


class _Replace(cst.CSTTransformer):
  def __init__(self, target: cst.CSTNode, kind: str):
    self.target, self.kind, self.done = target, kind, False

  def on_leave(self, original_node, updated_node):
    if original_node is self.target:
      new = _replacement(updated_node, self.kind)
      if new is not None:
        self.done = True
        return new
    return updated_node


def mutate(source: str, site: Site) -> Optional[str]:
  """The source with `site` mutated; None when the site cannot be mutated after all
  (e.g. the mutant is the base: `x == x` style no-ops, or it no longer parses)."""
  module, found = _collect(source)
  if site.index >= len(found) or found[site.index][1] != site.kind:
    raise ValueError(f"site {site} does not belong to this source")
  transformer = _Replace(found[site.index][0], site.kind)
  mutant = module.visit(transformer).code
  if not transformer.done or mutant == source:
    return None
  try:
    compile(mutant, "<mutant>", "exec")
  except SyntaxError:
    return None
  return mutant
