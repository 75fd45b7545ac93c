"""The Events beyond the DeviceQuota's, and the reconcile metric, on the real 1.37 control plane.

- A Pod whose claim is denied for quota gets a `QuotaExceeded` Warning (the denied claim
  does not exist): for a claim the resourceclaim controller stamps out of the Pod's
  template, and for the claim the scheduler makes for the Pod's extended resource. Both
  name the Pod as controlling owner; the Event carries the Pod's uid, so `kubectl
  describe pod` (which selects by uid) shows it.
- A claim the real scheduler allocates a larger device than its admission priced gets one
  `ChargedAboveReservation` (Normal) Event; one allocated within its price gets none.
  `dra-quota serve --default-pricing optimistic` prices the smallest candidate (an 80Gi
  GPU) and the Pod is kept on the node whose GPUs have 141Gi.
- `draquota_reconcile_duration_seconds` is scraped from the leader and counts the passes
  that wrote what the test reads on the DeviceQuota status.

(The DeviceQuota's own Events, on a denial and on turning Exceeded, are proven in
test_observability.py and test_controller.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from runtime.metricnames import INVENTORY_DEVICES, RECONCILE_DURATION

from .cluster import ControlPlane
from .driver import POD_IMAGE, RESOURCE_V1, Gpu, claim_spec, create_claim_template, create_pod, exact_request, \
    wait_pod_allocated
from .harness import DQ, Served, Setup, advised, annotated, create, denial, make_quota, metered
from .kube import Kube, Obj, poll

pytestmark = pytest.mark.e2e

EVENTS = "events.k8s.io/v1"
CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"  # every DeviceClass's implicit extended resource
EIGHTY_GIB = '{"memory":85899345920,"devices":1}'  # draquota.io/charge of one 80Gi GPU


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """Optimistic default pricing (the annotation prices the smallest candidate), metrics on."""
    async for handle in metered(cluster, tmp_path, "--default-pricing", "optimistic"):
        yield handle


async def events_where(kube: Kube, namespace: str, **fields: object) -> list[Obj]:
    """The Events of `namespace` whose top-level fields equal `fields`."""
    found = await kube.list(EVENTS, "events", namespace=namespace)
    return [e for e in found if all(e.get(k) == v for k, v in fields.items())]


def regarding(kind: str, obj: Obj, api_version: str = "v1") -> Obj:
    meta = obj["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "namespace": meta["namespace"],
            "uid": meta["uid"]}


async def test_a_pod_whose_claim_is_denied_for_quota_is_told(kube: Kube, setup: Setup) -> None:
    ns, fleet = setup.namespace, setup.fleet
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "80Gi")
        await create_claim_template(kube, ns, "one", claim_spec(exact_request("gpu", fleet.device_class)))
        await create(kube, setup, "holder")  # reserves the quota's 80Gi (no Pod: never allocated)
        from_template = await create_pod(kube, ns, "templated", template="one", node_selector=fleet.node_selector)
        extended = await kube.create("v1", "pods", {"kind": "Pod", "metadata": {"name": "extended"}, "spec": {
            "containers": [{"name": "main", "image": POD_IMAGE,
                            "resources": {"limits": {CLASS_PREFIX + fleet.device_class: "1"}}}],
            "nodeSelector": fleet.node_selector, "terminationGracePeriodSeconds": 0}}, namespace=ns)

        for pod in (from_template, extended):
            on_pod = regarding("Pod", pod)

            async def told(on_pod: Obj = on_pod) -> Obj | None:
                # Both retry (the resourceclaim controller's backoff starts at 5 ms, the
                # scheduler's at 1 s), each retry a new generated claim: one series.
                found = await events_where(kube, ns, reason="QuotaExceeded", regarding=on_pod)
                assert len(found) <= 1, found
                return found[0] if found and (found[0].get("series") or {}).get("count", 1) >= 2 else None

            event: Obj = await poll(told, timeout=60, what=f"QuotaExceeded counting 2 on Pod {on_pod['name']}")
            assert event["note"] == advised('exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=0, '
                                            "reserved memory=80Gi, limited memory=80Gi", "reserved", namespace=ns)
            assert (event["type"], event["action"], event["reportingController"], "related" in event) == (
                "Warning", "Admit", "draquota.io/dra-quota", False)
            # What `kubectl describe pod` asks for (core/v1 Events of the object, by its uid):
            described = await kube.list("v1", "events", namespace=ns, field_selector=(
                f"involvedObject.kind=Pod,involvedObject.name={on_pod['name']},involvedObject.namespace={ns},"
                f"involvedObject.uid={on_pod['uid']}"))
            assert [e["reason"] for e in described if e.get("reportingComponent") == "draquota.io/dra-quota"] == [
                "QuotaExceeded"], described
        # The DeviceQuota's Events stay: one per denied claim, each naming it, and with the
        # quota's uid (`kubectl describe devicequota` selects by it).
        quota = await kube.get(DQ, "devicequotas", "gpus", namespace=ns)
        on_quota = [e["note"] for e in await events_where(kube, ns, reason="QuotaExceeded")
                    if e["regarding"] == regarding("DeviceQuota", quota, DQ)]
        for prefix in ("templated-gpu-", "extended-extended-resources-"):
            assert any(n.startswith(f"ResourceClaim {ns}/{prefix}") and n.endswith(event["note"]) for n in on_quota), (
                prefix, on_quota)
        # The claims were denied: none exists for either Pod.
        assert [c["metadata"]["name"] for c in await kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)] == [
            "holder"]


async def test_an_allocation_above_its_reservation_is_told_once_and_reconciles_are_measured(
        kube: Kube, setup: Setup) -> None:
    ns, fleet, served = setup.namespace, setup.fleet, setup.served
    model = f"NVIDIA H200 {setup.run}"  # unique: other modules' fleets share the cluster
    big = await fleet.add_node("big", [Gpu(product=model, memory="141Gi")] * 2)
    with served.log_on_failure():
        before = await served.metrics()
        passes_before = before.get((f"{RECONCILE_DURATION}_count", frozenset()), 0.0)
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                               "spec": {"hard": {"memory": "1000Gi"}}}, namespace=ns)

        async def seen() -> bool:
            # serve holds the big node's GPUs (its inventory metric counts the test's model),
            # prices a 1-GPU claim at the smallest candidate, and its controller wrote the
            # new quota's first status.
            held = await served.metrics()
            big_gpus = [v for (name, labels), v in held.items()
                        if name == INVENTORY_DEVICES and dict(labels).get("model") == model]
            # Priced at the smallest candidate: 8 GPUs ask 8 x 80Gi, within the 1000Gi
            # (at the largest, 8 x 141Gi, they would not fit).
            probe = {"kind": "ResourceClaim", "metadata": {"name": "probe"},
                     "spec": claim_spec(exact_request("gpu", fleet.device_class, count=8))}
            message = await denial(kube.create(RESOURCE_V1, "resourceclaims", probe, namespace=ns, dry_run=True))
            status = (await kube.get(DQ, "devicequotas", "gpus", namespace=ns)).get("status") or {}
            return big_gpus == [2] and "used" in status and message == ""

        await poll(seen, timeout=30, what="the quota, the big node and optimistic pricing in serve's caches")
        await create_claim_template(kube, ns, "one", claim_spec(exact_request("gpu", fleet.device_class)))
        # Within its price first: an 80Gi GPU on the first node.
        await create_pod(kube, ns, "within", template="one", node_selector={"kubernetes.io/hostname": fleet.nodes[0]})
        _, within = await wait_pod_allocated(kube, ns, "within")
        await create_pod(kube, ns, "above", template="one", node_selector={"kubernetes.io/hostname": big})
        _, above = await wait_pod_allocated(kube, ns, "above")
        assert (await annotated(kube, ns, above["metadata"]["name"]))["draquota.io/charge"] == EIGHTY_GIB

        on_claim = regarding("ResourceClaim", above, RESOURCE_V1)

        async def told() -> list[Obj]:
            return await events_where(kube, ns, reason="ChargedAboveReservation", regarding=on_claim)

        (event,) = await poll(told, timeout=30, what="ChargedAboveReservation on the claim")
        assert (event["type"], event["action"], "series" in event) == ("Normal", "Allocate", False)
        assert event["note"] == (f"ResourceClaim {ns}/{above['metadata']['name']}: the allocated devices charge "
                                 "devices=1,memory=141Gi, more than the devices=1,memory=80Gi it was admitted at")
        # The claim allocated within its price: nothing. The recorder writes in order, and
        # that allocation was reviewed before the one just seen.
        assert not await events_where(kube, ns, reason="ChargedAboveReservation",
                                      regarding=regarding("ResourceClaim", within, RESOURCE_V1))

        # The leader's controller wrote both allocations to the status: its passes were timed.
        async def published() -> bool:
            status = (await kube.get(DQ, "devicequotas", "gpus", namespace=ns)).get("status") or {}
            return status.get("used") == {"memory": "221Gi", "devices": 2}

        await poll(published, timeout=30, what="used = 80Gi + 141Gi")
        after = await served.metrics()
        passes = after[(f"{RECONCILE_DURATION}_count", frozenset())] - passes_before
        assert passes >= 2, passes  # the new quota's first status, then the allocations
        assert after[(f"{RECONCILE_DURATION}_bucket", frozenset({("le", "+Inf")}))] == after[
            (f"{RECONCILE_DURATION}_count", frozenset())]
        assert 0 < after[(f"{RECONCILE_DURATION}_sum", frozenset())] < 60 * after[
            (f"{RECONCILE_DURATION}_count", frozenset())]
        # ... and still exactly one Event for the allocation above its price.
        assert len(await told()) == 1
