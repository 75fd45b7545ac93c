"""Kubernetes resource quantities as exact fractions.

Parses the grammar of k8s.io/apimachinery/pkg/api/resource/quantity.go
(`<signedNumber><suffix>`, suffixes binary SI, decimal SI or an `e`/`E` exponent) into
`fractions.Fraction`, so `64Gi == 65536Mi` holds exactly and nothing rounds until a
charge is turned into whole bytes. Used by the inventory (capacities), pricing
(requests, requestPolicy) and DeviceQuota (hard limits); the CEL `quantity()` type wraps
the same values. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

__all__ = ["QuantityError", "parse_quantity", "format_quantity", "ceil_int"]


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
# apimachinery refuses exponents this large; bounding them keeps a hostile quantity
# such as "1e999999999" from allocating a gigantic integer.
_MAX_EXPONENT = 100


def parse_quantity(value: str | int | float | Fraction) -> Fraction:
    """Return the exact value of a quantity (`"80Gi"`, `"500m"`, `"1e3"`, `40`)."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or number, not {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} is not a finite number")
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string or number, not {type(value).__name__}")
    return _parse_text(value)


# Inventories repeat a handful of values ("80Gi", "1Mi") tens of thousands of times;
# the bound keeps hostile unique strings from growing the cache without limit.
@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(
            f"quantity {value!r} must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (e.g. 80Gi, 500m, 1e9)"
        )
    number = Fraction(match["num"] if not match["num"].endswith(".") else match["num"][:-1])
    if match["exp"] is not None:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"quantity {value!r} has an exponent out of range")
        scale = Fraction(10) ** exponent
    elif match["suffix"] in _BINARY:
        scale = Fraction(_BINARY[match["suffix"]])
    else:
        scale = _DECIMAL[match["suffix"]]
    result = number * scale
    return -result if match["sign"] == "-" else result


def ceil_int(value: Fraction) -> int:
    """Whole units, rounded up: charges never under-count a fractional byte."""
    return math.ceil(value)


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
