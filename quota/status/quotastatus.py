"""The DeviceQuota status the quota controller writes: pure, from the ledger's usage.

Neighbours: `controllers.quotas` reads a DeviceQuota, calls `desired_status` with what
`quota.accounting.ledger` counts for it and writes the result back (only when it differs) through
the status subresource; `quota.accounting.reservations` owns `status.reservations` (the webhook's
persisted admissions, `quota.accounting.reservationrecord`) and its pure rules, which this module
reuses rather than restates; `quota.status.published` reads what is written here.

Two writers share one status, each owning its fields:
- the webhooks (every replica): `reservations`, `claimsThrough` and a team's
  `namespacesThrough`;
- the leader's controller: `used`, `reserved`, `claims`, `observedGeneration`,
  `conditions`, and it settles the record as any writer does
  (`quota.accounting.reservations.settle`: entries whose claim its cache holds go, raising the
  watermark; orphans go once expired), so the record shrinks even when no admission
  writes the quota again.
Both write the whole status, each built from the object it replaces: its own fields
new, every other field as read; the API server accepts the write only if that object
is still current (resourceVersion precondition), else the writer re-reads and builds
again. So neither can erase what the other wrote: a field written in between makes
the other's write a conflict, never a silent overwrite.

What the numbers mean (the same rule the webhook admits by, `quota.accounting.reservations`):
- `used`: the exact charge of the allocated claims (`status.allocation`), memory as a
  quantity string (`160Gi`, as ResourceQuota writes its status), devices a count;
- `reserved`: the estimated charge of the claims that exist unallocated, plus the
  persisted entries whose claim the controller's cache does not hold yet (admitted,
  not yet seen: usually for milliseconds, an orphan for at most one TTL);
- `reservedBy`: `reserved` split by source, written only while Kueue Workloads hold
  part of it (absent: all of `reserved` is claims'): `workloads`, what Kueue Workloads
  admitted by our AdmissionCheck hold beyond their Pods' claims (`quota.accounting.workloads`),
  and `claims`, the rest;
- `claims`: allocated and pending (existing, unallocated) claims;
- `namespaces` (a ClusterDeviceQuota's only): the same numbers per member namespace
  (`quota.accounting.teams`), sorted by namespace, as OpenShift's ClusterResourceQuota shows them;
  `used`, `reserved` and `claims` are then the team's totals;
- `effectiveHard`, `activeWindow`, `nextChange` (a quota with `spec.windows` only): the
  `hard` in force at the controller's clock, the window that sets it (absent: none) and
  when it next changes (absent: not within 400 days), `quota.quotas.windows.effective`;
- `Exceeded`: `used + reserved` above the `hard` in force for some resource (someone
  lowered `hard`, a window closed, Audit enforcement, an allocation accounted in
  account-only mode);
- `NamespacesListed` (a ClusterDeviceQuota's only): False (`TooManyNamespaces`) while the
  team has more members than the breakdown lists (`MAX_NAMESPACES`);
- `Ready` False (`InvalidSelector`): a `spec.devices` selector does not compile; it
  selects every device meanwhile (`quota.quotas.scope`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from quota.accounting.reservationrecord import Record, status_fields
from quota.accounting.reservations import Caches, in_flight, settle
from quota.quotas.devicequota import (
    RESOURCES,
    Amounts,
    ClusterDeviceQuotaStatus,
    Condition,
    DeviceQuota,
    DeviceQuotaStatus,
    LimitAmounts,
    NamespaceUsage,
    Usage,
    format_resource,
)
from quota.quotas.scope import selection_problems
from quota.quotas.windows import Effective, effective, hard_note, utc_stamp
from quota.status.leases import micro_time
from quota.values.model import ZERO, Charge, Limits
from quota.values.quantity import format_quantity
from quota.values.raw import as_map

__all__ = ["CONTROLLER_FIELDS", "MAX_NAMESPACES", "InForce", "boundary", "desired_status", "in_force", "next_change", "next_expiry"]

CONTROLLER_FIELDS = ("used", "reserved", "reservedBy", "claims", "observedGeneration", "conditions", "namespaces",
                     "effectiveHard", "activeWindow", "nextChange")
# Members a ClusterDeviceQuota's status lists (the CRD's maxItems): one item is about 150
# bytes, so the object stays far below etcd's request limit. Past it the status lists the
# first ones by name and the totals still count every member.
MAX_NAMESPACES = 2000


def desired_status(
    obj: Mapping[str, Any],
    quota: DeviceQuota,
    record: Record,
    *,
    usage: Usage,
    caches: Caches,
    now: float,
    members: Sequence[tuple[str, Usage]] | None = None,
    namespaces: int | None = None,
    windows: InForce | None = None,
) -> DeviceQuotaStatus:
    """The whole status `obj` should have: the controller's fields new, the rest as read.

    `record` is the reservation record parsed from `obj`, `caches` what this replica's
    caches know of its uids (`quota.accounting.reservations.Caches`). Deterministic for an
    unchanged input (a condition's lastTransitionTime moves only when its status does),
    so comparing the result with the current status says whether a write is needed.
    `members`: a ClusterDeviceQuota's member namespaces, each with its part of `usage`;
    `namespaces`: the newest Namespace this replica has seen (`quota.accounting.reservations.settle`);
    `windows`: `in_force(quota, now)` as the caller keeps it (None: computed here).
    """
    # The other writer's fields as read: the API server pruned what the schema does not name.
    status = cast(ClusterDeviceQuotaStatus, dict(obj.get("status") or {}))
    live = settle(record, caches, now=now, namespaces=namespaces)
    reserved = usage.reserved + in_flight(live, caches, leases=False)
    generation = (obj.get("metadata") or {}).get("generation")
    fields = status_fields(live)
    status["reservations"] = fields["reservations"]
    if "claimsThrough" in fields:
        status["claimsThrough"] = fields["claimsThrough"]
    if "namespacesThrough" in fields:
        status["namespacesThrough"] = fields["namespacesThrough"]
    status["used"] = _amounts(usage.used)
    status["reserved"] = _amounts(reserved)
    # By source, for dashboards and queue admins: what admitted Kueue Workloads hold
    # beyond their Pods' claims (`quota.accounting.workloads`), and the rest. Only while Workloads
    # hold something: without Kueue, `kubectl describe` showed an empty split.
    # Leases (`quota.accounting.headroom`) apart: room replicas hold for admissions they make without
    # a write, part of it perhaps claims already counted in `reserved` (only the holder
    # knows which), so that `used + reserved` stays what the claims take.
    leases = sum((r.charge for r in live.held.values() if r.source == "Lease"), ZERO)
    if usage.workloads.is_zero() and leases.is_zero():
        status.pop("reservedBy", None)
    else:
        status["reservedBy"] = {"claims": _amounts(reserved - usage.workloads),
                                "workloads": _amounts(usage.workloads)}
        if not leases.is_zero():
            status["reservedBy"]["leases"] = _amounts(leases)
    status["claims"] = {"allocated": usage.allocated_claims, "pending": usage.pending_claims}
    if members is not None:
        status["namespaces"] = [_member(namespace, part, live, caches)
                                for namespace, part in sorted(members)[:MAX_NAMESPACES]]
    if isinstance(generation, int):
        status["observedGeneration"] = generation
    hard, note = _in_force(status, quota, windows or in_force(quota, now))
    conditions = [_ready(quota, generation), _exceeded(hard, note, usage.used + reserved, generation)]
    if members is not None:
        conditions.append(_listed(len(members), generation))
    if not quota.scope.everything and quota.hard.memory is not None:
        conditions.append(_unmetered(usage.unmetered_claims, generation))
    status["conditions"] = _keep_transitions(status.get("conditions"), conditions, now)
    return status


@dataclass(frozen=True, slots=True)
class InForce:
    """A quota's windows at an instant: the state (`quota.quotas.windows.effective`) and why its hard
    is what it is (`quota.quotas.windows.hard_note`). Holds until `state.next_change`."""

    state: Effective
    note: str


def in_force(quota: DeviceQuota, now: float) -> InForce | None:
    """None for a quota without windows. Up to a few thousand steps for a schedule that
    opens every minute: a caller writing often keeps it until `state.next_change`."""
    if not quota.windows:
        return None
    at = datetime.fromtimestamp(now, UTC)
    return InForce(effective(quota.hard, quota.windows, at), hard_note(quota.hard, quota.windows, at))


def _in_force(status: ClusterDeviceQuotaStatus, quota: DeviceQuota, windows: InForce | None) -> tuple[Limits, str]:
    """The `hard` in force and why, its fields set on `status` for a quota with windows and
    removed from one without."""
    if windows is None:
        status.pop("effectiveHard", None)
        status.pop("activeWindow", None)
        status.pop("nextChange", None)
        return quota.hard, ""
    state = windows.state
    status["effectiveHard"] = _limits(state.hard)
    if state.window is None:
        status.pop("activeWindow", None)
    else:
        status["activeWindow"] = state.window
    if state.next_change is None:
        status.pop("nextChange", None)
    else:
        status["nextChange"] = utc_stamp(state.next_change)
    return state.hard, windows.note


def _limits(hard: Limits) -> LimitAmounts:
    out: LimitAmounts = {}
    if hard.memory is not None:
        out["memory"] = format_quantity(hard.memory)
    if hard.devices is not None:
        out["devices"] = hard.devices
    return out


def next_change(status: DeviceQuotaStatus) -> float | None:
    """When the `hard` in force written in `status` changes next (the controller wakes then)."""
    stamp = status.get("nextChange")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def boundary(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the Event a status write from `before` to `after` makes when the
    `hard` in force changed: a window opened (`WindowOpened`), closed (`WindowClosed`), or
    the hard in force moved with the same window (`HardInForceChanged`: a spec edit). None
    when neither status has windows' fields, or nothing of them changed."""
    was, now = before.get("activeWindow"), after.get("activeWindow")
    hard_was, hard_now = before.get("effectiveHard"), after.get("effectiveHard")
    if was == now and (hard_was is None or hard_was == hard_now):
        return None
    shown = ", ".join(f"{r}={v}" for r in ("memory", "devices") if (v := as_map(hard_now).get(r)) is not None)
    change = after.get("nextChange")
    until = f" until {change}" if isinstance(change, str) else ""
    if now is None and was is not None:
        if hard_now is None:  # the windows were removed from the spec while this one was open
            return "WindowClosed", f"window '{was}' closed: removed from spec.windows, spec.hard in force"
        return "WindowClosed", f"window '{was}' closed: hard in force {shown} (spec.hard){until}"
    if now is not None and was != now:
        closed = f"window '{was}' closed and " if was is not None else ""
        return "WindowOpened", f"{closed}window '{now}' opened: hard in force {shown}{until}"
    if hard_now is None:
        return None  # windows removed from the spec outside any window
    return "HardInForceChanged", f"hard in force {shown}{until}"


def _member(namespace: str, part: Usage, live: Record, caches: Caches) -> NamespaceUsage:
    reserved = part.reserved + in_flight(live, caches, namespace=namespace, leases=False)
    return {"namespace": namespace, "used": _amounts(part.used), "reserved": _amounts(reserved),
            "claims": {"allocated": part.allocated_claims, "pending": part.pending_claims}}


def next_expiry(record: Record, now: float) -> float | None:
    """When the earliest entry still live at `now` expires (the controller wakes then)."""
    return min((r.expires for r in record.held.values() if r.expires > now), default=None)


def _amounts(charge: Charge) -> Amounts:
    """Memory as a quantity (`160Gi`), as ResourceQuota's status and the printer columns
    beside `spec.hard` read; devices as a count. `quota.status.published` prints both as integers."""
    return {"memory": format_quantity(charge.memory), "devices": charge.devices}


def _ready(quota: DeviceQuota, generation: Any) -> Condition:
    """Ready unless a `spec.devices` selector does not compile: such a selector selects
    every device (`quota.quotas.scope`), so the quota still holds, but counts more than meant."""
    problems = selection_problems(quota.scope.devices.expressions)
    if problems:
        return _condition("Ready", False, "InvalidSelector", "; ".join(problems) + ": until it is fixed, that "
                          "selector selects every device (the quota counts more, never less)", generation)
    return _condition("Ready", True, "Counted", "usage counted from the allocated and pending claims", generation)


def _exceeded(hard: Limits, note: str, total: Charge, generation: Any) -> Condition:
    """Against the `hard` in force; `note` says which window set it or ended ("": spec.hard)."""
    over = [r for r in RESOURCES if (limit := hard.get(r)) is not None and total.amount(r) > limit]
    if not over:
        return _condition("Exceeded", False, "WithinHard", "used + reserved is within hard", generation)
    message = "; ".join(f"used + reserved {format_resource(r, total.amount(r))} is above hard "
                        f"{format_resource(r, hard.get(r) or 0)}" for r in over)
    return _condition("Exceeded", True, "AboveHard", message + (f" ({note})" if note else ""), generation)


def _listed(members: int, generation: Any) -> Condition:
    """A team's `NamespacesListed`: whether `status.namespaces` shows every member, so an
    admin reading a truncated breakdown is told so (the totals always count every one)."""
    if members <= MAX_NAMESPACES:
        return _condition("NamespacesListed", True, "AllListed",
                          f"status.namespaces lists all {members} member namespaces", generation)
    return _condition("NamespacesListed", False, "TooManyNamespaces",
                      f"status.namespaces lists the first {MAX_NAMESPACES} of {members} member namespaces by name; "
                      "used, reserved and claims count every one, and the metric "
                      "draquota_cluster_quota_namespace shows the largest parts and the rest summed as \"(other)\"; "
                      "the namespaces not listed get no AppliedClusterDeviceQuota (their tenants do not see the "
                      "team's budget)",
                      generation)


def _unmetered(claims: int, generation: Any) -> Condition:
    """`UnmeteredDevices` on a quota that limits memory and names classes or drivers: True
    while it counts claims whose devices have no memory (an RDMA NIC), each charged 0
    memory, so an admin sees what the admission warnings told the claims' creators."""
    if not claims:
        return _condition("UnmeteredDevices", False, "AllMetered",
                          "every device the quota counts has a memory", generation)
    return _condition("UnmeteredDevices", True, "CountedAtZeroMemory",
                      f"{claims} claim(s) counted hold or may get devices without a memory, each charged 0 memory and "
                      "1 device: configure a memory source for their driver (docs/charging.md, \"Devices without a "
                      "memory\"), or scope the quota to leave their class out", generation)


def _condition(kind: str, status: bool, reason: str, message: str, generation: Any) -> Condition:
    out: Condition = {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message}
    if isinstance(generation, int):
        out["observedGeneration"] = generation
    return out


def _keep_transitions(old: Any, new: list[Condition], now: float) -> list[Condition]:
    """`new`, each with the previous lastTransitionTime while its status is unchanged.

    Conditions of other types (none are written by anyone else today) are kept as read.
    """
    previous = {c.get("type"): c for c in old if isinstance(c, dict)} if isinstance(old, list) else {}
    ours = {c["type"] for c in new}
    out: list[Condition] = []
    for condition in new:
        before = previous.get(condition["type"]) or {}
        same = before.get("status") == condition["status"] and before.get("lastTransitionTime")
        stamp = str(before["lastTransitionTime"]) if same else micro_time(now)
        out.append({**condition, "lastTransitionTime": _seconds(stamp)})
    out.extend(cast(Condition, c) for t, c in previous.items() if t not in ours)  # as the CRD schema admits
    return out


def _seconds(stamp: str) -> str:
    """metav1.Time has second precision: the API server would round anything finer."""
    return stamp[:19] + "Z" if len(stamp) > 20 else stamp
