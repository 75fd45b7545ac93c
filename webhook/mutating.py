"""Mutating admission of ResourceClaims: our annotations, written on CREATE.

Neighbours: `webhook.endpoints` sends claim CREATEs here; `quota.admission.Admitter`
prices. The patch sets `draquota.io/charge` (JSON of the estimated charge, bytes and
devices) and `draquota.io/quotas` (the DeviceQuotas in scope that the charge draws
on, comma-separated), replacing whatever the user put there, and removes a
`draquota.io/allocated-charge` the user put there (only the leader writes that one,
after allocation: `webhook.allocations`). They inform queue managers
and dashboards; no decision reads them back (`webhook.claims` explains, and refuses
later changes).

What the mutating phase sees: no uid and, for a `generateName` create, no name (the
API server fills both in after mutating admission, k/k staging/src/k8s.io/apiserver/
pkg/registry/rest/create.go BeforeCreate), so nothing is reserved here: the validating
phase reserves under the uid. The charge written is the estimate at this moment; the
validating phase prices again a few milliseconds later and is the one that counts.
A claim that does not parse is let through without a patch: the validating webhook
denies it, naming the field, and one denial is clearer than two. A claim whose pricing
exceeds its budget (`quota.work`) is denied here with the budget's message: the
validating webhook would spend the same budget again to say the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from quota.claims import ALLOCATED_CHARGE_ANNOTATION, CHARGE_ANNOTATION, QUOTAS_ANNOTATION, ClaimError, parse_claim
from quota.raw import as_map, dig
from webhook.claims import ClaimContext, with_namespace
from webhook.review import AdmissionRequest, Verdict

__all__ = ["annotate_claim", "annotation_patch", "json_pointer"]


def annotate_claim(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """ResourceClaim CREATE: a JSON Patch writing our two annotations."""
    if request.object is None or not isinstance(request.object.get("metadata"), dict):
        return Verdict(True)
    try:
        claim = parse_claim(with_namespace(request.object, request.namespace))
    except ClaimError:
        return Verdict(True)
    pricing = ctx.admitter.price(claim)
    if pricing.over_budget:
        return Verdict(False, "; ".join(pricing.errors), cause="pricing")
    quotas = [
        q.name for q in sorted(ctx.admitter.ledger.quotas(claim.namespace), key=lambda q: q.name)
        if not pricing.charge_for(q.device_classes).is_zero()
    ]
    values = {
        CHARGE_ANNOTATION: json.dumps(pricing.total.as_json(), separators=(",", ":")),
        QUOTAS_ANNOTATION: ",".join(quotas),
    }
    patch = annotation_patch(request.object, values)
    if ALLOCATED_CHARGE_ANNOTATION in as_map(dig(request.object, "metadata", "annotations")):
        # A new claim has no allocation: a record is a copy (an exported manifest) or a
        # forgery, and would later price a vanished device. Only the leader writes it.
        patch.append({"op": "remove", "path": f"/metadata/annotations/{json_pointer(ALLOCATED_CHARGE_ANNOTATION)}"})
    return Verdict(True, patch=patch)


def annotation_patch(obj: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    """RFC 6902 operations setting `values` as annotations of `obj`, whatever it has now.

    `add` on an existing member replaces it (RFC 6902 §4.1), so one op per key covers
    both cases; a missing (or null) annotations map is added whole, since a JSON
    Pointer into a member that does not exist fails the whole patch.
    """
    if not isinstance(dig(obj, "metadata", "annotations"), dict):
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(values)}]
    return [
        {"op": "add", "path": f"/metadata/annotations/{json_pointer(key)}", "value": value}
        for key, value in values.items()
    ]


def json_pointer(token: str) -> str:
    """One reference token of a JSON Pointer (RFC 6901 §3): `~` as `~0`, then `/` as `~1`."""
    return token.replace("~", "~0").replace("/", "~1")
