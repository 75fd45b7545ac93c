"""One-write admission of a ResourceClaim CREATE: reserve and annotate in the create itself, its only write.

Neighbours: `webhook.endpoints` routes a claim CREATE reviewed by the mutating webhook
here; `webhook.claimreview.admit_new` prices, checks and reserves (as the validating
claim CREATE of the release before did, still served on /validate during an upgrade);
`quota.admission.annotating.Annotating.charge_annotations` builds the charge annotations the
leader writes on a claim that arrived without them (`controllers.annotator`, which
finds nothing due on a claim admitted here); `quota.admission.admissiontoken` names the reservation; the claim cache
(`kube.claimstore`) maps the token back to the claim, so the entry settles once the
claim is cached with its charge, as a uid-keyed entry does.

Why a fresh token per invocation: the mutating phase sees no uid (and no name for a
`generateName` create), and nothing in the incoming object may choose the key: a tenant
copying another claim's annotation must gain nothing, and a reinvocation (another
mutating webhook changed the object after us, `reinvocationPolicy: IfNeeded`) sees our
first answer. So every invocation reserves the full charge under a new token and
overwrites whatever the object carries; the token of an invocation whose answer did not
survive (a reinvocation's first, a create refused or failed after us) names an orphan,
which expires by the TTL (`quota.accounting.reservations`). A dry run reserves nothing and writes
no token.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kube.admissionreview import AdmissionRequest, Verdict
from quota.admission.admissiontoken import ADMISSION_ANNOTATION, token_key
from quota.objects.allocationrecord import RECORD_ANNOTATIONS
from quota.objects.extended import generated_base
from quota.values.model import ClaimUid
from quota.values.raw import dig
from webhook.claimreview import ClaimContext, admit_new, parse_request_claim, supplied

__all__ = ["admit_claim", "annotation_patch"]


async def admit_claim(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """ResourceClaim CREATE (mutating): `admit_new` under a fresh token's key; allowed, the
    answer patches the charge, the quotas and the token onto the claim."""
    claim = parse_request_claim(request)
    if isinstance(claim, Verdict):
        return claim
    # The allocation record is never ours to write at a create: one supplied is a tenant's
    # (the charge, the quotas and the token are overwritten below).
    if (denied := supplied(request.object, RECORD_ANNOTATIONS)) is not None:
        return denied
    token = secrets.token_hex(16)
    # A `generateName` create has no name yet (module doc): `parse_claim` names it by its
    # generateName, cut here to the base the API server keeps (`quota.objects.extended`), so that
    # its entry shows that and the scheduler's next attempt at the same Pod's claim still
    # finds and replaces it (`in_series`), whatever the Pod's name's length.
    name = claim.name if dig(request.object, "metadata", "name") else generated_base(claim.name)
    admitted = await admit_new(ctx, request, replace(claim, uid=ClaimUid(token_key(token)), name=name))
    if not admitted.verdict.allowed or admitted.entry is None:
        return admitted.verdict
    annotations = ctx.admitter.charge_annotations(admitted.entry)
    # Only an admission that reserved something has an entry to settle: a dry run, or a
    # claim no quota charges, carries no token (which every claim event would otherwise
    # look up in the claim cache's token map).
    if not request.dry_run and admitted.reserved:
        annotations[ADMISSION_ANNOTATION] = token
    # Else a token the creator wrote goes: it would name another claim's entry, and the
    # annotations guard keeps a token as it was created.
    return replace(admitted.verdict, patch=annotation_patch(request.object, annotations, drop=(ADMISSION_ANNOTATION,)))


def annotation_patch(obj: Mapping[str, Any] | None, annotations: Mapping[str, str],
                     drop: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """A JSON Patch setting `annotations` on `obj`, replacing what it carries under those
    keys, and removing those of `drop` it carries that `annotations` does not set."""
    carried = dig(obj, "metadata", "annotations")
    if not isinstance(carried, dict):
        return ({"op": "add", "path": "/metadata/annotations", "value": dict(annotations)},)
    # `add` on an object member replaces it (RFC 6902, 4.1); `/` in a key is `~1` (RFC 6901).
    return (*({"op": "add", "path": _path(key), "value": value} for key, value in annotations.items()),
            *({"op": "remove", "path": _path(key)} for key in drop if key in carried and key not in annotations))


def _path(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
