"""The Kueue harness itself (tests/e2e/kueue.py): a real Kueue admits a DRA Job, and holds
one behind an AdmissionCheck of ours.

No dra-quota runs here. The first test is Kueue alone: a ClusterQueue with quota for
:data:`~tests.e2e.kueue.DEVICE_RESOURCE` (the mapped DeviceClass), a LocalQueue, and a
suspended batch/v1 Job whose pod template stamps a ResourceClaimTemplate of that class:
Kueue's Workload charges the devices, is admitted and the Job unsuspended. The second is
the state our AdmissionCheck controller (controllerName ``draquota.io/devicequota``) will
act on: the test plays that controller's two writes (``Active`` on the AdmissionCheck, our
entry ``Ready`` on the Workload by server-side apply) and shows what Kueue does before and
after each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

from kube.api import Resource

from .driver import RESOURCE_V1, create_device_class
from .harness import unique
from .kube import Kube, Obj
from .kueue import API, DEVICE_RESOURCE, Kueue, condition
from .queues import BATCH, CONTROLLER, FIELD_MANAGER, charged, gpu_job, holds, kueue_namespace, queues, workload_of

pytestmark = pytest.mark.e2e


async def test_kueue_admits_a_dra_job_and_unsuspends_it(
    kueue: Kueue, kube: Kube, make_namespace: Callable[..., Awaitable[str]],
    queue_objects: Callable[..., Awaitable[Obj]],
) -> None:
    namespace = await kueue_namespace(make_namespace)
    cq, lq = await queues(kube, queue_objects, namespace, devices=4)
    await kube.wait_for_condition(API, "clusterqueues", cq, "Active")
    job = await gpu_job(kube, namespace, lq, devices=2)

    workload = await workload_of(kube, job, holds("Admitted"), "Admitted=True")

    assert holds("QuotaReserved")(workload)
    assert workload["status"]["admission"]["clusterQueue"] == cq
    flavor = next(iter(workload["status"]["admission"]["podSetAssignments"][0]["flavors"].values()))
    # Kueue charged the claim template's 2 devices of the mapped class, nothing else.
    assert charged(workload) == [{"flavors": {DEVICE_RESOURCE: flavor}, "usage": {DEVICE_RESOURCE: "2"}}]
    await kube.wait_for(BATCH, "jobs", job["metadata"]["name"], lambda j: j["spec"].get("suspend") is False,
                        namespace=namespace, what="unsuspended by Kueue")


async def test_workload_waits_for_our_admission_check(
    kueue: Kueue, kube: Kube, make_namespace: Callable[..., Awaitable[str]],
    queue_objects: Callable[..., Awaitable[Obj]],
) -> None:
    namespace = await kueue_namespace(make_namespace)
    check = (await queue_objects("admissionchecks", {
        "kind": "AdmissionCheck", "metadata": {"name": unique("ac")}, "spec": {"controllerName": CONTROLLER},
    }))["metadata"]["name"]
    cq, lq = await queues(kube, queue_objects, namespace, devices=4, checks=(check,))

    # No controller has made our check Active yet: Kueue keeps the ClusterQueue inactive.
    inactive = await kube.wait_for(
        API, "clusterqueues", cq, lambda o: (condition(o, "Active") or {}).get("reason") == "AdmissionCheckInactive",
        what="Active reason AdmissionCheckInactive")
    active = condition(inactive, "Active") or {}
    assert active["status"] == "False" and check in active["message"], active

    # What our controller will do first: mark the check Active.
    ac = await kube.get(API, "admissionchecks", check)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await kube.api.patch(Resource(API, "admissionchecks"), check, {
        "apiVersion": API, "kind": "AdmissionCheck", "metadata": {"name": check},
        "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active", "message": "e2e",
                                   "lastTransitionTime": now, "observedGeneration": ac["metadata"]["generation"]}]},
    }, patch_type="apply", subresource="status", field_manager=FIELD_MANAGER, force=True)
    await kube.wait_for_condition(API, "clusterqueues", cq, "Active")

    job = await gpu_job(kube, namespace, lq, devices=2)

    def checks(w: Obj) -> list[tuple[str, str]]:
        return [(c["name"], c["state"]) for c in (w.get("status") or {}).get("admissionChecks") or []]

    # Kueue lists our check (Pending) and reserves quota, in either order.
    reserved = await workload_of(kube, job, lambda w: holds("QuotaReserved")(w) and checks(w) == [(check, "Pending")],
                                 "QuotaReserved=True and our check Pending")

    # Quota reserved, our check Pending, not admitted, the Job still suspended: the state
    # our controller acts on. (Admitted cannot turn True without our Ready, so this holds.)
    assert not holds("Admitted")(reserved), reserved["status"]
    assert charged(reserved)[0]["usage"] == {DEVICE_RESOURCE: "2"}
    suspended = await kube.get(BATCH, "jobs", job["metadata"]["name"], namespace=namespace)
    assert suspended["spec"]["suspend"] is True

    # Our second write: only our entry, Ready, by server-side apply on workloads/status.
    name = reserved["metadata"]["name"]
    await kube.api.patch(Resource(API, "workloads"), name, {
        "apiVersion": API, "kind": "Workload", "metadata": {"name": name, "namespace": namespace},
        "status": {"admissionChecks": [{"name": check, "state": "Ready", "message": "e2e: fits",
                                        "lastTransitionTime": now}]},
    }, patch_type="apply", namespace=namespace, subresource="status", field_manager=FIELD_MANAGER, force=True)

    admitted = await workload_of(kube, job, holds("Admitted"), "Admitted=True after our check is Ready")
    assert checks(admitted) == [(check, "Ready")]
    await kube.wait_for(BATCH, "jobs", job["metadata"]["name"], lambda j: j["spec"].get("suspend") is False,
                        namespace=namespace, what="unsuspended by Kueue")


async def test_a_device_class_without_mapping_makes_the_workload_inadmissible(
    kueue: Kueue, kube: Kube, make_namespace: Callable[..., Awaitable[str]],
    queue_objects: Callable[..., Awaitable[Obj]],
) -> None:
    """Why every DeviceClass a Kueue test uses needs a deviceClassMappings entry (kueue.py)."""
    namespace = await kueue_namespace(make_namespace)
    cq, lq = await queues(kube, queue_objects, namespace, devices=4)
    await kube.wait_for_condition(API, "clusterqueues", cq, "Active")
    unmapped = unique("unmapped-gpu")
    await create_device_class(kube, unmapped)
    try:
        job = await gpu_job(kube, namespace, lq, devices=1, device_class=unmapped)

        def refused(w: Obj) -> bool:
            reserved = condition(w, "QuotaReserved") or {}
            return reserved.get("status") == "False" and "is not mapped" in reserved.get("message", "")

        workload = await workload_of(kube, job, refused, "QuotaReserved=False: DeviceClass not mapped")
        assert f"DeviceClass {unmapped} is not mapped" in (condition(workload, "QuotaReserved") or {})["message"]
        assert not holds("Admitted")(workload)
    finally:
        await kube.delete(RESOURCE_V1, "deviceclasses", unmapped)
