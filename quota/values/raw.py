"""Reading raw Kubernetes JSON defensively: one way to walk and check fields.

Neighbours: the parsers (`quota.objects.slices`, `quota.objects.claims`, `quota.objects.claimspec`,
`quota.quotas.devicequota`, `quota.values.meta`) turn raw objects into domain values with these
helpers, so a field of the wrong type becomes a parser error naming it instead of an AttributeError
deep in the webhook (tests/unit/quota/objects/test_fuzz_parsers.py holds them to that). `show` is
the one way a hostile value enters an error message.
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["Obj", "dig", "as_map", "as_list", "show", "small_json"]

# A Kubernetes object (or any JSON object) as decoded: the one name every floor uses for it.
Obj = dict[str, Any]

_SHOW_CHARS = 64
# Python refuses to print integers of more than 4300 digits (ValueError) and a printed
# 10**4000 says nothing useful: past this, describe the size instead.
_SHOW_INT = 10**30


def dig(obj: Any, *path: str) -> Any:
    """`obj[path[0]][path[1]]...`, or None as soon as a step is missing or not a map."""
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def as_map(value: Any) -> dict[str, Any]:
    """A map field; absent or of the wrong type reads as empty (status)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any, where: str, error: type[Exception]) -> list[Any]:
    """An optional list field: absent is empty, anything but a list is an `error`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise error(f"{where} must be a list, got {show(value)}")
    return value


def show(value: Any) -> str:
    """A value from user input, safe in a message: bounded, ASCII, never raises.

    Strings go through `ascii()` so newlines, ANSI escapes, bidi overrides and lone
    surrogates arrive escaped; containers are named, not printed (a deep one would hit
    the recursion limit, a large one would flood the message).
    """
    if isinstance(value, str):
        return ascii(value if len(value) <= _SHOW_CHARS else value[: _SHOW_CHARS - 3] + "...")
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        if -_SHOW_INT < value < _SHOW_INT:
            return str(value)
        return f"an integer of {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, dict):
        return "a map"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def small_json(raw: Any, *, max_bytes: int, max_digits: int = 19) -> Any:
    """An annotation of ours, decoded: None when it is not a string of at most `max_bytes`,
    not JSON, or holds an integer of more than `max_digits` digits (bounded before int()
    sees it), NaN or Infinity. Depth is bounded by the length, far below the recursion
    limit: a value not written by us is ignored rather than parsed at any cost."""
    if not isinstance(raw, str) or len(raw) > max_bytes:
        return None
    try:
        return _decoder(max_digits).decode(raw)
    except (ValueError, TypeError, RecursionError):
        return None


# One decoder per bound, built once (it holds no state between calls): every allocated
# claim a list brings has its allocation record decoded here.
@functools.lru_cache(maxsize=8)
def _decoder(max_digits: int) -> json.JSONDecoder:
    def small_int(text: str) -> int:
        if len(text.lstrip("-")) > max_digits:
            raise ValueError("integer too long")
        return int(text)

    def refuse(text: str) -> Any:
        raise ValueError(f"{text} is not a number")

    return json.JSONDecoder(parse_int=small_int, parse_constant=refuse)
