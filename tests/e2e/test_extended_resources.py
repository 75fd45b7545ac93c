"""A Pod's extended-resource request backed by DRA is no way around the quota.

The real 1.37 scheduler turns a container request for an extended resource that a
DeviceClass maps (`spec.extendedResourceName`, or the implicit
`deviceclass.resource.kubernetes.io/<class>`) into a ResourceClaim it creates itself in
PreBind: a plain CREATE with generateName `<pod>-extended-resources-`, the Pod as
controlling owner and the annotation `resource.kubernetes.io/extended-resource-claim`
(k/k pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go,
createExtendedResourceClaimInAPI), then one status update with the allocation; when
anything after the create fails it deletes the claim (unreserveExtendedResourceClaim).
So the claim goes through our quota webhook like any other (a denial fails PreBind and
shows on the Pod as FailedScheduling), is charged once (the reservation is keyed by the
admission's token, each retry is a new claim, and the next attempt at the same Pod's
claim replaces the last one's entry), and its DELETE releases it at once.

And at Pod CREATE, a Pod whose request cannot fit gets a warning (`kubectl apply` shows
it), never a denial.

`dra-quota serve` runs as tests/e2e/harness.py runs it (the shipped webhook configurations,
adapted to the shared cluster), with persisted reservations.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from .cluster import ControlPlane
from .driver import DRIVER, POD_IMAGE, RESOURCE_V1, Gpu
from .harness import (
    DQ, QUOTA_HOOK, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, advised, annotated, denial,
    governed, installed,
)
from .harness import Setup as ServeSetup
from .kube import Kube, Obj, poll

pytestmark = pytest.mark.e2e

EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"
CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"


@dataclass
class Setup(ServeSetup):
    """The harness's setup, and a DeviceClass of its own that maps an extended resource."""

    device_class: str  # maps `resource`
    resource: str  # its extendedResourceName


@pytest_asyncio.fixture(loop_scope="session")
async def setup(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
                make_fleet: MakeFleet) -> AsyncIterator[Setup]:
    """A labelled namespace, a 4-GPU node, a DeviceClass with an extendedResourceName of its
    own (unique per test: the scheduler's class cache is cluster-wide), and the webhooks."""
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("ext")
    await fleet.add_node("n1", [Gpu()] * 4)
    namespace = await make_namespace("ext", labels={RUN_LABEL: run})
    device_class, resource = f"{fleet.prefix}-ext", f"e{run}.example.com/gpu"
    await kube.create(RESOURCE_V1, "deviceclasses", {
        "kind": "DeviceClass", "metadata": {"name": device_class},
        "spec": {"extendedResourceName": resource, "selectors": [{"cel": {"expression": (
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"')}}]}})
    try:
        async with installed(kube, adapted_webhooks(run, served.port, cluster)) as created:
            yield Setup(run, namespace, fleet, served, created, device_class, resource)
    finally:
        await kube.delete(RESOURCE_V1, "deviceclasses", device_class)


async def make_quota(kube: Kube, setup: Setup, name: str, devices: int) -> None:
    """A DeviceQuota on the extended class's devices, then wait until the process enforces it."""
    await kube.create(DQ, "devicequotas", {
        "kind": "DeviceQuota", "metadata": {"name": name},
        "spec": {"hard": {"devices": devices}, "deviceClassNames": [setup.device_class]}}, namespace=setup.namespace)
    await governed(kube, setup.namespace)

    async def enforced() -> bool:
        probe = {"kind": "ResourceClaim", "metadata": {"name": "probe"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": setup.device_class, "count": devices + 1}}]}}}
        message = await denial(kube.create(RESOURCE_V1, "resourceclaims", probe, namespace=setup.namespace,
                                           dry_run=True))
        return f'exceeded DeviceQuota "{name}"' in message

    await poll(enforced, timeout=30, what="the webhook to enforce the DeviceQuota")


def pod_body(setup: Setup, name: str, requests: dict[str, Any], *, init: dict[str, Any] | None = None) -> Obj:
    """A Pod whose container asks `requests` (extended resources: limits, the API server
    defaults requests to them), kept on the test's node."""
    spec: Obj = {
        "containers": [{"name": "main", "image": POD_IMAGE, "resources": {"limits": requests}}],
        "nodeSelector": setup.fleet.node_selector,
        "terminationGracePeriodSeconds": 0,
    }
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": POD_IMAGE, "resources": {"limits": init}}]
    return {"kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def extended_claims(kube: Kube, setup: Setup, pod: str | None = None) -> list[Obj]:
    claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=setup.namespace)
    return [c for c in claims if (c["metadata"].get("annotations") or {}).get(EXTENDED_CLAIM) == "true"
            and (pod is None or any(o.get("name") == pod for o in c["metadata"].get("ownerReferences") or []))]


async def quota_status(kube: Kube, setup: Setup, name: str) -> Obj:
    status: Obj = (await kube.get(DQ, "devicequotas", name, namespace=setup.namespace)).get("status") or {}
    return status


def attempt_reviews(setup: Setup) -> re.Pattern[str]:
    """The uid of each claim CREATE review our mutating webhook allowed in the namespace,
    not a probe's: the scheduler's claims have only their generateName then, so the
    review names no claim (or, should the API server name it first, one of the Pod's)."""
    return re.compile(rf"/admit allowed CREATE {re.escape(setup.namespace)}/(?:\S*-extended-resources-\S*)? uid=(\S+)")


async def scheduling_failure(kube: Kube, setup: Setup, pod: str, text: str) -> str:
    """The first FailedScheduling event of `pod` whose message contains `text`."""
    async def found() -> str | None:
        events = await kube.list("v1", "events", namespace=setup.namespace,
                                 field_selector=f"involvedObject.name={pod},reason=FailedScheduling")
        return next((e["message"] for e in events if text in e["message"]), None)

    message: str = await poll(found, timeout=60, what=f"FailedScheduling of pod {pod} saying {text!r}")
    return message


# -- tests --------------------------------------------------------------------------------------


async def test_the_schedulers_claim_is_admitted_charged_and_released(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", 1)
        await kube.create("v1", "pods", pod_body(setup, "big", {setup.resource: "2"}), namespace=setup.namespace)

        # The scheduler's claim CREATE is denied with our message, and the Pod says so.
        message = await scheduling_failure(kube, setup, "big", 'exceeded DeviceQuota "gpus"')
        assert (f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded DeviceQuota "gpus": '
                "requested devices=2, used devices=0, reserved devices=0, limited devices=1") in message, message
        pod = await kube.get("v1", "pods", "big", namespace=setup.namespace)
        assert not pod["spec"].get("nodeName")
        assert await extended_claims(kube, setup) == []
        # A denied create reserves nothing, however often the scheduler retries.
        assert not (await quota_status(kube, setup, "gpus")).get("reservations")

        # Room for two: the next retry is admitted, allocated and bound.
        await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"hard": {"devices": 2}}}, namespace=setup.namespace)
        pod = await kube.wait_for("v1", "pods", "big", lambda p: bool(p["spec"].get("nodeName")),
                                  namespace=setup.namespace, timeout=60, what="bound")
        [claim] = await extended_claims(kube, setup, "big")
        claim = await kube.wait_for(RESOURCE_V1, "resourceclaims", claim["metadata"]["name"],
                                    lambda c: bool((c.get("status") or {}).get("allocation")),
                                    namespace=setup.namespace, timeout=30, what="allocated")
        assert claim["metadata"]["name"].startswith("big-extended-resources-")
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 2
        annotations = await annotated(kube, setup.namespace, claim["metadata"]["name"])
        assert json.loads(annotations["draquota.io/charge"])["devices"] == 2
        assert annotations["draquota.io/quotas"] == "gpus"

        # Charged once, as this claim: the denied attempts left nothing behind (their
        # entries replaced one another, and the claim's own left once it was seen).
        async def charged_once() -> bool:
            status = await quota_status(kube, setup, "gpus")
            return not status.get("reservations") and (status.get("used") or {}).get("devices") == 2

        await poll(charged_once, timeout=30, what="the claim counted once, with no entry left")
        assert (pod["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName") == \
            claim["metadata"]["name"]

        # The quota is full: a second Pod's claim is denied.
        await kube.create("v1", "pods", pod_body(setup, "small", {setup.resource: "1"}), namespace=setup.namespace)
        message = await scheduling_failure(kube, setup, "small", 'exceeded DeviceQuota "gpus"')
        assert "requested devices=1" in message and "limited devices=2" in message, message

        # Deleting the Pod deletes its claim (the garbage collector, by owner); the watch's
        # deletion frees its devices, and the second Pod gets them.
        await kube.delete("v1", "pods", "big", namespace=setup.namespace, grace_period_seconds=0)
        await kube.wait_for("v1", "pods", "small", lambda p: bool(p["spec"].get("nodeName")),
                            namespace=setup.namespace, timeout=60, what="bound once the first Pod is gone")
        [small] = await extended_claims(kube, setup, "small")
        charge = (await annotated(kube, setup.namespace, small["metadata"]["name"]))["draquota.io/charge"]
        assert json.loads(charge)["devices"] == 1


async def test_the_implicit_class_resource_name_is_charged_too(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", 1)
        name = CLASS_PREFIX + setup.device_class
        await kube.create("v1", "pods", pod_body(setup, "implicit", {name: "2"}), namespace=setup.namespace)
        message = await scheduling_failure(kube, setup, "implicit", 'exceeded DeviceQuota "gpus"')
        assert "requested devices=2" in message, message
        assert await extended_claims(kube, setup) == []


async def test_a_pod_that_cannot_fit_gets_a_warning_at_create(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", 1)

        async def warned(name: str, requests: dict[str, Any], **kw: Any) -> list[str]:
            _, warnings = await kube.create_warned("v1", "pods", pod_body(setup, name, requests, **kw),
                                                   namespace=setup.namespace, dry_run=True)
            return warnings

        # Allowed (a dry run: the warning needs no Pod to exist), with our message.
        assert await warned("big", {setup.resource: "2"}) == [advised(
            f"the ResourceClaim the scheduler creates for this Pod's '{setup.resource}': 2 (DeviceClass "
            f"{setup.device_class}) can never fit (the Pod stays Pending while dra-quota denies that claim): "
            'exceeded DeviceQuota "gpus": requested devices=2, used devices=0, reserved devices=0, limited devices=1',
            "never", namespace=setup.namespace)]
        # The implicit name, and an init container's request reused by the main one:
        # the scheduler asks max(init shortfall) + main = 1 device, which fits.
        assert await warned("implicit", {CLASS_PREFIX + setup.device_class: "2"})
        assert await warned("reuse", {setup.resource: "1"}, init={setup.resource: "1"}) == []
        # Fits: no warning. Not ours (cpu only, an unmapped extended resource): none either.
        assert await warned("fits", {setup.resource: "1"}) == []
        assert await warned("cpu", {"cpu": "1", "memory": "1Gi"}) == []
        assert await warned("unmapped", {f"e{setup.run}.example.com/unmapped": "1"}) == []

        # Once a Pod holds the device, the next one "does not fit now".
        await kube.create("v1", "pods", pod_body(setup, "holder", {setup.resource: "1"}), namespace=setup.namespace)
        await kube.wait_for("v1", "pods", "holder", lambda p: bool(p["spec"].get("nodeName")),
                            namespace=setup.namespace, timeout=60, what="bound")

        async def now_full() -> list[str]:
            return [w for w in await warned("next", {setup.resource: "1"}) if "does not fit now" in w]

        [warning] = await poll(now_full, timeout=30, what="the held device to count in the warning")
        # Reserved or used, depending on how far the scheduler got: one device either way.
        assert re.search(r'exceeded DeviceQuota "gpus": requested devices=1, used devices=(0|1), '
                         r"reserved devices=(0|1), limited devices=1", warning), warning
        assert "used devices=0, reserved devices=0" not in warning


async def test_a_claim_the_scheduler_deletes_after_a_failed_status_update_is_released(
    kube: Kube, setup: Setup,
) -> None:
    """The scheduler's status update fails (our allocation check denies it) and it deletes
    the claim; every retry is a new claim with a new uid; nothing accumulates."""
    with setup.served.log_on_failure():
        # Optimistic pricing charges the smallest candidate, an 80Gi GPU on the cordoned
        # node; the only schedulable node has 141Gi GPUs, so every allocation is larger
        # than its reservation, and larger than `hard`.
        await kube.patch("v1", "nodes", setup.fleet.nodes[0], {"spec": {"unschedulable": True}})
        await setup.fleet.add_node("n2", [Gpu(memory="141Gi")] * 2)
        await kube.create(DQ, "devicequotas", {
            "kind": "DeviceQuota", "metadata": {"name": "mem"},
            "spec": {"hard": {"memory": "100Gi"}, "pricing": "Optimistic", "deviceClassNames": [setup.device_class]}},
            namespace=setup.namespace)

        async def priced_optimistically() -> bool:
            body = {"kind": "ResourceClaim", "metadata": {"name": "probe"}, "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": setup.device_class, "count": 2}}]}}}
            message = await denial(kube.create(RESOURCE_V1, "resourceclaims", body, namespace=setup.namespace,
                                               dry_run=True))
            # Two 80Gi (not 141Gi) GPUs: the quota, the cordoned node's devices and the new one are all known.
            return "requested memory=160Gi" in message

        await poll(priced_optimistically, timeout=30, what="the webhook to price the class optimistically")
        await kube.create("v1", "pods", pod_body(setup, "big", {setup.resource: "1"}), namespace=setup.namespace)

        most_entries = 0

        async def denied_twice() -> bool:
            nonlocal most_entries
            entries = (await quota_status(kube, setup, "mem")).get("reservations") or {}
            most_entries = max(most_entries, len(entries))
            events = await kube.list("v1", "events", namespace=setup.namespace,
                                     field_selector="involvedObject.name=big,reason=FailedScheduling")
            denials = {e["message"] for e in events if "charge more than the claim reserved" in e["message"]}
            return len(denials) >= 2  # two attempts, two claims (each event names its claim)

        await poll(denied_twice, timeout=90, what="two allocation denials of the Pod's claims")
        # Each attempt reserved under its own admission's token; the entry left once a
        # writer saw the claim carrying it (or the next attempt replaced it), and the
        # scheduler's deletion of the claim released it: never more than the one attempt
        # in flight.
        assert most_entries <= 1, most_entries
        # Our log: each attempt's claim was admitted by its own review (the mutating
        # webhook, before the API server names a generateName claim); no DELETE ever
        # reached us (there is no webhook for it).
        log = setup.served.log_text()
        created = set(attempt_reviews(setup).findall(log))
        assert len(created) >= 2, created
        assert " DELETE " not in log
        pod = await kube.get("v1", "pods", "big", namespace=setup.namespace)
        assert not pod["spec"].get("nodeName")

        await kube.delete("v1", "pods", "big", namespace=setup.namespace, grace_period_seconds=0)

        async def all_released() -> bool:
            status = await quota_status(kube, setup, "mem")
            return not status.get("reservations") and not await extended_claims(kube, setup)

        await poll(all_released, timeout=20, what="every reservation released (well before the 120 s TTL)")


async def test_attempts_refused_after_us_do_not_pile_up_until_their_ttl(kube: Kube, setup: Setup) -> None:
    """The in-tree ResourceQuota admits after the webhooks: each of the scheduler's
    attempts is admitted by us (a reservation persisted), then refused there, so its claim
    never exists and no DELETE comes. The next attempt for the same Pod replaces that
    entry instead of adding one: one Pod cannot fill the DeviceQuota with claims that do
    not exist (before this, one Pod asking 1 device held 4 of 4 within 10 s)."""
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", 2)
        await kube.create("v1", "resourcequotas", {"kind": "ResourceQuota", "metadata": {"name": "no-claims"},
                                                  "spec": {"hard": {"count/resourceclaims.resource.k8s.io": "0"}}},
                          namespace=setup.namespace)
        await kube.create("v1", "pods", pod_body(setup, "big", {setup.resource: "1"}), namespace=setup.namespace)
        attempt = attempt_reviews(setup)
        most_entries = 0

        async def three_attempts() -> bool:
            nonlocal most_entries
            entries = (await quota_status(kube, setup, "gpus")).get("reservations") or {}
            most_entries = max(most_entries, len(entries))
            return len(set(attempt.findall(setup.served.log_text()))) >= 3

        await poll(three_attempts, timeout=90, what="three attempts admitted by us and refused by the ResourceQuota")
        assert most_entries <= 1, most_entries
        assert await extended_claims(kube, setup) == []
        # Room is left: a 1-device claim passes our webhook (the ResourceQuota refuses it).
        probe = {"kind": "ResourceClaim", "metadata": {"name": "probe"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": setup.device_class, "count": 1}}]}}}
        message = await denial(kube.create(RESOURCE_V1, "resourceclaims", probe, namespace=setup.namespace,
                                           dry_run=True))
        assert "exceeded quota: no-claims" in message and "DeviceQuota" not in message, message
        await kube.delete("v1", "pods", "big", namespace=setup.namespace, grace_period_seconds=0)
