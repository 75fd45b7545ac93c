"""Which Event an occurrence counts under, and when an Event may be written: pure values, no I/O.

Neighbours: `kube.events.EventRecorder` calls `Correlator.correlate` for every occurrence
and `Budget.take` before every write; it owns the queue, the series and the writes.

This follows client-go's EventCorrelator (k8s.io/client-go tools/record/events_cache.go)
and adds what it lacks for a server that records on behalf of many tenants:
- `Similar` is its EventAggregator: occurrences grouped by an aggregate key, told apart by
  a local key; once a group has seen `max_similar` distinct local keys within `interval`,
  later ones count under one "(combined from similar events)" Event. client-go groups by
  the involved object (its note is the local key); `Correlator` does that, then groups
  again by namespace (the object is the local key), so occurrences regarding many objects
  (a denial per claim, each claim new) fold too: client-go's per-object keys leave a
  tenant who names a new object per request one Event per request. The namespace groups
  by the objects' kind as well, so a DeviceQuota's Events never fold into a Pod's.
- `Budget` is its spam filter (a token bucket per source and object, burst 25, one token
  per 5 minutes) applied to writes, not occurrences: an occurrence is always counted, and
  a write the buckets refuse waits until they refill (`take` says when). Beside it, a
  bucket per namespace (one namespace's writes cannot use another's) and one for the
  process (a bound on writes a second to the API server, whatever the number of
  namespaces).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import TypeVar

__all__ = ["COMBINED", "Bucket", "Budget", "Correlator", "EventKey", "Rate", "Ref", "Similar"]

_DEFAULT_NAMESPACE = "default"
# client-go's prefix for an aggregated Event's message (events_cache.go EventAggregate).
COMBINED = "(combined from similar events): "

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Ref:
    """An ObjectReference: what an Event regards or relates to."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    # `kubectl describe` selects Events by the object's uid too: set it where it is known.
    uid: str = ""

    def as_json(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            out["namespace"] = self.namespace
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True, slots=True)
class EventKey:
    """What makes two occurrences the same Event (client-go tools/events `getKey`)."""

    regarding: Ref
    related: Ref | None
    type: str  # Normal | Warning
    reason: str
    action: str
    note: str

    @property
    def namespace(self) -> str:
        """Where the Event lives: its object's namespace; `default` for a cluster-scoped
        object, the only namespace (with kube-system) events.k8s.io/v1 accepts for one."""
        return self.regarding.namespace or _DEFAULT_NAMESPACE


@dataclass(slots=True)
class _Group:
    last: float
    locals: set[Hashable] = field(default_factory=set)
    combined: EventKey | None = None


class Similar:
    """client-go's EventAggregator over any aggregate and local keys, at most `max_entries` groups."""

    def __init__(self, *, max_similar: int = 10, interval: float = 600.0, max_entries: int = 4096) -> None:
        self.max_similar, self.interval, self.max_entries = max_similar, interval, max_entries
        self._groups: OrderedDict[Hashable, _Group] = OrderedDict()

    def fold(self, group: Hashable, local: Hashable, key: EventKey, combined: EventKey, now: float) -> EventKey:
        """`key`, or the group's combined Event once the group has seen enough distinct locals.

        As client-go: a group idle for `interval` starts again; the `max_similar`th distinct
        local key is the first combined. The combined Event is the one made first (`combined`
        then): events.k8s.io/v1 refuses a change of an Event's note, so later occurrences
        count on it rather than renaming it.
        """
        entry = self._groups.get(group)
        if entry is None or now - entry.last > self.interval:
            entry = self._groups[group] = _Group(last=now)
            while len(self._groups) > self.max_entries:
                self._groups.popitem(last=False)
        entry.last = now
        self._groups.move_to_end(group)
        if local in entry.locals:
            return key
        if len(entry.locals) + 1 < self.max_similar:
            entry.locals.add(local)
            return key
        if entry.combined is None:
            entry.combined = combined
        return entry.combined


class Correlator:
    """The key each occurrence counts under: by object as client-go, then by namespace."""

    def __init__(self, *, max_similar: int = 10, interval: float = 600.0, max_entries: int = 4096) -> None:
        self._by_object = Similar(max_similar=max_similar, interval=interval, max_entries=max_entries)
        self._by_namespace = Similar(max_similar=max_similar, interval=interval, max_entries=max_entries)

    def correlate(self, key: EventKey, now: float) -> EventKey:
        combined = EventKey(key.regarding, None, key.type, key.reason, key.action, COMBINED + key.note)
        on_object = (key.regarding, key.type, key.reason, key.action)
        key = self._by_object.fold(on_object, (key.related, key.note), key, combined, now)
        in_namespace = (key.namespace, key.regarding.kind, key.type, key.reason, key.action)
        combined = replace(key, related=None, note=key.note if key.note.startswith(COMBINED) else COMBINED + key.note)
        return self._by_namespace.fold(in_namespace, key.regarding, key, combined, now)


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket's shape: `burst` tokens at most, refilled at `per_second`."""

    burst: int
    per_second: float


@dataclass(frozen=True, slots=True)
class Bucket:
    tokens: float
    at: float

    @classmethod
    def full(cls, rate: Rate, now: float) -> Bucket:
        return cls(float(rate.burst), now)

    def refilled(self, rate: Rate, now: float) -> Bucket:
        return Bucket(min(float(rate.burst), self.tokens + max(0.0, now - self.at) * rate.per_second), now)

    def ready_at(self, rate: Rate) -> float:
        """When this (refilled) bucket holds a whole token."""
        return self.at + max(0.0, 1.0 - self.tokens) / rate.per_second


# client-go's spam filter (events_cache.go defaultSpamBurst, defaultSpamQPS).
PER_OBJECT = Rate(25, 1 / 300)
# A namespace's writes: the object's burst, then one every 10 s whatever its objects.
PER_NAMESPACE = Rate(25, 0.1)
# The process's writes to the API server, all namespaces together.
OVERALL = Rate(50, 20.0)


class Budget:
    """Token buckets a write must take from: its object's, its namespace's and the process's."""

    def __init__(self, *, per_object: Rate = PER_OBJECT, per_namespace: Rate = PER_NAMESPACE,
                 overall: Rate = OVERALL, max_entries: int = 4096) -> None:
        self.per_object, self.per_namespace, self.overall = per_object, per_namespace, overall
        self.max_entries = max_entries
        self._objects: OrderedDict[Ref, Bucket] = OrderedDict()
        self._namespaces: OrderedDict[str, Bucket] = OrderedDict()
        self._overall: Bucket | None = None

    def take(self, key: EventKey, now: float) -> float | None:
        """None when a token was taken from each bucket; else when to ask again (nothing taken)."""
        regarding = key.regarding
        obj = self._refilled(self._objects, regarding, self.per_object, now)
        namespace = self._refilled(self._namespaces, key.namespace, self.per_namespace, now)
        overall = (self._overall or Bucket.full(self.overall, now)).refilled(self.overall, now)
        self._overall = overall
        shaped = ((obj, self.per_object), (namespace, self.per_namespace), (overall, self.overall))
        if any(bucket.tokens < 1.0 for bucket, _ in shaped):
            return max(bucket.ready_at(rate) for bucket, rate in shaped)
        self._objects[regarding] = replace(obj, tokens=obj.tokens - 1)
        self._namespaces[key.namespace] = replace(namespace, tokens=namespace.tokens - 1)
        self._overall = replace(overall, tokens=overall.tokens - 1)
        return None

    def _refilled(self, buckets: OrderedDict[K, Bucket], at: K, rate: Rate, now: float) -> Bucket:
        bucket = buckets.get(at)
        bucket = Bucket.full(rate, now) if bucket is None else bucket.refilled(rate, now)
        buckets[at] = bucket
        buckets.move_to_end(at)
        # A bucket forgotten is a full one: the bound is on memory, a namespace that was
        # idle long enough to be evicted has refilled anyway.
        while len(buckets) > self.max_entries:
            buckets.popitem(last=False)
        return bucket
