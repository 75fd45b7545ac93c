"""Kueue Workloads (kueue.x-k8s.io/v1beta2) as the quota sees them: parsed, priced, held.

Neighbours: `controllers.kueue` feeds the Workloads and AdmissionChecks its reflectors see
into this module and writes our entry back; `quota.admission.admitter.Admitter.workload_entry`
turns a `Workload`'s claims into a ledger `Entry` priced like any claim;
`quota.accounting.ledger` counts what an admitted Workload holds (`Ledger.set_holding`) and
lets the claims of its Pods draw on it. Pure: no clock (`now` is passed in), no I/O.

The rule every replica derives, from the Workload alone (so a new leader rebuilds it
from a list, and nothing but our check entry is ever written):
a Workload *holds* its price while our check entry is `Ready` and it is neither
Finished nor Evicted (Kueue resets every check to Pending on eviction and
deactivation, pkg/workload/evict/evict.go). Its price is the sum over its PodSets of
`count` x the claims its pod template's `resourceClaimTemplateName`s stamp out. A
`resourceClaimName` (a claim that exists on its own) is charged by that claim and never
by the Workload (Kueue 0.19 refuses such a Workload anyway: "KueueDRAIntegration
feature does not support use of resource claims").

Matching (docs/kueue.md): our Ready entry carries `podSetUpdates` that
label every Pod of the Workload `draquota.io/workload: <Workload uid>`; Kueue copies
them into the Job's pod template when it admits (pkg/podset/podset.go Merge). A claim
the resourceclaim controller stamps for such a Pod has a controlling ownerReference to
it; the claim then draws on the Workload's holding, which is
max(0, price - the charges of its matched claims) per quota and resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from quota.quotas.devicequota import DeviceQuota, format_resource
from quota.values.model import Charge
from quota.values.raw import as_map, dig, show

__all__ = [
    "CONTROLLER_NAME",
    "MAX_POD_CLAIMS",
    "MAX_POD_SETS",
    "MAX_POD_SET_COUNT",
    "WORKLOAD_LABEL",
    "CheckEntry",
    "PodSet",
    "Workload",
    "WorkloadError",
    "check_active",
    "charge_message",
    "entry_patch",
    "holds",
    "needs_decision",
    "our_checks",
    "parse_workload",
    "too_many_claims",
]

CONTROLLER_NAME = "draquota.io/devicequota"
# Set on the Pods of an admitted Workload through our entry's podSetUpdates; its value is
# the Workload's uid (names are reused, uids never).
WORKLOAD_LABEL = "draquota.io/workload"
State = Literal["Pending", "Ready", "Retry", "Rejected"]
_STATES = ("Pending", "Ready", "Retry", "Rejected")
MAX_MESSAGE = 32768  # workload_types.go: AdmissionCheckState.message maxLength
# What a tenant's Workload may say, bounded before anything is priced (an unbounded one
# would take the memory or the time of the leader that decides every Workload):
MAX_POD_SETS = 8  # workload_types.go: spec.podSets maxItems
MAX_POD_SET_COUNT = 2**31 - 1  # PodSet.count is an int32 (a Job's parallelism)
MAX_POD_CLAIMS = 128  # resourceClaims per pod template: ours (the Pod API sets none)


class WorkloadError(ValueError):
    """A Workload this controller cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    # ResourceClaimTemplate names: each Pod stamps one claim per entry.
    templates: tuple[str, ...]
    # `resourceClaimName`s: existing claims, charged by themselves.
    claims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CheckEntry:
    name: str
    state: State
    message: str = ""
    last_transition: str = ""


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    uid: str
    pod_sets: tuple[PodSet, ...]
    checks: tuple[CheckEntry, ...]
    quota_reserved: bool
    finished: bool
    evicted: bool
    active: bool = True
    # metadata.creationTimestamp (RFC 3339, sorts as text): Kueue's FIFO order within a
    # priority, the order the leader decides Workloads waiting together.
    created: str = ""

    def check(self, name: str) -> CheckEntry | None:
        return next((c for c in self.checks if c.name == name), None)


def parse_workload(obj: Mapping[str, Any]) -> Workload:
    meta = as_map(obj.get("metadata"))
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str) and uid):
        raise WorkloadError("metadata.namespace, name and uid are required")
    pod_sets = []
    raw_sets = dig(obj, "spec", "podSets") or []
    if not isinstance(raw_sets, list) or len(raw_sets) > MAX_POD_SETS:
        raise WorkloadError(f"spec.podSets must be a list of at most {MAX_POD_SETS} (Kueue's limit), "
                            f"got {len(raw_sets) if isinstance(raw_sets, list) else show(raw_sets)}")
    for i, raw in enumerate(raw_sets):
        count = dig(raw, "count")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_POD_SET_COUNT:
            raise WorkloadError(f"spec.podSets[{i}].count must be an integer from 0 to {MAX_POD_SET_COUNT}, "
                                f"got {show(count)}")
        templates: list[str] = []
        claims: list[str] = []
        for ref in dig(raw, "template", "spec", "resourceClaims") or []:
            if isinstance(template := dig(ref, "resourceClaimTemplateName"), str) and template:
                templates.append(template)
            elif isinstance(claim := dig(ref, "resourceClaimName"), str) and claim:
                claims.append(claim)
        pod_sets.append(PodSet(str(dig(raw, "name") or f"podset-{i}"), count, tuple(templates), tuple(claims)))
    checks = []
    for raw in dig(obj, "status", "admissionChecks") or []:
        state = dig(raw, "state")
        if isinstance(dig(raw, "name"), str) and state in _STATES:
            checks.append(CheckEntry(raw["name"], state, str(dig(raw, "message") or ""),
                                     str(dig(raw, "lastTransitionTime") or "")))
    conditions = {c.get("type"): c.get("status") for c in dig(obj, "status", "conditions") or [] if isinstance(c, dict)}
    return Workload(
        namespace, name, uid, tuple(pod_sets), tuple(checks),
        quota_reserved=conditions.get("QuotaReserved") == "True",
        finished=conditions.get("Finished") == "True",
        evicted=conditions.get("Evicted") == "True",
        active=dig(obj, "spec", "active") is not False,
        created=str(meta.get("creationTimestamp") or ""),
    )


def too_many_claims(workload: Workload) -> str:
    """Why the Workload is not priced at all (its check says so), "" when it may be."""
    for pod_set in workload.pod_sets:
        named = len(pod_set.templates) + len(pod_set.claims)
        if named > MAX_POD_CLAIMS:
            return (f"PodSet {pod_set.name}: its pod template names {named} resource claims, more than dra-quota "
                    f"prices for one Pod ({MAX_POD_CLAIMS})")
    return ""


def our_checks(admission_checks: Mapping[str, str]) -> frozenset[str]:
    """The AdmissionCheck names (name -> controllerName) that are ours."""
    return frozenset(name for name, controller in admission_checks.items() if controller == CONTROLLER_NAME)


def holds(workload: Workload, ours: frozenset[str]) -> bool:
    """Whether `workload` holds its price now (module doc): one of our entries Ready,
    not finished, not evicted, active."""
    if workload.finished or workload.evicted or not workload.active:
        return False
    return any(c.state == "Ready" for c in workload.checks if c.name in ours)


def needs_decision(workload: Workload, ours: frozenset[str]) -> tuple[str, ...]:
    """Our check entries the leader must decide now: Pending or Retry, on a Workload with
    quota reserved that is still running. A Retry is decided again (Kueue resets it to
    Pending once it requeues; until then rewriting the same Retry is a no-op)."""
    if not workload.quota_reserved or workload.finished or workload.evicted or not workload.active:
        return ()
    if holds(workload, ours):
        return ()
    return tuple(c.name for c in workload.checks if c.name in ours and c.state == "Pending")


def charge_message(charges: Mapping[DeviceQuota, Charge]) -> str:
    """What an admitted Workload holds, per quota, for its check message and Event."""
    parts = []
    for quota in sorted(charges, key=lambda q: q.name):
        charge = charges[quota]
        amounts = ", ".join(format_resource(r, charge.memory if r == "memory" else charge.devices)
                            for r in ("devices", "memory") if quota.hard.get(r) is not None)
        parts.append(f'{quota.kind} "{quota.name}": {amounts or "nothing it limits"}')
    return "holds " + ("; ".join(parts) if parts else "nothing: no DeviceQuota in this namespace")


def check_active(generation: int, now: float) -> dict[str, Any]:
    """The `Active=True` condition we set on an AdmissionCheck of ours."""
    return {"type": "Active", "status": "True", "reason": "Active",
            "message": "dra-quota checks Workloads against the namespace's DeviceQuotas",
            "observedGeneration": generation, "lastTransitionTime": _stamp(now)}


def entry_patch(workload: Workload, check: str, state: State, message: str, *, now: float,
                requeue_after: int | None = None) -> dict[str, Any]:
    """The server-side apply body for `workloads/status` holding only our entry.

    lastTransitionTime stays as it was unless the state changes (Kueue's own rule,
    patching.go SetAdmissionCheckState). A Ready entry labels the Pods (module doc).
    """
    previous = workload.check(check)
    same = previous is not None and previous.state == state and previous.last_transition
    entry: dict[str, Any] = {
        "name": check, "state": state, "message": message[:MAX_MESSAGE],
        "lastTransitionTime": previous.last_transition if same and previous else _stamp(now),
    }
    if state == "Retry" and requeue_after is not None:
        entry["requeueAfterSeconds"] = requeue_after
    if state == "Ready":
        entry["podSetUpdates"] = [{"name": p.name, "labels": {WORKLOAD_LABEL: workload.uid}}
                                  for p in workload.pod_sets]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": workload.name, "namespace": workload.namespace},
            "status": {"admissionChecks": [entry]}}


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(int(now), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
