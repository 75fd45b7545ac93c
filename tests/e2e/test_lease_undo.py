"""An admin's edit undone within a lease's window admits nothing past `hard` (the faults of docs/reservations.md).

`serve` with leases on, 1 and 3 replicas on one port (`--reuse-port`, as test_replicas.py),
the shipped webhooks. Four DeviceQuotas of `hard: {devices: H}` scoped to one DeviceClass,
each in its own namespace, each taken through one edit and its undo, all at once:
- enforcement Enforce -> Audit -> Enforce;
- deviceClassNames [the class] -> [another] -> [the class];
- hard H -> 2H -> H;
- deleted, then created again with the same spec (another uid).

Each sequence: LEASED creates of one GPU at once, so the replicas take leases while the
quota is far from `hard` (a lease entry on its status is waited for); the edit; creates
until the namespace holds exactly H claims (the edited spec admits them: Audit, another
scope, a higher `hard`, no quota); the undo, well within the lease window
(`--lease-period` PERIOD, long so a loaded machine finishes the sequence inside it).

Then every replica's quota watch is shown to hold the undo: a marker DeviceQuota of
`hard: {devices: 0}` is created after it in another governed namespace (the same
all-namespaces watch delivers it after the undo), and creates there are retried until
each replica's own `draquota_quota_denials_total{quota=<marker>}` (its metrics port)
counted a denial (the marker's reviews are posted straight to the shared port, each over
a new connection, so the kernel reaches every replica). Then PROBE creates into the edited namespace, spread over the replicas
as the kernel spreads the API server's connections: none is admitted, and the persisted
claims stay exactly H. A replica that revived its lease because the restored spec compares
equal to the one it was granted on admitted its unused room on top (docs/reservations.md,
"A spec change while a lease is open": the numbers before and after).

Without the version check in `quota.accounting.headroom.take` (a lease good on any spec equal to its
own) the Audit and the class sequences fail: 2-7 claims past `hard` with 1 replica, 5-10
with 3. The `hard` sequence and the re-creation pass even then, and stay as guards: the
holder's own writes under the raised `hard` carry its lease over to that spec, and a
DELETED event ends the book (docs/reservations.md, rule 6).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.metricnames import QUOTA_DENIALS

from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, claim_spec, exact_request
from .harness import (
    DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, create_until_decided, governed, installed,
    review,
)
from .kube import Kube, Obj, poll

pytestmark = pytest.mark.e2e

H = 40  # devices
LEASED = 12  # far from hard: each replica takes a lease (a quarter of the free room)
PROBE = 24
IN_FLIGHT = 8
PERIOD = 30.0
VARIANTS = ("enforcement", "class", "hard", "recreate")


@dataclass
class Replica(Served):
    """A `Served` on a shared port (`--reuse-port`: `start` waits for this replica's own
    readiness) with long lease windows."""

    args: tuple[str, ...] = ("--reuse-port", "--lease-period", str(PERIOD))


@dataclass(frozen=True)
class Run:
    kube: Kube
    clients: list[Kube]
    replicas: list[Replica]
    make_namespace: MakeNamespace
    run: str
    device_class: str

    def claim(self, name: str) -> Obj:
        return {"kind": "ResourceClaim", "metadata": {"name": name},
                "spec": claim_spec(exact_request("gpu", self.device_class))}


@dataclass(frozen=True)
class Undone:
    variant: str
    leases: int  # lease entries on the status when the edit was made
    edited: int  # claims persisted when the undo was made (H)
    admitted: int  # PROBE creates admitted after every replica had the undo
    persisted: int  # claims persisted at the end

    @property
    def past_hard(self) -> int:
        return self.persisted - H


async def creates(run: Run, namespace: str, names: list[str]) -> list[str]:
    """Create claims `names`, IN_FLIGHT at a time, each retried until a quota decides
    (`harness.create_until_decided`: contention, or a quota full only by other replicas'
    leases, is retried as a controller would): the quota's denial of each ("" admitted)."""
    slots = asyncio.Semaphore(IN_FLIGHT)
    retried: dict[str, int] = {}

    async def one(i: int, name: str) -> str:
        async with slots:
            return await create_until_decided(run.clients[i % len(run.clients)], namespace, run.claim(name), retried)

    return list(await asyncio.gather(*(one(i, name) for i, name in enumerate(names))))


def marker_review(run: Run, namespace: str) -> Obj:
    """A create of one GPU in the marker's namespace, as the API server sends it to serve."""
    name = f"m-{uuid.uuid4().hex[:6]}"
    claim = {"apiVersion": "resource.k8s.io/v1", **run.claim(name)}
    claim["metadata"] = {**claim["metadata"], "namespace": namespace, "uid": str(uuid.uuid4())}
    return {"uid": str(uuid.uuid4()), "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "name": name, "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "undo-test", "groups": ["system:authenticated"]},
            "object": claim, "oldObject": None, "dryRun": False}


async def count(kube: Kube, namespace: str) -> int:
    return len(await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace))


async def denials(replica: Replica, quota: str) -> float:
    scraped = await replica.metrics()
    return sum(v for (name, labels), v in scraped.items()
               if name == QUOTA_DENIALS and dict(labels).get("quota") == quota
               and dict(labels).get("decision") == "denied")


async def quota_object(kube: Kube, namespace: str, spec: Obj, name: str = "gpus") -> None:
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": name}, "spec": spec},
                      namespace=namespace)


def edits(run: Run, namespace: str, spec: Obj, variant: str) -> tuple[Callable[[], Awaitable[object]], ...]:
    """The edit and its undo, as an admin makes them."""
    kube = run.kube

    def patch(change: Obj) -> Callable[[], Awaitable[object]]:
        return lambda: kube.patch(DQ, "devicequotas", "gpus", {"spec": change}, namespace=namespace)

    if variant == "enforcement":
        return patch({"enforcement": "Audit"}), patch({"enforcement": "Enforce"})
    if variant == "class":
        return patch({"deviceClassNames": [f"{run.device_class}-other"]}), patch({"deviceClassNames": [run.device_class]})
    if variant == "hard":
        return patch({"hard": {"devices": 2 * H}}), patch({"hard": {"devices": H}})

    async def delete() -> None:
        await kube.delete(DQ, "devicequotas", "gpus", namespace=namespace)
        await kube.wait_deleted(DQ, "devicequotas", "gpus", namespace=namespace, timeout=30)

    return delete, lambda: quota_object(kube, namespace, spec)


async def leases(kube: Kube, namespace: str) -> int:
    quota = await kube.get(DQ, "devicequotas", "gpus", namespace=namespace)
    return sum(1 for key in (quota.get("status") or {}).get("reservations") or {} if key.startswith("lease."))


async def edit_and_undo(run: Run, variant: str) -> Undone:
    kube = run.kube
    namespace = await run.make_namespace(f"undo-{variant}", labels={RUN_LABEL: run.run})
    marker_namespace = await run.make_namespace(f"mark-{variant}", labels={RUN_LABEL: run.run})
    spec = {"hard": {"devices": H}, "deviceClassNames": [run.device_class], "enforcement": "Enforce"}
    await quota_object(kube, namespace, spec)
    await governed(kube, namespace)

    # Far from hard: every create admitted, under the replicas' leases.
    refused = [m for m in await creates(run, namespace, [f"lease-{i}" for i in range(LEASED)]) if m]
    assert not refused, refused
    held = await poll(lambda: leases(kube, namespace), timeout=30, what=f"a lease on {namespace}'s quota")

    edit, undo = edits(run, namespace, spec, variant)
    await edit()

    async def filled() -> bool:
        # What the edited spec allows, up to exactly H claims (never more: each round
        # creates at most what is missing). Denials while a replica has not seen the
        # edit yet are tried again.
        missing = H - await count(kube, namespace)
        if missing:
            await creates(run, namespace, [f"edit-{uuid.uuid4().hex[:6]}" for _ in range(missing)])
        return await count(kube, namespace) == H

    await poll(filled, timeout=60, what=f"{namespace} to hold {H} claims under the edited spec")
    await undo()

    # The marker, after the undo in the same watch; each replica has the undo once it denied one.
    marker = f"marker-{variant}"
    await quota_object(kube, marker_namespace, {"hard": {"devices": 0}}, name=marker)

    async def every_replica_denied() -> bool:
        if all([await denials(r, marker) >= 1 for r in run.replicas]):
            return True
        # Reviews posted straight to the shared port, each over a new connection: the kernel
        # picks a replica for each. The API server's own connections would not do: it keeps
        # them open, and with none to a replica that replica sees no review at all.
        await asyncio.gather(*(review(run.replicas[0], marker_review(run, marker_namespace), "/admit")
                               for _ in range(IN_FLIGHT)))
        return False

    await poll(every_replica_denied, timeout=60, what=f"every replica to deny a create under {marker}")

    probed = await creates(run, namespace, [f"probe-{i}" for i in range(PROBE)])
    # Each refused by the quota as exceeded: no create is left to retry.
    assert all('exceeded DeviceQuota "gpus"' in m for m in probed if m), {m for m in probed if m}
    return Undone(variant, held, H, probed.count(""), await count(kube, namespace))


@pytest.mark.parametrize("replicas", [1, 3])
async def test_an_edit_undone_within_a_lease_window_admits_nothing_past_hard(
        cluster: ControlPlane, kube: Kube, crd: None, clients: list[Kube], make_namespace: MakeNamespace,
        make_fleet: MakeFleet, tmp_path: Path, replicas: int) -> None:
    fleet = await make_fleet("undo")
    await fleet.add_node("n1", [Gpu()] * 4)
    port, *metrics_ports = free_ports(1 + replicas)
    lease = f"undo-{uuid.uuid4().hex[:8]}"  # one leader among them
    group = [Replica(cluster, port, tmp_path / f"r{i}.log", metrics_port=metrics_ports[i], lease=lease)
             for i in range(replicas)]
    run = Run(kube, clients, group, make_namespace, uuid.uuid4().hex[:8], fleet.device_class)
    try:
        with contextlib.ExitStack() as logs:
            for replica in group:
                logs.enter_context(replica.log_on_failure())
                await replica.start()
            async with installed(kube, adapted_webhooks(run.run, port, cluster)):
                results = await asyncio.gather(*(edit_and_undo(run, v) for v in VARIANTS))
    finally:
        for replica in group:
            await replica.kill()
    print("\n" + "\n".join(
        f"{replicas} replica(s), {r.variant}: {r.leases} lease(s) at the edit, {r.edited} claims at the undo, "
        f"{r.admitted} of {PROBE} admitted after, {r.persisted} persisted ({r.past_hard} past hard {H})"
        for r in results), file=sys.stderr)
    assert [(r.variant, r.admitted, r.persisted) for r in results] == [(v, 0, H) for v in VARIANTS]
