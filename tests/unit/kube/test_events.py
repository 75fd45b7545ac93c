"""kube.events: which verdicts make Events, aggregation into series, a bounded queue.

A fake sink stands in for the API server here (tests/e2e/test_observability.py writes
to the real one); the clock is a variable, so windows are exact.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from kube.admissionreview import Verdict
from kube.apierror import ApiError
from kube.events import NOTE_BYTES, EventKey, EventRecorder, Ref
from quota.admission.policy import PolicyRecord
from quota.values.raw import Obj
from runtime.eventcorrelation import Budget, Rate

from ..clock import FakeClock
from ..webhook.test_claimreview import TEMPLATE_GVR, gpu_claim, review_request, stored

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUOTA = Ref("draquota.io/v1alpha1", "DeviceQuota", "gpus", "team-a")


class FakeSink:
    def __init__(self, fail: ApiError | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail = fail
        self.created = 0

    async def create(self, namespace: str, body: Obj) -> Obj:
        self.calls.append(("create", namespace, body))
        if self.fail is not None:
            raise self.fail
        self.created += 1
        return {**body, "metadata": {**body["metadata"], "name": f"ev-{self.created}"}}

    async def patch(self, namespace: str, name: str, patch: Obj) -> Obj:
        self.calls.append(("patch", f"{namespace}/{name}", patch))
        if self.fail is not None:
            raise self.fail
        return patch


def recorder(sink: FakeSink, **kwargs: Any) -> tuple[EventRecorder, FakeClock, list[str]]:
    clock, dropped = FakeClock(1_700_000_000.0), list[str]()
    return EventRecorder(sink, instance="dra-quota-0", dropped=dropped.append, clock=clock, **kwargs), clock, dropped


def key(note: str = "ResourceClaim team-a/c3: exceeded") -> EventKey:
    return EventKey(QUOTA, None, "Warning", "QuotaExceeded", "Admit", note)


async def drain(rec: EventRecorder) -> None:
    while await rec.write_ready():
        pass


async def test_a_first_occurrence_is_created_with_every_required_field() -> None:
    sink = FakeSink()
    rec, _, _ = recorder(sink)
    assert rec.record(key())
    await drain(rec)
    [(op, namespace, body)] = sink.calls
    assert (op, namespace) == ("create", "team-a")
    assert body["metadata"]["name"].startswith("gpus.") and body["metadata"]["namespace"] == "team-a"
    assert {k: body[k] for k in ("apiVersion", "kind", "reportingController", "reportingInstance", "action", "reason",
                                 "type", "note", "regarding")} == {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "reportingController": "draquota.io/dra-quota",
        "reportingInstance": "dra-quota-0", "action": "Admit", "reason": "QuotaExceeded", "type": "Warning",
        "note": "ResourceClaim team-a/c3: exceeded",
        "regarding": {"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "name": "gpus", "namespace": "team-a"}}
    assert body["eventTime"] == "2023-11-14T22:13:20.000000Z" and "series" not in body and "related" not in body


async def test_repeats_within_the_window_patch_the_series_count() -> None:
    sink = FakeSink()
    rec, clock, _ = recorder(sink)
    rec.record(key())
    await drain(rec)
    clock.now += 10
    rec.record(key())
    await drain(rec)
    clock.now += 10
    rec.record(key())
    await drain(rec)
    assert [c[0] for c in sink.calls] == ["create", "patch", "patch"]
    assert sink.calls[1][1:] == ("team-a/ev-1", {"series": {"count": 2, "lastObservedTime": "2023-11-14T22:13:30.000000Z"}})
    assert sink.calls[2][2] == {"series": {"count": 3, "lastObservedTime": "2023-11-14T22:13:40.000000Z"}}


async def test_repeats_waiting_in_the_queue_share_one_write() -> None:
    sink = FakeSink()
    rec, clock, _ = recorder(sink)
    for _ in range(5):
        rec.record(key())
        clock.now += 1
    await drain(rec)
    [(op, _, body)] = sink.calls
    assert op == "create" and body["series"] == {"count": 5, "lastObservedTime": "2023-11-14T22:13:24.000000Z"}


async def test_a_different_note_or_a_repeat_after_the_window_is_a_new_event() -> None:
    sink = FakeSink()
    rec, clock, _ = recorder(sink, window=60.0)
    rec.record(key())
    rec.record(key("ResourceClaim team-a/c4: exceeded"))
    await drain(rec)
    clock.now += 61
    rec.record(key())
    await drain(rec)
    assert [c[0] for c in sink.calls] == ["create", "create", "create"]
    assert "series" not in sink.calls[2][2]


async def test_a_full_queue_drops_and_counts_but_keeps_the_occurrence() -> None:
    sink = FakeSink()
    rec, _, dropped = recorder(sink, queue_size=1)
    assert rec.record(key("a"))
    assert rec.record(key("a"))  # rides on the write already queued
    assert not rec.record(key("b"))
    assert dropped == ["queue_full"]
    await drain(rec)
    assert rec.record(key("b"))  # b's series remembers its dropped first occurrence
    await drain(rec)
    assert [(c[0], c[2]["note"], c[2].get("series", {}).get("count")) for c in sink.calls] == [
        ("create", "a", 2), ("create", "b", 2)]


async def test_a_failed_write_is_counted_and_never_raised() -> None:
    sink = FakeSink(fail=ApiError(403, "Forbidden", "events.events.k8s.io is forbidden"))
    rec, _, dropped = recorder(sink)
    rec.record(key())
    await drain(rec)
    assert dropped == ["write_failed"]


async def test_a_write_into_a_namespace_being_deleted_is_counted_without_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    # The API server's answer to a create in a terminating namespace (a real one, trimmed).
    terminating = ApiError(403, "Forbidden", 'events.events.k8s.io "gpus.18eb" is forbidden: unable to create new '
                           "content in namespace kq-1 because it is being terminated",
                           body={"kind": "Status", "reason": "Forbidden", "code": 403, "details": {
                               "name": "gpus.18eb", "kind": "events",
                               "causes": [{"type": "NamespaceTerminating", "message": "namespace kq-1 is being "
                                                                                      "terminated", "field": "metadata.namespace"}]}})
    # The same answer without its cause (CI, 2026-11-27: test_kueue's teardown found it warned).
    bare = ApiError(403, "Forbidden", terminating.message, body={"kind": "Status", "reason": "Forbidden", "code": 403,
                                                                 "message": terminating.message})
    for err, level in ((terminating, "DEBUG"), (bare, "DEBUG"),
                       (ApiError(403, "Forbidden", "events.events.k8s.io is forbidden"), "WARNING")):
        caplog.clear()
        rec, _, dropped = recorder(FakeSink(fail=err))
        rec.record(key())
        with caplog.at_level("DEBUG", logger="kube.events"):
            await drain(rec)
        assert dropped == ["write_failed"]
        assert [r.levelname for r in caplog.records if r.name == "kube.events"] == [level]


async def test_an_expired_event_is_created_again_with_its_count() -> None:
    sink = FakeSink()
    rec, clock, _ = recorder(sink)
    rec.record(key())
    await drain(rec)
    clock.now += 10  # past the refresh: the repeat is patched
    sink.fail = ApiError(404, "NotFound", "gone")
    rec.record(key())

    async def patch_then_work(namespace: str, name: str, patch: Obj) -> Obj:
        sink.fail = None
        raise ApiError(404, "NotFound", "the event TTL passed")

    sink.patch = patch_then_work  # type: ignore[method-assign]
    await drain(rec)
    assert [c[0] for c in sink.calls] == ["create", "create"]
    assert sink.calls[1][2]["series"]["count"] == 2


async def test_the_cache_of_series_is_bounded() -> None:
    sink = FakeSink()
    rec, _, _ = recorder(sink, max_series=2)
    for note in ("a", "b", "c"):
        rec.record(key(note))
    await drain(rec)  # "a" was evicted before its turn: skipped
    assert [c[2]["note"] for c in sink.calls] == ["b", "c"]


async def test_a_long_note_is_cut_to_the_api_limit() -> None:
    sink = FakeSink()
    rec, _, _ = recorder(sink)
    rec.record(key("é" * 2000))
    await drain(rec)
    note = sink.calls[0][2]["note"]
    assert len(note.encode()) <= NOTE_BYTES and note.endswith("…")


# -- which verdicts make which Events -----------------------------------------------------------


def record(outcome: str, kind: str = "ResourceClaim") -> PolicyRecord:
    if kind == "Namespace":
        action, namespace, name = "add label x to Namespace team-a", "", "team-a"
    else:
        action, namespace, name = "create ResourceClaim team-a/c with adminAccess", "team-a", "c"
    return PolicyRecord(outcome, "alice", action, "b", kind, namespace, name)  # type: ignore[arg-type]


AUDIT = 'exceeded DeviceQuota "gpus": requested ... (enforcement: Audit, admitted)'
DENIED = Verdict(False, 'exceeded DeviceQuota "gpus": ...', cause="quota", quotas=("gpus", "small"))


@pytest.mark.parametrize(
    ("verdict", "dry_run", "expected"),
    [
        (DENIED, False, [
            (QUOTA, "QuotaExceeded", "Warning", "ResourceClaim team-a/c3: " + DENIED.message),
            (Ref("draquota.io/v1alpha1", "DeviceQuota", "small", "team-a"), "QuotaExceeded", "Warning",
             "ResourceClaim team-a/c3: " + DENIED.message)]),
        (DENIED, True, []),
        (Verdict(False, "x", cause="pricing"), False, []),
        (Verdict(True, warnings=("no device matches now",)), False, []),
        (Verdict(True, warnings=("x", AUDIT), cause="quota", quotas=("gpus",)), False, [
            (QUOTA, "QuotaExceeded", "Warning", f"ResourceClaim team-a/c3: {AUDIT}")]),
        (Verdict(True, records=(record("granted"),)), False, [
            (Ref("resource.k8s.io/v1", "ResourceClaim", "c", "team-a"), "AdminAccessGranted", "Normal",
             record("granted").audit_value)]),
        (Verdict(False, "no", records=(record("refused", "Namespace"),), cause="admin_access"), False, [
            (Ref("v1", "Namespace", "team-a"), "AdminAccessRefused", "Warning",
             record("refused", "Namespace").audit_value)]),
        (Verdict(True, records=(record("granted"),)), True, []),
    ],
    ids=["quota-denial", "dry-run", "pricing", "warned", "audit", "claim-grant", "label-refusal", "dry-run-grant"],
)
async def test_verdicts_to_events(verdict: Verdict, dry_run: bool, expected: list[tuple[Ref, str, str, str]]) -> None:
    rec, _, _ = recorder(FakeSink())
    rec.review(review_request(stored(gpu_claim()), name="c3", dry_run=dry_run), verdict)
    keys = list(rec._series)
    assert [(k.regarding, k.reason, k.type, k.note) for k in keys] == expected
    if keys and keys[0].reason == "QuotaExceeded":
        assert keys[0].related == Ref("resource.k8s.io/v1", "ResourceClaim", "c3", "team-a")
        assert keys[0].namespace == "team-a"
    if keys and keys[0].reason.startswith("AdminAccess"):
        # A claim's in its namespace, related to it; a Namespace's (cluster-scoped) in `default`.
        on_claim = keys[0].regarding.kind == "ResourceClaim"
        assert keys[0].namespace == ("team-a" if on_claim else "default")
        assert keys[0].related == (Ref("v1", "Namespace", "team-a") if on_claim else None)


async def test_an_unreadable_review_makes_no_event() -> None:
    rec, _, _ = recorder(FakeSink())
    rec.review(None, Verdict(False, "malformed", cause="invalid"))
    assert not rec._series


async def test_a_template_denial_relates_the_template() -> None:
    rec, _, _ = recorder(FakeSink())
    request = review_request(stored(gpu_claim(kind="ResourceClaimTemplate")), gvr=TEMPLATE_GVR, name="t1")
    rec.review(request, DENIED)
    first = next(iter(rec._series))
    assert first.related == Ref("resource.k8s.io/v1", "ResourceClaimTemplate", "t1", "team-a")
    assert first.note.startswith("ResourceClaimTemplate team-a/t1: ")


async def test_a_generated_claim_denied_before_it_is_named_is_named_by_its_base() -> None:
    """The mutating claim admission reviews a `generateName` CREATE before the API server
    names the claim: the DeviceQuota's Event names the generateName's base (as the
    reservation and the denial do), and relates no object (none has that name)."""
    rec, _, _ = recorder(FakeSink())
    claim = owned()
    claim["metadata"].pop("name", None)
    claim["metadata"]["generateName"] = "train-0-gpu-"
    rec.review(review_request(claim, name=""), ONE_DENIAL)
    [on_quota] = [k for k in rec._series if k.regarding.kind == "DeviceQuota"]
    assert on_quota.note == "ResourceClaim team-a/train-0-gpu-: " + ONE_DENIAL.message
    assert on_quota.related is None


async def test_run_writes_until_cancelled() -> None:
    sink = FakeSink()
    rec, _, _ = recorder(sink)
    task = asyncio.create_task(rec.run())
    rec.record(key())
    for _ in range(100):
        if sink.calls:
            break
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [c[0] for c in sink.calls] == ["create"]


# -- the owning Pod of a denied claim, and an allocation charged above its reservation ---------

POD_UID = "5b0c2e7f-3d41-4a8e-9f62-1c7d8e9a0b3d"


def owned(controller: object = True, kind: str = "Pod", api_version: str = "v1") -> dict[str, Any]:
    """A claim as the resourceclaim controller stamps it for Pod `train-0`."""
    claim = stored(gpu_claim())
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "x"},
        {"apiVersion": api_version, "kind": kind, "name": "train-0", "uid": POD_UID, "controller": controller,
         "blockOwnerDeletion": True}]
    return claim


POD = Ref("v1", "Pod", "train-0", "team-a", POD_UID)
ONE_DENIAL = Verdict(False, 'exceeded DeviceQuota "gpus": ...', cause="quota", quotas=("gpus",))


@pytest.mark.parametrize(
    ("claim", "verdict", "dry_run", "expected"),
    [
        (owned(), ONE_DENIAL, False, [(QUOTA, None), (POD, None)]),
        (owned(), ONE_DENIAL, True, []),
        (owned(controller=False), ONE_DENIAL, False, [(QUOTA, None)]),  # owned, not controlled
        (owned(controller="true"), ONE_DENIAL, False, [(QUOTA, None)]),  # not the boolean true
        (owned(kind="Job", api_version="batch/v1"), ONE_DENIAL, False, [(QUOTA, None)]),
        (owned(api_version="example.com/v1"), ONE_DENIAL, False, [(QUOTA, None)]),  # not the core Pod
        (stored(gpu_claim()), ONE_DENIAL, False, [(QUOTA, None)]),  # a claim nobody owns
        # admitted over an Audit quota: the claim exists, its Pod has nothing to be told
        (owned(), Verdict(True, warnings=(AUDIT,), cause="quota", quotas=("gpus",)), False, [(QUOTA, None)]),
        (owned(), Verdict(False, "x", cause="pricing"), False, []),
    ],
    ids=["denied", "dry-run", "not-controller", "controller-not-bool", "job", "other-group", "no-owner", "audit",
         "pricing"],
)
async def test_a_claim_denied_for_quota_tells_its_pod(claim: dict[str, Any], verdict: Verdict, dry_run: bool,
                                                      expected: list[tuple[Ref, None]]) -> None:
    rec, _, _ = recorder(FakeSink())
    rec.review(review_request(claim, name="c3", dry_run=dry_run), verdict)
    keys = list(rec._series)
    assert [(k.regarding, None if k.regarding.kind == "DeviceQuota" else k.related) for k in keys] == expected
    # the DeviceQuota's Event relates the claim, the Pod's does not (retries aggregate)
    for k in keys:
        if k.regarding.kind == "Pod":
            assert (k.type, k.reason, k.action, k.note) == ("Warning", "QuotaExceeded", "Admit", ONE_DENIAL.message)


async def test_the_retries_claims_of_one_pod_are_one_series() -> None:
    """Each retry of the resourceclaim controller is a new generated claim name: the Pod's
    Event counts them (the DeviceQuota's names each claim)."""
    rec, _, _ = recorder(FakeSink())
    for name in ("train-0-gpu-a1b2c", "train-0-gpu-d3e4f", "train-0-gpu-g5h6i"):
        rec.review(review_request(owned(), name=name), ONE_DENIAL)
    pod = [series for k, series in rec._series.items() if k.regarding == POD]
    assert [s.count for s in pod] == [3]


async def test_a_pod_denial_is_written_regarding_the_pod_with_its_uid() -> None:
    sink = FakeSink()
    rec, _, _ = recorder(sink)
    rec.review(review_request(owned(), name="c3"), ONE_DENIAL)
    await drain(rec)
    bodies = {body["regarding"]["kind"]: body for _, _, body in sink.calls}
    assert bodies["Pod"]["regarding"] == {"apiVersion": "v1", "kind": "Pod", "name": "train-0", "namespace": "team-a",
                                          "uid": POD_UID}
    assert "related" not in bodies["Pod"] and bodies["Pod"]["note"] == ONE_DENIAL.message


def allocation(dry_run: bool = False) -> Any:
    claim = stored(gpu_claim())
    return review_request(claim, operation="UPDATE", sub="status", old=claim, name="c3", dry_run=dry_run)


ABOVE = "ResourceClaim team-a/c3: the allocated devices charge devices=1,memory=141Gi, more than ..."


@pytest.mark.parametrize(
    ("verdict", "dry_run", "expected"),
    [
        (Verdict(True, charged_above=ABOVE), False, [("ChargedAboveReservation", "Normal")]),
        (Verdict(True, charged_above=ABOVE), True, []),
        (Verdict(True), False, []),
        # account-only over hard: the quota's Warning and the claim's note, both
        (Verdict(True, warnings=(AUDIT,), cause="quota", quotas=("gpus",), charged_above=ABOVE), False,
         [("QuotaExceeded", "Warning"), ("ChargedAboveReservation", "Normal")]),
        # a denied allocation never charged anything (a handler never sets both; still no Event)
        (Verdict(False, "no", cause="quota", charged_above=ABOVE), False, []),
    ],
    ids=["above", "dry-run", "within", "account-only", "denied"],
)
async def test_an_allocation_charged_above_its_reservation_tells_the_claim(
        verdict: Verdict, dry_run: bool, expected: list[tuple[str, str]]) -> None:
    sink = FakeSink()
    rec, _, _ = recorder(sink)
    rec.review(allocation(dry_run), verdict)
    assert [(k.reason, k.type) for k in rec._series] == expected
    await drain(rec)
    for _, _, body in sink.calls:
        if body["reason"] == "ChargedAboveReservation":
            assert body["regarding"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c3",
                                         "namespace": "team-a", "uid": "3c1f5e2a-9b7d-4e61-8f0a-5d2c6b4e7a10"}
            assert (body["note"], body["action"], "related" in body) == (ABOVE, "Allocate", False)


async def test_an_allocation_reviewed_again_is_told_once() -> None:
    """The API server reviews one allocation write again when the claim changed in storage
    meanwhile (the leader's annotation, while the excess was persisted): one Event, no
    series; after the window, the same claim charged the same again is told again."""
    sink = FakeSink()
    rec, clock, _ = recorder(sink)
    for _ in range(3):
        rec.review(allocation(), Verdict(True, charged_above=ABOVE))
    await drain(rec)
    assert [s.count for s in rec._series.values()] == [1] and len(sink.calls) == 1
    clock.now += rec.window + 1
    rec.review(allocation(), Verdict(True, charged_above=ABOVE))
    await drain(rec)
    assert len(sink.calls) == 2


async def test_a_quota_event_carries_the_uid_the_caches_know() -> None:
    uids = {("team-a", "gpus"): "dq-uid"}
    rec = EventRecorder(FakeSink(), instance="dra-quota-0", quota_uid=lambda ns, name: uids.get((ns, name), ""))
    rec.review(review_request(stored(gpu_claim()), name="c3"), DENIED)
    assert [k.regarding.uid for k in rec._series] == ["dq-uid", ""]  # "small" is not cached: no uid


# -- what a flood costs, and what it leaves other namespaces ---------------------------------------


def flood_key(i: int, namespace: str = "team-a") -> EventKey:
    """A denial on the namespace's DeviceQuota, or an adminAccess refusal regarding a new claim."""
    if i % 2:
        claim = Ref("resource.k8s.io/v1", "ResourceClaim", f"c{i}", namespace)
        return EventKey(claim, Ref("v1", "Namespace", namespace), "Warning", "AdminAccessRefused",
                        "AuthorizeAdminAccess", f"refused: mallory may not create ResourceClaim {namespace}/c{i}")
    return EventKey(replace(QUOTA, namespace=namespace), None, "Warning", "QuotaExceeded", "Admit",
                    f"ResourceClaim {namespace}/c{i}: exceeded")


def written_in(sink: FakeSink, namespace: str) -> list[tuple[str, str, Any]]:
    return [c for c in sink.calls if c[1].split("/")[0] == namespace]


async def test_a_flood_of_six_hundred_denials_costs_at_most_thirty_writes_and_counts_them_all() -> None:
    sink = FakeSink()
    rec, clock, dropped = recorder(sink)
    for i in range(600):
        rec.record(flood_key(i))
        clock.now += 0.005
        await rec.write_ready()
    for _ in range(3):  # a minute later: each series' count written once more
        clock.now += 20
        await drain(rec)
    assert len(sink.calls) <= 30 and dropped == []
    creates = [body for op, _, body in sink.calls if op == "create"]
    assert len(creates) == 20  # 9 + 1 combined, on the quota and on the claims
    combined = [b["note"] for b in creates if b["note"].startswith("(combined from similar events): ")]
    assert len(combined) == 2
    # the last write of each series carries its whole count: 600 occurrences in all
    last: dict[str, int] = {}
    for op, where, body in sink.calls:
        name = f"team-a/ev-{len(last) + 1}" if op == "create" else where
        last[name] = body.get("series", {}).get("count", 1)
    assert sum(last.values()) == 600


async def test_another_namespace_is_written_in_turn_while_one_floods() -> None:
    sink = FakeSink()
    rec, clock, dropped = recorder(sink, budget=Budget(overall=Rate(1000, 1000)))
    for i in range(300):
        rec.record(flood_key(i))
        if i % 60 == 30:  # team-b's five denials, amid the flood and its backlog
            rec.record(flood_key(i + 1000, "team-b"))
    mine = 0
    while await rec.write_ready() and mine < 5:
        mine = len(written_in(sink, "team-b"))
    assert mine == 5 and not dropped
    # Round-robin: each of team-b's writes came within one turn of team-a's, not after its backlog.
    assert len(written_in(sink, "team-a")) <= 10


async def test_a_namespace_queue_full_drops_its_own_occurrences_only() -> None:
    sink = FakeSink()
    rec, _, dropped = recorder(sink, queue_size=2)
    assert rec.record(flood_key(1)) and rec.record(flood_key(3))
    assert not rec.record(flood_key(5))
    assert rec.record(flood_key(5, "team-b"))
    assert dropped == ["queue_full"]


async def test_a_series_is_patched_at_most_once_per_refresh() -> None:
    sink = FakeSink()
    rec, clock, _ = recorder(sink, refresh=10.0)
    rec.record(key())
    await drain(rec)
    for _ in range(5):
        clock.now += 1
        rec.record(key())
        await drain(rec)
    assert [c[0] for c in sink.calls] == ["create"]
    clock.now += 5
    await drain(rec)
    assert [c[0] for c in sink.calls] == ["create", "patch"]
    assert sink.calls[1][2]["series"]["count"] == 6


async def test_a_write_the_budget_refuses_waits_for_its_token() -> None:
    sink = FakeSink()
    rec, clock, dropped = recorder(sink, budget=Budget(per_namespace=Rate(1, 0.1)))
    rec.record(flood_key(1))
    rec.record(flood_key(3))
    await drain(rec)
    assert len(sink.calls) == 1 and not dropped
    clock.now += 10
    await drain(rec)
    assert [c[2]["regarding"]["name"] for c in sink.calls] == ["c1", "c3"]
