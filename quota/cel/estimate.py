"""A static worst-case cost estimate, in the spirit of cel-go's checker.CostEstimate.

The API server refuses selectors whose estimated cost exceeds 1,000,000 ("too complex,
exceeds cost limit"); the scheduler does not estimate. Here the estimate is advisory
(`CompiledSelector.estimated_cost`): callers evaluating one selector against many
devices can see in advance how expensive one evaluation may get. Size bounds come from
the DRA API (k/k resource/v1 types.go, as compile.go declares them to cel-go): at most
32 attributes+capacities per device, ids of 32 characters, domains and driver names
of 63, attribute values of 64 characters or list elements. Every node costs 1 (a call
2); a comprehension costs its range plus size x (body + 2), like `quota.cel.evaluator`
charges at run time, so the estimate bounds `evaluate_with_cost`. `None` means
unbounded (a loop over something of unknown size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quota.cel import ast
from quota.values.work import pause_point

MAX_ENTRIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_VALUE = 64  # DeviceAttributeMaxValueLength, and list values per attribute
MAX_ID = 32
MAX_DOMAIN = 63


@dataclass(frozen=True, slots=True)
class Est:
    cost: int
    size: int | None = None  # length of a string/bytes/list/map value
    elem: Est | None = None  # elements of a list, values of a map
    key: Est | None = None  # keys of a map (what a comprehension over it binds)


class _Unbounded(Exception):
    pass


_VALUE = Est(0, MAX_VALUE, Est(0, MAX_VALUE))
_ID_MAP = Est(0, MAX_ENTRIES, _VALUE, Est(0, MAX_ID))
_DEVICE_FIELDS = {
    "driver": Est(0, MAX_DOMAIN),
    "allowMultipleAllocations": Est(0, 0),  # a bool: holds nothing (as `_SCALAR`)
    "attributes": Est(0, MAX_ENTRIES, _ID_MAP, Est(0, MAX_DOMAIN)),
    "capacity": Est(0, MAX_ENTRIES, Est(0, MAX_ENTRIES, Est(0), Est(0, MAX_ID)), Est(0, MAX_DOMAIN)),
}
_DEVICE = Est(0)
# Functions whose result holds nothing (a number, a bool, a quantity, a semver): size 0,
# so a comparison with one is bounded by the other operand (`_values_within`), as the
# evaluator charges it. Without this (and the scalar nodes of `visit`), hypothesis found
# `(c ? attr : quantity("1Gi")) == ...` estimated "unbounded".
_SCALAR = frozenset(
    "quantity semver isQuantity isSemver sign isGreaterThan isLessThan compareTo add sub mul div divInt "
    "isInteger asInteger asApproximateFloat major minor patch size int uint double bool".split()
)
# Functions whose run time grows with their first argument (cel-go charges a traversal).
_SCAN = frozenset(
    "contains startsWith endsWith matches find indexOf lastIndexOf lowerAscii upperAscii trim "
    "substring charAt isSorted sum min max reverse sort slice first last".split()
)


def estimate(root: ast.Node) -> int | None:
    try:
        return _Estimator().visit(root, {}).cost
    except _Unbounded:
        return None


def _need(size: int | None) -> int:
    if size is None:
        raise _Unbounded
    return size


class _Estimator:
    def visit(self, node: ast.Node, env: dict[str, Est]) -> Est:
        pause_point()
        if isinstance(node, ast.Lit):
            value = node.value
            # A scalar holds nothing (size 0), which keeps it from widening a bound to unknown.
            return Est(1, len(value) if isinstance(value, (str, bytes)) else 0)
        if isinstance(node, ast.Ident):
            if node.name in env:
                return Est(1, *_fields(env[node.name]))
            return _DEVICE if node.name == "device" else Est(1)
        if isinstance(node, ast.Select):
            operand = self.visit(node.operand, env)
            if operand is _DEVICE:
                return Est(2, *_fields(_DEVICE_FIELDS.get(node.field, Est(0))))
            return Est(operand.cost + 1, *_fields(operand.elem or Est(0)))
        if isinstance(node, ast.Index):
            operand, index = self.visit(node.operand, env), self.visit(node.index, env)
            return Est(operand.cost + index.cost + 1, *_fields(operand.elem or Est(0)))
        if isinstance(node, ast.Comprehension):
            return self._comprehension(node, env)
        if isinstance(node, ast.Bind):
            init = self.visit(node.init, env)
            body = self.visit(node.body, {**env, node.var: Est(0, init.size, init.elem, init.key)})
            return Est(init.cost + body.cost + 1, body.size, body.elem, body.key)
        if isinstance(node, ast.Call):
            return self._call(node, env)
        parts = [self.visit(child, env) for child in ast.children(node)]
        cost = 1 + sum(p.cost for p in parts)
        if isinstance(node, ast.ListLit):
            return Est(cost, len(parts), _widest(parts))
        if isinstance(node, ast.MapLit):
            return Est(cost, len(node.entries), _widest(parts[1::2]), _widest(parts[0::2]))
        if isinstance(node, ast.Binary) and node.op == "+":
            left, right = parts
            if left.size is not None and right.size is not None:
                return Est(cost + (left.size + right.size) // 2, left.size + right.size, _widest([left.elem, right.elem]))
            return Est(cost)
        if isinstance(node, ast.Binary) and node.op == "in":
            return Est(cost + (parts[1].size or 0) // 10, 0)
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISONS and not ast.uncharged_comparison(node):
            # As the evaluator charges it (ops.comparison_cost): the smaller operand's
            # values at every depth (strings: a tenth of their length, bounded by it).
            bounds = [b for b in (_values_within(parts[0]), _values_within(parts[1])) if b is not None]
            if not bounds:
                raise _Unbounded
            return Est(cost + min(bounds), 0)
        if isinstance(node, ast.Cond):
            return Est(cost, *_fields(_widest(parts[1:]) or Est(0)))
        # What is left (has, &&, ||, !, unary minus, arithmetic, uncharged comparisons)
        # yields a bool or a number: it holds nothing.
        return Est(cost, 0)

    def _comprehension(self, node: ast.Comprehension, env: dict[str, Est]) -> Est:
        rng = self.visit(node.range, env)
        size = 1 if node.kind in ("optMap", "optFlatMap") else _need(rng.size)
        if node.var2 is None:  # one variable: list elements, map keys
            first = rng.key if rng.key is not None else rng.elem
        else:  # two variables: index or key, then the value
            first = rng.key if rng.key is not None else Est(0)
        inner = {**env, node.var: first or Est(0)}
        if node.var2 is not None:
            inner[node.var2] = rng.elem or Est(0)
        body = self.visit(node.body, inner)
        pred = self.visit(node.pred, inner).cost if node.pred is not None else 0
        cost = 1 + rng.cost + size * (2 + body.cost + pred)
        if node.kind in ("map", "transformList", "transformMap"):
            return Est(cost, size, body)
        if node.kind == "filter":
            return Est(cost, size, rng.elem, rng.key)
        if node.kind in ("all", "exists", "exists_one", "existsOne"):
            # A bool holds nothing. Hypothesis found `(c ? attr : list.exists(...)) == ...`
            # estimated unbounded: an unknown size here widened the conditional's.
            return Est(cost, 0)
        return Est(cost)

    def _call(self, node: ast.Call, env: dict[str, Est]) -> Est:
        parts = ([self.visit(node.target, env)] if node.target is not None else []) + [self.visit(a, env) for a in node.args]
        cost = 2 + sum(p.cost for p in parts)  # the node, and the run-time charge of a costly call
        name = node.function
        first = parts[0] if parts else Est(0)
        if name in _SCAN:
            cost += _need(first.size) // 10
            return Est(cost, first.size, first.elem)
        if name in ("split", "findAll"):
            size = _need(first.size)
            return Est(cost + size // 2, size + 1, Est(0, size))
        if name == "join":
            total = _need(first.size) * _need((first.elem or Est(0)).size) + _need(first.size) * (
                parts[1].size or 0 if len(parts) > 1 else 0)
            return Est(cost + total // 10, total)
        if name == "replace":
            s, old, new = (_need(p.size) for p in parts[:3])
            size = s + max(new - old, 0) * (s + 1)
            return Est(cost + size // 10, size)
        if name == "lists.range":
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Lit) and type(arg.value) is int):
                raise _Unbounded
            return Est(cost + max(arg.value, 0), max(arg.value, 0), Est(0))
        if name == "distinct":
            size = _need(first.size)
            return Est(cost + size * size // 10, size, first.elem)
        if name.startswith("sets."):
            return Est(cost + _need(first.size) * _need(parts[1].size) // 10)
        if name == "flatten":
            size = _need(first.size) * max(_need((first.elem or Est(0, 1)).size), 1)
            return Est(cost + size // 2, size)
        if name == "includes":
            return Est(cost + 48)
        if name in ("orValue", "value", "dyn", "optional.of", "or"):
            return Est(cost, *_fields(_widest(parts) or Est(0)))
        if name in _SCALAR:
            return Est(cost, 0)
        return Est(cost)


def _values_within(e: Est) -> int | None:
    """An upper bound of the values `e` holds at every depth (or its length), None if unknown."""
    if e.elem is None:
        return e.size if e.size is not None else 0
    inner = _values_within(e.elem)
    if e.size is None or inner is None:
        return None
    return e.size * (1 + inner)


def _fields(e: Est) -> tuple[int | None, Est | None, Est | None]:
    return e.size, e.elem, e.key


def _widest(parts: Sequence[Est | None]) -> Est | None:
    """An element bound covering all the given ones (None size if any is unknown)."""
    known = [p for p in parts if p is not None]
    if not known:
        return None
    sizes = [p.size for p in known]
    size = None if any(s is None for s in sizes) else max(s for s in sizes if s is not None)
    return Est(0, size, _widest([p.elem for p in known]), _widest([p.key for p in known]))
