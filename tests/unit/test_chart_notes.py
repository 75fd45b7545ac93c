"""What the chart's NOTES tell the installer, rendered by the real helm for each
failure-policy and opt-in setting (tests.tools.chart.notes): each sentence must say what
the rendered webhook configurations do."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ..tools.chart import NAMESPACE, find, notes, render

POLICIES = ("Fail", "Ignore")
OPT_IN = "draquota.io/enabled"


def _one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("governed", "ungoverned"), list(itertools.product(POLICIES, POLICIES)))
def test_the_notes_say_what_each_claim_failure_policy_does(governed: str, ungoverned: str) -> None:
    values = {"webhooks": {"failurePolicy": {"governed": governed, "ungoverned": ungoverned}}}
    text = _one_line(notes(values))
    hooks = {w["name"]: w["failurePolicy"]
             for w in find(render(values), "ValidatingWebhookConfiguration")["webhooks"]}
    assert hooks["quota.resourceclaimtemplates.draquota.io"] == governed
    assert hooks["quota-ungoverned.resourceclaimtemplates.draquota.io"] == ungoverned
    fail_closed = ("claim and template CREATEs and allocations are refused while no replica is ready "
                   "(failurePolicy Fail on the governed webhooks)")
    fail_open = ("claims are admitted and allocated without a quota check while no replica is ready "
                 "(failurePolicy Ignore on the governed webhooks)")
    assert (fail_closed in text) == (governed == "Fail"), text
    assert (fail_open in text) == (governed == "Ignore"), text
    everywhere = "Everywhere else, claim and template CREATEs are refused too while no replica is ready"
    assert (everywhere in text) == (ungoverned == "Fail"), text
    assert ("Everywhere else, no outage of ours blocks a claim" in text) == (ungoverned == "Ignore"), text
    # The sentence every install printed while the chart read a value that no longer exists.
    assert "admitted without a quota check (failurePolicy Ignore on the quota webhook)" not in text


def test_a_default_install_says_governed_claims_fail_closed_everywhere() -> None:
    text = _one_line(notes())
    assert "refused while no replica is ready (failurePolicy Fail on the governed webhooks)" in text
    assert "without a quota check" not in text, text
    assert f"Every namespace but kube-system, {NAMESPACE} is sent to the webhooks" in text
    assert "Staged install" not in text
    assert f"kubectl -n {NAMESPACE} rollout status deployment/dra-quota" in text


@pytest.mark.parametrize("label", ["", OPT_IN])
def test_the_notes_say_which_namespaces_reach_the_webhooks(label: str) -> None:
    values = {"webhooks": {"optInLabel": label, "excludeNamespaces": ["kube-system", "kube-public"]}}
    text = _one_line(notes(values))
    selectors = [w["namespaceSelector"]["matchExpressions"]
                 for w in find(render(values), "MutatingWebhookConfiguration")["webhooks"]]
    assert all(({"key": OPT_IN, "operator": "Exists"} in s) == bool(label) for s in selectors)
    staged = (f"Staged install: only namespaces labelled {OPT_IN} are sent to the webhooks. In every other "
              "namespace claims are admitted without a quota check and no DeviceQuota is enforced.")
    assert (staged in text) == bool(label), text
    assert (f"kubectl label namespace team-a {OPT_IN}=true" in text) == bool(label), text
    everyone = f"Every namespace but kube-system, kube-public, {NAMESPACE} is sent to the webhooks"
    assert (everyone in text) == (not label), text


@pytest.mark.parametrize(("policy", "vap", "says"), [
    ("Fail", True, "are refused while no replica is ready (failurePolicy Fail)"),
    ("Ignore", True, "(failurePolicy Ignore); the API server's ValidatingAdmissionPolicy still checks them."),
    ("Ignore", False, "(failurePolicy Ignore), nor by anything else"),
])
def test_the_notes_say_who_checks_the_admin_access_label_during_an_outage(policy: str, vap: bool,
                                                                          says: str) -> None:
    values: dict[str, Any] = {"webhooks": {"failurePolicy": {"adminAccess": policy}},
                              "adminAccess": {"validatingAdmissionPolicy": {"enabled": vap}}}
    text = _one_line(notes(values))
    assert says in text, text
    policies = [o for o in render(values) if o["kind"] == "ValidatingAdmissionPolicy"
                and "admin-access" in o["metadata"]["name"]]
    assert bool(policies) == vap


@pytest.mark.parametrize("listed", [False, True])
def test_the_notes_say_rbac_decides_who_may_set_the_governed_labels(listed: bool) -> None:
    values: dict[str, Any] = {"adminAccess": {"groups": ["gpu-admins"]}} if listed else {}
    text = _one_line(notes(values))
    roles = {r["metadata"]["name"] for r in render(values) if r.get("kind") == "ClusterRole"}
    for role in ("dra-quota-admin-access-labeler", "dra-quota-team-labeler"):
        assert role in roles and role in text, (role, text)
    assert "decided by RBAC: verb \"label\" on adminaccess.draquota.io and teams.draquota.io" in text, text
    assert ("The principals listed in adminAccess.users/groups/serviceAccounts may as well" in text) == listed, text
    assert "cluster admins included" not in text  # what the notes said while only the lists decided
