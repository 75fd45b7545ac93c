"""quota.pricing.pricer: every charge rule of docs/design.md ("The charge of a claim"), one table row each."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from fractions import Fraction
from typing import Any

import pytest

from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admitter, claim_ref
from quota.admission.annotating import read_annotations
from quota.devices.inventory import Inventory
from quota.objects.allocationrecord import (
    ALLOCATED_CHARGE_ANNOTATION,
    ALLOCATION_RESULTS_ANNOTATION,
    by_device,
    record_in_step,
    recorded_devices,
)
from quota.objects.claims import CHARGE_ANNOTATION, parse_claim, parse_device_class, pod_owner
from quota.objects.claimspec import ClaimError, DeviceRequirement, Toleration, unnamed
from quota.pricing.priced import Pricing, at_least_recorded
from quota.pricing.pricer import Pricer
from quota.quotas.scope import DeviceSelection, Scope
from quota.values.model import Charge, DeviceClass, DeviceClassName, DeviceKey, Mode, RecordKey

from ...builders import (
    GiB,
    MiB,
    exactly,
    first_available,
    make_class,
    make_claim,
    make_device,
    make_slice,
    record_for,
    request,
    result,
)

D = "gpu.example.com"
SHARE_POLICY = {"default": "48Gi", "validRange": {"min": "1Mi", "max": "48Gi", "step": "1Mi"}}


def inventory() -> Inventory:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("n1", [
        make_device(f"gpu-{i}", memory="80Gi", attrs={"type": "gpu", "model": "h100"}) for i in range(4)
    ], node="node-1"))
    inv.add_or_update_slice(make_slice("n2", [
        make_device(f"gpu-{i}", memory="141Gi", attrs={"type": "gpu", "model": "h200"}) for i in range(2)
    ], node="node-2"))
    inv.add_or_update_slice(make_slice("n3", [
        *(make_device(f"mig-{i}", memory="4864Mi", attrs={"type": "mig", "profile": "1g.5gb"}) for i in range(7)),
        make_device("shared-0", memory="48Gi", attrs={"type": "shared"}, shared=True, policy=SHARE_POLICY),
        make_device("tainted-0", memory="40Gi", attrs={"type": "tainted"},
                    taints=[{"key": "broken", "value": "true", "effect": "NoSchedule"}]),
    ], node="node-3"))
    return inv


CLASSES = {
    c.name: c
    for c in map(parse_device_class, [
        make_class("gpu", f"device.driver == '{D}' && device.attributes['{D}'].type == 'gpu'"),
        make_class("mig", f"device.attributes['{D}'].type == 'mig'"),
        make_class("shared", "device.allowMultipleAllocations"),
        make_class("tainted", f"device.attributes['{D}'].type == 'tainted'"),
        make_class("any"),
        make_class("empty", "false"),
        make_class("broken-class", f"device.attributes['{D}'].nosuchkey == 'x'"),
    ])
}


def price(*requests: dict[str, Any], mode: Mode = "conservative", inv: Inventory | None = None) -> Pricing:
    pricer = Pricer(inv or inventory(), CLASSES)
    return pricer.estimate(parse_claim(make_claim("c", *requests)).spec, mode=mode)


H100 = f"device.attributes['{D}'].model == 'h100'"


@pytest.mark.parametrize(
    ("requests", "mode", "memory", "devices", "candidates"),
    [
        # ExactCount: count x the largest candidate (conservative) or the smallest (optimistic).
        ([request("r", exactly("gpu", count=2))], "conservative", 2 * 141 * GiB, 2, 6),
        ([request("r", exactly("gpu", count=2))], "optimistic", 2 * 80 * GiB, 2, 6),
        ([request("r", exactly("gpu", H100))], "conservative", 80 * GiB, 1, 4),
        ([request("r", exactly("mig", count=3))], "conservative", 3 * 4864 * MiB, 3, 7),
        # Candidates must satisfy capacity.requests.
        ([request("r", exactly("gpu", capacity={"memory": "100Gi"}))], "optimistic", 141 * GiB, 1, 2),
        # All: per dimension, the largest per-node sum (node-1's 4 x 80Gi); optimistic: the
        # smallest (node-2's 2 x 141Gi).
        ([request("r", exactly("gpu", mode="All"))], "conservative", 4 * 80 * GiB, 4, 6),
        ([request("r", exactly("gpu", mode="All"))], "optimistic", 2 * 141 * GiB, 2, 6),
        # firstAvailable: per-dimension max (conservative) / min (optimistic) over subrequests.
        ([first_available("r", ("big", exactly("gpu", count=1)), ("many", exactly("mig", count=4)))],
         "conservative", 141 * GiB, 4, 6),
        ([first_available("r", ("big", exactly("gpu", count=1)), ("many", exactly("mig", count=4)))],
         "optimistic", 4 * 4864 * MiB, 1, 6),
        # Shared device: the request rounded up by the policy (1Mi step), or the policy default.
        ([request("r", exactly("shared", capacity={"memory": "20Gi"}))], "conservative", 20 * GiB, 1, 1),
        ([request("r", exactly("shared", capacity={"memory": "1000000000"}))], "conservative", 954 * MiB, 1, 1),
        ([request("r", exactly("shared"))], "conservative", 48 * GiB, 1, 1),
        # adminAccess: free, whatever it matches.
        ([request("r", exactly("gpu", count=2, admin=True))], "conservative", 0, 0, 6),
        # Requests add up.
        ([request("a", exactly("gpu", H100)), request("b", exactly("mig"))], "conservative", 80 * GiB + 4864 * MiB, 2, None),
        # A tainted device is no candidate unless tolerated.
        ([request("r", exactly("tainted", tolerations=[{"key": "broken", "operator": "Exists"}]))], "conservative", 40 * GiB, 1, 1),
    ],
)
def test_estimates(requests: list[dict[str, Any]], mode: Mode, memory: int, devices: int, candidates: int | None) -> None:
    pricing = price(*requests, mode=mode)
    assert pricing.errors == ()
    assert pricing.total == Charge(memory, devices)
    if candidates is not None:
        assert pricing.requests[0].candidates == candidates


def test_no_candidate_is_charged_at_the_largest_class_device_with_a_warning() -> None:
    pricing = price(request("r", exactly("gpu", "false", count=2)))
    assert pricing.total == Charge(2 * 141 * GiB, 2)
    assert pricing.requests[0].candidates == 0
    assert pricing.warnings == ("request r: no device matches now; charged as 2 device(s) at the largest per-device "
                                "charge in class gpu (141Gi each)",)


def shared_inventory() -> Inventory:
    """An 80Gi GPU shared in 1Gi steps whose requestPolicy default is 8Gi, one with no
    policy, and an exclusive 40Gi GPU, each in a class of its own and all in `any`."""
    inv = Inventory()
    inv.add_or_update_slice(make_slice("n", [
        make_device("share-0", memory="80Gi", attrs={"type": "shared"}, shared=True,
                    policy={"default": "8Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}}),
        make_device("nopolicy-0", memory="64Gi", attrs={"type": "nopolicy"}, shared=True),
        make_device("gpu-0", memory="40Gi", attrs={"type": "gpu"}),
    ], node="node-1"))
    return inv


SHARED_ONLY = {c.name: c for c in map(parse_device_class, [
    make_class("shared", f"device.attributes['{D}'].type == 'shared'"),
    make_class("nopolicy", f"device.attributes['{D}'].type == 'nopolicy'"),
    make_class("both", f"device.attributes['{D}'].type in ['shared', 'gpu']"),
])}


@pytest.mark.parametrize(("cls", "capacity", "count", "memory"), [
    # Asks for no memory: the policy default of the shared device, not its 80Gi.
    ("shared", None, 2, 2 * 8 * GiB),
    # Asks for 20.5Gi: rounded up by the policy to 21Gi, what it would hold on that device.
    ("shared", {"memory": "20992Mi"}, 1, 21 * GiB),
    # Asks for more than the device has: it could never be rounded onto it, the whole device.
    ("shared", {"memory": "100Gi"}, 1, 80 * GiB),
    # A shared device without a requestPolicy: unrequested capacity is consumed whole
    # (fillEmptyRequest in k8s.io/dynamic-resource-allocation structured/internal/*/
    # consumable_capacity.go), so the no-memory request costs all of its 64Gi.
    ("nopolicy", None, 1, 64 * GiB),
    # The largest per-device charge of the class: the exclusive 40Gi GPU beats the 8Gi default.
    ("both", None, 1, 40 * GiB),
])
def test_no_candidate_prices_a_shared_device_at_the_charge_this_request_would_have_on_it(
        cls: str, capacity: dict[str, str] | None, count: int, memory: int) -> None:
    req = request("r", exactly(cls, "false", count=count, capacity=capacity))
    pricing = Pricer(shared_inventory(), SHARED_ONLY).estimate(parse_claim(make_claim("c", req)).spec)
    assert pricing.requests[0].candidates == 0 and "no device matches now" in pricing.warnings[0]
    assert pricing.total == Charge(memory, count)


def test_untolerated_taint_means_no_candidate() -> None:
    pricing = price(request("r", exactly("tainted")))
    assert pricing.requests[0].candidates == 0 and "no device matches now" in pricing.warnings[0]


def test_a_class_without_devices_charges_devices_only() -> None:
    assert price(request("r", exactly("empty", count=3))).total == Charge(0, 3)


def test_too_few_candidates_warns() -> None:
    pricing = price(request("r", exactly("gpu", H100, count=6)))
    assert pricing.total == Charge(6 * 80 * GiB, 6)
    assert pricing.warnings == ("request r: only 4 device(s) match now, 6 requested",)


def test_unknown_class_is_an_error_naming_the_class() -> None:
    pricing = price(request("r", exactly("nope")))
    # A tenant cannot create a DeviceClass: what it can do first, then whom to ask.
    assert pricing.errors == ("request r: device class 'nope' not found: fix deviceClassName (kubectl get "
                              "deviceclasses lists them), or ask the cluster admin to create the DeviceClass",)


def test_cel_compile_error_is_reported_with_the_selector_index() -> None:
    pricing = price(request("r", exactly("gpu", "true", "device.attributes[")))
    assert len(pricing.errors) == 1 and pricing.errors[0].startswith("request r: selector #1: CEL compile error")


def test_cel_runtime_error_is_reported_like_the_scheduler() -> None:
    pricing = price(request("r", exactly("broken-class")))
    (error,) = pricing.errors
    assert error.startswith("request r: class broken-class #0: CEL runtime error") and "nosuchkey" in error


def test_runtime_errors_only_on_devices_the_class_selected() -> None:
    # The class already filtered to GPUs, which all have `model`: no error, as in the scheduler.
    pricing = price(request("r", exactly("gpu", f"device.attributes['{D}'].model == 'h200'")))
    assert pricing.errors == () and pricing.total == Charge(141 * GiB, 1)


def test_scoped_charge_of_first_available() -> None:
    pricing = price(first_available("r", ("big", exactly("gpu")), ("small", exactly("mig", count=2))))
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("mig")}))) == Charge(2 * 4864 * MiB, 2)
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("gpu")}))) == Charge(141 * GiB, 1)
    assert pricing.charge_for(Scope()) == Charge(141 * GiB, 2)


def test_estimates_follow_inventory_changes() -> None:
    inv = inventory()
    pricer = Pricer(inv, CLASSES)
    spec = parse_claim(make_claim("c", request("r", exactly("gpu")))).spec
    assert pricer.estimate(spec).total == Charge(141 * GiB, 1)
    inv.delete_slice("n2")
    assert pricer.estimate(spec).total == Charge(80 * GiB, 1)


def test_class_edits_are_seen() -> None:
    classes: dict[DeviceClassName, DeviceClass] = dict(CLASSES)
    pricer = Pricer(inventory(), classes)
    spec = parse_claim(make_claim("c", request("r", exactly("gpu")))).spec
    assert pricer.estimate(spec).total.memory == 141 * GiB
    classes[DeviceClassName("gpu")] = parse_device_class(make_class("gpu", f"device.attributes['{D}'].type == 'gpu'", H100))
    assert pricer.estimate(spec).total.memory == 80 * GiB


# -- exact pricing from status.allocation ---------------------------------------------


def exact(allocation: list[dict[str, Any]], *requests: dict[str, Any],
          annotations: dict[str, str] | None = None) -> Pricing:
    reqs = requests or (request("r", exactly("gpu")),)
    claim = parse_claim(make_claim("c", *reqs, allocation=allocation, annotations=annotations))
    return Pricer(inventory(), CLASSES).exact(claim)


def test_exact_charge_is_the_sum_of_device_memories() -> None:
    pricing = exact([result("r", "gpu-0", pool="node-2"), result("r", "gpu-1", pool="node-1")],
                    request("r", exactly("gpu", count=2)))
    assert pricing.exact and pricing.total == Charge((141 + 80) * GiB, 2)


def test_exact_charge_uses_consumed_capacity_on_shared_devices() -> None:
    pricing = exact([result("r", "shared-0", pool="node-3", consumed={"memory": "20Gi"})])
    assert pricing.total == Charge(20 * GiB, 1)
    qualified = exact([result("r", "shared-0", pool="node-3", consumed={f"{D}/memory": "7Gi"})])
    assert qualified.total == Charge(7 * GiB, 1)


def test_exact_consumed_capacity_cannot_undercut_the_device() -> None:
    # Not shared: allocated whole, whatever consumedCapacity says.
    assert exact([result("r", "gpu-0", pool="node-2", consumed={"memory": "0"})]).total == Charge(141 * GiB, 1)
    # One capacity named with and without prefix: the larger counts, in either order.
    both = {"memory": "20Gi", f"{D}/memory": "0"}
    assert exact([result("r", "shared-0", pool="node-3", consumed=both)]).total == Charge(20 * GiB, 1)
    # Below the policy's minimum: what the device sets aside for it.
    assert exact([result("r", "shared-0", pool="node-3", consumed={"memory": "0"})]).total == Charge(MiB, 1)


def test_exact_device_never_seen_is_charged_as_the_largest_of_its_class() -> None:
    for gone in (result("r", "gpu-9", pool="node-9"), result("r", "gpu-0", pool="node-2", driver="other.example.com")):
        pricing = exact([gone])
        assert pricing.total == Charge(141 * GiB, 1)
        assert "no charge recorded" in pricing.warnings[0]


def test_results_must_name_a_request_of_the_claim() -> None:
    for name in ("bogus", "r"):  # "r" is a firstAvailable parent: the class would be ambiguous
        with pytest.raises(ClaimError, match=r"results\[0\]\.request: '(bogus|r)' is not the name"):
            parse_claim(make_claim("c", first_available("r", ("big", exactly("gpu"))), allocation=[result(name, "gpu-0")]))


def test_exact_admin_access_is_free() -> None:
    assert exact([result("r", "gpu-0", admin=True)]).total == Charge()


def test_exact_first_available_is_attributed_to_the_chosen_subrequest_class() -> None:
    pricing = exact([result("r/small", "mig-0", pool="node-3")],
                    first_available("r", ("big", exactly("gpu")), ("small", exactly("mig"))))
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("mig")}))) == Charge(4864 * MiB, 1)
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("gpu")}))) == Charge()


def test_vanished_device_keeps_its_recorded_charge() -> None:
    gone = result("r", "gpu-9", pool="node-9")
    record = record_for({RecordKey("r", DeviceKey(D, "node-9", "gpu-9")): 123})
    assert exact([gone], annotations=record).total == Charge(123, 1)
    from_annotation = exact([gone], annotations={"draquota.io/charge": '{"memory": 1000, "devices": 1}'})
    assert from_annotation.total == Charge(1000, 1)
    assert "vanished from the inventory" in from_annotation.warnings[0]


# -- a pending claim priced again after a restart -------------------------------------------


def _recorded(claim: dict[str, Any], charge: Charge) -> dict[str, Any]:
    claim["metadata"]["annotations"] = {"draquota.io/charge": f'{{"memory":{charge.memory},"devices":{charge.devices}}}'}
    return claim


def test_a_restart_reserves_a_pending_claim_at_no_less_than_its_admission_charged() -> None:
    """The class's largest devices (141Gi) leave the inventory while a claim admitted at
    their price is pending: the replica that admitted it still reserves 141Gi; one that
    starts now must reserve the same, not the new estimate (80Gi), else `reserved`
    depends on whether the leader restarted (tests/e2e/test_crash_safety.py found it)."""
    before = inventory()
    running = Admitter(Pricer(before, CLASSES), Ledger())
    claim = make_claim("c", request("r", exactly("gpu")))
    admitted = running.admit_claim(parse_claim(claim), namespace_labels=None)
    assert admitted.allowed and admitted.pricing.total == Charge(141 * GiB, 1)
    persisted = parse_claim(_recorded(claim, admitted.pricing.total))  # the mutating webhook's annotation

    after = inventory()
    after.delete_slice("n2")  # both 141Gi GPUs gone
    restarted = Admitter(Pricer(after, CLASSES), Ledger())
    assert restarted.price(persisted).total == Charge(80 * GiB, 1)  # what it estimates now
    restarted.reserve_existing(persisted)
    held = restarted.ledger.entry(claim_ref(persisted))
    assert held is not None and not held.allocated
    assert held.pricing["conservative"].total == Charge(141 * GiB, 1)
    # Scoped quotas see it in its class, and nowhere else.
    assert held.pricing["conservative"].charge_for(Scope(frozenset({DeviceClassName("gpu")}))) == Charge(141 * GiB, 1)
    assert held.pricing["conservative"].charge_for(Scope(frozenset({DeviceClassName("mig")}))) == Charge()


@pytest.mark.parametrize(("recorded", "expected"), [
    (None, Charge(80 * GiB, 1)),  # nothing recorded: the estimate
    (Charge(141 * GiB, 1), Charge(141 * GiB, 1)),  # recorded above: what was reserved
    (Charge(0, 0), Charge(80 * GiB, 1)),  # below the estimate (not our annotation): the estimate
    (Charge(100 * GiB, 0), Charge(100 * GiB, 1)),  # per dimension
])
def test_at_least_recorded(recorded: Charge | None, expected: Charge) -> None:
    pricing = Pricer(inventory(), CLASSES).estimate(parse_claim(make_claim("c", request("r", exactly(
        "gpu", f"device.attributes['{D}'].model == 'h100'")))).spec)
    assert pricing.total == Charge(80 * GiB, 1)
    assert at_least_recorded(pricing, recorded).total == expected


def test_at_least_recorded_leaves_a_claim_of_several_classes_to_its_estimate() -> None:
    spec = parse_claim(make_claim("c", request("a", exactly("gpu")), request("b", exactly("mig")))).spec
    pricing = Pricer(inventory(), CLASSES).estimate(spec)
    assert at_least_recorded(pricing, Charge(10**15, 9)) == pricing


# -- the allocation record (draquota.io/allocated-charge) -----------------------------------


def test_a_device_that_vanishes_keeps_its_exact_charge_in_the_running_and_in_a_restarted_process() -> None:
    """Admitted at 2 x 141Gi, allocated one 80Gi and one 141Gi GPU (221Gi); then the 141Gi
    GPU's slice goes. Without the record a later event or a restart re-priced it from
    the admission charge: 80 + (282 - 80) = 282Gi (tests/e2e/test_crash_safety.py)."""
    two = request("r", exactly("gpu", count=2))
    allocation = [result("r", "gpu-0", pool="node-1"), result("r", "gpu-0", pool="node-2")]
    admission = {"draquota.io/charge": f'{{"memory":{282 * GiB},"devices":2}}'}
    before = Pricer(inventory(), CLASSES)
    claim = parse_claim(make_claim("c", two, allocation=allocation, annotations=admission))
    assert before.exact(claim).total == Charge(221 * GiB, 2)
    record = before.allocation_record(claim)
    assert record == {RecordKey("r", DeviceKey(D, "node-1", "gpu-0")): 80 * GiB,
                      RecordKey("r", DeviceKey(D, "node-2", "gpu-0")): 141 * GiB}

    gone = inventory()
    gone.delete_slice("n2")
    after = Pricer(gone, CLASSES)
    assert after.exact(claim).total == Charge(282 * GiB, 2)  # no record: the admission charge's share
    recorded = parse_claim(make_claim("c", two, allocation=allocation, annotations={**admission, **record_for(record)}))
    assert dict(recorded.recorded_devices) == by_device(record)  # one class: by device is all it takes
    priced = after.exact(recorded)
    assert priced.total == Charge(221 * GiB, 2) and priced.warnings == ()
    # What the record should say now: unchanged, the vanished device's charge kept.
    assert after.allocation_record(recorded) == record


def test_the_record_follows_the_allocation_and_is_exact() -> None:
    pricer = Pricer(inventory(), CLASSES)
    shared = parse_claim(make_claim("c", request("r", exactly("shared")), allocation=[
        result("r", "shared-0", pool="node-3", consumed={"memory": "20Gi"})]))
    assert [(key.request, key.device.device, memory) for key, memory in pricer.allocation_record(shared).items()] == \
        [("r", "shared-0", 20 * GiB)]
    assert pricer.allocation_record(parse_claim(make_claim("c", request("r", exactly("gpu")), allocation=[
        result("r", "gpu-0", admin=True)]))) == {}  # adminAccess is free: nothing to keep
    stale = record_for({RecordKey("r", DeviceKey(D, "node-9", "gpu-9")): 5})
    moved = parse_claim(make_claim("c", request("r", exactly("gpu")), allocation=[result("r", "gpu-1", pool="node-1")],
                                   annotations=stale))
    assert pricer.allocation_record(moved) == {RecordKey("r", DeviceKey(D, "node-1", "gpu-1")): 80 * GiB}  # old devices dropped
    assert pricer.allocation_record(parse_claim(make_claim("c", request("r", exactly("gpu"))))) == {}


def test_a_deallocated_claims_record_prices_its_last_allocation_as_exact_did() -> None:
    """`Pricer.recorded`: what a process started after the deallocation counts, the same as
    `exact` priced the allocation (by device and by class); for a record an older release
    wrote (by device), None where it cannot say which class a device was charged to."""
    pricer = Pricer(inventory(), CLASSES)
    spec = make_claim("c", request("a", exactly("gpu")), request("b", exactly("gpu")))
    allocation = [result("a", "gpu-0"), result("b", "gpu-1")]
    exact = pricer.exact(parse_claim(make_claim("c", *spec["spec"]["devices"]["requests"], allocation=allocation)))
    record = record_for(dict(exact.record))
    freed = parse_claim(make_claim("c", *spec["spec"]["devices"]["requests"], annotations=record))
    last = pricer.recorded(freed)
    assert last is not None and last.exact
    assert last.total == exact.total == Charge(2 * 80 * GiB, 2)
    assert [last.charge_for(Scope(classes=frozenset({DeviceClassName(c)}))) for c in ("gpu", "mig")] == [exact.total, Charge()]
    assert pricer.recorded(parse_claim(spec)) is None  # no record: never allocated, or not recorded yet
    # Requests of two classes, recorded by device (an older release): each device is charged
    # to the one class selecting it.
    two_classes = parse_claim(make_claim("c", request("a", exactly("gpu")), request("b", exactly("mig")),
                                         annotations=record_for(by_device(dict(exact.record)))))
    split = pricer.recorded(two_classes)
    assert split is not None and split.total == exact.total
    assert [split.charge_for(Scope(classes=frozenset({DeviceClassName(c)}))) for c in ("gpu", "mig")] == \
        [exact.total, Charge()]
    # A device two of its classes select could have served either request: the record says which.
    either = make_claim("c", request("a", exactly("gpu")), request("b", exactly("any")), allocation=allocation)
    both = pricer.exact(parse_claim(either))
    by_class = [Scope(classes=frozenset({DeviceClassName(c)})) for c in ("gpu", "any")]
    assert [both.charge_for(s) for s in by_class] == [Charge(80 * GiB, 1)] * 2
    freed_either = parse_claim(make_claim("c", request("a", exactly("gpu")), request("b", exactly("any")),
                                          annotations=record_for(dict(both.record), several_classes=True)))
    read = pricer.recorded(freed_either)
    assert read is not None and [read.charge_for(s) for s in by_class] == [Charge(80 * GiB, 1)] * 2
    # Recorded by device (an older release): not told.
    old = {RecordKey("", key.device): memory for key, memory in both.record}
    assert pricer.recorded(replace(freed_either, recorded_devices=tuple(old.items()))) is None
    allocated = make_claim("c", request("a", exactly("gpu")), allocation=[result("a", "gpu-0")], annotations=record)
    assert pricer.recorded(parse_claim(allocated)) is None  # allocated: `exact` prices it


def test_two_shares_of_one_device_are_two_results_of_the_record() -> None:
    """A device that allows several allocations, shared twice by one claim: recorded by
    device, the second share overwrote the first (the record charged 10Gi of 30Gi); the
    device's entry is their sum now."""
    pricer = Pricer(inventory(), CLASSES)
    shares = [result("r", "shared-0", pool="node-3", consumed={"memory": amount}) for amount in ("10Gi", "20Gi")]
    shares[1]["shareID"] = "6ba7b810-9dad-11d1-80b4-00c04fd430c9"
    claim = parse_claim(make_claim("c", request("r", exactly("shared", count=2)), allocation=shares))
    record = pricer.allocation_record(claim)
    assert sorted(record.values()) == [10 * GiB, 20 * GiB]
    freed = parse_claim(make_claim("c", request("r", exactly("shared", count=2)), annotations=record_for(record)))
    last = pricer.recorded(freed)
    # A claim of one class is recorded by device: its shares of one device read as one.
    assert pricer.exact(claim).total == Charge(30 * GiB, 2)
    assert last is not None and last.total == Charge(30 * GiB, 1)


def test_an_older_release_s_record_is_rewritten_only_where_it_cannot_be_read() -> None:
    """A record by device (an older release) reads the same on a claim of one class: the
    leader leaves it (an upgrade does not patch every allocated claim); on a claim of
    several classes it writes the record by request."""
    pricer = Pricer(inventory(), CLASSES)
    admitter = Admitter(pricer, Ledger())

    def due(*requests: dict[str, Any], allocation: list[dict[str, Any]]) -> dict[str, str]:
        exact = pricer.allocation_record(parse_claim(make_claim("c", *requests, allocation=allocation)))
        current = {CHARGE_ANNOTATION: '{"memory":1,"devices":1}', **record_for(by_device(exact))}
        claim = parse_claim(make_claim("c", *requests, allocation=allocation, annotations=current))
        return admitter.annotations_due(claim, current)

    one = [request("a", exactly("gpu")), request("b", exactly("gpu"))]
    assert due(*one, allocation=[result("a", "gpu-0"), result("b", "gpu-1")]) == {}
    assert not record_in_step(parse_claim(make_claim("c", *one)), {RecordKey("a", DeviceKey(D, "node-1", "gpu-0")): 1})
    mixed = [request("a", exactly("gpu")), request("b", exactly("mig"))]
    allocation = [result("a", "gpu-0"), result("b", "mig-0", pool="node-3")]
    record = pricer.allocation_record(parse_claim(make_claim("c", *mixed, allocation=allocation)))
    assert all(key.request for key in record)
    assert due(*mixed, allocation=allocation) == record_for(record, several_classes=True)


@pytest.mark.parametrize("raw", [
    None, "", "[]", "{", '{"a/b": 1}', '{"d/p/x": -1}', '{"d/p/x": 1.5}', '{"d/p/x": "1"}',
    '{"d/p/x": 99999999999999999999}', '{"d/p/x": NaN}', "x" * 20000, '{":d/p/x": 1}', '{"r:d/p/x#": 1}',
    '{"r:d/p": 1}', '{"r:" : 1}', '{"d/p/x": ' + "1" * 40000 + "}",
    '{"r:d/p/x": 1}',  # a key by result, in the annotation by device
    '{"d/p/x": 1, "r:d/p/x": 1}',  # both forms (read, they would count the device twice)
])
def test_a_record_that_is_not_ours_is_ignored(raw: str | None) -> None:
    assert recorded_devices({ALLOCATED_CHARGE_ANNOTATION: raw}) == ()


SHARED = DeviceKey(D, "node-3", "shared-0")


def test_the_annotation_by_device_is_what_a_release_before_records_by_result_reads() -> None:
    """A record by result in `draquota.io/allocated-charge` would read, on a replica of the
    release before, as devices of a driver named "r:gpu.example.com": 0 for a quota scoped
    by driver. That annotation stays by device (the sum of a device's results), and the
    results go in their own."""
    record = {RecordKey("a", DeviceKey(D, "node-1", "gpu-0")): 80 * GiB,
              RecordKey("b", SHARED, "s-1"): 10 * GiB, RecordKey("b", SHARED, "s-2"): 20 * GiB}
    written = record_for(record, several_classes=True)
    assert json.loads(written[ALLOCATED_CHARGE_ANNOTATION]) == {f"{D}/node-1/gpu-0": 80 * GiB, f"{SHARED}": 30 * GiB}
    assert dict(recorded_devices(written, requests={"a", "b"})) == record
    assert dict(recorded_devices(written)) == by_device(record)  # a claim of one class reads it by device


def test_a_record_by_result_counts_only_where_the_one_by_device_agrees() -> None:
    """A leader of the release before rewrites the annotation by device alone, for a newer
    allocation: the one by result then says an older one, and is not read."""
    record = {RecordKey("a", DeviceKey(D, "node-1", "gpu-0")): 80 * GiB}
    newer = {RecordKey("", DeviceKey(D, "node-2", "gpu-0")): 141 * GiB}
    written = {**record_for(record, several_classes=True), **record_for(newer)}
    assert dict(recorded_devices(written, requests={"a"})) == newer
    del written[ALLOCATED_CHARGE_ANNOTATION]
    assert recorded_devices(written, requests={"a"}) == ()  # the one by result alone is not a record


def test_an_older_records_collapsed_shares_of_a_vanished_device_are_not_rewritten_larger() -> None:
    """Two shares (10Gi, 20Gi) of one shared device, recorded by the release before once,
    20Gi (the second share overwrote the first). The device leaves the inventory: were each
    share to take the device's 20Gi, 40Gi would be recorded while the allocation says 30Gi,
    and a replica started after the deallocation would count 40Gi. A device's entry by
    device stands for one result only where it has no other."""
    shares = [result("r", "shared-0", pool="node-3", consumed={"memory": a}) for a in ("10Gi", "20Gi")]
    shares[1]["shareID"] = "6ba7b810-9dad-11d1-80b4-00c04fd430c9"
    gone = inventory()
    gone.delete_slice("n3")
    pricer = Pricer(gone, CLASSES)
    claim = parse_claim(make_claim("c", request("r", exactly("shared", count=2)), allocation=shares,
                                   annotations=record_for({RecordKey("", SHARED): 20 * GiB})))
    assert pricer.exact(claim).total == Charge(30 * GiB, 2)
    assert sorted(pricer.allocation_record(claim).values()) == [10 * GiB, 20 * GiB]


GPU0 = DeviceKey(D, "node-1", "gpu-0")


def test_a_results_annotation_on_a_claim_of_one_class_is_not_read() -> None:
    """The release before neither guards nor reads `draquota.io/allocation-results`:
    a tenant could set it before the upgrade, naming a request the claim does not have
    (class ""), with the devices' memory (public). On a claim of one class it is not read,
    nor on one of several where it names a request the claim does not have."""
    pricer = Pricer(inventory(), CLASSES)
    forged = {ALLOCATION_RESULTS_ANNOTATION: allocated_json({RecordKey("zzz", GPU0): 80 * GiB})}
    one = make_claim("c", request("r", exactly("gpu")), annotations={**record_for({RecordKey("r", GPU0): 80 * GiB}),
                                                                      **forged})
    last = pricer.recorded(parse_claim(one))
    assert last is not None
    assert last.charge_for(Scope(classes=frozenset({DeviceClassName("gpu")}))) == Charge(80 * GiB, 1)
    two = [request("a", exactly("gpu")), request("b", exactly("mig"))]
    freed = parse_claim(make_claim("c", *two, annotations={**record_for({RecordKey("a", GPU0): 80 * GiB}), **forged}))
    assert all(not key.request for key, _ in freed.recorded_devices)  # by device, the class told by the selectors
    split = pricer.recorded(freed)
    assert split is not None and split.charge_for(Scope(classes=frozenset({DeviceClassName("gpu")}))) == \
        Charge(80 * GiB, 1)


def test_a_vanished_device_keeps_its_charge_by_device_where_the_results_do_not_name_it() -> None:
    """A result missing from the record by result (the results say an older allocation)
    falls back on the record's entry by device once its device leaves the inventory:
    priced from the admission charge instead, it would be 80Gi -> 1, and the leader would
    write that."""
    gone = inventory()
    gone.delete_slice("n1")
    pricer = Pricer(gone, CLASSES)
    spec = [request("a", exactly("gpu")), request("b", exactly("mig"))]
    current = {CHARGE_ANNOTATION: '{"memory":1,"devices":1}',
               **record_for({RecordKey("b", GPU0): 80 * GiB}, several_classes=True)}
    claim = parse_claim(make_claim("c", *spec, allocation=[result("a", "gpu-0")], annotations=current))
    assert pricer.exact(claim).total == Charge(80 * GiB, 1)
    assert json.loads(Admitter(pricer, Ledger()).annotations_due(claim, current)[ALLOCATED_CHARGE_ANNOTATION]) == \
        {str(GPU0): 80 * GiB}


def test_an_admin_access_result_on_the_same_device_leaves_its_record_readable() -> None:
    """An adminAccess result is free and not recorded: it is no second share
    of the device, whose entry by device stands for the one charged result."""
    spec = [request("a", exactly("gpu")), request("m", exactly("gpu", admin=True))]
    allocation = [result("a", "gpu-0"), result("m", "gpu-0", admin=True)]
    truth = Pricer(inventory(), CLASSES).allocation_record(parse_claim(make_claim("c", *spec, allocation=allocation)))
    assert truth == {RecordKey("a", GPU0): 80 * GiB}
    gone = inventory()
    gone.delete_slice("n1")
    pricer = Pricer(gone, CLASSES)
    current = {CHARGE_ANNOTATION: '{"memory":1,"devices":1}', **record_for(truth)}
    claim = parse_claim(make_claim("c", *spec, allocation=allocation, annotations=current))
    assert pricer.exact(claim).total == Charge(80 * GiB, 1)
    assert Admitter(pricer, Ledger()).annotations_due(claim, current) == {}


def allocated_json(record: dict[RecordKey, int]) -> str:
    return json.dumps({str(k): v for k, v in record.items()})


def test_a_share_of_a_vanished_device_keeps_the_rounded_charge_its_record_kept() -> None:
    """A share consumed off the policy's step is charged rounded up to it while the device
    is there; once it is gone nothing rounds it, so the record's rounded charge is kept
    rather than the lower unrounded amount charged and written over it."""
    share = [result("r", "shared-0", pool="node-3", consumed={"memory": "1000000000"})]
    spec = request("r", exactly("shared"))
    record = Pricer(inventory(), CLASSES).allocation_record(parse_claim(make_claim("c", spec, allocation=share)))
    assert list(record.values()) == [954 * MiB]  # 1e9 bytes rounded up to the 1Mi step
    gone = inventory()
    gone.delete_slice("n3")
    pricer = Pricer(gone, CLASSES)
    claim = parse_claim(make_claim("c", spec, allocation=share, annotations=record_for(record)))
    assert pricer.exact(claim).total == Charge(954 * MiB, 1)
    assert pricer.allocation_record(claim) == record


def test_a_claim_of_one_class_reads_the_same_by_device_and_by_result() -> None:
    """On a claim of one class every scope (by driver, by selector, by class)
    counts a record by device as the allocation, so none is rewritten by result."""
    pricer = Pricer(inventory(), CLASSES)
    selections = (DeviceSelection(drivers=frozenset({D})), DeviceSelection(drivers=frozenset({"x.example.com"})),
                  DeviceSelection(expressions=(f"device.attributes['{D}'].model == 'h100'",)))
    spec = [first_available("a", ("big", exactly("any")), ("small", exactly("any"))), request("b", exactly("any"))]
    allocation = [result("a/small", "mig-0", pool="node-3"), result("b", "gpu-1", pool="node-2")]
    exact = pricer.exact(parse_claim(make_claim("c", *spec, allocation=allocation)), selections=selections)
    freed = parse_claim(make_claim("c", *spec, annotations=record_for(dict(exact.record))))
    assert record_in_step(freed, dict(exact.record)) and all(not key.request for key, _ in freed.recorded_devices)
    last = pricer.recorded(freed, selections=selections)
    assert last is not None
    scopes = [Scope(devices=s) for s in selections] + [Scope(classes=frozenset({DeviceClassName("any")})), Scope()]
    assert [last.charge_for(s) for s in scopes] == [exact.charge_for(s) for s in scopes]


@pytest.mark.parametrize("key", [
    RecordKey("r", DeviceKey(D, "node-1/part-a", "gpu-0")),  # a pool name with slashes
    RecordKey("r/small", DeviceKey(D, "node-1", "gpu-0")),  # a subrequest
    RecordKey("r", DeviceKey(D, "node-1", "gpu-0"), "8c4d5b6e-0000-4000-8000-000000000001"),  # a share
    RecordKey("", DeviceKey(D, "node-1/part-a", "gpu-0")),  # an older release's, by device
], ids=str)
def test_a_record_key_round_trips(key: RecordKey) -> None:
    record = {key: 7}
    assert dict(recorded_devices(record_for(record, several_classes=True), requests={"r", "r/small"})) == record


@pytest.mark.parametrize("name", [10**5000, None, ["x"], {"a": 1}], ids=["huge-int", "none", "list", "map"])
def test_a_pod_owner_whose_name_is_not_a_string_is_read_without_converting_it(name: Any) -> None:
    """The fuzzer's find: str() of a 5,000-digit int raises ValueError (Python's limit)."""
    claim = make_claim("c", request("r", exactly("gpu")))
    claim["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": "u-1",
                                             "controller": True}]
    assert pod_owner(claim) == ("", "u-1")
    assert parse_claim(claim).owner == "u-1"


def test_a_requirement_unnamed_is_the_same_requirement_without_its_name() -> None:
    # Pricing's cache key: built field by field, so every field must be carried over.
    req = DeviceRequirement("r/s", DeviceClassName("gpu"), ("true",), "All", 3, True, (("memory", Fraction(5)),),
                            (Toleration("k", "Equal", "v", "NoSchedule"),))
    assert all(getattr(req, f.name) != getattr(DeviceRequirement("", DeviceClassName("")), f.name)
               for f in fields(DeviceRequirement))  # every field set apart from its default
    assert unnamed(req) == replace(req, name="")
    assert unnamed(req, selectors=()) == replace(req, name="", selectors=())


def test_what_the_annotator_reads_of_annotations_answers_as_they_do() -> None:
    # A relist holds each claim's annotations until its swap: only what the annotator reads
    # of them (`read_annotations`), shared by the claims of one charge.
    pricer = Pricer(inventory(), CLASSES)
    admitter = Admitter(pricer, Ledger())
    allocation = [result("a", "gpu-0")]
    record = record_for(pricer.allocation_record(parse_claim(make_claim("c", request("a", exactly("gpu")),
                                                                         allocation=allocation))))
    for current in ({}, {"team": "x" * 1000}, {CHARGE_ANNOTATION: '{"memory":1,"devices":1}', "team": "y"},
                    {CHARGE_ANNOTATION: '{"memory":1,"devices":1}', **record}, record):
        for alloc in (allocation, None):
            claim = parse_claim(make_claim("c", request("a", exactly("gpu")), allocation=alloc, annotations=current))
            read = read_annotations(current)
            assert admitter.annotations_due(claim, read) == admitter.annotations_due(claim, current)
            assert admitter.annotations_may_be_due(claim, read) == admitter.annotations_may_be_due(claim, current)
            assert set(read) <= {CHARGE_ANNOTATION}
    charged = {CHARGE_ANNOTATION: "".join(['{"memory":2,', '"devices":1}'])}
    assert read_annotations(charged) is read_annotations(dict(charged))
    assert read_annotations({}) is read_annotations({"team": "a"})
