"""Pod CREATE: a warning when the Pod's DRA-backed extended resources cannot fit its quotas.

Neighbours: `webhook.endpoints` routes core `pods` CREATE here (the webhook
configuration sends only Pods that request an extended resource); `quota.extended`
rebuilds the ResourceClaim the scheduler will create for the Pod in PreBind;
`quota.admission.Admitter.fit` prices it as a template is priced, reserving nothing.

Never a denial: the scheduler's claim CREATE goes through `webhook.claimreview` like every
claim, and that is where the quota is enforced (with the numbers of that moment). This
only tells the author at `kubectl apply` time what would otherwise surface as a Pending
Pod with a FailedScheduling event. Anything we cannot read or price is a warning at
most, and a Pod without such requests is allowed silently.
"""

from __future__ import annotations

import logging

from kube.admissionreview import AdmissionRequest, Verdict
from quota.admission import Admission
from quota.extended import PodError, extended_claim
from webhook.claimreview import ClaimContext, with_namespace

__all__ = ["create_pod"]

log = logging.getLogger(__name__)


def create_pod(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """Allowed, with a warning if the claim for its extended resources would be denied."""
    if request.object is None:
        return Verdict(True)
    try:
        extended = extended_claim(with_namespace(request.object, request.namespace), ctx.admitter.pricer.classes)
    except PodError as err:
        # The API server validated the Pod before us: this is our reader's limit, not the user's error.
        log.info("pod %s/%s: cannot read its extended resources: %s", request.namespace, request.name, err)
        return Verdict(True)
    if extended is None:
        return Verdict(True)
    what = f"the ResourceClaim the scheduler creates for this Pod's {extended.describe()}"
    fit = ctx.admitter.fit(extended.claim, namespace_labels=ctx.namespace_labels(extended.claim.namespace))
    if isinstance(fit, Admission):
        return Verdict(True, warnings=(*fit.warnings, f"{what} would be denied: {fit.reason}"))
    pending = "; the Pod stays Pending while dra-quota denies that claim"
    if not fit.never.allowed:
        return Verdict(True, warnings=(*fit.warnings, f"{what} can never fit: {fit.never.message}{pending}"))
    if not fit.now.allowed:
        return Verdict(True, warnings=(*fit.warnings, f"{what} does not fit now: {fit.now.message}{pending}"))
    return Verdict(True, warnings=fit.warnings)
