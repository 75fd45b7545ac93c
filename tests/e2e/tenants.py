"""The tenants of test_hostile_tenant.py: who they are, what `edit` lets them do, what they send.

Three users the admin client impersonates, each bound to the API server's own `edit`
ClusterRole in a namespace of their own (`Tenants`). alice and bob work honestly (Pods
from a template; claims and Pods using them): every create is answered, and allowed
exactly when it fits. mallory sends what a tenant can send through the API server
(padded, forged, expensive and never-fitting claims and templates, dryRun floods, DELETEs
another webhook refuses): each attack asserts the answer it got and counts it in
`Tenants.answers`. The fixture, the sampler and the test are test_hostile_tenant.py's;
`expensive` is also what test_hostile_pricing.py and bench/attacks.py send.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from quota.values.work import CLAIM_COST_BUDGET

from .driver import RESOURCE_V1, GpuFleet, claim_spec, exact_request, pod_body
from .harness import DQ, Served, edit_binding, governed
from .kube import ApiError, Kube, Obj, poll, resource_path
from .webhook_recorder import impersonated

GPU = 80 * 2**30  # every GPU of the fleet
HARD = "160Gi"  # every namespace's DeviceQuota: two GPUs
PAD = 200 * 1024  # annotation bytes of a padded claim (the API server allows 256 KiB in all)
PROTECTED = "e2e.draquota.io/protected"  # mallory's namespace: a second webhook refuses claim DELETEs there
ROUNDS = 2  # of each honest tenant
EXCEEDED = (r'exceeded DeviceQuota "gpus": requested memory=(\d+Gi), used memory=\S+, reserved memory=\S+, '
            r'limited memory=160Gi')
# The numbers, then one sentence of advice (`quota.quotas.advice`), none of which holds a ';' for a DeviceQuota.
QUOTA_DENIAL = re.compile(rf'403: admission webhook "quota\.resourceclaims\.draquota\.io" denied the request: {EXCEEDED}'
                          r'; [^;]+ ask the cluster admin to raise the limit of DeviceQuota "gpus"$')
BUDGET = f"exceeded the per-claim budget of {CLAIM_COST_BUDGET:,} CEL cost units"
TIMED_OUT = ('504: admission webhook "quota.resourceclaims.draquota.io" denied the request: dra-quota could not '
             "decide within the webhook timeout")
OURS = ("draquota.io/charge", "draquota.io/quotas")


def expensive(device_class: str, salt: int) -> dict[str, object]:
    """A claim of 32 requests x 8 subrequests of `device_class`, each selector salted (module doc)."""
    def selector(r: int, s: int) -> dict[str, object]:
        # Per device (the whole attribute map is read) and ~3,500 units a device.
        expression = (f"size(device.attributes) >= 0 && "
                      f"lists.range(500).all(x, x + {salt * 256 + r * 8 + s} >= 0)")
        return {"cel": {"expression": expression}}

    return {"kind": "ResourceClaim", "metadata": {"name": f"hostile-{salt}"}, "spec": {"devices": {"requests": [
        {"name": f"r{r}", "firstAvailable": [
            {"name": f"s{s}", "deviceClassName": device_class, "selectors": [selector(r, s)]}
            for s in range(8)]}
        for r in range(32)]}}}


@dataclass
class Tenants:
    kube: Kube
    run: str
    fleet: GpuFleet
    served: Served
    namespaces: dict[str, str]  # user -> the namespace where the user may `edit`
    honest_creates: list[float] = field(default_factory=list)  # seconds each honest claim create took
    answers: Counter[str] = field(default_factory=Counter)  # what mallory's attacks got, by kind

    def user(self, name: str) -> str:
        return f"{name}-{self.run}"

    def ns(self, name: str) -> str:
        return self.namespaces[self.user(name)]

    async def create(self, name: str, plural: str, body: Obj, *, dry_run: bool = False) -> str:
        """Create `body` in `name`'s namespace as `name`: "" when created, else "<status>: <message>"."""
        try:
            await impersonated(self.kube, "POST", resource_path(body["apiVersion"], plural, namespace=self.ns(name)),
                               user=self.user(name), body=body, params={"dryRun": "All"} if dry_run else None,
                               content_type="application/json")
        except ApiError as err:
            return f"{err.status}: {err.message}"
        return ""

    async def claim(self, name: str, claim: str, *, count: int = 1, annotations: dict[str, str] | None = None,
                    dry_run: bool = False) -> str:
        body = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim",
                "metadata": {"name": claim, "annotations": annotations or {}},
                "spec": claim_spec(exact_request("gpu", self.fleet.device_class, count=count))}
        return await self.create(name, "resourceclaims", body, dry_run=dry_run)

    async def pod(self, name: str, pod: str, **source: str) -> str:
        body = {"apiVersion": "v1", **pod_body(pod, node_selector=self.fleet.node_selector, **source)}
        return await self.create(name, "pods", body)

    async def request(self, name: str, method: str, path: str, body: Any = None) -> str:
        """Any other call as `name`: "" when it succeeded, else "<status>: <message>"."""
        try:
            await impersonated(self.kube, method, path, user=self.user(name), body=body)
        except ApiError as err:
            return f"{err.status}: {err.message}"
        return ""


async def enforced(t: Tenants, name: str) -> bool:
    """Whether serve holds the namespace's DeviceQuota and the fleet (four GPUs never fit)."""
    return bool(QUOTA_DENIAL.match(await t.claim(name, "probe", count=4, dry_run=True)))


async def governed_tenants(t: Tenants) -> None:
    """Each of `t`'s users bound to `edit` in their namespace, governed by a DeviceQuota of
    `HARD`; returns once serve enforces each (its webhooks installed already)."""
    for user, namespace in t.namespaces.items():
        await t.kube.create("rbac.authorization.k8s.io/v1", "rolebindings", edit_binding(user), namespace=namespace)
        await t.kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                                 "spec": {"hard": {"memory": HARD}}}, namespace=namespace)
        await governed(t.kube, namespace)
    for name in (user.removesuffix(f"-{t.run}") for user in t.namespaces):
        await poll(lambda name=name: enforced(t, name), timeout=30,  # type: ignore[misc]
                   what=f"serve to enforce the DeviceQuota of {name}")


# -- what `edit` lets a tenant do --------------------------------------------------------------------


async def may(t: Tenants, name: str, verb: str, group: str, resource: str, subresource: str = "") -> bool:
    review = await impersonated(t.kube, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                user=t.user(name), content_type="application/json", body={
                                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                    "spec": {"resourceAttributes": {
                                        "namespace": t.ns(name), "verb": verb, "group": group,
                                        "resource": resource, "subresource": subresource}}})
    return bool(review["status"].get("allowed"))


async def check_edit_rights(t: Tenants) -> None:
    """`edit` creates claims, templates and Pods (and deletes and patches claims); the
    quota, the claims' status and the namespace's labels are out of reach."""
    allowed = [("create", "resource.k8s.io", "resourceclaims"), ("create", "resource.k8s.io", "resourceclaimtemplates"),
               ("create", "", "pods"), ("delete", "resource.k8s.io", "resourceclaims"),
               ("patch", "resource.k8s.io", "resourceclaims")]
    refused = [("create", "draquota.io", "devicequotas"), ("update", "draquota.io", "devicequotas"),
               ("update", "draquota.io", "devicequotas", "status"),
               ("update", "resource.k8s.io", "resourceclaims", "status"), ("patch", "", "namespaces")]
    assert [await may(t, "mallory", *r) for r in allowed] == [True] * len(allowed)
    assert [await may(t, "mallory", *r) for r in refused] == [False] * len(refused)


# -- the honest tenants ----------------------------------------------------------------------------


async def honest_claim(t: Tenants, name: str, claim: str) -> bool:
    """One honest create, timed: True when admitted; a denial must be the quota's."""
    started = time.monotonic()
    outcome = await t.claim(name, claim)
    t.honest_creates.append(time.monotonic() - started)
    assert outcome == "" or QUOTA_DENIAL.match(outcome), f"{name}'s create of {claim}: {outcome}"
    return outcome == ""


async def allocated(kube: Kube, namespace: str, claim: str) -> bool:
    obj = await kube.get(RESOURCE_V1, "resourceclaims", claim, namespace=namespace)
    return bool((obj.get("status") or {}).get("allocation"))


async def bob(t: Tenants) -> None:
    """Claims and Pods using them: two fit, a third is denied, before and after allocation."""
    ns = t.ns("bob")
    for r in range(ROUNDS):
        claims = [f"c{r}-{i}" for i in range(2)]
        for claim in claims:
            # The previous round's claims are released when the watch delivers their
            # deletion: until then the quota's denial is the right answer.
            await poll(lambda claim=claim: honest_claim(t, "bob", claim), timeout=60,  # type: ignore[misc]
                       what=f"bob's {claim} admitted")
        assert not await honest_claim(t, "bob", f"c{r}-over")
        for i, claim in enumerate(claims):
            assert await t.pod("bob", f"p{r}-{i}", claim=claim) == ""
        for claim in claims:
            await poll(lambda claim=claim: allocated(t.kube, ns, claim), timeout=60,  # type: ignore[misc]
                       what=f"bob's {claim} allocated")
        assert not await honest_claim(t, "bob", f"c{r}-over")
        for i, claim in enumerate(claims):
            await t.kube.delete("v1", "pods", f"p{r}-{i}", namespace=ns, grace_period_seconds=0)
            await t.kube.wait_deleted("v1", "pods", f"p{r}-{i}", namespace=ns, timeout=60)
            await t.kube.delete(RESOURCE_V1, "resourceclaims", claim, namespace=ns)
        for claim in claims:
            await t.kube.wait_deleted(RESOURCE_V1, "resourceclaims", claim, namespace=ns, timeout=60)


async def alice(t: Tenants) -> None:
    """Pods from a template: two get their claims allocated, a third's claim is refused
    with the quota's message (the resourceclaim controller's Event)."""
    ns = t.ns("alice")
    template = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu"},
                "spec": {"spec": claim_spec(exact_request("gpu", t.fleet.device_class))}}
    assert await t.create("alice", "resourceclaimtemplates", template) == ""
    for r in range(ROUNDS):
        pods = [f"a{r}-{i}" for i in range(3)]
        for pod in pods[:2]:
            assert await t.pod("alice", pod, template="one-gpu") == ""
        for pod in pods[:2]:
            await poll(lambda pod=pod: pod_allocated(t.kube, ns, pod), timeout=60,  # type: ignore[misc]
                       what=f"alice's pod {pod} allocated")
        assert await t.pod("alice", pods[2], template="one-gpu") == ""
        message = await poll(lambda: refused_claim(t.kube, ns, pods[2]), timeout=60,
                             what=f"FailedResourceClaimCreation on alice's pod {pods[2]}")
        assert re.search(EXCEEDED, message), message
        for pod in pods:
            await t.kube.delete("v1", "pods", pod, namespace=ns, grace_period_seconds=0)
        for pod in pods:
            await t.kube.wait_deleted("v1", "pods", pod, namespace=ns, timeout=60)
        await poll(lambda: no_claims(t.kube, ns), timeout=60, what="alice's claims deleted with their pods")


async def pod_allocated(kube: Kube, namespace: str, pod: str) -> bool:
    obj = await kube.get("v1", "pods", pod, namespace=namespace)
    statuses = (obj.get("status") or {}).get("resourceClaimStatuses") or []
    names = [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]
    return bool(obj["spec"].get("nodeName")) and bool(names) and await allocated(kube, namespace, names[0])


async def refused_claim(kube: Kube, namespace: str, pod: str) -> str | None:
    events = await kube.list("v1", "events", namespace=namespace,
                             field_selector=f"involvedObject.name={pod},reason=FailedResourceClaimCreation")
    return next((e["message"] for e in events if "exceeded DeviceQuota" in e["message"]), None)


async def no_claims(kube: Kube, namespace: str) -> bool:
    return not await kube.list(RESOURCE_V1, "resourceclaims", namespace=namespace)


# -- mallory ---------------------------------------------------------------------------------------


def our_annotation_refused(outcome: str, *, hook: str, verb: str) -> bool:
    return outcome.startswith(f'403: admission webhook "{hook}" denied the request: annotation draquota.io/charge '
                              f"is written by dra-quota once the claim exists and may not be {verb}")


async def padded_then_protected(t: Tenants, refused_deletes: list[str]) -> None:
    """Claims with 200 KB annotations (two fit); then forged charges on them, and DELETEs
    another webhook refuses: the quota stays full (the sampler checks the counts)."""
    ns = t.ns("mallory")
    outcomes = [await t.claim("mallory", f"pad-{i}", annotations={"example.com/padding": "x" * PAD}) for i in range(5)]
    assert all(o == "" or QUOTA_DENIAL.match(o) for o in outcomes), outcomes
    t.answers["padded 200 KB: admitted"] += outcomes.count("")
    t.answers["padded 200 KB: quota"] += len(outcomes) - outcomes.count("")
    mine = [c["metadata"]["name"] for c in await t.kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)]
    assert mine, "mallory holds claims to attack with"
    for claim in mine:
        path = resource_path(RESOURCE_V1, "resourceclaims", claim, ns)
        forged = {"metadata": {"annotations": {OURS[0]: '{"memory":0,"devices":0}'}}}
        outcome = await t.request("mallory", "PATCH", path, forged)
        assert our_annotation_refused(outcome, hook="annotations.resourceclaims.draquota.io", verb="changed"), outcome
        t.answers["forged charge patch: refused"] += 1
        outcome = await t.request("mallory", "DELETE", path)
        assert outcome.startswith("403: ") and "claims are protected here" in outcome, outcome
        t.answers["DELETE refused by another webhook"] += 1
    assert len(refused_deletes) >= len(mine)
    # Nothing was released: still full (unless her Pods' claims are what holds it).
    outcome = await t.claim("mallory", "after-deletes")
    assert outcome == "" or QUOTA_DENIAL.match(outcome), outcome
    t.answers[f"create after refused DELETEs: {'admitted' if outcome == '' else 'quota'}"] += 1


async def expensive_claims(t: Tenants, salts: range, until: asyncio.Event) -> None:
    """Salted 32 x 8 selectors, dryRun and not, until the honest tenants are done."""
    for salt in salts:
        body = {"apiVersion": RESOURCE_V1, **expensive(t.fleet.device_class, salt)}
        outcome = await t.create("mallory", "resourceclaims", body, dry_run=salt % 3 != 0)
        # Denied by the budget, or, when it waited for the slow lane past the webhook's
        # timeout, by ours: either way our answer, not a failed call.
        budget = outcome.startswith('403: admission webhook "') and BUDGET in outcome
        assert budget or outcome.startswith(TIMED_OUT), outcome
        t.answers[f"expensive CEL: {'budget' if budget else 'timeout'}"] += 1
        if until.is_set() and salt >= salts.start + 2:
            return


async def dry_run_flood(t: Tenants, worker: int, until: asyncio.Event) -> None:
    """dryRun creates with 20 KB annotations, one GPU and four, until the honest tenants are done."""
    i = 0
    while not until.is_set() or i < 10:
        count = 4 if i % 2 else 1
        outcome = await t.claim("mallory", f"dry-{worker}-{i}", count=count, dry_run=True,
                                annotations={"example.com/padding": "y" * 20_000})
        match = QUOTA_DENIAL.match(outcome)
        assert (outcome == "" and count == 1) or (match and match.group(1) == f"{80 * count}Gi"), outcome
        t.answers[f"dryRun flood: {'admitted' if outcome == '' else 'quota'}"] += 1
        i += 1


async def forged_and_free(t: Tenants) -> None:
    """Our annotations on a new claim or template, a template that can never fit, adminAccess."""
    # A claim's charge is written by our mutating webhook into the create itself: one its
    # creator supplied is replaced by the claim's price, never kept (webhook/claimadmit.py).
    outcome = await t.claim("mallory", "forged", annotations={OURS[0]: '{"memory":0,"devices":0}', OURS[1]: ""})
    if outcome == "":
        stored = await t.kube.get(RESOURCE_V1, "resourceclaims", "forged", namespace=t.ns("mallory"))
        charge = json.loads(stored["metadata"]["annotations"][OURS[0]])
        assert charge == {"memory": 80 * 2**30, "devices": 1}, charge
        t.answers["claim with our annotations: charged its price"] += 1
    else:
        assert QUOTA_DENIAL.match(outcome), outcome
        t.answers["claim with our annotations: quota"] += 1
    stamped = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "forged"},
               "spec": {"metadata": {"annotations": {OURS[0]: "{}"}},
                        "spec": claim_spec(exact_request("gpu", t.fleet.device_class))}}
    outcome = await t.create("mallory", "resourceclaimtemplates", stamped)
    assert our_annotation_refused(outcome, hook="quota.resourceclaimtemplates.draquota.io", verb="set by its creator"), \
        outcome
    t.answers["template stamping our annotations: refused"] += 1
    huge = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "huge"},
            "spec": {"spec": claim_spec(exact_request("gpu", t.fleet.device_class, count=8))}}
    outcome = await t.create("mallory", "resourceclaimtemplates", huge)
    assert "a claim from this template can never fit" in outcome and 'DeviceQuota "gpus"' in outcome, outcome
    t.answers["template that never fits: refused"] += 1
    free = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": "free"},
            "spec": claim_spec(exact_request("gpu", t.fleet.device_class, admin_access=True))}
    outcome = await t.create("mallory", "resourceclaims", free)
    assert outcome.startswith(("403: ", "422: ")), outcome  # the API server's own check, or ours
    t.answers["adminAccess claim: refused"] += 1


async def template_pods(t: Tenants) -> None:
    """A template that fits, and three Pods from it: at most the quota's worth get claims."""
    template = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "one"},
                "spec": {"spec": claim_spec(exact_request("gpu", t.fleet.device_class))}}
    assert await t.create("mallory", "resourceclaimtemplates", template) == ""
    for i in range(3):
        assert await t.pod("mallory", f"m{i}", template="one") == ""
    t.answers["pods from a template: created"] += 3
