"""A tenant who makes the leader's allocation record fail cannot over-commit its quota
across a restart of `serve` or a change of leader (docs/development/reservations.md, "A replica that
cannot vouch for a claim's history").

On the real control plane, as a tenant bound to `edit` in its namespace: one 80Gi GPU and
two 141Gi GPUs; a Conservative DeviceQuota of 221Gi on the fleet's class. The tenant creates
claim u (any GPU: reserved at 141Gi) and pads u's annotations to 16 bytes short of the 256 KiB
the API server allows, an edit that never reaches our webhooks. u is allocated the 80Gi GPU
(the test writes the allocation as the scheduler does): the leader's patch recording it is
refused (422), so it names u (an `AnnotationsRefused` Event, a metric) and does not retry it.
The 61Gi u freed lets the tenant's claim w in at 141Gi. u is deallocated. A replica that
starts now counts u at its 141Gi reservation, as the record is not there: before, it took
u's reallocation on a 141Gi GPU as within that reservation, and w's beside it, 282Gi under a
hard of 221Gi, for good. It cannot vouch for u's history (a list brought it unallocated), so
the allocation is checked whole against the rest of the quota and refused; what u had (the
80Gi GPU) passes, and then w's 141Gi.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from quota.values.quantity import ceil_int, parse_quantity

from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, claim_spec, exact_request
from .harness import (
    ADMISSION, DQ, PLURALS, RUN_LABEL, MakeFleet, MakeNamespace, adapted_webhooks, denial, edit_binding,
    installed, metered, wait_status,
)
from .kube import ApiError, Kube, Obj, poll
from .test_replicas import Replica
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

GiB = 1024**3
RBAC = "rbac.authorization.k8s.io/v1"
ANNOTATIONS_LIMIT = 256 * 1024  # the API server's total for an object's annotations (keys and values)
PAD = "e2e.draquota.io/pad"
WHOLE = "dra-quota cannot tell what this claim's last allocation charged"
REFUSED_METRIC = "draquota_claim_annotations_refused_total"


def _gib(status: Obj, field: str) -> int:
    return ceil_int(parse_quantity((status.get(field) or {}).get("memory") or 0)) // GiB


@dataclass
class Scene:
    kube: Kube
    namespace: str
    tenant: str
    driver: str
    small: str  # the pool of the 80Gi GPU
    big: tuple[str, str]  # the pools of the two 141Gi GPUs
    body: Obj

    def path(self, name: str = "") -> str:
        return f"/apis/{RESOURCE_V1}/namespaces/{self.namespace}/resourceclaims" + (f"/{name}" if name else "")

    async def create(self, name: str) -> str:
        """The tenant creates claim `name`: "" when admitted, else the denial."""
        return await denial(impersonated(self.kube, "POST", self.path(), user=self.tenant,
                                         body={**self.body, "metadata": {"name": name}},
                                         content_type="application/json"))

    async def allocate(self, name: str, pool: str) -> str:
        """The scheduler's write of an allocation on `pool`'s GPU: "" when allowed, else the denial."""
        allocation = {"devices": {"results": [{"request": "gpu", "driver": self.driver, "pool": pool,
                                               "device": "gpu-0"}]}}
        return await denial(self.kube.patch(RESOURCE_V1, "resourceclaims", name, {"status": {"allocation": allocation}},
                                            namespace=self.namespace, subresource="status"))

    async def deallocate(self, name: str) -> None:
        """What the resourceclaim controller writes once the claim's Pod is gone."""
        await self.kube.patch(RESOURCE_V1, "resourceclaims", name, {"status": {"allocation": None}},
                              namespace=self.namespace, subresource="status")


async def scene(kube: Kube, make_namespace: MakeNamespace, make_fleet: MakeFleet, run: str) -> Scene:
    fleet = await make_fleet("unrecorded")
    small = await fleet.add_node("small", [Gpu()])
    big = (await fleet.add_node("big1", [Gpu(product="NVIDIA H200", memory="141Gi")]),
           await fleet.add_node("big2", [Gpu(product="NVIDIA H200", memory="141Gi")]))
    ns = await make_namespace("unrecorded", labels={RUN_LABEL: run})
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"}, "spec": {
        "hard": {"memory": "221Gi"}, "deviceClassNames": [fleet.device_class]}}, namespace=ns)
    tenant = f"tenant-{run}"
    await kube.create(RBAC, "rolebindings", edit_binding(tenant, tenant), namespace=ns)
    body = {"kind": "ResourceClaim", "apiVersion": RESOURCE_V1,
            "spec": claim_spec(exact_request("gpu", fleet.device_class))}
    return Scene(kube, ns, tenant, fleet.driver, small, big, body)


async def blocked_and_freed(s: Scene) -> None:
    """u padded, allocated on the 80Gi GPU with its record refused, w admitted into the room
    u freed, u deallocated: u counts 80Gi where its history is known, 141Gi elsewhere."""
    async def tenant_may_create() -> bool:  # the RoleBinding loads into the authorizer's cache
        message = await s.create("u")
        assert "forbidden" in message.lower() or message == "", message
        return message == ""

    await poll(tenant_may_create, timeout=30, what="the tenant's first create")
    await wait_status(s.kube, s.namespace, lambda st: _gib(st, "reserved") == 141 and not st.get("reservations"),
                      "u counted at its Conservative price")
    u = await s.kube.get(RESOURCE_V1, "resourceclaims", "u", namespace=s.namespace)
    annotations = u["metadata"].get("annotations") or {}
    taken = sum(len(k) + len(v) for k, v in annotations.items())
    pad = "x" * (ANNOTATIONS_LIMIT - 16 - taken - len(PAD))
    # An edit of the tenant's own annotations, not ours: it never reaches dra-quota's webhooks.
    assert await denial(impersonated(s.kube, "PATCH", s.path("u"), user=s.tenant,
                                     body={"metadata": {"annotations": {PAD: pad}}})) == ""
    assert await s.allocate("u", s.small) == ""
    await wait_status(s.kube, s.namespace, lambda st: (_gib(st, "used"), _gib(st, "reserved")) == (80, 0),
                      "u counted at its allocation")

    async def named() -> Obj | None:
        events = await s.kube.list("events.k8s.io/v1", "events", namespace=s.namespace)
        return next((e for e in events if e.get("reason") == "AnnotationsRefused"
                     and (e.get("regarding") or {}).get("name") == "u"), None)

    event = await poll(named, timeout=60, what="the AnnotationsRefused Event on u")
    assert "Too long" in event["note"] and "remove some of the claim's own annotations" in event["note"], event
    u = await s.kube.get(RESOURCE_V1, "resourceclaims", "u", namespace=s.namespace)
    assert "draquota.io/allocated-charge" not in (u["metadata"].get("annotations") or {})
    assert await s.create("w") == ""  # 80Gi used + 141Gi
    await s.deallocate("u")
    status = await wait_status(
        s.kube, s.namespace, lambda st: st.get("claims") == {"allocated": 0, "pending": 2} and not st.get("reservations"),
        "u deallocated, w admitted")
    assert (_gib(status, "used"), _gib(status, "reserved")) == (0, 80 + 141), status


async def no_over_commit(s: Scene) -> None:
    """On a replica that started after the deallocation and never read u's record: u's
    reallocation on a 141Gi GPU is checked whole and refused; the 80Gi GPU passes, then w's."""
    message = await s.allocate("u", s.big[0])
    assert WHOLE in message and 'exceeded DeviceQuota "gpus": requested memory=141Gi' in message, message
    assert await s.allocate("u", s.small) == ""  # what u had
    await wait_status(s.kube, s.namespace,
                      lambda st: (st.get("claims") or {}).get("allocated") == 1 and not st.get("reservations"),
                      "u allocated again, its entry settled")
    assert await s.allocate("w", s.big[1]) == ""
    status = await wait_status(s.kube, s.namespace, lambda st: (st.get("claims") or {}).get("allocated") == 2,
                               "w allocated")
    assert (_gib(status, "used"), _gib(status, "reserved")) == (221, 0), status


async def test_a_tenant_who_blocks_the_record_cannot_over_commit_across_a_restart(
        cluster: ControlPlane, kube: Kube, crd: None, make_namespace: MakeNamespace, make_fleet: MakeFleet,
        tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    s = await scene(kube, make_namespace, make_fleet, run)
    async for served in metered(cluster, tmp_path):
        async with installed(kube, adapted_webhooks(run, served.port, cluster)):
            await blocked_and_freed(s)
            metrics = await served.metrics()
            assert metrics.get((REFUSED_METRIC, frozenset({("namespace", s.namespace)})), 0) >= 1, {
                k: v for k, v in metrics.items() if k[0] == REFUSED_METRIC}
            writes = served.log_text().count("cannot write the annotations of ResourceClaim")
            assert writes >= 1
            await served.kill()
            await served.start()
            await no_over_commit(s)


async def test_nor_across_a_change_of_leader(cluster: ControlPlane, kube: Kube, crd: None,
                                             make_namespace: MakeNamespace, make_fleet: MakeFleet,
                                             tmp_path: Path) -> None:
    """Two replicas on one port. The leader is SIGKILLed after the deallocation: the other,
    which saw it all, leads and refuses the reallocation (u's 61Gi excess over the 80Gi it
    counts). The killed one starts again, and the survivor is SIGKILLed: the restarted one
    alone answers, never having seen u's allocation, and refuses it too."""
    run = uuid.uuid4().hex[:8]
    s = await scene(kube, make_namespace, make_fleet, run)
    port = free_ports(1)[0]
    a = Replica(cluster, port, tmp_path / "a.log")
    b = Replica(cluster, port, tmp_path / "b.log", lease=a.lease)
    configs: list[tuple[str, str]] = []
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            await b.start()
            for config in adapted_webhooks(run, port, cluster):
                await kube.create(ADMISSION, PLURALS[config["kind"]], config)
                configs.append((PLURALS[config["kind"]], config["metadata"]["name"]))

            def leader() -> Replica | None:
                leading = [r for r in (a, b) if r.process is not None and r.process.poll() is None
                           and r.log_text().count("leading: Lease") > 0]
                return leading[0] if len(leading) == 1 else None

            first = await poll(lambda: _now(leader()), timeout=60, what="a leader")
            await blocked_and_freed(s)
            other = b if first is a else a
            await first.kill()
            await poll(lambda: _now(other.log_text().count("leading: Lease") > 0 or None), timeout=90,
                       what="the other replica to take the Lease")
            message = await s.allocate("u", s.big[0])
            assert 'exceeded DeviceQuota "gpus"' in message, message
            await first.start()  # it lists: u unallocated, no record
            await other.kill()
            await no_over_commit(s)
    finally:
        for plural, name in reversed(configs):
            try:
                await kube.delete(ADMISSION, plural, name)
            except ApiError:
                pass
        await a.kill()
        await b.kill()


async def _now(value: object) -> object:
    return value
