"""Compile a checked CEL AST into nested Python closures, with a runtime cost budget.

This replaces celpy's InterpretedRunner/CompiledRunner for speed (see README.md for
the numbers): each node becomes one closure taking a `State`; constant subtrees
(`quantity("40Gi")`, `semver("1.2.3")`) fold at compile time; the common
`device.attributes["d"].x` path is one dict lookup. Errors are `EvalError`s that
`&&`, `||` and the macros absorb exactly as cel-go does (a false operand wins over an
error). The cost budget follows cel-go's runtime cost tracking in spirit: every
comprehension step costs its body's size, traversals cost a tenth of the length, and
`CostLimitExceeded` (never absorbed) aborts once the scheduler's limit
(resourceapi.CELSelectorExpressionMaxCost = 1,000,000) is spent. Inputs come from
`quota.cel.checker` (types, overloads); `quota.cel.selector` wraps the result.
"""

from __future__ import annotations

from typing import Any

from quota.cel import ast, ops
from quota.cel.calls import compile_call, compile_comprehension
from quota.cel.checker import Annotations
from quota.cel.library import Overload
from quota.cel.runtime import Fn, State, charge
from quota.cel.twovar import compile_two_var
from quota.cel.types import qualified_name
from quota.cel.values import CelType, CostLimitExceeded, EvalError, Optional, cel_equal
from quota.values.work import pause_point

class _Lazy:
    """A `cel.bind` value not computed yet (cel-go evaluates bindings lazily)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Fn) -> None:
        self.fn = fn


def compile_program(root: ast.Node, notes: Annotations) -> tuple[Fn, int]:
    """Return the closure for `root` and the number of variable slots it needs."""
    compiler = _Compiler(notes)
    fn, _ = compiler.compile(root, {})
    return fn, compiler.slot_count


def node_count(node: ast.Node) -> int:
    """Node count: the per-iteration cost of a comprehension body and the base cost of
    an evaluation. A nested comprehension counts once; its iterations charge themselves."""
    if isinstance(node, ast.Comprehension):
        return 1 + node_count(node.range)
    return 1 + sum(node_count(child) for child in ast.children(node))


Scope = dict[str, tuple[int, bool]]  # name -> (slot, is a cel.bind variable)


# Constant folding shares one small budget per expression: folding must stay cheap, and
# a folded value lives as long as the cached selector, so big results stay dynamic.
FOLD_BUDGET = 10_000


class _Compiler:
    def __init__(self, notes: Annotations) -> None:
        self.notes = notes
        self.slot_count = 0
        self.fold_state = State(None, 0, FOLD_BUDGET)

    def compile(self, node: ast.Node, scope: Scope) -> tuple[Fn, bool]:
        """(closure, is constant); constant closures were folded to their value."""
        pause_point()
        fn, const = getattr(self, "_" + type(node).__name__)(node, scope)
        if const and not isinstance(node, ast.Lit):
            if self.fold_state.cost >= FOLD_BUDGET:
                return fn, False
            try:
                value = fn(self.fold_state)
            except EvalError:
                return fn, False  # keep the error for evaluation time, where && may absorb it
            except CostLimitExceeded:
                self.fold_state.cost = FOLD_BUDGET
                return fn, False
            return (lambda st: value), True
        return fn, const

    def _new_slot(self) -> int:
        self.slot_count += 1
        return self.slot_count - 1

    def _Lit(self, node: ast.Lit, scope: Scope) -> tuple[Fn, bool]:
        value = node.value
        return (lambda st: value), True

    def _Ident(self, node: ast.Ident, scope: Scope) -> tuple[Fn, bool]:
        if node.name in scope:
            slot, is_bind = scope[node.name]
            if not is_bind:
                return (lambda st: st.slots[slot]), False

            def bound(st: State) -> Any:
                value = st.slots[slot]
                if type(value) is _Lazy:
                    value = st.slots[slot] = value.fn(st)
                return value

            return bound, False
        if node.name == "device":
            return (lambda st: st.device), False
        type_value = CelType(node.name)
        return (lambda st: type_value), True

    def _device_path(self, node: ast.Node, scope: Scope) -> tuple[str, str, str] | None:
        """`device.attributes["d"].x` or `device.capacity["d"]["x"]` with literals."""
        if isinstance(node, ast.Select) and not node.optional:
            key: Any = node.field
            inner = node.operand
        elif isinstance(node, ast.Index) and not node.optional and isinstance(node.index, ast.Lit):
            key, inner = node.index.value, node.operand
        else:
            return None
        if not isinstance(inner, ast.Index) or inner.optional or not isinstance(inner.index, ast.Lit):
            return None
        top = inner.operand
        if not (isinstance(top, ast.Select) and not top.optional and top.field in ("attributes", "capacity")):
            return None
        if not (isinstance(top.operand, ast.Ident) and top.operand.name == "device" and "device" not in scope):
            return None
        domain = inner.index.value
        if type(domain) is not str or type(key) is not str:
            return None
        return top.field, domain, key

    def _Select(self, node: ast.Select, scope: Scope) -> tuple[Fn, bool]:
        qualified = qualified_name(node, scope)
        if qualified is not None:
            type_value = CelType(qualified)
            return (lambda st: type_value), True
        path = self._device_path(node, scope)
        if path is not None:
            return self._path_fn(*path), False
        operand, const = self.compile(node.operand, scope)
        name = node.field
        if node.optional:
            return (lambda st: ops.optional_select(operand(st), name)), const
        if isinstance(node.operand, ast.Ident) and node.operand.name == "device" and "device" not in scope:
            return (lambda st: getattr(st.device, name)), False
        return (lambda st: ops.select(operand(st), name)), const

    @staticmethod
    def _path_fn(kind: str, domain: str, key: str) -> Fn:
        missing = f"no such key: {key}"
        if kind == "attributes":

            def attribute(st: State) -> Any:
                try:
                    return st.device.attributes[domain][key]
                except KeyError:
                    raise EvalError(missing) from None

            return attribute

        def capacity(st: State) -> Any:
            try:
                return st.device.capacity[domain][key]
            except KeyError:
                raise EvalError(missing) from None

        return capacity

    def _Index(self, node: ast.Index, scope: Scope) -> tuple[Fn, bool]:
        path = self._device_path(node, scope)
        if path is not None:
            return self._path_fn(*path), False
        operand, c1 = self.compile(node.operand, scope)
        key, c2 = self.compile(node.index, scope)
        if node.optional:
            return (lambda st: ops.optional_index(operand(st), key(st))), c1 and c2
        return (lambda st: ops.index(operand(st), key(st))), c1 and c2

    def _Has(self, node: ast.Has, scope: Scope) -> tuple[Fn, bool]:
        operand, const = self.compile(node.operand, scope)
        name = node.field
        return (lambda st: ops.has_field(operand(st), name)), const

    def _Call(self, node: ast.Call, scope: Scope) -> tuple[Fn, bool]:
        parts = ([node.target] if node.target is not None else []) + list(node.args)
        compiled = [self.compile(p, scope) for p in parts]
        static = [self.notes.type_of(p) for p in parts]
        candidates: tuple[Overload, ...] = self.notes.overloads[id(node)]
        fn = compile_call(node.function, candidates, [f for f, _ in compiled], static)
        return fn, all(c for _, c in compiled)

    def _ListLit(self, node: ast.ListLit, scope: Scope) -> tuple[Fn, bool]:
        compiled = [self.compile(item, scope) for item in node.items]
        fns = tuple(f for f, _ in compiled)
        optional = frozenset(node.optional)
        if not optional:
            return (lambda st: tuple(f(st) for f in fns)), all(c for _, c in compiled)

        def build(st: State) -> tuple[Any, ...]:
            out = []
            for i, f in enumerate(fns):
                value = f(st)
                if i in optional:
                    if type(value) is not Optional:
                        raise ops.no_overload("optional list element", value)
                    if not value.has_value:
                        continue
                    value = value.value
                out.append(value)
            return tuple(out)

        return build, all(c for _, c in compiled)

    def _MapLit(self, node: ast.MapLit, scope: Scope) -> tuple[Fn, bool]:
        compiled = [(self.compile(k, scope), self.compile(v, scope)) for k, v in node.entries]
        entries = tuple((k[0], v[0]) for k, v in compiled)
        optional = frozenset(node.optional)

        def build(st: State) -> dict[Any, Any]:
            out: dict[Any, Any] = {}
            for i, (key_fn, value_fn) in enumerate(entries):
                key = key_fn(st)
                if type(key) not in (str, int, bool) and not isinstance(key, int):
                    raise EvalError(f"unsupported key type: {type(key).__name__}")
                value = value_fn(st)
                if i in optional:
                    if type(value) is not Optional:
                        raise ops.no_overload("optional map entry", value)
                    if not value.has_value:
                        continue
                    value = value.value
                if key in out:
                    raise EvalError(f"Failed with repeated key: {key}")
                out[key] = value
            return out

        return build, all(k[1] and v[1] for k, v in compiled)

    def _Comprehension(self, node: ast.Comprehension, scope: Scope) -> tuple[Fn, bool]:
        rng, _ = self.compile(node.range, scope)
        slot = self._new_slot()
        inner = {**scope, node.var: (slot, False)}
        slot2 = None
        if node.var2 is not None:
            slot2 = self._new_slot()
            inner[node.var2] = (slot2, False)
        body, _ = self.compile(node.body, inner)
        pred = self.compile(node.pred, inner)[0] if node.pred is not None else None
        step = 2 + node_count(node.body) + (node_count(node.pred) if node.pred is not None else 0)
        if slot2 is not None:
            return compile_two_var(node.kind, rng, (slot, slot2), body, pred, step), False
        return compile_comprehension(node.kind, rng, slot, body, pred, step), False

    def _Bind(self, node: ast.Bind, scope: Scope) -> tuple[Fn, bool]:
        init, _ = self.compile(node.init, scope)
        slot = self._new_slot()
        body, _ = self.compile(node.body, {**scope, node.var: (slot, True)})

        def bind(st: State) -> Any:
            st.slots[slot] = _Lazy(init)
            return body(st)

        return bind, False

    def _And(self, node: ast.And, scope: Scope) -> tuple[Fn, bool]:
        return self._junction(node.left, node.right, scope, stop_on=False, name="_&&_")

    def _Or(self, node: ast.Or, scope: Scope) -> tuple[Fn, bool]:
        return self._junction(node.left, node.right, scope, stop_on=True, name="_||_")

    def _junction(self, left_node: ast.Node, right_node: ast.Node, scope: Scope, *, stop_on: bool,
                  name: str) -> tuple[Fn, bool]:
        """`&&` (decided by false) and `||` (decided by true), commutative over errors as
        in cel-go: an error on one side is absorbed when the other side decides."""
        left, c1 = self.compile(left_node, scope)
        right, c2 = self.compile(right_node, scope)
        # Compared by identity with untyped results; kept apart from the bools returned.
        decisive: object = stop_on
        other: object = not stop_on

        def junction(st: State) -> bool:
            try:
                a = left(st)
            except EvalError as exc:
                a = exc
            if a is decisive:
                return stop_on
            b = right(st)  # errors on the right propagate unless the left decided
            if b is decisive:
                return stop_on
            if a is other and b is other:
                return not stop_on
            raise a if isinstance(a, EvalError) else ops.no_overload(name, a, b)

        return junction, c1 and c2

    def _Not(self, node: ast.Not, scope: Scope) -> tuple[Fn, bool]:
        operand, const = self.compile(node.operand, scope)

        def not_(st: State) -> bool:
            value = operand(st)
            if type(value) is not bool:
                raise ops.no_overload("!_", value)
            return not value

        return not_, const

    def _Neg(self, node: ast.Neg, scope: Scope) -> tuple[Fn, bool]:
        operand, const = self.compile(node.operand, scope)
        return (lambda st: ops.negate(operand(st))), const

    def _Cond(self, node: ast.Cond, scope: Scope) -> tuple[Fn, bool]:
        cond, c1 = self.compile(node.condition, scope)
        then, c2 = self.compile(node.then, scope)
        other, c3 = self.compile(node.otherwise, scope)

        def choose(st: State) -> Any:
            flag = cond(st)
            if flag is True:
                return then(st)
            if flag is False:
                return other(st)
            raise ops.no_overload("_?_:_", flag)

        return choose, c1 and c2 and c3

    def _Binary(self, node: ast.Binary, scope: Scope) -> tuple[Fn, bool]:
        left, c1 = self.compile(node.left, scope)
        right, c2 = self.compile(node.right, scope)
        if node.op in ast.COMPARISONS and not ast.uncharged_comparison(node):
            return _charged_comparison(node.op, left, right), c1 and c2
        return _binary(node.op, left, right), c1 and c2


_SIZED = frozenset((str, bytes, tuple, dict, ops.DomainMap))


def _not_equal(a: Any, b: Any) -> bool:
    return not cel_equal(a, b)


_VALUE_COMPARE = {"==": cel_equal, "!=": _not_equal, "<": ops.less, "<=": ops.less_equal, ">": ops.greater,
                  ">=": ops.greater_equal}


def _charged_comparison(op: str, left: Fn, right: Fn) -> Fn:
    """Charge a comparison of two computed values by their size before comparing
    (cel-go runtimecost.go charges `_==_` and string ordering by the smaller operand)."""
    compare = _VALUE_COMPARE[op]

    def charged(st: State) -> Any:
        a, b = left(st), right(st)
        if type(a) in _SIZED:
            charge(st, ops.comparison_cost(a, b, st.limit - st.cost))
        return compare(a, b)

    return charged


def _binary(op: str, left: Fn, right: Fn) -> Fn:
    if op == "==":
        return lambda st: cel_equal(left(st), right(st))
    if op == "!=":
        return lambda st: not cel_equal(left(st), right(st))
    if op == "<":
        return lambda st: ops.less(left(st), right(st))
    if op == "<=":
        return lambda st: ops.less_equal(left(st), right(st))
    if op == ">":
        return lambda st: ops.greater(left(st), right(st))
    if op == ">=":
        return lambda st: ops.greater_equal(left(st), right(st))
    if op == "in":

        def member(st: State) -> bool:
            item, container = left(st), right(st)
            if type(container) is tuple:
                # every element is compared with the item, which may itself be a list
                cap = st.limit - st.cost
                charge(st, len(container) * max(1, ops.elements(item, cap)) // 10)
            return ops.contains(container, item)

        return member
    if op == "+":

        def plus(st: State) -> Any:
            a, b = left(st), right(st)
            cost = ops.concat_cost(a, b)
            if cost:
                charge(st, cost)
            return ops.add(a, b)

        return plus
    arithmetic = {"-": ops.subtract, "*": ops.multiply, "/": ops.divide, "%": ops.modulo}[op]
    return lambda st: arithmetic(left(st), right(st))
