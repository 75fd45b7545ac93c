"""A mapping of bounded size, the least recently used entry out first. Pure.

Neighbours: `quota.devices.selectors` keeps compiled selectors, partitions and match results in
them; `quota.pricing.pricer` the requirements priced and the classes' bounds; `quota.admission.counting`
the estimates and the pricings shared by the claims priced alike; `quota.objects.jsonclaims` the
specs parsed. What a tenant's objects put in one (a spec, a selector) can only push older
entries out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(OrderedDict[K, V]):
    """`lookup` marks an entry used; `store` adds one and drops the least recently used
    past `size`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def lookup(self, key: K) -> V | None:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def store(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
