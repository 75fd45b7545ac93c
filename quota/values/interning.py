"""Equal values parsed apart, held as one object, in a table of bounded size. Pure.

Neighbours: `quota.objects.slices` shares equal capacities (tens of thousands of GPUs publish a
handful, and `quota.devices.selectors` groups devices by capacity identity); `quota.objects.claims` shares
the names a cache of claims repeats (namespaces, drivers, pools, devices, request names).

Why not `sys.intern`: many of these names are not ours to bound (a tenant names its
requests, nodes come and go with their pools), and on Python 3.12 an interned string is
immortal, so a long-lived `serve` would keep every name it ever parsed. Here the table
stops growing at its limit; a value seen after that is simply not shared.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Interned"]

T = TypeVar("T", bound=Hashable)


class Interned(Generic[T]):
    """`shared(value)`: the one object equal to `value` this table holds, else `value`
    (added while fewer than `limit` are held)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[T, T] = {}

    def __call__(self, value: T) -> T:
        found = self._held.get(value)
        if found is not None:
            return found
        if len(self._held) < self.limit:
            self._held[value] = value
        return value

    def held(self, value: T) -> T | None:
        """The one object equal to `value` this table holds, if any (none added): a table
        of values checked once (`quota.values.meta`'s namespaces) tells a value checked before."""
        return self._held.get(value)

    def __len__(self) -> int:
        return len(self._held)
