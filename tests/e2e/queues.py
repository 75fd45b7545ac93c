"""Kueue's objects a test makes: queues, a Job of DRA devices, and the Workload Kueue makes of it.

Shared by test_kueue_harness.py (Kueue alone, and our AdmissionCheck's two writes played
by hand) and test_kueue.py (dra-quota's AdmissionCheck controller); the Kueue process is
tests/e2e/kueue.py's, and conftest.py's ``queue_objects`` fixture deletes what they make.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .driver import POD_IMAGE, claim_spec, create_claim_template, exact_request
from .harness import unique
from .kube import Kube, Obj, poll
from .kueue import API, DEVICE_CLASS, DEVICE_RESOURCE, NAMESPACE_LABEL, QUEUE_LABEL, condition

# `make` of `queues`: conftest.py's `queue_objects` fixture.
MakeQueueObject = Callable[..., Awaitable[Obj]]
CONTROLLER = "draquota.io/devicequota"
FIELD_MANAGER = "dra-quota"
BATCH = "batch/v1"


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
