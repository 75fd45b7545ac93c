"""Pod CREATE: a warning when the Pod's DRA-backed extended resources cannot fit its quotas.

Neighbours: `webhook.endpoints` routes core `pods` CREATE here (the webhook
configuration sends only Pods that request an extended resource); `quota.objects.extended`
rebuilds the ResourceClaim the scheduler will create for the Pod in PreBind;
`quota.admission.admitter.Admitter.fit` prices it as a template is priced, reserving nothing.

Never a denial: the scheduler's claim CREATE goes through `webhook.claimreview` like every
claim, and that is where the quota is enforced (with the numbers of that moment). This
only tells the author at `kubectl apply` time what would otherwise surface as a Pending
Pod with a FailedScheduling event. Anything we cannot read or price is a warning at
most, and a Pod without such requests is allowed silently.

Priced as a claim review is (`webhook.claimreview`): under a review `Budget`, through
the context's `Slicer`. A Pod's reading is as long as its containers (up to 1,024 of them,
`quota.objects.extended`) and pauses per container, so an expensive one goes to the slow lane and
gives the loop back every slice. Where a claim would be refused with `Busy` (the slow
lane full), a Pod is allowed with a warning that it was not checked.
"""

from __future__ import annotations

import logging

from kube.admissionreview import AdmissionRequest, Verdict
from quota.admission.admitter import Admission
from quota.objects.extended import PodError, TooManyRequests, extended_claim
from quota.values.work import Budget
from runtime.slicing import Busy
from webhook.claimreview import ClaimContext, with_namespace

__all__ = ["create_pod"]

log = logging.getLogger(__name__)


async def create_pod(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """Allowed, with a warning if the claim for its extended resources would be denied."""
    if request.object is None:
        return Verdict(True)
    try:
        return await ctx.slicer.run(lambda: _judge(ctx, request))
    except Busy:
        # Never a denial (module doc); the claim is judged when the scheduler creates it.
        return Verdict(True, warnings=("dra-quota is busy pricing other expensive requests and did not check this "
                                       "Pod's extended resources; the ResourceClaim the scheduler creates for them is "
                                       "still checked against the quota",))


def _judge(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    assert request.object is not None
    try:
        extended = extended_claim(with_namespace(request.object, request.namespace), ctx.admitter.pricer.classes)
    except TooManyRequests as err:
        return Verdict(True, warnings=(f"the ResourceClaim the scheduler creates for this Pod cannot be created: {err}",))
    except PodError as err:
        # The API server validated the Pod before us: this is our reader's limit, not the user's error.
        log.info("pod %s/%s: cannot read its extended resources: %s", request.namespace, request.name, err)
        return Verdict(True)
    if extended is None:
        return Verdict(True)
    what = f"the ResourceClaim the scheduler creates for this Pod's {extended.describe()}"
    fit = ctx.admitter.fit(extended.claim, namespace_labels=ctx.namespace_labels(extended.claim.namespace),
                           budget=Budget.review())
    if isinstance(fit, Admission):
        return Verdict(True, warnings=(*fit.warnings, f"{what} would be denied: {fit.reason}"))
    # Before the quota's message: a warning is cut at its end (`kube.admissionreview`), where
    # the message's advice is.
    pending = "(the Pod stays Pending while dra-quota denies that claim)"
    if not fit.never.allowed:
        return Verdict(True, warnings=(*fit.warnings, f"{what} can never fit {pending}: {fit.never.message}"))
    if not fit.now.allowed:
        return Verdict(True, warnings=(*fit.warnings, f"{what} does not fit now {pending}: {fit.now.message}"))
    return Verdict(True, warnings=fit.warnings)
