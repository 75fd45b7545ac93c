"""quota.quotas.scope and the charge a quota selecting devices (`spec.devices`) sees.

The inventory: two H100s (80Gi) and two A100s (40Gi) of driver gpu.example.com, one FPGA
(16Gi) of fpga.example.com. Classes `h100` and `alias` are two ways to ask for the same
GPUs: a quota scoped by `deviceClassNames: [h100]` never sees a claim through `alias`
(the sidestep), one scoped by `spec.devices` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef
from quota.accounting.reservationrecord import Record
from quota.admission.admitter import Admitter, claim_ref
from quota.devices.inventory import Inventory
from quota.devices.memorysources import MemorySources
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.priced import Pricing
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import QuotaError, parse_device_quota
from quota.quotas.scope import DeviceSelection, Scope
from quota.status.quotastatus import desired_status
from quota.values.model import Charge, DeviceClassName, DeviceKey, Mode, Namespace, RecordKey
from quota.values.work import Budget

from ...builders import (
    GiB,
    exactly,
    first_available,
    make_class,
    make_claim,
    make_device,
    make_quota,
    make_slice,
    record_for,
    request,
    result,
)
from ..reports.test_check import run
from ..accounting.test_reservations import Seen

D, F = "gpu.example.com", "fpga.example.com"
NS = Namespace("team-a")
# Guarded by driver, as a DeviceClass's must be: another driver's device has no such domain.
H100 = f"device.driver == '{D}' && device.attributes['{D}'].model == 'h100'"
A100 = f"device.driver == '{D}' && device.attributes['{D}'].model == 'a100'"
ONLY_H100 = DeviceSelection(expressions=(H100,))
ONLY_FPGA = DeviceSelection(drivers=frozenset({F}))


SLICES = [
    make_slice("n1", [make_device(f"h100-{i}", memory="80Gi", attrs={"kind": "gpu", "model": "h100"})
                      for i in range(2)], node="node-1"),
    make_slice("n2", [make_device(f"a100-{i}", memory="40Gi", attrs={"kind": "gpu", "model": "a100"})
                      for i in range(2)], node="node-2"),
    make_slice("n3", [make_device("f-0", memory="16Gi", attrs={"kind": "fpga"})], driver=F, node="node-3"),
    make_slice("n4", [make_device("m-0", memory=None, attrs={"kind": "nomem", "model": "none"})], node="node-4"),
]


def inventory() -> Inventory:
    inv = Inventory()
    for obj in SLICES:
        inv.add_or_update_slice(obj)
    return inv


CLASSES = {c.name: c for c in map(parse_device_class, [
    make_class("h100", H100),
    make_class("alias", f"device.driver == '{D}' && device.attributes['{D}'].kind == 'gpu'"),  # and the A100s
    make_class("fpga", f"device.driver == '{F}'"),
    make_class("nomem", f"device.driver == '{D}' && device.attributes['{D}'].kind == 'nomem'"),
    make_class("empty", "device.driver == 'none.example.com'"),
])}


def priced(*requests: dict[str, Any], mode: Mode = "conservative",
           selections: tuple[DeviceSelection, ...] = (ONLY_H100,)) -> Pricing:
    pricing = Pricer(inventory(), CLASSES).estimate(parse_claim(make_claim("c", *requests)).spec, mode=mode,
                                                     selections=selections)
    assert pricing.errors == ()
    return pricing


# -- parsing --------------------------------------------------------------------------------


def test_spec_devices_parses_into_a_frozen_scope_in_the_order_written() -> None:
    quota = parse_device_quota(make_quota("q", memory="1Gi", classes=["alias"], drivers=[D, F],
                                          selectors=[A100, H100]))
    assert quota.scope == Scope(frozenset({DeviceClassName("alias")}),
                                DeviceSelection(frozenset({D, F}), (A100, H100)))
    assert not quota.scope.everything and quota.scope.devices.admits_driver(F)
    assert parse_device_quota(make_quota("q", memory="1Gi")).scope == Scope()
    assert hash(quota.scope) == hash(parse_device_quota(make_quota("q", memory="1Gi", classes=["alias"],
                                                                   drivers=[F, D], selectors=[A100, H100])).scope)


@pytest.mark.parametrize(("devices", "message"), [
    ("gpu", "spec.devices must be a map"),
    ({}, "spec.devices must name drivers or selectors"),
    ({"drivers": [D, D]}, "spec.devices.drivers[1]: duplicate driver"),
    ({"drivers": ["Not_A_Driver"]}, "spec.devices.drivers[0]"),
    ({"drivers": ["d" * 64 + ".example.com"]}, "at most 63"),
    ({"drivers": [f"d{i}.example.com" for i in range(33)]}, "at most 32 items"),
    ({"selectors": [{"expression": "true"}]}, "spec.devices.selectors[0].cel is required"),
    ({"selectors": [{"cel": {"expression": ""}}]}, "spec.devices.selectors[0].cel.expression is required"),
    ({"selectors": [{"cel": {"expression": "x" * 10241}}]}, "at most 10240 characters"),
    ({"selectors": [{"cel": {"expression": "true"}}] * 9}, "at most 8 items"),
])
def test_a_malformed_spec_devices_is_refused_by_field(devices: Any, message: str) -> None:
    raw = make_quota("q", memory="1Gi")
    raw["spec"]["devices"] = devices
    with pytest.raises(QuotaError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_device_quota(raw)


# -- unallocated claims ---------------------------------------------------------------------

SELECTED = Scope(devices=ONLY_H100)


@pytest.mark.parametrize(("requests", "mode", "unscoped", "scoped", "touches"), [
    # The class that names the H100s, and another class over the same GPUs: both charged.
    ([request("r", exactly("h100"))], "conservative", Charge(80 * GiB, 1), Charge(80 * GiB, 1), True),
    ([request("r", exactly("alias"))], "conservative", Charge(80 * GiB, 1), Charge(80 * GiB, 1), True),
    # Optimistic: the smallest *selected* candidate, not the A100 the quota does not hold.
    ([request("r", exactly("alias"))], "optimistic", Charge(40 * GiB, 1), Charge(80 * GiB, 1), True),
    # A request narrowed to devices outside the selection: nothing selected, nothing charged.
    ([request("r", exactly("alias", A100, count=2))], "conservative", Charge(80 * GiB, 2), Charge(), False),
    ([request("r", exactly("fpga"))], "conservative", Charge(16 * GiB, 1), Charge(), False),
    # No candidate now: the largest selected device of the class, per requested device...
    ([request("r", exactly("alias", "false", count=2))], "conservative", Charge(160 * GiB, 2),
     Charge(160 * GiB, 2), True),
    # ... none when the class has devices but none selected ...
    ([request("r", exactly("fpga", "false"))], "conservative", Charge(16 * GiB, 1), Charge(), False),
    # ... and as unscoped when the class has no device at all: it cannot tell.
    ([request("r", exactly("empty", count=3))], "conservative", Charge(0, 3), Charge(0, 3), True),
    # adminAccess: free.
    ([request("r", exactly("alias", admin=True))], "conservative", Charge(), Charge(), True),
    # All: the largest per-node sum over the selected candidates.
    ([request("r", exactly("alias", mode="All"))], "conservative", Charge(160 * GiB, 2), Charge(160 * GiB, 2), True),
    ([request("r", exactly("alias", A100, mode="All"))], "conservative", Charge(80 * GiB, 2), Charge(), False),
    # firstAvailable: alternatives combined per dimension as unscoped.
    ([first_available("r", ("f", exactly("fpga")), ("g", exactly("alias")))], "conservative",
     Charge(80 * GiB, 1), Charge(80 * GiB, 1), True),
    ([first_available("r", ("f", exactly("fpga")), ("g", exactly("alias")))], "optimistic",
     Charge(16 * GiB, 1), Charge(), True),
    # Requests add up.
    ([request("a", exactly("alias")), request("b", exactly("fpga"))], "conservative", Charge(96 * GiB, 2),
     Charge(80 * GiB, 1), True),
])
def test_a_selection_prices_only_its_candidates(requests: list[dict[str, Any]], mode: Mode, unscoped: Charge,
                                                 scoped: Charge, touches: bool) -> None:
    pricing = priced(*requests, mode=mode)
    assert pricing.total == unscoped
    assert pricing.charge_for(SELECTED) == scoped
    assert pricing.in_scope(SELECTED) is touches


def test_the_class_scope_is_sidestepped_by_another_class_and_the_device_scope_is_not() -> None:
    """The way around a quota scoped by class: the same H100, asked for through another class."""
    pricing = priced(request("r", exactly("alias", H100)))
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("h100")}))) == Charge()
    assert pricing.charge_for(SELECTED) == Charge(80 * GiB, 1)


def test_drivers_and_classes_combine_a_device_must_satisfy_both() -> None:
    pricing = priced(request("a", exactly("alias")), request("b", exactly("fpga")), selections=(ONLY_FPGA,))
    assert pricing.charge_for(Scope(devices=ONLY_FPGA)) == Charge(16 * GiB, 1)
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("alias")}), ONLY_FPGA)) == Charge()
    assert pricing.charge_for(Scope(frozenset({DeviceClassName("fpga")}), ONLY_FPGA)) == Charge(16 * GiB, 1)


def test_drivers_guard_the_selectors_which_may_read_their_domain_unguarded() -> None:
    """A class spanning both drivers: the FPGA has no gpu.example.com attributes, and the
    selector reading them never sees it (it would fail on it, and count every candidate)."""
    unguarded = DeviceSelection(frozenset({D}), (f"device.attributes['{D}'].model == 'h100'",))
    classes = {**CLASSES, DeviceClassName("all"): parse_device_class(make_class("all"))}
    spec = parse_claim(make_claim("c", request("r", exactly("all")))).spec
    pricing = Pricer(inventory(), classes).estimate(spec, mode="optimistic", selections=(unguarded,))
    assert pricing.charge_for(Scope(devices=unguarded)) == Charge(80 * GiB, 1)  # the smallest H100
    assert pricing.warnings == ()
    exact = Pricer(inventory(), classes).exact(parse_claim(make_claim(
        "c", request("r", exactly("all", count=2)), allocation=[result("r", "f-0", pool="node-3", driver=F),
                                                                result("r", "h100-1", pool="node-1")])),
        selections=(unguarded,))
    assert exact.charge_for(Scope(devices=unguarded)) == Charge(80 * GiB, 1)


def test_a_selection_it_was_not_priced_for_sees_the_unscoped_charge() -> None:
    """Never less than the truth: a quota created after the claim was priced."""
    pricing = priced(request("r", exactly("alias", A100)), selections=())
    assert pricing.charge_for(SELECTED) == pricing.total == Charge(40 * GiB, 1)
    assert not pricing.priced_for(ONLY_H100) and pricing.priced_for(DeviceSelection())


@pytest.mark.parametrize(("selector", "warning"), [
    (f"device.attributes['{D}'].nosuchkey == 'x'", "no such key"),
    ("device.driver ==", "compilation failed"),
])
def test_a_selector_that_cannot_say_selects_every_candidate(selector: str, warning: str) -> None:
    broken = DeviceSelection(expressions=(selector,))
    pricing = priced(request("r", exactly("alias", A100)), selections=(broken,))
    assert pricing.charge_for(Scope(devices=broken)) == Charge(40 * GiB, 1)
    assert any(warning in w and "spec.devices.selectors[0]" in w for w in pricing.warnings), pricing.warnings


def test_the_selection_spends_the_claims_budget() -> None:
    spec = parse_claim(make_claim("c", request("r", exactly("alias")))).spec
    alone, scoped = Budget.claim(), Budget.claim()
    Pricer(inventory(), CLASSES).estimate(spec, budget=alone)
    Pricer(inventory(), CLASSES).estimate(spec, budget=scoped, selections=(ONLY_H100,))
    assert scoped.spent > alone.spent > 0


# -- allocated claims -----------------------------------------------------------------------


def allocated(*devices: str, annotations: dict[str, str] | None = None) -> Pricing:
    results = [result("r", d, pool=f"node-{1 if d.startswith('h') else 2}") for d in devices]
    claim = parse_claim(make_claim("c", request("r", exactly("alias", count=len(devices))), allocation=results,
                                   annotations=annotations))
    return Pricer(inventory(), CLASSES).exact(claim, selections=(ONLY_H100, ONLY_FPGA))


def test_an_allocation_counts_each_selected_device() -> None:
    pricing = allocated("h100-0", "a100-0")
    assert pricing.total == Charge(120 * GiB, 2)
    assert pricing.charge_for(SELECTED) == Charge(80 * GiB, 1)
    assert pricing.charge_for(Scope(devices=ONLY_FPGA)) == Charge()
    assert pricing.in_scope(SELECTED) and not pricing.in_scope(Scope(devices=ONLY_FPGA))


def test_a_vanished_device_counts_by_its_driver_its_selectors_cannot_see_it() -> None:
    pricing = allocated("h100-9", annotations=record_for({RecordKey("r", DeviceKey(D, "node-1", "h100-9")): 80 * GiB}))
    assert pricing.charge_for(SELECTED) == Charge(80 * GiB, 1)  # kept: it may have been selected
    assert pricing.charge_for(Scope(devices=ONLY_FPGA)) == Charge()  # its driver says it was not


def test_rescoping_an_allocation_needs_only_its_pricing() -> None:
    pricer = Pricer(inventory(), CLASSES)
    claim = parse_claim(make_claim("c", request("r", exactly("alias", count=2)), allocation=[
        result("r", "h100-0", pool="node-1"), result("r", "a100-0", pool="node-2")]))
    bare = pricer.exact(claim)
    assert bare.charge_for(SELECTED) == bare.total  # not priced for it: unscoped
    assert pricer.rescoped(bare, (ONLY_H100,)) == pricer.exact(claim, selections=(ONLY_H100,))


# -- admission, allocation, quotas that come later -------------------------------------------


def admitter(*quotas: dict[str, Any]) -> Admitter:
    adm = Admitter(Pricer(inventory(), CLASSES), Ledger())
    for quota in quotas:
        assert adm.add_or_update_quota(parse_device_quota(quota)).stale == ()
    return adm


def claim(name: str, cls: str, *selectors: str, allocation: list[dict[str, Any]] | None = None) -> Any:
    return parse_claim(make_claim(name, request("r", exactly(cls, *selectors)), allocation=allocation))


@pytest.mark.parametrize(("quota", "admitted"), [
    # Scoped by class: a claim through `alias` for an H100 is never charged (documented).
    (make_quota("q", memory="160Gi", classes=["h100"]), 4),
    (make_quota("q", memory="160Gi", selectors=[H100]), 2),
    (make_quota("q", memory="160Gi", drivers=[D], selectors=[H100]), 2),
])
def test_claims_through_either_class_are_held_by_a_device_scope(quota: dict[str, Any], admitted: int) -> None:
    adm = admitter(quota)
    decisions = [adm.admit_claim(claim(f"c{i}", ("h100", "alias")[i % 2], H100), namespace_labels={}).allowed
                 for i in range(4)]
    assert decisions == [True] * admitted + [False] * (4 - admitted)


def test_an_allocation_outside_the_reservations_scope_is_checked_by_its_excess() -> None:
    """Admitted at 0 (its candidates are A100s), allocated on an H100: the excess must fit."""
    adm = admitter(make_quota("q", memory="80Gi", selectors=[H100]))
    assert adm.admit_claim(claim("first", "h100"), namespace_labels={}).allowed
    narrowed = claim("narrowed", "alias", A100)
    admission = adm.admit_claim(narrowed, namespace_labels={})
    assert admission.allowed and admission.charged_quotas == ()
    on_h100 = parse_claim(make_claim("narrowed", request("r", exactly("alias", A100)),
                                     allocation=[result("r", "h100-1", pool="node-1")]))
    denied = adm.allocate_claim(on_h100, enforce=True)
    assert not denied.allowed and 'exceeded DeviceQuota "q"' in denied.reason
    on_a100 = parse_claim(make_claim("narrowed", request("r", exactly("alias", A100)),
                                     allocation=[result("r", "a100-1", pool="node-2")]))
    assert adm.allocate_claim(on_a100, enforce=True).allowed
    usage = adm.ledger.usage(NS, "q")
    assert (usage.used, usage.reserved, usage.allocated_claims) == (Charge(), Charge(80 * GiB, 1), 0)


def test_a_quota_selecting_new_devices_prices_the_namespaces_claims_again() -> None:
    adm = admitter()
    adm.account_allocated(claim("on-a100", "alias", allocation=[result("r", "a100-0", pool="node-2")]))
    adm.reserve_existing(claim("pending", "alias", A100))
    quota = parse_device_quota(make_quota("q", memory="1Ti", selectors=[H100]))
    repriced = adm.add_or_update_quota(quota)
    stale = repriced.stale
    assert repriced.keys == ((NS, "q"),)  # the quotas whose usage moved: the allocation's
    usage = adm.ledger.usage(NS, "q")
    # The allocation at once, exactly: its A100 is not selected.
    assert usage.used == Charge() and usage.allocated_claims == 0
    # The pending claim meanwhile at its unscoped charge (never less than the truth) ...
    assert [c.name for c, _ in stale] == ["pending"] and usage.reserved == Charge(40 * GiB, 1)
    for pending, _ in stale:
        adm.reserve_existing(pending)
    # ... then at its price for the selection.
    assert adm.ledger.usage(NS, "q").reserved == Charge()
    # The quota's status writes come back as updates: no second pass.
    assert adm.add_or_update_quota(quota).stale == ()


def test_a_selected_device_without_memory_is_charged_0_memory_with_a_warning() -> None:
    # The driver has no memory source: its memory-less device is no accelerator. A quota
    # naming its driver counts it (0 memory, 1 device) and says so; never a denial.
    adm = admitter(make_quota("q", memory="1Ti", drivers=[D]))
    admitted = adm.admit_claim(claim("c", "nomem"), namespace_labels={})
    assert admitted.allowed and adm.ledger.usage(NS, "q").reserved == Charge(0, 1)
    assert any(f"driver {D}" in w and "0 memory" in w and "memory source" in w for w in admitted.warnings)
    # Not selected by a quota of the FPGA driver: nothing for it to count, nothing to say.
    other = admitter(make_quota("q", memory="1Ti", drivers=[F]))
    admitted = other.admit_claim(claim("c", "nomem"), namespace_labels={})
    assert admitted.allowed and admitted.warnings == () and other.ledger.usage(NS, "q").reserved == Charge()


def test_a_quota_counting_devices_without_memory_says_so_in_its_status() -> None:
    """`UnmeteredDevices`: what the admission warning told the claim's creator, for the
    admin reading the quota; counted as claims come and go (`Usage.unmetered_claims`)."""
    obj = make_quota("q", memory="1Ti", drivers=[D])
    adm = admitter(obj)

    def conditions(quota_obj: dict[str, Any]) -> dict[str, Any]:
        status = desired_status(quota_obj, parse_device_quota(quota_obj), Record(), usage=adm.ledger.usage(NS, "q"),
                                caches=Seen(), now=0.0)
        return {c["type"]: c for c in status["conditions"]}

    assert (conditions(obj)["UnmeteredDevices"]["status"], conditions(obj)["UnmeteredDevices"]["reason"]) == (
        "False", "AllMetered")
    nic = claim("c", "nomem")
    assert adm.admit_claim(nic, namespace_labels={}).allowed
    assert adm.admit_claim(claim("g", "h100"), namespace_labels={}).allowed
    assert adm.ledger.usage(NS, "q").unmetered_claims == 1
    unmetered = conditions(obj)["UnmeteredDevices"]
    assert unmetered["status"] == "True" and unmetered["message"].startswith("1 claim(s) counted hold"), unmetered
    adm.ledger.delete_claim(claim_ref(nic))
    assert conditions(obj)["UnmeteredDevices"]["status"] == "False"
    # A quota with no scope does not govern such devices: no condition to show.
    assert "UnmeteredDevices" not in conditions(make_quota("q", memory="1Ti"))


def test_a_quota_that_starts_limiting_memory_counts_its_unmetered_claims() -> None:
    # A 0-memory device is "unmetered" only under a quota that limits memory: an edit adding
    # `hard.memory` must count the claims again, not keep the devices-only quota's usage
    # (whose scope and mode are the same).
    adm = admitter(make_quota("q", devices=10, drivers=[D]))
    assert adm.admit_claim(claim("c", "nomem"), namespace_labels={}).allowed
    assert adm.ledger.usage(NS, "q").unmetered_claims == 0
    adm.add_or_update_quota(parse_device_quota(make_quota("q", memory="1Ti", devices=10, drivers=[D])))
    assert adm.ledger.usage(NS, "q").unmetered_claims == 1
    adm.add_or_update_quota(parse_device_quota(make_quota("q", devices=10, drivers=[D])))
    assert adm.ledger.usage(NS, "q").unmetered_claims == 0


def test_memory_no_selected_accelerator_tells_is_no_admission() -> None:
    # Listed as an accelerator driver (a memory source entry, none applying): unpriced.
    inv = Inventory(MemorySources({D: ()}))
    for obj in SLICES:
        inv.add_or_update_slice(obj)
    adm = Admitter(Pricer(inv, CLASSES), Ledger())
    adm.add_or_update_quota(parse_device_quota(make_quota("q", memory="1Ti", drivers=[D])))
    denied = adm.admit_claim(claim("c", "nomem"), namespace_labels={})
    assert not denied.allowed and "cannot be priced" in denied.reason and "its spec.devices selects" in denied.reason
    assert f"configure a memory source for driver {D}" in denied.reason


def test_a_workloads_pods_multiply_the_selected_charge() -> None:
    adm = admitter(make_quota("q", memory="1Ti", selectors=[H100]))
    template = parse_claim(make_claim("t", request("a", exactly("alias")), request("b", exactly("alias", A100)),
                                      kind="ResourceClaimTemplate"))
    entry = adm.workload_entry(NS, ClaimRef("w"), [(template, 7)])
    assert not isinstance(entry, str)
    (quota,) = adm.ledger.quotas(NS)
    assert entry.charge_for(quota, "conservative") == Charge(7 * 80 * GiB, 7)


# -- dra-quota check --------------------------------------------------------------------------


def cluster_files(tmp_path: Path, quota: dict[str, Any], *claims: dict[str, Any]) -> str:
    slices = [make_slice("n1", [make_device(f"h100-{i}", memory="80Gi", attrs={"kind": "gpu", "model": "h100"})
                                for i in range(2)], node="node-1"),
              make_slice("n2", [make_device(f"a100-{i}", memory="40Gi", attrs={"kind": "gpu", "model": "a100"})
                                for i in range(2)], node="node-2")]
    classes = [make_class("h100", H100), make_class("alias", f"device.driver == '{D}'")]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump_all([*classes, *slices, quota, *claims]))
    return str(path)


def test_check_holds_a_device_scope_against_claims_through_either_class(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claims = [make_claim("used", request("r", exactly("alias")), allocation=[result("r", "a100-0", pool="node-2")]),
              *(make_claim(f"c{i}", request("r", exactly(cls, H100)))
                for i, cls in enumerate(["h100", "alias", "alias"]))]
    by_device = make_quota("q", memory="160Gi", selectors=[H100])
    code, out, err = run(capsys, "check", "-f", cluster_files(tmp_path, by_device, *claims), "-o", "json")
    data = json.loads(out)
    assert code == 0, err
    assert [(o["name"], o["allowed"]) for o in data["objects"]] == [
        ("used", True), ("c0", True), ("c1", True), ("c2", False)]
    assert data["objects"][3]["reason"].startswith('exceeded DeviceQuota "q": requested memory=80Gi, used memory=0, '
                                                   "reserved memory=160Gi, limited memory=160Gi")
    (quota,) = data["quotas"]
    assert (quota["used"], quota["reserved"]) == ({"memory": 0, "devices": 0}, {"memory": 160 * GiB, "devices": 2})
    # The same limit by class name: the claims through `alias` are not counted (the sidestep).
    by_class = make_quota("q", memory="160Gi", classes=["h100"])
    code, out, _ = run(capsys, "check", "-f", cluster_files(tmp_path, by_class, *claims), "-o", "json")
    assert [(o["name"], o["allowed"]) for o in json.loads(out)["objects"]] == [
        ("used", True), ("c0", True), ("c1", True), ("c2", True)]


def test_check_names_a_selector_that_does_not_compile_and_a_misspelt_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = make_quota("q", memory="160Gi", selectors=["device.driver =="])
    code, _, err = run(capsys, "check", "-f", cluster_files(tmp_path, broken))
    assert code == 0
    assert ("DeviceQuota team-a/q selects every device, as its selector does not compile: "
            "spec.devices.selectors[0].cel.expression: compilation failed") in err
    misspelt = make_quota("q", memory="160Gi")
    misspelt["spec"]["devices"] = {"driver": [D]}
    code, _, err = run(capsys, "check", "-f", cluster_files(tmp_path, misspelt))
    assert code == 2 and 'unknown field "spec.devices.driver"' in err


def test_past_eight_selections_a_quota_sees_the_unscoped_charge_of_its_classes() -> None:
    """Each selection prices every claim of the namespace once more: the ninth (in a stable
    order) is not priced, and counts more than the truth, never less."""
    selectors = [f"{A100} && {i} >= 0" for i in range(9)]  # nine selections of the A100s
    adm = admitter(*(make_quota(f"q{i}", memory="1Ti", selectors=[s]) for i, s in enumerate(selectors)))
    assert adm.admit_claim(claim("c", "alias", H100), namespace_labels={}).allowed
    charged = {q.name: adm.ledger.usage(NS, q.name).reserved for q in adm.ledger.quotas(NS)}
    last = max(adm.ledger.quotas(NS), key=lambda q: q.scope.devices.sort_key()).name
    assert charged.pop(last) == Charge(80 * GiB, 1)  # not priced for it: the H100 counts
    assert set(charged.values()) == {Charge()}
