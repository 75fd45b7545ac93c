"""The pure parts of the Kubernetes access layer: event decoding, line splitting, backoff,
trimming, and how a reflector applies one event to its store (kube.api, kube.watching).

The I/O (lists, watches, 410s, reconnects) is proven against the real API server in
tests/e2e/test_watching.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any, cast

import aiohttp
import pytest

from kubernetes_asyncio.client import Configuration

from kube.api import KubeApi, Listing, Resource
from kube.apierror import ApiError
from kube.watchlines import LineBuffer, decode_event
from kube.watching import (
    INITIAL_EVENTS_END, LAST_APPLIED, STREAM_BATCH, Backoff, Reflector, WatchSettings, trim_claim, trim_object,
)
from quota.values.raw import Obj

from ..clock import until


def make_obj(name: str = "a", rv: str = "7", **extra: Any) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": "ns",
        "resourceVersion": rv,
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:data": {}}}],
        "annotations": {LAST_APPLIED: "{...}", "draquota.io/charge": "{}"},
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **extra}


class RecordingStore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def replace(self, objects: list[Obj]) -> None:
        self.calls.append(("replace", objects))

    def upsert(self, obj: Obj) -> None:
        self.calls.append(("upsert", obj))

    def delete(self, obj: Obj) -> None:
        self.calls.append(("delete", obj))


def make_reflector(store: RecordingStore) -> Reflector:
    # apply() never touches the API client.
    return Reflector(api=cast(KubeApi, None), resource=Resource("v1", "configmaps"), store=store)


# -- decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"type": "ADDED", "object": {"metadata": {"name": "a"}}}, ("ADDED", {"metadata": {"name": "a"}})),
        ({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": "9"}}},
         ("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "9"}})),
    ],
)
def test_decode_event(event: Obj, expected: tuple[str, Obj]) -> None:
    assert decode_event(json.dumps(event).encode()) == expected


def test_error_event_raises_api_error_with_its_code() -> None:
    line = json.dumps({"type": "ERROR", "object": {
        "kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 1 (4242)"}})
    with pytest.raises(ApiError) as caught:
        decode_event(line.encode())
    assert (caught.value.status, caught.value.reason, caught.value.message) == (410, "Expired", "too old resource version: 1 (4242)")


@pytest.mark.parametrize("line", [b"[]", b'{"type": "ADDED"}', b'{"type": "ADDED", "object": 3}', b"{trunc"])
def test_malformed_event_is_a_value_error(line: bytes) -> None:
    with pytest.raises(ValueError):
        decode_event(line)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (404, b'{"kind":"Status","reason":"NotFound","message":"configmaps \\"x\\" not found"}',
         (404, "NotFound", 'configmaps "x" not found')),
        (502, b"<html>bad gateway</html>", (502, "", "<html>bad gateway</html>")),
    ],
)
def test_api_error_from_body(status: int, body: bytes, expected: tuple[int, str, str]) -> None:
    error = ApiError.from_body(status, body, where="GET /x")
    assert (error.status, error.reason, error.message) == expected
    assert str(error).startswith(f"GET /x: HTTP {status}")


def test_line_buffer_joins_chunks_and_keeps_big_lines() -> None:
    big = json.dumps({"type": "ADDED", "object": {"data": "x" * 300_000}}).encode()
    buffer = LineBuffer()
    assert buffer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert buffer.feed(b":2}\n\n" + big[:1000]) == [b'{"b":2}']
    assert buffer.feed(big[1000:] + b"\n") == [big]  # above aiohttp's 128 KiB readline limit
    assert buffer.feed(b'{"c":3}') == []
    assert buffer.rest() == b'{"c":3}'
    assert buffer.rest() == b""


@pytest.mark.parametrize(
    ("api_version", "args", "path"),
    [
        ("v1", {}, "/api/v1/configmaps"),
        ("v1", {"namespace": "ns", "name": "a b"}, "/api/v1/namespaces/ns/configmaps/a%20b"),
        ("resource.k8s.io/v1", {"namespace": "ns", "name": "c", "subresource": "status"},
         "/apis/resource.k8s.io/v1/namespaces/ns/configmaps/c/status"),
    ],
)
def test_resource_path(api_version: str, args: dict[str, str], path: str) -> None:
    assert Resource(api_version, "configmaps").path(**args) == path


# -- backoff --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [(0, 0.0, 0.2), (1, 0.0, 0.4), (3, 0.0, 1.6), (3, 0.5, 2.0), (7, 0.0, 25.6), (8, 0.0, 30.0),
     (7, 0.99, 30.0), (10_000, 0.5, 30.0)],
)
def test_backoff_is_exponential_jittered_and_capped(attempt: int, rand: float, expected: float) -> None:
    assert Backoff().delay(attempt, rand=rand) == pytest.approx(expected)


# -- trimming -------------------------------------------------------------------------------------


def test_trim_object_drops_managed_fields_and_last_applied_without_touching_input() -> None:
    obj = make_obj(data={"k": "v"})
    before = copy.deepcopy(obj)
    trimmed = trim_object(obj)
    assert obj == before
    assert trimmed == {
        "apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"},
        "metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7", "annotations": {"draquota.io/charge": "{}"}},
    }


def test_trim_object_without_metadata_extras() -> None:
    assert trim_object({"metadata": {"name": "a"}}) == {"metadata": {"name": "a"}}


def test_trim_claim_keeps_only_what_accounting_reads() -> None:
    status = {"allocation": {"devices": {"results": []}}, "reservedFor": [{"resource": "pods", "name": "p"}],
              "devices": [{"driver": "gpu.example.com", "conditions": [], "data": {"big": "x" * 1000}}]}
    trimmed = trim_claim(make_obj(spec={"devices": {}}, status=status))
    assert trimmed["status"] == {"allocation": status["allocation"], "reservedFor": status["reservedFor"]}
    assert trimmed["spec"] == {"devices": {}}
    assert "managedFields" not in trimmed["metadata"]
    assert "status" not in trim_claim(make_obj())


# -- applying events ------------------------------------------------------------------------------


def test_reflector_applies_events_trimmed_and_follows_resource_versions() -> None:
    store = RecordingStore()
    reflector = make_reflector(store)
    reflector.apply("ADDED", make_obj("a", "10"))
    reflector.apply("MODIFIED", make_obj("a", "11"))
    reflector.apply("DELETED", make_obj("a", "12"))
    assert [(op, o["metadata"]["resourceVersion"]) for op, o in store.calls] == [("upsert", "10"), ("upsert", "11"), ("delete", "12")]
    assert all("managedFields" not in o["metadata"] for _, o in store.calls)
    assert reflector.resource_version == "12"
    assert (reflector.stats.events, reflector.stats.bookmarks) == (3, 0)


def test_bookmark_only_advances_the_resource_version() -> None:
    store = RecordingStore()
    reflector = make_reflector(store)
    reflector.resource_version = "12"
    reflector.apply("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "40"}})
    assert store.calls == []
    assert reflector.resource_version == "40"
    assert (reflector.stats.events, reflector.stats.bookmarks) == (0, 1)


def test_unknown_event_type_changes_nothing() -> None:
    store = RecordingStore()
    reflector = make_reflector(store)
    reflector.resource_version = "12"
    reflector.apply("SURPRISE", make_obj("a", "13"))
    assert (store.calls, reflector.resource_version, reflector.stats.events) == ([], "12", 0)


# -- list restarts --------------------------------------------------------------------------------


class ScriptedApi(KubeApi):
    """Answers list pages from a script; the real API server cannot be made to expire a
    continue token on demand (1.37 serves continuations from watch-cache snapshots, even
    after etcd has compacted past them)."""

    def __init__(self, pages: list[Obj | ApiError]) -> None:
        super().__init__(Configuration())
        self.pages = pages
        self.queries: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        self.queries.append(dict(kwargs["params"]))
        page = self.pages.pop(0)
        if isinstance(page, ApiError):
            raise page
        return page


def page(names: list[str], rv: str, token: str = "") -> Obj:
    return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": rv, "continue": token},
            "items": [{"metadata": {"name": n}} for n in names]}


async def test_list_starts_over_when_its_continue_token_expired() -> None:
    expired = ApiError(410, "Expired", "The provided continue parameter is too old")
    api = ScriptedApi([page(["a", "b"], "5", "t1"), expired, page(["a", "b"], "9", "t2"), page(["c"], "9")])
    listing = await api.list(Resource("v1", "configmaps"), limit=2)
    assert [o["metadata"]["name"] for o in listing.items] == ["a", "b", "c"]
    assert listing.resource_version == "9"
    assert [q.get("continue") for q in api.queries] == [None, "t1", None, "t2"]
    assert {(o["apiVersion"], o["kind"]) for o in listing.items} == {("v1", "ConfigMap")}


async def test_list_gives_up_after_repeated_expiry_and_never_retries_other_errors() -> None:
    expired = ApiError(410, "Expired", "too old")
    api = ScriptedApi([page(["a"], "5", "t"), expired] * 4)
    with pytest.raises(ApiError) as caught:
        await api.list(Resource("v1", "configmaps"))
    assert caught.value.status == 410 and len(api.queries) == 8
    forbidden = ScriptedApi([page(["a"], "5", "t"), ApiError(403, "Forbidden", "no")])
    with pytest.raises(ApiError) as caught:
        await forbidden.list(Resource("v1", "configmaps"))
    assert caught.value.status == 403 and len(forbidden.queries) == 2


class EmptyWatchApi(KubeApi):
    """Every list is empty and every watch ends at once without an event."""

    def __init__(self) -> None:
        super().__init__(Configuration())
        self.watches = 0

    async def list(self, resource: Resource, **kwargs: Any) -> Listing:
        return Listing([], "5")

    async def watch(self, resource: Resource, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj], None]:
        self.watches += 1
        return
        yield  # an async generator that yields nothing


async def test_a_watch_that_ends_at_once_empty_backs_off_instead_of_looping() -> None:
    api = EmptyWatchApi()
    store = RecordingStore()
    reflector = Reflector(api=api, resource=Resource("v1", "configmaps"), store=store,
                          settings=WatchSettings(backoff=Backoff(initial=0.001, cap=0.001)))
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 5)
        await until(lambda: api.watches >= 3, "three watches")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert store.calls == [("replace", [])]
    assert reflector.stats.lists == 1 and reflector.stats.restarts >= 2


async def test_a_list_goes_through_the_rebuild_hook_and_no_watch_starts_before_it_returns() -> None:
    """`serve` applies a list in slices (`kube.rebuilds`): the reflector hands it over
    and neither watches nor says synced until the store has the whole list."""
    api = EmptyWatchApi()
    store = RecordingStore()
    seen: list[tuple[int, bool]] = []
    release = asyncio.Event()

    async def rebuild(fetch: Callable[[], Awaitable[list[Obj]]], replace: Callable[[list[Obj]], None]) -> None:
        items = await fetch()
        await release.wait()  # a rebuild that takes its time, in slices
        seen.append((api.watches, reflector.synced.is_set()))
        replace(items)

    reflector = Reflector(api=api, resource=Resource("v1", "configmaps"), store=store, rebuild=rebuild,
                          settings=WatchSettings(backoff=Backoff(initial=0.001, cap=0.001)))
    task = asyncio.create_task(reflector.run())
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert store.calls == [] and api.watches == 0 and not reflector.synced.is_set()
        release.set()
        await asyncio.wait_for(reflector.synced.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert seen == [(0, False)] and store.calls[0] == ("replace", [])
    assert reflector.resource_version == "5"  # the list's


class FlakyWatchApi(EmptyWatchApi):
    """The first watch fails to connect (an API server restarting); the next is accepted
    and then stays open without an event, as a quiet kind's watch does."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted = asyncio.Event()

    async def watch(self, resource: Resource, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj], None]:
        self.watches += 1
        if self.watches == 1:
            raise aiohttp.ClientConnectionError("connection refused")
        kwargs["opened"]()
        self.accepted.set()
        await asyncio.Event().wait()
        yield "BOOKMARK", {}  # never reached


async def test_a_reflector_is_not_live_from_a_failed_watch_until_one_is_accepted_again() -> None:
    api = FlakyWatchApi()
    lives: list[bool] = []
    reflector = Reflector(api=api, resource=Resource("v1", "configmaps"), store=RecordingStore(),
                          settings=WatchSettings(backoff=Backoff(initial=0.05, cap=0.05)))
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 5)
        await until(lambda: reflector.stats.restarts == 1, "the failed watch")
        lives.append(reflector.live)  # in the backoff after the failure
        await asyncio.wait_for(api.accepted.wait(), 5)
        lives.append(reflector.live)  # accepted, no event yet
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert lives == [False, True]


# -- streamed lists -------------------------------------------------------------------------------


class StreamingApi(KubeApi):
    """A streamed list (`sendInitialEvents`) answers `script` (events, or an ApiError to
    raise); every later watch ends at once empty. Pages answer `pages`."""

    def __init__(self, script: list[tuple[str, Obj]] | ApiError, pages: list[Obj] | None = None) -> None:
        super().__init__(Configuration())
        self.script = script
        self.pages = pages or []
        self.calls: list[str] = []

    async def list(self, resource: Resource, **kwargs: Any) -> Listing:
        self.calls.append("list")
        return Listing(copy.deepcopy(self.pages), "3")

    async def watch(self, resource: Resource, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj], None]:
        self.calls.append("stream" if kwargs.get("send_initial_events") else f"watch {kwargs.get('resource_version')}")
        if not kwargs.get("send_initial_events"):
            return
        if isinstance(self.script, ApiError):
            raise self.script
        for kind, obj in copy.deepcopy(self.script):
            yield kind, obj


class StagingStore(RecordingStore):
    """A `StagedStore`: records each piece added and the commit, or the cancel."""

    def relist(self) -> StagingStore.Relist:
        return StagingStore.Relist(self)

    class Relist:
        def __init__(self, store: StagingStore) -> None:
            self.store = store

        def add(self, objects: Iterable[Obj]) -> None:
            self.store.calls.append(("add", [o["metadata"]["name"] for o in objects]))

        def commit(self) -> None:
            self.store.calls.append(("commit", None))

        def cancel(self) -> None:
            self.store.calls.append(("cancel", None))


def end_marker(rv: str) -> tuple[str, Obj]:
    return "BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": rv,
                                                          "annotations": {INITIAL_EVENTS_END: "true"}}}


async def synced_once(api: KubeApi, store: RecordingStore) -> Reflector:
    reflector = Reflector(api=api, resource=Resource("v1", "configmaps"), store=store,
                          settings=WatchSettings(stream_list=True, backoff=Backoff(initial=0.001, cap=0.001)))
    task = asyncio.create_task(reflector.run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return reflector


async def test_a_streamed_list_is_staged_in_batches_as_it_arrives_and_committed_at_its_end_marker() -> None:
    names = [f"o{i}" for i in range(STREAM_BATCH + 5)]
    api = StreamingApi([("ADDED", make_obj(n)) for n in names] + [end_marker("42"), ("ADDED", make_obj("later"))])
    store = StagingStore()
    reflector = await synced_once(api, store)
    # Every object staged trimmed, in pieces of at most STREAM_BATCH, then one commit;
    # nothing past the end marker (the watch that follows brings it).
    assert store.calls == [("add", names[:STREAM_BATCH]), ("add", names[STREAM_BATCH:]), ("commit", None)]
    assert reflector.resource_version == "42" and reflector.stats.lists == 1
    assert api.calls[:2] == ["stream", "watch 42"]


async def test_a_streamed_list_hands_another_store_the_whole_list_trimmed() -> None:
    api = StreamingApi([("ADDED", make_obj("a")), ("ADDED", make_obj("b")), end_marker("9")])
    store = RecordingStore()
    reflector = await synced_once(api, store)
    [(call, objects)] = store.calls
    assert call == "replace" and [o["metadata"]["name"] for o in objects] == ["a", "b"]
    assert all("managedFields" not in o["metadata"] for o in objects)
    assert reflector.resource_version == "9"


async def streamed_twice(api: StreamingApi, store: RecordingStore) -> Reflector:
    """A reflector run until it has tried the streamed list twice."""
    reflector = Reflector(api=api, resource=Resource("v1", "configmaps"), store=store,
                          settings=WatchSettings(stream_list=True, backoff=Backoff(initial=0.001, cap=0.001)))
    task = asyncio.create_task(reflector.run())
    try:
        await until(lambda: api.calls.count("stream") >= 2, "the list streamed again")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return reflector


async def test_a_stream_cut_before_its_end_marker_is_cancelled_and_listed_again() -> None:
    api = StreamingApi([("ADDED", make_obj("a"))])
    store = StagingStore()
    reflector = await streamed_twice(api, store)
    assert not reflector.synced.is_set()
    # Each attempt's relist cancelled (nothing of it reaches the store), none committed.
    assert set(store.calls) == {("cancel", None)}


async def test_an_api_server_that_refuses_streamed_lists_is_listed_by_pages() -> None:
    refused = ApiError(422, "Invalid", "sendInitialEvents is forbidden for watch unless the WatchList feature gate "
                                       "is enabled")
    api = StreamingApi(refused, pages=[make_obj("a")])
    store = StagingStore()
    reflector = await synced_once(api, store)
    assert api.calls[:2] == ["stream", "list"]
    assert store.calls == [("cancel", None), ("replace", [make_obj("a")])] and reflector.resource_version == "3"


async def test_other_errors_of_a_streamed_list_are_not_taken_for_a_refusal() -> None:
    api = StreamingApi(ApiError(403, "Forbidden", "no"), pages=[make_obj("a")])
    reflector = await streamed_twice(api, StagingStore())
    assert "list" not in api.calls and not reflector.synced.is_set()
