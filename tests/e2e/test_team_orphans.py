"""One namespace's failing creates never fill its team's record (quota.accounting.reservationrecord,
MAX_ENTRIES_PER_NAMESPACE), on the real API server with one `serve`.

Claim creates are admitted by a mutating webhook (docs/development/one-write.md), which runs before
the API server validates the object: a create the API server then refuses has reserved,
and its entry holds a place in the record until the TTL (an orphan). A tenant chooses
that: mallory, bound to `edit` in one namespace of a team, sends creates carrying an
invalid finalizer (our webhook checks a claim's name, labels and annotations itself, and
denies those before reserving; the API server checks the rest of its metadata after).
The team's record (shared by its namespaces) keeps at most MAX_ENTRIES_PER_NAMESPACE of
them, past which mallory's creates are refused by name, while a teammate's namespace
still admits. The quota has room for every orphan (it limits
devices, 10,000), so only the record's bound can refuse them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from quota.accounting.reservationrecord import MAX_ENTRIES_PER_NAMESPACE

from .cluster import ControlPlane
from .driver import RESOURCE_V1, Gpu, GpuFleet, claim_spec, exact_request
from .harness import (
    DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, adapted_webhooks, edit_binding, governed, installed,
)
from .kube import ApiError, Kube, Obj, poll, resource_path
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

TEAM_LABEL = "team.draquota.io/name"
CDQ = "clusterdevicequotas"
ATTEMPTS = MAX_ENTRIES_PER_NAMESPACE + 50
WORKERS = 16
INVALID = "not a finalizer!"  # the API server refuses it after the mutating webhooks


@dataclass
class Team:
    name: str
    noisy: str  # mallory's namespace
    quiet: str  # a teammate's
    mallory: str
    fleet: GpuFleet


@pytest_asyncio.fixture(loop_scope="session")
async def team(cluster: ControlPlane, kube: Kube, served: Served, make_namespace: MakeNamespace,
               make_fleet: MakeFleet) -> AsyncIterator[Team]:
    run = uuid.uuid4().hex[:8]
    name = f"orphans-{run}"
    fleet = await make_fleet("orphans")
    await fleet.add_node("n1", [Gpu()] * 4)
    labels = {RUN_LABEL: run, TEAM_LABEL: name}
    noisy = await make_namespace("noisy", labels=labels)
    quiet = await make_namespace("quiet", labels=labels)
    mallory = f"mallory-{run}"
    async with installed(kube, adapted_webhooks(run, served.port, cluster)):
        await kube.create("rbac.authorization.k8s.io/v1", "rolebindings", edit_binding(mallory), namespace=noisy)
        await kube.create(DQ, CDQ, {"kind": "ClusterDeviceQuota", "metadata": {"name": name},
                                    "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: name}},
                                             "hard": {"devices": 10_000}}})
        try:
            for namespace in (noisy, quiet):
                await governed(kube, namespace)
            t = Team(name, noisy, quiet, mallory, fleet)

            async def enforced() -> bool:  # a dry run is charged to the team once the quota is in the caches
                probe = await kube.create(RESOURCE_V1, "resourceclaims", claim(t, "probe"), namespace=quiet,
                                          dry_run=True)
                quotas = probe["metadata"].get("annotations", {}).get("draquota.io/quotas", "")
                return f"ClusterDeviceQuota/{name}" in quotas.split(",")

            await poll(enforced, timeout=30, what="the webhook to enforce the ClusterDeviceQuota")
            yield t
        finally:
            await kube.delete(DQ, CDQ, name)


def claim(team: Team, name: str, *, count: int = 1, finalizers: tuple[str, ...] = ()) -> Obj:
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": name, "finalizers": [*finalizers]},
            "spec": claim_spec(exact_request("gpu", team.fleet.device_class, count=count))}


async def as_mallory(kube: Kube, team: Team, body: Obj) -> str:
    """mallory's create: "" when created, else "<status>: <message>"."""
    try:
        await impersonated(kube, "POST", resource_path(RESOURCE_V1, "resourceclaims", namespace=team.noisy),
                           user=team.mallory, body=body, content_type="application/json")
    except ApiError as err:
        return f"{err.status}: {err.message}"
    return ""


async def test_one_namespaces_failing_creates_never_fill_its_teams_record(kube: Kube, team: Team,
                                                                          served: Served) -> None:
    bounded = (f'ClusterDeviceQuota "{team.name}" holds {MAX_ENTRIES_PER_NAMESPACE} admissions in flight from '
               f'namespace "{team.noisy}"')
    outcomes: Counter[str] = Counter()
    queue = iter(range(ATTEMPTS))

    async def attacker() -> None:
        for i in queue:
            answer = await as_mallory(kube, team, claim(team, f"orphan-{i}", finalizers=(INVALID,)))
            if answer.startswith("422: ") and "metadata.finalizers" in answer:
                outcomes["invalid"] += 1  # admitted by our webhook, refused by the API server's validation
            elif answer.startswith("403: ") and bounded in answer:
                outcomes["bounded"] += 1
            else:
                outcomes[answer or "created"] += 1

    with served.log_on_failure():
        await asyncio.gather(*(attacker() for _ in range(WORKERS)))
        # Every orphan reserved until the TTL (120 s, longer than this test): exactly the
        # bound's worth reached the API server's validation, the rest were refused by name.
        assert outcomes == {"invalid": MAX_ENTRIES_PER_NAMESPACE, "bounded": ATTEMPTS - MAX_ENTRIES_PER_NAMESPACE}, \
            outcomes
        status: Obj = (await kube.get(DQ, CDQ, team.name)).get("status") or {}
        entries = status.get("reservations") or {}
        assert sum(1 for e in entries.values() if e["claim"].startswith(f"{team.noisy}/")) == MAX_ENTRIES_PER_NAMESPACE

        # mallory's valid claim waits with the rest of its namespace's; a teammate's admits.
        refused = await as_mallory(kube, team, claim(team, "valid"))
        assert refused.startswith("403: ") and bounded in refused, refused
        created = await kube.create(RESOURCE_V1, "resourceclaims", claim(team, "teammate"), namespace=team.quiet)
        assert "draquota.io/charge" in created["metadata"].get("annotations", {}), created["metadata"]
