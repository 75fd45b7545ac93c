"""What admission says of devices without a memory: denials for what stays unpriced,
warnings for devices a quota's scope names that have none.

Neighbours: `quota.pricing.pricer` marks each alternative of a request `unpriced` (accelerators
whose memory nothing tells, or a class with no device at all) or `unmetered` (devices
without a memory that are no accelerators, an RDMA NIC), `quota.pricing.priced` says which a
quota's scope sees, `quota.admission.admitter` turns them into denials and warnings with the
words here (docs/charging.md, "Devices without a memory" and "No free claims"). Each
message says what the cluster admin can do: configure a memory source, or scope the
quota. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from quota.quotas.devicequota import DeviceQuota
from quota.values.model import Device, DeviceClassName

__all__ = ["unmetered_warning", "unpriced_message"]

_SOURCES = "the --memory-sources file of serve and check; docs/charging.md, \"Devices without a memory\""


def _scope(quota: DeviceQuota, cls: DeviceClassName) -> str:
    if quota.scope.classes:
        return f"leave class {cls} out of the quota's spec.deviceClassNames"
    return f"scope {quota.kind} \"{quota.name}\" (spec.deviceClassNames or spec.devices) to leave class {cls} out"


def unpriced_message(quota: DeviceQuota, alternative: str, cls: DeviceClassName, devices: Iterable[Device]) -> str:
    """Why a memory limit cannot price request `alternative` of class `cls`, whose
    devices (those of the class now) are `devices`, and what the cluster admin can do."""
    drivers = sorted({d.driver for d in devices if d.is_accelerator and d.memory_capacity is None})
    head = f'{quota.kind} "{quota.name}" limits memory but request {alternative} cannot be priced: '
    if not drivers:
        return (f"{head}class {cls} has no device at all{_which(quota)}, so nothing tells what a device of it "
                f"would cost. A cluster admin can {_scope(quota, cls)} until its driver publishes devices")
    named = ", ".join(drivers)
    return (f"{head}the devices of class {cls}{_which(quota)} that could serve it are accelerators of driver "
            f"{named} with no memory: the driver publishes no memory capacity and no memory source configured for "
            f"it applies to them. A cluster admin can configure a memory source for driver {named} "
            f"({_SOURCES}), or {_scope(quota, cls)}")


def unmetered_warning(quota: DeviceQuota, alternative: str, cls: DeviceClassName, drivers: Iterable[str]) -> str:
    """A quota's scope names devices without a memory (an RDMA NIC): counted, at 0 memory."""
    named = ", ".join(drivers)
    return (f'{quota.kind} "{quota.name}" counts the devices of driver {named} that request {alternative} (class '
            f"{cls}) may get, which have no memory: each is charged 0 memory and 1 device. To charge them memory, "
            f"configure a memory source for driver {named} ({_SOURCES}); to stop counting them, "
            f"{_scope(quota, cls)}")


def _which(quota: DeviceQuota) -> str:
    return "" if quota.scope.devices.everything else " its spec.devices selects"
