"""kube.quotawriter against a scripted API server: what the real one cannot do on demand.

The fake (`.scripted.FakeApi`) keeps one DeviceQuota per name with a resourceVersion,
answers a status PUT with 409 when the precondition is stale, and can be told to inject
conflicts (another replica writing in between) — the real control plane is exercised in
tests/e2e/test_replicas.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kube.api import Resource
from kube.apierror import ApiError
from kube.leasebook import LeaseBook
from kube.quotawriter import Reservations
from kube.statuswriter import CONTENTION
from kube.watching import Progress
from quota.accounting.excess import allocation_key
from quota.accounting.headroom import Sizing
from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.admission.admitter import Admitter
from quota.pricing.priced import PricedRequest, Pricing
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import DeviceQuota, parse_cluster_device_quota, parse_device_quota
from quota.values.model import Charge, DeviceClassName, Namespace
from webhook.claimreview import ClaimContext, create_claim

from ..builders import GiB, make_cluster_quota, make_quota
from ..quota.pricing.test_pricer import CLASSES, inventory
from ..webhook.test_claimreview import POLICY, review_request
from .scripted import FakeApi

NS = Namespace("team-a")
GPU = Charge(80 * GiB, 1)


def setup(*quotas: dict[str, Any]) -> tuple[FakeApi, Reservations, list[DeviceQuota]]:
    api = FakeApi(*quotas)
    ledger = Ledger()
    ledger.set_namespace(NS, {"team.draquota.io/name": "ml"})
    parsed = [parse_cluster_device_quota(q) if q["kind"] == "ClusterDeviceQuota" else parse_device_quota(q)
              for q in quotas]
    for quota in parsed:
        ledger.add_or_update_quota(quota)
    return api, Reservations(api, ledger, ttl=60.0, clock=lambda: 1_000.0), parsed  # type: ignore[arg-type]


async def test_concurrent_admissions_share_one_write_and_stop_at_hard() -> None:
    api, reservations, (quota,) = setup(make_quota("gpus", memory="400Gi"))
    decisions = await asyncio.gather(*(reservations.admit({quota: GPU}, uid=f"u{i}", claim=f"team-a/c{i}")
                                       for i in range(8)))
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
    assert api.writes == 1
    assert decisions[5].message.startswith('exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=0, '
                                           "reserved memory=400Gi")
    assert decisions[5].denied_by == ("gpus",)  # the Event regards it
    status = api.objects["gpus"]["status"]
    assert sorted(status["reservations"]) == [f"u{i}" for i in range(5)]
    assert "reserved" not in status  # the quota controller's field (quota.status.quotastatus)


async def test_a_conflict_is_re_read_and_re_checked_then_denied_after_three() -> None:
    api, reservations, (quota,) = setup(make_quota("gpus", memory="400Gi"))
    api.conflicts_to_inject = 3
    assert (await reservations.admit({quota: GPU}, uid="u1", claim="team-a/c1")).allowed
    api.conflicts_to_inject = 4
    denied = await reservations.admit({quota: GPU}, uid="u2", claim="team-a/c2")
    assert (denied.allowed, denied.message, denied.denied_by) == (False, f'{CONTENTION} (DeviceQuota "gpus")', ())
    assert list(api.objects["gpus"]["status"]["reservations"]) == ["u1"]


class GatedApi(FakeApi):
    """Holds every status write at the API server until `gate` opens."""

    def __init__(self, *quotas: dict[str, Any]) -> None:
        super().__init__(*quotas)
        self.gate, self.in_flight = asyncio.Event(), asyncio.Event()

    async def update_status(self, resource: Resource, body: dict[str, Any], *,
                            namespace: str | None = None) -> dict[str, Any]:
        self.in_flight.set()
        await self.gate.wait()
        return await super().update_status(resource, body, namespace=namespace)


async def test_the_controller_waits_for_an_admissions_write_instead_of_conflicting_with_it() -> None:
    api = GatedApi(make_quota("gpus", memory="400Gi"))
    ledger = Ledger()
    quota = parse_device_quota(make_quota("gpus", memory="400Gi"))
    ledger.add_or_update_quota(quota)
    reservations = Reservations(api, ledger, ttl=60.0, clock=lambda: 1_000.0)  # type: ignore[arg-type]
    built: list[dict[str, Any]] = []

    def build(obj: dict[str, Any]) -> dict[str, Any]:
        built.append(obj)
        return {**obj, "status": {**(obj.get("status") or {}), "used": {"memory": "0", "devices": 0}}}

    admission = asyncio.create_task(reservations.admit({quota: GPU}, uid="u1", claim="team-a/c1"))
    await api.in_flight.wait()  # the admission's write is at the API server
    # The controller's write, with no retry: built from the object the admission is
    # replacing, it would be refused.
    controller = asyncio.create_task(reservations.write_status((quota.namespace, quota.name), build, retries=0))
    for _ in range(10):  # let it run as far as it can (no clock involved: only task switches)
        await asyncio.sleep(0)
    api.gate.set()
    admitted, written = await asyncio.gather(admission, controller)
    assert admitted.allowed and not written.conflicts and written.written is not None
    assert [list(obj["status"].get("reservations") or {}) for obj in built] == [["u1"]]  # built once, after it
    assert api.writes == 2
    status = api.objects["gpus"]["status"]
    assert list(status["reservations"]) == ["u1"] and status["used"] == {"memory": "0", "devices": 0}


async def test_a_retried_uid_and_a_dry_run_count_nothing_more() -> None:
    api, reservations, (quota,) = setup(make_quota("gpus", memory="160Gi"))
    for _ in range(2):
        assert (await reservations.admit({quota: GPU}, uid="u1", claim="team-a/c1")).allowed
    writes = api.writes
    assert (await reservations.admit({quota: GPU}, uid="u2", claim="team-a/c2", dry_run=True)).allowed
    assert api.writes == writes and list(api.objects["gpus"]["status"]["reservations"]) == ["u1"]


async def test_a_later_quota_denying_releases_the_earlier_ones() -> None:
    api, reservations, quotas = setup(make_quota("a-roomy", memory="800Gi"), make_quota("b-tight", memory="40Gi"))
    decision = await reservations.admit({q: GPU for q in quotas}, uid="u1", claim="team-a/c1")
    assert not decision.allowed and 'exceeded DeviceQuota "b-tight"' in decision.message
    assert decision.denied_by == ("b-tight",)
    assert api.objects["a-roomy"]["status"]["reservations"] == {}
    assert api.objects["b-tight"]["status"] == {}  # denied: nothing to write


async def test_a_denied_attempt_takes_back_only_its_own_reserve_of_an_allocations_excess() -> None:
    """Two attempts at claim u's allocation on one copy share one entry (`quota.accounting.excess`).
    The first to reserve on "a" is refused by "b", but only after the second reserved on
    "a" over it (the same 61Gi, at the same clock) and was allowed on "b": its rollback
    finds the entry rewritten and leaves it. Restoring what the key held before its own
    reserve (nothing) would drop the allowed attempt's 61Gi, which may land."""
    api, reservations, (a, b) = setup(make_quota("a", memory="400Gi"), make_quota("b", memory="100Gi"))
    key, excess = allocation_key("u", 40), Charge(61 * GiB, 0)
    refused, allowed = await asyncio.gather(
        reservations.admit({a: excess, b: Charge(200 * GiB, 0)}, uid=key, claim="team-a/u"),
        reservations.admit({a: excess, b: excess}, uid=key, claim="team-a/u"))
    assert (refused.allowed, refused.denied_by, allowed.allowed) == (False, ("b",), True)
    assert api.objects["a"]["status"]["reservations"][key]["memory"] == "61Gi"
    assert api.objects["b"]["status"]["reservations"][key]["memory"] == "61Gi"


async def test_a_delete_releases_the_entry_and_the_quota_going_away_holds_nothing() -> None:
    api, reservations, (quota,) = setup(make_quota("gpus", memory="80Gi"))
    assert (await reservations.admit({quota: GPU}, uid="u1", claim="team-a/c1")).allowed
    await reservations.release(NS, "u1")
    assert api.objects["gpus"]["status"]["reservations"] == {}
    del api.objects["gpus"]
    reservations.drop(NS, "gpus")
    assert (await reservations.admit({quota: GPU}, uid="u2", claim="team-a/c2")).allowed


async def test_an_audit_quota_admits_over_hard_and_says_which() -> None:
    api, reservations, quotas = setup(make_quota("audit", memory="40Gi", enforcement="Audit"),
                                      make_quota("roomy", memory="800Gi"))
    decision = await reservations.admit({q: GPU for q in quotas}, uid="u1", claim="team-a/c1")
    assert (decision.allowed, decision.charged, decision.warned_by) == (True, ("audit", "roomy"), ("audit",))
    assert sorted(api.objects["audit"]["status"]["reservations"]) == ["u1"]  # reserved all the same
def scheduler_attempt(uid: str, name: str) -> dict[str, Any]:
    """The scheduler's claim for Pod `train`'s extended resources, as validation sees it."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {
        "name": name, "uid": uid, "namespace": "team-a", "generateName": "train-extended-resources-",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train", "uid": "p1", "controller": True}],
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0",
                                           "exactly": {"deviceClassName": "gpu", "count": 1}}]}}}


async def test_the_schedulers_retries_replace_each_others_unpersisted_reservations() -> None:
    """Each attempt refused after us (the in-tree ResourceQuota) leaves an entry; the
    scheduler's next attempt for the same Pod replaces it, a tenant's look-alike does not."""
    api, reservations, _ = setup(make_quota("gpus", devices=2))
    ctx = ClaimContext(Admitter(Pricer(inventory(), CLASSES), reservations.ledger), {"team-a": {}}.get,
                       lambda: POLICY, reservations)
    scheduler = {"username": "system:kube-scheduler", "uid": "s", "groups": ["system:authenticated"]}
    tenant = {"username": "alice", "uid": "a", "groups": ["system:authenticated"]}

    async def create(uid: str, user: dict[str, Any]) -> bool:
        obj = scheduler_attempt(uid, f"train-extended-resources-{uid}")
        return (await create_claim(ctx, review_request(obj, user=user, name=obj["metadata"]["name"]))).allowed

    for uid in ("aaaa1", "aaaa2", "aaaa3", "aaaa4"):
        assert await create(uid, scheduler)
        assert list(api.objects["gpus"]["status"]["reservations"]) == [uid]
    # The same marks from anyone else are a plain claim: they add up to `hard`.
    assert await create("bbbb1", tenant)
    assert not await create("bbbb2", tenant)
    assert sorted(api.objects["gpus"]["status"]["reservations"]) == ["aaaa4", "bbbb1"]


async def test_a_review_cancelled_while_its_write_is_in_flight_leaves_no_entry() -> None:
    """The review's deadline (webhook.server) cancels it after its batch sent the write:
    the claim is answered denied and never created, so the entry must not stay behind."""
    api = GatedApi(make_quota("gpus", memory="400Gi"))
    ledger = Ledger()
    quota = parse_device_quota(make_quota("gpus", memory="400Gi"))
    ledger.add_or_update_quota(quota)
    reservations = Reservations(api, ledger, ttl=120.0, clock=lambda: 1_000.0)  # type: ignore[arg-type]
    review = asyncio.create_task(reservations.admit({quota: GPU}, uid="late", claim="team-a/late"))
    await api.in_flight.wait()
    review.cancel()
    with pytest.raises(asyncio.CancelledError):
        await review
    api.gate.set()
    while reservations._tasks:  # the batch's write, then the release queued behind it
        await asyncio.gather(*list(reservations._tasks))
    assert api.objects["gpus"]["status"]["reservations"] == {} and api.writes == 2


async def test_a_review_cancelled_while_its_allocations_excess_is_in_flight_leaves_the_entry_its_key_shares() -> None:
    """The same, for an allocation's excess: its entry may hold another attempt's excess on
    the same copy (`quota.accounting.excess`), allowed already, and what the cancelled write made of
    it is unknown. It is left to settle or expire, never released whole."""
    api = GatedApi(make_quota("gpus", memory="400Gi"))
    ledger = Ledger()
    quota = parse_device_quota(make_quota("gpus", memory="400Gi"))
    ledger.add_or_update_quota(quota)
    reservations = Reservations(api, ledger, ttl=120.0, clock=lambda: 1_000.0)  # type: ignore[arg-type]
    key, excess = allocation_key("u", 40), Charge(61 * GiB, 0)
    api.gate.set()
    assert (await reservations.admit({quota: excess}, uid=key, claim="team-a/u")).allowed
    api.gate.clear()
    api.in_flight.clear()
    review = asyncio.create_task(reservations.admit({quota: excess}, uid=key, claim="team-a/u"))
    await api.in_flight.wait()
    review.cancel()
    with pytest.raises(asyncio.CancelledError):
        await review
    api.gate.set()
    while reservations._tasks:
        await asyncio.gather(*list(reservations._tasks))
    assert api.objects["gpus"]["status"]["reservations"][key]["memory"] == "61Gi"


async def test_a_team_quota_is_written_cluster_scoped_first_and_released_when_its_namespace_denies() -> None:
    # "a-team" sorts before "b-gpus" by name either way: the order is by key, teams first.
    api, reservations, (gpus, team) = setup(make_quota("b-gpus", memory="80Gi"),
                                            make_cluster_quota("a-team", team="ml", memory="800Gi"))
    assert (await reservations.admit({gpus: GPU, team: GPU}, uid="u1", claim="team-a/c1")).allowed
    assert api.written == [("clusterdevicequotas", None, "a-team"), ("devicequotas", "team-a", "b-gpus")]
    denied = await reservations.admit({gpus: GPU, team: GPU}, uid="u2", claim="team-a/c2")
    assert not denied.allowed and denied.denied_by == ("b-gpus",)
    # The team's reservation of the denied claim was released: all or nothing.
    assert list(api.objects["a-team"]["status"]["reservations"]) == ["u1"]
    await reservations.release(NS, "u1")  # a release reaches the team quota too
    assert api.objects["a-team"]["status"]["reservations"] == {}


async def test_a_full_team_denies_naming_itself() -> None:
    api, reservations, (team,) = setup(make_cluster_quota("ml", memory="80Gi"))
    assert (await reservations.admit({team: GPU}, uid="u1", claim="team-a/c1")).allowed
    denied = await reservations.admit({team: GPU}, uid="u2", claim="team-b/c2")
    assert denied.message.startswith('exceeded ClusterDeviceQuota "ml": requested memory=80Gi')
    assert denied.denied_by == ("ClusterDeviceQuota/ml",)


async def test_a_replica_whose_namespace_watch_lags_a_relabel_waits_for_it_before_deciding_on_the_team() -> None:
    # Replica A has seen team-b join the team (Namespace resourceVersion 100) and admits u1
    # there; replica B's Namespace watch is at 90, so its ledger does not count team-b's
    # claims in the team. Deciding at once, B would read u1's entry as counted (its claim
    # cache holds the claim) and admit two more GPUs into a team of two.
    team_b = Namespace("team-b")
    api = FakeApi(make_cluster_quota("ml", team="ml", memory="160Gi"))
    team = parse_cluster_device_quota(make_cluster_quota("ml", team="ml", memory="160Gi"))
    ledgers = Ledger(), Ledger()
    for led, b_labels in zip(ledgers, ({"team.draquota.io/name": "ml"}, {})):
        led.set_namespace(NS, {"team.draquota.io/name": "ml"})
        led.set_namespace(team_b, b_labels)
        led.add_or_update_quota(team)
    a = Reservations(api, ledgers[0], ttl=60.0, clock=lambda: 1_000.0, namespaces_seen=lambda: 100)  # type: ignore[arg-type]
    assert (await a.admit({team: GPU}, uid="u1", claim="team-b/c1")).allowed
    assert api.objects["ml"]["status"]["namespacesThrough"] == "100"
    # u1's claim reaches both claim caches (and ledgers); B still has team-b outside the team.
    for led in ledgers:
        led.add_or_update_claim(team_entry("u1", team_b))
    progress = Progress()
    progress.advance("90")
    b = Reservations(api, ledgers[1], ttl=60.0, clock=lambda: 1_000.0,  # type: ignore[arg-type]
                     claim_version=lambda uid: 5 if uid == "u1" else None, namespace_progress=progress,
                     namespaces_seen=lambda: progress.version, catch_up=600.0)
    burst = asyncio.gather(*(b.admit({team: GPU}, uid=u, claim=f"team-a/{u}") for u in ("u2", "u3")))
    for _ in range(10):  # as far as it can go without the Namespace event (task switches only)
        await asyncio.sleep(0)
    ledgers[1].set_namespace(team_b, {"team.draquota.io/name": "ml"})  # the relabel reaches B
    progress.advance("100")
    assert sorted(d.allowed for d in await burst) == [False, True]


def team_entry(ref: str, namespace: Namespace) -> Entry:
    pricing = Pricing((PricedRequest("r", 1, GPU, ((DeviceClassName("gpu"), GPU),)),))
    return Entry(namespace, ClaimRef(ref), {"conservative": pricing}, False)


async def test_a_replica_deciding_on_a_team_object_newer_than_its_quota_watch_refuses_until_it_counted_it() -> None:
    # The team's selector grew to team-b (80Gi of claims there) on the API server; this
    # replica read the new object after a conflict, but its ledger still counts the old
    # selector: deciding on it would admit two GPUs into a team with room for one.
    team_b = Namespace("team-b")
    old = make_cluster_quota("ml", selector={"matchLabels": {"team.draquota.io/name": "ml"}}, memory="160Gi")
    new = make_cluster_quota("ml", selector={"matchExpressions": [
        {"key": "team.draquota.io/name", "operator": "In", "values": ["ml", "ml2"]}]}, memory="160Gi")
    api = FakeApi(new)
    ledger = Ledger()
    ledger.set_namespace(NS, {"team.draquota.io/name": "ml"})
    ledger.set_namespace(team_b, {"team.draquota.io/name": "ml2"})
    ledger.add_or_update_quota(parse_cluster_device_quota(old))
    ledger.add_or_update_claim(team_entry("b1", team_b))
    reservations = Reservations(api, ledger, ttl=60.0, clock=lambda: 1_000.0)  # type: ignore[arg-type]
    team = parse_cluster_device_quota(new)
    burst = [reservations.admit({team: GPU}, uid=u, claim=f"team-a/{u}") for u in ("u1", "u2")]
    refused = await asyncio.gather(*burst)
    assert [d.allowed for d in refused] == [False, False]
    assert "has not counted its newest spec" in refused[0].message
    ledger.add_or_update_quota(team)  # the quota watch brings it
    decisions = await asyncio.gather(*(reservations.admit({team: GPU}, uid=u, claim=f"team-a/{u}")
                                       for u in ("u1", "u2")))
    assert sorted(d.allowed for d in decisions) == [False, True]


# -- leases (quota.accounting.headroom, kube.leasebook) ------------------------------------------------------


def leased(*quotas: dict[str, Any], now: list[float]) -> tuple[FakeApi, Reservations, list[DeviceQuota]]:
    api, plain, parsed = setup(*quotas)
    reservations = Reservations(api, plain.ledger, ttl=60.0, clock=lambda: now[0],  # type: ignore[arg-type]
                                leases=LeaseBook(Sizing(period=5.0), holder="serve-a"))
    return api, reservations, parsed


async def test_far_from_hard_one_write_grants_a_lease_that_admits_many_claims_with_none() -> None:
    now = [1_000.0]
    api, reservations, (quota,) = leased(make_quota("gpus", memory="8000Gi"), now=now)  # 100 GPUs
    first = await reservations.admit({quota: GPU}, uid="u0", claim="team-a/c0")
    assert first.allowed and api.writes == 1
    entry = api.objects["gpus"]["status"]["reservations"]["lease.serve-a.0"]
    # A quarter of the 99 GPUs left, in whole GPUs (24), expiring a period and a TTL on.
    assert (entry["source"], entry["claim"], entry["expires"]) == ("Lease", "serve-a", "1970-01-01T00:17:45.000Z")
    stats = reservations.leases.stats  # what the metrics read (webhook.metrics)
    assert stats.writes["granted"] == 1 and reservations.leases.room() == Charge(24 * 80 * GiB, 0)
    decisions = [await reservations.admit({quota: GPU}, uid=f"u{i}", claim=f"team-a/c{i}") for i in range(1, 25)]
    assert all(d.allowed and d.charged == ("gpus",) for d in decisions) and api.writes == 1
    assert stats.admitted == {"lease": 24, "exact": 1}
    # The 25th does not fit the lease: its exact write renews the lease (settles nothing,
    # as no claim was seen) and it is admitted with an entry of its own.
    assert (await reservations.admit({quota: GPU}, uid="u25", claim="team-a/c25")).allowed and api.writes == 2
    assert "u25" in api.objects["gpus"]["status"]["reservations"]
    assert stats.admitted == {"lease": 24, "exact": 2} and (stats.writes["granted"], stats.writes["renewed"]) == (1, 1)
    # dryRun reserves nothing, under a lease or not, and counts nothing.
    book = reservations.leases.leases[(NS, "gpus")]
    assert (await reservations.admit({quota: GPU}, uid="dry", claim="team-a/dry", dry_run=True)).allowed
    assert reservations.leases.leases[(NS, "gpus")] == book and api.writes == 2
    assert stats.admitted == {"lease": 24, "exact": 2}
    # Past its window nothing is admitted under it: the exact path decides.
    now[0] += 10.0
    assert (await reservations.admit({quota: GPU}, uid="late", claim="team-a/late")).allowed and api.writes == 3
    assert "late" in api.objects["gpus"]["status"]["reservations"]
    await reservations.close()



async def test_near_hard_every_admission_is_exact_and_stops_at_hard() -> None:
    api, reservations, (quota,) = leased(make_quota("gpus", memory="400Gi"), now=[1_000.0])  # 5 GPUs
    decisions = [await reservations.admit({quota: GPU}, uid=f"u{i}", claim=f"team-a/c{i}") for i in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    # A quarter of the four GPUs left is less than two: no lease, every admission exact.
    assert not any(uid.startswith("lease.") for uid in api.objects["gpus"]["status"]["reservations"])
    await reservations.close()


async def test_a_claim_refused_by_another_quota_gives_its_lease_room_back() -> None:
    api, reservations, (roomy, tight) = leased(make_quota("gpus", memory="8000Gi"),
                                               make_quota("small", memory="80Gi"), now=[1_000.0])
    assert (await reservations.admit({roomy: GPU}, uid="u0", claim="team-a/c0")).allowed
    assert (await reservations.admit({roomy: GPU, tight: GPU}, uid="u1", claim="team-a/c1")).allowed
    denied = await reservations.admit({roomy: GPU, tight: GPU}, uid="u2", claim="team-a/c2")
    assert not denied.allowed and denied.denied_by == ("small",)
    assert set(reservations.leases.leases[(NS, "gpus")].admitted) == {"u1"}
    await reservations.close()



async def test_a_write_whose_outcome_is_unknown_retires_the_lease() -> None:
    now = [1_000.0]
    api, reservations, (quota,) = leased(make_quota("gpus", memory="8000Gi"), now=now)
    assert (await reservations.admit({quota: GPU}, uid="u0", claim="team-a/c0")).allowed
    failing = api.update_status

    async def timeout(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise TimeoutError("the API server did not answer")

    api.update_status = timeout  # type: ignore[method-assign]
    now[0] += 10.0  # past the window: the next admission writes, and that write times out
    assert not (await reservations.admit({quota: GPU}, uid="u1", claim="team-a/c1")).allowed
    assert (NS, "gpus") not in reservations.leases.leases and reservations.leases.room().is_zero()
    assert reservations.leases.stats.writes["uncertain"] == 1
    api.update_status = failing  # type: ignore[method-assign]
    assert (await reservations.admit({quota: GPU}, uid="u2", claim="team-a/c2")).allowed
    # A new key: the old entry is left to expire, never guessed at.
    assert {"lease.serve-a.0", "lease.serve-a.1"} <= set(api.objects["gpus"]["status"]["reservations"])
    await reservations.close()


async def test_at_shutdown_a_lease_shrinks_to_what_it_admitted() -> None:
    api, reservations, (quota,) = leased(make_quota("gpus", memory="8000Gi"), now=[1_000.0])
    for i in range(3):
        assert (await reservations.admit({quota: GPU}, uid=f"u{i}", claim=f"team-a/c{i}")).allowed
    assert api.objects["gpus"]["status"]["reservations"]["lease.serve-a.0"]["memory"] == "1920Gi"
    await reservations.close()
    # u1 and u2, admitted under it and not seen yet, stay covered; the idle 22 GPUs go.
    assert api.objects["gpus"]["status"]["reservations"]["lease.serve-a.0"]["memory"] == "160Gi"
    assert reservations.leases.stats.writes["shrunk"] == 1 and reservations.leases.room().memory == 160 * GiB
    assert not reservations.leases.tending


async def test_a_watch_event_older_than_our_own_write_does_not_replace_it() -> None:
    api, reservations, (quota,) = leased(make_quota("gpus", memory="8000Gi"), now=[1_000.0])
    before = {**api.objects["gpus"], "metadata": dict(api.objects["gpus"]["metadata"])}
    assert (await reservations.admit({quota: GPU}, uid="u0", claim="team-a/c0")).allowed
    reservations.observe(before)  # the watch delivers the object as it was before the grant
    newest = reservations.newest("team-a", "gpus")
    assert newest is not None and "lease.serve-a.0" in newest["status"]["reservations"]
    await reservations.close()


async def test_a_quota_deleted_and_created_again_admits_nothing_under_the_old_objects_lease() -> None:
    # The new object holds no lease: the other replicas count none. The holder's book must
    # not admit against it (its window has seconds to run), or both give the room away.
    now = [1_000.0]
    spec = make_quota("gpus", memory="8000Gi")  # 100 GPUs
    api, holder, (quota,) = leased(spec, now=now)
    assert (await holder.admit({quota: GPU}, uid="u0", claim="team-a/c0")).allowed
    assert "lease.serve-a.0" in api.objects["gpus"]["status"]["reservations"]
    # `kubectl replace --force`: the quota goes and comes back with the same spec.
    api.objects["gpus"] = {**spec, "metadata": {**spec["metadata"], "uid": "new", "resourceVersion": "50"},
                           "status": {}}
    holder.drop("team-a", "gpus")  # the holder's quota watch: DELETED, then ADDED
    holder.observe(api.objects["gpus"])
    other = Reservations(api, Ledger(), ttl=60.0, clock=lambda: now[0])  # type: ignore[arg-type]
    other.ledger.add_or_update_quota(quota)
    assert (await other.admit({quota: Charge(8000 * GiB, 100)}, uid="big", claim="team-a/big")).allowed
    # Hard is taken whole by the new object's one entry: nothing more fits.
    assert not (await holder.admit({quota: GPU}, uid="u1", claim="team-a/c1")).allowed
    await holder.close()


async def test_a_relist_bringing_another_object_of_the_quotas_name_retires_the_lease() -> None:
    now = [1_000.0]
    spec = make_quota("gpus", memory="8000Gi")  # 100 GPUs
    api, holder, (quota,) = leased(spec, now=now)
    api.objects["gpus"]["metadata"]["uid"] = "old"
    assert (await holder.admit({quota: GPU}, uid="u0", claim="team-a/c0")).allowed
    assert (await holder.admit({quota: GPU}, uid="u1", claim="team-a/c1")).allowed and api.writes == 1
    # The watch expired across the delete: the relist brings the new object, no DELETED.
    api.objects["gpus"] = {**spec, "metadata": {**spec["metadata"], "uid": "new", "resourceVersion": "50"},
                           "status": {}}
    holder.observe(api.objects["gpus"])
    assert (NS, "gpus") not in holder.leases.leases
    assert (await holder.admit({quota: GPU}, uid="u2", claim="team-a/c2")).allowed and api.writes == 2
    assert "u2" in api.objects["gpus"]["status"]["reservations"]
    await holder.close()


async def test_one_replica_never_counts_its_own_leases_idle_room_against_a_claim_that_fits() -> None:
    # 100 GPUs, one taken; the holder's lease holds 24 more, none of them used. A claim of
    # 80 fits (81 of 100): the write that admits it gives the lease's idle room back.
    api, reservations, (quota,) = leased(make_quota("gpus", memory="8000Gi"), now=[1_000.0])
    assert (await reservations.admit({quota: GPU}, uid="u0", claim="team-a/c0")).allowed
    big = await reservations.admit({quota: Charge(80 * 80 * GiB, 80)}, uid="big", claim="team-a/big")
    assert big.allowed, big.message
    status = api.objects["gpus"]["status"]["reservations"]
    assert sorted(status) == ["big", "u0"]  # the lease, idle, is gone: 81 of 100 leaves none
    assert reservations.leases.stats.writes["released"] == 1 and reservations.leases.room().is_zero()
    await reservations.close()


async def test_a_crd_that_refuses_lease_entries_turns_leases_off_and_admits_with_single_entries() -> None:
    # The DeviceQuota CRD of the release before leases (its upgrade forgotten: Helm never
    # upgrades a chart's crds/) refuses the `Lease` source as the real API server does.
    api, reservations, (quota,) = leased(make_quota("gpus", memory="8000Gi"), now=[1_000.0])
    writing = api.update_status

    async def old_schema(resource: Resource, body: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        for key, entry in (body["status"].get("reservations") or {}).items():
            if entry.get("source") == "Lease":
                raise ApiError(422, "Invalid", f'DeviceQuota.draquota.io "gpus" is invalid: status.reservations.{key}.'
                                               'source: Unsupported value: "Lease": supported values: "Claim", "Workload"')
        return await writing(resource, body, namespace=namespace)

    api.update_status = old_schema  # type: ignore[method-assign]
    decisions = [await reservations.admit({quota: GPU}, uid=f"u{i}", claim=f"team-a/c{i}") for i in range(3)]
    assert all(d.allowed for d in decisions), decisions
    held = api.objects["gpus"]["status"]["reservations"]
    assert set(held) == {"u0", "u1", "u2"} and api.writes == 3  # one entry each, no lease
    assert not reservations.leases.leasable(quota)
    stats = reservations.leases.stats  # one refused lease write, then the exact path
    assert stats.writes["refused"] == 1 and stats.admitted == {"lease": 0, "exact": 3}
    # Past the pause the next admission tries a lease again (the CRD may be applied by then).
    reservations.leases.refused_until = 0.0
    api.update_status = writing  # type: ignore[method-assign]
    assert (await reservations.admit({quota: GPU}, uid="u3", claim="team-a/c3")).allowed
    assert any(k.startswith("lease.") for k in api.objects["gpus"]["status"]["reservations"])
    await reservations.close()
