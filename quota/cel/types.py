"""Static CEL types for the checker, and the runtime test each type implies.

A deliberately small model of cel-go's checker types: primitives by name, `list(T)`,
`map(K, V)`, `optional_type(T)`, the opaque `kubernetes.Quantity`/`kubernetes.Semver`,
the `device` object and `dyn`. Type parameters of overloads (`A`, `B`) act as `dyn`.
`quota.cel.library` writes overload signatures as strings parsed here;
`quota.cel.checker` uses `assignable` to pick overloads and report "no matching
overload"; `quota.cel.evaluator` uses `runtime_test` for dynamic dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from functools import cache
from typing import Any

from quota.cel import ast
from quota.cel.values import CelType, Optional, Quantity, Semver, Uint


@dataclass(frozen=True, slots=True)
class T:
    name: str
    params: tuple[T, ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(str(p) for p in self.params)})"

    @property
    def is_dyn(self) -> bool:
        return self.name == "dyn" or len(self.name) == 1  # type parameters A, B, ...

    def param(self, i: int) -> T:
        return self.params[i] if len(self.params) > i else DYN


DYN = T("dyn")
BOOL = T("bool")
INT = T("int")
UINT = T("uint")
DOUBLE = T("double")
STRING = T("string")
BYTES = T("bytes")
NULL = T("null_type")
TYPE = T("type")
QUANTITY = T("kubernetes.Quantity")
SEMVER = T("kubernetes.Semver")
DEVICE = T("kubernetes.DRADevice")
LIST_DYN = T("list", (DYN,))
MAP_DYN = T("map", (DYN, DYN))

_NAMES = {
    "dyn": DYN, "bool": BOOL, "int": INT, "uint": UINT, "double": DOUBLE, "string": STRING,
    "bytes": BYTES, "null_type": NULL, "type": TYPE, "quantity": QUANTITY, "semver": SEMVER,
}


# Dotted type identifiers the Kubernetes environment declares (cel-go's well-known
# types; apiserver/pkg/cel library: QuantityType "kubernetes.Quantity", SemverType
# "kubernetes.Semver", IPType "net.IP", CIDRType "net.CIDR"), usable as `type(x) == net.IP`.
QUALIFIED_TYPES = frozenset((
    "google.protobuf.Timestamp", "google.protobuf.Duration", "kubernetes.Quantity", "kubernetes.Semver",
    "net.IP", "net.CIDR",
))


def qualified_name(node: ast.Node, scope: Container[str]) -> str | None:
    """`a.b.c` made of plain selections on an identifier that is not a variable."""
    parts: list[str] = []
    while isinstance(node, ast.Select) and not node.optional:
        parts.append(node.field)
        node = node.operand
    if not isinstance(node, ast.Ident) or node.name in scope or node.name == "device":
        return None
    name = ".".join([node.name, *reversed(parts)])
    return name if name in QUALIFIED_TYPES else None


@cache
def parse_type(text: str) -> T:
    """`"list(string)"`, `"map(string, dyn)"`, `"optional_type(A)"`, `"int"` -> T."""
    text = text.strip()
    if "(" not in text:
        return _NAMES.get(text, T(text))
    name, _, inner = text.partition("(")
    inner = inner[:-1]
    params, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            params.append(parse_type(inner[start:i]))
            start = i + 1
    params.append(parse_type(inner[start:]))
    return T(name, tuple(params))


def assignable(param: T, arg: T) -> bool:
    """May a value of static type `arg` be passed where `param` is declared?"""
    if param.is_dyn or arg.is_dyn:
        return True
    if param.name != arg.name:
        return False
    return all(assignable(p, a) for p, a in zip(param.params, arg.params))


def join(a: T, b: T) -> T:
    """The common type of two branches (ternary, list literal); dyn when they differ."""
    if a == b:
        return a
    if a.name == NULL.name:
        return b
    if b.name == NULL.name:
        return a
    if a.name == b.name and len(a.params) == len(b.params):
        return T(a.name, tuple(join(x, y) for x, y in zip(a.params, b.params)))
    return DYN


_RUNTIME: dict[str, Callable[[Any], bool]] = {
    "bool": lambda v: type(v) is bool,
    "int": lambda v: type(v) is int,
    "uint": lambda v: type(v) is Uint,
    "double": lambda v: type(v) is float,
    "string": lambda v: type(v) is str,
    "bytes": lambda v: type(v) is bytes,
    "null_type": lambda v: v is None,
    "list": lambda v: type(v) is tuple,
    "map": lambda v: isinstance(v, dict),  # DomainMap included
    "kubernetes.Quantity": lambda v: type(v) is Quantity,
    "kubernetes.Semver": lambda v: type(v) is Semver,
    "optional_type": lambda v: type(v) is Optional,
    "type": lambda v: type(v) is CelType,
}


def register_runtime_type(name: str, cls: type) -> None:
    """Let a library declare an opaque type (e.g. `net.IP`) for dynamic dispatch."""
    _RUNTIME[name] = lambda v: type(v) is cls


def runtime_test(t: T) -> Callable[[Any], bool] | None:
    """A predicate telling whether a runtime value has type `t`; None means "any"."""
    if t.is_dyn:
        return None
    return _RUNTIME.get(t.name)
