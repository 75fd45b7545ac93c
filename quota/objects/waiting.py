"""Which ResourceClaimTemplates have Pods waiting for a claim, read from Pods.

Neighbours: `controllers.requeue` lists a namespace's unscheduled Pods when quota frees there
and touches the templates this module names, so the resourceclaim controller retries
those Pods at once. Why a template: that controller re-queues every Pod using a
ResourceClaimTemplate when the template changes (k/k pkg/controller/resourceclaim
controller.go, enqueueResourceClaimTemplate -> enqueuePod -> podNeedsWork "must create
ResourceClaim from template"), while after a denied create it backs off exponentially,
up to 1000 s. A Pod is waiting when one of its template claims has no entry in
`status.resourceClaimStatuses` (the controller records the generated name only once
the create succeeded), it is not scheduled, not terminal and not being deleted.

A namespace's unscheduled Pods are listed as metadata only (`pod_mark`: name, uid,
resourceVersion, creation), so what the list costs grows with their number, not their
size; a Pod is read whole once per resourceVersion to learn what it waits on, and
`pick` chooses the templates a bounded number of writes goes to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from quota.values.raw import as_map, dig

__all__ = ["Waiter", "pick", "pod_mark", "waiting_templates"]


def waiting_templates(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """Names of the templates whose claim some waiting Pod (module doc) still lacks."""
    names: set[str] = set()
    for pod in pods:
        if not isinstance(pod, Mapping) or dig(pod, "metadata", "deletionTimestamp") is not None:
            continue
        if dig(pod, "spec", "nodeName") or dig(pod, "status", "phase") in ("Succeeded", "Failed"):
            continue
        statuses = dig(pod, "status", "resourceClaimStatuses")
        created = {as_map(s).get("name") for s in statuses} if isinstance(statuses, list) else set()
        claims = dig(pod, "spec", "resourceClaims")
        for claim in claims if isinstance(claims, list) else ():
            template = as_map(claim).get("resourceClaimTemplateName")
            if isinstance(template, str) and template and as_map(claim).get("name") not in created:
                names.add(template)
    return names


@dataclass(frozen=True, slots=True)
class Waiter:
    """What one unscheduled Pod waits on, as read at its `version`."""
    version: str
    created: str  # RFC 3339 in UTC: ordered as text
    templates: tuple[str, ...]


def pod_mark(item: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a listed Pod's metadata the requeue keeps (a list item's transform)."""
    return {key: str(dig(item, "metadata", field) or "") for key, field in
            (("name", "name"), ("uid", "uid"), ("version", "resourceVersion"), ("created", "creationTimestamp"))}


def pick(waiters: Iterable[Waiter], touched: Mapping[str, float], count: int) -> list[str]:
    """Up to `count` templates some waiter waits on: those touched longest ago (never first),
    then those whose oldest waiting Pod is oldest, so successive writes go round them all."""
    oldest: dict[str, str] = {}
    for waiter in waiters:
        for template in waiter.templates:
            oldest[template] = min(oldest.get(template, waiter.created), waiter.created)
    ranked = sorted(oldest, key=lambda t: (touched.get(t, float("-inf")), oldest[t], t))
    return ranked[:max(0, count)]
