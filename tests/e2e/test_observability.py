"""`dra-quota serve`'s metrics and Events, against the real 1.37 API server.

adminAccess: a non-allowlisted user (impersonation) cannot add the namespace label nor
create an adminAccess claim; an allowlisted one can; the Event and metric show both; plus
the quota denial: the process is scraped on its plain-HTTP metrics port before and after
each step, and every counter must have moved by exactly what the step did; the Events are
read back through events.k8s.io/v1.

Impersonated users carry `system:masters`, so RBAC is never the question (the policy
lists users only, so the group gives them nothing there). Each claim CREATE is one
review of the mutating webhook (`admitting`, deploy/manifests/webhooks.yaml), which
writes the charge into the claim: no UPDATE review follows (the leader writes nothing to
it; were it to, the claim-annotation guard would review it, as the test's serve runs as
the cluster admin, whom the shipped configuration does not skip); a namespace label
change is one validating review.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from certs.authority import inspect
from kube.events import EventKey, EventRecorder, Ref
from runtime.eventcorrelation import Budget, Rate
from runtime.metricnames import (
    ADMIN_ACCESS_DECISIONS, ADMISSION_REQUESTS, BUILD_INFO, CERTIFICATE_EXPIRATION, EVENTS_DROPPED, WATCH_SYNCED,
)

from .cluster import ControlPlane
from .driver import RESOURCE_V1, claim_spec, exact_request
from .harness import (DQ, RUN_LABEL, MakeNamespace, Served, Setup, advised, annotated, claim_body, denial, make_quota,
                      metered)
from .kube import ApiError, Kube, Obj, poll, resource_path
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

ADMIN_LABEL = "resource.kubernetes.io/admin-access"
RUN = uuid.uuid4().hex[:8]
OPS, MALLORY = f"e2e-ops-{RUN}", f"e2e-mallory-{RUN}"  # allowlisted, and not
EVENTS = "events.k8s.io/v1"
RBAC = "rbac.authorization.k8s.io/v1"
ROOT = Path(__file__).resolve().parents[2]
SHIPPED_RBAC = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/rbac-events.yaml").read_text()) if d]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """`serve` with an adminAccess allowlist of one user and metrics on a free port."""
    policy = tmp_path / "admin-access-policy.yaml"
    policy.write_text(f"users: [{OPS}]\n")
    async for handle in metered(cluster, tmp_path, "--admin-access-policy", str(policy)):
        yield handle


def moved(before: Samples, after: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The series of `name` that changed between two scrapes, and by how much."""
    keys = {k for k in (*before, *after) if k[0] == name}
    return {k[1]: after.get(k, 0.0) - before.get(k, 0.0) for k in keys if after.get(k, 0.0) != before.get(k, 0.0)}


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


def requests(operation: str, resource: str, decision: str, reason: str, webhook: str = "validating", *,
             namespace: str) -> frozenset[tuple[str, str]]:
    return labels(webhook=webhook, operation=operation, resource=resource, decision=decision, reason=reason,
                  namespace=namespace)


async def events(kube: Kube, namespace: str, predicate: Callable[[Obj], bool], what: str) -> Obj:
    async def found() -> Obj | None:
        return next((e for e in await kube.list(EVENTS, "events", namespace=namespace) if predicate(e)), None)

    event: Obj = await poll(found, timeout=30, what=what)
    return event


def admin_claim(name: str, setup: Setup) -> Obj:
    return {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": claim_spec(exact_request("gpu", setup.fleet.device_class, admin_access=True))}


async def test_denials_and_admin_access_show_in_metrics_and_events(kube: Kube, setup: Setup) -> None:
    served, ns, ops, mallory = setup.served, setup.namespace, OPS, MALLORY

    def as_user(user: str, method: str, path: str, body: Obj, **params: str) -> Awaitable[Any]:
        return impersonated(kube, method, path, user=user, groups=["system:masters"], body=body, params=params or None,
                            content_type="application/merge-patch+json" if method == "PATCH" else "application/json")

    with served.log_on_failure():
        first = await served.metrics()
        assert [v for k, v in first.items() if k[0] == BUILD_INFO] == [1]
        for resource in ("resourceslices", "deviceclasses", "namespaces", "devicequotas", "resourceclaims"):
            assert first[(WATCH_SYNCED, labels(resource=resource))] == 1
        not_after = inspect(served.cluster.webhook_cert[0].read_bytes()).not_after
        assert first[(CERTIFICATE_EXPIRATION, labels(certificate="serving"))] == not_after.timestamp()

        # -- a quota denial, twice: one Event whose series counts both ------------------------
        await make_quota(kube, setup, "gpus", "80Gi")  # its dry-run probes come before the baseline
        before = await served.metrics()
        await kube.create(RESOURCE_V1, "resourceclaims", claim_body(setup, "c1"), namespace=ns)
        await annotated(kube, ns, "c1")
        for _ in range(2):
            assert 'exceeded DeviceQuota "gpus"' in await denial(
                kube.create(RESOURCE_V1, "resourceclaims", claim_body(setup, "c2"), namespace=ns))
        after = await served.metrics()
        # One review a create, the mutating one; no UPDATE review: the charge came with the
        # create, the leader patched nothing (its patch would be reviewed here, as the test's
        # serve runs as the cluster admin).
        assert moved(before, after, ADMISSION_REQUESTS) == {
            requests("CREATE", "resourceclaims", "allowed", "none", "admitting", namespace=ns): 1,
            requests("CREATE", "resourceclaims", "denied", "quota", "admitting", namespace=ns): 2,
        }
        assert moved(before, after, ADMIN_ACCESS_DECISIONS) == {}

        def quota_denial(e: Obj) -> bool:
            return (e["reason"] == "QuotaExceeded" and e["regarding"]["kind"] == "DeviceQuota"
                    and e["regarding"]["name"] == "gpus" and (e.get("series") or {}).get("count") == 2)

        event = await events(kube, ns, quota_denial, "a QuotaExceeded Event counting 2 on DeviceQuota gpus")
        assert event["note"] == advised(f'ResourceClaim {ns}/c2: exceeded DeviceQuota "gpus": requested '
                                        "memory=80Gi, used memory=0, reserved memory=80Gi, limited memory=80Gi",
                                        "reserved", namespace=ns)
        assert (event["type"], event["reportingController"], event["related"]["name"]) == (
            "Warning", "draquota.io/dra-quota", "c2")
        assert event["reportingInstance"]

        # -- the namespace label: refused to mallory, granted to the allowlisted user --------
        # mallory may patch the Namespace, not label adminaccess.draquota.io (which
        # system:masters, as cluster-admin, may: RBAC decides beside the allowlist).
        ns_path = resource_path("v1", "namespaces", ns)
        patcher = f"e2e-ns-patcher-{RUN}"
        await kube.create(RBAC, "clusterroles", {"kind": "ClusterRole", "metadata": {"name": patcher}, "rules": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "patch"]}]})
        await kube.create(RBAC, "clusterrolebindings", {
            "kind": "ClusterRoleBinding", "metadata": {"name": patcher},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": patcher},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": mallory}]})
        label = {"metadata": {"labels": {ADMIN_LABEL: "true"}}}

        async def refused_by_us() -> ApiError | None:  # until the binding loads, RBAC refuses first
            try:
                await impersonated(kube, "PATCH", ns_path, user=mallory, body=label,
                                   content_type="application/merge-patch+json")
            except ApiError as err:
                return err if f"{mallory} may not add label" in err.message else None
            raise AssertionError(f"{mallory} labelled {ns}")

        try:
            before = await served.metrics()
            refused = await poll(refused_by_us, timeout=30, what="the ClusterRoleBinding to apply")
        finally:
            await kube.delete(RBAC, "clusterrolebindings", patcher)
            await kube.delete(RBAC, "clusterroles", patcher)
        assert refused.status == 403
        await as_user(ops, "PATCH", ns_path, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
        after = await served.metrics()
        assert moved(before, after, ADMISSION_REQUESTS) == {
            requests("UPDATE", "namespaces", "denied", "admin_access", namespace=ns): 1,
            requests("UPDATE", "namespaces", "allowed", "none", namespace=ns): 1,
        }
        assert moved(before, after, ADMIN_ACCESS_DECISIONS) == {
            labels(outcome="refused", action="namespace_label"): 1,
            labels(outcome="granted", action="namespace_label"): 1,
        }
        for reason, user in (("AdminAccessRefused", mallory), ("AdminAccessGranted", ops)):
            def on_namespace(e: Obj, r: str = reason, u: str = user) -> bool:
                return bool(e["reason"] == r and e["regarding"] == {"apiVersion": "v1", "kind": "Namespace", "name": ns}
                            and e["note"].startswith(f"{r.removeprefix('AdminAccess').lower()}: {u} may"))
            event = await events(kube, "default", on_namespace, f"{reason} on {ns}")
            assert event["type"] == ("Warning" if reason == "AdminAccessRefused" else "Normal")

        # -- adminAccess claims: the same two outcomes ---------------------------------------
        claims_path = resource_path(RESOURCE_V1, "resourceclaims", namespace=ns)

        async def label_seen() -> bool:
            # The API server's own label check and serve's namespace cache both follow a
            # watch: a dry run (no Event, no adminAccess metric) says when both see it.
            try:
                await as_user(ops, "POST", claims_path, admin_claim("probe", setup), dryRun="All")
            except ApiError:
                return False
            return True

        await poll(label_seen, timeout=30, what="the admin-access label to be seen")
        before = await served.metrics()
        with pytest.raises(ApiError) as refused:
            await as_user(mallory, "POST", claims_path, admin_claim("a1", setup))
        assert refused.value.status == 403 and f"{mallory} may not create ResourceClaim {ns}/a1" in refused.value.message
        await as_user(ops, "POST", claims_path, admin_claim("a2", setup))
        await annotated(kube, ns, "a2")
        after = await served.metrics()
        assert moved(before, after, ADMISSION_REQUESTS) == {
            requests("CREATE", "resourceclaims", "denied", "admin_access", "admitting", namespace=ns): 1,
            requests("CREATE", "resourceclaims", "allowed", "none", "admitting", namespace=ns): 1,
        }
        assert moved(before, after, ADMIN_ACCESS_DECISIONS) == {
            labels(outcome="refused", action="claim"): 1,
            labels(outcome="granted", action="claim"): 1,
        }
        for reason, claim in (("AdminAccessRefused", "a1"), ("AdminAccessGranted", "a2")):
            # In the claim's namespace, regarding the claim: never in `default` for a claim.
            def on_claim(e: Obj, r: str = reason, c: str = claim) -> bool:
                return bool(e["reason"] == r and e["regarding"]["kind"] == "ResourceClaim"
                            and e["regarding"]["name"] == c and e.get("related") == {
                                "apiVersion": "v1", "kind": "Namespace", "name": ns})
            await events(kube, ns, on_claim, f"{reason} for claim {claim}")
        # dry runs made no Event: the probe's grants are nowhere
        for where in (ns, "default"):
            assert not [e for e in await kube.list(EVENTS, "events", namespace=where)
                        if "probe" in (e["regarding"]["name"], (e.get("related") or {}).get("name"))]
        assert after[(EVENTS_DROPPED, labels(reason="queue_full"))] == 0
        assert after[(EVENTS_DROPPED, labels(reason="write_failed"))] == 0


async def test_an_admission_over_an_audit_quota_is_warned_and_recorded(kube: Kube, setup: Setup,
                                                                      make_namespace: MakeNamespace) -> None:
    served = setup.served
    ns = await make_namespace("audit", labels={RUN_LABEL: setup.run})
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "watch"},
                                           "spec": {"hard": {"memory": "1Gi"}, "enforcement": "Audit"}}, namespace=ns)
    warned = requests("CREATE", "resourceclaims", "warned", "quota", "admitting", namespace=ns)
    with served.log_on_failure():
        async def audited() -> bool:
            # The process has the quota once a dry run counts as warned (dry runs make no Event).
            before = await served.metrics()
            await kube.create(RESOURCE_V1, "resourceclaims", claim_body(setup, "probe"), namespace=ns, dry_run=True)
            return moved(before, await served.metrics(), ADMISSION_REQUESTS).get(warned) == 1

        await poll(audited, timeout=30, what="the Audit DeviceQuota to be seen")
        before = await served.metrics()
        await kube.create(RESOURCE_V1, "resourceclaims", claim_body(setup, "w1"), namespace=ns)
        await annotated(kube, ns, "w1")
        after = await served.metrics()
        assert moved(before, after, ADMISSION_REQUESTS) == {warned: 1}  # and no UPDATE: the leader wrote nothing
        event = await events(kube, ns, lambda e: e["reason"] == "QuotaExceeded" and e["regarding"]["name"] == "watch",
                             "QuotaExceeded on the Audit quota")
        assert event["note"] == (f'ResourceClaim {ns}/w1: exceeded DeviceQuota "watch": requested memory=80Gi, '
                                 "used memory=0, reserved memory=0, limited memory=1Gi (enforcement: Audit, admitted)")
        assert not [e for e in await kube.list(EVENTS, "events", namespace=ns)
                    if e.get("related", {}).get("name") == "probe"]


async def test_the_shipped_rbac_allows_events_and_nothing_more(kube: Kube, namespace: str) -> None:
    """deploy/manifests/rbac-events.yaml, bound to a per-test service account: the recorder's
    own create and series patch go through as that account, a list or a delete does not."""
    account = f"e2e-events-{RUN}"
    user = f"system:serviceaccount:dra-quota-system:{account}"
    groups = ["system:serviceaccounts", "system:serviceaccounts:dra-quota-system", "system:authenticated"]

    def as_account(method: str, path: str, body: Obj | None = None) -> Awaitable[Any]:
        return impersonated(kube, method, path, user=user, groups=groups, body=body,
                            content_type="application/merge-patch+json" if method == "PATCH" else "application/json")

    class AccountSink:
        async def create(self, ns: str, body: Obj) -> Obj:
            created: Obj = await as_account("POST", resource_path(EVENTS, "events", namespace=ns), body)
            return created

        async def patch(self, ns: str, name: str, patch: Obj) -> Obj:
            patched: Obj = await as_account("PATCH", resource_path(EVENTS, "events", name, ns), patch)
            return patched

    dropped: list[str] = []
    # Every try written at once (no refresh, no budget): what is tested is the RBAC on each write.
    unlimited = Rate(10**6, 10**6)
    recorder = EventRecorder(AccountSink(), instance="e2e", dropped=dropped.append, refresh=0.0,
                             budget=Budget(per_object=unlimited, per_namespace=unlimited, overall=unlimited))
    key = EventKey(Ref("draquota.io/v1alpha1", "DeviceQuota", "gpus", namespace), None, "Warning", "QuotaExceeded",
                   "Admit", f"ResourceClaim {namespace}/c: exceeded")
    recorder.record(key)
    assert await recorder.write_ready()
    assert dropped == ["write_failed"]  # not bound yet: the grant below is what allows it

    role, binding = copy.deepcopy(SHIPPED_RBAC)
    name = f"dra-quota-events-{RUN}"
    role["metadata"]["name"] = binding["metadata"]["name"] = binding["roleRef"]["name"] = name
    binding["subjects"][0]["name"] = account
    await kube.create(RBAC, "clusterroles", role)
    await kube.create(RBAC, "clusterrolebindings", binding)
    try:
        async def allowed() -> bool:  # the authorizer follows RBAC objects through a watch
            recorder.record(key)
            before = len(dropped)
            assert await recorder.write_ready()
            return len(dropped) == before

        await poll(allowed, timeout=30, what="the ClusterRoleBinding to apply")
        # Tries before the authorizer saw the binding failed too (each one a drop).
        assert set(dropped) == {"write_failed"}
        refused = len(dropped)
        recorder.record(key)  # a repeat: the series patch
        assert await recorder.write_ready()
        assert len(dropped) == refused
        [event] = [e for e in await kube.list(EVENTS, "events", namespace=namespace) if e["note"] == key.note]
        assert event["series"]["count"] >= 3 and event["reportingController"] == "draquota.io/dra-quota"
        for method, path in (("GET", resource_path(EVENTS, "events", namespace=namespace)),
                             ("DELETE", resource_path(EVENTS, "events", event["metadata"]["name"], namespace))):
            with pytest.raises(ApiError) as err:
                await as_account(method, path)
            assert err.value.status == 403, (method, err.value)
    finally:
        await kube.delete(RBAC, "clusterrolebindings", name)
        await kube.delete(RBAC, "clusterroles", name)
