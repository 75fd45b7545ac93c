"""Per-pool columns: the values every device field takes over one pool's devices.

Neighbours: `quota.devices.inventory` indexes each usable pool once, when it rebuilds that pool
(`ColumnTable.index`); `quota.devices.partitions` groups devices by columns instead of reading
devices; `quota.devices.selectors` keys its verdicts with `cel_value`.

Why: the first selector to read a field used to read that field on every device of the
inventory (~3 µs a device, ~190 ms at 58,000 devices). Reading every field of a pool once
when the pool is built costs about as much as one such scan, and afterwards a field is a
dictionary lookup per pool. Columns are interned (the 2,000 H100 nodes share one
`architecture` column object), so pools compare by identity, not value by value.

A column holds grouping keys, not raw values: they must be equal exactly when CEL cannot
tell the values apart, and may be finer. Python has `1 == True` with equal hashes, CEL
does not, so bools (also inside list attributes) get their own tokens; capacities are
keyed by identity (`quota.objects.slices` interns equal ones, and hashing their Fractions
dominated grouping time), which also keeps a group uniform in its request policy.

A selector that only tests a field for presence reads its presence column
(`presence(field)`), derived once per distinct column, so a `uuid` (one column per pool)
tested with `has()` groups like any field every device has. And a device whose version
attribute CEL cannot parse fails every selector (`quota.cel.activation`): the ERROR
column, present only in pools holding such a device, keeps it out of healthy groups.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from dataclasses import dataclass

from quota.cel.activation import activation_error, version_error
from quota.values.model import MEMORY, AttributeValue, Capacity, Device, Version

__all__ = ["Field", "Column", "PoolIndex", "ColumnTable", "MISSING", "DRIVER", "MULTI", "TAINTS", "ERROR", "SOURCED",
           "ERROR_AT", "DRIVER_AT", "MULTI_AT", "base_fields", "cel_value", "key_of", "untyped", "presence", "column"]

# A `quota.cel` DevicePath (("attributes" | "capacity", domain, id), ("driver",),
# ("allowMultipleAllocations",)), or ("taints",), which pricing needs uniform in a group.
Field = tuple[str, ...]
DRIVER: Field = ("driver",)
MULTI: Field = ("allowMultipleAllocations",)
TAINTS: Field = ("taints",)
# Per device, why CEL cannot see it (quota.cel.activation.activation_error), or None.
ERROR: Field = ("error",)
# Per device, the memory a memory source gives it (`quota.devices.memorysources`), by identity:
# not a CEL field (the scheduler sees no such capacity), but pricing needs it uniform.
SOURCED: Field = ("sourcedMemory",)
# presence(field) = (PRESENCE, *field): whether the device has the field, not its value.
PRESENCE = "present"

# Private tokens: no attribute value can equal them.
MISSING = object()
_TRUE, _FALSE, _PRESENT = object(), object(), object()
_EMPTY: dict[str, object] = {}


class Column:
    """One field's keys by device position in a pool; interned, so compared by identity."""

    __slots__ = ("values", "_presence", "__weakref__")

    def __init__(self, values: tuple[object, ...]) -> None:
        self.values = values
        self._presence: Column | None = None

    def presence(self) -> Column:
        """Which devices have the field at all: few distinct ones, whatever the values."""
        if self._presence is None:
            self._presence = _presence_column(tuple([_PRESENT if v is not MISSING else MISSING for v in self.values]))
        return self._presence


# Interned like the table's columns (identity is what grouping compares); the distinct
# presence patterns are few (per pool size, mostly "all present"), so a bounded cache.
@functools.lru_cache(maxsize=4096)
def _presence_column(values: tuple[object, ...]) -> Column:
    return Column(values)


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class PoolIndex:
    """A usable pool's devices and the column of every field any of them has.

    A field no device of the pool has is absent from `columns`: reads MISSING everywhere.
    """

    devices: tuple[Device, ...]
    columns: Mapping[Field, Column]


# Types that are their own grouping keys (`object` is MISSING's).
_PLAIN = frozenset({str, int, object})


def _attribute_maps(devices: tuple[Device, ...]) -> dict[str, list[Mapping[str, object]]]:
    domains = set().union(*[d.attributes for d in devices])
    return {domain: [d.attributes.get(domain, _EMPTY) for d in devices] for domain in domains}


def _capacity_maps(devices: tuple[Device, ...]) -> dict[str, list[Mapping[str, object]]]:
    domains = set().union(*[d.capacity for d in devices])
    return {domain: [d.capacity.get(domain, _EMPTY) for d in devices] for domain in domains}


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


def presence(path: Field) -> Field:
    return (PRESENCE, *path)


def column(pool: PoolIndex, field: Field) -> Column | None:
    """The pool's column for `field`, a presence field included (None: no device has it)."""
    if field[0] == PRESENCE:
        found = pool.columns.get(field[1:])
        return None if found is None else found.presence()
    return pool.columns.get(field)


def key_of(value: AttributeValue) -> object:
    """The column key of an attribute value (a literal a selector compares with)."""
    return _typed(value)


def untyped(key: object) -> AttributeValue:
    """The value an attribute or MULTI column's key stands for (not MISSING; capacity
    keys are identities and stand for nothing)."""
    if key is _TRUE:
        return True
    if key is _FALSE:
        return False
    if type(key) is tuple:
        kind, inner = key
        return Version(inner) if kind is Version else tuple([untyped(k) for k in inner])  # type: ignore[return-value]
    return key  # type: ignore[return-value]


def cel_value(device: Device, path: Field) -> object:
    """The key of what CEL sees at `path` on `device` (capacities by amount, not identity:
    verdicts are cached across inventory changes, where an identity could be reused)."""
    kind = path[0]
    if kind == PRESENCE:
        return cel_value(device, path[1:]) is not MISSING
    if kind == "attributes":
        return _typed(device.attributes.get(path[1], _EMPTY).get(path[2], MISSING))  # type: ignore[arg-type]
    if kind == "capacity":
        cap = device.capacity.get(path[1], _EMPTY).get(path[2])
        return cap.value if isinstance(cap, Capacity) else MISSING
    if kind == "driver":
        return device.key.driver
    return device.allow_multiple_allocations


def _broken(value: object) -> bool:
    if type(value) is Version:
        return version_error(value.text) is not None
    return type(value) is tuple and any(map(_broken, value))


def _forget(columns: dict[tuple[object, ...], weakref.ref[Column]], values: tuple[object, ...],
            ref: weakref.ref[Column]) -> None:
    if columns.get(values) is ref:  # not a newer column for the same values
        del columns[values]


# Where base_fields puts the fields callers read back from group keys.
ERROR_AT, DRIVER_AT, MULTI_AT = 0, 1, 3


def base_fields(driver: str, capacity_names: tuple[str, ...]) -> tuple[Field, ...]:
    """What pricing needs uniform within a group: ERROR, driver, memory, sharing, taints,
    sourced memory, and the capacities a request asks for (unqualified names are in the
    driver's domain)."""
    fields = [ERROR, DRIVER, ("capacity", driver, MEMORY), MULTI, TAINTS, SOURCED]
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
        """Read every field of every device once. Field by field rather than device by
        device: each column is then one comprehension (about 50 ns a device), and only
        columns holding other than strings and ints go through `_typed`."""
        columns: dict[Field, Column] = {
            DRIVER: self._column(tuple([d.key.driver for d in devices])),
            # Tokens, not bools: interning by value would hand an int column of 0s
            # the same object, and keys must decode to values (`untyped`).
            MULTI: self._column(tuple([_TRUE if d.allow_multiple_allocations else _FALSE for d in devices])),
            TAINTS: self._column(tuple([d.taints for d in devices])),
        }
        if any(d.sourced_memory is not None for d in devices):
            columns[SOURCED] = self._column(tuple([MISSING if d.sourced_memory is None else id(d.sourced_memory)
                                                   for d in devices]))
        broken = False
        for kind, per_domain in (("attributes", _attribute_maps), ("capacity", _capacity_maps)):
            for domain, maps in per_domain(devices).items():
                for ident in set().union(*maps):
                    raw = [m.get(ident, MISSING) for m in maps]
                    if kind == "capacity":
                        values = tuple([MISSING if v is MISSING else id(v) for v in raw])
                    elif set(map(type, raw)) <= _PLAIN:
                        values = tuple(raw)
                    else:
                        values = tuple([_typed(v) for v in raw])  # type: ignore[arg-type]
                        broken = broken or any(map(_broken, set(raw)))
                    columns[self._field((kind, domain, ident))] = self._column(values)
        if broken:
            columns[ERROR] = self._column(tuple([activation_error(d) for d in devices]))
        return PoolIndex(devices, columns)

    def _column(self, values: tuple[object, ...]) -> Column:
        ref = self._columns.get(values)
        found = ref() if ref is not None else None
        if found is None:
            found = Column(values)
            self._columns[values] = weakref.ref(found, functools.partial(_forget, self._columns, values))
        return found

    def _field(self, field: Field) -> Field:
        return self._fields.setdefault(field, field)
