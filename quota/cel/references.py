"""Which device paths can an expression read? A conservative static analysis.

`references(root)` returns the set of `DevicePath`s (`("driver",)`,
`("allowMultipleAllocations",)`, `("attributes", domain, id)`, `("capacity", domain,
id)`) when every use of `device` is statically resolvable, else None. The pricing
layer groups devices by the values at these paths and evaluates one device per group,
so a non-None answer must be sound: the result (value or error) of the expression
depends on nothing but those values and their presence. Anything that exposes a whole
map (iterating, sizing, comparing, passing it to a function, `in` on the domain map, a
computed key, a conditional choosing between maps) makes the answer None. `cel.bind`
aliases of device parts are followed, since a binding is a pure substitution.

`presence_only(root)` names the referenced paths the expression only tests for presence
(`has(m.x)`, `"x" in m` with a literal key): its outcome depends on whether they exist,
never on their values, so devices need only agree on that (a `uuid` is unique per
device, its presence is not). Optional selection (`m.?x`) counts as a value read: it
hands the value on.

`equalities(root)` names the top-level `&&` terms `device.attributes["d"].x == <literal>`
(either side; a string, int or bool literal): on a device where that attribute holds
another value the term is false without an error, so the whole expression is false
(`&&` absorbs the other terms' errors), which lets `quota.devices.equality` answer selectors
that pin one device from an index instead of evaluating every device.
"""

from __future__ import annotations

from dataclasses import dataclass

from quota.cel import ast
from quota.values.work import pause_point

DevicePath = tuple[str, ...]

__all__ = ["DevicePath", "references", "presence_only", "equalities"]


@dataclass(frozen=True, slots=True)
class _Part:
    """A device-valued sub-expression: the device, a domain map, or an id map."""

    kind: str  # "device" | "domains" | "ids"
    map_name: str = ""  # attributes | capacity
    domain: str = ""


class _Unresolvable(Exception):
    pass


_DEVICE = _Part("device")
_SCALAR_FIELDS = ("driver", "allowMultipleAllocations")


def references(root: ast.Node) -> frozenset[DevicePath] | None:
    walker = _Walker()
    try:
        walker.value(root, {})
    except _Unresolvable:
        return None
    return frozenset(walker.found | walker.tested)


def presence_only(root: ast.Node) -> frozenset[DevicePath]:
    """The referenced paths read only by presence tests (empty when `references` is None)."""
    walker = _Walker()
    try:
        walker.value(root, {})
    except _Unresolvable:
        return frozenset()
    return frozenset(walker.tested - walker.found)


def equalities(root: ast.Node) -> tuple[tuple[DevicePath, str | int | bool], ...]:
    """The top-level `attribute == literal` terms (module doc), in source order."""
    terms: list[tuple[DevicePath, str | int | bool]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.And):
            stack += [node.right, node.left]
        elif isinstance(node, ast.Binary) and node.op == "==":
            for side, other in ((node.left, node.right), (node.right, node.left)):
                path = _attribute(side)
                if path is not None and isinstance(other, ast.Lit) and type(other.value) in (str, int, bool):
                    terms.append((path, other.value))
                    break
    return tuple(terms)


def _attribute(node: ast.Node) -> DevicePath | None:
    """`device.attributes["d"].x` or `device.attributes["d"]["x"]` (no optionals), else None."""
    if isinstance(node, ast.Select) and not node.optional:
        ident, domains = node.field, node.operand
    elif isinstance(node, ast.Index) and not node.optional and isinstance(node.index, ast.Lit) \
            and type(node.index.value) is str:
        ident, domains = node.index.value, node.operand
    else:
        return None
    if not (isinstance(domains, ast.Index) and not domains.optional and isinstance(domains.index, ast.Lit)
            and type(domains.index.value) is str):
        return None
    top = domains.operand
    if isinstance(top, ast.Select) and not top.optional and top.field == "attributes" \
            and isinstance(top.operand, ast.Ident) and top.operand.name == "device":
        return ("attributes", domains.index.value, ident)
    return None


Env = dict[str, "_Part | None"]


class _Walker:
    def __init__(self) -> None:
        self.found: set[DevicePath] = set()  # values read
        self.tested: set[DevicePath] = set()  # presence tested

    def value(self, node: ast.Node, env: Env) -> None:
        """`node` is used as a value: it must not be a device part."""
        if self.visit(node, env) is not None:
            raise _Unresolvable

    def visit(self, node: ast.Node, env: Env) -> _Part | None:
        pause_point()
        if isinstance(node, ast.Ident):
            if node.name in env:
                return env[node.name]
            return _DEVICE if node.name == "device" else None
        if isinstance(node, ast.Select):
            return self._select(self.visit(node.operand, env), node.field, node.optional)
        if isinstance(node, ast.Index):
            return self._index(node, env)
        if isinstance(node, ast.Has):
            self._has(self.visit(node.operand, env), node.field)
            return None
        if isinstance(node, ast.Binary) and node.op == "in":
            self._in(node, env)
            return None
        if isinstance(node, ast.Bind):
            bound = self.visit(node.init, env)
            return self.visit(node.body, {**env, node.var: bound})
        if isinstance(node, ast.Comprehension):
            self.value(node.range, env)
            inner: Env = {**env, node.var: None}
            if node.var2 is not None:
                inner[node.var2] = None
            self.value(node.body, inner)
            if node.pred is not None:
                self.value(node.pred, inner)
            return None
        for child in ast.children(node):
            self.value(child, env)
        return None

    def _select(self, part: _Part | None, field: str, optional: bool) -> _Part | None:
        if part is None:
            return None
        if part.kind == "device":
            if field in _SCALAR_FIELDS:
                self.found.add((field,))
                return None
            if optional:
                raise _Unresolvable
            return _Part("domains", field)
        if part.kind == "domains":
            if optional:
                raise _Unresolvable  # presence of a domain depends on the whole map
            return _Part("ids", part.map_name, field)
        self.found.add((part.map_name, part.domain, field))
        return None

    def _index(self, node: ast.Index, env: Env) -> _Part | None:
        part = self.visit(node.operand, env)
        if part is None:
            self.value(node.index, env)
            return None
        key = node.index
        if part.kind == "device" or not (isinstance(key, ast.Lit) and type(key.value) is str):
            raise _Unresolvable
        if part.kind == "domains":
            if node.optional:
                raise _Unresolvable
            return _Part("ids", part.map_name, key.value)
        self.found.add((part.map_name, part.domain, key.value))
        return None

    def _has(self, part: _Part | None, field: str) -> None:
        if part is None:
            return
        if part.kind == "ids":
            self.tested.add((part.map_name, part.domain, field))
        elif part.kind == "device" and field in _SCALAR_FIELDS:
            self.found.add((field,))
        elif part.kind == "domains":
            raise _Unresolvable
        # has(device.attributes) is constantly true: it reads nothing.

    def _in(self, node: ast.Binary, env: Env) -> None:
        container = self.visit(node.right, env)
        if container is None:
            self.value(node.left, env)
            return
        key = node.left
        if container.kind != "ids" or not (isinstance(key, ast.Lit) and type(key.value) is str):
            raise _Unresolvable
        self.tested.add((container.map_name, container.domain, key.value))
