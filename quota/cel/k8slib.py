"""The Kubernetes quantity and semver CEL libraries and DRA's `includes`, registered
into `quota.cel.library.REGISTRY` on import.

Follows k/k staging/src/k8s.io/apiserver/pkg/cel/library/quantity.go (quantity,
isQuantity, sign, isGreaterThan, isLessThan, compareTo, add, sub, mul, div, divInt,
isInteger, asInteger, asApproximateFloat) and semverlib.go version 1 (semver and
isSemver with the optional normalize flag, major/minor/patch, comparisons). Quantities
are exact fractions parsed by `quota.values.quantity.parse_quantity`; the grammar check in
front of it reproduces apimachinery's two error messages. `includes` and `asList` are
the DRA helpers for list-typed attributes (dynamic-resource-allocation/cel,
DRAListTypeAttributes).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from quota.cel.library import check_int, register
from quota.cel.values import (
    INT64_MAX,
    INT64_MIN,
    EvalError,
    Quantity,
    Semver,
    cel_equal,
    normalize_and_parse_semver,
    parse_semver,
)
from quota.values.quantity import QuantityError, parse_quantity

# apimachinery resource/quantity.go: the first, purely syntactic check of ParseQuantity.
_QUANTITY_SHAPE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SHAPE_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def parse_cel_quantity(text: str) -> Quantity:
    """resource.ParseQuantity as the quantity() function reports it."""
    if not text or not _QUANTITY_SHAPE.match(text):
        raise EvalError(_SHAPE_ERROR)
    try:
        return Quantity(parse_quantity(text))
    except QuantityError:
        raise EvalError("unable to parse quantity's suffix") from None


@register("quantity", "string -> kubernetes.Quantity")
def _quantity(text: str) -> Quantity:
    return parse_cel_quantity(text)


@register("isQuantity", "string -> bool")
def _is_quantity(text: str) -> bool:
    try:
        parse_cel_quantity(text)
    except EvalError:
        return False
    return True


# quantity.go declares `sign` as a global overload; the receiver form is accepted too.
@register("sign", "kubernetes.Quantity -> int")
@register("sign", "kubernetes.Quantity -> int", member=True)
def _sign(q: Quantity) -> int:
    return (q.value > 0) - (q.value < 0)


@register("isGreaterThan", "kubernetes.Quantity, kubernetes.Quantity -> bool", member=True)
def _q_greater(a: Quantity, b: Quantity) -> bool:
    return a.cmp > b.cmp


@register("isLessThan", "kubernetes.Quantity, kubernetes.Quantity -> bool", member=True)
def _q_less(a: Quantity, b: Quantity) -> bool:
    return a.cmp < b.cmp


@register("compareTo", "kubernetes.Quantity, kubernetes.Quantity -> int", member=True)
def _q_compare(a: Quantity, b: Quantity) -> int:
    x, y = a.cmp, b.cmp
    return (x > y) - (x < y)


@register("add", "kubernetes.Quantity, kubernetes.Quantity -> kubernetes.Quantity", member=True)
@register("add", "kubernetes.Quantity, int -> kubernetes.Quantity", member=True)
def _q_add(a: Quantity, b: Quantity | int) -> Quantity:
    return Quantity(a.value + (b.value if isinstance(b, Quantity) else b))


@register("sub", "kubernetes.Quantity, kubernetes.Quantity -> kubernetes.Quantity", member=True)
@register("sub", "kubernetes.Quantity, int -> kubernetes.Quantity", member=True)
def _q_sub(a: Quantity, b: Quantity | int) -> Quantity:
    return Quantity(a.value - (b.value if isinstance(b, Quantity) else b))


@register("mul", "kubernetes.Quantity, int -> kubernetes.Quantity", member=True)
def _q_mul(a: Quantity, b: int) -> Quantity:
    return Quantity(a.value * b)


def _divisor(b: int) -> int:
    if b == 0:
        raise EvalError("division by zero error")
    return b


@register("div", "kubernetes.Quantity, int -> kubernetes.Quantity", member=True)
def _q_div(a: Quantity, b: int, digits: int = 4) -> Quantity:
    # QuoRound(denominator, digits): round half away from zero to `digits` decimals.
    if digits < 0 or digits > 10:
        raise EvalError(f"the valid range for roundVal is 0 to 10 but {digits} was passed")
    exact = a.value / _divisor(b)
    scaled = abs(exact) * 10**digits
    rounded = math.floor(scaled + Fraction(1, 2))
    return Quantity(Fraction(rounded, 10**digits) * (1 if exact >= 0 else -1))


register("div", "kubernetes.Quantity, int, int -> kubernetes.Quantity", member=True)(_q_div)


@register("divInt", "kubernetes.Quantity, int -> kubernetes.Quantity", member=True)
def _q_div_int(a: Quantity, b: int) -> Quantity:
    exact = a.value / _divisor(b)
    return Quantity(Fraction(math.trunc(exact)))


def _as_int64(q: Quantity) -> int | None:
    # resource.Quantity.AsInt64: only whole values that fit in int64 convert.
    if q.value.denominator != 1 or not INT64_MIN <= q.value.numerator <= INT64_MAX:
        return None
    return q.value.numerator


@register("isInteger", "kubernetes.Quantity -> bool", member=True)
def _q_is_integer(q: Quantity) -> bool:
    return _as_int64(q) is not None


@register("asInteger", "kubernetes.Quantity -> int", member=True)
def _q_as_integer(q: Quantity) -> int:
    value = _as_int64(q)
    if value is None:
        raise EvalError("cannot convert value to integer")
    return value


@register("asApproximateFloat", "kubernetes.Quantity -> double", member=True)
def _q_as_float(q: Quantity) -> float:
    try:
        return float(q.value)
    except OverflowError:
        return math.inf if q.value > 0 else -math.inf


# --- semver (semverlib.go, version 1 as base.go enables it) -------------------------


@register("semver", "string -> kubernetes.Semver")
def _semver(text: str, normalize: bool = False) -> Semver:
    return normalize_and_parse_semver(text) if normalize else parse_semver(text)


register("semver", "string, bool -> kubernetes.Semver")(_semver)


@register("isSemver", "string -> bool")
def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        _semver(text, normalize)
    except EvalError:
        return False
    return True


register("isSemver", "string, bool -> bool")(_is_semver)


@register("major", "kubernetes.Semver -> int", member=True)
def _major(v: Semver) -> int:
    return check_int(v.major)


@register("minor", "kubernetes.Semver -> int", member=True)
def _minor(v: Semver) -> int:
    return check_int(v.minor)


@register("patch", "kubernetes.Semver -> int", member=True)
def _patch(v: Semver) -> int:
    return check_int(v.patch)


@register("isGreaterThan", "kubernetes.Semver, kubernetes.Semver -> bool", member=True)
def _v_greater(a: Semver, b: Semver) -> bool:
    return a.compare(b) == 1


@register("isLessThan", "kubernetes.Semver, kubernetes.Semver -> bool", member=True)
def _v_less(a: Semver, b: Semver) -> bool:
    return a.compare(b) == -1


@register("compareTo", "kubernetes.Semver, kubernetes.Semver -> int", member=True)
def _v_compare(a: Semver, b: Semver) -> int:
    return a.compare(b)


# --- includes (DRA list-typed attributes) -------------------------------------------

# resourceapi.ResourceSliceMaxAttributeValuesPerDevice: the scheduler refuses longer lists.
MAX_LIST_ATTRIBUTE_VALUES = 48


@register("includes", "dyn, dyn -> bool", member=True, cost=lambda *_: MAX_LIST_ATTRIBUTE_VALUES)
def _includes(attribute: Any, value: Any) -> bool:
    if type(attribute) is tuple:
        if len(attribute) > MAX_LIST_ATTRIBUTE_VALUES:
            raise EvalError(
                f"'includes' function cannot be applied to lists longer than {MAX_LIST_ATTRIBUTE_VALUES} values"
            )
        return any(cel_equal(item, value) for item in attribute)
    return cel_equal(attribute, value)


# Newer scheduler code (1.38 development) adds `asList()` so that a list-typed attribute
# and a scalar one can be iterated alike; harmless to offer: scalar -> [scalar].
@register("asList", "dyn -> list(dyn)", member=True)
def _as_list(attribute: Any) -> tuple[Any, ...]:
    return attribute if type(attribute) is tuple else (attribute,)
