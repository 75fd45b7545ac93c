"""A replica cut off from the API server while the other is not, under a steady load of creates.

Two replicas on one loopback port (SO_REUSEPORT, one Lease, as test_replicas.py): `a`
leads and reaches the API server directly; `b` reaches it through `faults.PausingProxy`,
which the test pauses (every byte held both ways, new connections too: a partition) and
resumes. `faults.Load` creates claims across 20 namespaces throughout.

During the cut, once `b` says it is cut off (`draquota_api_server_reachable` 0 on its
metrics, plain HTTP here: a scrape's token review would need the API server), asserted
on the real control plane:
- creates the API server sends `b` in governed namespaces are refused, never admitted:
  each failed call the load saw is `b`'s own 503 ("failed calling webhook ... cannot reach
  the API server", failurePolicy Fail); before it knew, its own timeout denials ("retry");
- a namespace that comes under a DeviceQuota during the cut (which `b` never saw) gets
  no claim past its `hard`;
- creates in a namespace no quota governs all succeed (failurePolicy Ignore);
- no claim is stored without our charge, and no quota is charged past `hard`.
After the cut heals: `b` is reachable and ready again (its gauge and its log), and its
caches caught up: alone on the port once `a` is gone, it denies, with the quota's own
message, a create into the quota created while it was cut off.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import pytest

from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, claim_spec, exact_request
from .faults import (Load, PausingProxy, Persisted, all_governed, device_quota, proxied_kubeconfig, report, scale,
                     scrape, stall_max, tenants)
from .harness import (DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, governed, installed)
from .kube import ApiError, Kube, poll

pytestmark = pytest.mark.e2e

CUT_OFF = "cannot reach the API server"


async def reachable(metrics_port: int, value: float) -> bool:
    return (await scrape(metrics_port)).get("draquota_api_server_reachable[]") == value


async def test_a_replica_cut_off_from_the_api_server_admits_nothing_unchecked(
        cluster: ControlPlane, kube: Kube, crd: None, clients: list[Kube], make_namespace: MakeNamespace,
        make_fleet: MakeFleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("cut")
    await fleet.add_node("n1", [Gpu()] * 4)
    t = await tenants(kube, make_namespace, fleet.device_class, run=run)
    open_ns = await make_namespace("ungoverned", labels={RUN_LABEL: run})
    proxy = PausingProxy(("127.0.0.1", cluster.apiserver_port))
    await proxy.start()
    port, metrics_port, a_metrics = free_ports(3)
    lease = f"cut-{run}"
    size = scale()
    a = Served(cluster, port, tmp_path / "a.log", lease=lease, log_level="info", metrics_port=a_metrics,
               args=("--reuse-port", "--no-metrics-secure"))
    b = Served(cluster, port, tmp_path / "b.log", lease=lease, log_level="info", metrics_port=metrics_port,
               kubeconfig=proxied_kubeconfig(cluster, proxy.port, tmp_path / "proxied.kubeconfig"),
               args=("--reuse-port", "--no-metrics-secure"))
    load = Load(clients, t, workers=size.workers)
    persisted = Persisted(kube, t)
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            await kube.wait_for("coordination.k8s.io/v1", "leases", lease,
                                lambda obj: obj["spec"].get("holderIdentity") == "a", namespace="default",
                                timeout=60, what="a to lead")
            await b.start()
            async with installed(kube, adapted_webhooks(run, port, cluster)):
                await all_governed(kube, t)
                await persisted.start()
                load.start()
                await load.until(size.between)

                proxy.pause()
                cut = time.monotonic()
                await poll(lambda: reachable(metrics_port, 0.0), timeout=60, what="b to see it is cut off")
                noticed = time.monotonic() - cut
                late = await make_namespace("late", labels={RUN_LABEL: run})
                await kube.create(DQ, "devicequotas", device_quota(2, fleet.device_class), namespace=late)
                t.hard[late] = 2  # watched from here on (`Persisted` reads `t.hard` at each event)
                await governed(kube, late)
                late_answers = await creates(clients, late, fleet.device_class, 12)
                open_answers = await creates(clients, open_ns, fleet.device_class, 24)
                await asyncio.sleep(size.cut)  # the partition's length: the scenario, not a wait for a state
                during = load.summary()
                proxy.resume()
                healed = time.monotonic()

                await poll(lambda: reachable(metrics_port, 1.0), timeout=60, what="b to reach the API server again")
                back = time.monotonic() - healed
                await poll(lambda: logged(b, "answers again after"), timeout=30, what="b's log to say it decides again")
                await load.until(size.between)
                await load.stop()
                stalls = [await stall_max(p) for p in (a_metrics, metrics_port)]
                # b alone on the port from here (the API server keeps its connections to a
                # otherwise): its answers say whether its caches caught up with the cut.
                await a.kill()
                healed = time.monotonic()
                await poll(lambda: enforced(kube, late, fleet.device_class), timeout=120,
                           what="b to enforce the quota created while it was cut off")
                resynced = time.monotonic() - healed
                await persisted.caught_up()
                print(f"\nduring the cut: {during}\nin the end: {load.summary()}\n{persisted.summary()}\n"
                      f"late namespace: {late_answers}\nungoverned: {open_answers}", file=sys.stderr)
                report("cut off", {"creates": load.total, "rate": round(load.rate, 1),
                                   "cut_seconds": round(time.monotonic() - cut, 1),
                                   "refused_cut_off": sum(n for m, n in load.failed.items() if CUT_OFF in m),
                                   "failed_otherwise": sum(n for m, n in load.failed.items() if CUT_OFF not in m),
                                   "denied_to_retry": dict(load.retried),
                                   "over_commit_gpus": persisted.over, "unchecked": len(persisted.unchecked),
                                   "late_quota": late_answers, "ungoverned": open_answers,
                                   "seconds_to_notice": round(noticed, 2),
                                   "seconds_to_ready_after_heal": round(back, 2),
                                   "seconds_to_enforce_the_quota_made_during_the_cut": round(resynced, 2),
                                   "longest_stall_seconds": max(stalls)})
                assert load.failed, "no create reached b during the cut: the test proves nothing"
                assert all(CUT_OFF in m and "failed calling webhook" in m for m in load.failed), load.summary()
                assert persisted.over <= 0, persisted.summary()
                assert not persisted.unchecked, persisted.summary()
                assert persisted.charged.get(late, 0) <= 2, persisted.summary()
                assert open_answers["admitted"] == 24, open_answers
    finally:
        await load.stop()
        await persisted.stop()
        proxy.resume()
        await a.kill()
        await b.kill()
        await proxy.close()


async def logged(served: Served, text: str) -> bool:
    return text in served.log_text()


async def creates(clients: list[Kube], namespace: str, device_class: str, count: int) -> dict[str, int]:
    """`count` creates of one GPU into `namespace` at once; how each was answered."""
    answers: dict[str, int] = {}

    async def one(i: int) -> None:
        body = {"kind": "ResourceClaim", "metadata": {"name": f"x{i}"},
                "spec": claim_spec(exact_request("gpu", device_class))}
        try:
            await clients[i % len(clients)].create(RESOURCE_V1, "resourceclaims", body, namespace=namespace)
            key = "admitted"
        except ApiError as err:
            key = ("exceeded" if "exceeded DeviceQuota" in err.message else
                   "cut off" if CUT_OFF in err.message else err.message[:120])
        answers[key] = answers.get(key, 0) + 1

    await asyncio.gather(*(one(i) for i in range(count)))
    return answers


async def enforced(kube: Kube, namespace: str, device_class: str) -> bool:
    """A dry-run create of 4 GPUs into `namespace` (never fits) is denied by its quota."""
    body = {"kind": "ResourceClaim", "metadata": {"name": "probe"},
            "spec": claim_spec(exact_request("gpu", device_class, count=4))}
    try:
        await kube.create(RESOURCE_V1, "resourceclaims", body, namespace=namespace, dry_run=True)
    except ApiError as err:
        return "exceeded DeviceQuota" in err.message  # else a call to a, which is gone
    return False
