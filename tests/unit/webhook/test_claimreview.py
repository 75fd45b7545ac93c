"""webhook.claimreview: claim and template admission from realistic AdmissionReview requests.

A claim CREATE persists its reservation on the DeviceQuota's status (`kube.quotawriter`,
the one admission protocol), here through a scripted API server (`..kube.scripted`); a
`World` is one replica as `serve` wires it, whose claim cache counts a claim once the
watch delivers it (`World.created`).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube.admissionreview import AdmissionRequest, ReviewError, Verdict, parse_review, respond
from kube.claimstore import ClaimStore
from kube.quotawriter import Reservations
from kube.watching import Progress
from quota.accounting.ledger import Ledger
from quota.admission.admitter import ADMIN_ACCESS_MESSAGE, Admitter
from quota.admission.policy import CLAIM_CONTROLLER, PolicyRecord, parse_policy
from quota.objects.allocationrecord import (
    ALLOCATED_CHARGE_ANNOTATION,
    ALLOCATION_RESULTS_ANNOTATION,
    record_annotations,
)
from quota.objects.claims import parse_claim
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_cluster_device_quota, parse_device_quota
from quota.values.model import Charge, Namespace
from webhook.claimreview import (
    ClaimContext,
    allocate_claim,
    create_claim,
    create_template,
    update_claim,
    with_namespace,
)
from webhook.endpoints import endpoints

from ..bounds import bounded, fuzz_examples
from ..builders import GiB, MiB, advised, exactly, make_claim, make_cluster_quota, make_quota, request, result
from ..kube.scripted import FakeApi
from ..quota.objects.test_fuzz_parsers import paths, splice, values
from ..quota.pricing.test_pricer import CLASSES, inventory

NS = Namespace("team-a")
D = "gpu.example.com"
H100 = f"device.attributes['{D}'].model == 'h100'"  # 80Gi each, on node-1
H200 = f"device.attributes['{D}'].model == 'h200'"  # 141Gi each, on node-2
ALICE = {"username": "alice", "uid": "a1", "groups": ["team-a-devs", "system:authenticated"]}
ADMIN = {"username": "root-ops", "uid": "r1", "groups": ["gpu-admins", "system:authenticated"]}
CONTROLLER_USER = {"username": CLAIM_CONTROLLER, "uid": "c1",
                   "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}
ADMIN_LABELS = {"kubernetes.io/metadata.name": "team-a", "resource.kubernetes.io/admin-access": "true"}
POLICY = parse_policy({"groups": ["gpu-admins"]})
CLAIM_GVR = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}
TEMPLATE_GVR = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaimtemplates"}
# One pricer for the module: its caches are keyed on the inventory, which never changes here.
PRICER = Pricer(inventory(), CLASSES)
UID = "3c1f5e2a-9b7d-4e61-8f0a-5d2c6b4e7a10"
UID2 = "8e4b2d7c-1a6f-4c93-b5e0-7f3a9d1c2b64"


class World:
    """One replica as `serve` wires it: the ledger, the reservations persisted through a
    scripted API server, and the claim cache, which counts a claim once the watch
    delivers it and tells the reservations of its deletion."""

    def __init__(self, *quotas: dict[str, Any], labels: Mapping[str, str] | None = None,
                 allocation_check: str = "enforce", pricer: Pricer = PRICER) -> None:
        ledger = Ledger()
        for quota in quotas:
            ledger.add_or_update_quota(parse_device_quota(quota))
        admitter = Admitter(pricer, ledger)
        self.api = FakeApi(*quotas)
        self.progress = Progress()
        self.claims = ClaimStore(admitter)
        self.reservations = Reservations(self.api, ledger, ttl=60.0, progress=self.progress,  # type: ignore[arg-type]
                                         claim_version=self.claims.version,
                                         claim_recorded=self.claims.recorded_version)
        self.claims.deleted = self.reservations.claim_deleted
        self.reservations.claim_history_known = self.claims.history_known
        known = {"team-a": labels or {"kubernetes.io/metadata.name": "team-a"}}
        self.ctx = ClaimContext(admitter, known.get, lambda: POLICY, self.reservations,
                                allocation_check)  # type: ignore[arg-type]
        self._revision = 100

    def created(self, obj: dict[str, Any]) -> None:
        """The API server stored admitted claim `obj` and the claim watch delivered it
        (`obj` then carries the resourceVersion it was stored at)."""
        event = self._event(obj)
        obj["metadata"]["resourceVersion"] = event["metadata"]["resourceVersion"]
        self.claims.upsert(event)

    def deleted(self, obj: dict[str, Any]) -> None:
        """The claim watch delivered `obj`'s deletion."""
        self.claims.delete(self._event(obj))

    def _event(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._revision += 1
        out = copy.deepcopy(dict(with_namespace(obj, NS)))
        out["metadata"]["resourceVersion"] = str(self._revision)
        self.progress.advance(str(self._revision))
        return out


def context(*quotas: dict[str, Any], labels: Mapping[str, str] | None = None,
            allocation_check: str = "enforce") -> ClaimContext:
    return World(*quotas, labels=labels, allocation_check=allocation_check).ctx


def admit(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """A claim CREATE's verdict, its reservation persisted (`create_claim`)."""
    return asyncio.run(create_claim(ctx, request))


def allocate(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """A `resourceclaims/status` UPDATE's verdict, its excess persisted (`allocate_claim`)."""
    return asyncio.run(allocate_claim(ctx, request))


def stored(obj: dict[str, Any], *, uid: str | None = UID, name: str = "train-gpu-x7k2q") -> dict[str, Any]:
    """`obj` as the validating phase of a generateName CREATE sees it: generated name and uid."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    meta["generateName"] = "train-gpu-"
    meta["name"] = name
    if uid is not None:
        meta["uid"] = uid
    meta["creationTimestamp"] = "2026-11-23T18:30:00Z"
    meta["managedFields"] = [{"manager": "kubectl-create", "operation": "Update", "apiVersion": "resource.k8s.io/v1"}]
    return out


def review_request(obj: dict[str, Any] | None, *, operation: str = "CREATE", gvr: dict[str, str] = CLAIM_GVR,
                   sub: str = "", old: dict[str, Any] | None = None, user: dict[str, Any] = ALICE,
                   dry_run: bool = False, name: str = "train-gpu-x7k2q") -> AdmissionRequest:
    kind = (obj or old or {}).get("kind", "ResourceClaim")
    raw: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": gvr["group"], "version": "v1", "kind": kind},
        "resource": gvr,
        "requestKind": {"group": gvr["group"], "version": "v1", "kind": kind},
        "requestResource": gvr,
        "name": name,
        "namespace": "team-a",
        "operation": operation,
        "userInfo": user,
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"kind": f"{operation.title()}Options", "apiVersion": "meta.k8s.io/v1"},
    }
    if sub:
        raw["subResource"] = sub
        raw["requestSubResource"] = sub
    return parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": raw})


def gpu_claim(selector: str = H100, *, admin: bool = False, count: int | None = None,
              kind: str = "ResourceClaim") -> dict[str, Any]:
    obj = make_claim("ignored", request("gpu", exactly("gpu", selector, admin=admin, count=count)), kind=kind)
    del obj["metadata"]["name"]
    return obj


def reserved(ctx: ClaimContext, quota: str = "gpus") -> Charge:
    """What the replica counts as reserved: its cache's pending claims and the persisted
    entries of claims it does not hold yet."""
    return ctx.admitter.ledger.usage(NS, quota).reserved + ctx.reservations.pending(NS, quota)


GPUS = make_quota("gpus", memory="200Gi", devices=4)
DENIED_THIRD = advised('exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=0, reserved memory=160Gi, '
                       "limited memory=200Gi", "reserved")


def test_creates_reserve_until_the_quota_is_full() -> None:
    ctx = context(GPUS)
    for i, uid in enumerate((UID, UID2)):
        assert admit(ctx, review_request(stored(gpu_claim(), uid=uid, name=f"g-{i}"))) == Verdict(True)
    third = admit(ctx, review_request(stored(gpu_claim(), uid="third", name="g-2")))
    assert third == Verdict(False, DENIED_THIRD, cause="quota", quotas=("gpus",))
    assert reserved(ctx) == Charge(160 * GiB, 2)


def test_a_retried_uid_counts_once_and_a_reused_name_is_another_claim() -> None:
    world = World(GPUS)
    ctx = world.ctx
    assert admit(ctx, review_request(stored(gpu_claim()))).allowed
    assert admit(ctx, review_request(stored(gpu_claim()))).allowed  # the same call again
    assert reserved(ctx) == Charge(80 * GiB, 1)
    # The same name under a new uid (a collision re-ran admission, or a delete and re-create).
    assert admit(ctx, review_request(stored(gpu_claim(), uid=UID2))).allowed
    assert reserved(ctx) == Charge(160 * GiB, 2)
    # The watch's deletion of the first object releases only its own reservation.
    world.deleted(stored(gpu_claim()))
    assert reserved(ctx) == Charge(80 * GiB, 1)
    assert UID2 in world.api.objects["gpus"]["status"]["reservations"]


@pytest.mark.parametrize(
    ("quota", "dry_run", "expected", "reserved_after"),
    [
        (make_quota("gpus", memory="100Gi"), True, Verdict(True), Charge()),
        (make_quota("gpus", memory="50Gi"), True, Verdict(
            False, advised('exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=0, reserved memory=0, '
                           "limited memory=50Gi", "never"), cause="quota", quotas=("gpus",)), Charge()),
        (make_quota("gpus", memory="50Gi", enforcement="Audit"), False, Verdict(True, warnings=(
            'exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=0, reserved memory=0, limited '
            "memory=50Gi (enforcement: Audit, admitted)",), cause="quota", quotas=("gpus",)), Charge(80 * GiB, 1)),
        (make_quota("gpus", memory="100Gi", classes=["mig"]), False, Verdict(True), Charge()),
    ],
    ids=["dry-run", "dry-run-denied", "audit", "out-of-scope"],
)
def test_create_table(quota: dict[str, Any], dry_run: bool, expected: Verdict, reserved_after: Charge) -> None:
    ctx = context(quota)
    assert admit(ctx, review_request(stored(gpu_claim()), dry_run=dry_run)) == expected
    assert reserved(ctx) == reserved_after


def test_the_request_namespace_is_the_claims() -> None:
    ctx = context(GPUS)
    obj = stored(gpu_claim())
    del obj["metadata"]["namespace"]
    assert admit(ctx, review_request(obj)).allowed
    assert reserved(ctx) == Charge(80 * GiB, 1)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o["spec"]["devices"]["requests"][0]["exactly"].update(count="two"),
         "invalid ResourceClaim: spec.devices.requests[0].exactly.count"),
        (lambda o: o["metadata"].update(uid=7), "invalid ResourceClaim: ResourceClaim train-gpu-x7k2q: metadata.uid"),
        (lambda o: o.update(apiVersion="resource.k8s.io/v1alpha3"),
         "invalid ResourceClaim: ResourceClaim with apiVersion 'resource.k8s.io/v1alpha3' is not supported: use resource.k8s.io/v1"),
        (lambda o: o["metadata"].pop("uid"), "metadata.uid is missing"),
    ],
)
def test_malformed_claims_are_denied_naming_the_field(mutate: Any, message: str) -> None:
    obj = stored(gpu_claim())
    mutate(obj)
    verdict = admit(context(GPUS), review_request(obj))
    assert (verdict.allowed, verdict.reason, verdict.code) == (False, "Invalid", 422)
    assert verdict.message.startswith(message), verdict.message


def test_a_missing_object_is_denied() -> None:
    verdict = admit(context(GPUS), review_request(None))
    assert verdict == Verdict(False, "request.object is missing on a CREATE of resourceclaims", "Invalid", 422,
                              cause="invalid")


TEMPLATE_GPUS = make_quota("gpus", memory="200Gi")


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, Verdict(True)),
        (2, Verdict(True, warnings=(advised(
            'claims from this template do not fit now: exceeded DeviceQuota "gpus": requested memory=160Gi, '
            "used memory=0, reserved memory=80Gi, limited memory=200Gi", "reserved"),))),
        (3, Verdict(False, advised('a claim from this template can never fit: exceeded DeviceQuota "gpus": requested '
                                   "memory=240Gi, used memory=0, reserved memory=0, limited memory=200Gi", "never"),
                    cause="quota", quotas=("gpus",))),
    ],
)
def test_templates_reserve_nothing(count: int, expected: Verdict) -> None:
    world = World(TEMPLATE_GPUS)
    ctx = world.ctx
    other = stored(gpu_claim(), uid="other")
    assert admit(ctx, review_request(other)).allowed  # 80Gi reserved
    world.created(other)  # what "now" is checked against: this replica's cache
    template = stored(gpu_claim(count=count, kind="ResourceClaimTemplate"), uid="tmpl")
    assert create_template(ctx, review_request(template, gvr=TEMPLATE_GVR)) == expected
    assert reserved(ctx) == Charge(80 * GiB, 1)


def allocated(obj: dict[str, Any], *devices: tuple[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"] = {"allocation": {"devices": {"results": [result("gpu", d, pool=p) for p, d in devices]}}}
    return out


def status_update(obj: dict[str, Any], old: dict[str, Any], *, dry_run: bool = False) -> AdmissionRequest:
    scheduler = {"username": "system:kube-scheduler", "groups": ["system:authenticated"]}
    # The API server sends the stored copy, with its resourceVersion.
    old = {**old, "metadata": {"resourceVersion": "1", **old["metadata"]}}
    return review_request(obj, operation="UPDATE", sub="status", old=old, user=scheduler, dry_run=dry_run)


EXCEEDED = advised("the allocated devices charge more than the claim reserved (requested: the excess): "
                   'exceeded DeviceQuota "gpus": requested memory=61Gi, used memory=0, reserved memory=160Gi, '
                   "limited memory=160Gi", "reserved")


@pytest.mark.parametrize(
    ("device", "check", "expected", "used", "still_reserved"),
    [
        (("node-1", "gpu-0"), "enforce", Verdict(True), Charge(80 * GiB, 1), Charge(80 * GiB, 1)),
        # priced at an h100, allocated an h200 (as an Optimistic quota may): 61Gi more, nothing left
        (("node-2", "gpu-0"), "enforce", Verdict(False, EXCEEDED, cause="quota", quotas=("gpus",)), Charge(),
         Charge(160 * GiB, 2)),
        (("node-2", "gpu-0"), "account-only", Verdict(True, warnings=(
            f"{EXCEEDED} (allocation check: account-only, admitted)",), cause="quota", quotas=("gpus",),
            charged_above="ResourceClaim team-a/train-gpu-x7k2q: the allocated devices charge devices=1,memory=141Gi, "
                          "more than the devices=1,memory=80Gi it was admitted at"),
         Charge(141 * GiB, 1), Charge(80 * GiB, 1)),
    ],
)
def test_the_allocation_replaces_the_reservation(device: tuple[str, str], check: str, expected: Verdict,
                                                 used: Charge, still_reserved: Charge) -> None:
    world = World(make_quota("gpus", memory="160Gi"), allocation_check=check)
    ctx = world.ctx
    claim, other = stored(gpu_claim()), stored(gpu_claim(), uid=UID2, name="other")
    for obj in (claim, other):
        assert admit(ctx, review_request(obj)).allowed
        world.created(obj)  # the scheduler allocates claims that exist
    verdict = allocate(ctx, status_update(allocated(claim, device), claim))
    assert verdict == expected
    if verdict.allowed:
        world.created(allocated(claim, device))  # stored; the ledger counts what the watch brings
    usage = ctx.admitter.ledger.usage(NS, "gpus")
    assert (usage.used, usage.reserved) == (used, still_reserved)
    # the scheduler's retry of the same update counts nothing twice
    allocate(ctx, status_update(allocated(claim, device), claim))
    assert ctx.admitter.ledger.usage(NS, "gpus") == usage


def test_an_allocation_denied_for_its_excess_says_what_the_requester_can_do() -> None:
    world = World(make_quota("gpus", memory="160Gi"))
    claim, other = stored(gpu_claim()), stored(gpu_claim(), uid=UID2, name="other")
    for obj in (claim, other):
        assert admit(world.ctx, review_request(obj)).allowed
        world.created(obj)
    verdict = allocate(world.ctx, status_update(allocated(claim, ("node-2", "gpu-0")), claim))
    assert verdict.message == (
        "the allocated devices charge more than the claim reserved (requested: the excess): exceeded DeviceQuota "
        '"gpus": requested memory=61Gi, used memory=0, reserved memory=160Gi, limited memory=160Gi; to fit, free room '
        "in namespace team-a (claims not allocated yet hold the room at their estimate until they are allocated or "
        'deleted) or ask the cluster admin to raise the limit of DeviceQuota "gpus"')


def at(obj: dict[str, Any], version: int) -> dict[str, Any]:
    """`obj` as the API server stores it at resourceVersion `version`."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(version)
    return out


def test_a_late_allocation_review_of_a_deleted_claim_counts_nothing() -> None:
    """The scheduler's allocation of a claim deleted meanwhile: the API server validated a
    stale copy (its watch cache's, or one read before the DELETE committed) and its write
    will find no claim, but this replica's watch had already delivered the deletion. No
    later event would ever take the claim away: counting it again kept a gone claim in
    `used` for good (tests/e2e/test_crash_safety.py, CRASH_SEED=34108989: used 221Gi and
    allocated 2 against 141Gi and 1)."""
    world = World(make_quota("gpus", memory="400Gi"))
    ctx = world.ctx
    claim, other = stored(gpu_claim()), stored(gpu_claim(), uid=UID2, name="other")
    for obj in (claim, other):
        assert admit(ctx, review_request(obj)).allowed
        world.created(obj)  # at resourceVersions 101 and 102
    world.deleted(claim)  # 103: the claim's reservation goes
    late = at(claim, 101)
    assert allocate(ctx, status_update(allocated(late, ("node-1", "gpu-0")), late)) == Verdict(True)
    usage = ctx.admitter.ledger.usage(NS, "gpus")
    assert (usage.used, usage.allocated_claims, usage.reserved, usage.pending_claims) == (
        Charge(), 0, Charge(80 * GiB, 1), 1)


def test_a_late_allocation_review_of_a_claim_gone_before_the_list_counts_nothing() -> None:
    """The same after a restart: the claim was deleted before the list this replica started
    from, so its watch never delivers a deletion; the list's resourceVersion is past the
    copy's, and the cache does not hold it."""
    world = World(make_quota("gpus", memory="400Gi"))
    ctx = world.ctx
    listed = at(stored(gpu_claim(), uid=UID2, name="other"), 150)
    world.claims.replace([dict(with_namespace(listed, NS))])
    world.progress.advance("200")
    late = at(stored(gpu_claim()), 120)
    assert allocate(ctx, status_update(allocated(late, ("node-1", "gpu-0")), late)) == Verdict(True)
    assert ctx.admitter.ledger.usage(NS, "gpus").used == Charge()
    # The claim the cache holds, and one the watch has not reached yet (its events
    # follow), are counted at once: the one by the ledger (at its reservation, until the
    # watch brings its allocation), the other, all of whose charge is above what this
    # ledger holds for it, by its excess's persisted entry. The listed one came from a
    # list unallocated, so this replica cannot vouch for its history: its allocation is
    # persisted whole too (`ClaimStore.history_known`).
    new = at(stored(gpu_claim(), uid="fresh", name="fresh"), 201)
    for obj in (listed, new):
        assert allocate(ctx, status_update(allocated(obj, ("node-1", "gpu-0")), obj)) == Verdict(True)
    usage = ctx.admitter.ledger.usage(NS, "gpus")
    assert (usage.reserved, usage.pending_claims, usage.used) == (Charge(80 * GiB, 1), 1, Charge())
    assert ctx.reservations.pending(NS, "gpus") == Charge(160 * GiB, 2)


def test_only_the_update_that_sets_the_allocation_is_checked() -> None:
    ctx = context(make_quota("gpus", memory="1Gi"))
    claim = allocated(stored(gpu_claim()), ("node-2", "gpu-0"))
    # deallocation, and a driver's status.devices write on an allocated claim
    assert allocate(ctx, status_update(stored(gpu_claim()), claim)) == Verdict(True)
    assert allocate(ctx, status_update({**claim, "status": {**claim["status"], "devices": []}}, claim)) == Verdict(True)
    assert ctx.admitter.ledger.usage(NS, "gpus").used == Charge()


def test_a_dry_run_allocation_changes_nothing() -> None:
    world = World(GPUS)
    ctx = world.ctx
    claim = stored(gpu_claim())
    assert admit(ctx, review_request(claim)).allowed
    world.created(claim)
    assert allocate(ctx, status_update(allocated(claim, ("node-1", "gpu-0")), claim, dry_run=True)) == Verdict(True)
    assert (ctx.admitter.ledger.usage(NS, "gpus").used, reserved(ctx)) == (Charge(), Charge(80 * GiB, 1))


H200_EXCESS = advised("the allocated devices charge more than the claim reserved (requested: the excess): "
                      'exceeded DeviceQuota "gpus": requested memory=61Gi, used memory=0, reserved memory=221Gi, '
                      "limited memory=260Gi", "reserved")


def test_two_replicas_excess_allocations_never_both_take_the_last_room() -> None:
    """Two claims reserved at an h100 each (160Gi of 260Gi), both allocated an h200 (61Gi
    more each, room for one), the two status updates reviewed by two replicas before
    either's claim watch brought the other's allocation. Decided from each replica's own
    ledger, both passed (282Gi used of 260Gi); the excess is persisted now, and the
    second replica counts the first's entry."""
    quota = make_quota("gpus", memory="260Gi")
    a, b = World(quota), World(quota)
    b.reservations.api = a.api  # type: ignore[assignment]  # one API server
    claims = [stored(gpu_claim(), uid=uid, name=name) for uid, name in ((UID, "train-gpu-x7k2q"), (UID2, "other"))]
    for obj in claims:
        assert admit(a.ctx, review_request(obj)).allowed
        for world in (a, b):
            world.created(obj)  # both watches deliver both claims, at one resourceVersion each
    first, second = (allocated(obj, ("node-2", "gpu-0")) for obj in claims)
    assert allocate(a.ctx, status_update(first, claims[0])) == Verdict(True, charged_above=ABOVE)
    writes = a.api.writes
    assert allocate(b.ctx, status_update(second, claims[1])) == Verdict(False, H200_EXCESS, cause="quota",
                                                                     quotas=("gpus",))
    # Counted by both while their caches hold the claim's older, unallocated copy ...
    assert reserved(a.ctx) == reserved(b.ctx) == Charge(221 * GiB, 2)
    # ... and by the cache once it holds the allocated one: the entry goes, nothing twice.
    b.created(first)
    usage = b.ctx.admitter.ledger.usage(NS, "gpus")
    assert (usage.used, reserved(b.ctx)) == (Charge(141 * GiB, 1), Charge(80 * GiB, 1))
    # The denied one still does not fit; a dry run of it says so and writes nothing.
    assert not allocate(b.ctx, status_update(second, claims[1], dry_run=True)).allowed
    assert a.api.writes == writes


def test_a_reallocation_reviewed_by_a_replica_that_missed_the_deallocation_persists_its_excess() -> None:
    """Claim u took an h200 (61Gi above its 80Gi reservation), landed, was deallocated;
    replica B's watch brought the deallocation, replica A's not yet. The scheduler
    allocates u an h200 again, reviewed on the deallocated copy by A, whose ledger still
    holds u's first allocation. Measured against that stale allocation the excess was 0:
    A allowed and wrote nothing, and B, had it counted u at its 80Gi reservation again, would
    have let claim w's 61Gi excess in too (282Gi allocated under a hard of 260Gi). Measured
    against what the reviewed copy may count on some replica (its 80Gi reservation, on one
    that started after the deallocation) it is 61Gi, persisted: never both. B counts u at
    its last allocation (141Gi), so w's excess does not fit; once A's watch catches up, u
    gets back what it had."""
    quota = make_quota("gpus", memory="260Gi")
    a, b = World(quota), World(quota)
    b.reservations.api = a.api  # type: ignore[assignment]  # one API server
    u, w = (stored(gpu_claim(), uid=uid, name=name) for uid, name in ((UID, "train-gpu-x7k2q"), (UID2, "other")))
    for obj in (u, w):
        assert admit(a.ctx, review_request(obj)).allowed
        for world in (a, b):
            world.created(obj)
    first = allocated(u, ("node-2", "gpu-0"))
    assert allocate(a.ctx, status_update(first, u)) == Verdict(True, charged_above=ABOVE)
    for world in (a, b):
        world.created(first)  # landed; both watches bring it
    freed = stored(gpu_claim())  # deallocated: only B's watch has brought it
    b.created(freed)
    again = allocate(a.ctx, status_update(allocated(freed, ("node-2", "gpu-0")), freed))
    other = allocate(b.ctx, status_update(allocated(w, ("node-2", "gpu-0")), w))
    # A, lagging, also counts u's stale allocation: it refuses until its watch catches up
    # (more, never less).
    assert not (again.allowed and other.allowed)
    assert not other.allowed
    a.created(freed)
    assert allocate(a.ctx, status_update(allocated(freed, ("node-2", "gpu-0")), freed)).allowed


def test_a_retried_allocation_after_one_within_the_reservation_is_counted_whole_by_the_replica() -> None:
    """Claim u reserved at 141Gi (any GPU, Conservative). The scheduler's first write (an
    h100, within the reservation) is allowed, writing nothing, but fails after us; its
    retry on the same copy takes an h100 and an h200 (221Gi). This replica must count all
    of it until its watch moves: the 141Gi reservation it holds plus an excess of 80Gi."""
    world = World(make_quota("gpus", memory="400Gi"))
    u = stored(gpu_claim("true"))
    assert admit(world.ctx, review_request(u)).allowed
    world.created(u)
    assert allocate(world.ctx, status_update(allocated(u, ("node-1", "gpu-0")), u)).allowed
    retry = allocated(u, ("node-1", "gpu-0"), ("node-2", "gpu-0"))
    assert allocate(world.ctx, status_update(retry, u)).allowed
    usage = world.ctx.admitter.ledger.usage(NS, "gpus")
    assert (usage.used + usage.reserved + world.ctx.reservations.pending(NS, "gpus")).memory >= 221 * GiB


def test_a_denied_attempt_on_a_copy_never_releases_an_allowed_one_s_excess() -> None:
    """Two allocations of u reviewed on one copy (two allocators, or a retry while the
    first write is still in the API server): the first (an h200, 61Gi above u's 80Gi) fits
    quotas "a" and "b" and is allowed; the second (two h200s) fits "a" but not "b", so
    its part on "a" is taken back. The entry the two share on "a" then holds the first's
    61Gi again, which may still land: removing the entry whole would uncount it."""
    world = World(make_quota("a", memory="400Gi"), make_quota("b", memory="250Gi"))
    u = stored(gpu_claim())
    assert admit(world.ctx, review_request(u)).allowed
    world.created(u)
    assert allocate(world.ctx, status_update(allocated(u, ("node-2", "gpu-0")), u)).allowed
    assert not allocate(world.ctx, status_update(allocated(u, ("node-2", "gpu-0"), ("node-2", "gpu-1")), u)).allowed
    assert world.ctx.reservations.pending(NS, "a") == Charge(61 * GiB, 0)


def test_a_lone_denied_attempt_leaves_no_entry_behind() -> None:
    """The scheduler's allocation (two h200s) fits "a" but not "b": its part on "a" is
    taken back, so its retries do not hold room there until the TTL."""
    world = World(make_quota("a", memory="400Gi"), make_quota("b", memory="250Gi"))
    u = stored(gpu_claim())
    assert admit(world.ctx, review_request(u)).allowed
    world.created(u)
    assert not allocate(world.ctx, status_update(allocated(u, ("node-2", "gpu-0"), ("node-2", "gpu-1")), u)).allowed
    assert list(world.api.objects["a"]["status"]["reservations"]) == [UID]  # the create's, counted by the cache
    assert world.ctx.reservations.pending(NS, "a") == Charge()


def test_a_reallocation_within_the_reservation_never_takes_room_given_away_meanwhile() -> None:
    """One replica, no race. Claim u, reserved at 141Gi (any GPU, Conservative), is
    allocated an h100 (80Gi); claim w is admitted at 141Gi into the 221Gi that leaves.
    u is deallocated (its Pod done; a standalone claim): it counts 141Gi again, 282Gi
    of 221Gi. u is allocated an h200 (141Gi, "within its reservation", not checked),
    then w an h200: 282Gi used of a hard 221Gi in an Enforce quota."""
    world = World(make_quota("gpus", memory="221Gi"))
    landed(world, ("node-1", "gpu-0"))
    w = admitted(world)
    freed = stored(gpu_claim("true"))
    world.created(freed)  # deallocated
    again = allocate(world.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed))
    other = allocate(world.ctx, status_update(allocated(w, ("node-2", "gpu-0")), w))
    assert not (again.allowed and other.allowed)


def test_a_replica_lagging_a_deallocation_never_lets_a_reallocation_within_its_reservation_over_commit() -> None:
    """Claim u, reserved at 141Gi (any GPU, Conservative), allocated an h100 (80Gi, within
    its reservation: nothing written); deallocated, which replica B's watch brought and
    C's not yet. The scheduler allocates u an h200 (141Gi, still within its reservation:
    nothing written), reviewed by B. C, counting u at its stale 80Gi, admits claim w at
    141Gi into a hard of 221Gi; w is then allocated within its reservation: 282Gi used."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    u = stored(gpu_claim("true"))
    assert admit(b.ctx, review_request(u)).allowed
    for world in (b, c):
        world.created(u)
    first = allocated(u, ("node-1", "gpu-0"))
    assert allocate(b.ctx, status_update(first, u)).allowed
    for world in (b, c):
        world.created(first)
    freed = stored(gpu_claim("true"))
    b.created(freed)  # deallocated: only B's watch has brought it
    again = allocate(b.ctx, status_update(allocated(freed, ("node-2", "gpu-0")), freed))
    created = admit(c.ctx, review_request(stored(gpu_claim("true"), uid=UID2, name="other")))
    assert not (again.allowed and created.allowed)


def replicas(quota: dict[str, Any]) -> tuple[World, World]:
    """Two replicas B and C of one API server, with `quota`."""
    b, c = World(quota), World(quota)
    c.reservations.api = b.api  # type: ignore[assignment]  # one API server
    return b, c


def admitted(world: World) -> dict[str, Any]:
    """Claim w (any GPU: 141Gi, Conservative) admitted on `world`, stored and brought by its watch."""
    w = stored(gpu_claim("true"), uid=UID2, name="other")
    assert admit(world.ctx, review_request(w)).allowed
    world.created(w)
    return w


def landed(world: World, device: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Claim u (any GPU: reserved at 141Gi, Conservative) admitted on `world`, allocated
    `device`, both stored and brought by its watch: (u, its allocated copy)."""
    u = stored(gpu_claim("true"))
    assert admit(world.ctx, review_request(u)).allowed
    world.created(u)
    first = allocated(u, device)
    assert allocate(world.ctx, status_update(first, u)).allowed
    world.created(first)
    return u, first


def recorded(obj: dict[str, Any], allocation: dict[str, Any]) -> dict[str, Any]:
    """`obj` carrying the leader's record of `allocation` (`draquota.io/allocated-charge`)."""
    record = PRICER.allocation_record(parse_claim(with_namespace(allocation, NS)))
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("annotations", {}).update(record_annotations(parse_claim(with_namespace(out, NS)), record))
    return out


def test_a_replica_started_after_a_deallocation_counts_the_last_allocation_from_its_record() -> None:
    """Claim u, reserved at 141Gi (any GPU, Conservative), allocated an h100 (80Gi), its
    record written, deallocated: replica B, which saw all that, counts u at 80Gi. Replica
    C starts after: its first sight of u is the deallocated copy. Counting u at its
    reservation, it would take u's reallocation on an h200 as within it and write
    nothing, and B would admit a 141Gi claim into the 221Gi hard beside u's 80Gi: 282Gi
    once both are allocated. From the record C counts 80Gi too; and as a list brought
    u unallocated, C cannot vouch for the record being current: the whole 141Gi is
    persisted (checked against the quota less u's own 80Gi), and B counts it."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    u, first = landed(b, ("node-1", "gpu-0"))
    freed = recorded(stored(gpu_claim("true")), first)
    b.created(freed)
    c.claims.replace([dict(with_namespace(freed, NS))])
    assert c.ctx.admitter.ledger.usage(NS, "gpus").reserved == Charge(80 * GiB, 1)
    assert allocate(c.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed)).allowed
    assert c.ctx.reservations.pending(NS, "gpus") == Charge(141 * GiB, 1)
    assert not admit(b.ctx, review_request(stored(gpu_claim("true"), uid=UID2, name="other"))).allowed


def test_a_replica_started_after_a_deallocation_reads_a_device_two_of_its_classes_select_by_its_request() -> None:
    """Claim u asks any GPU (class gpu, reserved at 141Gi, Conservative) and a MIG slice
    (class any: every device), is allocated an h100 (80Gi) and a slice, recorded and
    deallocated; w takes the 61Gi freed. Class any selects the h100 too, so a record by
    device could not say which request, and which class, it was charged to: replica C,
    started after, counted u at its reservation and took u's reallocation on an h200 as
    within it, 282Gi of GPUs in the end. The record names each result's request now:
    C counts the last allocation, and the 61Gi excess must fit."""
    mig = f"device.attributes['{D}'].type == 'mig'"
    spec = make_claim("ignored", request("gpu", exactly("gpu", "true")), request("small", exactly("any", mig)))
    del spec["metadata"]["name"]
    slice_ = 4864 * MiB
    b, c = replicas(make_quota("gpus", memory=f"{221 * GiB + slice_}"))
    u = stored(spec)
    assert admit(b.ctx, review_request(u)).allowed
    b.created(u)

    def on(*devices: tuple[str, str, str]) -> dict[str, Any]:
        out = copy.deepcopy(u)
        out["status"] = {"allocation": {"devices": {"results": [result(r, d, pool=p) for r, p, d in devices]}}}
        return out

    first = on(("gpu", "node-1", "gpu-0"), ("small", "node-3", "mig-0"))
    assert allocate(b.ctx, status_update(first, u)).allowed
    b.created(first)
    freed = recorded(u, first)
    b.created(freed)
    admitted(b)
    c.claims.replace([dict(with_namespace(freed, NS))])
    assert c.ctx.admitter.ledger.usage(NS, "gpus").reserved == Charge(80 * GiB + slice_, 2)
    again = on(("gpu", "node-2", "gpu-1"), ("small", "node-3", "mig-0"))
    assert not allocate(c.ctx, status_update(again, freed)).allowed
    assert allocate(c.ctx, status_update(on(("gpu", "node-1", "gpu-1"), ("small", "node-3", "mig-0")), freed)).allowed


def test_a_deallocated_claim_s_record_changes_only_with_its_next_allocation() -> None:
    world = World(make_quota("gpus", memory="400Gi"))
    u = stored(gpu_claim())
    first = allocated(u, ("node-2", "gpu-0"))
    freed = recorded(u, first)
    lowered = copy.deepcopy(freed)
    lowered["metadata"]["annotations"][ALLOCATED_CHARGE_ANNOTATION] = "{}"
    verdict = update_claim(world.ctx, review_request(lowered, operation="UPDATE", old=freed))
    assert not verdict.allowed
    assert "records the claim's last allocation: it is written by dra-quota" in verdict.message
    # The leader's record of a new allocation passes.
    again = allocated(freed, ("node-1", "gpu-0"))
    assert update_claim(world.ctx, review_request(recorded(again, again), operation="UPDATE", old=again)).allowed


def test_a_replica_whose_watch_missed_an_allocation_counts_the_last_allocation_from_its_record() -> None:
    """Claim u, reserved at 141Gi (any GPU, Conservative), held by replicas B and C at
    that reservation. C's watch breaks; meanwhile u is allocated an h100 (80Gi), its record
    written, and deallocated; C relists and finds u unallocated. B, which saw it all, counts
    u at 80Gi and admits claim w at 141Gi into the 221Gi hard. Were C to keep counting u at
    its reservation (the ledger's entry winning over the record), it would take u's
    reallocation on an h200 as within it and write nothing: 282Gi once w is allocated, no
    race needed. From the record C counts 80Gi, so the reallocation's 61Gi must fit, and
    does not."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    u, first = landed(b, ("node-1", "gpu-0"))
    c.created(u)
    freed = recorded(stored(gpu_claim("true")), first)
    b.created(freed)
    w = admitted(b)
    c.claims.replace([dict(with_namespace(obj, NS)) for obj in (freed, w)])  # its watch resumes with a list
    assert c.ctx.admitter.ledger.usage(NS, "gpus").reserved == Charge(221 * GiB, 2)
    assert not allocate(c.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed)).allowed


def test_a_restart_after_a_deallocation_with_no_record_never_lets_a_reallocation_over_commit() -> None:
    """Claim u, reserved at 141Gi (any GPU, Conservative), allocated an h100 (80Gi); claim
    w admitted at 141Gi into the 221Gi left; u deallocated before the leader recorded its
    allocation, and the one replica (the leader) restarts before it brings the record up
    to date (`Annotating.record_due`), or a tenant made every write of the record fail
    (its annotations padded to the API server's limit): it counts u at its 141Gi
    reservation again. Taking u's reallocation on an h200 as within that, with w's
    allocation within its own after it, would put 282Gi under a hard of 221Gi. A list
    brought u unallocated, so the replica cannot vouch for its history: the reallocation
    is checked whole against the quota (w's 141Gi beside it), and denied."""
    quota = make_quota("gpus", memory="221Gi")
    world = World(quota)
    landed(world, ("node-1", "gpu-0"))
    w = admitted(world)
    freed = stored(gpu_claim("true"))
    world.created(freed)  # deallocated, no record
    restarted = World(quota)
    restarted.reservations.api = world.api  # type: ignore[assignment]
    restarted.claims.replace([dict(with_namespace(obj, NS)) for obj in (freed, w)])
    verdict = allocate(restarted.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed))
    assert not verdict.allowed
    assert verdict.message.startswith("dra-quota cannot tell what this claim's last allocation charged")
    assert "requested memory=141Gi, used memory=0, reserved memory=141Gi, limited memory=221Gi" in verdict.message


def test_a_restart_still_lets_a_claim_that_was_never_allocated_take_the_room_it_reserved() -> None:
    """Claim u reserved the whole 141Gi of its quota and was never allocated; the replica
    restarts, so a list brings u and it cannot vouch for u's history. Its allocation is
    checked whole, but against the quota less u's own count: it fits where the
    reservation did, and the entry holds all of it for the other replicas."""
    quota = make_quota("gpus", memory="141Gi")
    world = World(quota)
    u = stored(gpu_claim("true"))
    assert admit(world.ctx, review_request(u)).allowed
    world.created(u)
    restarted = World(quota)
    restarted.reservations.api = world.api  # type: ignore[assignment]
    restarted.claims.replace([dict(with_namespace(u, NS))])
    assert not restarted.reservations.claim_history_known(UID)
    assert allocate(restarted.ctx, status_update(allocated(u, ("node-2", "gpu-1")), u)).allowed
    assert restarted.ctx.reservations.pending(NS, "gpus") == Charge(141 * GiB, 1)
    # A second claim finds no room: u's reservation and its allocation's entry count once each.
    assert not admit(restarted.ctx, review_request(stored(gpu_claim("true"), uid=UID2, name="other"))).allowed


def test_a_stale_record_never_lets_a_reallocation_over_commit() -> None:
    """Claim u (141Gi reservation, any GPU) allocated an h200, recorded (141Gi),
    deallocated; allocated an h100 (80Gi) and deallocated again before the leader recorded
    that: the record still says 141Gi. Replica B counts u at 80Gi and admits w at 141Gi
    into the 221Gi hard. Replica C, started after, counting u at the record's 141Gi,
    would take u's reallocation on an h200 as within it: 282Gi. The leader, B, which saw
    the h100 land, brings the record up to date (the webhook accepts that value on an
    unallocated claim, and only that), and C counts what B does."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    u, first = landed(b, ("node-2", "gpu-0"))
    freed = recorded(stored(gpu_claim("true")), first)
    b.created(freed)
    second = allocated(freed, ("node-1", "gpu-0"))
    assert allocate(b.ctx, status_update(second, freed)).allowed
    b.created(second)
    freed_again = recorded(stored(gpu_claim("true")), first)  # the leader had not recorded the h100 yet
    b.created(freed_again)
    c.claims.replace([dict(with_namespace(freed_again, NS))])  # C starts now: the stale record
    assert c.ctx.admitter.ledger.usage(NS, "gpus").reserved == Charge(141 * GiB, 1)
    stale = parse_claim(with_namespace(freed_again, NS))
    assert b.ctx.admitter.record_due(stale) == PRICER.allocation_record(parse_claim(with_namespace(second, NS)))
    caught_up = recorded(stored(gpu_claim("true")), second)
    assert not update_claim(c.ctx, review_request(caught_up, operation="UPDATE", old=freed_again)).allowed
    assert update_claim(b.ctx, review_request(caught_up, operation="UPDATE", old=freed_again)).allowed
    for world in (b, c):
        world.created(caught_up)  # C reads the rewritten record
    freed_again = caught_up
    w = admitted(b)
    c.created(w)
    assert c.ctx.admitter.ledger.usage(NS, "gpus").reserved == Charge((80 + 141) * GiB, 2)
    assert not allocate(c.ctx, status_update(allocated(freed_again, ("node-2", "gpu-1")), freed_again)).allowed


def test_a_record_missing_a_device_never_lets_a_replica_count_less_than_the_last_allocation() -> None:
    """Claim u, reserved at 282Gi (two of any GPU), allocated an h100 and a device no
    ResourceSlice publishes (charged 141Gi, the largest of its class): 221Gi. Were the
    record to hold the h100 only, then once u is deallocated B would count 221Gi and C
    (started after) 80Gi, so C would admit w (two h200s, 282Gi) into the 400Gi hard, and B
    take u's reallocation on an h100 and an h200 (221Gi) as within what u holds: 503Gi once
    both are allocated. The record holds both."""
    b, c = replicas(make_quota("gpus", memory="400Gi"))
    u = stored(gpu_claim("true", count=2))
    assert admit(b.ctx, review_request(u)).allowed
    b.created(u)
    first = allocated(u, ("node-1", "gpu-0"), ("node-9", "gpu-0"))
    assert allocate(b.ctx, status_update(first, u)).allowed
    b.created(first)
    freed = recorded(stored(gpu_claim("true", count=2)), first)
    b.created(freed)
    c.claims.replace([dict(with_namespace(freed, NS))])
    w = stored(gpu_claim(H200, count=2), uid=UID2, name="other")
    created = admit(c.ctx, review_request(w))
    again = allocate(b.ctx, status_update(allocated(freed, ("node-1", "gpu-0"), ("node-2", "gpu-1")), freed))
    assert not (created.allowed and again.allowed)


def two_cycles(b: World, c: World) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Claim u (any GPU: reserved at 141Gi, Conservative) allocated an h200 (141Gi), landed on
    B and C; then, C's watch broken, recorded and deallocated, allocated an h100 (80Gi),
    recorded and deallocated again on B alone, which admits w at 141Gi beside u's 80Gi:
    (u's first allocation, its last copy, w)."""
    u, first = landed(b, ("node-2", "gpu-0"))
    c.created(u)
    c.created(first)
    freed = recorded(stored(gpu_claim("true")), first)
    b.created(freed)
    second = allocated(freed, ("node-1", "gpu-0"))
    assert allocate(b.ctx, status_update(second, freed)).allowed
    b.created(second)
    freed_again = recorded(stored(gpu_claim("true")), second)
    b.created(freed_again)
    w = admitted(b)
    return first, freed_again, w


def test_a_replica_that_missed_a_whole_cycle_never_lets_a_reallocation_over_commit() -> None:
    """u's h200 (141Gi) landed on B and C; C's watch broke, and u was deallocated,
    allocated an h100 (80Gi), recorded and deallocated again: B counts u at 80Gi and admits
    w at 141Gi into the 221Gi hard. C relists: were its own history (the h200) to win over
    the newer record, C would measure u's reallocation on an h200 over it alone: within it,
    nothing written, 282Gi once it lands. Measured over the record too, the 61Gi must fit."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    first, freed, w = two_cycles(b, c)
    c.created(recorded(stored(gpu_claim("true")), first))  # the first deallocation, then the break
    c.claims.replace([dict(with_namespace(obj, NS)) for obj in (freed, w)])
    assert not allocate(c.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed)).allowed


def test_a_replica_lagging_a_whole_cycle_never_lets_a_reallocation_over_commit() -> None:
    """The same with C's watch behind, not broken: its ledger still holds u's h200
    allocation. The reallocation is measured over the record the reviewed copy carries too
    (80Gi, what B and any replica started since count), not only over the smaller of that
    allocation and u's reservation (141Gi both): `_reserved` asks the unallocated copy for
    its record, since `Pricer.recorded` reads one on an unallocated claim only."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    _, freed, w = two_cycles(b, c)
    assert not allocate(c.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed)).allowed


def test_a_replica_that_missed_a_whole_cycle_never_rewrites_the_newer_record() -> None:
    """As `test_a_replica_that_missed_a_whole_cycle_never_lets_a_reallocation_over_commit`:
    C relisted u (record: the h100's 80Gi) holding its own older history (the h200's
    141Gi). Were C to write 141Gi back leading (or a tenant through C's webhook), replica
    D, started then, would count u at 141Gi and measure u's reallocation on an h200 over it
    (nothing written), while B counts 80Gi beside w's 141Gi: 282Gi under the 221Gi hard.
    A relist of a claim that changed while the watch was down takes its record over the
    process's own older history, so C has nothing to write back."""
    quota = make_quota("gpus", memory="221Gi")
    b, c = replicas(quota)
    first, freed, w = two_cycles(b, c)
    c.created(recorded(stored(gpu_claim("true")), first))
    c.claims.replace([dict(with_namespace(obj, NS)) for obj in (freed, w)])
    due = c.ctx.admitter.annotations_due(parse_claim(with_namespace(freed, NS)), freed["metadata"]["annotations"])
    if ALLOCATED_CHARGE_ANNOTATION in due:  # the leader's write, or a tenant's through C's webhook
        rewritten = copy.deepcopy(freed)
        rewritten["metadata"]["annotations"].update(due)
        assert update_claim(c.ctx, review_request(rewritten, operation="UPDATE", old=freed)).allowed
        freed = rewritten
    d = World(quota)
    d.reservations.api = b.api  # type: ignore[assignment]
    d.claims.replace([dict(with_namespace(obj, NS)) for obj in (freed, w)])
    assert not allocate(d.ctx, status_update(allocated(freed, ("node-2", "gpu-1")), freed)).allowed


def test_a_replica_behind_the_stored_claim_accepts_no_record_change() -> None:
    """As `two_cycles`, with C's watch behind rather than broken: it has brought u's first
    deallocation (its history: the h200's 141Gi), not the h100's cycle the record now
    says (80Gi). A tenant writing 141Gi back through C's webhook is refused: C does not
    hold the stored copy, so its history may be older than the record."""
    b, c = replicas(make_quota("gpus", memory="221Gi"))
    first, freed, _ = two_cycles(b, c)
    c.created(recorded(stored(gpu_claim("true")), first))
    due = c.ctx.admitter.record_due(parse_claim(with_namespace(freed, NS)))
    assert due == PRICER.allocation_record(parse_claim(with_namespace(first, NS)))  # C's older history
    rewritten = copy.deepcopy(freed)
    rewritten["metadata"]["annotations"].update(record_annotations(parse_claim(with_namespace(freed, NS)), due))
    verdict = update_claim(c.ctx, review_request(rewritten, operation="UPDATE", old=freed))
    assert not verdict.allowed and "records the claim's last allocation" in verdict.message


def test_an_allocation_within_its_reservation_writes_nothing() -> None:
    world = World(make_quota("gpus", memory="160Gi"))
    claim = stored(gpu_claim())
    assert admit(world.ctx, review_request(claim)).allowed
    world.created(claim)
    writes = world.api.writes
    assert allocate(world.ctx, status_update(allocated(claim, ("node-1", "gpu-0")), claim)) == Verdict(True)
    assert world.api.writes == writes


def test_a_delete_is_not_judged_and_releases_nothing() -> None:
    """A later admission step may refuse the DELETE, so its admission
    must not release anything; the claim watch's DELETED event does."""
    ctx = context(GPUS)
    claim = stored(gpu_claim())
    assert admit(ctx, review_request(claim)).allowed
    assert run("/validate", ctx, review_request(None, operation="DELETE", old=claim)) == Verdict(True)
    assert reserved(ctx) == Charge(80 * GiB, 1)


@pytest.mark.parametrize("key", ["draquota.io/charge", "draquota.io/quotas", "draquota.io/allocated-charge"])
def test_a_new_claim_or_template_may_not_carry_our_annotations(key: str) -> None:
    ctx = context(GPUS)
    claim = stored(gpu_claim())
    claim["metadata"].setdefault("annotations", {})[key] = '{"memory":0,"devices":0}'
    denial = Verdict(False, f"annotation {key} is written by dra-quota once the claim exists and may not be set by its "
                            "creator: remove it (an object exported from a cluster carries it)", cause="annotations")
    assert admit(ctx, review_request(claim)) == denial
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": NS},
                "spec": {"metadata": {"annotations": {key: "x"}}, "spec": gpu_claim()["spec"]}}
    assert create_template(ctx, review_request(template, gvr=TEMPLATE_GVR)) == denial
    assert reserved(ctx) == Charge()


def admin_record(outcome: str, username: str, basis: str, kind: str = "ResourceClaim") -> PolicyRecord:
    action = f"create {kind} team-a/train-gpu-x7k2q with adminAccess"
    return PolicyRecord(outcome, username, action, basis, kind, "team-a", "train-gpu-x7k2q")  # type: ignore[arg-type]


def with_admin(record: PolicyRecord, allowed: bool = True, message: str = "") -> Verdict:
    return Verdict(allowed, message, audit_annotations={"admin-access": record.audit_value}, records=(record,),
                   cause="none" if allowed else "admin_access")


REFUSED = "not on the adminAccess allowlist"
STAMPED = "stamped from a Pod's ResourceClaimTemplate, judged at the template's CREATE"
POD_MARKS = {
    "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train", "uid": "p-1", "controller": True,
                         "blockOwnerDeletion": True}],
}


@pytest.mark.parametrize(
    ("user", "marks", "labels", "expected"),
    [
        (ADMIN, {}, ADMIN_LABELS, with_admin(admin_record("granted", "root-ops", "allowlisted group gpu-admins"))),
        (ALICE, {}, ADMIN_LABELS, with_admin(
            r := admin_record("refused", "alice", REFUSED), False,
            f"alice may not {r.action}: not on dra-quota's adminAccess allowlist")),
        (CONTROLLER_USER, POD_MARKS, ADMIN_LABELS, with_admin(admin_record("granted", CLAIM_CONTROLLER, STAMPED))),
        (CONTROLLER_USER, {}, ADMIN_LABELS, with_admin(
            r := admin_record("refused", CLAIM_CONTROLLER, REFUSED), False,
            f"{CLAIM_CONTROLLER} may not {r.action}: not on dra-quota's adminAccess allowlist")),
        (ALICE, POD_MARKS, ADMIN_LABELS, with_admin(
            r := admin_record("refused", "alice", REFUSED), False,
            f"alice may not {r.action}: not on dra-quota's adminAccess allowlist")),
        # allowlisted, but the namespace lacks the label: nothing is granted, nothing recorded
        (ADMIN, {}, None, Verdict(False, ADMIN_ACCESS_MESSAGE, cause="admin_access")),
    ],
    ids=["allowlisted", "refused", "controller-for-pod", "controller-alone", "forged-marks", "no-label"],
)
def test_admin_access_claims(user: dict[str, Any], marks: dict[str, Any], labels: Mapping[str, str] | None,
                             expected: Verdict) -> None:
    ctx = context(GPUS, labels=labels)
    obj = stored(gpu_claim(admin=True))
    obj["metadata"].update(copy.deepcopy(marks))
    assert admit(ctx, review_request(obj, user=user)) == expected
    assert reserved(ctx) == Charge()  # adminAccess requests cost nothing


def test_admin_access_templates_follow_the_allowlist_too() -> None:
    template = stored(gpu_claim(admin=True, kind="ResourceClaimTemplate"))
    ctx = context(GPUS, labels=ADMIN_LABELS)
    granted = admin_record("granted", "root-ops", "allowlisted group gpu-admins", "ResourceClaimTemplate")
    assert create_template(ctx, review_request(template, gvr=TEMPLATE_GVR, user=ADMIN)) == with_admin(granted)
    # the controller's account never makes templates: no stamped-from-Pod exception here
    verdict = create_template(ctx, review_request(template, gvr=TEMPLATE_GVR, user=CONTROLLER_USER))
    assert not verdict.allowed and verdict.records[0].outcome == "refused"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({"draquota.io/charge": '{"memory":85899345920,"devices":1}'}, {"draquota.io/charge": '{"memory":0,"devices":1}'},
         Verdict(False, "annotation draquota.io/charge is written by dra-quota once the claim exists and may not be changed "
                        "(was '{\"memory\":85899345920,\"devices\":1}', now '{\"memory\":0,\"devices\":1}')",
                 cause="annotations")),
        ({"draquota.io/quotas": "gpus"}, {},
         Verdict(False, "annotation draquota.io/quotas is written by dra-quota once the claim exists and may not be changed "
                        "(was 'gpus', now None)", cause="annotations")),
        ({}, {"draquota.io/quotas": ""},
         Verdict(False, "annotation draquota.io/quotas is written by dra-quota once the claim exists and may not be changed "
                        "(was None, now '')", cause="annotations")),
        ({"draquota.io/quotas": "gpus"}, {"draquota.io/quotas": "gpus", "team": "ml"}, Verdict(True)),
        # Added once, by anyone, but only with what dra-quota writes (the leader's write).
        ({}, {"draquota.io/charge": '{"memory":85899345920,"devices":1}', "draquota.io/quotas": "gpus"},
         Verdict(True)),
        ({}, {"draquota.io/charge": '{"memory":1,"devices":1}', "draquota.io/quotas": "gpus"},
         Verdict(False, "annotation draquota.io/charge is written by dra-quota once the claim exists and may not be "
                        "changed (was None, now '{\"memory\":1,\"devices\":1}')", cause="annotations")),
    ],
)
def test_our_annotations_may_not_change(old: dict[str, str], new: dict[str, str], expected: Verdict) -> None:
    before, after = stored(gpu_claim()), stored(gpu_claim())
    before["metadata"]["annotations"], after["metadata"]["annotations"] = old, new
    assert update_claim(context(GPUS), review_request(after, operation="UPDATE", old=before)) == expected


# -- the endpoints --------------------------------------------------------------------


def run(path: str, ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    async def call() -> Verdict:  # asyncio.run wants a coroutine; an Endpoint returns an Awaitable
        return await endpoints(ctx)[path](request)
    return asyncio.run(call())


@pytest.mark.parametrize(
    ("path", "request_", "expected"),
    [
        ("/validate", review_request(stored(gpu_claim()), operation="CONNECT"), Verdict(True)),
        ("/validate", review_request(stored(gpu_claim()), gvr={**CLAIM_GVR, "resource": "deviceclasses"}), Verdict(True)),
        ("/validate", review_request(stored(gpu_claim()), sub="binding", operation="UPDATE", old=stored(gpu_claim())),
         Verdict(True)),
        ("/validate", review_request(stored(gpu_claim(count=3))), Verdict(False, advised(
            'exceeded DeviceQuota "gpus": requested memory=240Gi, used memory=0, reserved memory=0, limited memory=200Gi',
            "never"), cause="quota", quotas=("gpus",))),
        ("/mutate", review_request(stored(gpu_claim()), operation="UPDATE", old=stored(gpu_claim())), Verdict(True)),
        ("/mutate", review_request(stored(gpu_claim()), gvr=TEMPLATE_GVR), Verdict(True)),
    ],
    ids=["connect", "other-resource", "other-subresource", "claim-create", "mutate-update", "mutate-template"],
)
def test_endpoints_dispatch_and_skip_what_is_not_ours(path: str, request_: AdmissionRequest, expected: Verdict) -> None:
    assert run(path, context(GPUS), request_) == expected


def test_the_mutating_endpoint_of_earlier_releases_allows_untouched() -> None:
    """A MutatingWebhookConfiguration left by an upgrade still calls /mutate: it must not
    fail creates, and nothing is mutated any more (the leader annotates)."""
    assert run("/mutate", context(GPUS), review_request(stored(gpu_claim()))) == Verdict(True)


# -- no sequence over-commits, no retry counts twice ----------------------------------------

SIZES = (H100, H200, "device.attributes['gpu.example.com'].type == 'gpu'")
DEVICES = (("node-1", "gpu-0"), ("node-2", "gpu-1"), ("node-1", "gpu-3"))
ENFORCED = make_quota("gpus", memory="300Gi", devices=3)
op = st.tuples(st.sampled_from(["create", "retry", "delete", "allocate", "dry-run"]),
               st.integers(0, 3), st.integers(0, 2), st.integers(0, 2))


@settings(max_examples=fuzz_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=25), st.sampled_from(["enforce", "account-only"]))
def test_no_sequence_over_commits_and_no_retry_counts_twice(ops: list[tuple[str, int, int, int]], check: str) -> None:
    world = World(ENFORCED, make_quota("audit", memory="100Gi", enforcement="Audit"), allocation_check=check)
    ctx = world.ctx
    ledger = ctx.admitter.ledger
    quota = ledger.quotas(NS)[0]

    def counted() -> tuple[Charge, Charge]:
        usage = ledger.usage(NS, "gpus")
        return usage.used, usage.reserved + ctx.reservations.pending(NS, "gpus")

    for kind, uid, size, device in ops:
        # uids are reused across sizes and names: the key is the uid, whatever the name
        claim = stored(gpu_claim(SIZES[size]), uid=f"uid-{uid}", name=f"c-{size}")
        if kind in ("create", "retry", "dry-run"):
            if admit(ctx, review_request(claim, dry_run=kind == "dry-run")).allowed and kind != "dry-run":
                world.created(claim)
            if kind == "retry":
                before = counted()
                admit(ctx, review_request(claim))
                assert counted() == before
        elif kind == "delete":  # the claim watch's DELETED event
            world.deleted(claim)
        else:
            allocate(ctx, status_update(allocated(claim, DEVICES[device]), claim))
        used, reserved = counted()
        if check == "enforce":
            total = used + reserved
            assert total.memory <= 300 * GiB and total.devices <= 3
        usage = ledger.usage(NS, "gpus")
        # incremental usage is a recomputation from the entries: nothing counted twice
        used = sum((e.charge_for(quota, "conservative") for e in ledger.entries() if e.allocated), Charge())
        held = sum((e.charge_for(quota, "conservative") for e in ledger.entries() if not e.allocated), Charge())
        assert (usage.used, usage.reserved) == (used, held)


# -- fuzzing the endpoints with mutated reviews ----------------------------------------------

ADMIN_CLAIM = stored(gpu_claim(admin=True))
ADMIN_CLAIM["metadata"].update(copy.deepcopy(POD_MARKS))


def raw_review(obj: Any, *, operation: str = "CREATE", gvr: dict[str, str] = CLAIM_GVR, sub: str = "",
               old: Any = None, user: dict[str, Any] = CONTROLLER_USER, dry_run: bool = False) -> dict[str, Any]:
    request_ = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": gvr["group"], "version": "v1", "kind": "X"},
        "resource": dict(gvr), "subResource": sub, "name": "train-gpu-x7k2q", "namespace": "team-a",
        "operation": operation, "userInfo": copy.deepcopy(user), "object": copy.deepcopy(obj),
        "oldObject": copy.deepcopy(old), "dryRun": dry_run,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request_}


NAMESPACE_GVR = {"group": "", "version": "v1", "resource": "namespaces"}
TEMPLATE = stored(gpu_claim(admin=True, count=2, kind="ResourceClaimTemplate"))
NS_OBJECT = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": dict(ADMIN_LABELS)}}
BASES = [
    raw_review(ADMIN_CLAIM),
    raw_review(TEMPLATE, gvr=TEMPLATE_GVR, user=ADMIN),
    raw_review(allocated(ADMIN_CLAIM, DEVICES[1]), operation="UPDATE", sub="status", old=ADMIN_CLAIM),
    raw_review(None, operation="DELETE", old=ADMIN_CLAIM, dry_run=True),
    raw_review(ADMIN_CLAIM, operation="UPDATE", old=stored(gpu_claim())),
    raw_review(NS_OBJECT, operation="UPDATE", gvr=NAMESPACE_GVR, sub="finalize",
               old={**NS_OBJECT, "metadata": {"name": "team-a"}}, user=ALICE),
]


@settings(max_examples=fuzz_examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), st.sampled_from(range(len(BASES))), values)
def test_fuzz_the_endpoints_answer_every_mutated_review(data: st.DataObject, base: int, value: Any) -> None:
    body = copy.deepcopy(BASES[base])
    body = splice(body, data.draw(st.sampled_from(paths(body))), value)
    ctx = context(GPUS, make_quota("audit", memory="1Gi", enforcement="Audit"), labels=ADMIN_LABELS)
    with bounded(seconds=10, megabytes=256):
        try:
            request_ = parse_review(body)
        except ReviewError:
            return
        for path in ("/validate", "/mutate"):
            verdict = run(path, ctx, request_)
            assert isinstance(verdict, Verdict)
            assert verdict.allowed or (verdict.message and not verdict.patch)
            json.dumps(respond(request_.uid, verdict), ensure_ascii=False).encode("utf-8")
        total = ctx.admitter.ledger.usage(NS, "gpus")
        assert total.used.memory + reserved(ctx).memory <= 200 * GiB


def test_a_lone_surrogate_in_the_object_is_a_malformed_review() -> None:
    body = raw_review(ADMIN_CLAIM)
    body["request"]["object"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "'\ud800' == 'x'"}}]
    with pytest.raises(ReviewError, match="request.object holds a lone UTF-16 surrogate"):
        parse_review(body)


def annotated(obj: dict[str, Any], memory: int, devices: int) -> dict[str, Any]:
    """`obj` carrying the `draquota.io/charge` the leader wrote once it existed."""
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("annotations", {})["draquota.io/charge"] = json.dumps(
        {"memory": memory, "devices": devices})
    return out


ABOVE = ("ResourceClaim team-a/train-gpu-x7k2q: the allocated devices charge devices=1,memory=141Gi, more than "
         "the devices=1,memory=80Gi it was admitted at")
EXCEEDED_100 = advised("the allocated devices charge more than the claim reserved (requested: the excess): "
                       'exceeded DeviceQuota "gpus": requested memory=61Gi, used memory=0, reserved memory=80Gi, '
                       "limited memory=100Gi", "reserved")


@pytest.mark.parametrize(
    ("device", "hard", "check", "expected"),
    [
        # the h100 it was priced at: within the recorded charge
        (("node-1", "gpu-0"), "400Gi", "enforce", Verdict(True)),
        # an h200: 61Gi above, admitted (fits hard), the claim's Event note on the verdict
        (("node-2", "gpu-0"), "400Gi", "enforce", Verdict(True, charged_above=ABOVE)),
        # above and over hard: denied, so nothing was charged above anything
        (("node-2", "gpu-0"), "100Gi", "enforce", Verdict(False, EXCEEDED_100, cause="quota", quotas=("gpus",))),
        # account-only admits it over hard: charged above, and warned
        (("node-2", "gpu-0"), "100Gi", "account-only", Verdict(
            True, warnings=(f"{EXCEEDED_100} (allocation check: account-only, admitted)",), cause="quota",
            quotas=("gpus",), charged_above=ABOVE)),
    ],
    ids=["within", "above", "above-denied", "above-account-only"],
)
def test_an_allocation_above_the_recorded_charge_is_said_on_the_verdict(
        device: tuple[str, str], hard: str, check: str, expected: Verdict) -> None:
    world = World(make_quota("gpus", memory=hard), allocation_check=check)
    ctx = world.ctx
    assert admit(ctx, review_request(stored(gpu_claim()))).allowed
    world.created(stored(gpu_claim()))
    claim = annotated(stored(gpu_claim()), 80 * GiB, 1)
    assert allocate(ctx, status_update(allocated(claim, device), claim)) == expected


def test_an_allocation_no_quota_counts_was_reserved_nothing_to_exceed() -> None:
    for world in (World(), World(make_quota("other-class", memory="1Gi", classes=["other"]))):
        ctx = world.ctx
        assert admit(ctx, review_request(stored(gpu_claim()))).allowed
        world.created(stored(gpu_claim()))
        claim = annotated(stored(gpu_claim()), 80 * GiB, 1)
        assert allocate(ctx, status_update(allocated(claim, ("node-2", "gpu-0")), claim)) == Verdict(True)


def test_an_allocation_before_the_leader_annotated_the_claim_is_compared_with_its_reservation() -> None:
    world = World(make_quota("gpus", memory="400Gi"))
    ctx = world.ctx
    claim = stored(gpu_claim())  # not annotated yet: what the ledger counts for it says what was admitted
    assert admit(ctx, review_request(claim)).allowed
    world.created(claim)
    assert allocate(ctx, status_update(allocated(claim, ("node-2", "gpu-0")), claim)) == Verdict(
        True, charged_above=ABOVE)


def test_an_allocation_of_a_claim_nobody_priced_has_nothing_to_compare() -> None:
    ctx = context(make_quota("gpus", memory="400Gi"))
    claim = stored(gpu_claim())  # created before the install: no reservation, no annotation
    assert allocate(ctx, status_update(allocated(claim, ("node-2", "gpu-0")), claim)) == Verdict(True)


# -- the allocation record: only its exact value may be written --------------------------

RECORD_80 = '{"gpu.example.com/node-1/gpu-0":85899345920}'


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        (None, RECORD_80, True),  # the leader's first write: the exact charge of gpu-0 (80Gi)
        (RECORD_80, RECORD_80.replace("85899345920", "1"), False),  # lowered
        (None, '{"gpu.example.com/node-1/gpu-0":85899345920,"gpu.example.com/node-9/gpu-9":1}', False),  # not allocated
        (None, RECORD_80.replace('{"', '{"gpu:'), False),  # by result, where only the one by device goes
        (RECORD_80, None, False),  # removed
        (None, "not json", False),
        (None, "{}", False),  # the allocation's devices are known: {} is not their record
    ],
)
def test_the_allocation_record_may_only_say_what_the_devices_charge(old: str | None, new: str | None,
                                                                     allowed: bool) -> None:
    claim = allocated(stored(gpu_claim()), ("node-1", "gpu-0"))
    before, after = copy.deepcopy(claim), copy.deepcopy(claim)
    before["metadata"]["annotations"] = {} if old is None else {"draquota.io/allocated-charge": old}
    after["metadata"]["annotations"] = {} if new is None else {"draquota.io/allocated-charge": new}
    verdict = update_claim(context(GPUS), review_request(after, operation="UPDATE", old=before))
    assert verdict.allowed is allowed
    if not allowed:
        assert verdict.cause == "annotations" and "draquota.io/allocated-charge" in verdict.message
        if new is not None:
            assert f"expected '{RECORD_80}'" in verdict.message


def test_the_record_by_result_may_only_say_what_the_allocation_says() -> None:
    """`draquota.io/allocation-results`: on a claim of two classes the leader writes it beside
    the record by device; nobody may write another value, or one on a claim of one class."""
    two = make_claim("ignored", request("gpu", exactly("gpu", "true")), request("any", exactly("any")))
    del two["metadata"]["name"]
    claim = stored(two)
    claim["status"] = {"allocation": {"devices": {"results": [result("gpu", "gpu-0", pool="node-1"),
                                                               result("any", "gpu-1", pool="node-1")]}}}
    written = record_annotations(parse_claim(with_namespace(claim, NS)),
                                 PRICER.allocation_record(parse_claim(with_namespace(claim, NS))))
    assert set(written) == {ALLOCATED_CHARGE_ANNOTATION, ALLOCATION_RESULTS_ANNOTATION}

    def verdict(obj: dict[str, Any], annotations: dict[str, str]) -> Verdict:
        after = copy.deepcopy(obj)
        after["metadata"]["annotations"] = annotations
        return update_claim(context(GPUS), review_request(after, operation="UPDATE", old=obj))

    assert verdict(claim, written).allowed
    lowered = {**written, ALLOCATION_RESULTS_ANNOTATION: written[ALLOCATION_RESULTS_ANNOTATION].replace("85899345920", "1")}
    refused = verdict(claim, lowered)
    assert not refused.allowed and ALLOCATION_RESULTS_ANNOTATION in refused.message
    one = allocated(stored(gpu_claim()), ("node-1", "gpu-0"))
    assert not verdict(one, {ALLOCATED_CHARGE_ANNOTATION: RECORD_80,
                             ALLOCATION_RESULTS_ANNOTATION: RECORD_80.replace('{"', '{"gpu:')}).allowed
    assert verdict(one, {ALLOCATED_CHARGE_ANNOTATION: RECORD_80}).allowed


def test_a_vanished_devices_record_is_kept_not_rewritten() -> None:
    """gpu-9 is not in the inventory: only the value already recorded for it is accepted."""
    claim = allocated(stored(gpu_claim()), ("node-1", "gpu-0"), ("node-9", "gpu-9"))
    kept = '{"gpu.example.com/node-1/gpu-0":85899345920,"gpu.example.com/node-9/gpu-9":7}'
    before, after = copy.deepcopy(claim), copy.deepcopy(claim)
    before["metadata"]["annotations"] = {"draquota.io/allocated-charge": '{"gpu.example.com/node-9/gpu-9":7}'}
    after["metadata"]["annotations"] = {"draquota.io/allocated-charge": kept}
    assert update_claim(context(GPUS), review_request(after, operation="UPDATE", old=before)) == Verdict(True)
    after["metadata"]["annotations"] = {"draquota.io/allocated-charge": kept.replace(":7}", ":1}")}
    assert not update_claim(context(GPUS), review_request(after, operation="UPDATE", old=before)).allowed


def test_a_claim_of_a_namespace_not_cached_yet_waits_while_teams_exist() -> None:
    """Which ClusterDeviceQuotas select a namespace is in its labels: a claim of a
    namespace this replica's watch has not brought yet could skip its team's quota."""
    world = World(GPUS)
    known: dict[str, Mapping[str, str]] = {}
    ctx = ClaimContext(world.ctx.admitter, known.get, lambda: POLICY, world.reservations)
    assert admit(ctx, review_request(stored(gpu_claim(), uid=UID))).allowed  # no team: the labels decide nothing
    ctx.admitter.ledger.add_or_update_quota(parse_cluster_device_quota(make_cluster_quota("ml", memory="1Ti")))
    verdict = admit(ctx, review_request(stored(gpu_claim(), uid=UID2, name="g-2")))
    assert (verdict.allowed, verdict.cause) == (False, "unavailable")
    assert verdict.message == ("namespace team-a is not in dra-quota's cache yet, and ClusterDeviceQuotas select "
                               "namespaces by their labels: retry in a moment")
    known["team-a"] = {"kubernetes.io/metadata.name": "team-a"}
    assert admit(ctx, review_request(stored(gpu_claim(), uid=UID2, name="g-2"))).allowed


def test_a_claim_whose_estimate_is_memoised_is_priced_without_the_slicer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second claim of a spec finds its estimate memoised (`Counting._estimate`): priced
    at once, not through the slicer, and judged as a replica that never saw the first would."""
    world = World(GPUS)
    sliced: list[object] = []
    run = world.ctx.slicer.run

    async def counted(fn: Any, **kwargs: Any) -> Any:
        sliced.append(fn)
        return await run(fn, **kwargs)

    monkeypatch.setattr(world.ctx.slicer, "run", counted)
    first = admit(world.ctx, review_request(stored(gpu_claim(), uid=UID)))
    second = admit(world.ctx, review_request(stored(gpu_claim(), uid=UID2, name="train-gpu-b8m3r")))
    assert first.allowed and len(sliced) == 1
    assert second == admit(context(GPUS), review_request(stored(gpu_claim(), uid=UID2, name="train-gpu-b8m3r")))
