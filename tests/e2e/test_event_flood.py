"""A tenant's flood of denials costs a bounded number of Events, in its own namespaces, and
leaves another tenant's Events recorded (the tenant budget, docs/development/hostile-tenant.md).

On the real 1.37 control plane with `dra-quota serve`: mallory, bound to `edit` in two
namespaces (one with a DeviceQuota smaller than any GPU, one with no quota), sends 300
claim creates her quota denies and 300 adminAccess claims the allowlist refuses, as an
impersonated user through the API server (real creates: dryRun ones make no Event). While
she does, bob, `edit` in his own governed namespace, has 5 claims denied. Then:
- each of mallory's namespaces holds at most 30 of our Events, their counts add up to
  her requests (aggregated on the Events, not dropped), and `default` and every other
  namespace hold none of hers (an Event regarding a Namespace could live only in
  `default`: the refusals regard the claim, in its namespace);
- each of bob's 5 denials has its Event, naming its claim.
bench/events.py measures the same flood (writes per request, the other tenant's fraction).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from runtime.metricnames import EVENTS_DROPPED

from .cluster import ControlPlane
from .driver import RESOURCE_V1, claim_spec, exact_request
from .harness import DQ, RUN_LABEL, MakeNamespace, Served, Setup, edit_binding, make_quota, metered
from .kube import ApiError, Kube, Obj, poll, resource_path
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

EVENTS = "events.k8s.io/v1"
OURS = "draquota.io/dra-quota"
FLOOD = 300  # of each kind
BOUND = 30  # Events in a namespace for the flood
IN_FLIGHT = 12


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    async for handle in metered(cluster, tmp_path):
        yield handle


async def ours(kube: Kube, namespace: str) -> list[Obj]:
    return [e for e in await kube.list(EVENTS, "events", namespace=namespace) if e.get("reportingController") == OURS]


def count(event: Obj) -> int:
    return int((event.get("series") or {}).get("count", 1))


async def test_a_flood_of_denials_costs_a_bounded_number_of_events_and_starves_no_one(
        kube: Kube, setup: Setup, make_namespace: MakeNamespace) -> None:
    served, run, fleet = setup.served, setup.run, setup.fleet
    quota_ns = setup.namespace
    free_ns = await make_namespace("evfree", labels={RUN_LABEL: run})
    bob_ns = await make_namespace("evbob", labels={RUN_LABEL: run})
    mallory, bob = f"mallory-{run}", f"bob-{run}"
    rbac = "rbac.authorization.k8s.io/v1"
    for user, namespace in ((mallory, quota_ns), (mallory, free_ns), (bob, bob_ns)):
        await kube.create(rbac, "rolebindings", edit_binding(user), namespace=namespace)

    async def claim(user: str, namespace: str, name: str, *, admin_access: bool = False) -> str:
        body = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": claim_spec(exact_request("gpu", fleet.device_class, admin_access=admin_access))}
        try:
            await impersonated(kube, "POST", resource_path(RESOURCE_V1, "resourceclaims", namespace=namespace),
                               user=user, body=body, content_type="application/json")
        except ApiError as err:
            return f"{err.status}: {err.message}"
        return ""

    def quota_denied(outcome: str) -> bool:
        return outcome.startswith("403: ") and 'exceeded DeviceQuota "gpus"' in outcome

    def refused(outcome: str) -> bool:
        return outcome.startswith("403: ") and "not on dra-quota's adminAccess allowlist" in outcome

    with served.log_on_failure():
        await make_quota(kube, setup, "gpus", "1Gi")  # waits until serve enforces it
        await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                               "spec": {"hard": {"memory": "1Gi"}}}, namespace=bob_ns)

        async def bob_enforced() -> bool:
            return quota_denied(await claim(bob, bob_ns, "probe-0"))

        # bob's probes are real denials too: after this, his Events are counted from `probe-*`.
        await poll(bob_enforced, timeout=30, what="serve to enforce bob's DeviceQuota")
        before = await served.metrics()

        sent = asyncio.Semaphore(IN_FLIGHT)
        outcomes: list[bool] = []

        async def attempt(call: Awaitable[str], expected: Callable[[str], bool]) -> None:
            async with sent:
                outcome = await call
            assert expected(outcome), outcome
            outcomes.append(True)

        flood = [attempt(claim(mallory, quota_ns, f"q{i}"), quota_denied) for i in range(FLOOD)]
        flood += [attempt(claim(mallory, free_ns, f"a{i}", admin_access=True), refused) for i in range(FLOOD)]
        flooding = asyncio.gather(*flood)
        bobs: list[str] = []
        while not flooding.done() and len(bobs) < 5:  # bob's five denials, each amid the flood
            if len(outcomes) >= (len(bobs) + 1) * 2 * FLOOD // 7:
                name = f"bob-{len(bobs)}"
                assert quota_denied(await claim(bob, bob_ns, name)), name
                bobs.append(name)
            await asyncio.sleep(0.05)  # paces bob's looks at the flood's progress, syncs nothing
        await flooding
        assert len(bobs) == 5, "the flood ended before bob's five denials were sent"
        assert len(outcomes) == 2 * FLOOD

        async def bob_told() -> list[str] | None:
            notes = [e["note"] for e in await ours(kube, bob_ns) if e["reason"] == "QuotaExceeded"]
            told = [b for b in bobs if any(n.startswith(f"ResourceClaim {bob_ns}/{b}: ") for n in notes)]
            return told if told == bobs else None

        await poll(bob_told, timeout=60, what="an Event for each of bob's five denials")

        async def counted() -> dict[str, list[Obj]] | None:
            # Every request counts on some Event once the series' last patches are written
            # (at most 10 s after the flood, the namespace's budget permitting).
            found = {ns: await ours(kube, ns) for ns in (quota_ns, free_ns)}
            totals = {ns: sum(count(e) for e in events) for ns, events in found.items()}
            return found if totals == {quota_ns: FLOOD, free_ns: FLOOD} else None

        found = await poll(counted, timeout=120, what=f"the Events to count mallory's {FLOOD} + {FLOOD} denials")
        for ns, events in found.items():
            assert len(events) <= BOUND, (ns, len(events))
            assert any(count(e) > 1 and e["note"].startswith("(combined from similar events): ") for e in events), ns
        assert {e["reason"] for e in found[free_ns]} == {"AdminAccessRefused"}
        assert all(e["regarding"]["kind"] == "ResourceClaim" and e["regarding"]["namespace"] == free_ns
                   for e in found[free_ns])

        # None of mallory's anywhere else: not in `default`, not in bob's namespace.
        mine = (quota_ns, free_ns, mallory)
        for ns in {e["metadata"]["namespace"] for e in await kube.list(EVENTS, "events")}:
            if ns in (quota_ns, free_ns):
                continue
            strays = [e for e in await ours(kube, ns) if any(m in e["note"] for m in mine)]
            assert not strays, (ns, strays)

        after = await served.metrics()
        dropped = (EVENTS_DROPPED, frozenset({("reason", "queue_full")}))
        # Folded into at most 20 series a namespace, the flood never fills its queue.
        assert after.get(dropped, 0) == before.get(dropped, 0)
