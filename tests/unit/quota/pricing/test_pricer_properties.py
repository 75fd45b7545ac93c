"""Property tests for pricing: invariants that must hold for any inventory and claim."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.cel import compile_selector, device_activation
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.priced import Pricing
from quota.pricing.pricer import Pricer
from quota.quotas.scope import DeviceSelection, Scope
from quota.values.model import Charge, DeviceClassName

from ...builders import MiB, exactly, first_available, make_class, make_claim, make_device, make_slice, request, result

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


def _alternatives(raw_request: dict[str, Any]) -> list[dict[str, Any]]:
    return [raw_request["exactly"]] if "exactly" in raw_request else raw_request["firstAvailable"]


def _in_class(inv: Inventory, raw_request: dict[str, Any]) -> list[tuple[int, int]]:
    """Per alternative, (its class's usable devices, counted without the pricer: every
    device is a gpu, "shared" takes the shareable ones; the count it asks for)."""
    return [(sum(1 for d in inv.usable().values() if alt["deviceClassName"] != "shared" or d.allow_multiple_allocations),
             alt.get("count", 1)) for alt in _alternatives(raw_request)]


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
        for raw_request, priced in zip(raw["spec"]["devices"]["requests"], pricing.requests, strict=True):
            in_class = _in_class(inv, raw_request)
            if any("capacity" in alt for alt in _alternatives(raw_request)):  # it may rule devices out
                assert 0 <= priced.candidates <= max(n for n, _ in in_class), (raw_request, priced)
            else:  # the first alternative with enough candidates, the one the scheduler tries
                enough = [n for n, count in in_class if n >= count]
                assert priced.candidates == (enough[0] if enough else max(n for n, _ in in_class)), (raw_request, priced)
    assert optimistic.total.memory <= conservative.total.memory
    assert optimistic.total.devices <= conservative.total.devices
    for cls in CLASSES:
        scoped_c = conservative.charge_for(Scope(frozenset({DeviceClassName(cls)})))
        scoped_o = optimistic.charge_for(Scope(frozenset({DeviceClassName(cls)})))
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
    """What a stored claim counts before it is priced (`controllers.refine`) may be more than
    the truth, never less: per dimension, in each mode, for every quota scope."""
    pricer = Pricer(inv, CLASSES)
    spec = parse_claim(raw).spec
    bound = pricer.upper_bound(spec)
    scopes = [Scope(), *(Scope(frozenset({DeviceClassName(c)})) for c in CLASSES)]
    for mode in ("conservative", "optimistic"):
        estimate = pricer.estimate(spec, mode=mode)
        for scope in scopes:
            high, truth = bound.charge_for(scope), estimate.charge_for(scope)
            assert high.memory >= truth.memory and high.devices >= truth.devices, (mode, scope, high, truth)


# -- quotas selecting devices (`spec.devices`) ---------------------------------------------------

E = "accel.example.com"


def _tier(driver: str, tier: str) -> str:
    return f"device.driver == '{driver}' && device.attributes['{driver}'].tier == '{tier}'"


TWO_DRIVER_CLASSES = {
    c.name: c
    for c in map(parse_device_class, [
        make_class("gpu", f"device.driver == '{D}'"),
        make_class("accel", f"device.driver == '{E}'"),
        make_class("tier-a", f"({_tier(D, 'a')}) || ({_tier(E, 'a')})"),  # a class across drivers
        make_class("shared", "device.allowMultipleAllocations"),
        make_class("any"),
    ])
}
# Selections that never fail on a device: what they do not select, they do not select.
SELECTIONS = [
    DeviceSelection(expressions=(_tier(D, "a"),)),
    DeviceSelection(expressions=(f"({_tier(D, 'b')}) || ({_tier(E, 'b')})",)),
    DeviceSelection(expressions=("device.capacity[device.driver].memory.compareTo(quantity('40Gi')) >= 0",)),
    DeviceSelection(expressions=("false",)),
    DeviceSelection(drivers=frozenset({D})),
    DeviceSelection(drivers=frozenset({E}), expressions=(f"device.attributes['{E}'].tier == 'a'",)),
]


@st.composite
def two_driver_inventories(draw: st.DrawFn) -> Inventory:
    inv = Inventory()
    for node in range(draw(st.integers(1, 3))):
        for driver in (D, E):
            devices = []
            for i in range(draw(st.integers(0, 3))):
                shared = draw(st.booleans())
                policy = {"default": "8Gi", "validRange": {"min": "1Mi", "step": "1Mi"}} if shared else None
                devices.append(make_device(f"d{i}", memory=draw(memories), attrs={"tier": draw(st.sampled_from("ab"))},
                                           shared=shared, policy=policy))
            inv.add_or_update_slice(make_slice(f"{driver}-{node}", devices, driver=driver, node=f"node-{node}"))
    return inv


@st.composite
def two_driver_claims(draw: st.DrawFn) -> dict[str, Any]:
    def requirement() -> dict[str, Any]:
        mode = draw(st.sampled_from([None, "All"]))
        chosen = draw(st.lists(st.sampled_from([_tier(D, "a"), _tier(E, "b"), "device.allowMultipleAllocations"]),
                               max_size=1))
        cap = draw(st.sampled_from([None, "1Gi", "30Gi"]))
        return exactly(draw(st.sampled_from(sorted(TWO_DRIVER_CLASSES))), *chosen,
                       count=None if mode else draw(st.integers(1, 3)), mode=mode,
                       capacity={"memory": cap} if cap else None)

    reqs = []
    for i in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            reqs.append(request(f"r{i}", {**requirement(), **({"adminAccess": True} if draw(st.booleans()) else {})}))
        else:
            reqs.append(first_available(f"r{i}", *((f"s{j}", requirement()) for j in range(draw(st.integers(1, 3))))))
    return make_claim("c", *reqs)


def _estimates(inv: Inventory, raw: dict[str, Any], selections: list[DeviceSelection]) -> dict[str, Pricing]:
    pricer = Pricer(inv, TWO_DRIVER_CLASSES)
    spec = parse_claim(raw).spec
    return {mode: pricer.estimate(spec, mode=mode, selections=selections) for mode in ("conservative", "optimistic")}


@settings(max_examples=200, deadline=None)
@given(two_driver_inventories(), two_driver_claims())
def test_a_selection_never_charges_more_than_unscoped_nor_optimistic_more_than_conservative(
        inv: Inventory, raw: dict[str, Any]) -> None:
    priced = _estimates(inv, raw, SELECTIONS)
    high, low = priced["conservative"], priced["optimistic"]
    assert high.errors == low.errors == ()
    all_mode = any(alt.allocation_mode == "All" for r in parse_claim(raw).spec.requests for alt in r.alternatives)
    for selection in SELECTIONS:
        for classes in (frozenset(), frozenset({DeviceClassName("gpu"), DeviceClassName("tier-a")})):
            scope = Scope(classes, selection)
            scoped, cheap = high.charge_for(scope), low.charge_for(scope)
            assert scoped.memory <= high.charge_for(Scope(classes)).memory, (selection, scoped)
            # All mode prices the node with the most memory: another node may hold more devices.
            assert all_mode or scoped.devices <= high.charge_for(Scope(classes)).devices, (selection, scoped)
            assert cheap.memory <= scoped.memory and cheap.devices <= scoped.devices, (selection, cheap, scoped)


@settings(max_examples=150, deadline=None)
@given(two_driver_inventories(), two_driver_claims(), st.sampled_from([D, E, "other.example.com"]))
def test_scoped_by_driver_is_scoped_by_the_equivalent_selector(inv: Inventory, raw: dict[str, Any],
                                                               driver: str) -> None:
    by_driver = DeviceSelection(drivers=frozenset({driver}))
    by_selector = DeviceSelection(expressions=(f"device.driver == '{driver}'",))
    for pricing in _estimates(inv, raw, [by_driver, by_selector]).values():
        assert pricing.charge_for(Scope(devices=by_driver)) == pricing.charge_for(Scope(devices=by_selector))
        assert pricing.in_scope(Scope(devices=by_driver)) == pricing.in_scope(Scope(devices=by_selector))
    devices = list(inv.usable().values())
    exact = Pricer(inv, TWO_DRIVER_CLASSES).exact(_allocated(devices[:5]), selections=[by_driver, by_selector])
    assert exact.charge_for(Scope(devices=by_driver)) == exact.charge_for(Scope(devices=by_selector))


def _allocated(devices: list[Any]) -> Any:
    allocation = [result("r", d.key.device, pool=d.key.pool, driver=d.key.driver) for d in devices]
    return parse_claim(make_claim("c", request("r", exactly("any", count=max(len(devices), 1))),
                                  allocation=allocation))


@settings(max_examples=150, deadline=None)
@given(two_driver_inventories(), st.data(), st.sampled_from(SELECTIONS))
def test_a_device_outside_the_selection_never_charges(inv: Inventory, data: st.DataObject,
                                                      selection: DeviceSelection) -> None:
    devices = list(inv.usable().values())
    picked = data.draw(st.lists(st.sampled_from(devices), unique_by=lambda d: d.key, max_size=6)) if devices else []
    pricing = Pricer(inv, TWO_DRIVER_CLASSES).exact(_allocated(picked), selections=[selection])

    def selected(device: Any) -> bool:
        return selection.admits_driver(device.driver) and all(
            compile_selector(e).evaluate(device_activation(device)) for e in selection.expressions)

    assert pricing.charge_for(Scope(devices=selection)) == Charge(
        sum(int(d.memory) for d in picked if selected(d)), sum(1 for d in picked if selected(d)))
    # Unallocated: a selection that selects nothing charges nothing, but for a class with
    # no device at all (which cannot tell what a device would be).
    nothing = DeviceSelection(expressions=("false",))
    raw = data.draw(two_driver_claims())
    for pricing in _estimates(inv, raw, [nothing]).values():
        charge = pricing.charge_for(Scope(devices=nothing))
        empty_class = any(not Pricer(inv, TWO_DRIVER_CLASSES).matcher.match((TWO_DRIVER_CLASSES[alt.device_class]
                                                                             .selectors,)).groups
                          for r in parse_claim(raw).spec.requests for alt in r.alternatives)
        assert charge.memory == 0 and (charge.devices == 0 or empty_class), charge
