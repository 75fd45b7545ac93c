"""Per-pool columns: the values every device field takes over one pool's devices.

Neighbours: `quota.inventory` indexes each usable pool when it rebuilds that pool
(`ColumnTable.index`: which fields its devices have); `quota.partitions` groups devices
by columns instead of reading devices; `quota.selectors` keys its verdicts with
`cel_value`.

Why: the first selector to read a field used to read that field on every device of the
inventory (~3 µs a device, ~190 ms at 58,000 devices) and regroup them all. Now a field
no pool has costs nothing (the inventory counts pools per field name), and an existing
one is read once per pool into a column (about 50 ns a device), kept with the pool.
Columns are interned (the 2,000 H100 nodes share one `architecture` column object), so
pools compare by identity, not value by value.

A column holds grouping keys, not raw values: they must be equal exactly when CEL cannot
tell the values apart, and may be finer. Python has `1 == True` with equal hashes, CEL
does not, so bools (also inside list attributes) get their own tokens; capacities are
keyed by identity (`quota.slices` interns equal ones, and hashing their Fractions
dominated grouping time), which also keeps a group uniform in its request policy.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

from quota.model import MEMORY, AttributeValue, Capacity, Device, Version

__all__ = ["Field", "Column", "PoolIndex", "ColumnTable", "MISSING", "DRIVER", "MULTI", "TAINTS",
           "base_fields", "cel_value"]

# A `quota.cel` DevicePath (("attributes" | "capacity", domain, id), ("driver",),
# ("allowMultipleAllocations",)), or ("taints",), which pricing needs uniform in a group.
Field = tuple[str, ...]
DRIVER: Field = ("driver",)
MULTI: Field = ("allowMultipleAllocations",)
TAINTS: Field = ("taints",)

# Private tokens: no attribute value can equal them.
MISSING = object()
_TRUE, _FALSE = object(), object()
_EMPTY: dict[str, object] = {}


class Column:
    """One field's keys by device position in a pool; interned, so compared by identity."""

    __slots__ = ("values", "__weakref__")

    def __init__(self, values: tuple[object, ...]) -> None:
        self.values = values


@dataclass(frozen=True, slots=True, eq=False)
class PoolIndex:
    """A usable pool's devices, the fields any of them has, and their columns.

    Only the names are read when the pool is built (a few set unions); a column is read
    the first time a selector splits this pool by its field, then kept. Reading every
    column up front cost about 20% more load time for columns most pools never need.
    """

    devices: tuple[Device, ...]
    names: frozenset[Field]
    table: ColumnTable
    columns: dict[Field, Column] = field(default_factory=dict)

    def column(self, name: Field) -> Column | None:
        """The column of `name`, or None when no device of the pool has that field."""
        found = self.columns.get(name)
        if found is None and name in self.names:
            found = self.columns[name] = self.table.column(self.devices, name)
        return found


# Types that are their own grouping keys (`object` is MISSING's).
_PLAIN = frozenset({str, int, object})


def _typed(value: AttributeValue) -> object:
    if type(value) is Version:
        # A tuple hashes in C; the dataclass's hash runs in Python, per device.
        return (Version, value.text)
    if value is True:
        return _TRUE
    if value is False:
        return _FALSE
    if type(value) is tuple:
        return (tuple, tuple(_typed(item) for item in value))
    return value


def cel_value(device: Device, path: Field) -> object:
    """The key of what CEL sees at `path` on `device` (capacities by amount, not identity:
    verdicts are cached across inventory changes, where an identity could be reused)."""
    kind = path[0]
    if kind == "attributes":
        return _typed(device.attributes.get(path[1], _EMPTY).get(path[2], MISSING))  # type: ignore[arg-type]
    if kind == "capacity":
        cap = device.capacity.get(path[1], _EMPTY).get(path[2])
        return cap.value if isinstance(cap, Capacity) else MISSING
    if kind == "driver":
        return device.key.driver
    return device.allow_multiple_allocations


def _forget(columns: dict[tuple[object, ...], weakref.ref[Column]], values: tuple[object, ...],
            ref: weakref.ref[Column]) -> None:
    if columns.get(values) is ref:  # not a newer column for the same values
        del columns[values]


def base_fields(driver: str, capacity_names: tuple[str, ...]) -> tuple[Field, ...]:
    """What pricing needs uniform within a group: driver, memory, sharing, taints, and the
    capacities a request asks for (unqualified names are in the driver's domain)."""
    fields = [DRIVER, ("capacity", driver, MEMORY), MULTI, TAINTS]
    for name in capacity_names:
        domain, _, ident = name.rpartition("/")
        fields.append(("capacity", domain or driver, ident))
    return tuple(fields)


class ColumnTable:
    """Interns columns and field names across pools; one per inventory.

    Weak values: a column goes away with the last pool using it (UUID columns are one
    per pool, and pools are rebuilt on every slice update).
    """

    def __init__(self) -> None:
        # A dict of weak references rather than a WeakValueDictionary, whose lookups run
        # in Python: 5,000 pools x 20 fields go through here at every relist.
        self._columns: dict[tuple[object, ...], weakref.ref[Column]] = {}
        self._fields: dict[Field, Field] = {}

    def index(self, devices: tuple[Device, ...]) -> PoolIndex:
        """The pool's field names: set unions in C, no value read."""
        names = {DRIVER, MULTI, TAINTS}
        for kind in ("attributes", "capacity"):
            maps = [d.attributes for d in devices] if kind == "attributes" else [d.capacity for d in devices]
            for domain in set().union(*maps):
                idents: set[str] = set().union(*[m.get(domain, _EMPTY) for m in maps])
                names.update(self._field((kind, domain, ident)) for ident in idents)
        return PoolIndex(devices, frozenset(names), self)

    def column(self, devices: tuple[Device, ...], name: Field) -> Column:
        """Read one field on a pool's devices: one comprehension, about 50 ns a device;
        only values other than strings and ints go through `_typed`."""
        kind = name[0]
        raw: list[object]
        if kind == "driver":
            raw = [d.key.driver for d in devices]
        elif kind == "allowMultipleAllocations":
            raw = [d.allow_multiple_allocations for d in devices]
        elif kind == "taints":
            raw = [d.taints for d in devices]
        elif kind == "capacity":
            caps = [d.capacity.get(name[1], _EMPTY).get(name[2]) for d in devices]
            raw = [MISSING if c is None else id(c) for c in caps]
        else:
            raw = [d.attributes.get(name[1], _EMPTY).get(name[2], MISSING) for d in devices]
            if not set(map(type, raw)) <= _PLAIN:
                raw = [_typed(v) for v in raw]  # type: ignore[arg-type]
        return self._column(tuple(raw))

    def _column(self, values: tuple[object, ...]) -> Column:
        ref = self._columns.get(values)
        found = ref() if ref is not None else None
        if found is None:
            found = Column(values)
            self._columns[values] = weakref.ref(found, functools.partial(_forget, self._columns, values))
        return found

    def _field(self, field: Field) -> Field:
        return self._fields.setdefault(field, field)
