"""Why a claim costs what it costs: the note a quota denial carries after its numbers.

Neighbours: `quota.admission.Admitter.explained` calls `conservative_note` for the quotas
that denied a claim (the webhook's claim paths and `check` append it to the denial);
`quota.pricing` prices the claim in both modes; `quota.devicequota` wrote the denial's
in-tree prefix (`exceeded DeviceQuota "gpus": requested memory=141Gi, used ..., reserved
..., limited ...`), which stays as it is for the tools that parse it.

A user who asked for "one GPU" and is refused for "requested memory=141Gi" needs to know
that Conservative pricing charged the largest device the scheduler might pick, and what
to change: a selector that narrows the candidates, or Optimistic pricing on the quota.
The note is written only where it is true: a quota that prices Conservative denied the
claim, and for a dimension it limits some request would cost less at its smallest
candidate. Pure; prices only on the denial path.
"""

from __future__ import annotations

from collections.abc import Sequence

from quota.claims import Claim
from quota.devicequota import DeviceQuota, format_resource
from quota.model import Mode
from quota.priced import PricedRequest
from quota.pricing import Pricer
from quota.scope import Scope

__all__ = ["conservative_note"]


def conservative_note(pricer: Pricer, claim: Claim, denied_by: Sequence[DeviceQuota], default_mode: Mode) -> str:
    """The note for a claim `denied_by` these quotas; "" when pricing is not the story.

    Charges are those the first Conservative quota sees (its classes and devices)."""
    conservative = [q for q in denied_by if (q.mode or default_mode) == "conservative"]
    if not conservative:
        return ""
    scope = conservative[0].scope
    selections = () if scope.devices.everything else (scope.devices,)
    high = pricer.estimate(claim.spec, mode="conservative", selections=selections).requests
    low = pricer.estimate(claim.spec, mode="optimistic", selections=selections).requests
    limited = [r for r in ("memory", "devices") if any(q.hard.get(r) is not None for q in conservative)]
    parts = [_request(hi, lo, limited, scope) for hi, lo in zip(high, low, strict=True) if hi.touches(scope)]
    found = [p for p in parts if p]
    if not found:
        return ""
    names = ", ".join(f'"{q.name}"' for q in conservative)
    return (f"Priced conservatively: {'; '.join(found)}. To be charged less, narrow the request with a selector "
            f"(a model, a memory capacity) so that only the devices it needs match, or set spec.pricing: Optimistic "
            f"on DeviceQuota {names} (it charges the smallest candidate; dra-quota check --mode optimistic shows "
            f"those prices)")


def _request(high: PricedRequest, low: PricedRequest, limited: Sequence[str], scope: Scope) -> str:
    """"" unless the smallest candidate costs less than the largest in a limited dimension."""
    hi, lo = high.scoped(scope), low.scoped(scope)
    cheaper = [r for r in limited if lo.amount(r) < hi.amount(r)]
    if not cheaper:
        return ""
    charged = ",".join(format_resource(r, hi.amount(r)) for r in cheaper)
    smallest = ",".join(format_resource(r, lo.amount(r)) for r in cheaper)
    return (f"request {high.name} may get any of the {high.candidates} devices that match it and is charged as "
            f"if it got the largest: {charged} (the smallest: {smallest})")
