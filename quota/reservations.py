"""Persisted reservations on a DeviceQuota's status: the state and the pure decision.

Neighbours: `webhook.reservations` reads a DeviceQuota, calls `apply` and writes the
result back through the status subresource with a resourceVersion precondition;
`quota.devicequota.check` is the check itself; `quota.ledger` supplies the usage this
replica's claim cache sees. Pure: no clock (`now` is passed in), no I/O.

The record, `status.reservations`, a map keyed by the claim's uid:

    reservations:
      <uid>: {claim: <namespace>/<name>, memory: <bytes>, devices: <n>, expires: <RFC 3339>}
    reserved: {memory: <sum of the entries' memory>, devices: <sum of their devices>}

Why this is enough for N replicas: every writer checks against the object it is about
to replace and the API server accepts the write only if nobody wrote in between (the
resourceVersion precondition, like the in-tree quota admission plugin's
`UpdateStatus` in staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/
controller.go). So two admissions can never both be granted the same headroom: one of
them is refused with a conflict, re-reads, and checks again.

What counts against `hard` for one replica: `used` and the pending claims of its own
claim cache (the ledger), plus every persisted entry whose claim that cache does not
hold yet. A claim is counted once: by its entry until this replica's watch delivers
the claim, by the claim afterwards.

Expiry (the TTL, `dra-quota serve --reservation-ttl`, 60 s by default): an entry is
dropped by whichever replica next writes the quota once it expired, whether its claim
was persisted or not (a later webhook denied the create, the create failed). No leader
is needed: dropping is part of an ordinary conditional write. An entry whose claim is
in the cache ("confirmed") is deliberately kept until it expires too: another replica
whose watch lags may not hold the claim yet, and without the entry it would count the
claim nowhere. The assumption, stated: every replica's claim watch lags less than the
TTL, and the replicas' clocks agree to well within it. An entry whose claim this
replica saw deleted (`gone`) is dropped at once, as is one released by a claim DELETE.

What a status reader sees: the entries admitted in the last TTL, confirmed or not.
`status.used`, `status.reserved` (pending claims plus entries whose claim is not seen
yet) and the conditions are the leader-elected quota controller's (`quota.quotastatus`
says how the two writers share the status); that controller also drops expired
entries when no admission writes the quota again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from quota.devicequota import Decision, DeviceQuota, QuotaCheck, Usage, check
from quota.extended import in_series
from quota.model import ZERO, Charge

__all__ = ["Held", "Outcome", "Request", "Reservation", "apply", "counting", "outstanding", "parse_reservations",
           "status_fields"]


@dataclass(frozen=True, slots=True)
class Reservation:
    uid: str
    claim: str  # namespace/name, for people reading the status
    charge: Charge
    expires: float  # seconds since the epoch

    def as_json(self) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(self.expires, timezone.utc).isoformat(timespec="milliseconds")
        return {"claim": self.claim, "memory": self.charge.memory, "devices": self.charge.devices,
                "expires": stamp.replace("+00:00", "Z")}


Held = Mapping[str, Reservation]


@dataclass(frozen=True, slots=True)
class Request:
    op: Literal["reserve", "release"]
    uid: str
    claim: str = ""
    charge: Charge = ZERO
    # A reserve for the scheduler's claim for a Pod's extended resources: the series of
    # that Pod's attempts (`quota.extended.attempt_series`), whose unconfirmed entries
    # this one replaces.
    series: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    held: dict[str, Reservation]
    # One per request, in order; a release is always allowed.
    decisions: tuple[Decision, ...]
    changed: bool


def parse_reservations(status: Any) -> dict[str, Reservation]:
    """`status.reservations` as written by `status_fields`; malformed entries are skipped.

    Skipping is safe only because the API server validates the status against the CRD
    schema: what reaches us was written by a dra-quota replica.
    """
    raw = status.get("reservations") if isinstance(status, dict) else None
    out: dict[str, Reservation] = {}
    for uid, entry in (raw or {}).items() if isinstance(raw, dict) else ():
        try:
            expires = datetime.fromisoformat(str(entry["expires"]).replace("Z", "+00:00")).timestamp()
            charge = Charge(int(entry.get("memory") or 0), int(entry.get("devices") or 0))
            out[str(uid)] = Reservation(str(uid), str(entry.get("claim") or ""), charge, expires)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def status_fields(held: Held) -> dict[str, Any]:
    """The status field this protocol owns: the entries.

    `status.reserved` is the quota controller's (`quota.quotastatus`): it counts the
    pending claims too, and one owner per field keeps the two writers from undoing
    each other's numbers.
    """
    return {"reservations": {uid: r.as_json() for uid, r in sorted(held.items())}}


def counting(held: Held, *, gone: Callable[[str], bool], now: float) -> dict[str, Reservation]:
    """The entries still counting: not expired, and their claim not seen deleted."""
    return {uid: r for uid, r in held.items() if r.expires > now and not gone(uid)}


def outstanding(held: Held, *, cached: Callable[[str], bool]) -> Charge:
    """What `held` adds to a replica's claim cache: the entries whose claim it does not hold."""
    return sum((r.charge for uid, r in held.items() if not cached(uid)), ZERO)


def apply(
    quota: DeviceQuota,
    held: Held,
    requests: Sequence[Request],
    *,
    usage: Usage,
    cached: Callable[[str], bool],
    gone: Callable[[str], bool],
    now: float,
    ttl: float,
) -> Outcome:
    """Apply `requests` in order to the entries `held` on `quota`'s status.

    `usage` is what this replica's claim cache counts for the quota, `cached(uid)` says
    whether that cache holds the claim (then its entry is not counted again), `gone(uid)`
    whether it saw the claim deleted. Expired and gone entries are dropped first. A
    reserve for a uid already held replaces that entry (a retried review never counts
    twice); a denied retry keeps the earlier entry, whose answer may have been delivered.
    A reserve with a `series` first drops the entries of earlier attempts of that series
    that this replica's cache does not hold: the scheduler retries a Pod's
    extended-resource claim forever, and when an admission step after ours refuses each
    attempt, entries left to expire would fill the quota with claims that do not exist
    (one Pod asking 1 device held 4 of a quota of 4 on the e2e cluster). One whose claim
    is cached is kept: it exists, and is counted once, through the cache.
    """
    live = counting(held, gone=gone, now=now)
    changed = len(live) != len(held)
    decisions: list[Decision] = []
    for request in requests:
        if request.op == "reserve" and request.series:
            stale = [uid for uid, r in live.items()
                     if uid != request.uid and not cached(uid) and in_series(r.claim, request.series)]
            for uid in stale:
                del live[uid]
            changed = changed or bool(stale)
        previous = live.pop(request.uid, None)
        if request.op == "release":
            changed = changed or previous is not None
            decisions.append(Decision(True))
            continue
        pending = outstanding(live, cached=cached)
        decision = check([QuotaCheck(quota, Usage(usage.used, usage.reserved + pending), request.charge)])
        if decision.allowed:
            live[request.uid] = Reservation(request.uid, request.claim, request.charge, now + ttl)
            changed = True
        elif previous is not None:
            live[request.uid] = previous
        decisions.append(decision)
    return Outcome(live, tuple(decisions), changed)
