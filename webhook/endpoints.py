"""The `/validate`, `/mutate` and `/admit` endpoints: dispatch a review to the handler of its kind.

Neighbours: `webhook.server.build_app` serves what `endpoints` returns; the per-kind
modules (`webhook.claimreview`, `webhook.namespaces`, `webhook.pods`) decide. A review
for anything not in the tables (another resource, subresource or operation, which the
webhook configurations should not send but a hand-edited one may) is allowed untouched:
failing closed on a request we were never meant to judge would block unrelated writes.
A claim CREATE, and an allocation above what its claim reserved, await a conditional
status write (`kube.quotawriter`: the one admission protocol) and slice their own
pricing, as a Pod CREATE does (a Pod past a full slow lane is allowed, never refused:
`webhook.pods`); every other handler is synchronous and runs through the context's slicer (`runtime.slicing`): one whose pricing is long gives the
loop back between slices, in the slow lane, so it delays no other review.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from kube.admissionreview import AdmissionRequest, Verdict
from kube.resources import CLAIMS, NAMESPACES, PODS, TEMPLATES
from runtime.slicing import Busy
from webhook.claimadmit import admit_claim
from webhook.claimreview import (
    ClaimContext,
    allocate_claim,
    create_claim,
    create_template,
    update_claim,
)
from webhook.namespaces import review_namespace
from webhook.pods import create_pod
from webhook.server import Endpoint

__all__ = ["endpoints"]

Handler = Callable[[ClaimContext, AdmissionRequest], Verdict | Awaitable[Verdict]]
# (API group, resource, subresource, operation) -> handler. The `status` and `finalize`
# subresources of namespaces write labels too; claims' `status` carries the allocation.
Route = tuple[str, str, str, str]


async def _namespace(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    return await review_namespace(ctx.policy, ctx.may_label, request)


VALIDATING: dict[Route, Handler] = {
    # Awaits the status write: the one await between check and answer, made safe by the
    # write's resourceVersion precondition.
    (CLAIMS.group, CLAIMS.plural, "", "CREATE"): create_claim,
    (CLAIMS.group, CLAIMS.plural, "", "UPDATE"): update_claim,
    # Awaits the status write when the allocation charges more than the claim reserved.
    (CLAIMS.group, CLAIMS.plural, "status", "UPDATE"): allocate_claim,
    (TEMPLATES.group, TEMPLATES.plural, "", "CREATE"): create_template,
    # Warnings only: the scheduler's claim for the Pod's extended resources is judged above.
    # Slices its own reading and pricing: `Busy` is a warning there, not a denial.
    (PODS.group, PODS.plural, "", "CREATE"): create_pod,
    **{(NAMESPACES.group, NAMESPACES.plural, sub, op): _namespace
       for sub in ("", "status", "finalize") for op in ("CREATE", "UPDATE")},
}
# Nothing is mutated on `/mutate`: it still answers, allowing everything untouched, so that
# a MutatingWebhookConfiguration of an earlier release, still in place while an upgrade
# rolls out, does not fail claim creates.
MUTATING: dict[Route, Handler] = {}
# One-write admission (`webhook.claimadmit`, docs/development/one-write.md), the shipped
# configuration's claim CREATE: reviewed by a mutating webhook, reserved and annotated in
# the create itself, so the leader writes nothing to it (`controllers.annotator`). Its own
# path: during an upgrade an older Pod answers it 404 (the claim waits where a quota
# governs) instead of allowing it unpriced as its `/mutate` would. The claim CREATE on
# `/validate` above stays for the validating configuration of an earlier release while an
# upgrade rolls out.
ADMITTING: dict[Route, Handler] = {
    (CLAIMS.group, CLAIMS.plural, "", "CREATE"): admit_claim,
}


def endpoints(ctx: ClaimContext) -> dict[str, Endpoint]:
    """`{"/validate": ..., "/mutate": ..., "/admit": ...}` for `build_app`."""
    return {"/validate": _endpoint(ctx, VALIDATING), "/mutate": _endpoint(ctx, MUTATING),
            "/admit": _endpoint(ctx, ADMITTING)}


def _endpoint(ctx: ClaimContext, table: dict[Route, Handler]) -> Endpoint:
    async def decide(request: AdmissionRequest) -> Verdict:
        resource = request.resource
        handler = table.get((resource.group, resource.resource, request.sub_resource, request.operation))
        if handler is None:
            return Verdict(True)
        try:
            # An async handler slices its own pricing: making its coroutine needs no slice
            # (the slicer's two greenlet switches were 1.7 % of `serve`'s busy time in
            # bench/floor.py's one-write mode, for a call that runs none of its code).
            verdict = handler(ctx, request) if inspect.iscoroutinefunction(handler) else \
                await ctx.slicer.run(lambda: handler(ctx, request))
            return await verdict if inspect.isawaitable(verdict) else verdict
        except Busy as busy:
            return Verdict(False, str(busy), "ServiceUnavailable", 503, cause="unavailable")

    return decide
