"""quota.accounting.showback: memory- and device-seconds integrated per (namespace, class, model), from plain values."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef
from quota.accounting.showback import OTHER, Accrual, Accrued, contributions
from quota.accounting.usage import device_labels
from quota.admission.admitter import Admitter, claim_ref
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.values.model import Charge, DeviceClassName, DeviceKey, Namespace

from ...builders import GiB, exactly, make_claim, make_class, make_device, make_slice, request, result

D = "gpu.nvidia.com"
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
NS, NS_B = Namespace("team-a"), Namespace("team-b")
GPU = DeviceClassName("gpu")
MEM = 80 * GiB


def held(memory: int = MEM, devices: int = 1, model: str = A100) -> list[tuple[DeviceClassName, str, Charge]]:
    return [(GPU, model, Charge(memory, devices))]


def totals(accrual: Accrual, now: float) -> dict[tuple[str, str, str], tuple[float, float]]:
    return {a.cell: (a.memory_seconds, a.device_seconds) for a in accrual.totals(now)}


def test_a_claim_held_for_an_hour_accrues_its_memory_times_an_hour() -> None:
    accrual = Accrual()
    accrual.lead(True, 0.0)
    accrual.count(ClaimRef("u1"), NS, held(), 100.0)
    assert totals(accrual, 1900.0) == {(NS, GPU, A100): (MEM * 1800.0, 1800.0)}
    accrual.uncount(ClaimRef("u1"), 3700.0)
    # Gone: what it held stays accrued, nothing more is added.
    assert totals(accrual, 5000.0) == {(NS, GPU, A100): (MEM * 3600.0, 3600.0)}


def test_cells_are_per_namespace_class_and_model_and_claims_add_up() -> None:
    accrual = Accrual()
    accrual.lead(True, 0.0)
    accrual.count(ClaimRef("u1"), NS, held(), 0.0)
    accrual.count(ClaimRef("u2"), NS, held(2 * MEM, 2), 10.0)
    accrual.count(ClaimRef("u3"), NS, held(model=H100), 20.0)
    accrual.count(ClaimRef("u4"), NS_B, held(10 * GiB, 1), 30.0)
    assert totals(accrual, 40.0) == {
        (NS, GPU, A100): (MEM * 40 + 2 * MEM * 30, 40.0 + 2 * 30),
        (NS, GPU, H100): (MEM * 20, 20.0),
        (NS_B, GPU, A100): (10 * GiB * 10, 10.0),
    }
    assert accrual.rates()[(NS, GPU, A100)] == Charge(3 * MEM, 3)


def test_an_update_replaces_what_the_claim_held_at_that_instant() -> None:
    accrual = Accrual()
    accrual.lead(True, 0.0)
    accrual.count(ClaimRef("u1"), NS, held(), 0.0)
    accrual.count(ClaimRef("u1"), NS, held(2 * MEM, 2), 10.0)  # the ledger counted it again, larger
    assert totals(accrual, 20.0) == {(NS, GPU, A100): (MEM * 10 + 2 * MEM * 10, 10.0 + 20.0)}
    # Taken out as it was last put in.
    accrual.uncount(ClaimRef("u1"), 20.0)
    assert accrual.rates() == {}


def test_only_while_leading_are_seconds_accrued() -> None:
    accrual = Accrual()
    accrual.count(ClaimRef("u1"), NS, held(), 0.0)
    assert totals(accrual, 50.0) == {}  # a follower exports nothing
    accrual.lead(True, 100.0)
    accrual.lead(False, 160.0)
    # Frozen at the 60 seconds it led, still exported (its last value scraped again).
    assert totals(accrual, 500.0) == {(NS, GPU, A100): (MEM * 60, 60.0)}
    accrual.lead(True, 1000.0)
    assert totals(accrual, 1010.0) == {(NS, GPU, A100): (MEM * 70, 70.0)}


def test_two_replicas_handing_over_never_hold_the_same_second() -> None:
    """The sum over replicas of what each accrued is the true integral: 0-1000 one leads,
    1000-2000 the other; each follows the same claims."""
    a, b = Accrual(), Accrual()
    for replica in (a, b):
        replica.count(ClaimRef("u1"), NS, held(), 0.0)
    a.lead(True, 0.0)
    a.lead(False, 1000.0)
    b.lead(True, 1000.0)
    for replica in (a, b):
        replica.uncount(ClaimRef("u1"), 1500.0)
    summed = sum(x.memory_seconds for replica in (a, b) for x in replica.totals(2000.0))
    assert summed == MEM * 1500


def test_a_cell_that_accrues_nothing_for_forget_after_is_no_longer_exported() -> None:
    accrual = Accrual(forget_after=3600.0)
    accrual.lead(True, 0.0)
    accrual.count(ClaimRef("u1"), NS, held(), 0.0)
    accrual.uncount(ClaimRef("u1"), 10.0)
    assert totals(accrual, 3609.0) == {(NS, GPU, A100): (MEM * 10, 10.0)}
    assert totals(accrual, 3610.0) == {}
    assert accrual.rates() == {}
    # Back: counted again from 0 (a counter reset, which increase() reads as one).
    accrual.count(ClaimRef("u2"), NS, held(), 4000.0)
    assert totals(accrual, 4001.0) == {(NS, GPU, A100): (MEM * 1.0, 1.0)}


def test_a_held_cell_is_never_forgotten_while_the_leader_accrues_it() -> None:
    accrual = Accrual(forget_after=10.0)
    accrual.lead(True, 0.0)
    accrual.count(ClaimRef("u1"), NS, held(), 0.0)
    assert totals(accrual, 100.0) == {(NS, GPU, A100): (MEM * 100, 100.0)}
    assert totals(accrual, 200.0) == {(NS, GPU, A100): (MEM * 200, 200.0)}


def test_namespaces_past_the_cap_are_accrued_as_other_and_a_freed_slot_is_reused() -> None:
    accrual = Accrual(namespaces=2, forget_after=100.0)
    accrual.lead(True, 0.0)
    for i, ns in enumerate(("a", "b", "c", "d")):
        accrual.count(ClaimRef(f"u{i}"), Namespace(ns), held(), 0.0)
    assert set(totals(accrual, 10.0)) == {("a", GPU, A100), ("b", GPU, A100), (OTHER, GPU, A100)}
    assert totals(accrual, 10.0)[(OTHER, GPU, A100)] == (2 * MEM * 10, 20.0)
    accrual.uncount(ClaimRef("u0"), 10.0)
    assert ("a", GPU, A100) not in totals(accrual, 110.0)  # forgotten: its slot is free
    accrual.count(ClaimRef("u9"), Namespace("e"), held(), 110.0)
    assert ("e", GPU, A100) in totals(accrual, 111.0)


def test_time_going_nowhere_accrues_nothing() -> None:
    accrual = Accrual()
    accrual.lead(True, 5.0)
    accrual.count(ClaimRef("u1"), NS, held(), 5.0)
    assert totals(accrual, 5.0) == {}
    assert list(accrual.totals(4.0)) == []


# -- from the ledger's entries -----------------------------------------------------------------


def gpu(name: str, product: str) -> dict[str, Any]:
    return make_device(name, memory="80Gi", attrs={"type": "gpu", "productName": product, "uuid": f"GPU-{name}"})


def admitter() -> Admitter:
    inv = Inventory()
    inv.replace_all([make_slice("n1", [gpu("gpu-0", A100), gpu("gpu-1", H100), gpu("gpu-2", A100)], driver=D)])
    classes = {GPU: parse_device_class(make_class("gpu", f"device.attributes['{D}'].type == 'gpu'"))}
    return Admitter(Pricer(inv, classes), Ledger())


def test_contributions_are_each_allocated_devices_exact_charge_by_class_and_model() -> None:
    adm = admitter()
    claim = parse_claim(make_claim("c1", request("g", exactly("gpu", count=3)),
                                   allocation=[result("g", f"gpu-{i}", driver=D) for i in range(3)]))
    adm.account_allocated(claim)
    entry = adm.ledger.entry(claim_ref(claim))
    assert entry is not None

    def model(key: DeviceKey) -> str:
        return device_labels(adm.pricer.inventory.lookup(key)).model

    assert sorted(contributions(entry, "conservative", model)) == [
        (GPU, A100, Charge(2 * MEM, 2)), (GPU, H100, Charge(MEM, 1))]


def test_a_claim_not_allocated_contributes_nothing() -> None:
    adm = admitter()
    claim = parse_claim(make_claim("c1", request("g", exactly("gpu"))))
    adm.reserve_existing(claim)
    entry = adm.ledger.entry(claim_ref(claim))
    assert entry is not None
    assert contributions(entry, "conservative", lambda _key: "x") == ()


@pytest.mark.parametrize("sign", [1, -1])
def test_the_ledger_tells_its_observer_each_claim_counted_in_and_out(sign: int) -> None:
    adm = admitter()
    seen: list[tuple[str, int]] = []
    adm.ledger.observer = lambda entry, s: seen.append((entry.ref, s))
    claim = parse_claim(make_claim("c1", request("g", exactly("gpu")),
                                   allocation=[result("g", "gpu-0", driver=D)]))
    adm.account_allocated(claim)
    if sign < 0:
        adm.ledger.delete_claim(claim_ref(claim))
    ref = claim_ref(claim)
    assert seen == [(ref, 1)] + ([(ref, -1)] if sign < 0 else [])


# -- the invariant, for any history ------------------------------------------------------------

Event = tuple[float, str, int, int]  # (after how long, "count" | "uncount" | "handover", claim, GiB)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.sampled_from(["count", "uncount", "handover"]),
                          st.integers(0, 4), st.integers(1, 80)), max_size=40))
def test_two_replicas_together_accrue_the_exact_integral_whatever_happens(events: list[Event]) -> None:
    """Both replicas follow every claim event; leadership moves between them; the sum of
    what they accrued is the integral of what was held, computed the plain way."""
    replicas, leader = (Accrual(forget_after=math.inf), Accrual(forget_after=math.inf)), 0
    replicas[0].lead(True, 0.0)
    held: dict[int, int] = {}
    now, integral = 0.0, 0.0
    for wait, kind, claim, gib in events:
        integral += sum(held.values()) * GiB * wait
        now += wait
        if kind == "handover":
            replicas[leader].lead(False, now)
            leader = 1 - leader
            replicas[leader].lead(True, now)
            continue
        for replica in replicas:
            if kind == "count":
                replica.count(ClaimRef(f"u{claim}"), NS, held_of(gib), now)
            else:
                replica.uncount(ClaimRef(f"u{claim}"), now)
        if kind == "count":
            held[claim] = gib
        else:
            held.pop(claim, None)
    integral += sum(held.values()) * GiB * 10
    accrued = sum(a.memory_seconds for replica in replicas for a in replica.totals(now + 10))
    # Instants are floats: each interval a replica measures (now - since) is exact to about
    # an ulp of `now`, times a rate of at most 5 claims x 80 GiB, at each event on either
    # replica. A hundred times that bound is still under a millionth of a GiB-second.
    rounding = 100 * 2 * (len(events) + 1) * math.ulp(now + 10) * 5 * 80 * GiB
    assert accrued == pytest.approx(integral, rel=1e-9, abs=rounding)


def held_of(gib: int) -> list[tuple[DeviceClassName, str, Charge]]:
    return held(gib * GiB, 1)
