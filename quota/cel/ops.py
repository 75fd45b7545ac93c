"""CEL operators over runtime values: arithmetic, ordering, membership, selection.

The operator half of cel-go's standard library (cel-spec langdef "Standard
definitions"), with int64/uint64 overflow errors, Go's truncating division, cross-type
numeric ordering (base.go enables CrossTypeNumericComparisons) and CEL map semantics:
`no such key` for a missing key, and the DRA domain maps' "unknown domain is an empty
map" (compile.go newStringInterfaceMapWithDefault) via `DomainMap`. Used by
`quota.cel.evaluator`; `quota.cel.activation` builds the `DeviceActivation` defined here.
"""

from __future__ import annotations

import math
from typing import Any, Final

from quota.cel.library import check_int, check_uint
from quota.cel.timelib import Duration, Timestamp
from quota.cel.values import INT64_MIN, OPTIONAL_NONE, EvalError, Optional, Uint, cel_equal, type_name

EMPTY: Final[dict[str, Any]] = {}


class DomainMap(dict[str, Any]):
    """`device.attributes` / `device.capacity`: an unknown domain reads as an empty map."""

    __slots__ = ()

    def __missing__(self, key: str) -> dict[str, Any]:
        return EMPTY


class DeviceActivation:
    """The `device` variable (object type kubernetes.DRADevice in compile.go), built
    once per device by `quota.cel.activation.device_activation`. `error` is set when
    the device cannot be presented to CEL at all (compile.go fails every match then)."""

    __slots__ = ("driver", "attributes", "capacity", "allowMultipleAllocations", "error")
    cel_type_name = "kubernetes.DRADevice"

    def __init__(
        self, driver: str, attributes: DomainMap, capacity: DomainMap, allow_multiple: bool, error: str | None = None
    ) -> None:
        self.driver = driver
        self.attributes = attributes
        self.capacity = capacity
        self.allowMultipleAllocations = allow_multiple
        self.error = error


def no_overload(op: str, *args: Any) -> EvalError:
    return EvalError(f"no such overload: {op}({', '.join(type_name(a) for a in args)})")


_ORDERED: Final = frozenset((bool, int, Uint, float, str, bytes, Timestamp, Duration))
_NUMBERS: Final = frozenset((int, Uint, float))


def less(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if (ta is tb and ta in _ORDERED) or (ta in _NUMBERS and tb in _NUMBERS):
        return bool(a < b)
    raise no_overload("_<_", a, b)


def less_equal(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if (ta is tb and ta in _ORDERED) or (ta in _NUMBERS and tb in _NUMBERS):
        return bool(a <= b)
    raise no_overload("_<=_", a, b)


def greater(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if (ta is tb and ta in _ORDERED) or (ta in _NUMBERS and tb in _NUMBERS):
        return bool(a > b)
    raise no_overload("_>_", a, b)


def greater_equal(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if (ta is tb and ta in _ORDERED) or (ta in _NUMBERS and tb in _NUMBERS):
        return bool(a >= b)
    raise no_overload("_>=_", a, b)


def add(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is not type(b):
        if ta is Timestamp and type(b) is Duration:
            return Timestamp(a.ns + b.ns)
        if ta is Duration and type(b) is Timestamp:
            return Timestamp(a.ns + b.ns)
        raise no_overload("_+_", a, b)
    if ta is Duration:
        return Duration(a.ns + b.ns)
    if ta is int:
        return check_int(a + b)
    if ta is float or ta is str or ta is bytes or ta is tuple:
        return a + b
    if ta is Uint:
        return check_uint(a + b)
    raise no_overload("_+_", a, b)


def concat_cost(a: Any, b: Any) -> int:
    """Concatenation copies both operands (cel-go charges by size): a tenth of the
    characters, half the list elements (each is a pointer and maybe a new object)."""
    if type(a) is not type(b):
        return 0
    if type(a) is tuple:
        return (len(a) + len(b)) // 2
    if type(a) is str or type(a) is bytes:
        return (len(a) + len(b)) // 10
    return 0


def comparison_cost(a: Any, b: Any, cap: int) -> int:
    """cel-go (interpreter/runtimecost.go) charges `==` and string ordering by the
    smaller operand's size x 0.1. Python compares nested lists and maps element by
    element, so those pay one per element inside (counted up to `cap`)."""
    if type(a) is str or type(a) is bytes:
        return min(len(a), len(b)) // 10 if type(b) is type(a) else 0
    return min(elements(a, cap), elements(b, cap))


def elements(value: Any, cap: int) -> int:
    """How many values a list or map holds at every depth, counting stops past `cap`."""
    count, stack = 0, [value]
    while stack and count <= cap:
        item = stack.pop()
        if type(item) is tuple:
            count += len(item)
            stack.extend(x for x in item if type(x) is tuple or isinstance(x, dict))
        elif isinstance(item, dict):
            count += len(item)
            stack.extend(x for x in item.values() if type(x) is tuple or isinstance(x, dict))
    return count


def subtract(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is not type(b):
        if ta is Timestamp and type(b) is Duration:
            return Timestamp(a.ns - b.ns)
        raise no_overload("_-_", a, b)
    if ta is Timestamp:
        return Duration(a.ns - b.ns)
    if ta is Duration:
        return Duration(a.ns - b.ns)
    if ta is int:
        return check_int(a - b)
    if ta is float:
        return a - b
    if ta is Uint:
        return check_uint(a - b)
    raise no_overload("_-_", a, b)


def multiply(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is not type(b):
        raise no_overload("_*_", a, b)
    if ta is int:
        return check_int(a * b)
    if ta is float:
        return a * b
    if ta is Uint:
        return check_uint(a * b)
    raise no_overload("_*_", a, b)


def divide(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is not type(b):
        raise no_overload("_/_", a, b)
    if ta is float:
        if b == 0:  # IEEE 754, as Go: x/0 is ±Inf, 0/0 is NaN
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
        return a / b
    if ta is int or ta is Uint:
        if b == 0:
            raise EvalError("division by zero")
        if ta is int and a == INT64_MIN and b == -1:
            raise EvalError("integer overflow")
        quotient = abs(a) // abs(b)  # Go truncates toward zero
        result = quotient if (a < 0) == (b < 0) else -quotient
        return Uint(result) if ta is Uint else result
    raise no_overload("_/_", a, b)


def modulo(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is not type(b) or ta not in (int, Uint):
        raise no_overload("_%_", a, b)
    if b == 0:
        raise EvalError("modulus by zero")
    if ta is int and a == INT64_MIN and b == -1:
        raise EvalError("integer overflow")
    remainder = abs(a) % abs(b)  # Go: the sign follows the dividend
    result = -remainder if a < 0 else remainder
    return Uint(result) if ta is Uint else result


def negate(a: Any) -> Any:
    ta = type(a)
    if ta is int:
        return check_int(-a)
    if ta is float:
        return -a
    raise no_overload("-_", a)


def _key_matches(container: dict[Any, Any], key: Any) -> bool:
    # Python treats True == 1; CEL keys of type bool and int never match each other.
    if type(key) is bool or (type(key) is int and container):
        return any(type(k) is bool for k in container) == (type(key) is bool)
    return True


def contains(container: Any, item: Any) -> bool:
    """`item in container` for lists and maps."""
    if type(container) is tuple:
        return any(cel_equal(item, element) for element in container)
    if isinstance(container, dict):
        if type(item) in (list, tuple, dict) or not _hashable(item):
            return False
        return item in container and _key_matches(container, item)
    raise no_overload("@in", item, container)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def index(container: Any, key: Any) -> Any:
    """`container[key]`: list position or map key; optionals chain."""
    if isinstance(container, dict):
        if type(key) in (list, tuple, dict) or not _hashable(key):
            raise EvalError(f"unsupported key type: {type_name(key)}")
        try:
            value = container[key]
        except KeyError:
            raise EvalError(f"no such key: {key}") from None
        if value is EMPTY or _key_matches(container, key):
            return value
        raise EvalError(f"no such key: {key}")
    if type(container) is tuple:
        position = _position(key)
        if position < 0 or position >= len(container):
            raise EvalError(f"index '{position}' out of range in list size '{len(container)}'")
        return container[position]
    if type(container) is Optional:
        # Chaining after `.?`/`[?]` (cel-go OptionalTypes): a missing entry stays none.
        return optional_index(container.value, key) if container.has_value else OPTIONAL_NONE
    raise no_overload("_[_]", container, key)


def _position(key: Any) -> int:
    # cel-go IndexOrError: ints, uints and whole doubles index a list.
    if type(key) is int or type(key) is Uint:
        return int(key)
    if type(key) is float:
        if key.is_integer():
            return int(key)
        raise EvalError(f"unsupported index value {key} in list")
    raise EvalError(f"unsupported index type '{type_name(key)}' in list")


def optional_index(container: Any, key: Any) -> Optional:
    """`container[?key]`: optional.none() instead of a missing-key error."""
    if type(container) is Optional:
        return optional_index(container.value, key) if container.has_value else OPTIONAL_NONE
    if type(container) is DomainMap:
        return Optional(container[key])  # compile.go's map finds every domain, unknown ones empty
    if isinstance(container, dict):
        if not _hashable(key) or key not in container or not _key_matches(container, key):
            return OPTIONAL_NONE
        return Optional(container[key])
    if type(container) is tuple:
        position = _position(key)
        return Optional(container[position]) if 0 <= position < len(container) else OPTIONAL_NONE
    raise no_overload("_[?_]", container, key)


def select(value: Any, field: str) -> Any:
    """`value.field`: a map key or a field of the device object; optionals chain."""
    if isinstance(value, dict):
        try:
            return value[field]
        except KeyError:
            raise EvalError(f"no such key: {field}") from None
    if type(value) is DeviceActivation:
        return getattr(value, field)
    if type(value) is Optional:
        return optional_select(value.value, field) if value.has_value else OPTIONAL_NONE
    raise EvalError(f"type '{type_name(value)}' does not support field selection")


def optional_select(value: Any, field: str) -> Optional:
    """`value.?field`."""
    if type(value) is Optional:
        return optional_select(value.value, field) if value.has_value else OPTIONAL_NONE
    if type(value) is DomainMap:
        return Optional(value[field])
    if isinstance(value, dict):
        return Optional(value[field]) if field in value else OPTIONAL_NONE
    if type(value) is DeviceActivation:
        return Optional(getattr(value, field))
    # cel-go: selecting on a present value that is not a map is an error, not none.
    raise EvalError(f"no such key: {field}")


def has_field(value: Any, field: str) -> bool:
    """`has(value.field)`; on an optional, false when it is none."""
    if isinstance(value, dict):
        return field in value
    if type(value) is DeviceActivation:
        return True
    if type(value) is Optional:
        return value.has_value and has_field(value.value, field)
    raise EvalError(f"invalid type for field selection: {type_name(value)}")
