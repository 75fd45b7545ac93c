"""`dra-quota serve` as a process, reached by the real 1.37 API server through its Service.

The process runs with the admin kubeconfig and the test webhook certificate on a free
loopback port, behind the shipped configurations adapted for a shared test cluster
(tests/e2e/harness.py says how; the `served` and `setup` fixtures are conftest.py's).
On failure, the process's log is attached to the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest

from quota.admission.admissiontoken import is_token

from .driver import RESOURCE_V1, Gpu, claim_spec, create_claim_template, create_pod, exact_request
from .harness import (ADMISSION, DQ, QUOTA_HOOK, Setup, annotated, create, denial, exceeded, make_quota, review_latencies,
                      served_context, wait_status)
from .kube import ApiError, Kube, Obj, poll
from .timings import record

pytestmark = pytest.mark.e2e


# -- tests --------------------------------------------------------------------------------------


async def test_quota_is_enforced_on_direct_claims(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")  # two 80Gi GPUs' worth

        first = await create(kube, setup, "c1")
        # dryRun is evaluated, never reserved: two of them leave room for a second claim.
        for name in ("d1", "d2"):
            assert await denial(create(kube, setup, name, dry_run=True)) == ""
        second = await create(kube, setup, "c2")
        message = await denial(create(kube, setup, "c3"))
        assert message == exceeded("gpus", used="0", reserved="160Gi", limited="160Gi", namespace=setup.namespace,
                                   case="reserved")

        # One write per create: the charge, the quotas and the admission's token come back
        # with the create (the mutating webhook), and nothing rewrites them afterwards.
        for claim in (first, second):
            annotations = claim["metadata"]["annotations"]
            assert annotations["draquota.io/charge"] == '{"memory":85899345920,"devices":1}'
            assert annotations["draquota.io/quotas"] == "gpus"
            assert is_token(annotations["draquota.io/admission"]), annotations
            stored = await kube.get(RESOURCE_V1, "resourceclaims", claim["metadata"]["name"], namespace=setup.namespace)
            assert stored["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]

        await kube.delete(RESOURCE_V1, "resourceclaims", "c1", namespace=setup.namespace)
        await kube.wait_deleted(RESOURCE_V1, "resourceclaims", "c1", namespace=setup.namespace, timeout=30)
        # Gone from the API server is not yet seen by serve's watch (a backlog of other
        # tests' deletions may be ahead of it): until then its room stays held, fail closed.
        await wait_status(kube, setup.namespace, lambda s: (s.get("reserved") or {}).get("memory") == "80Gi",
                          "serve to see c1 deleted and free its room")
        await create(kube, setup, "c4")
        assert (await denial(create(kube, setup, "c5"))).startswith(f'admission webhook "{QUOTA_HOOK}" denied')
        latencies = review_latencies(setup.served.log_text())
        assert latencies, "the process logs each review with its uid and duration"
        print(f"serve ready in {setup.served.ready_seconds:.2f}s; {len(latencies)} reviews, "
              f"max {max(latencies):.1f}ms, median {sorted(latencies)[len(latencies) // 2]:.1f}ms")


async def test_a_conservative_denial_says_why_one_gpu_costs_the_largest(kube: Kube, setup: Setup) -> None:
    """The persisted path (reservations on the status) appends the note `check` does."""
    with setup.served.log_on_failure():
        await setup.fleet.add_node("n2", [Gpu("NVIDIA H200", "141Gi")])
        await make_quota(kube, setup, "gpus", "100Gi")

        async def priced_at_the_h200() -> str:  # once the process's inventory holds the new node
            message = await denial(create(kube, setup, "one", dry_run=True))
            return message if "requested memory=141Gi" in message else ""

        await poll(priced_at_the_h200, timeout=30, what="the webhook to see the H200")
        message = await denial(create(kube, setup, "one"))
        assert message == exceeded("gpus", used="0", reserved="0", limited="100Gi", requested="141Gi",
                                   namespace=setup.namespace, case="never") + (
            ". Priced conservatively: request gpu may get any of the 5 devices that match it and is charged as if it "
            "got the largest: memory=141Gi (the smallest: memory=80Gi). To be charged less, narrow request gpu with a "
            "selector (a model, a memory capacity) so that only the devices it needs match; or ask the cluster admin "
            'to set spec.pricing: Optimistic on DeviceQuota "gpus" (it charges the smallest candidate; dra-quota '
            "check --mode optimistic shows those prices)")


async def test_claims_from_pod_templates_are_admitted_the_same_way(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")
        await create(kube, setup, "direct")
        spec = claim_spec(exact_request("gpu", setup.fleet.device_class))
        await create_claim_template(kube, setup.namespace, "one-gpu", spec)
        for pod in ("p1", "p2"):
            await create_pod(kube, setup.namespace, pod, template="one-gpu", node_selector=setup.fleet.node_selector)

        async def generated() -> Obj | None:
            claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=setup.namespace)
            owned = [c for c in claims if any(o.get("kind") == "Pod" for o in c["metadata"].get("ownerReferences") or [])]
            return owned[0] if owned else None

        claim = await poll(generated, timeout=60, what="a claim generated from the template")
        assert (await annotated(kube, setup.namespace, claim["metadata"]["name"]))["draquota.io/quotas"] == "gpus"
        owner = next(o["name"] for o in claim["metadata"]["ownerReferences"] if o["kind"] == "Pod")
        refused = "p2" if owner == "p1" else "p1"

        async def failed_event() -> str | None:
            events = await kube.list("v1", "events", namespace=setup.namespace,
                                     field_selector=f"involvedObject.name={refused},reason=FailedResourceClaimCreation")
            return next((e["message"] for e in events if 'exceeded DeviceQuota "gpus"' in e["message"]), None)

        message = await poll(failed_event, timeout=60, what=f"FailedResourceClaimCreation on pod {refused}")
        # The numbers move as the scheduler allocates the admitted claims; the form does not.
        assert re.search(r'exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=\S+, '
                         r'reserved memory=\S+, limited memory=160Gi', message), message
        await kube.delete("v1", "pods", refused, namespace=setup.namespace, grace_period_seconds=0)


async def test_reservations_are_re_derived_from_the_claims_after_a_restart(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")
        for name in ("c1", "c2"):
            await create(kube, setup, name)
        code, _ = await setup.served.terminate()
        assert code == 0
        await setup.served.start()
        # The new process never admitted c1 and c2: it reserves them from the list.
        message = await denial(create(kube, setup, "c3"))
        assert message == exceeded("gpus", used="0", reserved="160Gi", limited="160Gi", namespace=setup.namespace,
                                   case="reserved")


@contextlib.asynccontextmanager
async def review_cut_short(setup: Setup) -> AsyncIterator[None]:
    """A connection on which serve has answered once, then got the headers and half the
    body of a review, and nothing more: aiohttp reads nothing once it is shutting down,
    so serve's drain waits for this one its whole grace (10 s)."""
    context = ssl.create_default_context(cafile=str(setup.served.cluster.ca_file))
    context.check_hostname = False  # the certificate names the Service, not 127.0.0.1
    reader, writer = await asyncio.open_connection("127.0.0.1", setup.served.port, ssl=context)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: dra-quota\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")  # answered: this connection is aiohttp's now
        assert head.startswith(b"HTTP/1.1 200"), head
        body = b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}'
        writer.write(b"POST /validate HTTP/1.1\r\nHost: dra-quota\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:len(body) // 2]))
        await writer.drain()
        yield
    finally:
        writer.close()


async def test_sigterm_stops_the_leaders_writes_before_the_listener_closes(kube: Kube, setup: Setup) -> None:
    """SIGTERM while the leader annotates claims being created. Its annotation PATCHes pass
    through our own claim-annotation guard (failurePolicy Fail: the namespace is governed),
    so the writers stop, and the Lease is released, while the listener still answers; it
    closes only then. Closing it first failed those PATCHes with 500, and a writer woken by
    such a failure just as it was cancelled lost the cancellation (3.11's wait_for): serve
    never exited (two e2e runs hung so). A review cut short keeps the listener draining
    for the whole grace, so a writer still running would meet it closed.
    The mutating configuration is removed first: a claim it admits carries its charge
    from the create and the leader has nothing to write; one that arrives without a charge
    (no webhook of ours reached it) the leader charges, as here."""
    with setup.served.log_on_failure():
        await make_quota(kube, setup, "gpus", "300Gi")
        # Then room for every claim below (none is allocated: each stays reserved).
        await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"hard": {"memory": "100000Gi"}}},
                         namespace=setup.namespace)

        async def raised() -> bool:
            return await denial(create(kube, setup, "probe", count=4, dry_run=True)) == ""

        await poll(raised, timeout=30, what="the webhook to see the raised limit")
        mutating = [c for c in setup.configs if c[0] == "mutatingwebhookconfigurations"]
        assert mutating, setup.configs
        for plural, name in mutating:
            await kube.delete(ADMISSION, plural, name)
            setup.configs.remove((plural, name))

        async def keep_creating(worker: int) -> None:
            for i in range(10_000):
                with contextlib.suppress(ApiError):  # refused once the listener closed: Fail
                    await create(kube, setup, f"w{worker}-{i}")

        async def writing() -> bool:  # the leader has annotated a claim, and the creates go on
            claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=setup.namespace)
            # The leader's charge: no admission token (the mutating webhook's charge has one).
            return any("draquota.io/charge" in (a := c["metadata"].get("annotations") or {})
                       and "draquota.io/admission" not in a for c in claims)

        creating = [asyncio.create_task(keep_creating(worker)) for worker in range(4)]
        try:
            await poll(writing, timeout=30, what="the leader to annotate a claim")
            async with review_cut_short(setup):
                code, _ = await setup.served.terminate()
        finally:
            for task in creating:
                task.cancel()
            await asyncio.gather(*creating, return_exceptions=True)
        assert code == 0
        log = setup.served.log_text()
        failed = re.findall(r"PATCH /apis/resource\.k8s\.io/v1/namespaces/\S+/resourceclaims/\S+ -> 5\d\d", log)
        assert failed == [], "the leader's annotation writes met its own closed listener"
        assert "still running" not in log


async def test_sigterm_stops_the_process_cleanly(kube: Kube, setup: Setup) -> None:
    with setup.served.log_on_failure():
        for plural, name in reversed(setup.configs):
            await kube.delete(ADMISSION, plural, name)
        setup.configs.clear()
        # terminate() waits 60 s for the exit (then raises): a condition, not a bar.
        code, seconds = await setup.served.terminate()
        assert code == 0, code
        record("SIGTERM -> exit", seconds, target=5.0)
        log = setup.served.log_text()
        assert "stopped" in log and "Traceback" not in log


async def test_after_sigterm_it_answers_not_ready_until_the_delay_ends_or_a_second_signal(
        kube: Kube, setup: Setup) -> None:
    """--shutdown-delay (the chart sets 15 s): after SIGTERM /readyz answers 503 at once, so
    the kubelet's probe takes the Pod out of the endpoints, while reviews are still answered
    (a rollout's old Pod fails none that reach it meanwhile); a second signal ends the wait.
    Without the delay the listener closed at once and the create below failed (500)."""
    served = setup.served
    with served.log_on_failure():
        await make_quota(kube, setup, "gpus", "160Gi")
        code, _ = await served.terminate()
        assert code == 0
        served.args = (*served.args, "--shutdown-delay", "3600")
        await served.start()
        assert served.process is not None
        served.process.send_signal(signal.SIGTERM)
        async with aiohttp.ClientSession() as http:
            async def not_ready() -> bool:
                async with http.get(f"https://127.0.0.1:{served.port}/readyz", ssl=served_context(served)) as resp:
                    return resp.status == 503

            await poll(not_ready, timeout=30, what="/readyz to answer 503 after SIGTERM")
        message = await denial(create(kube, setup, "too-big", count=3, dry_run=True))
        assert "exceeded DeviceQuota" in message, message
        assert served.process.poll() is None, "it waits out the delay"
        code, _ = await served.terminate()  # the second signal
        assert code == 0
        assert "SIGTERM: not ready" in served.log_text()
