"""Reflectors: keep a synchronous store equal to one kind of object on the API server.

Neighbours: `kube.api` does the HTTP; the stores behind the `Store` protocol (adapters
over `quota.devices.inventory` and `quota.accounting.ledger`, later) are pure and synchronous, so each
callback is atomic on the event loop and a decision never sees half an event.

The loop follows client-go's reflector (k8s.io/client-go tools/cache/reflector.go) and
kopf (`_cogs/clients/watching.py`): list (paginated, or streamed: `WatchSettings.stream_list`,
below), hand the store the whole list at once, then watch from the list's resourceVersion with bookmarks, remembering the last
resourceVersion seen. A watch the server ends (timeoutSeconds) is reopened from there; a
connection error or a silent connection is reopened from there after a capped, jittered
exponential backoff; a 410 Gone (as an HTTP status or as an ERROR event) means the server
no longer has events that old, so the only way back is a fresh list, which replaces the
store. `synced` is set after the first complete list, never before. `live` says the
store follows the server now: False from a failed watch or list (the API server gone or
restarting, a 410) until a list lands or a watch is accepted again; a watch the server
ended on its timeout is reopened without ever being not live.

A list goes through `Reflector.rebuild`, which fetches it and hands it to the store's
`replace`: at once by default; `serve` keeps full garbage collections off while the
list arrives and runs `replace` in slices of the event loop (`kube.rebuilds`), so a
relist of 150,000 claims never holds the loop for long. The reflector awaits it before
it watches again, so no event of its kind reaches the store while the store applies a
list: each store builds the new state aside and swaps it in in one step
(`quota.devices.inventory`, `quota.accounting.ledger`).

A streamed list (`Reflector._list_streamed`) is a watch that sends the existing objects
first, as client-go lists with WatchListClient: the API server answers it from its watch
cache in one request, where a big collection's pages each cost it a read of the whole
range. A `StagedStore` takes it a piece at a time as it arrives (built aside all the
same, swapped in at the end), so the raw objects of the whole list are never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol, runtime_checkable

import aiohttp

from kube.api import KubeApi, Listing, Resource
from kube.apierror import ApiError
from quota.values.raw import Obj
from runtime.slicing import in_slices

__all__ = [
    "LAST_APPLIED",
    "Backoff",
    "Progress",
    "Rebuild",
    "Reflector",
    "ReflectorStats",
    "Staged",
    "StagedStore",
    "Store",
    "Trim",
    "WatchSettings",
    "trim_claim",
    "trim_object",
]

logger = logging.getLogger(__name__)

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_SHORT_WATCH = 1.0  # seconds; client-go reflector.go: "watch lasted less than a second"
# The BOOKMARK annotation that closes a streamed list's initial events (KEP-3157).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# Objects of a streamed list staged at once (`Reflector._list_streamed`): a slice of the
# event loop's work, as a page of 100 claims was.
STREAM_BATCH = 100
# Seconds of decoding a streamed list may hold the event loop before giving it back (a
# read may bring hundreds of events; a ResourceSlice of 128 GPUs takes ~1 ms).
STREAM_HOLD = 0.005
# How an API server without streamed lists answers one (`sendInitialEvents` forbidden
# unless the WatchList feature is on: a field error, 422; 400 from an older one).
_STREAM_REFUSED = (400, 422)
Trim = Callable[[Obj], Obj]
# Fetches a list and hands it to a store's `replace` (module doc).
Rebuild = Callable[[Callable[[], Awaitable[list[Obj]]], Callable[[list[Obj]], None]], Awaitable[None]]


async def _staged(relist: Staged, batch: list[Obj]) -> None:
    """`relist.add(batch)` in slices of the event loop (`runtime.slicing`)."""
    await in_slices(lambda: relist.add(batch))


async def _at_once(fetch: Callable[[], Awaitable[list[Obj]]], replace: Callable[[list[Obj]], None]) -> None:
    replace(await fetch())


class Store(Protocol):
    """What a reflector feeds. Synchronous on purpose: no await, so each call is atomic.

    Callbacks must not raise: a reflector has no better answer to a store error than to
    stop, and a stopped reflector means a stale cache.
    """

    def replace(self, objects: list[Obj]) -> None: ...
    def upsert(self, obj: Obj) -> None: ...
    def delete(self, obj: Obj) -> None: ...


class Staged(Protocol):
    """A relist a store builds a piece at a time (`StagedStore.relist`)."""

    def add(self, objects: Iterable[Obj]) -> None: ...
    def commit(self) -> None: ...
    def cancel(self) -> None: ...


@runtime_checkable
class StagedStore(Protocol):
    """A store that can take a list a piece at a time (`kube.claimstore.ClaimStore`):
    a streamed list hands it each object as it arrives, so the whole list's raw objects
    are never held at once; `replace` is `relist`, every piece added, `commit`."""

    def relist(self) -> Staged: ...


# -- trimming -----------------------------------------------------------------------------------


def trim_object(obj: Obj) -> Obj:
    """Drop what no reader needs and what weighs most: managedFields, last-applied annotation.

    A shallow copy (nested values are shared, the input is untouched): 150,000 claims as
    full dicts are about 1 GB, and managedFields is often a third of an object.
    """
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return {**obj, "metadata": meta}


_CLAIM_STATUS_KEPT = ("allocation", "reservedFor")


def trim_claim(obj: Obj) -> Obj:
    """`trim_object`, and of a ResourceClaim's status only what accounting reads.

    `status.allocation` is what is charged and `status.reservedFor` names the consuming
    pods; `status.devices` (driver-written conditions and network data per device) is
    dropped.
    """
    trimmed = trim_object(obj)
    status = obj.get("status")
    if isinstance(status, dict):
        trimmed["status"] = {k: status[k] for k in _CLAIM_STATUS_KEPT if k in status}
    return trimmed


# -- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter, as client-go's wait.Backoff.

    The jitter spreads the reconnects of many replicas after an API server restart, so
    that they do not all list at the same instant (the thundering herd client-go's
    reflector avoids the same way).
    """

    initial: float = 0.2
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.5  # up to this fraction of the delay added at random

    def delay(self, attempt: int, *, rand: float) -> float:
        """Seconds to wait before retry number `attempt` (0-based); `rand` is uniform in [0, 1)."""
        base = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return min(self.cap, base * (1.0 + self.jitter * rand))


@dataclass(frozen=True, slots=True)
class WatchSettings:
    page_size: int = 500
    # Server-side watch length, randomised in [1, 2) times this as client-go's reflector
    # does (minWatchTimeout 5 min) so that watches of many clients do not end together.
    server_timeout: int = 300
    # Longest wait for one read. The API server sends a BOOKMARK about once a minute on a
    # quiet watch (k8s.io/apiserver pkg/storage/cacher, bookmarkFrequency), so a minute
    # and a half of silence means the connection is dead, not the collection quiet.
    silence: float = 90.0
    backoff: Backoff = Backoff()
    # List by a watch that streams the existing objects first (`sendInitialEvents`,
    # KEP-3157), not by pages (module doc); a server that refuses it is listed by pages.
    stream_list: bool = False
    # Server-side length of that watch: it ends once the initial events are in, so this
    # only bounds a first sync that never completes.
    stream_timeout: int = 1800


@dataclass(slots=True)
class ReflectorStats:
    """Plain counters, read by the metrics layer later."""

    lists: int = 0  # complete lists handed to the store (the first one included)
    relists: int = 0  # lists caused by 410 Gone
    restarts: int = 0  # watches reopened after an error or a silent connection
    events: int = 0  # ADDED/MODIFIED/DELETED applied
    bookmarks: int = 0


# -- how far a watch has come -------------------------------------------------------------------


class Progress:
    """The resourceVersion up to which a reflector has applied every event to its store.

    `kube.statuswriter` waits on it before deciding on a DeviceQuota: a writer may
    count a claim only from its own cache once the cache holds it, and
    `quota.accounting.reservations` says when that must be (the watermark). A reflector moves it
    after the store took the list or the event, never before, so `reached(v)` means the
    store reflects every event up to v. Versions are etcd's integers
    (`quota.accounting.reservationrecord.parse_version`); anything else leaves it where it is.
    """

    def __init__(self) -> None:
        self.version: int | None = None
        self._moved = asyncio.Event()

    def advance(self, resource_version: str | None) -> None:
        version = int(resource_version) if resource_version and resource_version.isdigit() else None
        if version is not None and (self.version is None or version > self.version):
            self.version = version
            self._moved.set()

    def has_reached(self, version: int | None) -> bool:
        return version is None or (self.version is not None and self.version >= version)

    async def reached(self, version: int | None, *, timeout: float) -> bool:
        """Wait until the store reflects `version` (None: nothing to wait for); False
        when `timeout` seconds passed first."""
        try:
            async with asyncio.timeout(timeout):
                while not self.has_reached(version):
                    self._moved.clear()
                    await self._moved.wait()
        except TimeoutError:
            return False
        return True


# -- the reflector ------------------------------------------------------------------------------


@dataclass(eq=False)
class Reflector:
    """List and watch one resource into `store`; `await run()` until cancelled."""

    api: KubeApi
    resource: Resource
    store: Store
    namespace: str | None = None
    label_selector: str | None = None
    # e.g. "metadata.name=x": one object, which RBAC can then grant by resourceNames
    # (the API server reads the name of a list or watch from this selector).
    field_selector: str | None = None
    trim: Trim = trim_object
    settings: WatchSettings = WatchSettings()
    rand: Callable[[], float] = random.random
    synced: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    # Told each resourceVersion the store reflects (`Progress`); None: nobody asks.
    progress: Progress | None = None
    # How the store takes a list (module doc).
    rebuild: Rebuild = _at_once
    # The resourceVersion the next watch starts from: the list's, then each event's.
    resource_version: str | None = field(default=None, init=False)
    # False once the API server refused a streamed list (`WatchSettings.stream_list`).
    _streams: bool = field(default=True, init=False, repr=False)
    stats: ReflectorStats = field(default_factory=ReflectorStats, init=False)
    _attempt: int = field(default=0, init=False, repr=False)
    live: bool = field(default=False, init=False)  # module doc

    @property
    def where(self) -> str:
        return f"{self.resource.plural} in {self.namespace}" if self.namespace else f"{self.resource.plural} (all namespaces)"

    async def run(self) -> NoReturn:
        must_list = True
        while True:
            try:
                if must_list:
                    await self._list()
                    must_list = False
                if await self._watch():
                    continue  # the server ended the watch (timeoutSeconds): reopen at once
                self.live = False
            except ApiError as e:
                self.live = False
                if e.status == 410:
                    # reflector.go: an expired resourceVersion ends the watch and relists.
                    logger.info("%s: resourceVersion %s expired (%s), listing again", self.where, self.resource_version, e.message)
                    must_list = True
                    self.stats.relists += 1
                else:
                    logger.warning("%s: %s", self.where, e)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                self.live = False
                # ClientError covers refused/reset connections and the silence timeout
                # (ServerTimeoutError); ValueError a truncated or garbled JSON line.
                logger.warning("%s: watch connection lost (%s: %s), reconnecting", self.where, type(e).__name__, e)
            self.stats.restarts += 1
            delay = self.settings.backoff.delay(self._attempt, rand=self.rand())
            self._attempt += 1
            await asyncio.sleep(delay)

    async def _list(self) -> None:
        if self.settings.stream_list and self._streams:
            try:
                await self._list_streamed()
                return
            except ApiError as e:
                if e.status not in _STREAM_REFUSED:
                    raise
                # An API server without streaming lists (the WatchList feature off)
                # refuses `sendInitialEvents` as invalid: list by pages from now on.
                logger.info("%s: a streamed list was refused (%s), listing by pages", self.where, e)
                self._streams = False
        await self._list_paged()

    async def _list_streamed(self) -> None:
        """The list as a watch that sends the existing objects first, closed by a BOOKMARK
        annotated `k8s.io/initial-events-end` (KEP-3157), as client-go's reflector lists
        with WatchListClient: one request the API server answers from its watch cache,
        each object decoded on its own as it arrives. Against pages: at 150,000 claims a
        page of 100 cost the API server 0.4-1.3 s (a continued page is read at its list's
        revision, every key of the range counted for `remainingItemCount`), so 1,500 pages
        took many minutes; and every page's objects were held until the last arrived. A
        `StagedStore` stages the objects `STREAM_BATCH` at a time as they arrive and lets
        them go; another store gets the whole list, as from pages. The watch is closed at
        the end marker and the next one starts from its resourceVersion."""
        staged_store = self.store if isinstance(self.store, StagedStore) else None
        staged: list[Staged] = []
        end: list[str] = []
        count = 0

        async def fetch() -> list[Obj]:
            nonlocal count
            items: list[Obj] = []
            relist = staged_store.relist() if staged_store is not None else None
            batch: list[Obj] = []
            held_since = time.monotonic()
            try:
                stream = self.api.watch(
                    self.resource,
                    namespace=self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                    timeout_seconds=self.settings.stream_timeout,
                    silence=self.settings.silence,
                    send_initial_events=True,
                )
                async with contextlib.aclosing(stream):
                    async for kind, obj in stream:
                        if kind == "BOOKMARK":
                            meta = obj.get("metadata") or {}
                            if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                                end.append(str(meta.get("resourceVersion") or ""))
                                break
                            continue
                        # Only ADDED comes before the end marker; anything else would be
                        # applied after the list, by the watch that follows it.
                        count += 1
                        (batch if relist is not None else items).append(self.trim(obj))
                        if relist is not None and len(batch) >= STREAM_BATCH:
                            await _staged(relist, batch)
                            batch = []
                        elif time.monotonic() - held_since >= STREAM_HOLD:
                            await asyncio.sleep(0)  # the loop back: one read may hold many events
                        else:
                            continue
                        held_since = time.monotonic()
                if not end:
                    raise ValueError("the streamed list ended before its last object")
                if relist is not None:
                    await _staged(relist, batch)
                    staged.append(relist)
            except BaseException:
                if relist is not None:
                    relist.cancel()
                raise
            return items

        def replace(items: list[Obj]) -> None:
            if staged:
                staged[0].commit()
            else:
                self.store.replace(items)

        await self.rebuild(fetch, replace)
        self._listed(end[0], count)

    async def _list_paged(self) -> None:
        listed: list[Listing] = []

        async def fetch() -> list[Obj]:
            listed.append(await self.api.list(
                self.resource,
                namespace=self.namespace,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                limit=self.settings.page_size,
                transform=self.trim,
            ))
            return listed[0].items

        await self.rebuild(fetch, self.store.replace)
        listing = listed[0]
        self._listed(listing.resource_version, len(listing.items))

    def _listed(self, resource_version: str, count: int) -> None:
        self.resource_version = resource_version
        if self.progress is not None:
            self.progress.advance(self.resource_version)
        self.stats.lists += 1
        self.live = True
        self._attempt = 0
        if not self.synced.is_set():
            logger.info("%s: synced, %d objects at resourceVersion %s", self.where, count, self.resource_version)
        self.synced.set()

    async def _watch(self) -> bool:
        """Watch until the stream ends; False for a watch that ended at once with nothing in it.

        Such a watch is treated as an error (backoff) rather than reopened at once, as
        client-go's reflector.go does ("very short watch"): a proxy or a broken server
        answering every watch with an empty 200 would otherwise be hammered in a loop.
        """
        timeout = int(self.settings.server_timeout * (1.0 + self.rand()))
        started, received = time.monotonic(), 0
        stream = self.api.watch(
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            resource_version=self.resource_version,
            timeout_seconds=timeout,
            silence=self.settings.silence,
            opened=self._opened,
        )
        async with contextlib.aclosing(stream):
            async for kind, obj in stream:
                self._attempt = 0  # the connection works: the next failure starts the backoff over
                received += 1
                self.apply(kind, obj)
        if received or time.monotonic() - started >= _SHORT_WATCH:
            return True
        logger.warning("%s: the watch ended after %.2fs without an event, reconnecting after a backoff",
                       self.where, time.monotonic() - started)
        return False

    def _opened(self) -> None:
        self.live = True

    def apply(self, kind: str, obj: Obj) -> None:
        """Apply one decoded watch event to the store and advance the resourceVersion."""
        if kind in ("ADDED", "MODIFIED"):
            self.store.upsert(self.trim(obj))
            self.stats.events += 1
        elif kind == "DELETED":
            self.store.delete(self.trim(obj))
            self.stats.events += 1
        elif kind == "BOOKMARK":
            self.stats.bookmarks += 1
        else:
            logger.warning("%s: ignoring a watch event of type %r", self.where, kind)
            return
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
            if self.progress is not None:
                self.progress.advance(self.resource_version)

