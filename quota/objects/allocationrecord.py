"""The allocation record: what each allocated device charged, kept on the claim by the leader.

Neighbours: `quota.pricing.allocated.AllocatedPricer` builds it (`Pricing.record`) and reads it
(`recorded`: a deallocated claim's last allocation; a device that left the inventory);
`quota.objects.claims.parse_claim` reads it off the claim (`Claim.recorded_devices`);
`quota.admission.annotating` says when the leader must write it (`controllers.annotator` writes);
`webhook.claimreview` refuses any other value. Pure.

Two annotations, because releases before this one read only the first:
- `draquota.io/allocated-charge`, by device: `{"driver/pool/device": bytes}`, the memory
  of a device's results summed. Always written. Every release reads it.
- `draquota.io/allocation-results`, by result: `{"request:driver/pool/device[#shareID]":
  bytes}`. Written, and read, only on a claim of several device classes: a device two of
  them select could have served either request, and a quota scoped by class counts it
  by its request's class. Read only where every key names one of the claim's requests
  and it agrees with the first (the same devices and memory): a release that does not
  know it rewrites the first alone, and the second then says an older allocation. On a
  claim of one class the first says all there is (each device is of that class); its
  shares of one device read as one device.

A release that knew only the first saw the second as a foreign annotation, so during a
rolling upgrade every replica reads a record it understands (a record by result in the
first annotation would read, on an older replica, as devices of an unknown driver, which
a quota scoped by driver then counts at 0).

What the second cannot tell (docs/development/reservations.md): the release before neither guards nor
rewrites it, so one a tenant set on a claim before the upgrade, or one an older leader
left standing after reallocating the same devices to other requests (a rollback), is
read while it agrees by device, until the leader rewrites it (an allocated claim's at
once; a deallocated claim's once it sees the claim allocated again).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol

from quota.values.model import DeviceKey, RecordKey
from quota.values.raw import small_json
from quota.values.validation import MAX_INT64

__all__ = [
    "ALLOCATED_CHARGE_ANNOTATION",
    "ALLOCATION_RESULTS_ANNOTATION",
    "RECORD_ANNOTATIONS",
    "Recorded",
    "by_device",
    "record_annotations",
    "record_in_step",
    "recorded_devices",
]

ALLOCATED_CHARGE_ANNOTATION = "draquota.io/allocated-charge"
ALLOCATION_RESULTS_ANNOTATION = "draquota.io/allocation-results"
RECORD_ANNOTATIONS = (ALLOCATED_CHARGE_ANNOTATION, ALLOCATION_RESULTS_ANNOTATION)

# One entry per allocation result (at most 32, dra-api.md), each key at most 63 + 1 + 63
# (request/subrequest) + 1 + 63 + 253 + 63 (the device) + 1 + 36 (a shareID) characters
# and its value an int64: anything longer is not ours.
_MAX_BYTES = 32 * 1024

Entries = tuple[tuple[RecordKey, int], ...]


class Recorded(Protocol):
    """A claim as the record's rules need it (`quota.objects.claims.Claim`)."""

    @property
    def recorded_devices(self) -> Entries: ...

    @property
    def several_classes(self) -> bool: ...


def recorded_devices(annotations: Mapping[str, Any], *, requests: Collection[str] = ()) -> Entries:
    """The record a claim's annotations carry: (result, memory bytes) pairs, sorted; by
    result on a claim of several classes (its `requests`, top-level and subrequests, given:
    none for one of one class) where the second annotation names only those and agrees
    with the first (module doc), else by device (`RecordKey.request` ""). Empty when
    absent, malformed or not ours: never an error (the leader rewrites it, and the
    webhook refuses anyone else's)."""
    devices = _parse(annotations.get(ALLOCATED_CHARGE_ANNOTATION), by_result=False)
    if requests:
        results = _parse(annotations.get(ALLOCATION_RESULTS_ANNOTATION), by_result=True)
        if results and all(key.request in requests for key, _ in results) and \
                by_device(dict(results)) == dict(devices):
            return results
    return devices


def by_device(record: Mapping[RecordKey, int]) -> dict[RecordKey, int]:
    """`record` as the first annotation says it: each device's results summed."""
    out: dict[RecordKey, int] = {}
    for key, memory in record.items():
        device = RecordKey("", key.device)
        out[device] = out.get(device, 0) + memory
    return out


def record_annotations(claim: Recorded, record: Mapping[RecordKey, int]) -> dict[str, str]:
    """The annotations that say `record` on `claim`: the first always, the second on a
    claim of several classes (module doc)."""
    out = {ALLOCATED_CHARGE_ANNOTATION: _json(by_device(record))}
    if claim.several_classes:
        out[ALLOCATION_RESULTS_ANNOTATION] = _json(record)
    return out


def record_in_step(claim: Recorded, record: Mapping[RecordKey, int]) -> bool:
    """Whether `claim`'s record says `record`, as the leader would write it: on a claim of
    one class, by device (an upgrade rewrites no such record); on one of several, result
    by result."""
    recorded = dict(claim.recorded_devices)
    if claim.several_classes:
        return recorded == record
    return _device_sums(recorded.items()) == _device_sums(record.items())


def _device_sums(pairs: Iterable[tuple[RecordKey, int]]) -> dict[DeviceKey, int]:
    """`by_device`, keyed by the devices themselves: the same comparison without a
    RecordKey built and hashed per device (the leader checks every allocated claim's
    record this way as a list brings it)."""
    out: dict[DeviceKey, int] = {}
    for key, memory in pairs:
        out[key.device] = out.get(key.device, 0) + memory
    return out


def _json(record: Mapping[RecordKey, int]) -> str:
    return json.dumps({str(k): v for k, v in sorted(record.items(), key=lambda kv: str(kv[0]))},
                      separators=(",", ":"))


def _parse(raw: Any, *, by_result: bool) -> Entries:
    data = small_json(raw, max_bytes=_MAX_BYTES)
    if not isinstance(data, dict):
        return ()
    out: list[tuple[RecordKey, int]] = []
    for text, memory in data.items():
        key = _record_key(text)
        # Each annotation in its own form only: a by-result key in the first would be
        # counted beside the same device's by-device key.
        if key is None or bool(key.request) != by_result or type(memory) is not int or not 0 <= memory <= MAX_INT64:
            return ()
        out.append((key, memory))
    return tuple(sorted(out, key=lambda item: str(item[0])))


def _record_key(text: str) -> RecordKey | None:
    # A request name has no ":" or "#" (a DNS label, or two: "req/sub"), a driver no ":"
    # or "#", a pool or device no "#" (DNS subdomains and labels).
    request, colon, rest = text.partition(":")
    if not colon:
        request, rest = "", text
    elif not request:
        return None
    rest, hash_, share = rest.partition("#")
    driver, _, rest = rest.partition("/")
    pool, _, device = rest.rpartition("/")
    if not (driver and pool and device) or (hash_ and not share) or (share and not request):
        return None
    return RecordKey(request, DeviceKey(driver, pool, device), share)
