"""`<string>.format(<list>)` from cel-go ext.Strings (version 1 and later; base.go
enables version 2 from Kubernetes 1.29).

Clauses: `%s` (any value, lists and maps rendered recursively, map entries sorted by
their rendered key), `%d`, `%f`/`%e` with an optional `.N` precision, `%b`, `%o`,
`%x`/`%X` (numbers, strings and bytes in hex) and `%%`, with cel-go's error wording
("could not parse formatting clause: ...", "error during formatting: ..."). Doubles
follow Go: NaN and ±Infinity spelled out, `%.0f` rounds half to even. Registered
into `quota.cel.library.REGISTRY` on import by `quota.cel.checker`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from quota.cel.library import format_double, register
from quota.cel.timelib import Duration, Timestamp, format_duration, format_timestamp
from quota.cel.values import CelType, EvalError, Uint, type_name

_CLAUSE = re.compile(r"%(?:\.(\d+))?(.)?", re.S)


# Digits a %f clause can print before the point (the largest double is about 1.8e308),
# and the most any other scalar renders to (an int64 in binary, a timestamp).
_MAX_INTEGER_DIGITS = 310
_SCALAR_WIDTH = 64
# Rendering sizes are summed only up to this, enough to exceed any cost budget.
_SIZE_CAP = 10**8


def _rendered_size(value: Any, budget: int = _SIZE_CAP) -> int:
    """An upper bound of len(_string(value)), computed without rendering it."""
    kind = type(value)
    if kind is str or kind is bytes:
        return len(value)
    if kind is tuple or isinstance(value, dict):
        total = 2
        for item in value.items() if isinstance(value, dict) else value:
            total += 4 + (_rendered_size(item[0], budget) + _rendered_size(item[1], budget)
                          if isinstance(value, dict) else _rendered_size(item, budget))
            if total > budget:
                break
        return total
    return _SCALAR_WIDTH


def _format_cost(text: str, args: tuple[Any, ...]) -> int:
    """Charge what the result will hold before producing it: cel-go charges format by
    its inputs, but `%.1000000000e` makes Python (and Go) allocate a gigabyte, so the
    precision counts as output (quota.cel README, "Cost limit design")."""
    size, used = len(text), 0
    for match in _CLAUSE.finditer(text):
        precision, verb = match.group(1), match.group(2)
        if verb == "%" and precision is None or used >= len(args):
            continue
        value, used = args[used], used + 1
        digits = 6 if precision is None else int(precision) if len(precision) < 12 else _SIZE_CAP
        if verb in ("f", "e"):
            size += digits + _MAX_INTEGER_DIGITS
        else:
            size += _rendered_size(value) * (2 if verb in ("x", "X") else 1)
        if size > _SIZE_CAP:
            break
    return size // 10


@register("format", "string, list(dyn) -> string", member=True, cost=_format_cost)
def _format(text: str, args: tuple[Any, ...]) -> str:
    out: list[str] = []
    position, used = 0, 0
    for match in _CLAUSE.finditer(text):
        out.append(text[position : match.start()])
        position = match.end()
        precision, verb = match.group(1), match.group(2)
        if verb == "%" and precision is None:
            out.append("%")
            continue
        if verb is None or verb not in _VERBS:
            raise EvalError(f'could not parse formatting clause: unrecognized formatting clause "{verb or ""}"')
        if used >= len(args):
            raise EvalError(f"index {used} out of range")
        out.append(_VERBS[verb](args[used], None if precision is None else int(precision)))
        used += 1
    out.append(text[position:])
    return "".join(out)


def _special_double(value: float) -> str | None:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return None


def _string(value: Any, _: int | None = None) -> str:
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is Uint:
        return str(int(value))
    if kind is float:
        return _special_double(value) or format_double(value)
    if kind is bytes:
        return value.decode("utf-8", errors="replace")  # type: ignore[no-any-return]
    if value is None:
        return "null"
    if kind is CelType:
        return str(value.name)
    if kind is Timestamp:
        return format_timestamp(value)
    if kind is Duration:
        return format_duration(value)
    if kind is tuple:
        return "[" + ", ".join(_string(v) for v in value) + "]"
    if isinstance(value, dict):
        entries = sorted((_string(k), _string(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in entries) + "}"
    raise EvalError(
        "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, "
        f"maps, lists, types, durations, and timestamps, was given {type_name(value)}"
    )


def _decimal(value: Any, _: int | None) -> str:
    if type(value) is float and _special_double(value):
        return _special_double(value) or ""
    if type(value) in (int, Uint):
        return str(int(value))
    raise EvalError(f"error during formatting: decimal clause can only be used on integers, was given {type_name(value)}")


def _number(value: Any, clause: str) -> float:
    if type(value) in (int, Uint, float):
        return float(value)
    raise EvalError(
        f"error during formatting: {clause} clause can only be used on doubles, was given {type_name(value)}"
    )


def _fixed(value: Any, precision: int | None) -> str:
    number = _number(value, "fixed-point")
    return _special_double(number) or f"{number:.{6 if precision is None else precision}f}"


def _scientific(value: Any, precision: int | None) -> str:
    number = _number(value, "scientific")
    return _special_double(number) or f"{number:.{6 if precision is None else precision}e}"


def _integer(value: Any, what: str, plural: str) -> int:
    if type(value) in (int, Uint) or (type(value) is bool and what == "binary"):
        return int(value)
    raise EvalError(f"error during formatting: {plural}, was given {type_name(value)}")


def _binary(value: Any, _: int | None) -> str:
    return format(_integer(value, "binary", "only integers and bools can be formatted as binary"), "b")


def _octal(value: Any, _: int | None) -> str:
    return format(_integer(value, "octal", "octal clause can only be used on integers"), "o")


def _hex(value: Any, upper: bool) -> str:
    if type(value) is str:
        text = value.encode("utf-8").hex()
    elif type(value) is bytes:
        text = value.hex()
    elif type(value) in (int, Uint):
        text = format(int(value), "x")
    else:
        raise EvalError(
            "error during formatting: only integers, byte buffers, and strings can be formatted as hex, "
            f"was given {type_name(value)}"
        )
    return text.upper() if upper else text


_VERBS: dict[str, Callable[[Any, int | None], str]] = {
    "s": _string,
    "d": _decimal,
    "f": _fixed,
    "e": _scientific,
    "b": _binary,
    "o": _octal,
    "x": lambda value, _: _hex(value, False),
    "X": lambda value, _: _hex(value, True),
}
