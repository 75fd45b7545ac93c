"""The `/validate` and `/mutate` endpoints: dispatch a review to the handler of its kind.

Neighbours: `webhook.server.build_app` serves what `endpoints` returns; the per-kind
modules (`webhook.claims`, `webhook.namespaces`, `webhook.mutating`) decide. A review
for anything not in the tables (another resource, subresource or operation, which the
webhook configurations should not send but a hand-edited one may) is allowed untouched:
failing closed on a request we were never meant to judge would block unrelated writes.
The handlers are synchronous, so a check and its reservation run without an await
between them.
"""

from __future__ import annotations

from collections.abc import Callable

from webhook.claims import ClaimContext, allocate_claim, create_claim, create_template, delete_claim, update_claim
from webhook.mutating import annotate_claim
from webhook.namespaces import update_namespace
from webhook.review import AdmissionRequest, Verdict
from webhook.server import Endpoint

__all__ = ["endpoints"]

Handler = Callable[[ClaimContext, AdmissionRequest], Verdict]
# (API group, resource, subresource, operation) -> handler. The `status` and `finalize`
# subresources of namespaces write labels too; claims' `status` carries the allocation.
Route = tuple[str, str, str, str]
RESOURCE = "resource.k8s.io"


def _namespace(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    return update_namespace(ctx.policy, request)


VALIDATING: dict[Route, Handler] = {
    (RESOURCE, "resourceclaims", "", "CREATE"): create_claim,
    (RESOURCE, "resourceclaims", "", "UPDATE"): update_claim,
    (RESOURCE, "resourceclaims", "", "DELETE"): delete_claim,
    (RESOURCE, "resourceclaims", "status", "UPDATE"): allocate_claim,
    (RESOURCE, "resourceclaimtemplates", "", "CREATE"): create_template,
    **{("", "namespaces", sub, op): _namespace for sub in ("", "status", "finalize") for op in ("CREATE", "UPDATE")},
}
MUTATING: dict[Route, Handler] = {
    (RESOURCE, "resourceclaims", "", "CREATE"): annotate_claim,
}


def endpoints(ctx: ClaimContext) -> dict[str, Endpoint]:
    """`{"/validate": ..., "/mutate": ...}` for `build_app`."""
    return {"/validate": _endpoint(ctx, VALIDATING), "/mutate": _endpoint(ctx, MUTATING)}


def _endpoint(ctx: ClaimContext, table: dict[Route, Handler]) -> Endpoint:
    async def decide(request: AdmissionRequest) -> Verdict:
        resource = request.resource
        handler = table.get((resource.group, resource.resource, request.sub_resource, request.operation))
        return Verdict(True) if handler is None else handler(ctx, request)

    return decide
