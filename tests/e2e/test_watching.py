"""kube.api and kube.watching against the real kube-apiserver (minik8s).

What only a real API server can show: pagination with continue tokens, the order of
watch events, bookmarks, a 410 for a resourceVersion the watch cache no longer has, and a
reflector converging after 410s and cut connections. Cut connections and silent peers are
made by a loopback TCP relay between the client and the API server (TLS passes through it
untouched), so the client sees a real reset or a real half-open connection.

Every wait is a condition with a deadline (tests.e2e.kube.poll), never a sleep.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import contextlib
import datetime
import time
import urllib.request
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from kube.api import KubeApi, Resource
from kube.apierror import ApiError
from kube.watching import LAST_APPLIED, STREAM_BATCH, Backoff, Reflector, WatchSettings
from quota.values.raw import Obj

from .cluster import ControlPlane
from .kube import Kube, poll

pytestmark = pytest.mark.e2e

CONFIGMAPS = Resource("v1", "configmaps")
# Core Events are the one kind kube-apiserver keeps out of its watch cache
# (pkg/kubeapiserver/options DefaultWatchCacheSizes: events -> 0), so their watches are
# served by etcd and a compacted resourceVersion is answered with 410 Gone at once. For a
# cached kind the watch cache answers an old resourceVersion with the current state until
# it has dropped events (75 s and a full buffer later): not something a test can wait for.
EVENTS = Resource("v1", "events")
LABEL = "e2e.draquota.io/watching"
FAST = WatchSettings(page_size=100, server_timeout=300, silence=90.0, backoff=Backoff(initial=0.05, cap=0.5))


class DictStore:
    """A store keyed by name that logs every call: (operation, name, resourceVersion)."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.log: list[tuple[str, str, str]] = []
        self.replaced_while_synced: list[bool] = []

    def replace(self, objects: list[Obj]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.log.append(("replace", str(len(objects)), ""))

    def upsert(self, obj: Obj) -> None:
        self.objects[obj["metadata"]["name"]] = obj
        self.log.append(("upsert", obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    def delete(self, obj: Obj) -> None:
        self.objects.pop(obj["metadata"]["name"], None)
        self.log.append(("delete", obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))

    def versions(self) -> dict[str, str]:
        return {name: o["metadata"]["resourceVersion"] for name, o in self.objects.items()}


class Relay:
    """A loopback TCP relay to the API server that can cut or freeze its open connections."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._open: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter, asyncio.Event]] = []
        self._frozen: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter, asyncio.Event]] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.sever()
        for client, upstream, flowing in self._frozen:
            client.transport.abort()
            upstream.transport.abort()
            flowing.set()  # wake the pumps so that they see the closed sockets and end
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def sever(self) -> int:
        """Reset every open connection; return how many there were."""
        cut = len(self._open)
        for client, upstream, _ in self._open:
            client.transport.abort()
            upstream.transport.abort()
        self._open.clear()
        return cut

    def freeze(self) -> int:
        """Stop forwarding on every open connection without closing it (a silent peer)."""
        for _, _, flowing in self._open:
            flowing.clear()
        frozen = len(self._open)
        self._frozen += self._open
        self._open = []
        return frozen

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        flowing = asyncio.Event()
        flowing.set()
        entry = (writer, up_writer, flowing)
        self._open.append(entry)
        self.connections += 1
        await asyncio.gather(self._pump(reader, up_writer, flowing), self._pump(up_reader, writer, flowing))
        if entry in self._open:
            self._open.remove(entry)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


@pytest_asyncio.fixture(loop_scope="session")
async def api(cluster: ControlPlane) -> AsyncIterator[KubeApi]:
    async with await KubeApi.from_kubeconfig(str(cluster.kubeconfig)) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def relayed(cluster: ControlPlane, tmp_path: Path) -> AsyncIterator[tuple[Relay, KubeApi]]:
    """A client whose kubeconfig points at a :class:`Relay` in front of the API server."""
    relay = Relay(cluster.apiserver_port)
    await relay.start()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    path = tmp_path / "relayed.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    async with await KubeApi.from_kubeconfig(str(path)) as client:
        yield relay, client
    await relay.close()


@contextlib.asynccontextmanager
async def running(reflector: Reflector) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.create_task(reflector.run(), name=f"reflector {reflector.where}")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def configmap(name: str, value: str = "0") -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {LABEL: "yes"}}, "data": {"v": value}}


def event(name: str, namespace: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "labels": {LABEL: "yes"}},
        "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": namespace, "name": "x"},
        "reason": "Testing", "message": name, "type": "Normal",
    }


async def create_many(api: KubeApi, namespace: str, names: list[str], resource: Resource = CONFIGMAPS) -> None:
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        body = configmap(name) if resource == CONFIGMAPS else event(name, namespace)
        async with gate:
            await api.create(resource, body, namespace=namespace)

    await asyncio.gather(*(one(n) for n in names))


async def converged(api: KubeApi, reflector: Reflector, store: DictStore, task: asyncio.Task[Any], timeout: float = 30) -> None:
    """Wait until the store holds exactly what a fresh list returns (names and resourceVersions)."""
    fresh: dict[str, str] = {}

    async def same() -> bool:
        nonlocal fresh
        if task.done():
            task.result()  # a crashed reflector fails the test with its own exception
        listing = await api.list(reflector.resource, namespace=reflector.namespace, label_selector=LABEL)
        fresh = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in listing.items}
        return store.versions() == fresh

    try:
        await poll(same, timeout=timeout, what=f"the store to equal a fresh list of {reflector.where}")
    except AssertionError as e:
        missing, extra = fresh.keys() - store.versions().keys(), store.versions().keys() - fresh.keys()
        raise AssertionError(f"{e}; missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}, stats {reflector.stats}") from None


async def watching(api: KubeApi, reflector: Reflector, store: DictStore, task: asyncio.Task[Any]) -> None:
    """Wait until the reflector's watch is established: a new object has reached the store."""
    await asyncio.wait_for(reflector.synced.wait(), 30)
    assert reflector.namespace is not None
    await create_many(api, reflector.namespace, [f"probe-{reflector.stats.events}"], reflector.resource)
    await converged(api, reflector, store, task)


def make_reflector(
    api: KubeApi, namespace: str, store: DictStore, settings: WatchSettings = FAST, resource: Resource = CONFIGMAPS
) -> Reflector:
    return Reflector(api=api, resource=resource, store=store, namespace=namespace, label_selector=LABEL, settings=settings)



class StagedDictStore(DictStore):
    """A `kube.watching.StagedStore` over DictStore: logs each piece staged and the commit."""

    def relist(self) -> StagedDictStore.Relist:
        return StagedDictStore.Relist(self)

    class Relist:
        def __init__(self, store: StagedDictStore) -> None:
            self.store = store
            self.objects: dict[str, Obj] = {}

        def add(self, objects: Iterable[Obj]) -> None:
            batch = list(objects)
            self.objects.update((o["metadata"]["name"], o) for o in batch)
            self.store.log.append(("staged", str(len(batch)), ""))

        def commit(self) -> None:
            self.store.objects = self.objects
            self.store.log.append(("commit", str(len(self.objects)), ""))

        def cancel(self) -> None:
            self.store.log.append(("cancel", "", ""))

# -- auth ------------------------------------------------------------------------------------------


async def test_in_cluster_auth_reads_the_rotated_token_and_never_logs_it(
    cluster: ControlPlane, kube: Kube, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    tokens = {}
    for account in ("first", "second"):
        await kube.create("v1", "serviceaccounts", {"metadata": {"name": account}}, namespace=namespace)
        review = await kube.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
        )
        tokens[account] = review["status"]["token"]
    token_file = tmp_path / "token"
    token_file.write_text(tokens["first"])
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(cluster.apiserver_port))
    # kubernetes_asyncio re-reads the token file once a minute; make "a minute" now.
    monkeypatch.setattr("kubernetes_asyncio.config.incluster_config.TOKEN_REFRESH_PERIOD", datetime.timedelta(0))
    caplog.set_level(logging.DEBUG)

    async def who() -> str:
        # A fresh service account may do nothing: the 403 names who the API server saw.
        with pytest.raises(ApiError) as caught:
            await client.list(CONFIGMAPS, namespace=namespace)
        assert caught.value.status == 403
        return caught.value.message

    async with KubeApi.in_cluster(token_file=str(token_file), ca_file=str(cluster.ca_file)) as client:
        assert client.server == f"https://127.0.0.1:{cluster.apiserver_port}"
        assert f"system:serviceaccount:{namespace}:first" in await who()
        token_file.write_text(tokens["second"])  # the kubelet rotates the projected token
        assert f"system:serviceaccount:{namespace}:second" in await who()
    assert caplog.text and not any(t in caplog.text or t[-20:] in caplog.text for t in tokens.values())


# -- list ------------------------------------------------------------------------------------------


class CountingApi(KubeApi):
    """Records the query of every non-watch request (a spy on the one HTTP seam)."""

    requests: list[Mapping[str, Any]]

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        self.requests.append(dict(kwargs.get("params") or {}))
        return await super().request(method, path, **kwargs)


async def test_list_follows_continue_tokens(cluster: ControlPlane, api: KubeApi, namespace: str) -> None:
    names = [f"cm-{i:03d}" for i in range(250)]
    started = time.monotonic()
    await create_many(api, namespace, names)
    created = time.monotonic() - started

    counting = await CountingApi.from_kubeconfig(str(cluster.kubeconfig))
    assert isinstance(counting, CountingApi)
    counting.requests = []
    try:
        started = time.monotonic()
        listing = await counting.list(CONFIGMAPS, namespace=namespace, label_selector=LABEL, limit=100)
        listed = time.monotonic() - started
    finally:
        await counting.close()

    assert sorted(o["metadata"]["name"] for o in listing.items) == names
    assert [(p["limit"], "continue" in p) for p in counting.requests] == [(100, False), (100, True), (100, True)]
    # List items come without apiVersion/kind from the API server; list() stamps them.
    assert {(o["apiVersion"], o["kind"]) for o in listing.items} == {("v1", "ConfigMap")}
    assert int(listing.resource_version) >= max(int(o["metadata"]["resourceVersion"]) for o in listing.items)
    print(f"\ncreated 250 ConfigMaps in {created:.2f}s; listed them in 3 pages in {listed * 1000:.0f} ms")


def compact_etcd(cluster: ControlPlane) -> int:
    """Compact etcd up to its current revision through its JSON gateway (loopback, no proxy).

    The API server's own compactor does this every 5 minutes; doing it now makes every
    older resourceVersion unservable, so a watch from one is answered 410 Gone.
    """
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(method: str, body: Obj) -> Obj:
        request = urllib.request.Request(
            f"http://127.0.0.1:{cluster.etcd_port}/v3/kv/{method}", data=json.dumps(body).encode(), method="POST"
        )
        with opener.open(request, timeout=10) as response:
            answer: Obj = json.load(response)
            return answer

    revision = int(call("range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    call("compaction", {"revision": revision, "physical": True})
    return revision


# -- watch -----------------------------------------------------------------------------------------


async def test_watch_requests_bookmarks_and_a_bookmark_carries_only_a_resource_version(api: KubeApi, namespace: str) -> None:
    await create_many(api, namespace, ["a", "b"])
    # sendInitialEvents is refused unless allowWatchBookmarks=true (k8s.io/apimachinery
    # pkg/apis/meta/internalversion/validation), and its end is marked by a BOOKMARK: both
    # prove that watch() asks for bookmarks and that they come through decoded.
    events: list[tuple[str, Obj]] = []
    stream = api.watch(CONFIGMAPS, namespace=namespace, label_selector=LABEL, send_initial_events=True, timeout_seconds=30)
    async with contextlib.aclosing(stream):
        async for kind, obj in stream:
            events.append((kind, obj))
            if kind == "BOOKMARK":
                break
    assert sorted((k, o["metadata"]["name"]) for k, o in events[:-1]) == [("ADDED", "a"), ("ADDED", "b")]
    kind, bookmark = events[-1]
    assert kind == "BOOKMARK" and bookmark["kind"] == "ConfigMap"
    assert bookmark["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert set(bookmark["metadata"]) == {"resourceVersion", "annotations"}


async def test_watch_from_a_compacted_resource_version_is_410(cluster: ControlPlane, api: KubeApi, namespace: str) -> None:
    await create_many(api, namespace, ["x"], EVENTS)
    compact_etcd(cluster)
    stream = api.watch(EVENTS, namespace=namespace, resource_version="1", timeout_seconds=30)
    with pytest.raises(ApiError) as caught:
        async with contextlib.aclosing(stream):
            async for _ in stream:
                pass
    assert caught.value.status == 410, caught.value


# -- reflector -------------------------------------------------------------------------------------


async def test_reflector_syncs_once_listed_and_follows_a_burst_in_order(api: KubeApi, namespace: str) -> None:
    await create_many(api, namespace, [f"pre-{i}" for i in range(30)])
    store = DictStore()
    reflector = make_reflector(api, namespace, store)
    original_replace = store.replace

    def replace(objects: list[Obj]) -> None:
        store.replaced_while_synced.append(reflector.synced.is_set())
        original_replace(objects)

    store.replace = replace  # type: ignore[method-assign]
    assert not reflector.synced.is_set()
    async with running(reflector) as task:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        assert store.replaced_while_synced == [False]
        assert len(store.objects) == 30
        assert all("managedFields" not in o["metadata"] for o in store.objects.values())

        started = time.monotonic()
        names = [f"burst-{i:03d}" for i in range(100)]
        await create_many(api, namespace, names)
        for name in names[:50]:
            await api.patch(CONFIGMAPS, name, {"data": {"v": "1"}}, namespace=namespace)
        for name in names[:30]:
            await api.delete(CONFIGMAPS, name, namespace=namespace)
        await api.patch(CONFIGMAPS, "pre-0", {"metadata": {"annotations": {LAST_APPLIED: "{}", "keep": "me"}}}, namespace=namespace)
        await converged(api, reflector, store, task)
        elapsed = time.monotonic() - started

    assert len(store.objects) == 100
    assert store.objects["pre-0"]["metadata"]["annotations"] == {"keep": "me"}
    # Per object: created, then updated, then deleted, with rising resourceVersions.
    by_name: dict[str, list[tuple[str, int]]] = {}
    for op, name, rv in store.log[1:]:
        by_name.setdefault(name, []).append((op, int(rv)))
    for name in names:
        ops = by_name[name]
        assert [rv for _, rv in ops] == sorted(rv for _, rv in ops), (name, ops)
        expected = ["upsert"] + ["upsert"] * (name in names[:50]) + ["delete"] * (name in names[:30])
        assert [op for op, _ in ops] == expected, (name, ops)
    assert (reflector.stats.lists, reflector.stats.relists, reflector.stats.restarts) == (1, 0, 0)
    print(f"\n{reflector.stats.events} events (181 writes) applied, store converged {elapsed:.2f}s after the burst began")


async def test_reflector_relists_after_410_and_converges(
    cluster: ControlPlane, relayed: tuple[Relay, KubeApi], api: KubeApi, namespace: str
) -> None:
    relay, client = relayed
    await create_many(api, namespace, [f"old-{i}" for i in range(20)], EVENTS)
    store = DictStore()
    reflector = make_reflector(client, namespace, store, resource=EVENTS)
    async with running(reflector) as task:
        await watching(api, reflector, store, task)
        # As if this reflector had been away for longer than etcd keeps history: the next
        # watch starts from "1", which the API server can only answer with 410 Gone.
        reflector.resource_version = "1"
        compact_etcd(cluster)
        assert relay.sever() >= 1
        for i in range(10):
            await api.delete(EVENTS, f"old-{i}", namespace=namespace)
        await create_many(api, namespace, [f"new-{i}" for i in range(10)], EVENTS)
        await converged(api, reflector, store, task)
        assert reflector.stats.relists >= 1 and reflector.stats.lists >= 2


async def test_reflector_reconnects_after_cut_connections_without_losing_events(
    relayed: tuple[Relay, KubeApi], api: KubeApi, namespace: str
) -> None:
    relay, client = relayed
    store = DictStore()
    reflector = make_reflector(client, namespace, store)
    async with running(reflector) as task:
        await watching(api, reflector, store, task)
        for round_ in range(5):
            await create_many(api, namespace, [f"r{round_}-{i}" for i in range(10)])
            relay.sever()  # events written while the watch was down come on the next watch
        await converged(api, reflector, store, task)
        assert len(store.objects) == 51  # and the probe
        assert reflector.stats.restarts >= 1 and reflector.stats.relists == 0 and reflector.stats.lists == 1


async def test_reflector_reconnects_after_silence(relayed: tuple[Relay, KubeApi], api: KubeApi, namespace: str) -> None:
    relay, client = relayed
    store = DictStore()
    settings = WatchSettings(page_size=100, server_timeout=300, silence=1.0, backoff=Backoff(initial=0.05, cap=0.5))
    reflector = make_reflector(client, namespace, store, settings)
    async with running(reflector) as task:
        await watching(api, reflector, store, task)
        before = relay.connections
        assert relay.freeze() >= 1  # the watch's connection stays open but nothing flows
        await create_many(api, namespace, ["after-freeze"])
        await converged(api, reflector, store, task)
        assert relay.connections > before and reflector.stats.restarts >= 1 and reflector.stats.relists == 0



async def test_a_streamed_list_syncs_in_staged_pieces_and_its_watch_misses_nothing_after_it(
    api: KubeApi, namespace: str
) -> None:
    """`serve` lists claims and slices by a streamed list (`WatchSettings.stream_list`):
    the 1.37 API server sends the existing objects, then the end marker, and the watch
    that follows from the marker's resourceVersion brings every later write."""
    await create_many(api, namespace, [f"pre-{i:03d}" for i in range(STREAM_BATCH + 20)])
    store = StagedDictStore()
    reflector = make_reflector(api, namespace, store,
                               settings=WatchSettings(page_size=100, stream_list=True, backoff=FAST.backoff))
    async with running(reflector) as task:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        assert store.log == [("staged", str(STREAM_BATCH), ""), ("staged", "20", ""),
                             ("commit", str(STREAM_BATCH + 20), "")]
        assert all("managedFields" not in o["metadata"] for o in store.objects.values())
        names = [f"burst-{i:03d}" for i in range(30)]
        await create_many(api, namespace, names)
        for name in names[:10]:
            await api.delete(CONFIGMAPS, name, namespace=namespace)
        await converged(api, reflector, store, task)
    assert len(store.objects) == STREAM_BATCH + 20 + 20
    assert (reflector.stats.lists, reflector.stats.relists) == (1, 0)
