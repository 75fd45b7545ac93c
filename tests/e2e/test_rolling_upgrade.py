"""A rolling upgrade and its rollback under a steady load of creates: none fails.

Replicas share one loopback port with SO_REUSEPORT (`--reuse-port`, as test_replicas.py),
which the API server's --loopback-service resolver dials for the webhook Service, and one
Lease. The chart's strategy (maxSurge 1, maxUnavailable 0) is played out: a replica with
the new flags starts; once it is ready the first old one gets SIGTERM (with the chart's
`--shutdown-delay`) and the second new one starts; once that one is ready the second old
one gets SIGTERM. Then the same back to the old flags (a rollback). Meanwhile `faults.Load`
creates claims across 20 namespaces, 5 of them at `hard`.

Asserted on what the API server holds and what its clients saw: no create failed (no
webhook call timed out or lost its connection: "failed calling webhook"; our webhook's own
denials that say "retry", contention on a status under CPU starvation, are counted and
reported, not failures of the call; any other denial of ours, a replica deciding on caches
that miss what it should know, fails the test), no quota is
charged past `hard` at any resourceVersion, every stored claim carries our charge (none
admitted unchecked), every old replica exited 0, and a live replica holds the Lease at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from pathlib import Path

import pytest

from .cluster import ControlPlane, free_ports
from .driver import Gpu
from .faults import Load, Persisted, all_governed, chart_shutdown_delay, handovers, report, scale, stall_max, tenants
from .harness import MakeFleet, MakeNamespace, Served, adapted_webhooks, installed
from .kube import Kube, WaitTimeout, poll
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
    t = await tenants(kube, make_namespace, fleet.device_class, run=run)
    port = free_ports(1)[0]
    delay = str(chart_shutdown_delay())
    lease = f"rolling-{run}"
    size = scale()
    serial = iter(range(100))

    def replica(flags: tuple[str, ...]) -> Served:
        # Metrics over plain HTTP: read for the longest stall before each replica leaves.
        return Served(cluster, port, tmp_path / f"r{next(serial)}.log", lease=lease, log_level="info",
                      metrics_port=free_ports(1)[0],
                      args=("--reuse-port", "--shutdown-delay", delay, "--no-metrics-secure", *flags))

    live: list[Served] = []
    every: list[Served] = []
    exits: list[tuple[str, int, float]] = []
    stalls: list[float] = []
    timeline: list[tuple[float, str]] = []  # what happened when: a failure's report places it

    async def surge(flags: tuple[str, ...]) -> None:
        new = replica(flags)
        with new.log_on_failure():
            await new.start()
        live.append(new)
        every.append(new)
        timeline.append((time.monotonic(), f"{new.log.stem} ready"))
        record("a replica ready under load (s)", new.ready_seconds)

    async def retire(old: Served) -> None:
        live.remove(old)
        stalls.append(await stall_max(old.metrics_port))
        timeline.append((time.monotonic(), f"{old.log.stem} SIGTERM"))
        with old.log_on_failure():
            code, seconds = await old.terminate()
        timeline.append((time.monotonic(), f"{old.log.stem} exited"))
        exits.append((old.log.stem, code, seconds))

    async def roll(flags: tuple[str, ...]) -> None:
        """Two old replicas replaced by two with `flags`, as the Deployment does it."""
        first, second = live
        await surge(flags)
        retiring = asyncio.create_task(retire(first))
        await surge(flags)
        await asyncio.gather(retiring, retire(second))

    load = Load(clients, t, workers=size.workers)
    persisted = Persisted(kube, t)
    try:
        await asyncio.gather(surge(OLD), surge(OLD))
        async with installed(kube, adapted_webhooks(run, port, cluster)):
            await all_governed(kube, t)
            await persisted.start()
            load.start()
            await load.until(size.between)  # the full quotas fill, the others hold leases
            await roll(NEW)
            await load.until(size.between)
            await roll(OLD)
            await load.until(size.between)
            await load.stop()
            stalls.extend([await stall_max(r.metrics_port) for r in live])
            await persisted.caught_up()
            names = {r.log.stem for r in live}

            async def held() -> dict[str, object] | None:
                # The last replica to leave released the Lease (holder cleared, as client-go
                # does): one of those left takes it at its next retry, not at once.
                spec: dict[str, object] = (await kube.get("coordination.k8s.io/v1", "leases", lease,
                                                          namespace="default"))["spec"]
                return spec if spec.get("holderIdentity") in names else None

            try:
                holder = await poll(held, timeout=60, what="a live replica to hold the Lease")
            except WaitTimeout:  # the assertion below shows who holds it
                holder = (await kube.get("coordination.k8s.io/v1", "leases", lease, namespace="default"))["spec"]
            gaps = handovers([r.log for r in every])
            events = sorted(timeline + [(when, f"FAILED {message[-100:]}") for when, message in load.failures])
            print(f"\n{load.summary()}\n{persisted.summary()}\nexits: {exits}\nno leader for: {gaps}\n"
                  + "\n".join(f"{when - load.started:7.2f}s {what}" for when, what in events), file=sys.stderr)
            report("rolling", {"creates": load.total, "rate": round(load.rate, 1), "failed": sum(load.failed.values()),
                               "failures": dict(load.failed), "denied_to_retry": dict(load.retried),
                               "over_commit_gpus": persisted.over,
                               "unchecked": len(persisted.unchecked),
                               "ready_seconds": [round(r.ready_seconds, 2) for r in every],
                               "exit_seconds": [round(x, 2) for _, _, x in exits],
                               "longest_stall_seconds": max(stalls), "no_leader_seconds": gaps})
            assert not load.failed, load.summary()
            # Our webhook's other denials only ask to retry (contention, its deadline under a
            # starved CPU): none decided on caches missing what they should hold.
            assert all(m.endswith("retry") or "; retry (" in m for m in load.retried), load.summary()
            assert persisted.over <= 0, persisted.summary()
            assert not persisted.unchecked, persisted.summary()
            assert [code for _, code, _ in exits] == [0] * 4, exits
            assert holder.get("holderIdentity") in names, holder
    finally:
        await load.stop()
        await persisted.stop()
        for r in live:
            with contextlib.suppress(Exception):
                await r.kill()
