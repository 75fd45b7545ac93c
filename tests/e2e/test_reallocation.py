"""A deallocated claim's next allocation cannot take room that went to another claim
(docs/development/reservations.md, "A deallocated claim keeps what its last allocation charged").

On the real control plane with `dra-quota serve`: one 80Gi GPU and one 141Gi GPU; a
Conservative DeviceQuota of 221Gi on the fleet's DeviceClass. Claim u, which may get either
(first through that class, else through a second class that selects the same GPUs), is
reserved at 141Gi and allocated the 80Gi GPU through the first: the 61Gi freed lets claim w in at 141Gi. u is deallocated (its
status cleared, as the resourceclaim controller does once its Pod is gone). Counted at its
reservation again, u would put the quota at 282Gi of 221Gi, and its reallocation on the
141Gi GPU, "within its reservation", would pass unchecked: 282Gi allocatable. Counted at
its last allocation, the quota stays at 221Gi, the 141Gi reallocation is refused for its
61Gi excess, also by a `serve` started after the deallocation (it reads u's last
allocation from the record the leader keeps on the claim, which a tenant with `edit`
cannot lower or clear), and the 80Gi one (what u had) passes. Two of u's classes select
its GPU: a record by device could not say which class it was charged to, and the
restarted `serve` counted u at its reservation and allowed the 141Gi reallocation; the
record names the request.
"""

from __future__ import annotations

import json
import uuid

import pytest

from quota.values.quantity import ceil_int, parse_quantity

from .cluster import ControlPlane
from .driver import RESOURCE_V1, Gpu, create_device_class
from .harness import (
    DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, denial, edit_binding, governed, installed,
    wait_status,
)
from .kube import Kube, Obj, poll
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

GiB = 1024**3
RBAC = "rbac.authorization.k8s.io/v1"
RECORD = ("draquota.io/allocated-charge", "draquota.io/allocation-results")  # by device, by result
EXCESS_DENIED = ("the allocated devices charge more than the claim reserved (requested: the excess): "
                 'exceeded DeviceQuota "gpus": requested memory=61Gi')
WHOLE_DENIED = ('exceeded DeviceQuota "gpus": requested memory=141Gi, used memory=0, reserved memory=141Gi, '
                "limited memory=221Gi")


def _gib(status: Obj, field: str) -> int:
    return ceil_int(parse_quantity((status.get(field) or {}).get("memory") or 0)) // GiB


async def test_a_reallocation_never_takes_room_its_deallocation_left_to_another_claim(
        cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
        make_fleet: MakeFleet) -> None:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("realloc")
    small = await fleet.add_node("small", [Gpu()])
    big = await fleet.add_node("big", [Gpu(product="NVIDIA H200", memory="141Gi")])
    ns = await make_namespace("realloc", labels={RUN_LABEL: run})
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"}, "spec": {
        "hard": {"memory": "221Gi"}, "deviceClassNames": [fleet.device_class]}}, namespace=ns)
    either = f"{fleet.device_class}-either"  # every GPU of the driver, the fleet's among them
    await create_device_class(kube, either, driver=fleet.driver)
    spec = {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "fleet", "deviceClassName": fleet.device_class}, {"name": "either", "deviceClassName": either}]}]}}

    async def allocate(name: str, pool: str) -> str:
        allocation = {"devices": {"results": [{"request": "gpu/fleet", "driver": fleet.driver, "pool": pool,
                                               "device": "gpu-0"}]}}
        return await denial(kube.patch(RESOURCE_V1, "resourceclaims", name, {"status": {"allocation": allocation}},
                                       namespace=ns, subresource="status"))

    try:
        async with installed(kube, adapted_webhooks(run, served.port, cluster)):
            await governed(kube, ns)
            await kube.create(RESOURCE_V1, "resourceclaims", {"kind": "ResourceClaim", "metadata": {"name": "u"},
                                                              "spec": spec}, namespace=ns)
            await wait_status(kube, ns, lambda s: _gib(s, "reserved") == 141 and not s.get("reservations"),
                              "u counted at its Conservative price")
            assert await allocate("u", small) == ""
            await wait_status(kube, ns, lambda s: (_gib(s, "used"), _gib(s, "reserved")) == (80, 0),
                              "u counted at its allocation")
            assert await denial(kube.create(RESOURCE_V1, "resourceclaims", {
                "kind": "ResourceClaim", "metadata": {"name": "w"}, "spec": spec}, namespace=ns)) == ""
            await kube.patch(RESOURCE_V1, "resourceclaims", "u", {"status": {"allocation": None}}, namespace=ns,
                             subresource="status")
            status = await wait_status(
                kube, ns, lambda s: s.get("claims") == {"allocated": 0, "pending": 2} and not s.get("reservations"),
                "u deallocated, w admitted")
            assert (_gib(status, "used"), _gib(status, "reserved")) == (0, 80 + 141), status
            message = await allocate("u", big)
            assert EXCESS_DENIED in message, message

            # A replica started now never saw u's allocation: it reads it from the record the
            # leader keeps on the claim, and refuses the same reallocation.
            async def record() -> dict[str, dict[str, int]] | None:
                claim = await kube.get(RESOURCE_V1, "resourceclaims", "u", namespace=ns)
                annotations = claim["metadata"].get("annotations") or {}
                got = {key: json.loads(annotations[key]) for key in RECORD if key in annotations}
                return got if len(got) == len(RECORD) else None

            last = await poll(record, timeout=30, what="u's allocation record, by device and by result")
            assert [list(value.values()) for value in last.values()] == [[80 * GiB], [80 * GiB]], last
            (by_result,) = last[RECORD[1]]
            assert by_result.startswith("gpu/fleet:"), last  # the request says the class

            # A tenant with `edit` cannot lower (or clear) that record through the API server:
            # a replica started later would count less than the others do.
            tenant = f"tenant-{run}"
            await kube.create(RBAC, "rolebindings", edit_binding(tenant, tenant), namespace=ns)
            for annotation, forged in [(key, value) for key in RECORD for value in ({k: 1 for k in last[key]}, {})]:
                body = {"metadata": {"annotations": {annotation: json.dumps(forged)}}}

                async def refused() -> str | None:  # until the binding loads, RBAC refuses first
                    message = await denial(impersonated(kube, "PATCH", f"/apis/{RESOURCE_V1}/namespaces/{ns}/"
                                                        "resourceclaims/u", user=tenant, body=body))
                    return message if "records the claim's last allocation" in message else None

                await poll(refused, timeout=30, what=f"the webhook to refuse the tenant's {annotation}")
            assert await record() == last
            await served.kill()
            await served.start()
            # It counts u from the record, and, a list having brought u unallocated, cannot
            # vouch for the record being current: the allocation is checked whole.
            message = await allocate("u", big)
            assert WHOLE_DENIED in message, message
            assert await allocate("u", small) == ""  # what u had
            status = await wait_status(kube, ns, lambda s: (s.get("claims") or {}).get("allocated") == 1,
                                       "u allocated again")
            assert _gib(status, "used") + _gib(status, "reserved") <= 221, status
    finally:
        await kube.delete(RESOURCE_V1, "deviceclasses", either)
