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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from quota.raw import as_map, dig

__all__ = ["trim_pod", "waiting_templates"]


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


def trim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields `waiting_templates` reads: a namespace's Pods can be large."""
    return {
        "metadata": {"name": dig(pod, "metadata", "name"), "namespace": dig(pod, "metadata", "namespace"),
                     "deletionTimestamp": dig(pod, "metadata", "deletionTimestamp")},
        "spec": {"nodeName": dig(pod, "spec", "nodeName"), "resourceClaims": dig(pod, "spec", "resourceClaims")},
        "status": {"phase": dig(pod, "status", "phase"),
                   "resourceClaimStatuses": dig(pod, "status", "resourceClaimStatuses")},
    }
