"""Answers the API server gave about a caller, kept a while and bounded: the authorizer's cache.

Neighbours: `webhook.metricsserver.TokenAccess` (who may scrape `/metrics`) and
`webhook.labelaccess.LabelAccess` (who may set the admin-access label) each ask the API
server a TokenReview or SubjectAccessReview per caller and keep the answer here, as the
API server's own webhook authorizer caches its answers: a loop of requests by one caller
is one review per `ttl`, and a flood of callers keeps at most `most` answers, the least
recently used dropped first. A failed review is never kept (the caller fails closed and
asks again). No clock of its own: times are passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Answers"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Answers(Generic[K, V]):
    def __init__(self, most: int) -> None:
        self.most = most
        self._kept: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        """The answer kept for `key` until a time after `now`, marked recently used; None: none."""
        kept = self._kept.get(key)
        if kept is None or kept[1] <= now:
            return None
        self._kept.move_to_end(key)
        return kept[0]

    def put(self, key: K, answer: V, until: float) -> None:
        """Keep `answer` for `key` until `until`, dropping the least recently used past `most`."""
        self._kept[key] = (answer, until)
        self._kept.move_to_end(key)
        while len(self._kept) > self.most:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)
