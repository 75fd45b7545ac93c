"""Reading raw Kubernetes JSON defensively: one way to walk and check fields.

Neighbours: the parsers (`quota.slices`, `quota.claims`, `quota.devicequota`,
`quota.check`) turn raw objects into domain values with these helpers, so a field of
the wrong type becomes a parser error naming it instead of an AttributeError deep in
the webhook (tests/unit/test_fuzz_parsers.py holds them to that).
"""

from __future__ import annotations

from typing import Any

__all__ = ["dig", "as_map", "as_list"]


def dig(obj: Any, *path: str) -> Any:
    """`obj[path[0]][path[1]]...`, or None as soon as a step is missing or not a map."""
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def as_map(value: Any) -> dict[str, Any]:
    """A map field; absent or of the wrong type reads as empty (metadata, status)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any, where: str, error: type[ValueError]) -> list[Any]:
    """An optional list field: absent is empty, anything but a list is an `error`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise error(f"{where} must be a list")
    return value
