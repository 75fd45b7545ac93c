"""quota.status.quotastatus: the controller's status fields, and two writers sharing one status."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, is_typeddict

import pytest
import yaml

from quota.accounting.reservationrecord import Record, Reservation, parse_record, status_fields
from quota.accounting.reservations import Request, apply
from quota.quotas.devicequota import (Amounts, ClaimCounts, ClusterDeviceQuotaStatus, Condition, DeviceQuotaStatus,
                               NamespaceUsage, ReservationEntry, ReservedBy, Usage, parse_cluster_device_quota,
                               parse_device_quota)
from quota.status.quotastatus import MAX_NAMESPACES, boundary, desired_status, next_change, next_expiry
from quota.values.model import Charge

from ...builders import GiB, make_cluster_quota, make_quota
from ..accounting.test_reservations import Seen

CRD = Path(__file__).resolve().parents[4] / "deploy" / "crds" / "devicequota.yaml"
CLUSTER_CRD = CRD.with_name("clusterdevicequota.yaml")

GPU = Charge(80 * GiB, 1)
TTL = 120.0
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def quota_obj(memory: str = "320Gi", status: Mapping[str, Any] | None = None, generation: int = 2) -> dict[str, Any]:
    obj = make_quota("gpus", memory=memory)
    obj["metadata"] = {**obj["metadata"], "generation": generation, "resourceVersion": "1"}
    return {**obj, "status": status} if status is not None else obj


def entries(*items: tuple[str, float], through: int | None = None) -> DeviceQuotaStatus:
    return status_fields(Record({uid: Reservation(uid, f"team-a/{uid}", GPU, at) for uid, at in items}, through))


def desired(obj: dict[str, Any], *, usage: Usage = Usage(), seen: Seen = Seen(), now: float = NOW) -> DeviceQuotaStatus:
    return desired_status(obj, parse_device_quota(obj), parse_record(obj.get("status")), usage=usage, caches=seen,
                          now=now)


def test_used_reserved_and_claims_from_the_ledger_and_the_unconfirmed_entries() -> None:
    # "a" is seen (its claim is in the cache at resourceVersion 9: counted by the ledger's
    # reserved, its entry goes and the watermark rises), "b" not yet (counted from its
    # entry), "c" expired, "d" deleted: both dropped.
    obj = quota_obj(status=entries(("a", NOW + 30), ("b", NOW + 30), ("c", NOW - 1), ("d", NOW + 30), through=4))
    usage = Usage(used=Charge(160 * GiB, 2), reserved=GPU, allocated_claims=2, pending_claims=1)
    status = desired(obj, usage=usage, seen=Seen(claims={"a": 9}, deleted={"d": 7}))
    assert sorted(status["reservations"]) == ["b"] and status["claimsThrough"] == "9"
    assert status["used"] == {"memory": "160Gi", "devices": 2}
    assert status["reserved"] == {"memory": "160Gi", "devices": 2}
    assert status["claims"] == {"allocated": 2, "pending": 1}
    assert status["observedGeneration"] == 2
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True"), ("Exceeded", "False")]
    assert next_expiry(parse_record(obj["status"]), NOW) == NOW + 30


def test_a_second_pass_changes_nothing_so_nothing_is_written() -> None:
    obj = quota_obj(status=entries(("b", NOW + 30)))
    first = desired(obj, usage=Usage(used=GPU, allocated_claims=1))
    again = desired({**obj, "status": first}, usage=Usage(used=GPU, allocated_claims=1), now=NOW + 20)
    assert again == first


def test_exceeded_after_hard_is_lowered_and_transition_times_move_only_on_a_flip() -> None:
    usage = Usage(used=Charge(160 * GiB, 2), allocated_claims=2)
    within = desired(quota_obj("320Gi"), usage=usage)
    lowered = desired(quota_obj("100Gi", within, generation=3), usage=usage, now=NOW + 5)
    exceeded = {c["type"]: c for c in lowered["conditions"]}["Exceeded"]
    assert exceeded["status"] == "True" and exceeded["reason"] == "AboveHard"
    assert exceeded["message"] == "used + reserved memory=160Gi is above hard memory=100Gi"
    assert exceeded["lastTransitionTime"] == "2027-01-15T08:00:05Z" and exceeded["observedGeneration"] == 3
    ready = {c["type"]: c for c in lowered["conditions"]}["Ready"]
    assert ready["lastTransitionTime"] == "2027-01-15T08:00:00Z"  # unchanged status: time kept
    assert lowered["observedGeneration"] == 3


def test_fields_of_other_writers_are_kept() -> None:
    other = {"type": "SomeoneElses", "status": "True"}
    status = desired(quota_obj(status={"conditions": [other], "extra": 1}))
    assert dict(status)["extra"] == 1 and other in status["conditions"]


# -- the two writers over one object, every interleaving -----------------------------------------


class Server:
    """One object with a resourceVersion: a write based on an older one is a conflict."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj, self.rv = obj, 1

    def read(self) -> tuple[dict[str, Any], int]:
        return self.obj, self.rv

    def write(self, status: Mapping[str, Any], rv: int) -> bool:
        if rv != self.rv:
            return False
        self.obj, self.rv = {**self.obj, "status": status}, self.rv + 1
        return True


def webhook_writes(server: Server, uid: str) -> Any:
    """kube.statuswriter.QuotaStatusWriter._write: read, apply, merge its field into the status as read."""
    while True:
        obj, rv = server.read()
        yield
        quota = parse_device_quota(obj)
        out = apply(quota, parse_record(obj.get("status")), [Request("reserve", uid, f"team-a/{uid}", GPU)],
                    usage=Usage(), caches=Seen(), now=NOW, ttl=TTL)
        if server.write({**(obj.get("status") or {}), **status_fields(out.record)}, rv):
            return
        yield


def controller_writes(server: Server) -> Any:
    while True:
        obj, rv = server.read()
        yield
        if server.write(desired(obj, usage=Usage(used=GPU, allocated_claims=1)), rv):
            return
        yield


def test_no_interleaving_of_the_two_writers_loses_a_reservation_or_the_usage() -> None:
    for order in set(itertools.permutations("wwwwcccc")):
        server = Server(quota_obj(status=entries(("old", NOW + 10))))
        writers = {"w": webhook_writes(server, "new"), "c": controller_writes(server)}
        done: set[str] = set()
        for step in itertools.chain(order, itertools.cycle("wc")):
            if step not in done:
                try:
                    next(writers[step])
                except StopIteration:
                    done.add(step)
            if done == {"w", "c"}:
                break
        status = server.obj["status"]
        assert sorted(status["reservations"]) == ["new", "old"], order
        assert status["used"] == {"memory": "80Gi", "devices": 1}, order


def test_reserved_is_split_by_source_workloads_and_claims() -> None:
    # The ledger's reserved holds 80Gi of pending claims and 160Gi Kueue Workloads hold;
    # the unconfirmed entry "b" is a claim's (or a Workload's not seen yet): claims'.
    obj = quota_obj(status=entries(("b", NOW + 30)))
    usage = Usage(reserved=GPU + Charge(160 * GiB, 2), workloads=Charge(160 * GiB, 2), pending_claims=1)
    status = desired(obj, usage=usage)
    assert status["reserved"] == {"memory": "320Gi", "devices": 4}
    assert status["reservedBy"] == {"claims": {"memory": "160Gi", "devices": 2},
                                    "workloads": {"memory": "160Gi", "devices": 2}}


def test_reserved_by_is_left_out_while_no_workload_holds_anything() -> None:
    """Without Kueue (or with nothing held), `kubectl describe` showed `Reserved By:` with
    an empty `Workloads:` split: the field is absent, all of `reserved` is claims'; one
    written earlier goes."""
    before = quota_obj(status={"reservedBy": {"claims": {"memory": "80Gi", "devices": 1},
                                              "workloads": {"memory": "80Gi", "devices": 1}}})
    status = desired(before, usage=Usage(reserved=GPU, pending_claims=1))
    assert status["reserved"] == {"memory": "80Gi", "devices": 1}
    assert "reservedBy" not in status


def test_a_devices_selector_that_does_not_compile_makes_the_quota_not_ready_and_says_which() -> None:
    obj = make_quota("gpus", memory="1Gi", selectors=["device.driver == 'gpu.example.com'", "device.driver =="])
    (ready,) = [c for c in desired(obj)["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSelector")
    assert ready["message"].startswith("spec.devices.selectors[1].cel.expression: compilation failed")
    assert "selects every device" in ready["message"]
    obj["spec"]["devices"]["selectors"].pop()
    assert [c["status"] for c in desired(obj)["conditions"] if c["type"] == "Ready"] == ["True"]


# -- the status's JSON type is the CRD's status schema -------------------------------------------


def _schema(*path: str, crd: Path = CRD) -> Any:
    node = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    for step in path:
        node = node["items"] if step == "[]" else node["additionalProperties"] if step == "{}" else node["properties"][step]
    return node


@pytest.mark.parametrize(("typed", "path"), [
    (DeviceQuotaStatus, ()), (Amounts, ("used",)), (Amounts, ("reserved",)), (ReservedBy, ("reservedBy",)),
    (Amounts, ("reservedBy", "claims")), (ClaimCounts, ("claims",)), (Condition, ("conditions", "[]")),
    (ReservationEntry, ("reservations", "{}")),
], ids=lambda v: ".".join(v) if isinstance(v, tuple) else None)
def test_the_status_types_name_the_fields_of_the_crd_schema(typed: Any, path: tuple[str, ...]) -> None:
    assert is_typeddict(typed)
    assert typed.__required_keys__ | typed.__optional_keys__ == set(_schema(*path)["properties"])



@pytest.mark.parametrize(("typed", "path"), [
    (ClusterDeviceQuotaStatus, ()), (NamespaceUsage, ("namespaces", "[]")), (Amounts, ("namespaces", "[]", "used")),
    (ClaimCounts, ("namespaces", "[]", "claims")), (Amounts, ("used",)), (Condition, ("conditions", "[]")),
], ids=lambda v: ".".join(v) if isinstance(v, tuple) else None)
def test_the_cluster_status_types_name_the_fields_of_its_crd_schema(typed: Any, path: tuple[str, ...]) -> None:
    assert typed.__required_keys__ | typed.__optional_keys__ == set(_schema(*path, crd=CLUSTER_CRD)["properties"])


def test_the_cluster_crd_is_the_device_quota_crd_plus_the_team_fields() -> None:
    def version(path: Path) -> Any:
        return yaml.safe_load(path.read_text())["spec"]["versions"][0]

    plain, cluster = version(CRD), version(CLUSTER_CRD)
    assert cluster["additionalPrinterColumns"] == plain["additionalPrinterColumns"]
    props = cluster["schema"]["openAPIV3Schema"]["properties"]
    spec, status = dict(props["spec"]["properties"]), dict(props["status"]["properties"])
    assert spec.pop("namespaceSelector") and status.pop("namespaces") and status.pop("namespacesThrough")
    assert spec == plain["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert status == plain["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]


def test_a_team_status_has_its_totals_and_each_namespaces_part_with_its_entries_in_flight() -> None:
    obj = make_cluster_quota("ml", memory="320Gi")
    obj["metadata"] = {**obj["metadata"], "generation": 1, "resourceVersion": "1"}
    record = Record({"u": Reservation("u", "team-b/c", GPU, NOW + 30)})
    obj["status"] = status_fields(record)
    a = Usage(used=Charge(160 * GiB, 2), allocated_claims=2)
    b = Usage(reserved=GPU, pending_claims=1)
    total = Usage(used=a.used, reserved=b.reserved, allocated_claims=2, pending_claims=1)
    status = desired_status(obj, parse_cluster_device_quota(obj), record, usage=total, caches=Seen(), now=NOW,
                            members=[("team-b", b), ("team-a", a)])
    assert status["used"] == {"memory": "160Gi", "devices": 2}
    assert status["reserved"] == {"memory": "160Gi", "devices": 2}  # b's claim and the entry in flight
    assert status["namespaces"] == [  # type: ignore[typeddict-item]
        {"namespace": "team-a", "used": {"memory": "160Gi", "devices": 2}, "reserved": {"memory": "0", "devices": 0},
         "claims": {"allocated": 2, "pending": 0}},
        {"namespace": "team-b", "used": {"memory": "0", "devices": 0}, "reserved": {"memory": "160Gi", "devices": 2},
         "claims": {"allocated": 0, "pending": 1}},
    ]
    # A DeviceQuota's status has no breakdown.
    assert "namespaces" not in desired(quota_obj())


def test_the_leader_dropping_a_teams_entry_raises_its_namespace_watermark() -> None:
    # It counts the claim in the team by its own view of the Namespaces' labels: a writer
    # after it must have seen at least as much (quota.accounting.reservations, namespacesThrough).
    obj = make_cluster_quota("ml", memory="320Gi")
    record = Record({"u": Reservation("u", "team-b/c", GPU, NOW + 30)})
    obj["status"] = status_fields(record)
    quota = parse_cluster_device_quota(obj)
    status = desired_status(obj, quota, record, usage=Usage(), caches=Seen(claims={"u": 7}), now=NOW, namespaces=40)
    assert status["reservations"] == {} and status["namespacesThrough"] == "40"  # type: ignore[typeddict-item]
    kept = desired_status(obj, quota, record, usage=Usage(), caches=Seen(), now=NOW, namespaces=40)
    assert "namespacesThrough" not in kept


def test_a_team_says_when_its_breakdown_lists_only_the_first_namespaces() -> None:
    obj = make_cluster_quota("ml", memory="320Gi")
    quota = parse_cluster_device_quota(obj)
    few = desired_status(obj, quota, Record({}), usage=Usage(), caches=Seen(), now=NOW,
                         members=[("team-a", Usage())])
    listed = {c["type"]: c for c in few["conditions"]}["NamespacesListed"]
    assert (listed["status"], listed["reason"]) == ("True", "AllListed")
    many = [(f"ns-{i:05}", Usage()) for i in range(MAX_NAMESPACES + 1)]
    status = desired_status(obj, quota, Record({}), usage=Usage(), caches=Seen(), now=NOW, members=many)
    listed = {c["type"]: c for c in status["conditions"]}["NamespacesListed"]
    assert (listed["status"], listed["reason"]) == ("False", "TooManyNamespaces")
    assert f"first {MAX_NAMESPACES} of {MAX_NAMESPACES + 1}" in listed["message"]
    assert len(status["namespaces"]) == MAX_NAMESPACES  # type: ignore[typeddict-item]
    # A DeviceQuota has no breakdown, so no such condition.
    assert "NamespacesListed" not in {c["type"] for c in desired(quota_obj())["conditions"]}


# -- windows: the hard in force, the open window, the next change ------------------------------

DEADLINE = {"name": "deadline", "hard": {"memory": "640Gi"}, "start": "2027-01-15T06:00:00Z",
            "end": "2027-01-15T09:00:00Z"}


def windowed(status: Mapping[str, Any] | None = None) -> dict[str, Any]:
    obj = quota_obj(status=status)
    obj["spec"] = {**obj["spec"], "windows": [DEADLINE]}
    return obj


def test_a_quota_with_windows_shows_the_hard_in_force_the_window_and_the_next_change() -> None:
    status = desired(windowed(), usage=Usage(used=Charge(400 * GiB, 5)))  # NOW is 08:00, in the window
    assert status["effectiveHard"] == {"memory": "640Gi"}
    assert status["activeWindow"] == "deadline" and status["nextChange"] == "2027-01-15T09:00:00Z"
    assert next_change(status) == NOW + 3600  # the controller wakes then
    assert [c["status"] for c in status["conditions"] if c["type"] == "Exceeded"] == ["False"]


def test_after_a_window_closes_the_quota_is_exceeded_naming_it() -> None:
    status = desired(windowed(), usage=Usage(used=Charge(400 * GiB, 5)), now=NOW + 3600)
    assert status["effectiveHard"] == {"memory": "320Gi"}
    assert "activeWindow" not in status and "nextChange" not in status
    exceeded = next(c for c in status["conditions"] if c["type"] == "Exceeded")
    assert exceeded["status"] == "True"
    assert exceeded["message"] == ("used + reserved memory=400Gi is above hard memory=320Gi (the limit in force "
                                   "since window 'deadline' ended at 2027-01-15T09:00:00Z)")


def test_windows_removed_take_their_fields_along() -> None:
    before = desired(windowed())
    status = desired(quota_obj(status=before))
    assert not {"effectiveHard", "activeWindow", "nextChange"} & set(status)


def test_the_windows_fields_are_in_the_crd_schema() -> None:
    for crd in (CRD, CLUSTER_CRD):
        schema = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert {"effectiveHard", "activeWindow", "nextChange"} <= set(schema["properties"]["status"]["properties"])


def test_boundary_events() -> None:
    opened = {"effectiveHard": {"memory": "640Gi"}, "activeWindow": "deadline", "nextChange": "2027-01-15T09:00:00Z"}
    closed = {"effectiveHard": {"memory": "320Gi"}}
    assert boundary(closed, opened) == (
        "WindowOpened", "window 'deadline' opened: hard in force memory=640Gi until 2027-01-15T09:00:00Z")
    assert boundary(opened, closed) == ("WindowClosed", "window 'deadline' closed: hard in force memory=320Gi (spec.hard)")
    assert boundary({**opened, "activeWindow": "nights"}, opened) == (
        "WindowOpened", "window 'nights' closed and window 'deadline' opened: hard in force memory=640Gi "
        "until 2027-01-15T09:00:00Z")
    assert boundary(opened, {**opened, "effectiveHard": {"memory": "700Gi"}})[0] == "HardInForceChanged"  # type: ignore[index]
    assert boundary(opened, opened) is None and boundary({}, {}) is None
    assert boundary({}, closed) is None  # a first write outside every window
    assert boundary(closed, {}) is None  # windows removed outside every window
    assert boundary(opened, {}) == ("WindowClosed", "window 'deadline' closed: removed from spec.windows, "
                                                    "spec.hard in force")
