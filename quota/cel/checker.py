"""Compile-time checking: names, static types and overload choice, as cel-go's checker.

Walks `quota.cel.ast` nodes with a scope of local variables and the declared `device`
variable (k/k dynamic-resource-allocation/cel/compile.go: object `kubernetes.DRADevice`
with driver, attributes, capacity, allowMultipleAllocations), and reports the errors
the API server reports at compile time: undeclared references, undefined fields, no
matching overload, heterogeneous literals, and a result that is not bool. It returns
`Annotations`: the static type of every node and the overload candidates of every
call, which `quota.cel.evaluator` uses to compile calls without runtime searching.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quota.cel import ast
from quota.cel import extlib as _extlib  # noqa: F401 - registers the extension libraries
from quota.cel import k8slib as _k8slib  # noqa: F401 - registers quantity/semver/includes
from quota.cel import netlib as _netlib  # noqa: F401 - registers the IP and CIDR libraries
from quota.cel import strformat as _strformat  # noqa: F401 - registers string.format
from quota.cel import timelib as _timelib  # noqa: F401 - registers timestamps and durations
from quota.cel.extlib import compile_regex
from quota.cel.library import REGISTRY, Overload
from quota.cel.timelib import parse_duration, parse_timestamp
from quota.cel.types import (
    BOOL,
    BYTES,
    DEVICE,
    DOUBLE,
    DYN,
    INT,
    MAP_DYN,
    NULL,
    QUANTITY,
    STRING,
    TYPE,
    UINT,
    T,
    assignable,
    join,
    qualified_name,
)
from quota.cel.values import INT64_MAX, EvalError, Uint
from quota.values.work import pause_point

__all__ = ["Annotations", "CheckProblem", "check", "DEVICE_FIELDS"]

DEVICE_FIELDS: dict[str, T] = {
    "driver": STRING,
    "attributes": T("map", (STRING, T("map", (STRING, DYN)))),
    "capacity": T("map", (STRING, T("map", (STRING, QUANTITY)))),
    "allowMultipleAllocations": BOOL,
}
TYPE_IDENTS = frozenset(
    "int uint double bool string bytes list map null_type type optional_type".split()
)

# Valid in the Kubernetes environment, not implemented here (listed in README.md).
UNSUPPORTED = {
    "url": "the URL library", "isURL": "the URL library",
}
_NUMERIC = ("int", "uint", "double")
_TS, _DUR = "google.protobuf.Timestamp", "google.protobuf.Duration"
_ORDERED = ("int", "uint", "double", "string", "bytes", "bool", _TS, _DUR)
# Time arithmetic (cel-spec): the result type of each allowed (op, left, right).
_TIME_ARITHMETIC = {
    ("+", _TS, _DUR): _TS, ("+", _DUR, _TS): _TS, ("+", _DUR, _DUR): _DUR,
    ("-", _TS, _TS): _DUR, ("-", _TS, _DUR): _TS, ("-", _DUR, _DUR): _DUR,
}


class CheckProblem(Exception):
    def __init__(self, message: str, pos: tuple[int, int] = (1, 1)) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


@dataclass
class Annotations:
    types: dict[int, T] = field(default_factory=dict)
    overloads: dict[int, tuple[Overload, ...]] = field(default_factory=dict)

    def type_of(self, node: ast.Node) -> T:
        return self.types.get(id(node), DYN)


def check(root: ast.Node) -> Annotations:
    """Check an expression; raise CheckProblem; the result must be bool or dyn."""
    notes = Annotations()
    result = _Checker(notes).visit(root, {})
    if result not in (BOOL, DYN):
        raise CheckProblem(f"must evaluate to bool or the unknown type, not {result}")
    return notes


def _overload_text(name: str, target: T | None, args: list[T]) -> str:
    inner = ", ".join(str(a) for a in args)
    return f"found no matching overload for '{name}' applied to '{target}.({inner})'" if target else (
        f"found no matching overload for '{name}' applied to '({inner})'"
    )


class _Checker:
    def __init__(self, notes: Annotations) -> None:
        self.notes = notes
        self.exempt: set[int] = set()  # list literals the homogeneity rule skips

    def visit(self, node: ast.Node, scope: dict[str, T]) -> T:
        pause_point()
        result: T = getattr(self, "_" + type(node).__name__)(node, scope)
        self.notes.types[id(node)] = result
        return result

    def _Lit(self, node: ast.Lit, scope: dict[str, T]) -> T:
        value = node.value
        if type(value) is int and value > INT64_MAX:
            raise CheckProblem("invalid int literal")
        return {bool: BOOL, int: INT, Uint: UINT, float: DOUBLE, str: STRING, bytes: BYTES}.get(type(value), NULL)

    def _Ident(self, node: ast.Ident, scope: dict[str, T]) -> T:
        if node.name in scope:
            return scope[node.name]
        if node.name == "device":
            return DEVICE
        if node.name in TYPE_IDENTS:
            return TYPE
        raise CheckProblem(f"undeclared reference to '{node.name}' (in container '')", node.pos)

    def _Select(self, node: ast.Select, scope: dict[str, T]) -> T:
        if qualified_name(node, scope) is not None:
            return TYPE
        operand = self.visit(node.operand, scope)
        result = self._field_type(operand, node.field, node.pos)
        if node.optional and result.name != "optional_type":
            return T("optional_type", (result,))
        return result

    def _field_type(self, operand: T, name: str, pos: tuple[int, int]) -> T:
        if operand == DEVICE:
            if name not in DEVICE_FIELDS:
                raise CheckProblem(f"undefined field '{name}'", pos)
            return DEVICE_FIELDS[name]
        if operand.name == "map":
            return operand.param(1)
        if operand.name == "optional_type":
            return T("optional_type", (self._field_type(operand.param(0), name, pos),))
        if operand.is_dyn:
            return DYN
        raise CheckProblem(f"type '{operand}' does not support field selection", pos)

    def _Index(self, node: ast.Index, scope: dict[str, T]) -> T:
        operand = self.visit(node.operand, scope)
        index = self.visit(node.index, scope)
        result = self._element_type(operand, index, node.pos)
        if node.optional and result.name != "optional_type":
            return T("optional_type", (result,))
        return result

    def _element_type(self, operand: T, index: T, pos: tuple[int, int]) -> T:
        if operand.name == "list" and (index.is_dyn or index.name in ("int", "uint")):
            return operand.param(0)
        if operand.name == "map" and assignable(operand.param(0), index):
            return operand.param(1)
        if operand.name == "optional_type":
            return T("optional_type", (self._element_type(operand.param(0), index, pos),))
        if operand.is_dyn:
            return DYN
        raise CheckProblem(_overload_text("_[_]", None, [operand, index]), pos)

    def _Has(self, node: ast.Has, scope: dict[str, T]) -> T:
        self._field_type(self.visit(node.operand, scope), node.field, node.pos)
        return BOOL

    def _Call(self, node: ast.Call, scope: dict[str, T]) -> T:
        name = node.function
        target = self.visit(node.target, scope) if node.target is not None else None
        if name not in REGISTRY:  # before the arguments: a macro's variables are not declared
            if name in UNSUPPORTED or name.startswith("format."):
                what = UNSUPPORTED.get(name, "the format library")
                raise CheckProblem(
                    f"'{name}' ({what}) is valid in Kubernetes but not supported by dra-quota's CEL evaluator", node.pos
                )
            raise CheckProblem(f"undeclared reference to '{name}' (in container '')", node.pos)
        if name == "format":
            # cel-go exempts format()'s argument list from HomogeneousAggregateLiterals
            # (ext/strings.go registers it as an exempt function): `["a", 1]` is fine there.
            self.exempt.update(id(a) for a in node.args if isinstance(a, ast.ListLit))
        args = [self.visit(a, scope) for a in node.args]
        given = ([target] if target is not None else []) + args
        candidates = tuple(
            o for o in REGISTRY[name]
            if o.member == (target is not None) and len(o.params) == len(given)
            and all(assignable(p, a) for p, a in zip(o.params, given))
        )
        if not candidates:
            raise CheckProblem(_overload_text(name, target, args), node.pos)
        if name == "matches":
            _validate_regex_literal(node)
        if name in ("timestamp", "duration"):
            _validate_time_literal(node)
        self.notes.overloads[id(node)] = candidates
        result = _instantiate(candidates[0], given)
        for other in candidates[1:]:
            result = join(result, _instantiate(other, given))
        return result

    def _ListLit(self, node: ast.ListLit, scope: dict[str, T]) -> T:
        elem: T | None = None
        exempt = id(node) in self.exempt
        for i, item in enumerate(node.items):
            item_type = self.visit(item, scope)
            if i in node.optional:
                item_type = _unwrap_optional(item_type)
            elem = join(elem, item_type) if exempt and elem is not None else _homogeneous(elem, item_type)
        return T("list", (elem or DYN,))

    def _MapLit(self, node: ast.MapLit, scope: dict[str, T]) -> T:
        key_type: T | None = None
        value_type: T | None = None
        for i, (key, value) in enumerate(node.entries):
            k = self.visit(key, scope)
            if not (k.is_dyn or k.name in ("int", "uint", "bool", "string")):
                raise CheckProblem(f"unsupported map key type: {k}")
            v = self.visit(value, scope)
            key_type = _homogeneous(key_type, k)
            value_type = _homogeneous(value_type, _unwrap_optional(v) if i in node.optional else v)
        return T("map", (key_type or DYN, value_type or DYN))

    def _Comprehension(self, node: ast.Comprehension, scope: dict[str, T]) -> T:
        rng = self.visit(node.range, scope)
        if node.kind in ("optMap", "optFlatMap"):
            return self._optional_macro(node, rng, scope)
        if rng.name == "list":
            first, second = (INT, rng.param(0)) if node.var2 is not None else (rng.param(0), DYN)
        elif rng.name == "map":
            first, second = rng.param(0), rng.param(1)
        elif rng.is_dyn:
            first, second = DYN, DYN
        else:
            raise CheckProblem(
                f"expression of type '{rng}' cannot be range of a comprehension (must be list, map, or dynamic)", node.pos
            )
        inner = {**scope, node.var: first}
        if node.var2 is not None:
            inner[node.var2] = second
        body = self.visit(node.body, inner)
        if node.pred is not None:
            self._expect_bool(self.visit(node.pred, inner), node.kind, node.pos)
        if node.kind in ("map", "transformList"):
            return T("list", (body,))
        if node.kind == "sortBy":
            return T("list", (first,))
        if node.kind == "transformMap":
            return T("map", (first, body))
        if node.kind == "transformMapEntry":
            return body if body.name == "map" else MAP_DYN
        self._expect_bool(body, node.kind, node.pos)
        return T("list", (first,)) if node.kind == "filter" else BOOL

    def _optional_macro(self, node: ast.Comprehension, rng: T, scope: dict[str, T]) -> T:
        # cel-go OptionalTypes macros: opt.optMap(v, expr), opt.optFlatMap(v, optExpr).
        if not (rng.is_dyn or rng.name == "optional_type"):
            raise CheckProblem(_overload_text(node.kind, rng, []), node.pos)
        body = self.visit(node.body, {**scope, node.var: rng.param(0)})
        if node.kind == "optMap":
            return T("optional_type", (body,))
        if not (body.is_dyn or body.name == "optional_type"):
            raise CheckProblem(_overload_text(node.kind, rng, [body]), node.pos)
        return body

    def _Bind(self, node: ast.Bind, scope: dict[str, T]) -> T:
        return self.visit(node.body, {**scope, node.var: self.visit(node.init, scope)})

    def _expect_bool(self, t: T, what: str, pos: tuple[int, int] = (1, 1)) -> None:
        if t not in (BOOL, DYN):
            raise CheckProblem(_overload_text(what, None, [t]), pos)

    def _And(self, node: ast.And, scope: dict[str, T]) -> T:
        return self._logic("_&&_", node.left, node.right, scope)

    def _Or(self, node: ast.Or, scope: dict[str, T]) -> T:
        return self._logic("_||_", node.left, node.right, scope)

    def _logic(self, op: str, left: ast.Node, right: ast.Node, scope: dict[str, T]) -> T:
        types = [self.visit(left, scope), self.visit(right, scope)]
        if any(t not in (BOOL, DYN) for t in types):
            raise CheckProblem(_overload_text(op, None, types))
        return BOOL

    def _Not(self, node: ast.Not, scope: dict[str, T]) -> T:
        self._expect_bool(self.visit(node.operand, scope), "!_")
        return BOOL

    def _Neg(self, node: ast.Neg, scope: dict[str, T]) -> T:
        operand = self.visit(node.operand, scope)
        if not (operand.is_dyn or operand.name in ("int", "double")):
            raise CheckProblem(_overload_text("-_", None, [operand]), node.pos)
        return operand

    def _Cond(self, node: ast.Cond, scope: dict[str, T]) -> T:
        self._expect_bool(self.visit(node.condition, scope), "_?_:_")
        return join(self.visit(node.then, scope), self.visit(node.otherwise, scope))

    def _Binary(self, node: ast.Binary, scope: dict[str, T]) -> T:
        left = self.visit(node.left, scope)
        right = self.visit(node.right, scope)
        op = node.op
        dyn = left.is_dyn or right.is_dyn
        fail = CheckProblem(_overload_text(f"_{op}_" if op != "in" else "@in", None, [left, right]), node.pos)
        if op in ("==", "!="):
            if not dyn and NULL not in (left, right) and not assignable(left, right):
                raise fail
            return BOOL
        if op in ("<", "<=", ">", ">="):
            numeric = left.name in _NUMERIC and right.name in _NUMERIC
            if not (dyn or numeric or (left.name == right.name and left.name in _ORDERED)):
                raise fail
            return BOOL
        if op == "in":
            if right.name == "list" and assignable(right.param(0), left):
                return BOOL
            if right.name == "map" and assignable(right.param(0), left):
                return BOOL
            if right.is_dyn:
                return BOOL
            raise fail
        timed = _TIME_ARITHMETIC.get((op, left.name, right.name))
        if timed is not None:
            return T(timed)
        if not dyn and (left.name in (_TS, _DUR) or right.name in (_TS, _DUR)):
            raise fail  # any other mix of times, e.g. timestamp + timestamp
        allowed = {"+": ("int", "uint", "double", "string", "bytes", "list", _TS, _DUR), "-": (*_NUMERIC, _TS, _DUR),
                   "*": _NUMERIC, "/": _NUMERIC, "%": ("int", "uint")}[op]
        if dyn:
            concrete = right if left.is_dyn else left
            if not concrete.is_dyn and concrete.name not in allowed:
                raise fail
            return concrete if not concrete.is_dyn and concrete.name not in (_TS, _DUR) else DYN
        if left.name != right.name or left.name not in allowed:
            raise fail
        return join(left, right)


def _validate_regex_literal(node: ast.Call) -> None:
    # cel.ValidateRegexLiterals (base.go, 1.29): a literal pattern must compile.
    pattern = node.args[-1] if node.args else None
    if isinstance(pattern, ast.Lit) and type(pattern.value) is str:
        try:
            compile_regex(pattern.value)
        except EvalError as exc:
            if str(exc).startswith("invalid regular expression"):  # not the fallback's risk refusal
                raise CheckProblem("invalid matches argument", node.pos) from None


def _validate_time_literal(node: ast.Call) -> None:
    # cel.ValidateTimestampLiterals / ValidateDurationLiterals (base.go, 1.29).
    argument = node.args[0] if len(node.args) == 1 else None
    if isinstance(argument, ast.Lit) and type(argument.value) is str:
        parse = parse_timestamp if node.function == "timestamp" else parse_duration
        try:
            parse(argument.value)
        except EvalError:
            raise CheckProblem(f"invalid {node.function} argument", node.pos) from None


def _unwrap_optional(t: T) -> T:
    return t.param(0) if t.name == "optional_type" else DYN if t.is_dyn else t


def _homogeneous(current: T | None, new: T) -> T:
    # cel.HomogeneousAggregateLiterals (base.go): literal elements must share one type.
    if current is None:
        return new
    if current.is_dyn or new.is_dyn:
        return DYN
    if not assignable(current, new):
        raise CheckProblem(f"expected type '{current}' but found '{new}'")
    return join(current, new)


def _instantiate(overload: Overload, given: list[T]) -> T:
    """Bind the overload's type parameters from the arguments, then its result."""
    bindings: dict[str, T] = {}

    def bind(param: T, arg: T) -> None:
        if len(param.name) == 1 and param.name not in bindings and not arg.is_dyn:
            bindings[param.name] = arg
        for p, a in zip(param.params, arg.params):
            bind(p, a)

    for param, arg in zip(overload.params, given):
        bind(param, arg)

    def subst(t: T) -> T:
        if len(t.name) == 1:
            return bindings.get(t.name, DYN)
        return T(t.name, tuple(subst(p) for p in t.params)) if t.params else t

    return subst(overload.result)


__all__ += ["TYPE", "UNSUPPORTED"]
