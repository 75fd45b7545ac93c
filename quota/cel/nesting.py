"""Nesting limits of the CEL parser, measured the way cel-go measures them.

cel-go (parser/parser.go, limit `MaxRecursionDepth`, default 250; Kubernetes' base
environment keeps the default) stops deep expressions twice:
- while parsing, a listener counts how many contexts of each ANTLR rule are open at
  once ("expression recursion limit exceeded: 250"). Every parenthesis, list or map
  literal, call argument, index and ternary else-branch opens a new `expr` (and a new
  context of every rule below it); a chain of `.x`/`[i]`/`.f()` suffixes adds one
  `member` context per suffix, a chain of arithmetic (or relational) operators one
  `calc` (`relation`) context per operator, and the right operand one more.
  `&&`/`||` runs and `!`/`-` runs are loops in one context and add nothing.
- while building the AST, the visitor counts nested ternaries, relations, arithmetic,
  selections, member calls and indexes on one path ("max recursion depth exceeded").
`lark_depth_problem` emulates the first on lark's tree (`quota.cel.syntax` keeps a
`paren` node for it), `ast_depth_problem` the second on our AST, plus a bound of our
own on the AST's total depth, so the recursive passes (checker, compiler, estimator,
references, evaluation) stay far inside Python's recursion limit: an expression
cel-go accepts can only exceed it by stacking several nesting forms at once.
"""

from __future__ import annotations

from typing import Any

import lark

from quota.cel import ast
from quota.values.work import pause_point

__all__ = ["MAX_DEPTH", "MAX_AST_DEPTH", "lark_depth_problem", "ast_depth_problem"]

MAX_DEPTH = 250  # cel-go parser.MaxRecursionDepth default
# Ours: every single nesting form at cel-go's limit stays below it (about 251 levels).
MAX_AST_DEPTH = 300

_REL_OPS = frozenset(("<=", ">=", "==", "!=", "<", ">"))
_POSTFIX = frozenset(("select", "opt_select", "method", "index", "opt_index", "message"))


def _is_rel(node: Any) -> bool:
    if not isinstance(node, lark.Tree):
        return False
    return node.data == "in_" or (node.data == "binop" and str(node.children[1]) in _REL_OPS)


def _is_calc(node: Any) -> bool:
    return isinstance(node, lark.Tree) and node.data == "binop" and str(node.children[1]) not in _REL_OPS


def _spine(node: Any, same: Any) -> list[Any]:
    """The left-deep chain of operators starting at `node` (outermost first)."""
    chain = []
    while same(node):
        chain.append(node)
        node = node.children[0]
    return chain


def _sub_expressions(node: lark.Tree[Any]) -> list[Any]:
    """The `expr` operands a primary or postfix node opens (arguments, items, entries)."""
    out: list[Any] = []
    for child in node.children[1:] if node.data in _POSTFIX else node.children:
        if isinstance(child, lark.Tree):
            if child.data in ("args", "items", "entries", "fields", "item", "opt_item", "entry", "opt_entry"):
                out.extend(_sub_expressions(child))
            else:
                out.append(child)
    return out


def lark_depth_problem(tree: Any) -> str | None:
    """cel-go's per-rule nesting count over the parse tree, or None when within it."""
    # (node, rule it is parsed through, open expr/relation/calc/member contexts)
    stack: list[tuple[Any, str, int, int, int, int]] = [(tree, "expr", 0, 0, 0, 0)]
    while stack:
        pause_point()
        node, kind, e, r, c, m = stack.pop()
        if kind == "expr":
            e += 1
            if e > MAX_DEPTH:
                return _LISTENER
            if isinstance(node, lark.Tree) and node.data == "cond":
                cond, then, otherwise = node.children
                stack += [(cond, "or", e, r, c, m), (then, "or", e, r, c, m), (otherwise, "expr", e, r, c, m)]
                continue
            kind = "or"
        if kind == "or":
            if isinstance(node, lark.Tree) and node.data in ("or_", "and_"):
                stack += [(child, "or", e, r, c, m) for child in node.children]
                continue
            kind = "rel"
        if kind == "rel":
            chain = _spine(node, _is_rel)
            r += 1
            if r + len(chain) > MAX_DEPTH:
                return _LISTENER
            for j, op in enumerate(reversed(chain), 1):
                stack.append((op.children[-1], "rel", e, r + j, c, m))
            node = chain[-1].children[0] if chain else node
            kind = "calc"
        if kind == "calc":
            chain = _spine(node, _is_calc)
            c += 1
            if c + len(chain) > MAX_DEPTH:
                return _LISTENER
            for j, op in enumerate(reversed(chain), 1):
                stack.append((op.children[-1], "calc", e, r, c + j, m))
            node = chain[-1].children[0] if chain else node
            if isinstance(node, lark.Tree) and node.data in ("not_", "neg"):
                node = node.children[-1]  # `!!!x` is one unary context
        # member
        chain = _spine(node, lambda n: isinstance(n, lark.Tree) and n.data in _POSTFIX)
        m += 1
        if m + len(chain) > MAX_DEPTH:
            return _LISTENER
        for j, op in enumerate(reversed(chain), 1):
            stack += [(arg, "expr", e, r, c, m + j) for arg in _sub_expressions(op)]
        primary = chain[-1].children[0] if chain else node
        if isinstance(primary, lark.Tree) and primary.data in ("paren", "call", "list_lit", "map_lit"):
            stack += [(arg, "expr", e, r, c, m) for arg in _sub_expressions(primary)]
    return None


_LISTENER = f"expression recursion limit exceeded: {MAX_DEPTH}"


def _visited(node: ast.Node) -> bool:
    """Nodes cel-go's visitor counts: ternary, relation, calc, select, member call, index."""
    if isinstance(node, (ast.Cond, ast.Binary, ast.Select, ast.Index, ast.Has, ast.Comprehension, ast.Bind)):
        return True
    return isinstance(node, ast.Call) and (node.target is not None or "." in node.function)


def ast_depth_problem(root: ast.Node) -> str | None:
    """cel-go's visitor depth, then our own bound on the total depth."""
    stack = [(root, 1, int(_visited(root)))]
    while stack:
        pause_point()
        node, depth, visited = stack.pop()
        if visited > MAX_DEPTH:
            return "max recursion depth exceeded"
        if depth > MAX_AST_DEPTH:
            return (
                f"expression nesting too deep: more than {MAX_AST_DEPTH} levels in all "
                f"(each form of nesting is limited to {MAX_DEPTH})"
            )
        stack.extend((child, depth + 1, visited + _visited(child)) for child in ast.children(node))
    return None
