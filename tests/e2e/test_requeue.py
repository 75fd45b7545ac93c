"""A Pod denied for quota gets its claim within seconds once quota frees.

The real resourceclaim controller (in the test's kube-controller-manager) retries a Pod
whose template claim our webhook denied with exponential backoff: 5 ms doubling per
failure (client-go DefaultTypedControllerRateLimiter). The test lets the waiting Pod
fail FAILURES times, so that controller's next retry is at least 5 ms x 2^(FAILURES-1)
= 41 s away, then frees the quota: the claim must exist before that retry could make it
(the wait, REQUEUE_WAIT = 30 s, is a condition with a margin, not a latency bar), which
only `controllers.requeue` touching the template (which re-queues every Pod using it)
achieves. How long it took is recorded (tests/e2e/timings.py; the target is
seconds), never asserted.
"""

from __future__ import annotations

import re
import time

import pytest

from .driver import RESOURCE_V1, claim_spec, create_claim_template, create_pod, exact_request
from .harness import Setup, annotated, make_quota
from .kube import Kube, Obj, poll
from .timings import record

pytestmark = pytest.mark.e2e

FAILURES = 14
REQUEUE_WAIT = 30.0  # below the controller's own next retry (41 s), far above a requeue's


def owned_by(claims: list[Obj], pod: str) -> Obj | None:
    return next((c for c in claims if any(o.get("kind") == "Pod" and o.get("name") == pod
                                          for o in c["metadata"].get("ownerReferences") or [])), None)


async def test_waiting_pod_gets_its_claim_when_quota_frees(kube: Kube, setup: Setup) -> None:
    namespace = setup.namespace
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "80Gi")  # one 80Gi GPU
        await create_claim_template(kube, namespace, "one-gpu", claim_spec(exact_request("gpu", setup.fleet.device_class)))
        await create_pod(kube, namespace, "first", template="one-gpu", node_selector=setup.fleet.node_selector)

        async def first_claim() -> Obj | None:
            return owned_by(await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace), "first")

        held = await poll(first_claim, timeout=60, what="the first Pod's claim")
        await create_pod(kube, namespace, "waiting", template="one-gpu", node_selector=setup.fleet.node_selector)

        # Each retry of the waiting Pod is one claim CREATE our webhook denies: the mutating
        # admission reviews it before the API server generates its name (`waiting-gpu-...`),
        # so the review names no claim (only the waiting Pod's claims are denied here).
        denied = re.compile(rf"/admit denied CREATE {re.escape(namespace)}/(waiting-gpu-\S*)? uid=")

        def denials() -> int:
            return len(denied.findall(setup.served.log_text()))

        async def backed_off() -> bool:
            return denials() >= FAILURES

        await poll(backed_off, timeout=120, what=f"{FAILURES} denied creates of the waiting Pod's claim")
        # The Pod first (else the resourceclaim controller would make it a new claim), then
        # its claim; quota is free once the claim is gone.
        await kube.delete("v1", "pods", "first", namespace=namespace, grace_period_seconds=0)
        await kube.delete(RESOURCE_V1, "resourceclaims", held["metadata"]["name"], namespace=namespace)
        await kube.wait_deleted(RESOURCE_V1, "resourceclaims", held["metadata"]["name"], namespace=namespace,
                                timeout=30)
        freed_at = time.monotonic()

        async def waiting_claim() -> Obj | None:
            return owned_by(await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace), "waiting")

        claim = await poll(waiting_claim, timeout=REQUEUE_WAIT,
                           what="the waiting Pod's claim, before the controller's backoff would retry")
        took = time.monotonic() - freed_at
        record("quota freed -> waiting Pod's claim created", took, target=10.0)
        template = await kube.get(RESOURCE_V1, "resourceclaimtemplates", "one-gpu", namespace=namespace)
        assert "draquota.io/requeued-at" in template["metadata"].get("annotations", {})
        assert (await annotated(kube, namespace, claim["metadata"]["name"]))["draquota.io/quotas"] == "gpus"
        print(f"\nwaiting Pod's claim created {took:.2f}s after quota freed ({denials()} denials before)")
