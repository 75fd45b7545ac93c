"""Leader election on a coordination.k8s.io/v1 Lease: the record and the pure decisions.

Neighbours: `controllers.leader` reads and writes the Lease through `kube.api` and asks
this module whether it may take it and what to write; the quota controller
(`controllers.quotas`) runs only while that loop leads. Pure: the clocks are passed in.

The rules are client-go's (k8s.io/client-go tools/leaderelection/leaderelection.go):
- a candidate never trusts another replica's wall clock: a lease held by someone else
  has expired when *this* replica has watched its record stay unchanged for
  `leaseDurationSeconds` on its own monotonic clock (`Observed`), so clock skew between
  replicas cannot make two leaders;
- a lease with no holder (released on shutdown) or held by our own identity (a restart
  of the same Pod) may be taken at once;
- the leader renews every retry period and stops leading once it has failed to renew
  for the renew deadline, which is shorter than the lease duration: it steps down
  before any candidate may step up.
Timestamps written are real UTC in the Lease's MicroTime format (RFC 3339 with
microseconds, `Z`), unlike kubernetes_asyncio's elector, which stamps local time as UTC.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = ["LeaseRecord", "Observed", "Timing", "acquired", "may_acquire", "micro_time", "observe", "parse_lease",
           "released"]


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds; controller-runtime's defaults (pkg/leaderelection, manager options)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def problem(self) -> str | None:
        """Why these timings cannot work, or None (client-go's NewLeaderElector checks)."""
        if min(self.lease_duration, self.renew_deadline, self.retry_period) <= 0:
            return "lease duration, renew deadline and retry period must be positive"
        if self.lease_duration <= self.renew_deadline:
            return "the lease duration must be longer than the renew deadline"
        if self.renew_deadline <= 1.2 * self.retry_period:  # client-go's JitterFactor
            return "the renew deadline must be longer than 1.2 x the retry period"
        return None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str
    duration_seconds: int
    acquire_time: str
    renew_time: str
    transitions: int
    resource_version: str


@dataclass(frozen=True, slots=True)
class Observed:
    """A record and when (this replica's monotonic clock) it was first seen as it is."""

    record: LeaseRecord
    since: float


def parse_lease(obj: Mapping[str, Any]) -> LeaseRecord:
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(spec, dict) and isinstance(meta, dict)

    def number(key: str) -> int:
        value = spec.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_seconds=number("leaseDurationSeconds"),
        acquire_time=str(spec.get("acquireTime") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        transitions=number("leaseTransitions"),
        resource_version=str(meta.get("resourceVersion") or ""),
    )


def observe(previous: Observed | None, record: LeaseRecord, now: float) -> Observed:
    """`record` as seen at `now`; the clock keeps running while the record is unchanged.

    Unchanged means the same holder and renewTime: a resourceVersion alone may move for
    writes that renew nothing (labels), and those must not extend anyone's lease.
    """
    if previous is not None and (previous.record.holder, previous.record.renew_time) == (record.holder, record.renew_time):
        return Observed(record, previous.since)
    return Observed(record, now)


def may_acquire(observed: Observed, identity: str, now: float) -> bool:
    """May `identity` write itself as holder now (monotonic `now`)?"""
    record = observed.record
    if not record.holder or record.holder == identity:
        return True
    return now - observed.since >= record.duration_seconds


def micro_time(seconds: float) -> str:
    """A Unix time as a MicroTime: `2026-11-23T20:30:00.123456Z`, always UTC."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def acquired(current: LeaseRecord | None, identity: str, *, wall: float, duration: float) -> dict[str, Any]:
    """The spec that makes `identity` the holder at Unix time `wall` (acquire or renew)."""
    renewing = current is not None and current.holder == identity
    stamp = micro_time(wall)
    # client-go counts every change of holder, a take-over after a release included.
    transitions = 0 if current is None else current.transitions + (0 if renewing else 1)
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": max(1, math.ceil(duration)),
        "acquireTime": current.acquire_time if renewing and current is not None and current.acquire_time else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }


def released(current: LeaseRecord, *, wall: float) -> dict[str, Any]:
    """The spec a leader writes on shutdown: no holder, so the next candidate takes it at once.

    As client-go's `release` (ReleaseOnCancel): a 1 s duration and fresh times, the
    transition count kept.
    """
    stamp = micro_time(wall)
    return {"holderIdentity": None, "leaseDurationSeconds": 1, "acquireTime": stamp, "renewTime": stamp,
            "leaseTransitions": current.transitions}
