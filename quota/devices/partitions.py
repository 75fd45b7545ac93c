"""The usable devices grouped by the values of a chain of field sets, kept per pool.

Neighbours: `quota.devices.columns` gives each pool's columns; `quota.devices.selectors` builds one
`Partition` per chain of field sets its selectors read (the base fields pricing needs
first) and evaluates CEL once per distinct group key.

Why it is fast: a pool's groups are a `State`, (key, device positions) pairs, and pools
in the same state form a class. Refining a level by new fields looks up one column per
pool and field (a dict lookup, whatever the pool's size), buckets each class's pools by
those column objects (interned, so compared by identity), and splits the positions once
per bucket: the work is one lookup per pool plus the distinct shapes, never a read of
each device. Tens of thousands of devices fall into a few dozen classes.

Incremental: a level remembers each pool's state, so after a slice update only the
rebuilt pools move between classes (`refresh`), level by level from the base.

A full `rebuild` (a field chain read for the first time: per device, 100+ ms at 58,000
devices) has pause points (`quota.values.work`): `quota.devices.selectors` runs it on a fresh level,
installed only once complete, over a snapshot of the parent's classes, since a paused
rebuild may see the parent refreshed in place meanwhile (the journal then catches the
new level up). `refresh` moves a few pools and never pauses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from quota.devices.columns import MISSING, PRESENCE, Column, Field, PoolIndex, column
from quota.values.work import paced, pause_point

__all__ = ["GroupKey", "State", "Part", "Partition", "FieldsOf", "Superseded"]

PoolKey = tuple[str, str]
GroupKey = tuple[object, ...]
# A pool's columns for a level's fields (None: a field no device of the pool has).
Signature = tuple[Column | None, ...]
# A pool's groups: (key, ascending device positions), disjoint, covering the pool.
State = tuple[tuple[GroupKey, tuple[int, ...]], ...]
# One piece of a merged group: the same positions in each of these pools.
Part = tuple[tuple[PoolIndex, ...], tuple[int, ...]]
# The fields a level splits by for a pool (the base fields depend on its driver; a
# `quota.devices.columns.presence` field splits by presence alone), or None when a selector
# reads `device` as a whole: then every device is its own group.
FieldsOf = Callable[[PoolIndex], tuple[Field, ...] | None]


@functools.lru_cache(maxsize=1024)
def _whole(n: int) -> State:
    return (((), tuple(range(n))),) if n else ()


@dataclass(slots=True)
class Partition:
    """One level: the parent's groups split by `fields_of` (the base level has no parent)."""

    parent: Partition | None
    fields_of: FieldsOf
    generation: int = -1
    states: dict[PoolKey, State] = field(default_factory=dict)
    classes: dict[State, dict[PoolKey, PoolIndex]] = field(default_factory=dict)
    steps: int = 0  # pauses its rebuild passed: whether it moves (`quota.devices.selectors` waits on it)

    def rebuild(self, indexes: Mapping[PoolKey, PoolIndex], present: Mapping[Field, int],
                done_elsewhere: Callable[[], Partition | None] = lambda: None) -> int:
        """Recompute every pool, one split per (class, columns); returns the pools done.

        `done_elsewhere`: asked after each pause, the same level another caller completed
        meanwhile; then this one stops (`Superseded`). Every review arriving after a
        relist of the slices rebuilds the level it needs until one is installed: without
        this, each went on to the end of its own (~0.1 s each) and the slow lane's queue
        outgrew the reviews' deadlines (bench/stalls.py)."""
        self.states.clear()
        self.classes.clear()
        parents = _by_shape(indexes) if self.parent is None else list(self.parent.classes.items())
        for parent_state, members in parents:
            self.steps += 1
            _pause(done_elsewhere)
            if not members:
                continue  # emptied by a refresh while this rebuild paused
            # One class has one driver (see _by_shape), hence the same fields.
            fields = self.fields_of(next(iter(members.values())))
            for signature, bucket in _buckets(members, fields, present):
                self.steps += 1
                _pause(done_elsewhere)
                state = self._split(parent_state, signature, next(iter(bucket.values())))
                self.states.update(dict.fromkeys(bucket, state))
                # One lookup: a state hashes every key in it, and tuples cache no hash.
                found = self.classes.setdefault(state, bucket)
                if found is not bucket:
                    found.update(bucket)
        return len(self.states)

    def refresh(self, changed: Iterable[PoolKey], indexes: Mapping[PoolKey, PoolIndex]) -> int:
        """Move only the `changed` pools (the parent level is refreshed already)."""
        done = 0
        for pool_key in changed:
            old = self.states.pop(pool_key, None)
            if old is not None:
                members = self.classes[old]
                del members[pool_key]
                if not members:
                    del self.classes[old]
            pool = indexes.get(pool_key)
            if pool is None:
                continue
            parent_state = _whole(len(pool.devices)) if self.parent is None else self.parent.states.get(pool_key)
            if parent_state is None:
                continue
            fields = self.fields_of(pool)
            signature = None if fields is None else tuple([column(pool, f) for f in fields])
            state = self._split(parent_state, signature, pool)
            self.states[pool_key] = state
            self.classes.setdefault(state, {})[pool_key] = pool
            done += 1
        return done

    @staticmethod
    def _split(state: State, signature: Signature | None, pool: PoolIndex) -> State:
        if signature is None:
            # Per device: identities of live devices never collide across pools.
            return tuple(((*key, id(pool.devices[p])), (p,)) for key, positions in state for p in positions)
        if signature.count(None) == len(signature):
            # No device of the pool has any of the fields: nothing splits.
            extra = (MISSING,) * len(signature)
            return tuple(((*key, *extra), positions) for key, positions in state)
        absent = (MISSING,) * len(pool.devices)
        columns = [absent if c is None else c.values for c in signature]
        out: list[tuple[GroupKey, tuple[int, ...]]] = []
        for key, positions in state:
            # Column by column, then zipped; keys of distinct parent groups never meet.
            subs = [key + row for row in zip(*[[values[p] for p in positions] for values in columns])]
            distinct = len(set(subs))
            if distinct == 1:
                out.append((subs[0], positions))
            elif distinct == len(subs):
                # Every device apart (a per-device field such as a uuid): no dict needed.
                out.extend(zip(subs, [(p,) for p in positions]))
            else:
                split: dict[GroupKey, list[int]] = {}
                for p, sub in zip(positions, subs):
                    found = split.get(sub)
                    if found is None:
                        split[sub] = [p]
                    else:
                        found.append(p)
                out.extend((sub, tuple(group)) for sub, group in split.items())
        return tuple(out)


class Superseded(Exception):
    """A rebuild stopped: `partition`, the same level, was completed by another caller."""

    def __init__(self, partition: Partition) -> None:
        super().__init__("superseded")
        self.partition = partition


def _pause(done_elsewhere: Callable[[], Partition | None]) -> None:
    pause_point()
    if (done := done_elsewhere()) is not None:
        raise Superseded(done)


def _buckets(
    members: dict[PoolKey, PoolIndex], fields: tuple[Field, ...] | None, present: Mapping[Field, int]
) -> list[tuple[Signature | None, dict[PoolKey, PoolIndex]]]:
    """One class's pools by their columns for `fields`.

    A field no pool has (`present`: pools per field) costs nothing per pool: a tenant
    inventing names splits nothing. Otherwise a dict lookup per pool and field, then one
    pass over the pools, pausing (`quota.values.work.paced`): a class of 5,000 pools split in C,
    a pass per distinct column set over a list of every pool's, held the loop 44 ms
    (bench/stalls.py).
    """
    if fields is None:
        # Whole-device reads: every pool splits on its own.
        return [(None, {key: pool}) for key, pool in members.items()]
    # One snapshot: reading the columns pauses, and a refresh may move pools meanwhile.
    items = list(members.items())
    pools = [pool for _, pool in items]
    nowhere: list[Column | None] = [None] * len(pools)
    per_field = [_column_per_pool(pools, f) if present.get(f[1:] if f[0] == PRESENCE else f) else nowhere
                 for f in fields]
    if all(column is nowhere for column in per_field):
        return [((None,) * len(fields), dict(items))]  # a copy: levels move pools apart
    # Columns hash by identity (interned), so signatures are cheap to hash and compare.
    buckets: dict[Signature, dict[PoolKey, PoolIndex]] = {}
    for (key, pool), signature in paced(zip(items, zip(*per_field))):
        found = buckets.get(signature)
        if found is None:
            buckets[signature] = {key: pool}
        else:
            found[key] = pool
    return list(buckets.items())


def _column_per_pool(pools: list[PoolIndex], field: Field) -> list[Column | None]:
    """Per pool (5,000 of them: tens of ms for a presence field), pausing (`quota.values.work.paced`)."""
    if field[0] != PRESENCE:
        return [pool.columns.get(field) for pool in paced(pools)]
    return [column(pool, field) for pool in paced(pools)]


def _by_shape(indexes: Mapping[PoolKey, PoolIndex]) -> list[tuple[State, dict[PoolKey, PoolIndex]]]:
    """The base level's parent: every pool whole, by size and driver."""
    out: dict[tuple[int, str], dict[PoolKey, PoolIndex]] = {}
    for pool_key, pool in paced(list(indexes.items())):
        out.setdefault((len(pool.devices), pool_key[0]), {})[pool_key] = pool
    return [(_whole(size), members) for (size, _), members in out.items()]
