"""deploy/manifests/webhooks.yaml and admin-access-policy.yaml on the real 1.37 API server.

What the configurations select is decided by the API server (rules, selectors, CEL
matchConditions, dryRun and sideEffects), so it is proven there: the shipped objects are
applied as they are, except for what a shared test cluster needs:
- unique object names per test, and an extra objectSelector requirement on a per-test
  label, so only this test's objects are ever sent to this test's webhook (other e2e
  tests run against the same API server; the shipped namespaceSelector stays intact);
- clientConfig.service.port -> the loopback recorder's port (the API server's
  --loopback-service resolver dials 127.0.0.1:<service port> and verifies the certificate
  for dra-quota-webhook.dra-quota-system.svc), the test CA as caBundle, and the path
  suffixed with the webhook's name so each review says which webhook sent it;
- for the policy: the parameter ConfigMap in a test namespace, and the binding narrowed
  to the per-test label.
Every cluster-scoped object is deleted after its test.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from quota.admission.policy import parse_policy

from .cluster import ControlPlane, audit_event, free_ports
from .driver import RESOURCE_V1, claim_spec, exact_request
from .harness import ADMIN_LABEL, POLICY_DOCS
from .kube import ApiError, Kube, Obj, poll, resource_path
from .webhook_recorder import WEBHOOKS, Recorder, impersonated, serve_recorder
from .webhook_recorder import adapted_webhooks as shipped_for_test

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ADMISSION = "admissionregistration.k8s.io/v1"
RUN_LABEL = "e2e.draquota.io/run"
OUR_SA = "system:serviceaccount:dra-quota-system:dra-quota"

QUOTA = "quota.resourceclaims.draquota.io"  # mutating (one write a claim create)
TEMPLATES = "quota.resourceclaimtemplates.draquota.io"
ALLOCATION = "allocation.resourceclaims.draquota.io"
NAMESPACES = "admin-access.namespaces.draquota.io"
ANNOTATIONS = "annotations.resourceclaims.draquota.io"
PODS = "extended-resources.pods.draquota.io"
# The fail-open copies, for namespaces no DeviceQuota governs.
QUOTA_OPEN, TEMPLATES_OPEN, ALLOCATION_OPEN, ANNOTATIONS_OPEN = (
    h.replace(".resourceclaim", "-ungoverned.resourceclaim") for h in (QUOTA, TEMPLATES, ALLOCATION, ANNOTATIONS))
# What the leader keeps on namespaces holding a DeviceQuota; set by hand here (no serve).
GOVERNED = {"draquota.io/governed": "true"}
EXCLUDED = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "dra-quota-system"]}

MakeNamespace = Callable[..., Awaitable[str]]

PLURALS = {
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
}


def doc(docs: list[Obj], kind: str) -> Obj:
    (found,) = [d for d in docs if d["kind"] == kind]
    return copy.deepcopy(found)


class ClusterObjects:
    """Creates cluster-scoped objects and deletes them all after the test (reverse order)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.created: list[tuple[str, str, str]] = []

    async def create(self, body: Obj) -> Obj:
        api_version, plural = body["apiVersion"], PLURALS[body["kind"]]
        result = await self.kube.create(api_version, plural, body)
        self.created.append((api_version, plural, body["metadata"]["name"]))
        return result

    async def delete_all(self) -> None:
        for api_version, plural, name in reversed(self.created):
            await self.kube.delete(api_version, plural, name)
        self.created.clear()


@pytest_asyncio.fixture(loop_scope="session")
async def cluster_objects(kube: Kube, make_namespace: MakeNamespace) -> AsyncIterator[ClusterObjects]:
    # Depends on make_namespace so it is torn down first: the webhook configurations and
    # the policy are gone before the test's namespaces are deleted.
    objects = ClusterObjects(kube)
    try:
        yield objects
    finally:
        await objects.delete_all()


@pytest_asyncio.fixture(loop_scope="session")
async def recorder(cluster: ControlPlane) -> AsyncIterator[tuple[Recorder, int]]:
    cert, key = cluster.webhook_cert
    port = free_ports(1)[0]
    async with serve_recorder(str(cert), str(key), port) as rec:
        yield rec, port


def adapted_webhooks(run: str, port: int, cluster: ControlPlane) -> list[Obj]:
    return shipped_for_test(run, port, cluster, label=RUN_LABEL, name_suffix="e2e", selector="objectSelector",
                            path_per_hook=True)


def claim(name: str, run: str, *, annotations: dict[str, str] | None = None) -> Obj:
    meta: Obj = {"name": name, "labels": {RUN_LABEL: run}}
    if annotations:
        meta["annotations"] = annotations
    return {"kind": "ResourceClaim", "metadata": meta, "spec": claim_spec(exact_request("gpu", "e2e-no-such-class"))}


async def create_claim(kube: Kube, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
    return await kube.create(RESOURCE_V1, "resourceclaims", body, namespace=namespace, dry_run=dry_run)


async def apply_webhooks(
    kube: Kube, objects: ClusterObjects, cluster: ControlPlane, port: int, run: str, rec: Recorder, namespace: str
) -> None:
    """Create the configuration and wait until the API server calls it (a dry-run probe,
    answered by the quota webhook's copy for the namespace: governed or not)."""
    for config in adapted_webhooks(run, port, cluster):
        await objects.create(config)

    async def observed() -> bool:
        await create_claim(kube, namespace, claim("probe", run), dry_run=True)
        return bool({s.webhook for s in rec.reviews(name="probe")} & {QUOTA, QUOTA_OPEN})

    await poll(observed, timeout=30, what="the webhook configuration to take effect")
    rec.clear()


def run_id() -> str:
    return uuid.uuid4().hex[:8]


def once(items: list[Any]) -> list[Any]:
    """``items`` without repeats, in order.

    The API server runs validating admission inside the storage layer's optimistic
    update (GuaranteedUpdate, k8s.io/apiserver pkg/registry/generic/registry/store.go);
    when the cached current object it started from was stale, the update is retried and
    the webhook is called again for the same write. UPDATE assertions therefore compare
    the distinct writes a webhook saw (projected so that a retry looks the same).
    """
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


# -- the shape of the shipped objects (no cluster needed) ------------------------------------------


def test_shipped_webhooks_share_the_common_settings() -> None:
    """docs/design.md, "Deploy": every webhook excludes kube-system and our namespace, 5 s timeout,
    v1 reviews, dryRun-safe, Equivalent matching; each claim webhook twice, failing closed
    only where a DeviceQuota governs (docs/install.md, "Failure modes"); no DELETE; one mutating
    webhook, the claim CREATE's (its own path, reinvoked when a later webhook changes the claim)."""
    assert {c["kind"] for c in WEBHOOKS} == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    hooks = {h["name"]: h for c in WEBHOOKS for h in c["webhooks"]}
    mutating = {h["name"] for c in WEBHOOKS if c["kind"] == "MutatingWebhookConfiguration" for h in c["webhooks"]}
    assert mutating == {QUOTA, QUOTA_OPEN}
    assert set(hooks) == {QUOTA, QUOTA_OPEN, TEMPLATES, TEMPLATES_OPEN, ALLOCATION, ALLOCATION_OPEN, ANNOTATIONS,
                          ANNOTATIONS_OPEN, NAMESPACES, PODS}
    for name, hook in hooks.items():
        assert hook["admissionReviewVersions"] == ["v1"], name
        # The Pod warning writes nothing and must not slow Pod creation.
        assert hook["sideEffects"] == ("None" if name == PODS else "NoneOnDryRun"), name
        assert hook["timeoutSeconds"] == (2 if name == PODS else 5), name
        assert hook["matchPolicy"] == "Equivalent", name
        assert hook["namespaceSelector"]["matchExpressions"][0] == EXCLUDED, name
        service = hook["clientConfig"]["service"]
        assert (service["namespace"], service["name"], service["port"]) == ("dra-quota-system", "dra-quota-webhook", 443)
        assert service["path"] == ("/admit" if name in mutating else "/validate"), name
        assert hook.get("reinvocationPolicy") == ("IfNeeded" if name in mutating else None), name
        assert "caBundle" not in hook["clientConfig"], "injected by certs/ or cert-manager"
        assert "DELETE" not in hook["rules"][0]["operations"], name
    assert {n: h["failurePolicy"] for n, h in hooks.items()} == {
        QUOTA: "Fail", TEMPLATES: "Fail", ALLOCATION: "Fail", ANNOTATIONS: "Fail", QUOTA_OPEN: "Ignore",
        TEMPLATES_OPEN: "Ignore", ALLOCATION_OPEN: "Ignore", ANNOTATIONS_OPEN: "Ignore", NAMESPACES: "Fail",
        PODS: "Ignore",
    }  # fmt: skip
    for closed, open_ in ((QUOTA, QUOTA_OPEN), (TEMPLATES, TEMPLATES_OPEN), (ALLOCATION, ALLOCATION_OPEN),
                          (ANNOTATIONS, ANNOTATIONS_OPEN)):
        assert hooks[closed]["namespaceSelector"]["matchExpressions"][1:] == [
            {"key": "draquota.io/governed", "operator": "In", "values": ["true"]}]
        assert hooks[open_]["namespaceSelector"]["matchExpressions"][1:] == [
            {"key": "draquota.io/governed", "operator": "NotIn", "values": ["true"]}]
    for name in (NAMESPACES, PODS):
        assert hooks[name]["namespaceSelector"] == {"matchExpressions": [EXCLUDED]}, name
    skips_us = {n for n, h in hooks.items() if any(OUR_SA in c["expression"] for c in h.get("matchConditions", []))}
    assert skips_us == {ALLOCATION, ANNOTATIONS, ALLOCATION_OPEN, ANNOTATIONS_OPEN}


# -- (a), (d) and dryRun: claim and template CREATE, claim DELETE ----------------------------------


async def test_claim_create_delete_and_dry_run_reach_their_webhooks(
    kube: Kube, cluster: ControlPlane, make_namespace: MakeNamespace,
    cluster_objects: ClusterObjects, recorder: tuple[Recorder, int],
) -> None:  # fmt: skip
    rec, port = recorder
    run = run_id()
    ns = await make_namespace("admcfg", labels=GOVERNED)
    await apply_webhooks(kube, cluster_objects, cluster, port, run, rec, ns)

    # dryRun reaches the (governed) quota webhook (sideEffects NoneOnDryRun) with dryRun
    # true, and nothing is persisted.
    await create_claim(kube, ns, claim("dry", run), dry_run=True)
    assert [(s.webhook, s.path, s.operation, s.dry_run) for s in rec.reviews(name="dry")] == [
        (QUOTA, "/admit", "CREATE", True),
    ]
    assert await kube.get_or_none(RESOURCE_V1, "resourceclaims", "dry", namespace=ns) is None

    # A real CREATE: one webhook call, the mutating one, before the API server gives the
    # claim its uid (so the reservation is named by a token, webhook/claimadmit.py).
    created = await create_claim(kube, ns, claim("c1", run))
    seen = rec.reviews(name="c1")
    assert [(s.webhook, s.operation, s.dry_run, s.sub_resource) for s in seen] == [(QUOTA, "CREATE", False, "")]
    assert seen[0].request["uid"] and created["metadata"]["uid"]
    assert "uid" not in seen[0].object["metadata"]

    # A generateName CREATE: one call too (what name it shows is the API server's affair:
    # the token names the reservation, not the name).
    generated = {**claim("", run)}
    generated["metadata"] = {"generateName": "gen-", "labels": {RUN_LABEL: run}}
    await create_claim(kube, ns, generated)
    gen_seen = [s for s in rec.seen if (s.object.get("metadata") or {}).get("generateName") == "gen-"]
    assert [(s.webhook, s.operation) for s in gen_seen] == [(QUOTA, "CREATE")]

    # Templates: their own quota webhook, validating.
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t1", "labels": {RUN_LABEL: run}},
                "spec": {"spec": claim_spec(exact_request("gpu", "e2e-no-such-class"))}}  # fmt: skip
    await kube.create(RESOURCE_V1, "resourceclaimtemplates", template, namespace=ns)
    assert [(s.webhook, s.path, s.operation) for s in rec.reviews(name="t1")] == [(TEMPLATES, "/validate", "CREATE")]

    # Claim UPDATEs reach us only when they touch our annotations: other metadata
    # (labels, other annotations, finalizers) does not; adding, changing or removing
    # ours does; our own ServiceAccount's change does not (impersonated, with
    # system:masters so that RBAC is not the question).
    rec.clear()

    async def update(meta: Obj, user: str | None = None) -> None:
        if user is None:
            await kube.patch(RESOURCE_V1, "resourceclaims", "c1", {"metadata": meta}, namespace=ns)
        else:
            await impersonated(kube, "PATCH", resource_path(RESOURCE_V1, "resourceclaims", "c1", ns), user=user,
                               groups=["system:masters"], body={"metadata": meta})  # fmt: skip

    await update({"labels": {"x": "y"}, "annotations": {"note": "n"}, "finalizers": ["e2e.draquota.io/hold"]})
    await update({"finalizers": None})
    assert rec.seen == []
    await update({"annotations": {"draquota.io/charge": '{"memory":1,"devices":1}', "draquota.io/quotas": "q"}},
                 user=OUR_SA)
    assert rec.seen == []
    async def touches(meta: Obj) -> list[Any]:
        """One write; every call it caused came from our annotations webhook. The last
        call is the attempt the API server committed (see :func:`once`)."""
        rec.clear()
        await update(meta)
        assert {(s.webhook, s.operation, s.sub_resource) for s in rec.seen} == {(ANNOTATIONS, "UPDATE", "")}
        return rec.seen[-1:]

    (last,) = await touches({"annotations": {"draquota.io/charge": "forged"}})
    assert last.old_object["metadata"]["annotations"]["draquota.io/charge"] == '{"memory":1,"devices":1}'
    assert last.object["metadata"]["annotations"] == {"draquota.io/charge": "forged", "draquota.io/quotas": "q",
                                                      "note": "n"}  # fmt: skip
    (last,) = await touches({"annotations": {"draquota.io/quotas": None}})
    assert last.object["metadata"]["annotations"] == {"draquota.io/charge": "forged", "note": "n"}
    # The admission's token too: a copied token must reach us to be refused.
    (last,) = await touches({"annotations": {"draquota.io/admission": "copied"}})
    assert last.object["metadata"]["annotations"]["draquota.io/admission"] == "copied"
    rec.clear()

    # DELETE reaches no webhook of ours: a reservation ends when the claim watch delivers
    # the deletion, never at the DELETE's admission, which a later step may still refuse.
    await kube.delete(RESOURCE_V1, "resourceclaims", "c1", namespace=ns)
    await kube.wait_deleted(RESOURCE_V1, "resourceclaims", "c1", namespace=ns, timeout=30)
    assert rec.reviews(name="c1") == []

    # kube-system and our own namespace are excluded by the shipped namespaceSelector,
    # even for objects that carry this test's label (so only the NotIn can be what skips
    # them). Webhook calls are synchronous: had one matched, its review would be
    # recorded before the call returned. dra-quota-system is created if missing and left
    # in place (other tests may be using it).
    try:
        await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": {"name": "dra-quota-system"}})
    except ApiError as e:
        if e.status != 409:
            raise
    rec.clear()
    for excluded in ("kube-system", "dra-quota-system"):
        try:
            await create_claim(kube, excluded, claim(f"e2e-{run}", run))
            await kube.patch(RESOURCE_V1, "resourceclaims", f"e2e-{run}", {"status": {"allocation": allocation()}},
                             namespace=excluded, subresource="status")  # fmt: skip
            await kube.patch(RESOURCE_V1, "resourceclaims", f"e2e-{run}", {"status": {"allocation": None}},
                             namespace=excluded, subresource="status")  # fmt: skip
            await kube.delete(RESOURCE_V1, "resourceclaims", f"e2e-{run}", namespace=excluded)
            assert rec.seen == [], [(s.webhook, s.namespace, s.name) for s in rec.seen]
        finally:
            await kube.delete(RESOURCE_V1, "resourceclaims", f"e2e-{run}", namespace=excluded)
    # ... while the same create in the test namespace still reaches us.
    await create_claim(kube, ns, claim("after", run))
    assert {s.webhook for s in rec.reviews(name="after")} == {QUOTA}

    # Objects without this test's label never reach this test's webhooks.
    rec.clear()
    await create_claim(kube, ns, {**claim("unlabelled", run), "metadata": {"name": "unlabelled"}})
    assert rec.seen == []


# -- (b) the allocation check: only the status update that sets status.allocation ---------------


def allocation() -> Obj:
    return {
        "devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "pool-a", "device": "gpu-0"}]
        }
    }


async def test_allocation_webhook_sees_only_the_update_that_sets_allocation(
    kube: Kube, cluster: ControlPlane, make_namespace: MakeNamespace,
    cluster_objects: ClusterObjects, recorder: tuple[Recorder, int],
) -> None:  # fmt: skip
    rec, port = recorder
    run = run_id()
    ns = await make_namespace("admalloc", labels=GOVERNED)
    await apply_webhooks(kube, cluster_objects, cluster, port, run, rec, ns)
    await create_claim(kube, ns, claim("alloc", run))
    rec.clear()

    async def status(patch: Obj, *, user: str | None = None) -> Obj:
        if user is None:
            return await kube.patch(RESOURCE_V1, "resourceclaims", "alloc", {"status": patch}, namespace=ns,
                                    subresource="status")  # fmt: skip
        # Our own ServiceAccount (impersonated; system:masters so RBAC is not the question).
        path = resource_path(RESOURCE_V1, "resourceclaims", "alloc", ns, "status")
        result: Obj = await impersonated(kube, "PATCH", path, user=user, groups=["system:masters"],
                                         body={"status": patch})  # fmt: skip
        return result

    # The scheduler's write: allocation set (as the scheduler does, reservedFor with it).
    consumer = {"apiGroup": "e2e.draquota.io", "resource": "widgets", "name": "w1", "uid": str(uuid.uuid4())}
    # An unknown consumer type: the resourceclaim controller keeps such entries instead
    # of pruning them (syncClaim, pkg/controller/resourceclaim/controller.go), so it
    # cannot deallocate the claim behind the test's back.
    updated = await status({"allocation": allocation(), "reservedFor": [consumer]})
    assert updated["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert once([(s.webhook, s.operation, s.sub_resource, s.name) for s in rec.seen]) == [
        (ALLOCATION, "UPDATE", "status", "alloc")
    ]
    seen = rec.seen[-1]
    assert "allocation" not in (seen.old_object.get("status") or {})
    assert seen.object["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"

    # Later status writes never reach us: a reservedFor change (a second consumer), a
    # driver's status.devices, then deallocation (allocation and reservedFor cleared).
    rec.clear()
    other = {**consumer, "name": "w2", "uid": str(uuid.uuid4())}
    await status({"reservedFor": [consumer, other]})
    device_status = {"driver": "gpu.nvidia.com", "pool": "pool-a", "device": "gpu-0",
                     "conditions": [{"type": "Ready", "status": "True", "reason": "E2E", "message": "",
                                     "lastTransitionTime": "2026-11-23T00:00:00Z"}]}  # fmt: skip
    with_devices = await status({"devices": [device_status]})
    assert with_devices["status"]["devices"][0]["device"] == "gpu-0"
    await status({"reservedFor": [consumer]})
    freed = await status({"reservedFor": None, "allocation": None, "devices": None})
    assert "allocation" not in freed["status"]
    assert rec.seen == [], [(s.webhook, s.operation, s.sub_resource) for s in rec.seen]

    # Our own ServiceAccount's writes are skipped even when they set the allocation ...
    await status({"allocation": allocation()}, user=OUR_SA)
    await status({"allocation": None}, user=OUR_SA)
    assert rec.seen == []
    # ... while anyone else's identical write reaches us.
    await status({"allocation": allocation()})
    assert once([(s.webhook, s.username) for s in rec.seen]) == [(ALLOCATION, rec.seen[0].username)]
    assert rec.seen[0].username != OUR_SA


# -- (f) the Pod warning webhook ---------------------------------------------------------------


async def test_pod_webhook_sees_only_pods_asking_an_extended_resource(
    kube: Kube, cluster: ControlPlane, make_namespace: MakeNamespace,
    cluster_objects: ClusterObjects, recorder: tuple[Recorder, int],
) -> None:  # fmt: skip
    rec, port = recorder
    run = run_id()
    ns = await make_namespace("admpod")
    await apply_webhooks(kube, cluster_objects, cluster, port, run, rec, ns)

    async def create(name: str, limits: dict[str, str], *, init: dict[str, str] | None = None) -> None:
        """A dry-run Pod CREATE (sideEffects None: dry runs are sent too)."""
        spec: Obj = {"containers": [{"name": "c", "image": "pause", "resources": {"limits": limits}}]}
        if init is not None:
            spec["initContainers"] = [{"name": "i", "image": "pause", "resources": {"limits": init}}]
        await kube.create("v1", "pods", {"kind": "Pod", "metadata": {"name": name, "labels": {RUN_LABEL: run}},
                                         "spec": spec}, namespace=ns, dry_run=True)  # fmt: skip

    native = {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi", "hugepages-2Mi": "2Mi"}
    await create("native", native)
    await create("none", {})
    await create("gpu", {**native, "example.com/gpu": "1"})
    await create("implicit", {"deviceclass.resource.kubernetes.io/some-class": "1"})
    await create("init", native, init={"example.com/gpu": "1"})
    sent = {s.name: (s.webhook, s.operation, s.dry_run) for s in rec.seen if s.webhook == PODS}
    assert sent == {name: (PODS, "CREATE", True) for name in ("gpu", "implicit", "init")}, rec.seen
    assert all(s.webhook == PODS for s in rec.seen), rec.seen


# -- failure policies: what a down webhook blocks and what it does not ---------------------------


async def test_failure_policies_when_the_webhook_is_down(
    kube: Kube, cluster: ControlPlane, make_namespace: MakeNamespace, cluster_objects: ClusterObjects
) -> None:
    run = run_id()
    governed = await make_namespace("admdown", labels={RUN_LABEL: run, **GOVERNED})
    free = await make_namespace("admfree", labels={RUN_LABEL: run})
    cert, key = cluster.webhook_cert
    port = free_ports(1)[0]
    async with serve_recorder(str(cert), str(key), port) as rec:
        await apply_webhooks(kube, cluster_objects, cluster, port, run, rec, governed)
        for ns in (governed, free):
            await create_claim(kube, ns, claim("before", run))
    # Nothing listens on the port any more: every call fails with "connection refused".

    async def fails(call: Awaitable[Any], webhook: str) -> None:
        with pytest.raises(ApiError) as err:
            await call
        assert err.value.status == 500, err.value.body
        assert f'failed calling webhook "{webhook}"' in err.value.message, err.value.message

    def annotate(ns: str) -> Awaitable[Obj]:
        return kube.patch(RESOURCE_V1, "resourceclaims", "before",
                          {"metadata": {"annotations": {"draquota.io/charge": "x"}}}, namespace=ns)

    def allocate(ns: str) -> Awaitable[Obj]:
        return kube.patch(RESOURCE_V1, "resourceclaims", "before", {"status": {"allocation": allocation()}},
                          namespace=ns, subresource="status")

    # Fail where governed: claim CREATE, the allocation write, our annotations; and the
    # admin-access label everywhere.
    await fails(create_claim(kube, governed, claim("during", run)), QUOTA)
    await fails(allocate(governed), ALLOCATION)
    await fails(annotate(governed), ANNOTATIONS)
    await fails(kube.patch("v1", "namespaces", governed, {"metadata": {"labels": {ADMIN_LABEL: "true"}}}), NAMESPACES)
    # Ignore everywhere else: creates, DRA scheduling (the allocation write), then
    # deallocation and deletion go on as if dra-quota were not installed.
    await create_claim(kube, free, claim("during", run))
    allocated = await allocate(free)
    assert allocated["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    await annotate(free)
    await kube.patch(RESOURCE_V1, "resourceclaims", "before", {"status": {"allocation": None}}, namespace=free,
                     subresource="status")  # fmt: skip
    # Writes none of our webhooks select were never in question, governed or not.
    for ns in (governed, free):
        await kube.patch(RESOURCE_V1, "resourceclaims", "before", {"metadata": {"labels": {"x": "y"}}}, namespace=ns)
        await kube.patch("v1", "namespaces", ns, {"metadata": {"labels": {"team": "a"}}})
        # Ignore: Pods are created without their warning.
        await kube.create("v1", "pods", {"kind": "Pod", "metadata": {"name": "gpu", "labels": {RUN_LABEL: run}},
                                         "spec": {"containers": [{"name": "c", "image": "pause", "resources": {
                                             "limits": {"example.com/gpu": "1"}}}]}},
                          namespace=ns, dry_run=True)  # fmt: skip
        await kube.delete(RESOURCE_V1, "resourceclaims", "before", namespace=ns)
        await kube.wait_deleted(RESOURCE_V1, "resourceclaims", "before", namespace=ns, timeout=30)


# -- (c) the namespace label webhook -----------------------------------------------------------


async def namespace_dry_run_patch(kube: Kube, name: str, labels: dict[str, str | None]) -> Obj:
    result: Obj = await kube.request("PATCH", resource_path("v1", "namespaces", name), body={"metadata": {"labels": labels}},
                                     params={"dryRun": "All"}, content_type="application/merge-patch+json")  # fmt: skip
    return result


async def finalize(kube: Kube, name: str, labels: dict[str, str | None], *, user: str | None = None,
                   groups: tuple[str, ...] = ()) -> Obj:  # fmt: skip
    """PUT namespaces/<name>/finalize with the labels changed (the subresource takes no PATCH)."""
    current = await kube.get("v1", "namespaces", name)
    merged = {**(current["metadata"].get("labels") or {}), **labels}
    current["metadata"]["labels"] = {k: v for k, v in merged.items() if v is not None}
    path = resource_path("v1", "namespaces", name, subresource="finalize")
    if user is None:
        result: Obj = await kube.request("PUT", path, body=current)
    else:
        result = await impersonated(kube, "PUT", path, user=user, groups=groups, body=current,
                                    content_type="application/json")  # fmt: skip
    return result


async def test_namespace_webhook_sees_only_admin_access_label_changes(
    kube: Kube, cluster: ControlPlane, make_namespace: MakeNamespace,
    cluster_objects: ClusterObjects, recorder: tuple[Recorder, int],
) -> None:  # fmt: skip
    rec, port = recorder
    run = run_id()
    ns = await make_namespace("admns", labels={RUN_LABEL: run})
    for config in adapted_webhooks(run, port, cluster):
        await cluster_objects.create(config)

    async def observed() -> bool:
        await namespace_dry_run_patch(kube, ns, {ADMIN_LABEL: "true"})
        return bool(rec.reviews(webhook=NAMESPACES))

    await poll(observed, timeout=30, what="the namespace webhook to take effect")
    assert {(s.operation, s.name, s.sub_resource, s.dry_run) for s in rec.seen} == {("UPDATE", ns, "", True)}
    rec.clear()

    def seen() -> list[tuple[str, str, str | None, str | None]]:
        """What the last write sent: (operation, subresource, old label, new label) of the
        attempt the API server committed (the last call, see :func:`once`), or nothing."""
        assert {s.webhook for s in rec.seen} <= {NAMESPACES}
        assert len({(s.operation, s.sub_resource) for s in rec.seen}) <= 1, rec.seen
        out = []
        for s in rec.seen[-1:]:
            old = (s.old_object.get("metadata") or {}).get("labels") or {}
            new = (s.object.get("metadata") or {}).get("labels") or {}
            out.append((s.operation, s.sub_resource, old.get(ADMIN_LABEL), new.get(ADMIN_LABEL)))
        rec.clear()
        return out

    async def patch(labels: dict[str, str | None], subresource: str | None = None) -> None:
        await kube.patch("v1", "namespaces", ns, {"metadata": {"labels": labels}}, subresource=subresource)

    await patch({"team": "a"})  # other labels: not ours
    assert seen() == []
    await patch({ADMIN_LABEL: "true"})  # added
    assert seen() == [("UPDATE", "", None, "true")]
    await patch({"team": "b"})  # label present but unchanged: objectSelector matches, CEL does not
    assert seen() == []
    await patch({ADMIN_LABEL: "false"}, "status")  # changed through namespaces/status
    assert seen() == [("UPDATE", "status", "true", "false")]
    await patch({"team": "c"}, "status")
    assert seen() == []
    await finalize(kube, ns, {ADMIN_LABEL: None})  # removed through namespaces/finalize
    assert seen() == [("UPDATE", "finalize", "false", None)]
    await finalize(kube, ns, {"team": "d"})
    assert seen() == []

    # CREATE: with the label it reaches us (there is no oldObject), without it does not.
    created = await make_namespace("admnew", labels={RUN_LABEL: run, ADMIN_LABEL: "true"})
    assert seen() == [("CREATE", "", None, "true")]
    await make_namespace("admplain", labels={RUN_LABEL: run})
    assert seen() == []
    assert created


# -- the ValidatingAdmissionPolicy: the label guard in the API server itself ------------------------


async def test_admin_access_policy_guards_the_label(
    kube: Kube, cluster: ControlPlane, make_namespace: MakeNamespace, cluster_objects: ClusterObjects
) -> None:
    run = run_id()
    alice, mallory, carol = f"e2e-alice-{run}", f"e2e-mallory-{run}", f"e2e-carol-{run}"
    admins = f"e2e-admins-{run}"
    params_ns = await make_namespace("admparams")
    bot = f"system:serviceaccount:{params_ns}:bot"
    target = await make_namespace("admvap", labels={RUN_LABEL: run})
    other = await make_namespace("admvap2", labels={RUN_LABEL: run})

    # RBAC to write namespaces (and their subresources) for every test user, so the
    # policy, not RBAC, is what decides.
    role = f"e2e-ns-writer-{run}"
    await cluster_objects.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": [{"apiGroups": [""], "resources": ["namespaces", "namespaces/status", "namespaces/finalize"],
                   "verbs": ["get", "create", "patch", "update"]}],
    })  # fmt: skip
    await cluster_objects.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in (alice, mallory, carol)]
        + [{"kind": "ServiceAccount", "name": "bot", "namespace": params_ns}],
    })  # fmt: skip

    # The shipped ConfigMap, policy and binding: unique names, params in a test
    # namespace, binding narrowed to this test's namespaces.
    params = doc(POLICY_DOCS, "ConfigMap")
    params["metadata"].update(name=f"admin-access-{run}", namespace=params_ns)
    params["data"] = {"users": f" {alice} , someone-else", "groups": admins, "serviceAccounts": f"{params_ns}:*"}
    # The webhook reads the same ConfigMap (quota/admission/policy.py): it must agree on who is in.
    webhook_policy = parse_policy(params["data"])
    assert [webhook_policy.basis(u, g) is not None for u, g in
            ((alice, []), (mallory, []), (carol, [admins]), (bot, []))] == [True, False, True, True]  # fmt: skip
    await kube.create("v1", "configmaps", params, namespace=params_ns)
    policy = doc(POLICY_DOCS, "ValidatingAdmissionPolicy")
    policy["metadata"]["name"] = f"dra-quota-admin-access-label-{run}"
    await cluster_objects.create(policy)
    # (status.typeChecking would list CEL type warnings, but it is written by
    # kube-controller-manager's validatingadmissionpolicy-status-controller, which the
    # test control plane does not run; the behaviour below is the proof instead.)
    binding = doc(POLICY_DOCS, "ValidatingAdmissionPolicyBinding")
    binding["metadata"]["name"] = policy["metadata"]["name"]
    binding["spec"]["policyName"] = policy["metadata"]["name"]
    assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Deny"
    binding["spec"]["paramRef"].update(name=params["metadata"]["name"], namespace=params_ns)
    binding["spec"]["matchResources"] = {"objectSelector": {"matchLabels": {RUN_LABEL: run}}}
    await cluster_objects.create(binding)

    ns_path = resource_path("v1", "namespaces", target)
    status_path = resource_path("v1", "namespaces", target, subresource="status")

    async def as_user(user: str, labels: dict[str, str | None], *, path: str = ns_path, groups: tuple[str, ...] = (),
                      dry_run: bool = False) -> Obj:  # fmt: skip
        result: Obj = await impersonated(kube, "PATCH", path, user=user, groups=groups,
                                         body={"metadata": {"labels": labels}},
                                         params={"dryRun": "All"} if dry_run else None)  # fmt: skip
        return result

    async def denied(call: Awaitable[Obj]) -> ApiError:
        with pytest.raises(ApiError) as err:
            await call
        return err.value

    ours = "and the principals listed in ConfigMap"

    # The policy (and RBAC) take a moment to be observed: poll with a dry run until
    # mallory's attempt is refused by the policy (not by RBAC).
    async def policy_denies() -> ApiError | None:
        try:
            await as_user(mallory, {ADMIN_LABEL: "true"}, dry_run=True)
        except ApiError as e:
            return e if ours in e.message else None
        return None

    err = await poll(policy_denies, timeout=60, what="the admission policy to deny a non-allowlisted user")
    assert err.status == 403 and err.reason == "Forbidden", err.body
    assert f'ValidatingAdmissionPolicy \'{policy["metadata"]["name"]}\'' in err.message
    assert f"(<absent> -> \"true\")" in err.message
    assert f"ConfigMap {params_ns}/{params['metadata']['name']}" in err.message
    assert f'user "{mallory}" is neither' in err.message

    # Not-allowlisted: adding via UPDATE, namespaces/status and namespaces/finalize.
    err = await denied(as_user(mallory, {ADMIN_LABEL: "true"}))
    assert err.status == 403 and ours in err.message
    err = await denied(as_user(mallory, {ADMIN_LABEL: "true"}, path=status_path))
    assert err.status == 403 and ours in err.message
    err = await denied(finalize(kube, target, {ADMIN_LABEL: "true"}, user=mallory))
    assert err.status == 403 and ours in err.message
    # ... nor by creating a namespace that carries it.
    err = await denied(impersonated(kube, "POST", "/api/v1/namespaces", user=mallory, content_type="application/json",
                                    body={"apiVersion": "v1", "kind": "Namespace", "metadata": {
                                        "name": f"e2e-mallory-{run}", "labels": {RUN_LABEL: run, ADMIN_LABEL: "true"}}}))  # fmt: skip
    assert err.status == 403 and ours in err.message
    assert ADMIN_LABEL not in (await kube.get("v1", "namespaces", target))["metadata"]["labels"]
    # Other labels stay free for everyone.
    await as_user(mallory, {"team": "mallory"})

    # Allowlisted by user name (list entries trimmed): plain UPDATE.
    await as_user(alice, {ADMIN_LABEL: "true"})
    assert (await kube.get("v1", "namespaces", target))["metadata"]["labels"][ADMIN_LABEL] == "true"
    # Both decisions are in the audit log, under "<policy name>/<key>" (tests/e2e/cluster.py
    # audits namespace writes).
    audit_key = f"{policy['metadata']['name']}/admin-access-label"
    for user, value in ((mallory, f'not listed, RBAC decides (a refusal is the validation_failure): {mallory} changing {ADMIN_LABEL} '
                                  f'from <absent> to "true"'),
                        (alice, f'granted: {alice} changing {ADMIN_LABEL} from <absent> to "true"')):
        async def logged() -> Obj | None:
            return audit_event(cluster.audit_events(), resource="namespaces", name=target, user=user, annotation=audit_key)

        event = await poll(logged, timeout=30, what=f"the audit event of {user}'s label change")
        assert event["annotations"][audit_key] == value, event["annotations"]
    # A non-allowlisted user can neither change nor remove it, through any path ...
    changes: list[dict[str, str | None]] = [{ADMIN_LABEL: "false"}, {ADMIN_LABEL: None}]
    for labels in changes:
        for path in (ns_path, status_path):
            err = await denied(as_user(mallory, labels, path=path))
            assert err.status == 403 and ours in err.message, (labels, path)
        err = await denied(finalize(kube, target, labels, user=mallory))
        assert err.status == 403 and ours in err.message
    err = await denied(as_user(mallory, {ADMIN_LABEL: None}))
    assert '("true" -> <absent>)' in err.message
    # ... and may still write the labelled namespace otherwise (the matchCondition).
    await as_user(mallory, {"team": "still-mallory"}, path=status_path)
    # Allowlisted by group, through namespaces/status.
    await as_user(carol, {ADMIN_LABEL: "false"}, path=status_path, groups=(admins,))
    assert (await kube.get("v1", "namespaces", target))["metadata"]["labels"][ADMIN_LABEL] == "false"
    await as_user(alice, {ADMIN_LABEL: "true"}, path=status_path)
    assert (await kube.get("v1", "namespaces", target))["metadata"]["labels"][ADMIN_LABEL] == "true"
    # Allowlisted ServiceAccount (<namespace>:*), removing it through namespaces/finalize.
    await finalize(kube, target, {ADMIN_LABEL: None}, user=bot)
    assert ADMIN_LABEL not in (await kube.get("v1", "namespaces", target))["metadata"]["labels"]
    # The cluster admin is not allowlisted, but the authorizer allows system:masters
    # everything, `label` on adminaccess.draquota.io included: RBAC decides beside the lists.
    await as_user("platform-admin", {ADMIN_LABEL: "true"}, groups=("system:masters",), dry_run=True)

    # parameterNotFoundAction Deny: without the ConfigMap the guard fails closed, even
    # for alice, but only for writes that touch a labelled namespace (objectSelector).
    await as_user(alice, {ADMIN_LABEL: "true"}, path=ns_path)
    await kube.delete("v1", "configmaps", params["metadata"]["name"], namespace=params_ns)

    async def fails_closed() -> ApiError | None:
        try:
            await as_user(alice, {ADMIN_LABEL: None}, dry_run=True)
        except ApiError as e:
            return e
        return None

    err = await poll(fails_closed, timeout=60, what="the policy to deny once its ConfigMap is gone")
    # A binding that cannot be configured is a policy error, answered 422 Invalid
    # (k8s.io/apiserver pkg/admission/plugin/policy/generic/policy_dispatcher.go).
    assert err.status == 422, err.body
    assert "no params found for policy binding with `Deny` parameterNotFoundAction" in err.message
    await as_user(mallory, {"team": "unlabelled-is-unaffected"}, path=resource_path("v1", "namespaces", other))
