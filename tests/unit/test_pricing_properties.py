"""Property tests for pricing: invariants that must hold for any inventory and claim."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.claims import parse_claim, parse_device_class
from quota.inventory import Inventory
from quota.model import Charge, DeviceClassName
from quota.pricing import Pricer

from .builders import MiB, exactly, first_available, make_class, make_claim, make_device, make_slice, request, result

D = "gpu.example.com"
CLASSES = {
    c.name: c
    for c in map(parse_device_class, [
        make_class("gpu", f"device.attributes['{D}'].kind == 'gpu'"),
        make_class("shared", "device.allowMultipleAllocations"),
        make_class("any"),
    ])
}

memories = st.sampled_from(["4864Mi", "20Gi", "40Gi", "80Gi", "141Gi", "1000000000"])


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    inv = Inventory()
    for node in range(draw(st.integers(1, 4))):
        devices = []
        for i in range(draw(st.integers(0, 5))):
            shared = draw(st.booleans())
            policy = {"default": "8Gi", "validRange": {"min": "1Mi", "step": "1Mi"}} if shared and draw(st.booleans()) else None
            devices.append(make_device(f"d{i}", memory=draw(memories), attrs={"kind": "gpu"}, shared=shared, policy=policy))
        inv.add_or_update_slice(make_slice(f"s{node}", devices, driver=D, node=f"node-{node}"))
    return inv


requirement = st.builds(
    # allocationMode All takes no count (the API server refuses one).
    lambda cls, count, mode, admin, cap: exactly(cls, count=None if mode else count, mode=mode, admin=admin,
                                                 capacity={"memory": cap} if cap else None),
    st.sampled_from(["gpu", "shared", "any"]),
    st.integers(1, 4),
    st.sampled_from([None, "All"]),
    st.booleans(),
    st.sampled_from([None, "1Gi", "30Gi", "100Gi"]),
)


@st.composite
def claims(draw: st.DrawFn) -> dict[str, Any]:
    reqs = []
    for i in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            reqs.append(request(f"r{i}", draw(requirement)))
        else:
            subs = [(f"s{j}", {k: v for k, v in draw(requirement).items() if k != "adminAccess"}) for j in range(draw(st.integers(1, 3)))]
            reqs.append(first_available(f"r{i}", *subs))
    return make_claim("c", *reqs)


@settings(max_examples=150, deadline=None)
@given(inventories(), claims())
def test_optimistic_never_exceeds_conservative_and_nothing_is_negative(inv: Inventory, raw: dict[str, Any]) -> None:
    pricer = Pricer(inv, CLASSES)
    spec = parse_claim(raw).spec
    conservative = pricer.estimate(spec, mode="conservative")
    optimistic = pricer.estimate(spec, mode="optimistic")
    assert conservative.errors == optimistic.errors == ()
    for pricing in (conservative, optimistic):
        assert pricing.total.memory >= 0 and pricing.total.devices >= 0
        for req in pricing.requests:
            assert req.candidates >= 0
    assert optimistic.total.memory <= conservative.total.memory
    assert optimistic.total.devices <= conservative.total.devices
    for cls in CLASSES:
        scoped_c = conservative.charge_for(frozenset({DeviceClassName(cls)}))
        scoped_o = optimistic.charge_for(frozenset({DeviceClassName(cls)}))
        assert scoped_o.memory <= scoped_c.memory and scoped_c.memory <= conservative.total.memory


@settings(max_examples=150, deadline=None)
@given(inventories(), st.data())
def test_allocation_charge_is_the_sum_of_device_memories(inv: Inventory, data: st.DataObject) -> None:
    devices = list(inv.usable().values())
    picked = data.draw(st.lists(st.sampled_from(devices), unique_by=lambda d: d.key, max_size=6)) if devices else []
    admin = data.draw(st.lists(st.booleans(), min_size=len(picked), max_size=len(picked)))
    allocation = [result("r", d.key.device, pool=d.key.pool, driver=D, admin=a) for d, a in zip(picked, admin)]
    claim = parse_claim(make_claim("c", request("r", exactly("any", count=max(len(picked), 1))), allocation=allocation))
    pricing = Pricer(inv, CLASSES).exact(claim)
    expected_memory = sum(int(d.memory) for d, a in zip(picked, admin) if not a)
    assert pricing.total == Charge(expected_memory, sum(1 for a in admin if not a))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 200 * 1024), st.sampled_from([1, 2, 64]))
def test_shared_charge_is_the_rounded_request_never_less(request_mib: int, step_mib: int) -> None:
    inv = Inventory()
    # min and max are whole steps apart for every step drawn, as the API server requires.
    policy = {"default": "1Gi", "validRange": {"min": "64Mi", "max": "200Gi", "step": f"{step_mib}Mi"}}
    inv.add_or_update_slice(make_slice("s", [make_device("d", memory="200Gi", shared=True, policy=policy)], driver=D))
    spec = parse_claim(make_claim("c", request("r", exactly("shared", capacity={"memory": f"{request_mib}Mi"})))).spec
    pricing = Pricer(inv, CLASSES).estimate(spec)
    raised = max(request_mib, 64)  # raised to min, then up to the step
    rounded_mib = 64 + -(-(raised - 64) // step_mib) * step_mib
    if rounded_mib > 200 * 1024:
        # Above validRange.max the device cannot serve it: no candidate, priced at the whole device.
        assert pricing.total.memory == 200 * 1024 * MiB and "no device matches now" in pricing.warnings[0]
    else:
        assert pricing.total.memory == rounded_mib * MiB
        assert request_mib * MiB <= pricing.total.memory < (raised + step_mib) * MiB


SELECTORS = [f"device.attributes['{D}'].kind == 'gpu'", "device.capacity['gpu.example.com'].memory.compareTo("
             "quantity('40Gi')) >= 0", "false", "device.allowMultipleAllocations"]


@st.composite
def selected_claims(draw: st.DrawFn) -> dict[str, Any]:
    """`claims()`, each requirement with request selectors (fewer candidates, or none)."""
    raw = draw(claims())
    for req in raw["spec"]["devices"]["requests"]:
        for body in [req["exactly"]] if "exactly" in req else req["firstAvailable"]:
            chosen = draw(st.lists(st.sampled_from(SELECTORS), max_size=2))
            if chosen:
                body["selectors"] = [{"cel": {"expression": s}} for s in chosen]
    return raw


@settings(max_examples=200, deadline=None)
@given(inventories(), selected_claims())
def test_the_upper_bound_is_never_below_any_modes_estimate_in_any_scope(inv: Inventory, raw: dict[str, Any]) -> None:
    """What a stored claim counts before it is priced (`webhook.refine`) may be more than
    the truth, never less: per dimension, in each mode, for every quota scope."""
    pricer = Pricer(inv, CLASSES)
    spec = parse_claim(raw).spec
    bound = pricer.upper_bound(spec)
    scopes = [frozenset(), *(frozenset({DeviceClassName(c)}) for c in CLASSES)]
    for mode in ("conservative", "optimistic"):
        estimate = pricer.estimate(spec, mode=mode)
        for scope in scopes:
            high, truth = bound.charge_for(scope), estimate.charge_for(scope)
            assert high.memory >= truth.memory and high.devices >= truth.devices, (mode, scope, high, truth)
