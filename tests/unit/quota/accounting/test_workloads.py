"""quota.accounting.workloads and the ledger's Workload holdings: parsing, when a Workload holds,
its price (count x the claims its templates stamp), and its Pods' claims drawing on it."""

from __future__ import annotations

from typing import Any

import pytest

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.accounting.workloads import (
    MAX_POD_CLAIMS,
    WORKLOAD_LABEL,
    WorkloadError,
    charge_message,
    entry_patch,
    holds,
    needs_decision,
    our_checks,
    parse_workload,
    too_many_claims,
)
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_cluster_device_quota, parse_device_quota
from quota.quotas.scope import Scope
from quota.values.model import Charge, DeviceClassName, Namespace

from ...bounds import bounded
from ...builders import (
    GiB,
    exactly,
    make_class,
    make_claim,
    make_cluster_quota,
    make_device,
    make_quota,
    make_slice,
    request,
)

NS = Namespace("team-a")
OURS = frozenset({"dq"})
D = "gpu.example.com"


def workload(*, checks: list[dict[str, Any]] | None = None, conditions: dict[str, str] | None = None,
             pod_sets: list[dict[str, Any]] | None = None, active: bool | None = None, uid: str = "w-1") -> dict[str, Any]:
    spec: dict[str, Any] = {"podSets": pod_sets if pod_sets is not None else [pod_set("main", 1, ["gpus"])]}
    if active is not None:
        spec["active"] = active
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "job-a", "namespace": "team-a", "uid": uid},
        "spec": spec,
        "status": {"admissionChecks": checks or [],
                   "conditions": [{"type": t, "status": s} for t, s in (conditions or {}).items()]},
    }


def pod_set(name: str, count: int, templates: list[str], claims: tuple[str, ...] = ()) -> dict[str, Any]:
    refs: list[dict[str, Any]] = [{"name": f"t{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    refs += [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    return {"name": name, "count": count, "template": {"spec": {"resourceClaims": refs, "containers": []}}}


def state(name: str, value: str, stamp: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"name": name, "state": value, "lastTransitionTime": stamp, "message": ""}


def test_a_workload_is_parsed_with_its_templates_direct_claims_and_checks() -> None:
    w = parse_workload(workload(pod_sets=[pod_set("a", 3, ["gpus", "nics"], ("shared",))],
                                checks=[state("dq", "Pending"), state("other", "Ready")],
                                conditions={"QuotaReserved": "True"}))
    assert [(p.name, p.count, p.templates, p.claims) for p in w.pod_sets] == [("a", 3, ("gpus", "nics"), ("shared",))]
    assert [(c.name, c.state) for c in w.checks] == [("dq", "Pending"), ("other", "Ready")]
    assert w.quota_reserved and not w.finished and not w.evicted and w.active


@pytest.mark.parametrize("bad", [-1, "2", True, None])
def test_a_bad_count_is_refused_with_the_field(bad: Any) -> None:
    with pytest.raises(WorkloadError, match=r"spec.podSets\[0\].count"):
        parse_workload(workload(pod_sets=[{**pod_set("a", 1, []), "count": bad}]))


def test_only_checks_of_our_controller_are_ours() -> None:
    assert our_checks({"dq": "draquota.io/devicequota", "prov": "kueue.x-k8s.io/provisioning-request"}) == {"dq"}


@pytest.mark.parametrize(("conditions", "active", "check", "expected"), [
    ({"QuotaReserved": "True", "Admitted": "True"}, None, "Ready", True),
    ({"QuotaReserved": "True"}, None, "Pending", False),
    ({"QuotaReserved": "True", "Finished": "True"}, None, "Ready", False),  # released on finish
    ({"QuotaReserved": "True", "Evicted": "True"}, None, "Ready", False),  # and on eviction
    ({"QuotaReserved": "True"}, False, "Ready", False),  # and on deactivation
])
def test_a_workload_holds_while_our_check_is_ready_and_it_runs(conditions: dict[str, str], active: bool | None,
                                                                check: str, expected: bool) -> None:
    w = parse_workload(workload(checks=[state("dq", check)], conditions=conditions, active=active))
    assert holds(w, OURS) is expected


def test_the_leader_decides_only_pending_checks_of_workloads_with_quota_reserved() -> None:
    pending = workload(checks=[state("dq", "Pending"), state("other", "Pending")], conditions={"QuotaReserved": "True"})
    assert needs_decision(parse_workload(pending), OURS) == ("dq",)
    no_quota = workload(checks=[state("dq", "Pending")])
    assert needs_decision(parse_workload(no_quota), OURS) == ()
    retry = workload(checks=[state("dq", "Retry")], conditions={"QuotaReserved": "True"})
    assert needs_decision(parse_workload(retry), OURS) == ()  # Kueue resets it to Pending first


def test_our_entry_keeps_its_transition_time_unless_the_state_changes_and_labels_the_pods() -> None:
    w = parse_workload(workload(checks=[state("dq", "Retry", "2026-01-01T00:00:00Z")]))
    again = entry_patch(w, "dq", "Retry", "still full", now=1_800_000_000, requeue_after=15)
    entry = again["status"]["admissionChecks"][0]
    assert entry["lastTransitionTime"] == "2026-01-01T00:00:00Z" and entry["requeueAfterSeconds"] == 15
    assert "podSetUpdates" not in entry
    admitted = entry_patch(w, "dq", "Ready", "holds", now=1_800_000_000)["status"]["admissionChecks"][0]
    assert admitted["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    assert admitted["podSetUpdates"] == [{"name": "main", "labels": {WORKLOAD_LABEL: "w-1"}}]
    assert "requeueAfterSeconds" not in admitted


def test_the_charge_message_names_each_quota_and_what_it_limits() -> None:
    quota = parse_device_quota(make_quota("gpus", memory="160Gi"))
    assert charge_message({quota: Charge(160 * GiB, 2)}) == 'holds DeviceQuota "gpus": memory=160Gi'


# -- pricing and holdings -----------------------------------------------------------------------


def admitter() -> Admitter:
    inventory = Inventory()
    inventory.add_or_update_slice(make_slice("s", [make_device(f"gpu-{i}", memory="80Gi") for i in range(4)], driver=D))
    classes = {DeviceClassName("gpu"): parse_device_class(make_class("gpu", "device.attributes['gpu.example.com'].type == 'gpu'"))}
    adm = Admitter(Pricer(inventory, classes), Ledger())
    adm.ledger.add_or_update_quota(parse_device_quota(make_quota("gpus", memory="160Gi")))
    return adm


def template(count: int) -> Any:
    return parse_claim(make_claim("gpus", request("gpu", exactly("gpu", count=count)), kind="ResourceClaimTemplate"))


def claim(name: str, count: int, owner: str) -> Entry:
    obj = make_claim(name, request("gpu", exactly("gpu", count=count)))
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner,
                                           "controller": True}]
    parsed = parse_claim(obj)
    assert parsed.owner == owner
    return Entry(NS, ClaimRef(parsed.uid), {"conservative": Pricer.estimate(ADM.pricer, parsed.spec)}, False,
                 owner=parsed.owner)


ADM = admitter()


def test_a_workload_is_priced_count_times_its_templates_claims() -> None:
    adm = admitter()
    entry = adm.workload_entry(NS, ClaimRef("w-1"), [(template(1), 3)])
    assert isinstance(entry, Entry)
    quota = adm.ledger.quotas(NS)[0]
    assert adm.workload_charges(entry) == {quota: Charge(240 * GiB, 3)}



def test_a_workload_is_priced_against_the_teams_selecting_its_namespace_too() -> None:
    """controllers.kueue reserves `workload_charges` (quota.accounting.ledger.Ledger.quotas): a team's
    quota holds a Workload as it holds a claim, and the message names it by kind."""
    adm = admitter()
    adm.ledger.set_namespace(NS, {"team.draquota.io/name": "ml"})
    adm.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("ml", memory="1Ti")))
    entry = adm.workload_entry(NS, ClaimRef("w-1"), [(template(1), 2)])
    assert isinstance(entry, Entry)
    charges = adm.workload_charges(entry)
    assert sorted((q.kind, q.name, c) for q, c in charges.items()) == [
        ("ClusterDeviceQuota", "ml", Charge(160 * GiB, 2)), ("DeviceQuota", "gpus", Charge(160 * GiB, 2))]
    assert 'ClusterDeviceQuota "ml": memory=160Gi' in charge_message(charges)
    adm.ledger.set_holding(entry)
    assert adm.ledger.usage(Namespace(""), "ml").workloads == Charge(160 * GiB, 2)


MAX_COUNT = 2**31 - 1


@pytest.mark.parametrize("count", [10**7, MAX_COUNT])
def test_a_huge_job_is_priced_arithmetically_in_bounded_memory_and_refused(count: int) -> None:
    """`requests * count` would build a list of `count` requests (190 MB at 10^7, a
    MemoryError at 2^31-1 that kills the leader). The price is count x the template's
    charge, exact, in kilobytes; past int64 it is refused with the reason."""
    adm = admitter()
    quota = adm.ledger.quotas(NS)[0]
    with bounded(seconds=10, megabytes=16):
        entry = adm.workload_entry(NS, ClaimRef("w-1"), [(template(1), count)])
        if count * 80 * GiB > 2**63 - 1:
            assert isinstance(entry, str) and "past what a quota can count (2^63-1)" in entry
            return
        assert isinstance(entry, Entry)
        assert adm.workload_charges(entry) == {quota: Charge(count * 80 * GiB, count)}
        decision = adm.ledger.admit(entry, dry_run=True)
    assert not decision.allowed and 'exceeded DeviceQuota "gpus"' in decision.message


def test_a_multiplied_first_available_request_keeps_each_scopes_charge() -> None:
    """count x (max or min per dimension over the alternatives) is the max or min of the
    alternatives times count: a quota scoped to one class sees exactly count copies."""
    adm = admitter()
    classes = dict(adm.pricer.classes)
    classes[DeviceClassName("other")] = parse_device_class(make_class("other", "true"))
    adm = Admitter(Pricer(adm.pricer.inventory, classes), adm.ledger)
    either = parse_claim(make_claim("either", {"name": "r", "firstAvailable": [
        {"name": "two", "deviceClassName": "gpu", "count": 2}, {"name": "one", "deviceClassName": "other"}]},
        kind="ResourceClaimTemplate"))
    single = adm.workload_entry(NS, ClaimRef("w-1"), [(either, 1)])
    many = adm.workload_entry(NS, ClaimRef("w-1"), [(either, 7)])
    assert isinstance(single, Entry) and isinstance(many, Entry)
    for scope in (Scope(), Scope(frozenset({DeviceClassName("gpu")})), Scope(frozenset({DeviceClassName("other")}))):
        one = single.pricing["conservative"].charge_for(scope)
        assert many.pricing["conservative"].charge_for(scope) == Charge(one.memory * 7, one.devices * 7)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("count", MAX_COUNT + 1, r"spec.podSets\[0\].count must be an integer from 0 to 2147483647"),
    ("podSets", 9, "spec.podSets must be a list of at most 8"),
])
def test_sizes_from_the_workload_are_bounded(field: str, value: int, message: str) -> None:
    if field == "count":
        obj = workload(pod_sets=[pod_set("a", value, ["gpus"])])
    else:
        obj = workload(pod_sets=[pod_set(f"p{i}", 1, ["gpus"]) for i in range(value)])
    with pytest.raises(WorkloadError, match=message):
        parse_workload(obj)


def test_a_pod_naming_too_many_claims_is_not_priced_and_says_why() -> None:
    w = parse_workload(workload(pod_sets=[pod_set("a", 1, [f"t{i}" for i in range(MAX_POD_CLAIMS + 1)])]))
    assert too_many_claims(w) == (f"PodSet a: its pod template names {MAX_POD_CLAIMS + 1} resource claims, "
                                  f"more than dra-quota prices for one Pod ({MAX_POD_CLAIMS})")
    assert too_many_claims(parse_workload(workload())) == ""


def test_an_unpriceable_template_is_the_reason_it_has_no_price() -> None:
    adm = admitter()
    bad = parse_claim(make_claim("odd", request("gpu", exactly("missing-class")), kind="ResourceClaimTemplate"))
    reason = adm.workload_entry(NS, ClaimRef("w-1"), [(bad, 1)])
    assert isinstance(reason, str) and reason.startswith("ResourceClaimTemplate odd: ")


def test_a_holding_counts_as_reserved_and_its_pods_claims_draw_on_it_never_twice() -> None:
    adm = admitter()
    ledger = adm.ledger
    quota = ledger.quotas(NS)[0]
    holding = adm.workload_entry(NS, ClaimRef("w-1"), [(template(1), 2)])
    assert isinstance(holding, Entry)
    ledger.set_holding(holding)
    assert ledger.usage(NS, "gpus").reserved == Charge(160 * GiB, 2)
    assert ledger.usage(NS, "gpus").workloads == Charge(160 * GiB, 2)
    assert ledger.counts(ClaimRef("w-1"))

    # A claim of a Pod of the Workload: adds nothing, so it is admitted into a full quota.
    ledger.set_pod("pod-1", ClaimRef("w-1"))
    first = claim("c1", 1, "pod-1")
    assert ledger.uncovered(first, quota) == Charge()
    assert ledger.admit(first).allowed
    assert ledger.usage(NS, "gpus").reserved == Charge(160 * GiB, 2)  # 80Gi the claim's + 80Gi still held
    assert ledger.usage(NS, "gpus").workloads == Charge(80 * GiB, 1)

    # A claim of another Pod with no Workload is checked on top and denied.
    stranger = claim("c2", 1, "pod-9")
    assert ledger.uncovered(stranger, quota) == Charge(80 * GiB, 1)
    assert not ledger.admit(stranger).allowed

    # More than the Workload's price: only the excess is new, and checked.
    ledger.set_pod("pod-2", ClaimRef("w-1"))
    greedy = claim("c3", 2, "pod-2")
    assert ledger.uncovered(greedy, quota) == Charge(80 * GiB, 1)
    assert not ledger.admit(greedy).allowed

    # The Workload finishes: only its claims count.
    ledger.drop_holding(ClaimRef("w-1"))
    assert ledger.usage(NS, "gpus").reserved == Charge(80 * GiB, 1)
    assert ledger.usage(NS, "gpus").workloads == Charge()
    assert not ledger.counts(ClaimRef("w-1"))


def test_what_a_claim_adds_to_usage_is_its_charge_less_what_its_workload_holds_for_it() -> None:
    """`Ledger.counted`: usage less it is usage without the claim (an allocation checked
    whole replaces the claim's own count by its charge: `quota.accounting.reservations.Request.own`)."""
    adm = admitter()
    ledger = adm.ledger
    quota = ledger.quotas(NS)[0]
    holding = adm.workload_entry(NS, ClaimRef("w-1"), [(template(1), 2)])
    assert isinstance(holding, Entry)
    ledger.set_holding(holding)
    ledger.set_pod("pod-1", ClaimRef("w-1"))
    covered, stranger = claim("c1", 1, "pod-1"), claim("c2", 1, "pod-9")
    for c in (covered, stranger):
        ledger.add_or_update_claim(c)
    total = ledger.usage(NS, "gpus")
    for c in (covered, stranger):
        used, reserved = ledger.counted(c.ref, quota)
        ledger.delete_claim(c.ref)
        without = ledger.usage(NS, "gpus")
        ledger.add_or_update_claim(c)
        assert (total.used - used, total.reserved - reserved) == (without.used, without.reserved), c.ref
    assert ledger.counted(covered.ref, quota) == (Charge(), Charge())  # its Workload holds it either way
    assert ledger.counted(stranger.ref, quota) == (Charge(), Charge(80 * GiB, 1))
    assert ledger.counted(ClaimRef("unknown"), quota) == (Charge(), Charge())


def test_a_pod_seen_after_its_claim_still_matches() -> None:
    adm = admitter()
    ledger = adm.ledger
    holding = adm.workload_entry(NS, ClaimRef("w-1"), [(template(2), 1)])
    assert isinstance(holding, Entry)
    ledger.set_holding(holding)
    ledger.add_or_update_claim(claim("c1", 2, "pod-1"))  # counted before the Pod is known
    assert ledger.usage(NS, "gpus").reserved == Charge(320 * GiB, 4)  # over-counted, never under
    # Each move returns the quotas whose usage it moved (the holding's namespace's).
    assert ledger.set_pod("pod-1", ClaimRef("w-1")) == ((NS, "gpus"),)
    assert ledger.usage(NS, "gpus").reserved == Charge(160 * GiB, 2)
    assert ledger.set_pod("pod-1", None) == ((NS, "gpus"),)  # the Pod is gone
    assert ledger.usage(NS, "gpus").reserved == Charge(320 * GiB, 4)
    assert ledger.set_pod("pod-2", ClaimRef("w-unknown")) == ()  # no holding: nothing counts it
