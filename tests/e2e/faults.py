"""Faults under load: what tests/e2e/test_faults.py and bench/faults.py share.

- `Tenants`: namespaces, each with a DeviceQuota `gpus` of `hard: {devices: H}` on one
  DeviceClass (the first `full` of them small, so they fill under the load and deny), all
  members of one team (a ClusterDeviceQuota with room, so the leader also copies the team's
  numbers into every member: AppliedClusterDeviceQuotas).
- `Load`: one-GPU claim creates round-robin over the namespaces, `in_flight` at a time over
  the clients, until told to stop; each create is tried once and counted: created, denied
  by a quota, failed (by where it failed: the API server unreachable, our webhook, other).
- `QuotaWatch`: every DeviceQuota event of the tenants' namespaces, through serve's own
  reflector (it reconnects and relists across an API server restart or a compaction):
  the largest `used + reserved - hard` any watched resourceVersion showed (over-commit).
- `mismatches`: each quota's status against the claims the API server lists (the truth).
- `writes_sent_after`: the writes one serve process began from a given time on, from its
  debug log (a write that waited for a connection counts from its start: too early);
  `audited_writes_after`: its writes of claims and namespaces the API server received
  from a given time on (its audit log), the process running as an identity of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
import uuid
from collections import Counter
from datetime import datetime
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import aiohttp

from kube.api import KubeApi
from kube.resources import QUOTAS
from kube.watching import Reflector
from quota.raw import Obj, as_map

from .cluster import ControlPlane
from .driver import RESOURCE_V1, Gpu, claim_spec, create_fleet, exact_request
from .harness import CRDS, DQ, RUN_LABEL, Served, served_context
from .kube import ApiError, Kube, poll
from .shipped import token_kubeconfig

TEAM_LABEL = "team.draquota.io/name"
CDQ = "clusterdevicequotas"
MakeNamespace = Callable[[str, dict[str, str]], Awaitable[str]]


@dataclass(frozen=True)
class Tenants:
    run: str
    device_class: str
    team: str
    hard: dict[str, int]  # namespace -> devices

    @property
    def namespaces(self) -> list[str]:
        return list(self.hard)


async def tenants(kube: Kube, make_namespace: MakeNamespace, device_class: str, *, run: str, count: int,
                  full: int, small: int, large: int = 100_000) -> Tenants:
    """`count` namespaces labelled for `run`'s webhooks and one team; the first `full` with
    `hard: {devices: small}`, the others `large`; the team quota with room for all."""
    team = f"faults-{run}"
    hard: dict[str, int] = {}
    for i in range(count):
        namespace = await make_namespace(f"fault{i}", {RUN_LABEL: run, TEAM_LABEL: team})
        hard[namespace] = small if i < full else large
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                               "spec": {"hard": {"devices": hard[namespace]},
                                                        "deviceClassNames": [device_class]}}, namespace=namespace)
    await kube.create(DQ, CDQ, {"kind": "ClusterDeviceQuota", "metadata": {"name": team},
                                "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: team}},
                                         "hard": {"devices": large * count}}})
    return Tenants(run, device_class, team, hard)


async def own_tenants(kube: Kube, *, run: str, count: int, full: int, small: int) -> Tenants:
    """`tenants` on a control plane of one's own, which is thrown away after (nothing here
    is deleted): the CRDs, a DeviceClass with one node of two GPUs, the namespaces."""
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

    return await tenants(kube, make_namespace, fleet.device_class, run=run, count=count, full=full, small=small)


async def until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """`poll` on a condition this process holds (the load's counters, a log's text)."""
    async def probe() -> bool:
        return condition()

    await poll(probe, timeout=timeout, what=what)


def outcome(err: BaseException) -> str:
    """Where a create that failed failed: `unreachable` (no answer from the API server),
    `webhook` (the API server could not call ours, or ours failed it), else `other`."""
    if isinstance(err, ApiError):
        if "webhook" in err.message:
            return f"webhook: {err.status} {err.message[:120]}"
        return f"other: {err.status} {err.message[:120]}"
    return f"unreachable: {type(err).__name__}"


@dataclass
class Load:
    clients: Sequence[Kube]
    tenants: Tenants
    in_flight: int = 16
    created: int = 0
    denied: int = 0
    failed: Counter[str] = field(default_factory=Counter)

    @property
    def failed_by_webhook(self) -> int:
        return sum(n for why, n in self.failed.items() if why.startswith("webhook"))

    def summary(self) -> str:
        return (f"{self.created} created, {self.denied} denied by a quota, {sum(self.failed.values())} failed "
                f"({self.failed_by_webhook} by a webhook call): {dict(self.failed.most_common(4))}")

    async def run(self, stop: asyncio.Event) -> None:
        """Create until `stop` is set; every create's outcome counted, none retried."""
        namespaces = itertools.cycle(self.tenants.namespaces)

        async def worker(client: Kube) -> None:
            while not stop.is_set():
                namespace = next(namespaces)
                body = {"kind": "ResourceClaim", "metadata": {"name": f"l-{uuid.uuid4().hex[:10]}"},
                        "spec": claim_spec(exact_request("gpu", self.tenants.device_class))}
                try:
                    await client.create(RESOURCE_V1, "resourceclaims", body, namespace=namespace)
                    self.created += 1
                except ApiError as err:
                    if "exceeded DeviceQuota" in err.message or "exceeded ClusterDeviceQuota" in err.message:
                        self.denied += 1
                    else:
                        self.failed[outcome(err)] += 1
                except (aiohttp.ClientError, TimeoutError, OSError) as err:
                    self.failed[outcome(err)] += 1
                    await asyncio.sleep(0.05)  # the API server is down: pacing, not synchronisation

        await asyncio.gather(*(worker(self.clients[i % len(self.clients)]) for i in range(self.in_flight)))


@contextlib.asynccontextmanager
async def running(load: Load) -> AsyncIterator[Load]:
    """`load` running in the background while the block runs; stopped (and its errors
    raised) on the way out."""
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    try:
        yield load
    finally:
        stop.set()
        await task



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
