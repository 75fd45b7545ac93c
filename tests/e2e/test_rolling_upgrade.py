"""A rolling upgrade and its rollback under a steady load of creates: none fails.

Replicas share one loopback port with SO_REUSEPORT (`--reuse-port`, as test_replicas.py),
which the API server's --loopback-service resolver dials for the webhook Service, and one
Lease. The chart's strategy (maxSurge 1, maxUnavailable 0) is played out: a replica with
the new flags starts; once it is ready the first old one gets SIGTERM (with the chart's
`--shutdown-delay`) and the second new one starts; once that one is ready the second old
one gets SIGTERM. Then the same back to the old flags (a rollback). Meanwhile `faults.Load`
creates claims across 20 namespaces, 5 of them at `hard`.

Asserted on what the API server holds and what its clients saw: no create failed (no
webhook call timed out or lost its connection: "failed calling webhook"), no quota is
charged past `hard` at any resourceVersion, every stored claim carries our charge (none
admitted unchecked), every old replica exited 0, and a live replica holds the Lease at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from pathlib import Path

import pytest

from .cluster import ControlPlane, free_ports
from .driver import Gpu
from .faults import Load, Persisted, all_governed, chart_shutdown_delay, tenants
from .harness import MakeFleet, MakeNamespace, Served, adapted_webhooks, installed
from .kube import Kube
from .timings import record

pytestmark = pytest.mark.e2e

OLD = ("--lease-period", "5")
NEW = ("--lease-period", "3", "--resync-period", "240")


async def test_rolling_upgrade_and_rollback_fail_no_create(cluster: ControlPlane, kube: Kube, crd: None,
                                                          clients: list[Kube], make_namespace: MakeNamespace,
                                                          make_fleet: MakeFleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("rolling")
    await fleet.add_node("n1", [Gpu()] * 4)
    t = await tenants(kube, make_namespace, run, fleet.device_class)
    port = free_ports(1)[0]
    delay = str(chart_shutdown_delay())
    lease = f"rolling-{run}"
    serial = iter(range(100))

    def replica(flags: tuple[str, ...]) -> Served:
        return Served(cluster, port, tmp_path / f"r{next(serial)}.log", lease=lease, log_level="info",
                      args=("--reuse-port", "--shutdown-delay", delay, *flags))

    live: list[Served] = []
    exits: list[tuple[str, int, float]] = []

    async def surge(flags: tuple[str, ...]) -> None:
        new = replica(flags)
        with new.log_on_failure():
            await new.start()
        live.append(new)
        record("a replica ready under load (s)", new.ready_seconds)

    async def retire(old: Served) -> None:
        live.remove(old)
        with old.log_on_failure():
            code, seconds = await old.terminate()
        exits.append((old.log.stem, code, seconds))

    async def roll(flags: tuple[str, ...]) -> None:
        """Two old replicas replaced by two with `flags`, as the Deployment does it."""
        first, second = live
        await surge(flags)
        retiring = asyncio.create_task(retire(first))
        await surge(flags)
        await asyncio.gather(retiring, retire(second))

    load = Load(clients, t)
    persisted = Persisted(kube, t)
    try:
        await asyncio.gather(surge(OLD), surge(OLD))
        async with installed(kube, adapted_webhooks(run, port, cluster)):
            await all_governed(kube, t)
            await persisted.start()
            load.start()
            await load.until(200)  # the full quotas fill, the others hold leases
            await roll(NEW)
            await load.until(200)
            await roll(OLD)
            await load.until(200)
            await load.stop()
            await persisted.caught_up()
            holder = (await kube.get("coordination.k8s.io/v1", "leases", lease, namespace="default"))["spec"]
            print(f"\n{load.summary()}\n{persisted.summary()}\nexits: {exits}", file=sys.stderr)
            assert not load.failed, load.summary()
            assert persisted.over <= 0, persisted.summary()
            assert not persisted.unchecked, persisted.summary()
            assert [code for _, code, _ in exits] == [0] * 4, exits
            assert holder.get("holderIdentity") in {r.log.stem for r in live}, holder
    finally:
        await load.stop()
        await persisted.stop()
        for r in live:
            with contextlib.suppress(Exception):
                await r.kill()
