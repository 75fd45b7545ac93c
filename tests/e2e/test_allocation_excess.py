"""Two `dra-quota serve` replicas never let allocations that charge more than their claims
reserved pass `hard` together (docs/development/reservations.md, "Allocations above the reservation").

An Optimistic DeviceQuota prices each claim at its smallest candidate, an 80Gi GPU; the
allocations set here pick a 141Gi one, 61Gi above what each claim reserved. CLAIMS claims
fill all but ROOM of `hard`: two excesses fit, a third does not. The status updates that
set the allocations are sent all at once, through the API server, from 4 clients
(`clients`: separate connection pools), and the API server spreads its webhook calls over
the two replicas (one loopback port, --reuse-port: tests/e2e/test_replicas.py). Each
replica used to decide them from its own ledger, within its watch's lag of the other's
allowed ones: up to two each, four in all (244Gi of excess into 130Gi of room). Now each
excess is persisted on the quota's status before the webhook allows it. Leases are off
(--lease-period 0): an idle lease of the creates would hold room the excesses need.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest

from quota.values.quantity import ceil_int, parse_quantity

from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, GpuFleet, claim_spec, exact_request
from .harness import (
    DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, create_until_decided, governed, installed,
    quota_status, review_latencies, wait_status,
)
from .kube import ApiError, Kube, Obj

pytestmark = pytest.mark.e2e

GiB = 1024**3
CLAIMS = 12
ROOM = 130  # Gi beyond the claims' reservations: two 61Gi excesses, not three
HARD = CLAIMS * 80 + ROOM  # Gi
ROUNDS = 3
ARGS = ("--reuse-port", "--lease-period", "0")
EXCESS_DENIED = "the allocated devices charge more than the claim reserved (requested: the excess)"


async def committed(kube: Kube, namespace: str) -> int:
    """GiB the namespace's claims take, from the claims themselves: 141 allocated, 80 not."""
    claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace)
    return sum(141 if (c.get("status") or {}).get("allocation") else 80 for c in claims)


async def allocate(client: Kube, namespace: str, name: str, driver: str, pool: str, device: str) -> str:
    """Set the claim's allocation to one 141Gi GPU, as the scheduler does: "" if allowed, else
    the denial (retried while a replica answers that it could not persist, as the scheduler would)."""
    allocation = {"devices": {"results": [{"request": "gpu", "driver": driver, "pool": pool,
                                           "device": device}]}}
    for _ in range(20):
        try:
            await client.patch(RESOURCE_V1, "resourceclaims", name, {"status": {"allocation": allocation}},
                               namespace=namespace, subresource="status")
            return ""
        except ApiError as err:
            if EXCESS_DENIED in err.message:
                return err.message
            await asyncio.sleep(0.05)  # retry pacing (contention, a conflict), not synchronisation
    raise AssertionError(f"allocation of {namespace}/{name} undecided after 20 attempts")


async def test_concurrent_excess_allocations_on_two_replicas_never_pass_hard(
        cluster: ControlPlane, kube: Kube, crd: None, clients: list[Kube], make_namespace: MakeNamespace,
        make_fleet: MakeFleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("excess")
    await fleet.add_node("small", [Gpu()])  # the smallest candidate: what Optimistic prices
    big = await fleet.add_node("big", [Gpu(product="NVIDIA H200", memory="141Gi")] * CLAIMS)
    namespaces = []
    for _ in range(ROUNDS):  # every quota exists before the replicas start: /readyz means they have it
        ns = await make_namespace("excess", labels={RUN_LABEL: run})
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"}, "spec": {
            "hard": {"memory": f"{HARD}Gi"}, "pricing": "Optimistic", "deviceClassNames": [fleet.device_class]}},
            namespace=ns)
        namespaces.append(ns)
    port = free_ports(1)[0]
    a = Served(cluster, port, tmp_path / "a.log", args=ARGS)
    b = Served(cluster, port, tmp_path / "b.log", args=ARGS, lease=a.lease)  # one leader between them
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            await b.start()
            async with installed(kube, adapted_webhooks(run, port, cluster)):
                for ns in namespaces:
                    await governed(kube, ns)
                    await one_round(kube, clients, ns, fleet, big)
            assert review_latencies(a.log_text()) and review_latencies(b.log_text()), "one replica answered all"
    finally:
        await a.kill()
        await b.kill()


async def one_round(kube: Kube, clients: list[Kube], ns: str, fleet: GpuFleet, big: str) -> None:
    errors: dict[str, int] = {}
    body = {"kind": "ResourceClaim", "spec": claim_spec(exact_request("gpu", fleet.device_class))}
    for i in range(CLAIMS):
        assert await create_until_decided(kube, ns, {**body, "metadata": {"name": f"c{i}"}}, errors) == ""
    # Counted at 80Gi each, every create's entry settled: each replica's claim cache holds them
    # (a writer decides only once its watch reached the watermark the settling raised).
    await wait_status(kube, ns, lambda s: s.get("claims") == {"allocated": 0, "pending": CLAIMS}
                      and not s.get("reservations") and s.get("reserved", {}).get("memory") == f"{CLAIMS * 80}Gi",
                      "the claims counted at their Optimistic price")
    done = asyncio.Event()
    # GiB the claims took, and `used + reserved` the leader wrote, at most while the burst ran.
    most = [0, 0]

    async def sample() -> None:
        # An observation while the allocations land; the assertion is on the maxima.
        while not done.is_set():
            most[0] = max(most[0], await committed(kube, ns))
            most[1] = max(most[1], _counted(await quota_status(kube, ns)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    monitor = asyncio.create_task(sample())
    try:
        denials = await asyncio.wait_for(asyncio.gather(*(
            allocate(clients[i % len(clients)], ns, f"c{i}", fleet.driver, big, f"gpu-{i}")
            for i in range(CLAIMS))), 120)
    finally:
        done.set()
        await monitor
    allowed = sum(1 for d in denials if not d)
    assert 1 <= allowed <= ROOM // 61, (allowed, denials)
    assert all('exceeded DeviceQuota "gpus": requested memory=61Gi' in d for d in denials if d), denials
    assert max(most[0], await committed(kube, ns)) <= HARD, most
    status = await wait_status(kube, ns, lambda s: (s.get("claims") or {}).get("allocated") == allowed,
                               "the leader to count the allocations")
    assert _gib(status["used"]["memory"]) == allowed * 141
    assert max(most[1], _counted(status)) <= HARD * GiB, most


def _gib(quantity: str) -> int:
    return ceil_int(parse_quantity(quantity)) // GiB


def _counted(status: Obj) -> int:
    """`used + reserved` memory of a status the leader wrote, in bytes."""
    return sum(ceil_int(parse_quantity((status.get(field) or {}).get("memory") or 0)) for field in ("used", "reserved"))
