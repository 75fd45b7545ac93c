"""The CEL abstract syntax tree used between `quota.cel.syntax` and the later passes.

Small immutable nodes, one per construct cel-go's parser produces after macro
expansion (`has`, comprehensions and `cel.bind` are nodes of their own rather than
generic calls). `quota.cel.checker` annotates nothing in place: it walks these nodes
and returns its findings, and `quota.cel.evaluator` compiles them into closures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Pos = tuple[int, int]


class Node:
    """Base class of all nodes."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Lit(Node):
    value: Any
    # A numeric literal written without a sign: `-` may fold into it (int64 minimum).
    negatable: bool = field(default=False, compare=False)


@dataclass(frozen=True, slots=True)
class Ident(Node):
    name: str
    pos: Pos = (1, 1)


@dataclass(frozen=True, slots=True)
class Select(Node):
    operand: Node
    field: str
    optional: bool  # `a.?b`
    pos: Pos = (1, 1)


@dataclass(frozen=True, slots=True)
class Index(Node):
    operand: Node
    index: Node
    optional: bool  # `a[?b]`
    pos: Pos = (1, 1)


@dataclass(frozen=True, slots=True)
class Has(Node):
    operand: Node
    field: str
    pos: Pos = (1, 1)


@dataclass(frozen=True, slots=True)
class Call(Node):
    """A function (`target` None) or method call, by name; overloads resolve later."""

    function: str
    target: Node | None
    args: tuple[Node, ...]
    pos: Pos = (1, 1)


@dataclass(frozen=True, slots=True)
class ListLit(Node):
    items: tuple[Node, ...]
    optional: tuple[int, ...] = ()  # indexes of `?x` elements (kept only if present)


@dataclass(frozen=True, slots=True)
class MapLit(Node):
    entries: tuple[tuple[Node, Node], ...]
    optional: tuple[int, ...] = ()  # indexes of `?k: v` entries (kept only if present)


@dataclass(frozen=True, slots=True)
class Comprehension(Node):
    """`range.kind(var, body)`; `pred` is the filter of `map(x, pred, f)` and of the
    four-argument transforms; `var2` is the value variable of the two-variable forms
    (cel-go ext.TwoVarComprehensions: index/key first, then value)."""

    kind: str  # all | exists | exists_one | map | filter | transformList | transformMap | transformMapEntry
    range: Node
    var: str
    body: Node
    pred: Node | None
    pos: Pos = (1, 1)
    var2: str | None = None


@dataclass(frozen=True, slots=True)
class Bind(Node):
    """`cel.bind(var, init, body)` (cel-go ext.Bindings)."""

    var: str
    init: Node
    body: Node


@dataclass(frozen=True, slots=True)
class And(Node):
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Or(Node):
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Not(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class Neg(Node):
    operand: Node
    pos: Pos = (1, 1)


@dataclass(frozen=True, slots=True)
class Cond(Node):
    condition: Node
    then: Node
    otherwise: Node


@dataclass(frozen=True, slots=True)
class Binary(Node):
    """Arithmetic and relations: + - * / % < <= > >= == != in."""

    op: str
    left: Node
    right: Node
    pos: Pos = (1, 1)


def children(node: Node) -> list[Node]:
    """The direct sub-expressions of a node, in field order."""
    out: list[Node] = []
    for name in getattr(node, "__dataclass_fields__", {}):
        child = getattr(node, name)
        if isinstance(child, Node):
            out.append(child)
        elif isinstance(child, tuple):
            for item in child:
                out.extend(part for part in (item if isinstance(item, tuple) else (item,)) if isinstance(part, Node))
    return out


COMPARISONS = frozenset(("==", "!=", "<", "<=", ">", ">="))


def uncharged_comparison(node: Binary) -> bool:
    """A comparison with a small literal costs at most the literal's size, so the
    evaluator charges nothing for it (keeping the common `attr == "gpu"` free of the size
    check) and the estimator adds nothing; other comparisons pay by operand size."""
    return any(
        isinstance(side, Lit) and not (isinstance(side.value, (str, bytes)) and len(side.value) > 1000)
        for side in (node.left, node.right)
    )
