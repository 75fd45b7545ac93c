"""Why a claim costs what it costs: the note a quota denial carries after its numbers.

Neighbours: `quota.admission.admitter.Admitter.explained` calls `conservative_note` for the quotas
that denied a claim (the webhook's claim paths and `check` append it to the denial);
`quota.pricing.pricer` prices the claim in both modes; `quota.quotas.devicequota` wrote the denial's
in-tree prefix (`exceeded DeviceQuota "gpus": requested memory=141Gi, used ..., reserved
..., limited ...`), which stays as it is for the tools that parse it, and after it what
the requester can do about a full quota (`quota.quotas.advice`); this note comes last.

A user who asked for "one GPU" and is refused for "requested memory=141Gi" needs to know
that Conservative pricing charged the largest device the scheduler might pick, and what
they can change themselves: a selector that narrows a request whose candidates differ, or
for `firstAvailable` (charged as its most expensive subrequest) fewer subrequests. A quota
is the cluster admin's object, so its pricing is what to ask them for, named by its kind.
The note is written only where it is true: a quota that prices Conservative denied the
claim, and for a dimension it limits some request would cost less at its smallest
candidate. Pure; prices only on the denial path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quota.objects.claims import Claim
from quota.objects.claimspec import ClaimSpec, DeviceRequirement, Request
from quota.pricing.priced import PricedRequest, combine
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import DeviceQuota, format_resource
from quota.quotas.scope import DeviceSelection, Scope
from quota.values.model import Charge, Mode
from quota.values.work import CLAIM_COST_BUDGET, Budget

__all__ = ["conservative_note"]

_DIMENSIONS = ("memory", "devices")
NOTE_BUDGET = CLAIM_COST_BUDGET  # what pricing the alternatives alone may spend, for the note


def conservative_note(pricer: Pricer, claim: Claim, denied_by: Sequence[DeviceQuota], default_mode: Mode) -> str:
    """The note for a claim `denied_by` these quotas; "" when pricing is not the story.

    Charges are those the first Conservative quota sees (its classes and devices)."""
    conservative = [q for q in denied_by if (q.mode or default_mode) == "conservative"]
    if not conservative:
        return ""
    scope = conservative[0].scope
    limited = [r for r in _DIMENSIONS if any(q.hard.get(r) is not None for q in conservative)]
    # One claim's budget for every alternative priced alone, in both modes: the same
    # matches as pricing the claim (each charged once), so a tenant's claim of 32
    # requests of 8 subrequests costs the note no more than its own pricing did.
    budget = Budget(NOTE_BUDGET, "claim")
    notes = [n for request in claim.spec.requests
             if (n := _request(pricer, request, scope, limited, budget)) is not None]
    if not notes:
        return ""
    how = "; ".join(n.how for n in notes)
    todo = ", or ".join(dict.fromkeys(t for n in notes for t in n.todo))
    return (f"Priced conservatively: {how}. To be charged less, {todo}; or ask the cluster admin to set "
            f"spec.pricing: Optimistic on {_names(conservative)} (it charges the smallest candidate; "
            f"dra-quota check --mode optimistic shows those prices)")


@dataclass(frozen=True, slots=True)
class _Note:
    how: str  # how the request is charged
    todo: tuple[str, ...]  # what the requester can change in the claim


@dataclass(frozen=True, slots=True)
class _Alternative:
    """One `exactly` request or `firstAvailable` subrequest priced on its own."""

    name: str
    candidates: int
    high: Charge
    low: Charge


def _request(pricer: Pricer, request: Request, scope: Scope, limited: Sequence[str], budget: Budget) -> _Note | None:
    """None unless the request's smallest candidate costs less than its charge in a limited
    dimension. Each alternative is priced on its own: a firstAvailable request's counts and
    spreads are its subrequests', never a mix of them."""
    alternatives = [a for a in (_alone(pricer, alt, scope, budget) for alt in request.alternatives) if a is not None]
    if not alternatives:
        return None
    high = combine((a.high for a in alternatives), "conservative")
    low = combine((a.low for a in alternatives), "optimistic")
    cheaper = [r for r in limited if low.amount(r) < high.amount(r)]
    if not cheaper:
        return None
    if not request.first_available:
        only = alternatives[0]
        return _Note(f"request {request.name} may get any of the {_devices(only.candidates)} that match it and is "
                     f"charged as if it got the largest: {_show(high, cheaper)} (the smallest: {_show(low, cheaper)})",
                     (f"narrow request {request.name} with a selector (a model, a memory capacity) so that only the "
                      f"devices it needs match",))
    each = ", ".join(_subrequest(a, cheaper) for a in alternatives)
    least = combine((a.high for a in alternatives), "optimistic")
    costly = [a.name for a in alternatives if any(least.amount(r) < a.high.amount(r) == high.amount(r)
                                                  for r in cheaper)]
    spread = [a.name for a in alternatives if any(a.low.amount(r) < a.high.amount(r) for r in cheaper)]
    todo = []
    if costly:
        todo.append(f"drop subrequest {_and(costly)} (a firstAvailable request is charged as its most expensive "
                    f"subrequest)")
    if spread:
        todo.append(f"narrow subrequest {_and(spread)} with a selector (a model, a memory capacity) so that only "
                    f"the devices it needs match")
    return _Note(f"request {request.name} may get any of its subrequests and is charged as the most expensive: "
                 f"{_show(high, cheaper)} ({each})", tuple(todo))


def _alone(pricer: Pricer, alt: DeviceRequirement, scope: Scope, budget: Budget) -> _Alternative | None:
    """`alt` priced as a request of its own in both modes; None when the quota does not count
    it, or out of budget."""
    selections: tuple[DeviceSelection, ...] = () if scope.devices.everything else (scope.devices,)
    spec = ClaimSpec((Request(alt.name, (alt,)),))
    pricings = [pricer.estimate(spec, mode=mode, budget=budget, selections=selections)
                for mode in ("conservative", "optimistic")]
    if any(p.errors or not p.requests for p in pricings):
        return None
    high, low = (p.requests[0] for p in pricings)
    if not (high.governed if scope.everything else high.touches(scope)):
        return None
    return _Alternative(alt.name, high.candidates, _charge(high, scope), _charge(low, scope))


def _charge(priced: PricedRequest, scope: Scope) -> Charge:
    return priced.charge if scope.everything else priced.scoped(scope)


def _subrequest(alt: _Alternative, dimensions: Sequence[str]) -> str:
    if all(alt.low.amount(r) == alt.high.amount(r) for r in dimensions):
        return f"subrequest {alt.name} matches {_devices(alt.candidates)}, charged {_show(alt.high, dimensions)}"
    return (f"subrequest {alt.name} matches {_devices(alt.candidates)}, charged the largest "
            f"{_show(alt.high, dimensions)} (the smallest: {_show(alt.low, dimensions)})")


def _show(charge: Charge, dimensions: Sequence[str]) -> str:
    return ",".join(format_resource(r, charge.amount(r)) for r in dimensions)


def _devices(count: int) -> str:
    return "1 device" if count == 1 else f"{count} devices"


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _names(quotas: Sequence[DeviceQuota]) -> str:
    """`DeviceQuota "a"`, `ClusterDeviceQuota "t"`: the kind an admin edits, per quota."""
    by_kind: dict[str, list[str]] = {}
    for q in quotas:
        by_kind.setdefault(q.kind, []).append(f'"{q.name}"')
    return " and ".join(f"{kind} {', '.join(names)}" for kind, names in by_kind.items())
