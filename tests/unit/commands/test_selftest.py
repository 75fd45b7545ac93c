"""`dra-quota selftest`'s verdicts on what the API server answered (commands.selftest).
The messages are the API server's own (k8s.io/apiserver pkg/admission/plugin/webhook
errors: "admission webhook %q denied the request", "failed calling webhook %q"); the
process against a real API server is tests/e2e/test_selftest.py."""

from __future__ import annotations

import pytest

from commands.selftest import EXIT_FAILED, EXIT_OK, EXIT_UNABLE, judge_admitted, judge_refused, probe_claim
from kube.apierror import ApiError
from quota.objects.jsonclaims import parse_json_claim


def test_a_claim_charged_by_our_webhook_passes() -> None:
    claim = {"metadata": {"annotations": {"draquota.io/charge": '{"memory":0,"devices":0}',
                                          "draquota.io/quotas": ""}}}
    outcome = judge_admitted(claim, "team-a")
    assert outcome.code == EXIT_OK
    assert outcome.message == ('the dra-quota webhook admitted a dry-run ResourceClaim in namespace team-a '
                               '(draquota.io/charge={"memory":0,"devices":0}, quotas charged: none)')


@pytest.mark.parametrize("claim", [{"metadata": {}}, {"metadata": {"annotations": {"other.io/x": "1"}}}, {}])
def test_a_claim_admitted_without_our_charge_fails_naming_the_causes(claim: dict[str, object]) -> None:
    outcome = judge_admitted(claim, "team-a")
    assert outcome.code == EXIT_FAILED
    assert outcome.message.startswith("no dra-quota webhook answered for namespace team-a")
    for cause in ("webhooks.excludeNamespaces", "webhooks.optInLabel", "failurePolicy: Ignore", "not ready"):
        assert cause in outcome.message


@pytest.mark.parametrize("status,message,code,starts", [
    (403, 'admission webhook "quota-ungoverned.resourceclaims.draquota.io" denied the request: namespace x is not '
          "in dra-quota's cache yet", EXIT_OK, "the dra-quota webhook quota-ungoverned.resourceclaims.draquota.io "
                                               "answered"),
    (500, 'Internal error occurred: failed calling webhook "quota.resourceclaims.draquota.io": failed to call '
          'webhook: Post "https://dra-quota-webhook.dra-quota-system.svc:443/admit": dial tcp: connection refused',
     EXIT_FAILED, "the API server called the dra-quota webhook quota.resourceclaims.draquota.io"),
    (403, 'admission webhook "policy.example.com" denied the request: no', EXIT_FAILED,
     "the dry-run ResourceClaim in namespace team-a was refused, not by a dra-quota webhook"),
    (403, 'resourceclaims.resource.k8s.io is forbidden: User "system:serviceaccount:p:s" cannot create resource '
          '"resourceclaims"', EXIT_UNABLE, "not allowed to create a dry-run ResourceClaim in namespace team-a"),
    (404, 'namespaces "team-a" not found', EXIT_UNABLE, 'cannot send the claim: namespaces "team-a" not found'),
], ids=["denied-by-us", "our-call-failed", "denied-by-another", "rbac", "no-namespace"])
def test_a_refusal_passes_only_when_our_webhook_decided(status: int, message: str, code: int, starts: str) -> None:
    outcome = judge_refused(ApiError(status, "", message), "team-a")
    assert outcome.code == code
    assert outcome.message.startswith(starts), outcome.message


def test_the_probe_claim_requests_no_device() -> None:
    """It charges nothing whatever the quotas, and needs no DeviceClass."""
    claim = parse_json_claim({**probe_claim(), "metadata": {"name": "probe", "namespace": "team-a"}})
    assert claim.spec.requests == ()
