"""The adminAccess allowlist on the real 1.37 API server: reloaded from its ConfigMap
without a restart, read with the shipped least-privilege Role, and every grant and
refusal in the audit log.

`dra-quota serve --admin-access-configmap NS/NAME` runs as tests/e2e/harness.py runs it
(`Served`, the shipped webhook configurations adapted to this test's namespaces). Requests come
from impersonated users (`impersonated`), so the webhook judges them, not the admin.
The ConfigMap is the shipped one (deploy/manifests/admin-access-policy.yaml) with a
unique name in a test namespace. The test control plane audits claim and namespace
writes at Metadata level (tests/e2e/cluster.py AUDIT_POLICY).
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from kube.api import KubeApi
from kube.resources import CONFIGMAPS
from quota.admission.policy import AUDIT_KEY
from webhook.adminpolicy import PolicySource

from .cluster import ControlPlane, audit_event, free_ports
from .driver import RESOURCE_V1, claim_spec, exact_request
from .harness import (
    ADMIN_LABEL, ADMISSION, PLURALS, POLICY_DOCS, QUOTA_HOOK_OPEN, RUN_LABEL, MakeFleet, MakeNamespace, Served,
    adapted_webhooks,
)
from .kube import ApiError, Kube, Obj, poll, resource_path
from .webhook_recorder import impersonated

pytestmark = pytest.mark.e2e

NAMESPACE_HOOK = "admin-access.namespaces.draquota.io"
RBAC = "rbac.authorization.k8s.io/v1"
NOT_ALLOWLISTED = "not on dra-quota's adminAccess allowlist"


def shipped(kind: str) -> Obj:
    (found,) = [d for d in POLICY_DOCS if d["kind"] == kind]
    return copy.deepcopy(found)


@dataclass
class Allowlist:
    run: str
    served: Served
    kube: Kube
    params_ns: str  # where the ConfigMap lives
    configmap: str
    target: str  # a namespace our webhooks see
    device_class: str
    alice: str
    mallory: str

    async def set(self, data: dict[str, str]) -> Obj:
        """Replace the ConfigMap's data (creating it if it is gone)."""
        existing = await self.kube.get_or_none("v1", "configmaps", self.configmap, namespace=self.params_ns)
        if existing is None:
            body = shipped("ConfigMap")
            body["metadata"].update(name=self.configmap, namespace=self.params_ns)
            body["data"] = data
            return await self.kube.create("v1", "configmaps", body, namespace=self.params_ns)
        existing["data"] = data
        return await self.kube.replace("v1", "configmaps", existing, namespace=self.params_ns)

    async def label(self, user: str, value: str | None, *, dry_run: bool = True) -> str:
        """Add (or remove) the admin-access label on `target` as `user`: "" when allowed, else the denial."""
        try:
            await impersonated(self.kube, "PATCH", resource_path("v1", "namespaces", self.target), user=user,
                               body={"metadata": {"labels": {ADMIN_LABEL: value}}},
                               params={"dryRun": "All"} if dry_run else None)
        except ApiError as err:
            if err.status == 403:
                return err.message
            raise
        return ""

    async def claim(self, user: str, name: str) -> str:
        """Create an adminAccess claim in `target` as `user`: "" when allowed, else the denial."""
        body = {"apiVersion": RESOURCE_V1, "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": claim_spec(exact_request("gpu", self.device_class, admin_access=True))}
        try:
            await impersonated(self.kube, "POST", resource_path(RESOURCE_V1, "resourceclaims", namespace=self.target),
                               user=user, body=body, content_type="application/json")
        except ApiError as err:
            if err.status == 403:
                return err.message
            raise
        return ""


@pytest_asyncio.fixture(loop_scope="session")
async def allowlist(cluster: ControlPlane, kube: Kube, crd: None, tmp_path: Path, make_namespace: MakeNamespace,
                    make_fleet: MakeFleet) -> AsyncIterator[Allowlist]:
    """alice allowlisted in a ConfigMap; serve watching it; RBAC for alice and mallory to try."""
    run = uuid.uuid4().hex[:8]
    params_ns = await make_namespace("admparams")
    target = await make_namespace("admserve", labels={RUN_LABEL: run})
    fleet = await make_fleet("adm")
    alice, mallory = f"e2e-alice-{run}", f"e2e-mallory-{run}"
    role = f"e2e-admin-access-{run}"
    cluster_scoped: list[tuple[str, str, str]] = []

    async def create(api_version: str, plural: str, body: Obj) -> None:
        await kube.create(api_version, plural, body)
        cluster_scoped.append((api_version, plural, body["metadata"]["name"]))

    served = Served(cluster, free_ports(1)[0], tmp_path / "serve.log", args=("--admin-access-configmap", f"{params_ns}/allow-{run}"))
    handle = Allowlist(run, served, kube, params_ns, f"allow-{run}", target, fleet.device_class, alice, mallory)
    try:
        # RBAC lets both try: the allowlist, not RBAC, is what decides.
        await create(RBAC, "clusterroles", {"kind": "ClusterRole", "metadata": {"name": role}, "rules": [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "patch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["create"]}]})
        await create(RBAC, "clusterrolebindings", {
            "kind": "ClusterRoleBinding", "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in (alice, mallory)]})
        await handle.set({"users": alice, "groups": "", "serviceAccounts": ""})
        with served.log_on_failure():
            await served.start()
        for config in adapted_webhooks(run, served.port, cluster):
            await create(ADMISSION, PLURALS[config["kind"]], config)
        with served.log_on_failure():
            # The configurations take a moment to be observed by the API server.
            await poll(lambda: refused(handle.label(mallory, "true")), timeout=30, what="our webhook to judge the label")
        yield handle
    finally:
        for api_version, plural, name in reversed(cluster_scoped):
            await kube.delete(api_version, plural, name)
        await served.kill()


async def refused(call: Awaitable[str]) -> bool:
    return NOT_ALLOWLISTED in await call


async def allowed(call: Awaitable[str]) -> bool:
    return await call == ""


async def test_the_allowlist_follows_its_configmap_without_a_restart(allowlist: Allowlist) -> None:
    a = allowlist
    assert a.served.process is not None
    pid = a.served.process.pid
    with a.served.log_on_failure():
        message = await a.label(a.mallory, "true")
        assert message == (f'admission webhook "{NAMESPACE_HOOK}" denied the request: {a.mallory} may not add label '
                           f"{ADMIN_LABEL}='true' to Namespace {a.target}: {NOT_ALLOWLISTED}, and RBAC does not allow "
                           "it to label adminaccess.draquota.io")
        assert await a.label(a.alice, "true") == ""

        # mallory in, alice out: the next reviews follow the edit.
        edited = time.monotonic()
        await a.set({"users": a.mallory})
        await poll(lambda: allowed(a.label(a.mallory, "true")), timeout=30, what="mallory to be allowlisted")
        reload_seconds = time.monotonic() - edited
        assert await refused(a.label(a.alice, "true"))

        # A version that does not parse is ignored, with a warning naming it: the last
        # good policy stays (mallory in, alice out), neither opened nor emptied.
        bad = await a.set({"users": a.alice, "admins": a.alice})
        warning = (f"adminAccess policy not reloaded: ConfigMap {a.params_ns}/{a.configmap} "
                   f"(resourceVersion {bad['metadata']['resourceVersion']}): adminAccess policy: unknown field 'admins'")

        async def warned() -> bool:
            return warning in a.served.log_text()

        await poll(warned, timeout=30, what="the warning about the invalid ConfigMap")
        assert await allowed(a.label(a.mallory, "true"))
        assert await refused(a.label(a.alice, "true"))

        # Deleted: nobody (fail closed), until it is back.
        await a.kube.delete("v1", "configmaps", a.configmap, namespace=a.params_ns)
        await poll(lambda: refused(a.label(a.mallory, "true")), timeout=30, what="mallory refused once the ConfigMap is gone")
        assert await refused(a.label(a.alice, "true"))
        assert f"ConfigMap {a.params_ns}/{a.configmap} (deleted): nobody may use or grant adminAccess" in a.served.log_text()
        await a.set({"users": f"someone-else, {a.alice}"})
        await poll(lambda: allowed(a.label(a.alice, "true")), timeout=30, what="alice allowlisted again")
        assert await refused(a.label(a.mallory, "true"))

        # The same process throughout.
        assert a.served.process.pid == pid and a.served.exited() is None
        assert "Traceback" not in a.served.log_text()
    print(f"allowlist edit to effect (polled, shared 2-core machine): {reload_seconds:.2f}s")


async def test_grants_and_refusals_are_in_the_audit_log(cluster: ControlPlane, allowlist: Allowlist) -> None:
    a = allowlist
    # No DeviceQuota governs the namespace: the quota webhook's fail-open copy answers.
    key_ns, key_claim = f"{NAMESPACE_HOOK}/{AUDIT_KEY}", f"{QUOTA_HOOK_OPEN}/{AUDIT_KEY}"
    with a.served.log_on_failure():
        # The namespace label: alice adds it (granted), mallory tries to remove it (refused).
        assert await a.label(a.alice, "true", dry_run=False) == ""
        assert await refused(a.label(a.mallory, None, dry_run=False))

        # adminAccess claims in the now-labelled namespace (the API server's own rule),
        # once our namespace cache has seen the label (our label rule).
        async def alice_may() -> bool:
            message = await a.claim(a.alice, "granted")
            assert NOT_ALLOWLISTED not in message, message
            return message == ""

        await poll(alice_may, timeout=30, what="alice's adminAccess claim to be admitted")
        assert await refused(a.claim(a.mallory, "refused"))

        expected = [
            ("namespaces", a.target, a.alice, key_ns, 200,
             f"granted: {a.alice} may add label {ADMIN_LABEL}='true' to Namespace {a.target} (allowlisted user {a.alice})"),
            ("namespaces", a.target, a.mallory, key_ns, 403,
             f"refused: {a.mallory} may not remove label {ADMIN_LABEL} from Namespace {a.target} "
             "(not on the adminAccess allowlist)"),
            ("resourceclaims", "granted", a.alice, key_claim, 201,
             f"granted: {a.alice} may create ResourceClaim {a.target}/granted with adminAccess (allowlisted user {a.alice})"),
            ("resourceclaims", "refused", a.mallory, key_claim, 403,
             f"refused: {a.mallory} may not create ResourceClaim {a.target}/refused with adminAccess "
             "(not on the adminAccess allowlist)"),
        ]
        for resource, name, user, key, code, value in expected:
            async def logged() -> Obj | None:
                return audit_event(cluster.audit_events(), resource=resource, name=name, user=user, annotation=key)

            event = await poll(logged, timeout=30, what=f"the audit event of {user}'s {resource} {name}")
            assert event["level"] == "Metadata" and event["stage"] == "ResponseComplete", event
            assert event["responseStatus"]["code"] == code, event
            assert event["annotations"][key] == value, event["annotations"]


async def test_the_shipped_role_reads_the_allowlist_and_no_other_configmap(
    cluster: ControlPlane, kube: Kube, make_namespace: MakeNamespace, tmp_path: Path
) -> None:
    """The webhook's own Reflector, as a ServiceAccount bound to the shipped Role only."""
    ns = await make_namespace("admrbac")
    name = shipped("ConfigMap")["metadata"]["name"]
    configmap = shipped("ConfigMap")
    configmap["metadata"]["namespace"] = ns
    configmap["data"] = {"groups": "platform-admins"}
    await kube.create("v1", "configmaps", configmap, namespace=ns)
    await kube.create("v1", "configmaps", {"kind": "ConfigMap", "metadata": {"name": "other"}, "data": {"x": "y"}},
                      namespace=ns)
    role, binding = shipped("Role"), shipped("RoleBinding")
    (subject,) = binding["subjects"]
    for obj in (role, binding):
        obj["metadata"]["namespace"] = ns
    subject["namespace"] = ns
    await kube.create("v1", "serviceaccounts", {"kind": "ServiceAccount", "metadata": {"name": subject["name"]}},
                      namespace=ns)
    await kube.create(RBAC, "roles", role, namespace=ns)
    await kube.create(RBAC, "rolebindings", binding, namespace=ns)
    token = await kube.request("POST", resource_path("v1", "serviceaccounts", subject["name"], ns, "token"),
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": 600}})
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": "sa", "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    }))
    source = PolicySource.from_configmap(ns, name)
    async with await KubeApi.from_kubeconfig(str(kubeconfig)) as api:
        # RBAC takes a moment to be observed; a plain list of the namespace stays forbidden.
        async def listed() -> bool:
            try:
                await api.list(CONFIGMAPS, namespace=ns, field_selector=f"metadata.name={name}")
            except ApiError as err:
                assert err.status == 403, err
                return False
            return True

        await poll(listed, timeout=30, what="the Role to be observed")
        for selector in (None, "metadata.name=other"):
            with pytest.raises(ApiError) as err:
                await api.list(CONFIGMAPS, namespace=ns, field_selector=selector)
            assert err.value.status == 403
        (reflector,) = source.reflectors(api)

        async def groups(*expected: str) -> bool:
            return source.policy().groups == frozenset(expected)

        task = asyncio.create_task(reflector.run())
        try:
            await poll(lambda: groups("platform-admins"), timeout=30, what="the policy from the ConfigMap")
            configmap = await kube.get("v1", "configmaps", name, namespace=ns)
            configmap["data"] = {"groups": "platform-admins, sre"}
            await kube.replace("v1", "configmaps", configmap, namespace=ns)
            await poll(lambda: groups("platform-admins", "sre"), timeout=30, what="the watched edit")
            assert reflector.stats.restarts == 0  # the watch was allowed, not retried
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
