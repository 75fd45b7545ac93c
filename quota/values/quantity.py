"""Kubernetes resource quantities as exact fractions.

Parses the grammar of k8s.io/apimachinery/pkg/api/resource/quantity.go
(`<signedNumber><suffix>`, suffixes binary SI, decimal SI or an `e`/`E` exponent) into
`fractions.Fraction`, so `64Gi == 65536Mi` holds exactly and nothing rounds until a
charge is turned into whole bytes. Bounded like apimachinery's model: values are
rounded up to whole nano-units (ParseQuantity rounds non-zero amounts up to 1n); text
longer than 64 characters, exponents past 10^±100 and numbers of more than 64 digits
are refused, so no hostile quantity reaches Python's 4,300-digit limit or allocates a
huge integer. `parse_amount` adds the int64 bound for amounts objects hold (capacities,
requests, limits): `Quantity.Value()` is an int64, beyond it the API server caps or
saturates, which would make a charge silently wrong. CEL's `quantity()` uses the
unbounded-magnitude `parse_quantity`, as apimachinery's does. Used by the inventory (capacities), pricing
(requests, requestPolicy) and DeviceQuota (hard limits); the CEL `quantity()` type wraps
the same values. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from quota.values.raw import show

__all__ = ["QuantityError", "parse_quantity", "parse_amount", "format_quantity", "format_quantities", "ceil_int"]


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity; the message says what was wrong."""


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?))$"
)
# Bounding exponents keeps a hostile quantity such as "1e999999999" from allocating a
# gigantic integer; anything past 10^100 is refused by the magnitude bound anyway.
_MAX_EXPONENT = 100
# The longest quantity that can fit the bounds (19 integer digits, 9 fractional, a
# sign, a suffix) is far shorter; the bound keeps a 5,000-digit string away from int().
_MAX_TEXT = 64
_MAX_NUMBER = 10**_MAX_TEXT
_MAX_AMOUNT = 2**63 - 1
_NANO = 10**9


def parse_quantity(value: str | int | float | Fraction) -> Fraction:
    """Return the exact value of a quantity (`"80Gi"`, `"500m"`, `"1e3"`, `40`)."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or number, not {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return _bounded(Fraction(value), show(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {show(value)} is not a finite number")
        return _bounded(Fraction(value), show(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string or number, not {show(value)}")
    return _parse_text(value)


def parse_amount(value: str | int | float | Fraction) -> Fraction:
    """A quantity an object field holds: also at most 2^63-1 in magnitude (an int64)."""
    amount = parse_quantity(value)
    if abs(amount) > _MAX_AMOUNT:
        raise QuantityError(f"quantity {show(value)} is out of range: its magnitude must be at most 2^63-1")
    return amount


def non_negative_amount(value: Any, where: str, error: type[Exception]) -> Fraction:
    """`parse_amount` for a field that must not be negative (capacities, requests,
    limits: a negative one would lower charges); failures raise `error` naming `where`."""
    try:
        amount = parse_amount(value)  # wrong types raise QuantityError too
    except QuantityError as err:
        raise error(f"{where}: {err}") from None
    if amount < 0:
        raise error(f"{where}: must not be negative, got {show(value)}")
    return amount


def _bounded(value: Fraction, shown: str) -> Fraction:
    """A JSON number as a quantity: no more than 64 digits, like quantity text."""
    if abs(value) >= _MAX_NUMBER:
        raise QuantityError(f"quantity {shown} is out of range: more than {_MAX_TEXT} digits")
    return _round_nano(value)


def _round_nano(value: Fraction) -> Fraction:
    """ParseQuantity rounds non-zero amounts up (away from 0) to whole nano-units."""
    if (value * _NANO).denominator != 1:
        nanos = math.ceil(abs(value) * _NANO)
        value = Fraction(nanos if value > 0 else -nanos, _NANO)
    return value


# Inventories repeat a handful of values ("80Gi", "1Mi") tens of thousands of times;
# the bound keeps hostile unique strings from growing the cache without limit.
@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    text = value.strip()
    if len(text) > _MAX_TEXT:
        raise QuantityError(f"quantity {show(value)} is longer than {_MAX_TEXT} characters")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"quantity {show(value)} must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (e.g. 80Gi, 500m, 1e9)"
        )
    number = Fraction(match["num"] if not match["num"].endswith(".") else match["num"][:-1])
    if match["exp"] is not None:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"quantity {show(value)} has an exponent out of range")
        scale = Fraction(10) ** exponent
    elif match["suffix"] in _BINARY:
        scale = Fraction(_BINARY[match["suffix"]])
    else:
        scale = _DECIMAL[match["suffix"]]
    result = number * scale
    return _round_nano(-result if match["sign"] == "-" else result)


def ceil_int(value: Fraction) -> int:
    """Whole units, rounded up: charges never under-count a fractional byte."""
    return math.ceil(value)


def format_quantities(values: Sequence[int]) -> list[str]:
    """Byte counts shown side by side (`used / reserved / hard`) in one unit: the largest
    binary suffix that divides every one exactly (`100Gi / 193857Mi` becomes `102400Mi /
    193857Mi`), plain integers when none does; 0 stays `0`. Exact, like `format_quantity`,
    and comparable at a glance."""
    unit = next(((suffix, size) for suffix, size in sorted(_BINARY.items(), key=lambda item: -item[1])
                 if all(v % size == 0 for v in values)), None)
    if unit is None:
        return [str(v) for v in values]
    return ["0" if v == 0 else f"{v // unit[1]}{unit[0]}" for v in values]


def format_quantity(value: Fraction | int) -> str:
    """Render a quantity the way `kubectl` would for byte-like values.

    Uses the largest binary suffix that divides the value exactly (`80Gi`), else the
    plain integer, else a milli-value; stable so denial messages can be compared.
    """
    frac = Fraction(value)
    if frac.denominator != 1:
        milli = frac * 1000
        if milli.denominator == 1:
            return f"{milli.numerator}m"
        return f"{math.ceil(milli)}m"
    number = frac.numerator
    if number == 0:
        return "0"
    for suffix, size in sorted(_BINARY.items(), key=lambda item: -item[1]):
        if number % size == 0:
            return f"{number // size}{suffix}"
    return str(number)
