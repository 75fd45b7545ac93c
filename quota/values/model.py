"""Value types shared by the whole domain: identifiers, devices, charges.

The bottom layer: `quota.devices.inventory` builds `Device`s from ResourceSlices, `quota.cel`
evaluates selectors against them, `quota.objects.claimspec` parses claims' specs into requests,
`quota.pricing.pricer` turns requests into `Charge`s. Everything here is immutable and free
of I/O; raw JSON never travels past the parser that read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, NewType, TypeAlias

Namespace = NewType("Namespace", str)
DeviceClassName = NewType("DeviceClassName", str)
ClaimUid = NewType("ClaimUid", str)

AllocationMode = Literal["ExactCount", "All"]
Mode = Literal["conservative", "optimistic"]

# The capacity that quotas charge: `memory` in the publishing driver's domain.
MEMORY = "memory"


@dataclass(frozen=True, slots=True, order=True)
class DeviceKey:
    """Identity of a device: driver/pool/device (resource.k8s.io/v1 DeviceRequestAllocationResult)."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True)
class RecordKey:
    """One allocation result in the allocation record (`draquota.io/allocated-charge`):
    `request:driver/pool/device`, with `#shareID` for a share of a device that allows
    several allocations. The request says which of the claim's device classes the device
    was charged to: its selectors alone cannot tell, when two of the claim's classes
    select it (`quota.pricing.allocated.AllocatedPricer.recorded`); the share keeps two shares of
    one device apart. A record written before requests were recorded has `request` ""
    (read, never written)."""

    request: str
    device: DeviceKey
    share: str = ""

    def __str__(self) -> str:
        head = f"{self.request}:{self.device}" if self.request else str(self.device)
        return f"{head}#{self.share}" if self.share else head


@dataclass(frozen=True, slots=True)
class Version:
    """A `version` attribute: a semver 2.0.0 string, compared as semver by CEL."""

    text: str


AttributeValue: TypeAlias = (
    "int | bool | str | Version | tuple[int, ...] | tuple[bool, ...] | tuple[str, ...] | tuple[Version, ...]"
)


@dataclass(frozen=True, slots=True)
class ValidRange:
    min: Fraction
    max: Fraction | None
    step: Fraction | None


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """CapacityRequestPolicy: how a shared device rounds a capacity request."""

    default: Fraction | None
    valid_values: tuple[Fraction, ...] = ()
    valid_range: ValidRange | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Fraction
    policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    counter_set: str
    counters: Mapping[str, Fraction]


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class Device:
    """One device of the inventory, as the scheduler sees it.

    `attributes` and `capacity` are keyed by domain, then by identifier, exactly like the
    CEL `device` variable: unqualified names from the slice land under the driver's
    domain. Weak-referenceable so derived data (CEL activations) can be cached beside it. `scope` groups devices for `allocationMode: All` ("node/<name>" for node-local
    devices, "pool/<driver>/<pool>" otherwise). Compared by identity: the inventory holds
    one object per device and generation.
    """

    key: DeviceKey
    attributes: Mapping[str, Mapping[str, AttributeValue]]
    capacity: Mapping[str, Mapping[str, Capacity]]
    allow_multiple_allocations: bool = False
    node_name: str | None = None
    scope: str = ""
    taints: tuple[Taint, ...] = ()
    consumes_counters: tuple[CounterConsumption, ...] = ()
    binds_to_node: bool = False
    # Where the driver publishes no `memory`: the memory a configured source gives the
    # device (`quota.devices.memorysources`), and the capacity it reads ("" for an amount per
    # device model). Set by the inventory, never by the slice parser.
    sourced_memory: Capacity | None = None
    sourced_from: str = ""
    # Its driver is a known accelerator driver (one the memory sources list): without a
    # memory it is an accelerator whose memory nothing tells, never a device outside the
    # quotas that name no scope (docs/charging.md, "Devices without a memory").
    accelerator_driver: bool = False

    @property
    def driver(self) -> str:
        return self.key.driver

    def own_capacity(self, name: str) -> Capacity | None:
        """A capacity in the driver's own domain (`memory` means `<driver>/memory`)."""
        return self.capacity.get(self.key.driver, {}).get(name)

    @property
    def memory_capacity(self) -> Capacity | None:
        """The device's memory: its `memory` capacity, else what a memory source gives it."""
        cap = self.own_capacity(MEMORY)
        return cap if cap is not None else self.sourced_memory

    @property
    def memory_name(self) -> str | None:
        """The published capacity that holds the device's memory (what `capacity.requests`
        and `consumedCapacity` name); None when it has none, or its memory is an amount
        per model."""
        if self.own_capacity(MEMORY) is not None:
            return MEMORY
        return self.sourced_from or None

    @property
    def memory(self) -> Fraction:
        """The device's memory in bytes (0 for devices without one)."""
        cap = self.memory_capacity
        return cap.value if cap is not None else Fraction(0)

    @property
    def is_accelerator(self) -> bool:
        """Whether a quota with no scope governs it: it has a memory, or its driver is a
        known accelerator driver (then without a memory it is unpriced, not free)."""
        return self.accelerator_driver or self.memory_capacity is not None


@dataclass(frozen=True, slots=True, order=True)
class Charge:
    """What a claim takes from its namespace's quotas: memory in bytes, whole devices."""

    memory: int = 0
    devices: int = 0

    def __add__(self, other: Charge) -> Charge:
        return Charge(self.memory + other.memory, self.devices + other.devices)

    def __sub__(self, other: Charge) -> Charge:
        return Charge(self.memory - other.memory, self.devices - other.devices)

    def max(self, other: Charge) -> Charge:
        return Charge(max(self.memory, other.memory), max(self.devices, other.devices))

    def min(self, other: Charge) -> Charge:
        return Charge(min(self.memory, other.memory), min(self.devices, other.devices))

    def times(self, count: int) -> Charge:
        """`count` copies of this charge (a Kueue PodSet's Pods): arithmetic, never a list."""
        return Charge(self.memory * count, self.devices * count)

    def is_zero(self) -> bool:
        return self.memory == 0 and self.devices == 0

    def amount(self, resource: str) -> int:
        """`memory` or `devices` by name (a DeviceQuota's resources)."""
        return self.memory if resource == "memory" else self.devices

    def as_json(self) -> dict[str, int]:
        return {"memory": self.memory, "devices": self.devices}


ZERO = Charge()


@dataclass(frozen=True, slots=True)
class Limits:
    """A quota's `hard` (or a window's): per resource, the most its claims may hold
    together, None where it does not limit that resource."""

    memory: int | None = None
    devices: int | None = None

    def get(self, resource: str) -> int | None:
        return self.memory if resource == "memory" else self.devices

    def as_json(self) -> dict[str, int]:
        return {r: v for r in ("memory", "devices") if (v := self.get(r)) is not None}


def qualify(name: str, driver: str) -> tuple[str, str]:
    """Split a QualifiedName into (domain, id); a bare id belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    if not sep:
        return driver, name
    return domain, ident


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A DeviceClass: the selectors every request for the class must also satisfy.

    `extended_resource_name` and `created` (metadata.creationTimestamp, RFC 3339) say
    which Pod extended-resource requests the scheduler serves from it (`quota.objects.extended`).
    """

    name: DeviceClassName
    selectors: tuple[str, ...] = ()
    extended_resource_name: str | None = None
    created: str = ""
