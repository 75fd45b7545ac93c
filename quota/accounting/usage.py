"""What the usage metrics report: per quota, per namespace and class, per model, per device.

Neighbours: `quota.accounting.ledger` is the one accountant (used and reserved per quota, and the
entry of every claim); `quota.devices.inventory` the devices; `Holders` here records who holds
which device (fed by `kube.claimstore.ClaimStore` next to the ledger, charging nothing);
`webhook.usagemetrics` turns these views into Prometheus families at scrape time. Pure
and synchronous: every function reads the caches as they are at the call.

Device labels come from the attributes the NVIDIA DRA driver publishes
(NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go, `CommonAttributesMig`),
read in the device's own driver domain so any driver publishing the same names works:

- `model`: `productName` ("NVIDIA A100-SXM4-80GB", the string DCGM exporter calls
  `modelName`; a MIG device carries its parent's), else `model`, else "";
- `uuid`: a MIG device's `parentUUID` (DCGM labels a MIG instance with its parent GPU's
  `UUID`), else the device's `uuid`, else "";
- `profile`: a MIG device's `profile` ("1g.10gb", DCGM's `GPU_I_PROFILE`), else "".
  The driver publishes no GPU instance id (DCGM's `GPU_I_ID`): NVML assigns it when the
  instance is created, and the DRA device names placement and profile instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.devices.inventory import Inventory
from quota.objects.claims import AllocatedDevice, Claim
from quota.pricing.priced import PricedRequest, Pricing
from quota.values.model import ZERO, Charge, Device, DeviceClassName, DeviceKey, Namespace
from quota.values.quantity import ceil_int
from quota.values.work import pause_point

__all__ = [
    "DeviceLabels",
    "Held",
    "Holders",
    "HeldCounts",
    "ModelIndex",
    "ModelKey",
    "ModelUsage",
    "consumers",
    "device_labels",
    "held_devices",
    "held_keys",
    "namespace_usage",
]

State = Literal["allocated", "reserved"]
ModelKey = tuple[str, str, str]  # (driver, model, profile)


# -- who holds which device ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Held:
    """An allocated claim: its devices and the pods `status.reservedFor` names."""

    namespace: Namespace
    name: str
    pods: tuple[str, ...]
    devices: tuple[AllocatedDevice, ...]


def consumers(status: Any) -> tuple[str, ...]:
    """The pod names in a claim's `status.reservedFor` (other consumer kinds are skipped)."""
    reserved = status.get("reservedFor") if isinstance(status, dict) else None
    if not isinstance(reserved, list):
        return ()
    return tuple(sorted({
        ref["name"] for ref in reserved
        if isinstance(ref, dict) and ref.get("resource") == "pods" and not ref.get("apiGroup")
        and isinstance(ref.get("name"), str)
    }))


class Holders:
    """Allocated claims by ledger ref; `version` moves on every change (scrape caches key on it)."""

    def __init__(self) -> None:
        self._held: dict[ClaimRef, Held] = {}
        self.version = 0

    def update(self, ref: ClaimRef, claim: Claim, status: Any) -> None:
        """Record `claim` as its cache holds it now (`status`: its raw status); unallocated drops it."""
        held = self.of(claim, status)
        if held is None:
            self.drop(ref)
        elif self._held.get(ref) != held:
            self._held[ref] = held
            self.version += 1

    @staticmethod
    def of(claim: Claim, status: Any) -> Held | None:
        """What `update` records for `claim` (None: not allocated, nothing held)."""
        if claim.allocation is None:
            return None
        return Held(claim.namespace, claim.name, consumers(status), claim.allocation)

    def replace(self, held: dict[ClaimRef, Held]) -> dict[ClaimRef, Held]:
        """After a relist: exactly `held` (built aside: `kube.claimstore.ClaimStore.replace`).
        The old table, for the caller to free in pieces where it may pause (`quota.values.work.drop`)."""
        old, self._held = self._held, held
        self.version += 1
        return old

    def drop(self, ref: ClaimRef) -> None:
        if self._held.pop(ref, None) is not None:
            self.version += 1

    def keep_only(self, refs: Iterable[ClaimRef]) -> None:
        """After a relist: forget every claim not in `refs`."""
        keep = set(refs)
        for ref in [r for r in self._held if r not in keep]:
            self.drop(ref)

    def items(self) -> Iterable[tuple[ClaimRef, Held]]:
        return self._held.items()

    def mapping(self) -> Mapping[ClaimRef, Held]:
        """The allocated claims by ref, read-only (a live view: read it, do not keep it)."""
        return self._held

    def __len__(self) -> int:
        return len(self._held)


# -- device labels ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceLabels:
    model: str = ""
    uuid: str = ""
    profile: str = ""


def device_labels(device: Device | None) -> DeviceLabels:
    """The labels of module doc, from the device's own driver domain ("" when absent)."""
    if device is None:
        return DeviceLabels()
    own = device.attributes.get(device.driver, {})

    def text(name: str) -> str:
        value = own.get(name)
        return value if isinstance(value, str) else ""

    parent = text("parentUUID")
    return DeviceLabels(model=text("productName") or text("model"), uuid=parent or text("uuid"),
                        profile=text("profile") if parent else "")


def held_devices(held: Held, inventory: Inventory) -> Iterator[tuple[AllocatedDevice, DeviceLabels]]:
    """The devices `held` holds, adminAccess results excluded (they are not taken from
    anyone, and would make a device's `uuid` name two holders)."""
    for result in held.devices:
        if not result.admin_access:
            yield result, device_labels(inventory.lookup(result.key))


def held_keys(held: Held) -> tuple[DeviceKey, ...]:
    """The devices `held` holds (adminAccess excluded), each once."""
    return tuple(dict.fromkeys(result.key for result in held.devices if not result.admin_access))


# -- per namespace and class ----------------------------------------------------------------


def namespace_usage(ledger: Ledger, entries: Iterable[Entry]) -> dict[tuple[DeviceClassName, State], Charge]:
    """`entries` (every claim of a namespace the ledger holds), by device class and state.

    `allocated`: the exact charge of allocated claims; `reserved`: the estimate of admitted
    claims not allocated yet (the default pricing mode's, the `draquota.io/charge` one). A
    request is counted under one class: the class of its devices once allocated, else the
    class of the alternative it is priced at (a firstAvailable request whose subrequests
    name different classes is priced at the priciest in Conservative mode).
    """
    out: dict[tuple[DeviceClassName, State], Charge] = {}
    mode = ledger.default_mode
    for entry in entries:
        pause_point()
        pricing: Pricing = entry.pricing.get(mode) or next(iter(entry.pricing.values()))
        state: State = "allocated" if entry.allocated else "reserved"
        for request in pricing.requests:
            key = (_class_of(request), state)
            out[key] = out.get(key, ZERO) + request.charge
    return out


def _class_of(request: PricedRequest) -> DeviceClassName:
    alternatives = request.alternatives
    if not alternatives:
        return DeviceClassName("")
    first = alternatives[0][0]
    if all(cls == first for cls, _ in alternatives):
        return first
    return next((cls for cls, charge in alternatives if charge == request.charge), first)


# -- per model ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelUsage:
    devices: int = 0
    memory: int = 0  # bytes
    allocated: int = 0  # devices held by at least one claim


@dataclass(frozen=True, slots=True)
class ModelIndex:
    """The usable devices by (driver, model, profile): derived once per inventory generation."""

    totals: Mapping[ModelKey, ModelUsage]
    model_of: Mapping[DeviceKey, ModelKey]

    @classmethod
    def of(cls, inventory: Inventory) -> ModelIndex:
        counts: dict[ModelKey, list[int]] = {}
        model_of: dict[DeviceKey, ModelKey] = {}
        usable = inventory.usable()
        # Slice events land during the pauses: the keys, each looked up as it comes. Keys
        # only: a list of 58,000 new (key, device) pairs is traversed by each young
        # collection while it grows (60 ms in one piece, bench/stalls.py).
        for key in list(usable):
            pause_point()
            device = usable.get(key)
            if device is None:
                continue
            labels = device_labels(device)
            model = model_of[key] = (device.driver, labels.model, labels.profile)
            totals = counts.setdefault(model, [0, 0])
            totals[0] += 1
            totals[1] += ceil_int(device.memory)
        return cls({k: ModelUsage(d, m) for k, (d, m) in counts.items()}, model_of)

    def usage(self, held: HeldCounts) -> dict[ModelKey, ModelUsage]:
        """The totals, and how many of each model's devices are held."""
        return {model: replace(usage, allocated=held.by_model.get(model, 0)) for model, usage in self.totals.items()}


class HeldCounts:
    """How many devices of each model are held, kept incrementally as claims come and go.

    A device counts once however many claims hold it (a shared device), so each device
    keeps a count of its holders; a device the index does not know (vanished) counts
    for no model.
    """

    def __init__(self, index: ModelIndex) -> None:
        self.index = index
        self._holders: dict[DeviceKey, int] = {}
        self.by_model: dict[ModelKey, int] = {}

    def add(self, keys: Iterable[DeviceKey], sign: int = 1) -> None:
        """One claim's devices start (`sign` 1) or stop (-1) being held."""
        for key in keys:
            before = self._holders.get(key, 0)
            after = before + sign
            if after > 0:
                self._holders[key] = after
            else:
                self._holders.pop(key, None)
            if (before > 0) != (after > 0):
                model = self.index.model_of.get(key)
                if model is not None:
                    self.by_model[model] = self.by_model.get(model, 0) + (1 if after > 0 else -1)
