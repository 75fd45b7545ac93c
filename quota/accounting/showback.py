"""Showback: GPU-memory-seconds and device-seconds allocated, by namespace, device class and model.

Neighbours: `quota.accounting.ledger` tells every claim change (`Ledger.observe`: an entry counted in
or out); `quota.accounting.usage.device_labels` names a device's model; `webhook.showbackmetrics`
reads `Accrual.totals` at scrape time and exports the two counters, with the clock and the
leader's flag `runtime` and `commands.wiring` pass in. Pure: the time is an argument.

Each cell (namespace, class, model) holds its allocation *rate* (bytes and devices held
now) and what it has *accrued* (byte-seconds, device-seconds). A claim change moves the
rate of the cells its devices are in, after bringing those cells up to that instant (so
the integral is exact, piecewise); a scrape brings every cell up to now. A claim event
costs its devices, a scrape the cells, never the claims.

Only a replica that leads accrues (`lead`): every replica tracks the rates (cheap, from
its own ledger), the leader turns them into seconds. Two replicas never count the same
second: their counters are separate series (by instance), so `sum(increase(...))` over
them is the cluster's total. A replica that stops leading keeps its totals, frozen,
until they are forgotten (`forget_after` without an increment); one that restarts starts
again from 0, which `increase()` reads as a counter reset.

Bounded: a namespace beyond `namespaces` distinct ones exported at once is accrued
under `OTHER`; a cell that has accrued nothing for `forget_after` is no longer exported
(its last value was scraped long before; a later increment starts it again from 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.pricing.priced import Pricing
from quota.values.model import Charge, DeviceClassName, DeviceKey, Mode, Namespace

__all__ = ["OTHER", "Accrual", "Accrued", "Cell", "contributions"]

OTHER = Namespace("other")
# namespace, device class, model ("" when the device names none or left the inventory)
Cell = tuple[Namespace, DeviceClassName, str]


@dataclass(frozen=True, slots=True)
class Accrued:
    cell: Cell
    memory_seconds: float  # byte-seconds
    device_seconds: float


@dataclass(slots=True)
class _State:
    memory: int = 0  # bytes held now
    devices: int = 0
    since: float = 0.0  # accrued up to this instant
    memory_seconds: float = 0.0
    device_seconds: float = 0.0
    last_increment: float | None = None  # None: nothing to export


def contributions(entry: Entry, mode: Mode, model: Callable[[DeviceKey], str]) -> tuple[tuple[DeviceClassName, str,
                                                                                                Charge], ...]:
    """What an allocated entry holds, per (class, model): each allocated device's exact
    charge; an entry priced from its allocation record (no devices known) per request,
    under model "". Nothing for an entry not allocated."""
    if not entry.allocated:
        return ()
    pricing: Pricing = entry.pricing.get(mode) or next(iter(entry.pricing.values()))
    out: dict[tuple[DeviceClassName, str], Charge] = {}
    if pricing.held:
        for held in pricing.held:
            if not held.charge.is_zero():
                key = (held.device_class, model(held.key))
                out[key] = out.get(key, Charge()) + held.charge
    else:
        for request in pricing.requests:
            if not request.charge.is_zero():
                cls = request.alternatives[0][0] if request.alternatives else DeviceClassName("")
                out[(cls, "")] = out.get((cls, ""), Charge()) + request.charge
    return tuple((cls, name, charge) for (cls, name), charge in out.items())


class Accrual:
    def __init__(self, *, namespaces: int = 1000, forget_after: float = 3600.0) -> None:
        self.namespaces = namespaces
        self.forget_after = forget_after
        self._cells: dict[Cell, _State] = {}
        # What each counted claim put in: taken out as it was put in, whatever changed since.
        self._held: dict[ClaimRef, tuple[tuple[Cell, Charge], ...]] = {}
        # Cells per exported namespace: the cap counts namespaces, not cells.
        self._per_namespace: dict[Namespace, int] = {}
        self._leading = False

    @property
    def leading(self) -> bool:
        return self._leading

    def lead(self, leading: bool, now: float) -> None:
        """Start or stop accruing at `now`: every cell is brought up to it first."""
        if leading != self._leading:
            self._advance_all(now)
            self._leading = leading

    def count(self, ref: ClaimRef, namespace: Namespace,
              held: Iterable[tuple[DeviceClassName, str, Charge]], now: float) -> None:
        """A claim counted in, holding `held` from `now` (`contributions`)."""
        self.uncount(ref, now)
        put = tuple((self._cell(namespace, cls, model), charge) for cls, model, charge in held)
        if not put:
            return
        self._held[ref] = put
        for cell, charge in put:
            self._move(cell, charge, +1, now)

    def uncount(self, ref: ClaimRef, now: float) -> None:
        """A claim counted out at `now`: what it put in is taken out."""
        for cell, charge in self._held.pop(ref, ()):
            self._move(cell, charge, -1, now)

    def counted(self) -> list[ClaimRef]:
        """The claims counted in now (a copy)."""
        return list(self._held)

    def totals(self, now: float) -> Iterator[Accrued]:
        """Every cell brought up to `now`, those with a total to export; forgets the stale."""
        self._advance_all(now)
        for cell, state in list(self._cells.items()):
            if state.last_increment is not None and now - state.last_increment >= self.forget_after:
                state.last_increment, state.memory_seconds, state.device_seconds = None, 0.0, 0.0
            if state.last_increment is None and state.memory == 0 and state.devices == 0:
                self._drop(cell)
                continue
            if state.last_increment is not None:
                yield Accrued(cell, state.memory_seconds, state.device_seconds)

    def cells(self) -> set[Cell]:
        return set(self._cells)

    def rates(self) -> dict[Cell, Charge]:
        """What each cell holds now (for tests and the bench)."""
        return {cell: Charge(s.memory, s.devices) for cell, s in self._cells.items() if s.memory or s.devices}

    # -- cells --------------------------------------------------------------------------

    def _cell(self, namespace: Namespace, cls: DeviceClassName, model: str) -> Cell:
        exported = len(self._per_namespace) - (OTHER in self._per_namespace)
        if namespace not in self._per_namespace and exported >= self.namespaces:
            namespace = OTHER
        return namespace, cls, model

    def _move(self, cell: Cell, charge: Charge, sign: int, now: float) -> None:
        state = self._cells.get(cell)
        if state is None:
            state = self._cells[cell] = _State(since=now)
            self._per_namespace[cell[0]] = self._per_namespace.get(cell[0], 0) + 1
        else:
            self._advance(state, now)
        state.memory += sign * charge.memory
        state.devices += sign * charge.devices

    def _advance(self, state: _State, now: float) -> None:
        elapsed = now - state.since
        if elapsed <= 0:
            return
        state.since = now
        if self._leading and (state.memory or state.devices):
            state.memory_seconds += state.memory * elapsed
            state.device_seconds += state.devices * elapsed
            state.last_increment = now

    def _advance_all(self, now: float) -> None:
        for state in self._cells.values():
            self._advance(state, now)

    def _drop(self, cell: Cell) -> None:
        del self._cells[cell]
        left = self._per_namespace[cell[0]] - 1
        if left:
            self._per_namespace[cell[0]] = left
        else:
            del self._per_namespace[cell[0]]
