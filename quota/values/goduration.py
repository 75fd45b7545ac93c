"""Go's `time.ParseDuration`, to nanoseconds: one parser for every Go duration we read.

Neighbours: `quota.cel.timelib` wraps it as CEL's `duration(string)` (its error an
`EvalError`); `webhook.server` reads the API server's `?timeout=` with it, so answering a
review does not import the CEL engine. Pure: text in, an int64 of nanoseconds out.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_NS", "MIN_NS", "NANOS", "parse_go_duration"]

NANOS = 10**9
# Go's time.Duration is int64 nanoseconds (about ±292 years).
MIN_NS = -(2**63)
MAX_NS = 2**63 - 1
_UNITS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": NANOS, "m": 60 * NANOS, "h": 3600 * NANOS}
_PART = re.compile(r"(\d*)(?:\.(\d*))?(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """`[-+]` then one or more `<decimal><unit>`, or "0": its nanoseconds; ValueError names what is wrong."""
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0
    total, position = Fraction(0), 0
    while position < len(body):
        part = _PART.match(body, position)
        if part is None or not (part.group(1) or part.group(2)):
            raise ValueError(f'invalid duration "{text}"')
        if len(part.group(1)) > 20:  # past int64 in any unit (and Python's digit limit)
            raise ValueError(f'invalid duration "{text[:64]}"')
        # Digits past the 30th are below a nanosecond in every unit.
        number = Fraction(f"{part.group(1) or 0}.{(part.group(2) or '0')[:30]}")
        total += number * _UNITS[part.group(3)]
        position = part.end()
    if not body:
        raise ValueError(f'invalid duration "{text}"')
    nanos = -int(total) if text.startswith("-") else int(total)
    if not MIN_NS <= nanos <= MAX_NS:  # Go: time: invalid duration
        raise ValueError(f'invalid duration "{text}"')
    return nanos
