"""Faults under a steady load of claim creates: what the fault tests (test_faults.py,
test_rolling_upgrade.py, test_cut_off.py) and their benchmarks (bench/faults.py,
bench/rolling.py) share.

- `Tenants`: namespaces, each with a DeviceQuota `gpus` of `hard: {devices: H}` on one
  DeviceClass (the first `full` of them small, so they fill under the load and deny),
  optionally all members of one team (a ClusterDeviceQuota with room, so the leader also
  copies the team's numbers into every member: AppliedClusterDeviceQuotas).
- `Load`: one-GPU claim creates round-robin over the namespaces by `workers` coroutines
  over the clients, as fast as they go, until stopped. Nothing is retried: a create counts
  once, as a user sees it, sorted by its answer: admitted; `exceeded` (denied by a full
  quota: final, the quota did its job); `retried` (denied by our webhook with a "retry":
  contention on a quota's status, its own deadline passed, a full lease: under CPU
  starvation a few in a thousand: a test that expects none of some wording asserts on
  the reasons); and `failed`, by where: `webhook` (the API server could
  not get an answer from a webhook: "failed calling webhook", a timeout, a connection
  closed or refused, our 503), `unreachable` (the client's own connection to the API
  server failed), `other` (any other answer, our webhook's denials that do not say
  "retry" among them).
- `Persisted`: every claim the API server stores in the tenants' namespaces, by watch, in
  resourceVersion order, from before the load: at each ADDED event it adds the claim's
  devices to its namespace and keeps the largest `charged - hard` seen (over-commit at any
  resourceVersion, since the load deletes nothing), and it counts claims stored without
  our `draquota.io/charge` annotation (admitted with no quota check: the mutating webhook
  writes it in the create itself).
- `QuotaWatch`: every DeviceQuota event of the tenants' namespaces, through serve's own
  reflector (it reconnects and relists across an API server restart or a compaction):
  the largest `used + reserved - hard` any watched resourceVersion showed (over-commit).
- `mismatches`: each quota's status against the claims the API server lists (the truth).
- `writes_sent_after`: the writes one serve process began from a given time on, from its
  debug log (a write that waited for a connection counts from its start: too early);
  `audited_writes_after`: its writes of claims and namespaces the API server received
  from a given time on (its audit log), the process running as an identity of its own.
- `PausingProxy`: a loopback TCP proxy in front of the API server that a test pauses
  (every byte held both ways, new connections held too: a network partition, whose TCP
  retransmits deliver once it heals) and resumes, so one replica is cut off while the
  others are not.
- `scale()` is how hard and how long for the replica faults: the CI's (16 concurrent
  creates, 200 answered between two steps of a fault, a 30 s partition) or, with
  DRAQUOTA_FAULTS_SCALE=full, bench/rolling.py's (64, 3,000, 60 s); `report` hands the
  numbers a test measured to bench/rolling.py (DRAQUOTA_FAULTS_REPORT names the file):
  tests never assert a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kube.api import KubeApi, Resource
from kube.resources import QUOTAS
from kube.watching import Reflector
from quota.values.raw import Obj, as_map

from .cluster import ControlPlane
from .driver import RESOURCE_V1, Gpu, claim_spec, create_fleet, exact_request
from .harness import CRDS, DQ, RUN_LABEL, MakeNamespace, Served, governed, served_context
from .kube import ApiError, Kube, poll
from .shipped import token_kubeconfig

TEAM_LABEL = "team.draquota.io/name"
CDQ = "clusterdevicequotas"
CLAIMS = Resource(RESOURCE_V1, "resourceclaims")
CHARGE = "draquota.io/charge"
EXCEEDED = ("exceeded DeviceQuota", "exceeded ClusterDeviceQuota")
DENIED = "denied the request"  # how the API server words a webhook's denial
FAILED_CALL = "failed calling webhook"  # how it words a call it got no answer from
LARGE = 100_000  # the `hard` of a namespace with room


@dataclass(frozen=True)
class Tenants:
    run: str
    device_class: str
    hard: dict[str, int]  # namespace -> devices (a test may add one it creates later)
    team: str | None = None

    @property
    def namespaces(self) -> list[str]:
        return list(self.hard)

    @property
    def full(self) -> list[str]:
        return [ns for ns, hard in self.hard.items() if hard < LARGE]


async def tenants(kube: Kube, make_namespace: MakeNamespace, device_class: str, *, run: str, count: int = 20,
                  full: int = 5, small: int = 6, team: bool = False) -> Tenants:
    """`count` namespaces labelled for `run`'s webhooks, the first `full` with `hard:
    {devices: small}`, the others far from it; with `team`, all members of one team whose
    quota has room for all."""
    name = f"faults-{run}" if team else None
    labels = {RUN_LABEL: run, **({TEAM_LABEL: name} if name else {})}
    hard: dict[str, int] = {}
    for i in range(count):
        namespace = await make_namespace(f"fault{i}", labels)
        hard[namespace] = small if i < full else LARGE
        await kube.create(DQ, "devicequotas", device_quota(hard[namespace], device_class), namespace=namespace)
    if name:
        await kube.create(DQ, CDQ, {"kind": "ClusterDeviceQuota", "metadata": {"name": name},
                                    "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: name}},
                                             "hard": {"devices": LARGE * count}}})
    return Tenants(run, device_class, hard, name)


def device_quota(devices: int, device_class: str) -> Obj:
    return {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
            "spec": {"hard": {"devices": devices}, "deviceClassNames": [device_class]}}


async def own_tenants(kube: Kube, *, run: str, count: int, full: int, small: int) -> Tenants:
    """`tenants` (a team's) on a control plane of one's own, which is thrown away after
    (nothing here is deleted): the CRDs, a DeviceClass with one node of two GPUs, the namespaces."""
    for definition in CRDS:
        await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", definition)
        await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                      definition["metadata"]["name"], "Established", timeout=60)
    fleet = await create_fleet(kube, f"faults-{run}")
    await fleet.add_node("n1", [Gpu()] * 2)

    async def make_namespace(prefix: str, labels: dict[str, str]) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        return name

    return await tenants(kube, make_namespace, fleet.device_class, run=run, count=count, full=full, small=small,
                         team=True)


async def all_governed(kube: Kube, t: Tenants) -> None:
    """Once the leader labelled each namespace governed (which needs a `serve` running)."""
    await asyncio.gather(*(governed(kube, ns, timeout=60) for ns in t.hard))


async def until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """`poll` on a condition this process holds (the load's counters, a log's text)."""
    async def probe() -> bool:
        return condition()

    await poll(probe, timeout=timeout, what=what)


def outcome(err: BaseException) -> str:
    """A create's answer that is not admitted, nor a quota's denial, nor a "retry": where it
    failed (`webhook`, `unreachable`, `other`: module doc) and why (its end kept: the cause
    is there, "... failed to call webhook: Post ...: EOF")."""
    if isinstance(err, ApiError):
        where = "webhook" if FAILED_CALL in err.message else "other"
        return f"{where}: {err.status} {_short(err.message)}"
    return f"unreachable: {type(err).__name__} {_short(str(err))}"


def _short(message: str) -> str:
    return message if len(message) <= 200 else f"{message[:80]} ... {message[-120:]}"


def asks_to_retry(message: str) -> bool:
    """A webhook's denial whose reason asks to try again (ours say "retry", in some wording)."""
    return DENIED in message and "retry" in message.split(DENIED, 1)[1]


@dataclass
class Load:
    """Creates across `tenants`' namespaces by `workers` coroutines over `clients` (module doc)."""

    clients: Sequence[Kube]
    tenants: Tenants
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

    def failed_in(self, where: str) -> int:
        """Failures of one kind: `webhook`, `unreachable` or `other`."""
        return sum(n for why, n in self.failed.items() if why.startswith(f"{where}:"))

    def start(self) -> None:
        self.started = time.monotonic()
        self._tasks = [asyncio.create_task(self._work(i), name=f"load {i}") for i in range(self.workers)]

    async def stop(self) -> None:
        """Let each worker finish its create and end (again: nothing more); a worker's
        error is raised here."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            await asyncio.gather(*self._tasks)
        finally:
            self.stopped = time.monotonic()

    async def until(self, creates: int, *, timeout: float = 120) -> None:
        """Wait (as an observation of progress, not a pace) until `creates` more were answered."""
        goal = self.total + creates
        deadline = time.monotonic() + timeout
        while self.total < goal:
            assert time.monotonic() < deadline, f"the load answered {self.total} of {goal} creates in {timeout}s"
            await asyncio.sleep(0.05)

    async def _work(self, worker: int) -> None:
        client = self.clients[worker % len(self.clients)]
        while not self._stop.is_set():
            self._serial += 1
            serial = self._serial
            namespaces = self.tenants.namespaces
            body = {"kind": "ResourceClaim", "metadata": {"name": f"c{serial}"},
                    "spec": claim_spec(exact_request("gpu", self.tenants.device_class))}
            try:
                await client.create(RESOURCE_V1, "resourceclaims", body, namespace=namespaces[serial % len(namespaces)])
                self.admitted += 1
            except ApiError as err:
                if any(e in err.message for e in EXCEEDED):
                    self.exceeded += 1
                elif asks_to_retry(err.message):
                    self.retried[_short(err.message.split(DENIED, 1)[1])] += 1
                    self.failures.append((time.monotonic(), f"(denied) {err.message}"))
                else:
                    self._failed(err)
            except (aiohttp.ClientError, TimeoutError, OSError) as err:  # the client's own connection
                self._failed(err)
                await asyncio.sleep(0.05)  # the API server is down: pacing, not synchronisation

    def _failed(self, err: BaseException) -> None:
        why = outcome(err)
        self.failed[why] += 1
        self.failures.append((time.monotonic(), why))

    def summary(self) -> str:
        return (f"{self.total} creates at {self.rate:.0f}/s: {self.admitted} admitted, {self.exceeded} exceeded, "
                f"{sum(self.retried.values())} denied to retry {dict(self.retried)}, "
                f"{sum(self.failed.values())} failed ({self.failed_in('webhook')} calling a webhook, "
                f"{self.failed_in('unreachable')} the API server unreachable) {dict(self.failed.most_common(8))}")


@contextlib.asynccontextmanager
async def running(load: Load) -> AsyncIterator[Load]:
    """`load` running in the background while the block runs; stopped (and its errors
    raised) on the way out."""
    load.start()
    try:
        yield load
    finally:
        await load.stop()


@dataclass
class Persisted:
    """Every claim stored in `tenants`' namespaces, by watch, in resourceVersion order (module doc)."""

    kube: Kube
    tenants: Tenants
    charged: dict[str, int] = field(default_factory=dict)  # namespace -> devices
    over: int = 0  # max over namespaces and resourceVersions of charged - hard, in devices (<= 0: none)
    unchecked: list[str] = field(default_factory=list)  # namespace/name of claims stored without our charge
    seen: int = 0
    _task: asyncio.Task[None] | None = None
    _version: str = ""

    async def start(self) -> None:
        listing = await self.kube.api.list(CLAIMS)
        self._version = listing.resource_version
        for claim in listing.items:
            self._add(claim)
        self.over = max(self._over(ns) for ns in self.tenants.hard)
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
        if ns not in self.tenants.hard:
            return
        self.seen += 1
        if CHARGE not in (meta.get("annotations") or {}):
            self.unchecked.append(f"{ns}/{meta['name']}")
        self.charged[ns] = self.charged.get(ns, 0) + claim["spec"]["devices"]["requests"][0]["exactly"].get("count", 1)
        self.over = max(self.over, self._over(ns))

    def _over(self, ns: str) -> int:
        return self.charged.get(ns, 0) - self.tenants.hard[ns]

    async def caught_up(self, *, timeout: float = 60) -> None:
        """Wait until the watch holds every claim the API server lists now."""
        listing = await self.kube.api.list(CLAIMS)
        wanted = sum(1 for c in listing.items if c["metadata"]["namespace"] in self.tenants.hard)
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
        full = {ns: self.charged.get(ns, 0) for ns in self.tenants.full}
        return (f"{self.seen} claims stored, over-commit {self.over:+d} devices (max charged - hard), "
                f"{len(self.unchecked)} without our charge; full quotas at {full} devices")


def devices(amounts: object) -> int:
    value = as_map(amounts).get("devices", 0)
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else 0


class QuotaWatch:
    """A reflector's store for the tenants' DeviceQuotas: the largest over-commit and the
    number of statuses it saw (module doc)."""

    def __init__(self, tenants: Tenants) -> None:
        self.tenants = tenants
        self.events = 0
        self.worst = -(10**9)  # max(used + reserved - hard) over every status seen
        self.worst_at = ""

    def _see(self, obj: Obj) -> None:
        meta = as_map(obj.get("metadata"))
        namespace = str(meta.get("namespace") or "")
        hard = self.tenants.hard.get(namespace)
        if hard is None:
            return
        status = as_map(obj.get("status"))
        self.events += 1
        over = devices(status.get("used")) + devices(status.get("reserved")) - hard
        if over > self.worst:
            self.worst, self.worst_at = over, f"{namespace} at resourceVersion {meta.get('resourceVersion')}"

    def replace(self, objects: list[Obj]) -> None:
        for obj in objects:
            self._see(obj)

    def upsert(self, obj: Obj) -> None:
        self._see(obj)

    def delete(self, obj: Obj) -> None:
        pass


@contextlib.asynccontextmanager
async def watching(api: KubeApi, tenants: Tenants) -> AsyncIterator[QuotaWatch]:
    watch = QuotaWatch(tenants)
    reflector = Reflector(api, QUOTAS, watch, trim=lambda obj: obj)

    async def run() -> NoReturn:
        await reflector.run()

    task = asyncio.create_task(run())
    try:
        await asyncio.wait_for(reflector.synced.wait(), 30)
        yield watch
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)



async def mismatches(kube: Kube, tenants: Tenants) -> dict[str, object]:
    """Each namespace whose quota's status differs from the claims listed (pending, as no
    claim is allocated: each one device, `reserved`), or that holds more claims than
    `hard`, or holds a reservation entry whose claim never came (an orphan past its TTL):
    namespace -> (claims, status numbers)."""
    wrong: dict[str, object] = {}
    for namespace, hard in tenants.hard.items():
        claims = len(await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace))
        status = as_map((await kube.get(DQ, "devicequotas", "gpus", namespace=namespace)).get("status"))
        counted = as_map(status.get("claims"))
        entries = [k for k in as_map(status.get("reservations")) if not k.startswith("lease.")]
        seen = (counted.get("allocated"), counted.get("pending"), devices(status.get("reserved")), len(entries))
        if seen != (0, claims, claims, 0) or claims > hard:
            wrong[namespace] = {"claims": claims, "hard": hard, "allocated, pending, reserved, entries": seen}
    return wrong


async def overcommit(kube: Kube, tenants: Tenants) -> int:
    """max(claims - hard) over the namespaces: claims are never deleted here, so the count
    now is the largest it ever was."""
    return max([len(await kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)) - hard
                for ns, hard in tenants.hard.items()])


class Readiness:
    """A serve process's `/readyz`, asked every `every` seconds as a kubelet would (more
    often): the times (monotonic) it answered other than 200, and 200 again."""

    def __init__(self, served: Served, every: float = 0.02) -> None:
        self.served, self.every = served, every
        self.context = served_context(served)
        self.answers: list[tuple[float, bool]] = []  # (when, ready), at each change

    def ready_again(self, since: float) -> float | None:
        """When it was ready again after being not ready at or after `since`, or None."""
        dropped = next((i for i, (at, ok) in enumerate(self.answers) if at >= since and not ok), None)
        if dropped is None:
            return None
        return next((at for at, ok in self.answers[dropped:] if ok), None)

    async def run(self) -> NoReturn:
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(f"https://127.0.0.1:{self.served.port}/readyz", ssl=self.context,
                                        timeout=aiohttp.ClientTimeout(total=2)) as resp:
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if not self.answers or self.answers[-1][1] != ok:
                    self.answers.append((time.monotonic(), ok))
                await asyncio.sleep(self.every)  # the probe's period, not synchronisation


@contextlib.asynccontextmanager
async def sampled(served: Served) -> AsyncIterator[Readiness]:
    readiness = Readiness(served)
    task = asyncio.create_task(readiness.run())
    try:
        yield readiness
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def own_identity(cluster: ControlPlane, kube: Kube, name: str, path: Path) -> tuple[Path, str]:
    """A kubeconfig of a ServiceAccount of its own in `default`, bound to cluster-admin, so
    the API server's audit log tells this process's writes from every other's; and the
    user name the audit log gives it."""
    account = {"kind": "ServiceAccount", "metadata": {"name": name}}
    await kube.create("v1", "serviceaccounts", account, namespace="default")
    await kube.create("rbac.authorization.k8s.io/v1", "clusterrolebindings", {
        "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]})
    answer = await kube.request("POST", f"/api/v1/namespaces/default/serviceaccounts/{name}/token",
                                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                      "spec": {"expirationSeconds": 3600}})
    return token_kubeconfig(cluster, answer["status"]["token"], path), f"system:serviceaccount:default:{name}"


def audited_writes_after(cluster: ControlPlane, user: str, wall: float) -> list[str]:
    """The writes of claims and namespaces (what the control plane's audit policy records)
    by `user` that the API server received at or after Unix time `wall`."""
    found = []
    for event in cluster.audit_events():
        received = str(event.get("requestReceivedTimestamp") or "")
        if (event.get("user") or {}).get("username") != user or not received:
            continue
        at = datetime.fromisoformat(received.replace("Z", "+00:00")).timestamp()
        if at >= wall:
            ref = event.get("objectRef") or {}
            found.append(f"{received} {event.get('verb')} {ref.get('resource')} {ref.get('namespace')}/{ref.get('name')}")
    return found


_REQUEST = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) DEBUG kube\.api: (PUT|PATCH|POST|DELETE) (\S+) -> (\d+) "
                      r"in ([\d.]+)s", re.MULTILINE)


def writes_sent_after(log: str, wall: float) -> list[str]:
    """The writes a serve process's debug log says it sent at or after Unix time `wall`
    (its log line's time less the round trip it reports) and the API server accepted,
    its own Lease's left out: a write sent before, answered after, is not among them."""
    found = []
    for m in _REQUEST.finditer(log):
        stamp, millis, method, path, status, seconds = m.groups()
        sent = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000 - float(seconds)
        if sent >= wall and status.startswith("2") and "/leases" not in path:
            found.append(f"{stamp},{millis} {method} {path} -> {status}")
    return found


# The replica faults (test_rolling_upgrade.py, test_cut_off.py): how big, what they report, what they cut.

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
