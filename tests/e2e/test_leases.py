"""Leases take the status write off each create's path far from `hard`, and near it every admission is exact.

`serve` (one process, the shipped webhooks, leases on: `--lease-period 5`, the default, given explicitly)
takes BURST creates of one 80Gi GPU, IN_FLIGHT at a time, first into a namespace whose
DeviceQuota with room is in Audit mode (admissions there are persisted one by one, batched
as before leases: `quota.accounting.headroom.leasable`), then into one whose DeviceQuota with the same
room enforces (leased), then FILL creates into one of `hard` = K GPUs.

The status writes of each phase are counted by the API server's own metric (PUTs of
`devicequotas/status`, the leader's controller's included in both phases); the count is
asserted, not the time. Asserted: every create of the two bursts admitted; the leased
burst needs at most half the writes of the exact one (one write for many admissions:
measured 10-20x fewer); the filling quota admits exactly K and denies the rest as
exceeded, and `used + reserved` never passes `hard` on its status. serve's own metrics
(`draquota_reservation_admissions_total`, `draquota_lease_writes_total`) say the same: the
Audit burst all `exact`, the enforced one mostly `lease`, after a `granted` write.

And an upgrade whose CRDs were not applied: with the DeviceQuota CRD's `source` enum of
the release before leases, the API server refuses a lease entry (422); every create is
still admitted, with single entries (counted `exact`, none `lease`), serve's log says how
to fix it and `draquota_lease_writes_total{outcome="refused"}` counts the refusal. The CRD is put
back as it was, and the API server seen taking a lease entry again, before the test ends.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from quota.values.quantity import parse_quantity
from runtime.metricnames import LEASE_WRITES, RESERVATION_ADMISSIONS

from .cluster import ControlPlane
from .driver import RESOURCE_V1
from .harness import CLIENTS, DQ, QUOTA_HOOK, RUN_LABEL, MakeNamespace, Served, Setup, claim_body, governed, metered
from .kube import ApiError, Kube, Obj, poll

pytestmark = pytest.mark.e2e

BURST = 300
IN_FLIGHT = 16
K = 40
FILL = 60


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """`serve` with leases on (`--lease-period 5`, the default), metrics on (its lease counters are read)."""
    async for handle in metered(cluster, tmp_path, "--lease-period", "5"):
        yield handle


async def status_puts(kube: Kube) -> int:
    """DeviceQuota status PUTs the API server answered 200, all namespaces."""
    total = 0
    for line in (await kube.api.text("/metrics")).splitlines():
        if (line.startswith("apiserver_request_total{") and 'resource="devicequotas"' in line
                and 'subresource="status"' in line and 'verb="PUT"' in line and 'code="200"' in line):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def quota(kube: Kube, namespace: str, hard: str, enforcement: str = "Enforce") -> None:
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": hard}, "enforcement": enforcement}},
                      namespace=namespace)
    await governed(kube, namespace)
    await kube.wait_for(DQ, "devicequotas", "gpus", lambda q: "used" in (q.get("status") or {}),
                        namespace=namespace, timeout=30, what="the leader's first status")


async def burst(setup: Setup, clients: list[Kube], namespace: str, count: int, prefix: str) -> dict[str, str]:
    """`count` creates, IN_FLIGHT at a time: name -> "created" or the denial."""
    outcomes: dict[str, str] = {}
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def create(i: int) -> None:
        name = f"{prefix}-{i:04d}"
        async with slots:
            try:
                await clients[i % CLIENTS].create(RESOURCE_V1, "resourceclaims", claim_body(setup, name),
                                                  namespace=namespace)
                outcomes[name] = "created"
            except ApiError as err:
                outcomes[name] = err.message

    await asyncio.gather(*(create(i) for i in range(count)))
    return outcomes


async def lease_counts(served: Served) -> dict[str, float]:
    """serve's admissions by path ("lease", "exact") and lease writes by outcome."""
    scraped = await served.metrics()
    return {dict(labels).get("path") or dict(labels)["outcome"]: value for (name, labels), value in scraped.items()
            if name in (RESERVATION_ADMISSIONS, LEASE_WRITES)}


def used_and_reserved(status: Obj) -> int:
    return sum(int(parse_quantity(str((status.get(key) or {}).get("memory") or "0"))) for key in ("used", "reserved"))


async def test_a_lease_takes_the_status_write_off_each_create_and_hard_stays_exact(
        kube: Kube, setup: Setup, make_namespace: MakeNamespace, clients: list[Kube]) -> None:
    exact = await make_namespace("serve-exact", labels={RUN_LABEL: setup.run})
    leased = setup.namespace
    filling = await make_namespace("serve-fill", labels={RUN_LABEL: setup.run})
    await quota(kube, exact, "1000Ti", enforcement="Audit")
    await quota(kube, leased, "1000Ti")
    await quota(kube, filling, f"{K * 80}Gi")

    writes: dict[str, int] = {}
    counted: dict[str, dict[str, float]] = {}
    for name, ns in (("exact", exact), ("leased", leased)):
        before, counts = await status_puts(kube), await lease_counts(setup.served)
        outcomes = await burst(setup, clients, ns, BURST, name)
        writes[name] = await status_puts(kube) - before
        counted[name] = {k: v - counts[k] for k, v in (await lease_counts(setup.served)).items()}
        refused = {k: v for k, v in outcomes.items() if v != "created"}
        assert not refused, (name, len(refused), next(iter(refused.items())))
    lease = (await kube.get(DQ, "devicequotas", "gpus", namespace=leased))["status"]
    print(f"{BURST} creates, {IN_FLIGHT} in flight: {writes['exact']} status writes exact, {writes['leased']} "
          f"leased; the leased quota's status after: reservedBy {lease.get('reservedBy')}")
    assert writes["leased"] * 2 <= writes["exact"], writes
    # serve's metrics: the Audit quota's admissions all exact, the enforced one's mostly under a lease.
    assert (counted["exact"]["exact"], counted["exact"]["lease"]) == (BURST, 0), counted
    assert counted["leased"]["lease"] + counted["leased"]["exact"] == BURST, counted
    assert counted["leased"]["lease"] * 2 >= BURST and counted["leased"]["granted"] >= 1, counted

    outcomes = await burst(setup, clients, filling, FILL, "fill")
    admitted = [k for k, v in outcomes.items() if v == "created"]
    denied = {v for v in outcomes.values() if v != "created"}
    assert len(admitted) == K, (len(admitted), denied)
    assert all(m.startswith(f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded DeviceQuota "gpus"')
               for m in denied), denied
    status = (await kube.get(DQ, "devicequotas", "gpus", namespace=filling))["status"]
    assert used_and_reserved(status) <= K * 80 * 1024**3, status


CRD = "apiextensions.k8s.io/v1"
CRD_NAME = "devicequotas.draquota.io"


def with_sources(crd: Obj, sources: list[str]) -> Obj:
    """The DeviceQuota CRD with its reservations' `source` enum set to `sources`."""
    crd = copy.deepcopy(crd)
    version = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    entry = version["properties"]["status"]["properties"]["reservations"]["additionalProperties"]
    entry["properties"]["source"]["enum"] = sources
    return crd


async def accepts_leases(kube: Kube, namespace: str) -> bool:
    """Whether the API server's DeviceQuota schema takes a `Lease` entry now (an expired
    one, on this test's own quota: every writer drops it)."""
    obj = await kube.get(DQ, "devicequotas", "probe", namespace=namespace)
    status = obj.get("status") or {}
    status["reservations"] = {**(status.get("reservations") or {}), "lease.probe.0": {
        "claim": "probe", "memory": "0", "devices": 0, "expires": "2000-01-01T00:00:00Z", "source": "Lease"}}
    try:
        await kube.replace(DQ, "devicequotas", {**obj, "status": status}, namespace=namespace, subresource="status")
    except ApiError as err:
        if err.status == 409:
            return await accepts_leases(kube, namespace)
        assert err.status == 422 and '"Lease"' in err.message, err.message
        return False
    return True


async def test_a_crd_from_before_leases_admits_with_single_entries_and_says_how_to_fix_it(
        kube: Kube, setup: Setup, make_namespace: MakeNamespace, clients: list[Kube]) -> None:
    # An upgrade whose CRDs were not applied (Helm never upgrades a chart's crds/): the
    # API server refuses a lease entry with a 422. Admissions must go on, one entry each.
    current = await kube.get(CRD, "customresourcedefinitions", CRD_NAME)
    namespace = await make_namespace("serve-oldcrd", labels={RUN_LABEL: setup.run})
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "probe"},
                                           "spec": {"hard": {"memory": "1Gi"}, "enforcement": "Audit"}},
                      namespace=namespace)
    try:
        await kube.replace(CRD, "customresourcedefinitions", with_sources(current, ["Claim", "Workload"]))
        await poll(lambda: _refusing(kube, namespace), timeout=60, what="the API server to take the old schema")
        roomy = await make_namespace("serve-oldcrd-claims", labels={RUN_LABEL: setup.run})
        await quota(kube, roomy, "1000Ti")
        counts = await lease_counts(setup.served)
        outcomes = await burst(setup, clients, roomy, 40, "old")
        counted = {k: v - counts[k] for k, v in (await lease_counts(setup.served)).items()}
        refused = {k: v for k, v in outcomes.items() if v != "created"}
        assert not refused, (len(refused), next(iter(refused.items())))
        assert "the DeviceQuota CRD refuses lease entries" in setup.served.log_text()
        held = (await kube.get(DQ, "devicequotas", "gpus", namespace=roomy))["status"].get("reservations") or {}
        assert not any(k.startswith("lease.") for k in held), held
        assert counted["refused"] >= 1 and (counted["exact"], counted["lease"]) == (40, 0), counted
    finally:
        latest = await kube.get(CRD, "customresourcedefinitions", CRD_NAME)
        await kube.replace(CRD, "customresourcedefinitions",
                           with_sources(latest, current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
                                        ["status"]["properties"]["reservations"]["additionalProperties"]["properties"]
                                        ["source"]["enum"]))
        await poll(lambda: accepts_leases(kube, namespace), timeout=60, what="the API server to take the schema back")


async def _refusing(kube: Kube, namespace: str) -> bool:
    return not await accepts_leases(kube, namespace)
