"""The webhook's small caches: reflector stores that feed the inventory, classes, namespaces and ledger.

Neighbours: `kube.watching.Reflector` calls these stores (synchronously, one event at a
time); `commands.wiring` builds one reflector per store; the claims' store, with its
relist, is `kube.claimstore` (it parses with `parse_or_skip` and tells `QuotasChanged`
as these do); the handlers in `webhook.claimreview` read what they keep through
`ClaimContext`. Each adapter turns the raw objects of one kind into the domain's
updates and nothing else.

A store must never raise (`kube.watching.Store`): one malformed object would stop its
reflector and freeze the whole cache. So every object is parsed on its own, and one
that cannot be parsed is logged with its kind, namespace and name and skipped; the
rest of the list or stream still applies.

The quota stores (and the claim store) tell `changed` the quotas whose status may have
moved after each event: the keys the ledger's mutation returned (as kueue's cache returns them),
None after a whole list; the Namespace store tells its namespace, and, as it gives the
ledger every Namespace's labels (`Ledger.set_namespace`: which ClusterDeviceQuotas
select it), the teams a relabel moved it into or out of. Two quota stores feed the
ledger: DeviceQuotas and ClusterDeviceQuotas. The quota controller
(`controllers.quotas`) and the governed labels (`controllers.governed`) learn what to
look at again without a watch of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any, TypeVar

from quota.accounting.ledger import QuotaKey, shown
from quota.accounting.ledgerentry import Entry
from quota.accounting.reservationrecord import parse_version
from quota.admission.admitter import Admitter, Repriced
from quota.devices.inventory import Inventory
from quota.objects.claims import Claim, parse_device_class
from quota.objects.claimspec import ClaimError
from quota.objects.slices import ParsedSlice, SliceError, parse_slice
from quota.quotas.devicequota import (
    CLUSTER_KIND,
    KIND,
    DeviceQuota,
    QuotaError,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.values.meta import NamespaceError, parse_namespace
from quota.values.model import DeviceClass, DeviceClassName, Namespace
from quota.values.raw import Obj
from quota.values.work import pause_point
from runtime.guard import guarded

__all__ = ["ClassStore", "NamespaceStore", "QuotaStore", "QuotasChanged", "SliceStore", "StagedSlices", "parse_or_skip"]

log = logging.getLogger(__name__)

T = TypeVar("T")
# Told the DeviceQuotas whose status may have moved (None: any), module doc.
QuotasChanged = Callable[[Iterable[QuotaKey] | None], None]
# What the domain parsers raise for an object they refuse (all ValueError subclasses).
_PARSE_ERRORS = (SliceError, ClaimError, QuotaError, NamespaceError, ValueError, KeyError, TypeError)


def _describe(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    namespace, name = meta.get("namespace"), meta.get("name")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def parse_or_skip(kind: str, obj: Mapping[str, Any], parse: Callable[[Mapping[str, Any]], T]) -> T | None:
    """`parse(obj)`, or None after logging why the object is skipped (every cache's
    stores use it: `controllers.kueue` too)."""
    try:
        return parse(obj)
    except _PARSE_ERRORS as err:
        log.warning("skipping %s: %s", _describe(kind, obj), err)
        return None


class SliceStore:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    def replace(self, objects: list[Obj]) -> None:
        try:
            self.inventory.replace_all(objects)
        except _PARSE_ERRORS:
            # Rare: find the culprits one by one (each is logged), then swap in the rest.
            self.inventory.replace_all([o for o in objects if parse_or_skip("ResourceSlice", o, _check_slice) is not None])

    def relist(self) -> StagedSlices:
        """`replace` a piece at a time (`kube.watching.StagedStore`): each slice parsed as it
        arrives and its object let go (5,000 slices of 128 GPUs are ~280 MB as objects,
        twice what the inventory keeps of them); a malformed one is logged and skipped, as
        `replace` skips it."""
        return StagedSlices(self.inventory)

    def upsert(self, obj: Obj) -> None:
        parse_or_skip("ResourceSlice", obj, self.inventory.add_or_update_slice)

    def delete(self, obj: Obj) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if isinstance(name, str):
            self.inventory.delete_slice(name)


class StagedSlices:
    """A relist of `SliceStore` built a piece at a time: the slices parsed, swapped in at `commit`."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.items: list[ParsedSlice] = []

    def add(self, objects: Iterable[Obj]) -> None:
        for obj in objects:
            if (item := parse_or_skip("ResourceSlice", obj, self.inventory.parsed)) is not None:
                self.items.append(item)
            pause_point()

    def commit(self) -> None:
        items, self.items = self.items, []
        self.inventory.replace_parsed(items)

    def cancel(self) -> None:
        self.items = []


def _check_slice(obj: Mapping[str, Any]) -> bool:
    parse_slice(obj)  # the inventory's own parser: the same verdict replace_all reaches
    return True


class ClassStore:
    """DeviceClasses by name, in the live map the `Pricer` reads."""

    def __init__(self, classes: MutableMapping[DeviceClassName, DeviceClass]) -> None:
        self.classes = classes

    def replace(self, objects: list[Obj]) -> None:
        parsed = [c for c in (parse_or_skip("DeviceClass", o, parse_device_class) for o in objects) if c is not None]
        self.classes.clear()
        self.classes.update((c.name, c) for c in parsed)

    def upsert(self, obj: Obj) -> None:
        cls = parse_or_skip("DeviceClass", obj, parse_device_class)
        if cls is not None:
            self.classes[cls.name] = cls

    def delete(self, obj: Obj) -> None:
        self.classes.pop(DeviceClassName(str((obj.get("metadata") or {}).get("name"))), None)


class NamespaceStore:
    """Namespace labels by name: the adminAccess label rule reads them; `changed` is told
    each event's namespace (None after a whole list). With an `admitter`, the ledger is
    told them too (module doc), before `changed`: a relabel moves the namespace's usage
    between teams at once, and `quotas_changed` is told the teams it moved."""

    def __init__(self, labels: MutableMapping[str, Mapping[str, str]], *,
                 changed: Callable[[str | None], None] = lambda namespace: None,
                 admitter: Admitter | None = None, quotas_changed: QuotasChanged = lambda keys: None,
                 reprice: Callable[[Claim, Entry], None] | None = None) -> None:
        self.labels = labels
        self.changed = changed
        self.admitter = admitter
        self.quotas_changed = quotas_changed
        self.reprice = reprice
        # The highest resourceVersion of a Namespace listed or delivered (its deletion
        # included): a ClusterDeviceQuota's `namespacesThrough` is raised to it
        # (`quota.accounting.reservations`). Not the watch's position: a list's or a bookmark's
        # version is no Namespace event, and another replica's watch might not pass it
        # for a minute; every watch passes the version of a real Namespace write.
        self.newest: int | None = None

    def _seen(self, obj: Obj) -> None:
        meta = obj.get("metadata")
        version = parse_version(meta.get("resourceVersion")) if isinstance(meta, dict) else None
        if version is not None and (self.newest is None or version > self.newest):
            self.newest = version

    def replace(self, objects: list[Obj]) -> None:
        for obj in objects:
            self._seen(obj)
        parsed = [n for n in (parse_or_skip("Namespace", o, parse_namespace) for o in objects) if n is not None]
        gone = set(self.labels) - {n.name for n in parsed}
        self.labels.clear()
        self.labels.update((n.name, n.labels) for n in parsed)
        if self.admitter is not None:
            for name in gone:
                self.admitter.ledger.delete_namespace(Namespace(name))
            for ns in parsed:
                self._teams(ns.name, ns.labels)
            self.quotas_changed(None)
        self.changed(None)

    def upsert(self, obj: Obj) -> None:
        self._seen(obj)
        ns = parse_or_skip("Namespace", obj, parse_namespace)
        if ns is not None:
            self.labels[ns.name] = ns.labels
            if self.admitter is not None:
                self.quotas_changed(self._teams(ns.name, ns.labels))
        self.changed(_name(obj))

    def delete(self, obj: Obj) -> None:
        self._seen(obj)
        self.labels.pop(_name(obj), None)
        if self.admitter is not None:
            self.quotas_changed(self.admitter.ledger.delete_namespace(Namespace(_name(obj))))
        self.changed(_name(obj))

    def _teams(self, name: str, labels: Mapping[str, str]) -> tuple[QuotaKey, ...]:
        assert self.admitter is not None
        admitter = self.admitter
        repriced = guarded(f"counting the teams of Namespace {name}",
                           lambda: admitter.set_namespace(Namespace(name), labels)) or Repriced()
        return _repriced(admitter, repriced, self.reprice, f"Namespace {name}")


class QuotaStore:
    """DeviceQuotas (`cluster`: ClusterDeviceQuotas) into the ledger; `observe`/`drop` also
    get the raw objects, for the persisted reservations (`kube.quotawriter`) to write
    against the newest one. Deleting a quota drops its usage and reservations with it.

    A quota selecting devices no quota of its namespace selected before has the
    namespace's claims priced again for it (`Admitter.add_or_update_quota`): allocated
    ones at once, unallocated ones handed to `reprice` (`controllers.refine`: budgeted, after
    ready), or, without it, priced here."""

    def __init__(self, admitter: Admitter, *, observe: Callable[[Obj], None] | None = None,
                 drop: Callable[[str, str], None] | None = None,
                 reprice: Callable[[Claim, Entry], None] | None = None,
                 changed: QuotasChanged = lambda keys: None, cluster: bool = False) -> None:
        self.admitter = admitter
        self.ledger = admitter.ledger
        self.observe = observe
        self.drop = drop
        self.reprice = reprice
        self.changed = changed
        self.cluster = cluster
        self.kind = CLUSTER_KIND if cluster else KIND
        self.parse = parse_cluster_device_quota if cluster else parse_device_quota

    def replace(self, objects: list[Obj]) -> None:
        parsed = [q for q in (parse_or_skip(self.kind, o, self.parse) for o in objects) if q is not None]
        keep = {(q.namespace, q.name) for q in parsed}
        for quota in self.ledger.quotas():
            if quota.cluster == self.cluster and (quota.namespace, quota.name) not in keep:
                self.ledger.delete_quota(quota.namespace, quota.name)
                if self.drop is not None:
                    self.drop(quota.namespace, quota.name)
        for quota in parsed:
            self._count(quota)
        if self.observe is not None:
            for obj in objects:
                self.observe(obj)
        self.changed(None)

    def upsert(self, obj: Obj) -> None:
        quota = parse_or_skip(self.kind, obj, self.parse)
        if quota is not None:
            keys = self._count(quota)
            if self.observe is not None:
                self.observe(obj)
            self.changed(keys)

    def delete(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        namespace = "" if self.cluster else str(meta.get("namespace"))
        keys = self.ledger.delete_quota(Namespace(namespace), str(meta.get("name")))
        if self.drop is not None:
            self.drop(namespace, str(meta.get("name")))
        self.changed(keys)

    def _count(self, quota: DeviceQuota) -> tuple[QuotaKey, ...]:
        """Count `quota`; the quotas whose usage it moved."""
        what = shown((quota.namespace, quota.name))
        repriced = guarded(f"counting {what}",
                           lambda: self.admitter.add_or_update_quota(quota)) or Repriced(((quota.namespace, quota.name),))
        return _repriced(self.admitter, repriced, self.reprice, what)


def _repriced(admitter: Admitter, repriced: Repriced, reprice: Callable[[Claim, Entry], None] | None,
              why: str) -> tuple[QuotaKey, ...]:
    """The keys `repriced` moved; its stale claims handed to `reprice` (priced after ready,
    `controllers.refine`), or, without it, priced here."""
    keys = dict.fromkeys(repriced.keys)
    for claim, entry in repriced.stale:
        if reprice is not None:
            reprice(claim, entry)
        else:
            keys.update(dict.fromkeys(guarded(f"pricing ResourceClaim {claim.namespace}/{claim.name} for {why}",
                                              lambda: admitter.reserve_existing(claim)) or ()))
    return tuple(keys)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""
