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

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from kube.api import Resource

from .conftest import unique
from .driver import RESOURCE_V1, POD_IMAGE, claim_spec, create_claim_template, create_device_class, exact_request
from .kube import Kube, Obj, poll
from .kueue import API, DEVICE_CLASS, DEVICE_RESOURCE, NAMESPACE_LABEL, QUEUE_LABEL, Kueue, condition

pytestmark = pytest.mark.e2e

CONTROLLER = "draquota.io/devicequota"
FIELD_MANAGER = "dra-quota"
BATCH = "batch/v1"


@pytest_asyncio.fixture(loop_scope="session")
async def queue_objects(kueue: Kueue, kube: Kube) -> AsyncIterator[Callable[..., Awaitable[Obj]]]:
    """Factory for cluster-scoped Kueue objects, deleted after the test (not awaited: a
    ClusterQueue keeps its finalizer until its Workloads are gone with the namespace)."""
    made: list[tuple[str, str]] = []

    async def make(plural: str, body: Obj) -> Obj:
        kueue.check_alive()
        created = await kube.create(API, plural, body)
        made.append((plural, created["metadata"]["name"]))
        return created

    yield make
    for plural, name in reversed(made):
        await kube.delete(API, plural, name)


async def kueue_namespace(make_namespace: Callable[..., Awaitable[str]]) -> str:
    return await make_namespace("kueue", labels={NAMESPACE_LABEL: "true"})


def cluster_queue(name: str, flavor: str, namespace: str, *, devices: int, checks: tuple[str, ...] = ()) -> Obj:
    spec: Obj = {
        # Only the test's namespace: other tests' LocalQueues never draw on this quota.
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [{
            "coveredResources": [DEVICE_RESOURCE],
            "flavors": [{"name": flavor, "resources": [{"name": DEVICE_RESOURCE, "nominalQuota": devices}]}],
        }],
    }
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return {"kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


async def queues(kube: Kube, make: Callable[..., Awaitable[Obj]], namespace: str, *, devices: int,
                 checks: tuple[str, ...] = ()) -> tuple[str, str]:
    """ResourceFlavor + ClusterQueue + LocalQueue; (ClusterQueue, LocalQueue) names."""
    flavor = (await make("resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": unique("rf")}}))
    cq = await make("clusterqueues", cluster_queue(unique("cq"), flavor["metadata"]["name"], namespace,
                                                   devices=devices, checks=checks))
    lq = unique("lq")
    await kube.create(API, "localqueues", {"kind": "LocalQueue", "metadata": {"name": lq},
                                           "spec": {"clusterQueue": cq["metadata"]["name"]}}, namespace=namespace)
    return cq["metadata"]["name"], lq


async def gpu_job(kube: Kube, namespace: str, queue: str, *, devices: int, device_class: str = DEVICE_CLASS) -> Obj:
    """A suspended Job for `queue` whose one pod stamps a claim for `devices` of `device_class`."""
    await create_claim_template(kube, namespace, "gpus",
                                claim_spec(exact_request("gpu", device_class, count=devices)))
    pod: Obj = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpus"}],
        "containers": [{"name": "main", "image": POD_IMAGE, "resources": {"claims": [{"name": "gpu"}]}}],
    }
    job: Obj = {
        "kind": "Job",
        "metadata": {"name": unique("job"), "labels": {QUEUE_LABEL: queue}},
        "spec": {"suspend": True, "parallelism": 1, "completions": 1, "template": {"spec": pod}},
    }
    return await kube.create(BATCH, "jobs", job, namespace=namespace)


async def workload_of(kube: Kube, job: Obj, predicate: Callable[[Obj], bool], what: str,
                      timeout: float = 60.0) -> Obj:
    """The Workload Kueue made for `job` (owned by it), once `predicate` holds."""
    namespace, uid = job["metadata"]["namespace"], job["metadata"]["uid"]
    last: list[Obj] = []

    async def probe() -> Obj | None:
        last[:] = [w for w in await kube.list(API, "workloads", namespace=namespace)
                   if any(o.get("uid") == uid for o in w["metadata"].get("ownerReferences") or [])]
        return next((w for w in last if predicate(w)), None)

    try:
        found: Obj = await poll(probe, timeout=timeout, what=f"the Workload of Job {job['metadata']['name']}: {what}")
    except AssertionError as e:
        raise AssertionError(f"{e}; Workloads seen: {last}") from None
    return found


def holds(kind: str, status: str = "True") -> Callable[[Obj], bool]:
    return lambda obj: (condition(obj, kind) or {}).get("status") == status


def charged(workload: Obj) -> list[dict[str, Any]]:
    return [{"flavors": a.get("flavors"), "usage": a.get("resourceUsage")}
            for a in workload["status"]["admission"]["podSetAssignments"]]


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
