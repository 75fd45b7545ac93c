"""The reservations record on a DeviceQuota's status: its entries, bounds, parsing and writing.

Neighbours: `quota.accounting.reservations` decides on the record (the watermark protocol, read its
docstring first: `settle`, `apply`, `in_flight`); `kube.statuswriter` reads it off the
DeviceQuota it fetched (`parse_record`) and writes it back (`status_fields`);
`kube.caches` and the webhook read resourceVersions as the watermark compares them
(`parse_version`). Pure: no clock, no I/O.

The record, on the DeviceQuota's status:

    reservations:            # admissions in flight, keyed by the claim's uid
      <uid>: {claim: <namespace>/<name>, memory: <quantity>, devices: <n>, expires: <RFC 3339>}
      # an allocation's excess over its claim's reservation (`quota.accounting.excess`, its own rule)
      allocation.<uid>.<resourceVersion>: {claim: <namespace>/<name>, memory: ..., devices: ..., expires: ...}
    claimsThrough: "<resourceVersion>"   # the watermark
    namespacesThrough: "<resourceVersion>"  # a ClusterDeviceQuota's only (`quota.accounting.reservations.apply`)

The record is bounded: at most MAX_ENTRIES entries (the CRD says the same), past which
`quota.accounting.reservations.apply` refuses admissions into that quota with a message naming it; in steady state it
holds only the admissions of the last watch lag. A team's record (a ClusterDeviceQuota,
shared by its namespaces) also holds at most MAX_ENTRIES_PER_NAMESPACE entries of any one
namespace: an admission whose create then fails (a mutating webhook reserves before the
API server validates the object, so a tenant chooses that) holds its entry until the
TTL, and one namespace's failed creates must not fill the record its teammates admit
into. `reservations` is an atomic map in the CRD, so the API server keeps one
managedFields entry for it, not one per uid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from quota.quotas.devicequota import ClusterDeviceQuotaStatus, ReservationEntry
from quota.values.model import Charge
from quota.values.quantity import ceil_int, format_quantity, parse_quantity

__all__ = ["MAX_ENTRIES", "MAX_ENTRIES_PER_NAMESPACE", "Record", "Reservation", "Source", "parse_record",
           "parse_version", "status_fields"]

# Entries one DeviceQuota's record may hold (the CRD's maxProperties): about 150 bytes
# each, so the object stays far below etcd's 1.5 MiB request limit.
MAX_ENTRIES = 1000
# Claim entries of one namespace a team's record may hold: a quarter, so no one
# namespace's admissions (orphans included) fill what its teammates share. In steady state a
# namespace holds its creates of the last watch lag: 250 is over a second at 200 a second.
MAX_ENTRIES_PER_NAMESPACE = MAX_ENTRIES // 4
Source = Literal["Claim", "Workload", "Lease"]


@dataclass(frozen=True, slots=True)
class Reservation:
    uid: str
    claim: str  # namespace/name, for people reading the status
    charge: Charge
    expires: float  # seconds since the epoch
    source: Source = "Claim"

    def as_json(self) -> ReservationEntry:
        stamp = datetime.fromtimestamp(self.expires, timezone.utc).isoformat(timespec="milliseconds")
        # Memory as a quantity (`80Gi`), as status.used and status.reserved write it, so
        # `kubectl describe` reads one unit throughout; exact (format_quantity never rounds).
        out: ReservationEntry = {"claim": self.claim, "memory": format_quantity(self.charge.memory),
                                 "devices": self.charge.devices, "expires": stamp.replace("+00:00", "Z")}
        if self.source != "Claim":
            out["source"] = self.source
        return out


@dataclass(frozen=True, slots=True)
class Record:
    """`status.reservations`, `status.claimsThrough` and a team's `status.namespacesThrough`
    (None: no watermark yet)."""

    held: Mapping[str, Reservation] = field(default_factory=dict)
    through: int | None = None
    namespaces: int | None = None



def parse_version(value: Any) -> int | None:
    """A resourceVersion as the integer etcd made it; None for anything else.

    resourceVersions are opaque to clients in general, but the claim watch and the
    claims it delivers come from one storage: etcd's revisions, ordered integers (the
    same order the watch cache and `resourceVersionMatch` rely on).
    """
    if isinstance(value, str) and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def parse_record(status: Any) -> Record:
    """The record as `status_fields` writes it; malformed entries are skipped.

    Skipping is safe only because the API server validates the status against the CRD
    schema: what reaches us was written by a dra-quota replica.
    """
    status = status if isinstance(status, dict) else {}
    raw = status.get("reservations")
    held: dict[str, Reservation] = {}
    for uid, entry in raw.items() if isinstance(raw, dict) else ():
        try:
            expires = datetime.fromisoformat(str(entry["expires"]).replace("Z", "+00:00")).timestamp()
            # A quantity, or bytes as an integer (records written before 0.2).
            charge = Charge(ceil_int(parse_quantity(entry.get("memory") or 0)), int(entry.get("devices") or 0))
            if charge.memory < 0 or charge.devices < 0:
                continue
            raw_source = entry.get("source")
            source: Source = raw_source if raw_source in ("Workload", "Lease") else "Claim"
            held[str(uid)] = Reservation(str(uid), str(entry.get("claim") or ""), charge, expires, source)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return Record(held, parse_version(status.get("claimsThrough")), parse_version(status.get("namespacesThrough")))


def status_fields(record: Record) -> ClusterDeviceQuotaStatus:
    """The status fields this protocol owns: the entries and the watermarks (a
    ClusterDeviceQuotaStatus: `namespacesThrough` is a team's, absent for a DeviceQuota).

    `status.reserved` is the quota controller's (`quota.status.quotastatus`): it counts the
    pending claims too, and one owner per field keeps the two writers from undoing
    each other's numbers.
    """
    out: ClusterDeviceQuotaStatus = {"reservations": {uid: r.as_json() for uid, r in sorted(record.held.items())}}
    if record.through is not None:
        out["claimsThrough"] = str(record.through)
    if record.namespaces is not None:
        out["namespacesThrough"] = str(record.namespaces)
    return out
