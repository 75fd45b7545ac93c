"""A steady load of claim creates, and what the API server kept of it: for the fault tests
(test_rolling_upgrade.py, test_cut_off.py) and bench/rolling.py.

`Load` creates claims across many namespaces, as fast as its workers go, until stopped,
and sorts every answer: admitted; denied by a full quota (final: the quota did its job);
denied by our webhook with a "retry" (`retried`: contention on a quota's status, its own
deadline passed, a full lease: an answer, under CPU starvation a few in a thousand); and
anything else (`failed`: the API server could not get an answer from the webhook, "failed
calling webhook" (a timeout, a connection closed or refused), or the client's own
connection failed), which a fault must not cause. Nothing is retried here: a create counts
once, as a user sees it.

`Persisted` watches every claim the API server stores in those namespaces, in
resourceVersion order, from before the load: at each ADDED event it adds the claim's
charge to its namespace and keeps the largest `charged - hard` seen (over-commit at any
resourceVersion, since the load deletes nothing), and it counts claims stored without our
`draquota.io/charge` annotation (admitted with no quota check: the mutating webhook writes
it in the create itself).

`scale()` is how hard and how long: the CI's (16 concurrent creates, 200 answered between
two steps of a fault, a 30 s partition) or, with DRAQUOTA_FAULTS_SCALE=full, bench/rolling.py's
(64, 3,000, 60 s); `report` hands the numbers a test measured to bench/rolling.py
(DRAQUOTA_FAULTS_REPORT names the file): tests never assert a duration.

`PausingProxy` is a loopback TCP proxy in front of the API server that a test pauses (every
byte held both ways, new connections held too: a network partition, whose TCP retransmits
deliver once it heals) and resumes, so one replica is cut off while the others are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kube.api import ApiError, Resource

from .cluster import ControlPlane
from .driver import RESOURCE_V1, claim_spec, exact_request
from .harness import DQ, RUN_LABEL, MakeNamespace, governed
from .kube import Kube, Obj

GiB = 1024**3
GPU = 80 * GiB  # devcluster.driver.Gpu's memory
CLAIMS = Resource(RESOURCE_V1, "resourceclaims")
CHARGE = "draquota.io/charge"
EXCEEDED = ("exceeded DeviceQuota", "exceeded ClusterDeviceQuota")
DENIED = "denied the request"  # how the API server words a webhook's answer (our "retry" denials)


SCALE_ENV, REPORT_ENV = "DRAQUOTA_FAULTS_SCALE", "DRAQUOTA_FAULTS_REPORT"


@dataclass(frozen=True)
class Scale:
    workers: int  # creates in flight at once
    between: int  # creates answered between two steps of a fault
    cut: float  # seconds a partition lasts once the replica noticed it


def scale() -> Scale:
    return Scale(64, 3000, 60.0) if os.environ.get(SCALE_ENV) == "full" else Scale(16, 200, 30.0)


def report(test: str, numbers: dict[str, object]) -> None:
    """One line of JSON for bench/rolling.py, where it asked for them."""
    if path := os.environ.get(REPORT_ENV):
        with open(path, "a") as out:
            out.write(json.dumps({"test": test, **numbers}) + "\n")


async def scrape(metrics_port: int) -> dict[str, float]:
    """`serve`'s metrics over plain HTTP (`--no-metrics-secure`: a secure scrape's token review
    needs the API server): "name[(label, value), ...]" -> value."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
        text = await resp.text()
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def stall_max(metrics_port: int) -> float:
    """The longest event loop stall of a `serve` since it started (its metric, in seconds)."""
    return (await scrape(metrics_port)).get("draquota_event_loop_stall_max_seconds[]", float("nan"))


_LOGGED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?(released Lease|leading: Lease)", re.M)


def handovers(logs: Sequence[Path]) -> list[float]:
    """Seconds from each Lease a leaving leader released (its log) to the next replica's
    "leading" line: how long no replica led."""
    events = sorted((datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f"), what)
                    for log in logs if log.exists() for stamp, what in _LOGGED.findall(log.read_text(errors="replace")))
    gaps, released = [], None
    for when, what in events:
        if what == "released Lease":
            released = when
        elif released is not None:
            gaps.append((when - released).total_seconds())
            released = None
    return gaps


@dataclass
class Tenants:
    """The load's namespaces (each with one DeviceQuota "gpus") and their `hard` in bytes."""

    device_class: str
    hard: dict[str, int]

    @property
    def full(self) -> list[str]:
        return [ns for ns, hard in self.hard.items() if hard < 1000 * GPU]


async def tenants(kube: Kube, make_namespace: MakeNamespace, run: str, device_class: str, *, count: int = 20,
                  full: int = 5, small_gpus: int = 6) -> Tenants:
    """`count` namespaces labelled for `run`, each with a DeviceQuota: `full` of them of
    `small_gpus` GPUs (full within seconds of load), the rest far from `hard`. Returns once
    the leader labelled each governed (which needs a `serve` running)."""
    hard: dict[str, int] = {}
    for i in range(count):
        ns = await make_namespace("fault", labels={RUN_LABEL: run})
        gpus = small_gpus if i < full else 100_000
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                               "spec": {"hard": {"memory": f"{gpus * 80}Gi"}}}, namespace=ns)
        hard[ns] = gpus * GPU
    return Tenants(device_class, hard)


async def all_governed(kube: Kube, t: Tenants) -> None:
    await asyncio.gather(*(governed(kube, ns, timeout=60) for ns in t.hard))


@dataclass
class Load:
    """Creates across `tenants.hard`'s namespaces by `workers` coroutines over `clients`."""

    clients: list[Kube]
    t: Tenants
    workers: int = 16
    admitted: int = 0
    exceeded: int = 0
    retried: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    # (monotonic time, message) of each failure and "retry" denial: when, on the faults' timeline.
    failures: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0
    stopped: float = 0.0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _serial: int = 0

    @property
    def total(self) -> int:
        return self.admitted + self.exceeded + sum(self.retried.values()) + sum(self.failed.values())

    @property
    def rate(self) -> float:
        return self.total / max((self.stopped or time.monotonic()) - self.started, 1e-9)

    def start(self) -> None:
        self.started = time.monotonic()
        self._tasks = [asyncio.create_task(self._work(i), name=f"load {i}") for i in range(self.workers)]

    async def stop(self) -> None:
        """Let each worker finish its create and end (again: nothing more)."""
        if self._stop.is_set():
            return
        self._stop.set()
        await asyncio.gather(*self._tasks)
        self.stopped = time.monotonic()

    async def until(self, creates: int, *, timeout: float = 120) -> None:
        """Wait (as an observation of progress, not a pace) until `creates` more were answered."""
        goal = self.total + creates
        deadline = time.monotonic() + timeout
        while self.total < goal:
            assert time.monotonic() < deadline, f"the load answered {self.total} of {goal} creates in {timeout}s"
            await asyncio.sleep(0.05)

    async def _work(self, worker: int) -> None:
        namespaces = list(self.t.hard)
        client = self.clients[worker % len(self.clients)]
        while not self._stop.is_set():
            self._serial += 1
            serial = self._serial
            ns = namespaces[serial % len(namespaces)]
            body = {"kind": "ResourceClaim", "metadata": {"name": f"c{serial}"},
                    "spec": claim_spec(exact_request("gpu", self.t.device_class))}
            try:
                await client.create(RESOURCE_V1, "resourceclaims", body, namespace=ns)
                self.admitted += 1
            except ApiError as err:
                if any(e in err.message for e in EXCEEDED):
                    self.exceeded += 1
                elif DENIED in err.message:
                    self.retried[_short(err.message.split(DENIED, 1)[1])] += 1
                    self.failures.append((time.monotonic(), f"(denied) {err.message}"))
                else:
                    self._failed(f"{err.status} {err.message}")
            except (OSError, TimeoutError) as err:  # the client's own connection to the API server
                self._failed(f"client: {type(err).__name__} {err}")

    def _failed(self, message: str) -> None:
        self.failed[_short(message)] += 1
        self.failures.append((time.monotonic(), message))

    def summary(self) -> str:
        return (f"{self.total} creates at {self.rate:.0f}/s: {self.admitted} admitted, {self.exceeded} exceeded, "
                f"{sum(self.retried.values())} denied to retry {dict(self.retried)}, "
                f"{sum(self.failed.values())} failed {dict(self.failed)}")


def _short(message: str) -> str:
    # The cause is at the end: "... failed to call webhook: Post ...: EOF", "...; retry".
    return message if len(message) <= 200 else f"{message[:80]} ... {message[-120:]}"


@dataclass
class Persisted:
    """Every claim stored in `t`'s namespaces, by watch, in resourceVersion order (module doc)."""

    kube: Kube
    t: Tenants
    charged: dict[str, int] = field(default_factory=dict)
    over: int = 0  # max over namespaces and resourceVersions of charged - hard, in bytes (<= 0: none)
    unchecked: list[str] = field(default_factory=list)  # namespace/name of claims stored without our charge
    seen: int = 0
    _task: asyncio.Task[None] | None = None
    _version: str = ""

    async def start(self) -> None:
        listing = await self.kube.api.list(CLAIMS)
        self._version = listing.resource_version
        for claim in listing.items:
            self._add(claim)
        self.over = max(self._over(ns) for ns in self.t.hard)
        self._task = asyncio.create_task(self._watch(), name="persisted claims")

    async def _watch(self) -> None:
        while True:
            stream = self.kube.api.watch(CLAIMS, resource_version=self._version, timeout_seconds=600)
            async with contextlib.aclosing(stream):
                async for kind, obj in stream:
                    self._version = obj["metadata"].get("resourceVersion") or self._version
                    if kind == "ADDED":
                        self._add(obj)

    def _add(self, claim: Obj) -> None:
        meta = claim["metadata"]
        ns = meta.get("namespace", "")
        if ns not in self.t.hard:
            return
        self.seen += 1
        if CHARGE not in (meta.get("annotations") or {}):
            self.unchecked.append(f"{ns}/{meta['name']}")
        count = claim["spec"]["devices"]["requests"][0]["exactly"].get("count", 1)
        self.charged[ns] = self.charged.get(ns, 0) + count * GPU
        self.over = max(self.over, self._over(ns))

    def _over(self, ns: str) -> int:
        return self.charged.get(ns, 0) - self.t.hard[ns]

    async def caught_up(self, *, timeout: float = 60) -> None:
        """Wait until the watch holds every claim the API server lists now."""
        listing = await self.kube.api.list(CLAIMS)
        wanted = sum(1 for c in listing.items if c["metadata"]["namespace"] in self.t.hard)
        deadline = time.monotonic() + timeout
        while self.seen < wanted:
            assert time.monotonic() < deadline, f"the claim watch saw {self.seen} of {wanted} claims"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def summary(self) -> str:
        full = {ns: self.charged.get(ns, 0) // GPU for ns in self.t.full}
        return (f"{self.seen} claims stored, over-commit {self.over / GPU:+.0f} GPUs (max charged - hard), "
                f"{len(self.unchecked)} without our charge; full quotas at {full} GPUs")


class PausingProxy:
    """A loopback TCP proxy to `target` (module doc); `port` is where to point a client."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            await self._open.wait()
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            try:
                await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
            finally:
                upstream_writer.close()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._pipes.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self._open.wait()  # paused: held, as a partition holds unacknowledged segments
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()


def proxied_kubeconfig(cluster: ControlPlane, port: int, path: Path) -> Path:
    """The admin kubeconfig with its server at the proxy on `port` (the API server's
    certificate names 127.0.0.1, so TLS verifies as before)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


def chart_shutdown_delay() -> float:
    """`serve.shutdownDelaySeconds` as the chart ships it."""
    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy/helm/dra-quota/values.yaml").read_text())
    return float(values["serve"]["shutdownDelaySeconds"])
