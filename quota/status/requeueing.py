"""Who gets the next requeue write: a budget of writes per quota-freeing request, shared fairly.

Neighbours: `controllers.requeue` grants a credit for each claim deletion (`Turns.grant`),
takes turns (`Turns.take`) and spends each on the ResourceClaimTemplates `quota.objects.waiting`
names, then touches the same ones once more after a while (`Settles`). No clock of its
own: times are passed in, so the rules below are tested as tables.

The bounds (docs/security.md, "Bounds on what a tenant may cost"):
- One credit per deleted claim buys one template write now and the same write once more
  `settle` seconds later (a replica whose claim watch lags may deny the first retry):
  at most 2 writes per tenant request, however many templates or Pods wait.
- Credits are kept per *origin* (the namespace of the deleted claim), at most `cap`.
- Origins take turns round-robin, each at most one turn per `interval` and `per_turn`
  writes a turn: one tenant's churn earns that tenant turns and nothing more, and a credit
  of another tenant waits for at most one turn of each other origin, never for the churn.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Settles", "Turn", "Turns"]


@dataclass(frozen=True, slots=True)
class Turn:
    origin: str
    scope: tuple[str, ...]  # where the writes may go: the origin first, then its teams' namespaces
    writes: int


class Turns:
    def __init__(self, *, interval: float, cap: int = 16, per_turn: int = 4) -> None:
        self._interval = interval
        self._cap = cap
        self._per_turn = per_turn
        self._credits: dict[str, int] = {}  # insertion order is the round-robin order
        self._scope: dict[str, tuple[str, ...]] = {}
        self._ready: dict[str, float] = {}  # origin -> its next turn, no earlier

    def grant(self, origin: str, scope: Iterable[str] = ()) -> None:
        """A claim of `origin` is gone: one more write for the Pods waiting in `scope`."""
        self._credits[origin] = min(self._cap, self._credits.get(origin, 0) + 1)
        self._scope[origin] = (origin, *sorted(set(scope) - {origin}))

    def take(self, now: float) -> Turn | None:
        """The first origin in turn whose rate allows it now, moved to the back of the line."""
        for origin, credits in self._credits.items():
            if self._ready.get(origin, now) <= now:
                break
        else:
            return None
        writes = min(credits, self._per_turn)
        del self._credits[origin]
        if credits > writes:
            self._credits[origin] = credits - writes
        scope = self._scope[origin] if origin in self._credits else self._scope.pop(origin)
        self._ready = {o: at for o, at in self._ready.items() if at > now}
        self._ready[origin] = now + self._interval
        return Turn(origin, scope, writes)

    def next_at(self) -> float | None:
        """When `take` may next return a turn (None: no credit left)."""
        if not self._credits:
            return None
        return min(self._ready.get(origin, float("-inf")) for origin in self._credits)

    def __len__(self) -> int:
        return len(self._credits)

    def credits(self) -> int:
        """Credits not spent yet, over every origin."""
        return sum(self._credits.values())


class Settles:
    """Templates to touch once more, per namespace: as many as were touched, never more."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[float, frozenset[str]]] = {}

    def add(self, namespace: str, templates: Iterable[str], at: float) -> None:
        due, pending = self._due.get(namespace, (at, frozenset()))
        self._due[namespace] = (min(due, at), pending | frozenset(templates))

    def take(self, now: float) -> list[tuple[str, list[str]]]:
        ready = sorted(ns for ns, (at, _) in self._due.items() if at <= now)
        return [(ns, sorted(self._due.pop(ns)[1])) for ns in ready]

    def next_at(self) -> float | None:
        return min((at for at, _ in self._due.values()), default=None)

    def __len__(self) -> int:
        """Templates due to be touched once more, over every namespace."""
        return sum(len(templates) for _, templates in self._due.values())
