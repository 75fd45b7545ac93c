"""quota.accounting.usage: device labels from driver attributes, who holds what, per-class and per-model views."""

from __future__ import annotations

from typing import Any

import pytest

from quota.accounting.ledger import Ledger
from quota.accounting.usage import (
    DeviceLabels,
    HeldCounts,
    Holders,
    ModelIndex,
    ModelUsage,
    consumers,
    device_labels,
    namespace_usage,
)
from quota.admission.admitter import Admitter, claim_ref
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.objects.slices import parse_slice
from quota.pricing.pricer import Pricer
from quota.values.model import Charge, DeviceClassName, DeviceKey, Namespace

from ...builders import GiB, exactly, first_available, make_class, make_claim, make_device, make_slice, request, result

D = "gpu.nvidia.com"
NS = Namespace("team-a")
A100 = "NVIDIA A100-SXM4-80GB"


def gpu(name: str, uuid: str) -> dict[str, Any]:
    return make_device(name, memory="80Gi", attrs={"type": "gpu", "productName": A100, "uuid": uuid})


def mig(name: str, parent: str, profile: str = "1g.10gb") -> dict[str, Any]:
    return make_device(name, memory="10Gi", attrs={"type": "mig", "productName": A100, "uuid": f"MIG-{name}",
                                                   "parentUUID": parent, "profile": profile})


def inventory() -> Inventory:
    inv = Inventory()
    inv.replace_all([make_slice("n1", [gpu("gpu-0", "GPU-0"), gpu("gpu-1", "GPU-1"),
                                       mig("gpu-2-mig-a", "GPU-2"), mig("gpu-2-mig-b", "GPU-2", "2g.20gb")],
                                driver=D)])
    return inv


@pytest.mark.parametrize(("device", "labels"), [
    (gpu("gpu-0", "GPU-0"), DeviceLabels(A100, "GPU-0", "")),
    # A MIG device: DCGM's UUID is the parent GPU's, GPU_I_PROFILE its profile.
    (mig("gpu-2-mig-a", "GPU-2"), DeviceLabels(A100, "GPU-2", "1g.10gb")),
    # Another driver publishing `model` and no uuid.
    (make_device("acc-0", attrs={"model": "X1"}), DeviceLabels("X1", "", "")),
    # `profile` alone (no parentUUID) is not a MIG profile.
    (make_device("acc-1", attrs={"profile": "fast", "uuid": 7}), DeviceLabels("", "", "")),
])
def test_device_labels_read_the_drivers_own_attributes(device: dict[str, Any], labels: DeviceLabels) -> None:
    parsed = parse_slice(make_slice("s", [device], driver=D)).devices[0]
    assert device_labels(parsed) == labels
    assert device_labels(None) == DeviceLabels()


def test_consumers_are_the_pods_reserved_for() -> None:
    status = {"reservedFor": [{"resource": "pods", "name": "b", "uid": "1"}, {"resource": "pods", "name": "a"},
                              {"apiGroup": "batch", "resource": "jobs", "name": "j"}, {"resource": "pods"}, "junk"]}
    assert consumers(status) == ("a", "b")
    assert consumers({}) == consumers(None) == consumers({"reservedFor": "x"}) == ()


def allocated(name: str, *devices: str, uid: str, admin: bool = False) -> dict[str, Any]:
    obj = make_claim(name, request("gpu", exactly("gpu", admin=admin)),
                     allocation=[result("gpu", d, driver=D, admin=admin) for d in devices])
    obj["metadata"]["uid"] = uid
    return obj


def test_holders_track_allocated_claims_and_move_their_version_only_on_change() -> None:
    holders = Holders()
    claim = parse_claim(allocated("c1", "gpu-0", uid="u1"))
    holders.update(claim_ref(claim), claim, {"reservedFor": [{"resource": "pods", "name": "p1"}]})
    version = holders.version
    holders.update(claim_ref(claim), claim, {"reservedFor": [{"resource": "pods", "name": "p1"}]})
    assert holders.version == version  # the same view: nothing to re-render
    [(ref, held)] = holders.items()
    assert (ref, held.name, held.pods, [d.key.device for d in held.devices]) == ("u1", "c1", ("p1",), ["gpu-0"])
    holders.update(claim_ref(claim), parse_claim(make_claim("c1", request("gpu", exactly("gpu")))), {})
    assert len(holders) == 0 and holders.version > version  # deallocated: dropped
    holders.update(claim_ref(claim), claim, {})
    holders.keep_only([])
    assert len(holders) == 0


def test_namespace_usage_by_class_and_state() -> None:
    inv = inventory()
    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in (
        make_class("gpu", f"device.attributes['{D}'].type == 'gpu'"),
        make_class("mig", f"device.attributes['{D}'].type == 'mig'"))}
    admitter = Admitter(Pricer(inv, classes), Ledger())
    admitter.account_allocated(parse_claim(allocated("c1", "gpu-0", uid="u1")))
    mig_claim = make_claim("c2", request("m", exactly("mig")), allocation=[result("m", "gpu-2-mig-a", driver=D)])
    admitter.account_allocated(parse_claim(mig_claim))
    admitter.reserve_existing(parse_claim(make_claim("c3", request("gpu", exactly("gpu", count=2)))))
    # firstAvailable over two classes: one class only, the priciest alternative's (Conservative).
    admitter.reserve_existing(parse_claim(make_claim("c4", first_available("r", ("small", exactly("mig")),
                                                                           ("big", exactly("gpu"))))))
    admitter.reserve_existing(parse_claim(make_claim("other", request("gpu", exactly("gpu")), namespace="team-b")))
    assert namespace_usage(admitter.ledger, admitter.ledger.entries_in(NS)) == {
        ("gpu", "allocated"): Charge(80 * GiB, 1),
        ("mig", "allocated"): Charge(10 * GiB, 1),
        ("gpu", "reserved"): Charge(2 * 80 * GiB, 2) + Charge(80 * GiB, 1),
    }
    assert set(admitter.ledger.namespaces()) == {"team-a", "team-b"}


def test_models_count_devices_memory_and_each_held_device_once() -> None:
    index = ModelIndex.of(inventory())
    held = HeldCounts(index)
    gpu0, mig_b = DeviceKey(D, "node-1", "gpu-0"), DeviceKey(D, "node-1", "gpu-2-mig-b")
    held.add([gpu0, mig_b])
    held.add([gpu0])  # a second claim sharing gpu-0
    held.add([DeviceKey(D, "node-1", "gone")])  # vanished from the inventory: no model
    assert index.usage(held) == {
        (D, A100, ""): ModelUsage(devices=2, memory=2 * 80 * GiB, allocated=1),
        (D, A100, "1g.10gb"): ModelUsage(devices=1, memory=10 * GiB, allocated=0),
        (D, A100, "2g.20gb"): ModelUsage(devices=1, memory=10 * GiB, allocated=1),
    }
    held.add([gpu0], -1)  # one of the two sharers left: still held
    assert index.usage(held)[(D, A100, "")].allocated == 1
    held.add([gpu0, mig_b], -1)
    assert [u.allocated for u in index.usage(held).values()] == [0, 0, 0]
