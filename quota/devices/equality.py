"""Selectors that pin one device, answered from an equality index, not by evaluating every device.

Neighbours: `quota.cel.references.equalities` finds a selector's top-level
`device.attributes["d"].x == <literal>` terms; `quota.devices.selectors` asks `index_term`
whether a request's stage can be answered this way and `EqualityIndex.candidates` for
the devices it must still evaluate; `quota.devices.columns` gives each pool's column of the
attribute, which the index inverts.

Why: a never-seen `uuid == "GPU-..."` (or a serial, a node name) made a group of every
device (the uuid is unique), and CEL ran on each: 90-178 ms a claim at 40,000 devices.
The index maps each value of one attribute to the devices holding it, so the claim
evaluates one device.

Why the verdicts are exactly those of evaluating every device: on a device whose
attribute holds another value (of any type: CEL's heterogeneous equality says false,
no error) the term is false, and `&&` absorbs whatever the other terms would do, so the
selector is false there and the stage stops. Two things `&&` does not absorb are ruled
out before the index is used: exceeding the cost limit (the selector's static estimate
must be below it) and a failure of an earlier selector of the stage (only the first
selector's terms are used). Every other device is evaluated as before: those holding
the value, and those lacking the attribute (where the term errors, and the error must
surface as it does today). Earlier stages (the class's selectors) still run over every
device group, so their errors surface too; only which failing device a message names
may differ, as iteration order does.

Kept like the partitions: built lazily per attribute (on a fresh object, with pause
points: 58,000 devices take tens of milliseconds), refreshed per pool from the
inventory's journal, rebuilt when the journal cannot tell.
"""

from __future__ import annotations

from collections.abc import Mapping

from quota.cel import COST_LIMIT
from quota.devices.columns import MISSING, Field, PoolIndex, key_of
from quota.devices.verdicts import Stage
from quota.values.work import pause_point

__all__ = ["EqualityIndex", "index_term", "worth_indexing", "INDEX_SHARE"]

PoolKey = tuple[str, str]
Candidate = tuple[PoolKey, int]
# The index answers a stage only when it leaves at most 1/INDEX_SHARE of the devices to
# evaluate: a value many devices share (a product name) groups well already.
INDEX_SHARE = 8
# Values sampled (from the first pools holding the attribute) to tell an attribute worth
# an index (mostly distinct: a uuid, a serial) from one that groups (a product name).
_SAMPLE = 256


def index_term(stage: Stage) -> tuple[Field, object] | None:
    """(attribute field, column key of the literal) the stage can be answered by (module doc)."""
    if not stage.selectors:
        return None
    first = stage.selectors[0]
    if not first.equalities or first.estimated_cost is None or first.estimated_cost >= COST_LIMIT:
        return None
    path, literal = first.equalities[0]
    return path, key_of(literal)


def worth_indexing(field: Field, pools: Mapping[PoolKey, PoolIndex]) -> bool:
    """Whether most sampled values of `field` are distinct (only then is an index small
    against grouping, and quick to answer)."""
    sample: list[object] = []
    for pool in pools.values():
        column = pool.columns.get(field)
        if column is not None:
            sample.extend(v for v in column.values if v is not MISSING)
            if len(sample) >= _SAMPLE:
                break
    return len(sample) > 1 and len(set(sample)) * 2 >= len(sample)


class EqualityIndex:
    """One attribute's devices by value (column keys), MISSING for those without it."""

    def __init__(self, field: Field) -> None:
        self.field = field
        self.generation = -1
        # A list per value (mostly of one device: ~130 bytes a device at 58,000 devices).
        self._by_value: dict[object, list[Candidate]] = {}
        # What each pool contributed, to take it out again when the pool is rebuilt.
        self._pools: dict[PoolKey, tuple[object, ...]] = {}

    def rebuild(self, pools: Mapping[PoolKey, PoolIndex]) -> None:
        self._by_value.clear()
        self._pools.clear()
        for done, (pool_key, pool) in enumerate(list(pools.items())):
            if not done % 64:
                pause_point()
            self._add(pool_key, pool)

    def refresh(self, changed: set[PoolKey], pools: Mapping[PoolKey, PoolIndex]) -> None:
        for pool_key in changed:
            self._remove(pool_key)
            pool = pools.get(pool_key)
            if pool is not None:
                self._add(pool_key, pool)

    def count(self, key: object) -> int:
        """How many `candidates(key)` are, without listing them."""
        return len(self._by_value.get(key, ())) + len(self._by_value.get(MISSING, ()))

    def candidates(self, key: object) -> list[Candidate]:
        """The devices holding `key`, then those lacking the attribute."""
        return [*self._by_value.get(key, ()), *self._by_value.get(MISSING, ())]

    def _add(self, pool_key: PoolKey, pool: PoolIndex) -> None:
        column = pool.columns.get(self.field)
        values = column.values if column is not None else (MISSING,) * len(pool.devices)
        self._pools[pool_key] = values
        for position, value in enumerate(values):
            found = self._by_value.get(value)
            if found is None:
                self._by_value[value] = [(pool_key, position)]
            else:
                found.append((pool_key, position))

    def _remove(self, pool_key: PoolKey) -> None:
        values = self._pools.pop(pool_key, None)
        for value in set(values or ()):
            left = [c for c in self._by_value[value] if c[0] != pool_key]
            if left:
                self._by_value[value] = left
            else:
                del self._by_value[value]
