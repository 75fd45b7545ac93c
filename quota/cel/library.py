"""The function registry and CEL's standard functions, conversions and optionals.

Every function the DRA environment knows is an `Overload` here: its name, whether it
is a method, its parameter and result types (`quota.cel.types` syntax) and the
implementation over `quota.cel.values`. `quota.cel.checker` resolves calls against the
registry at compile time; `quota.cel.evaluator` calls the chosen implementations.
The Kubernetes and extension libraries register themselves from
`quota.cel.extlib` (strings, lists, regex, sets), `quota.cel.strformat` (format),
`quota.cel.k8slib` (quantity, semver, includes, asList) and `quota.cel.netlib` (IP,
CIDR); `quota.cel.checker` imports them all. Implementations raise `EvalError` with
cel-go's wording.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from quota.cel.types import T, parse_type
from quota.cel.values import (
    INT64_MAX,
    INT64_MIN,
    OPTIONAL_NONE,
    UINT64_MAX,
    CelType,
    EvalError,
    Optional,
    Uint,
    go_parse_float,
    type_name,
)

Impl = Callable[..., Any]
Cost = Callable[..., int]
F = TypeVar("F", bound=Impl)


@dataclass(frozen=True, slots=True)
class Overload:
    name: str
    member: bool
    params: tuple[T, ...]  # the receiver first for methods
    result: T
    impl: Impl
    # Extra runtime cost from argument sizes (cel-go charges traversals by length).
    cost: Cost | None = None


REGISTRY: dict[str, list[Overload]] = {}


def register(name: str, signature: str, *, member: bool = False, cost: Cost | None = None) -> Callable[[F], F]:
    """Decorator: `@register("size", "string -> int", member=True)`."""
    params_text, _, result_text = signature.partition("->")
    params = tuple(parse_type(p) for p in _split_params(params_text))
    result = parse_type(result_text)

    def add(impl: F) -> F:
        REGISTRY.setdefault(name, []).append(Overload(name, member, params, result, impl, cost))
        return impl

    return add


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def scan_cost(value: Any, *_: Any) -> int:
    """Cost of one pass over a string, bytes or list: a tenth of its length, as cel-go."""
    return len(value) // 10 if isinstance(value, (str, bytes, tuple, dict)) else 0


def check_int(value: int) -> int:
    if value < INT64_MIN or value > INT64_MAX:
        raise EvalError("integer overflow")
    return value


def check_uint(value: int) -> Uint:
    if value < 0 or value > UINT64_MAX:
        raise EvalError("unsigned integer overflow")
    return Uint(value)


# --- size and string predicates (cel-spec standard definitions) ---------------------

for _sig in ("string -> int", "bytes -> int", "list(A) -> int", "map(A, B) -> int"):
    register("size", _sig)(len)
    register("size", _sig, member=True)(len)


@register("contains", "string, string -> bool", member=True, cost=scan_cost)
def _contains(s: str, sub: str) -> bool:
    return sub in s


@register("startsWith", "string, string -> bool", member=True, cost=scan_cost)
def _starts_with(s: str, prefix: str) -> bool:
    return s.startswith(prefix)


@register("endsWith", "string, string -> bool", member=True, cost=scan_cost)
def _ends_with(s: str, suffix: str) -> bool:
    return s.endswith(suffix)


# --- conversions ---------------------------------------------------------------------

_INT_TEXT = re.compile(r"^[+-]?[0-9]+$")


@register("int", "int -> int")
def _int_int(v: int) -> int:
    return v


@register("int", "uint -> int")
def _int_uint(v: Uint) -> int:
    if v > INT64_MAX:
        raise EvalError("range error converting uint to int")
    return int(v)


@register("int", "double -> int")
def _int_double(v: float) -> int:
    # cel-go rejects values that do not fit strictly inside the int64 range.
    if not math.isfinite(v) or v <= -9.223372036854776e18 or v >= 9.223372036854776e18:
        raise EvalError("range error converting double to int")
    return int(v)


# More digits than this (after leading zeros) cannot be a 64-bit value; checked before
# int(), which refuses more than 4300 digits with a ValueError of its own.
_MAX_DIGITS = 20


def _digits(v: str) -> int | None:
    body = v.lstrip("+-").lstrip("0")
    return int(v) if len(body) <= _MAX_DIGITS else None


@register("int", "string -> int", cost=scan_cost)
def _int_string(v: str) -> int:
    if not _INT_TEXT.match(v):
        raise EvalError(f'cannot convert string "{_shown(v)}" to int')
    value = _digits(v)
    if value is None or value < INT64_MIN or value > INT64_MAX:
        raise EvalError(f'cannot convert string "{_shown(v)}" to int: value out of range')
    return value


def _shown(v: str) -> str:
    """A converted string in an error message, cut short: it may be megabytes long."""
    return v if len(v) <= 64 else v[:64] + "..."


@register("uint", "uint -> uint")
def _uint_uint(v: Uint) -> Uint:
    return v


@register("uint", "int -> uint")
def _uint_int(v: int) -> Uint:
    if v < 0:
        raise EvalError("range error converting int to uint")
    return Uint(v)


@register("uint", "double -> uint")
def _uint_double(v: float) -> Uint:
    if not math.isfinite(v) or v < 0 or v >= 1.8446744073709552e19:
        raise EvalError("range error converting double to uint")
    return Uint(int(v))


@register("uint", "string -> uint", cost=scan_cost)
def _uint_string(v: str) -> Uint:
    value = _digits(v) if v.isascii() and v.isdigit() else None
    if value is None or value > UINT64_MAX:
        raise EvalError(f'cannot convert string "{_shown(v)}" to uint')
    return Uint(value)


@register("double", "double -> double")
def _double_double(v: float) -> float:
    return v


@register("double", "int -> double")
@register("double", "uint -> double")
def _double_int(v: int) -> float:
    return float(v)


@register("double", "string -> double", cost=scan_cost)
def _double_string(v: str) -> float:
    try:
        return go_parse_float(v)
    except ValueError:
        raise EvalError(f'cannot convert string "{_shown(v)}" to double') from None


@register("string", "string -> string")
def _string_string(v: str) -> str:
    return v


@register("string", "int -> string")
@register("string", "uint -> string")
def _string_int(v: int) -> str:
    return str(int(v))


@register("string", "bool -> string")
def _string_bool(v: bool) -> str:
    return "true" if v else "false"


@register("string", "double -> string")
def _string_double(v: float) -> str:
    return format_double(v)


@register("string", "bytes -> string", cost=scan_cost)
def _string_bytes(v: bytes) -> str:
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        raise EvalError("invalid UTF-8 in bytes, cannot convert to string") from None


@register("bytes", "bytes -> bytes")
def _bytes_bytes(v: bytes) -> bytes:
    return v


@register("bytes", "string -> bytes", cost=scan_cost)
def _bytes_string(v: str) -> bytes:
    return v.encode("utf-8")


_BOOL_TEXT = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
              "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


@register("bool", "bool -> bool")
def _bool_bool(v: bool) -> bool:
    return v


@register("bool", "string -> bool")
def _bool_string(v: str) -> bool:
    if v not in _BOOL_TEXT:
        raise EvalError(f'cannot convert string "{_shown(v)}" to bool')
    return _BOOL_TEXT[v]


@register("dyn", "A -> dyn")
def _dyn(v: Any) -> Any:
    return v


@register("type", "A -> type")
def _type(v: Any) -> CelType:
    return CelType(type_name(v))


def format_double(v: float) -> str:
    """Go's fmt %g (shortest digits, exponent form below 1e-4 or from 1e+06 on), which
    cel-go's Double.ConvertToType(StringType) uses for string(double)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1, v) < 0 else "0"
    sign, digits, exponent = Decimal(repr(v)).normalize().as_tuple()
    text = "".join(str(d) for d in digits)
    point = len(text) + int(exponent)  # position of the decimal point in `text`
    minus = "-" if sign else ""
    if point - 1 < -4 or point - 1 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        exp = point - 1
        return f"{minus}{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    if point <= 0:
        return f"{minus}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{minus}{text}{'0' * (point - len(text))}"
    return f"{minus}{text[:point]}.{text[point:]}"


# --- optionals (cel-go OptionalTypes) -----------------------------------------------


@register("optional.of", "A -> optional_type(A)")
def _optional_of(v: Any) -> Optional:
    return Optional(v)


@register("optional.ofNonZeroValue", "A -> optional_type(A)")
def _optional_of_non_zero(v: Any) -> Optional:
    # The zero value of each CEL type: null, false, 0, 0u, 0.0, "", b"", [], {}.
    zero = v is None or (type(v) in (bool, int, Uint, float, str, bytes, tuple) and not v) or (
        isinstance(v, dict) and not v)
    return OPTIONAL_NONE if zero else Optional(v)


@register("optional.none", " -> optional_type(dyn)")
def _optional_none() -> Optional:
    return OPTIONAL_NONE


@register("hasValue", "optional_type(A) -> bool", member=True)
def _has_value(o: Optional) -> bool:
    return o.has_value


@register("value", "optional_type(A) -> A", member=True)
def _value(o: Optional) -> Any:
    return o.value


@register("or", "optional_type(A), optional_type(A) -> optional_type(A)", member=True)
def _or(o: Optional, other: Optional) -> Optional:
    return o if o.has_value else other


@register("orValue", "optional_type(A), A -> A", member=True)
def _or_value(o: Optional, other: Any) -> Any:
    return o.value if o.has_value else other
