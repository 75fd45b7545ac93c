"""The chart's manifests on the real 1.37 API server, and `serve` running with its RBAC.

deploy/manifests/dra-quota.yaml (the chart rendered with defaults; tests/unit/test_chart.py
proves it is) is applied with server-side apply, as `kubectl apply --server-side` would,
into dra-quota-system. There is no kubelet, so the Deployment cannot run: it is applied
with dryRun=All (validated, defaulted and admitted, not stored: stored, its ReplicaSet's
Pods would be bound to other tests' fake nodes, and bound Pods never finish
terminating without a kubelet), its Pod template is created (dry run) in a namespace
enforcing the "restricted" Pod Security Standard, and `dra-quota serve` runs as a local
process with the Deployment's own arguments. Only what must be local is replaced: the
listen addresses and ports (127.0.0.1, free ports) and the credentials: a kubeconfig
holding a TokenRequest token of the chart's ServiceAccount (kubernetes-asyncio's kubeconfig loader does not do
`as:` impersonation), so every API call serve makes is authorized by the chart's RBAC
and nothing else.

The webhook configurations keep their names (serve patches their caBundle through the
resourceNames the ClusterRole grants) and their rules; for the shared cluster they get
the per-test namespace label requirement and the Service port the loopback resolver
dials (tests/e2e/webhook_recorder.py adapted_webhooks). Proof that the RBAC is enough:
serve becomes ready (every cache listed and watched), the API server trusts the
certificate serve minted into its Secret (claims come back with the mutating webhook's
annotation), a claim beyond the quota is denied with the quota's message after the
first one's reservation was persisted on the DeviceQuota status. Proof that it is no
more than that: calls the chart does not grant are refused (403) with the same token.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from kube.api import KubeApi, Resource

from ..tools.chart import NAMESPACE, find, render
from ..tools.monitoring_crds import monitoring_crds
from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu
from .harness import (
    ADMISSION, DQ, PLURALS, RUN_LABEL, MakeFleet, MakeNamespace, Served, Setup, create, denial, exceeded,
    make_quota,
)
from .kube import ApiError, Kube, Obj, poll
from .shipped import ACCOUNT, DEPLOYMENT, OBJECTS, SECRET, apply, ensure_namespace, resource, token_kubeconfig
from .webhook_recorder import adapted_webhooks

pytestmark = pytest.mark.e2e

CHARGE = "draquota.io/charge"
ADMISSION_TOKEN = "draquota.io/admission"
# The chart's monitoring switches, all on (off by default: the shipped manifest has none of them).
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                          "dashboard": {"enabled": True, "folder": "GPU"}}}


def local_args(args: list[str], *, port: int, metrics_port: int) -> tuple[str, ...]:
    """The Deployment's arguments with the ports made local (Served listens on 127.0.0.1)."""
    assert args[0] == "serve"
    out = []
    for arg in args[1:]:
        flag, _, _value = arg.partition("=")
        if flag == "--port":
            arg = f"--port={port}"
        elif flag == "--metrics-port":
            arg = f"--metrics-port={metrics_port}"
        out.append(arg)
    return tuple(out)


@dataclass
class Installed:
    run: str
    served: Served
    token_api: KubeApi  # the chart's ServiceAccount
    applied: list[Obj] = field(default_factory=list)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def installed(cluster: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory,
                    ) -> AsyncIterator[Installed]:
    """The manifest applied, then serve started as the chart's ServiceAccount; all removed after the module."""
    tmp_path = tmp_path_factory.mktemp("chart")
    run = uuid.uuid4().hex[:8]
    port, metrics_port = free_ports(2)
    await ensure_namespace(kube, NAMESPACE)
    applied: list[Obj] = []
    served: Served | None = None
    token_api: KubeApi | None = None
    try:
        for obj in OBJECTS:
            if obj["kind"] == "Deployment":
                continue  # dry run only (module docstring): test_the_deployment_and_its_pods_are_admitted
            if obj["kind"] in PLURALS:
                (obj,) = adapted_webhooks(run, port, cluster, label=RUN_LABEL, name_suffix="", test_ca=False,
                                          selector="namespaceSelector", shipped=[obj])
            await apply(kube, obj)
            applied.append(obj)
        if any(o["kind"] == "CustomResourceDefinition" for o in applied):
            await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                          "devicequotas.draquota.io", "Established", timeout=60)
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": 3600}}
        answer = await kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
                                    body=request)
        kubeconfig = token_kubeconfig(cluster, answer["status"]["token"], tmp_path / "chart.kubeconfig")
        token_api = await KubeApi.from_kubeconfig(str(kubeconfig))
        pod = DEPLOYMENT["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: {"metadata.name": f"dra-quota-{run}", "metadata.namespace": NAMESPACE}[
            e["valueFrom"]["fieldRef"]["fieldPath"]] if "valueFrom" in e else e["value"] for e in container["env"]}
        served = Served(cluster, port, tmp_path / "serve.log", self_managed=True, kubeconfig=kubeconfig, env=env,
                        metrics_port=metrics_port,
                        args=local_args(container["args"], port=port, metrics_port=metrics_port))
        with served.log_on_failure():
            await served.start()
        yield Installed(run, served, token_api, applied)
    finally:
        # Admission objects first: webhook configurations left pointing at a stopped server
        # would refuse every later claim create of this run's namespaces, and the label
        # policy left without its ConfigMap would refuse every labelled namespace.
        for obj in sorted(applied, key=lambda o: o["kind"] not in ADMISSION_KINDS):
            if obj["kind"] == "CustomResourceDefinition":
                continue  # shared with the other e2e modules
            meta = obj["metadata"]
            with contextlib.suppress(ApiError):
                await kube.api.delete(resource(obj), meta["name"], namespace=meta.get("namespace"))
        if any(o["kind"] == "ValidatingAdmissionPolicyBinding" for o in applied):
            await policy_gone(kube)
        if served is not None:
            await served.kill()
        if token_api is not None:
            await token_api.close()
        with contextlib.suppress(ApiError):
            await kube.delete("v1", "secrets", SECRET, namespace=NAMESPACE)


ADMISSION_KINDS = {*PLURALS, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


async def policy_gone(kube: Kube) -> None:
    """Wait until the API server's admission no longer applies the deleted label policy
    (its informer drops it asynchronously): a labelled namespace passes a dry-run create."""

    async def admitted() -> bool:
        body = {"kind": "Namespace", "metadata": {"name": f"probe-{uuid.uuid4().hex[:8]}",
                                                  "labels": {"resource.kubernetes.io/admin-access": "true"}}}
        try:
            await kube.create("v1", "namespaces", body, dry_run=True)
        except ApiError as err:
            if "dra-quota-admin-access-label" in err.message:
                return False
            raise
        return True

    await poll(admitted, timeout=30, what="the deleted label policy to stop applying")


# -- tests --------------------------------------------------------------------------------------


async def test_serve_with_the_charts_rbac_admits_and_denies(
    kube: Kube, cluster: ControlPlane, installed: Installed, make_namespace: MakeNamespace, make_fleet: MakeFleet,
) -> None:
    served = installed.served
    with served.log_on_failure():
        # The certificate serve made with the chart's rights: stored in the Secret the Role
        # names, and its CA in every webhook of both configurations.
        secret = await kube.get("v1", "secrets", SECRET, namespace=NAMESPACE)
        ca = base64.b64decode(secret["data"]["ca.crt"])
        # Every configuration the manifest ships, each with its webhooks: a check over none
        # would pass whatever serve did.
        configurations = [obj for obj in installed.applied if obj["kind"] in PLURALS]
        assert len(configurations) == sum(o["kind"] in PLURALS for o in OBJECTS) >= 1, configurations

        def bundles(configuration: Obj) -> list[str | None]:
            return [h["clientConfig"].get("caBundle") for h in configuration["webhooks"]]

        def hold_the_ca(found: list[str | None]) -> bool:
            return bool(found) and all(b and ca in base64.b64decode(b) for b in found)

        for obj in configurations:
            live = bundles(await kube.get(ADMISSION, PLURALS[obj["kind"]], obj["metadata"]["name"]))
            assert hold_the_ca(live), (obj["metadata"]["name"], live)

        # An upgrade (the same apply again, as `helm upgrade` or `kubectl apply
        # --server-side` would send it) keeps the caBundle serve set: the manifest leaves
        # the field to its manager.
        for obj in configurations:
            again = bundles(await apply(kube, obj))
            assert hold_the_ca(again), (obj["metadata"]["name"], again)

        fleet = await make_fleet("chart")
        await fleet.add_node("n1", [Gpu()] * 2)
        namespace = await make_namespace("chart", labels={RUN_LABEL: installed.run})
        setup = Setup(installed.run, namespace, fleet, served, [])
        await make_quota(kube, setup, "one-gpu", "80Gi")

        first = await create(kube, setup, "first")
        # The create itself carries the charge and the admission's token: the mutating
        # configuration called serve (its caBundle is serve's too). The leader labelled the
        # namespace governed (patch namespaces, allowed by the chart's label policy).
        assert {CHARGE, ADMISSION_TOKEN} <= set(first["metadata"].get("annotations") or {}), first["metadata"]
        message = await denial(create(kube, setup, "second"))
        assert message == exceeded("one-gpu", used="0", reserved="80Gi", limited="80Gi",
                                   namespace=setup.namespace, case="reserved"), message

        async def counted() -> bool:
            quota = await kube.get(DQ, "devicequotas", "one-gpu", namespace=namespace)
            return bool((quota.get("status") or {}).get("reserved") == {"memory": "80Gi", "devices": 1})

        await poll(counted, timeout=30, what="the leader to count the claim in status.reserved")
        # A team quota over this namespace: the leader copies its numbers into the namespace
        # (list, then server-side apply, which creates: appliedclusterdevicequotas).
        team = f"chart-team-{installed.run}"
        await kube.create(DQ, "clusterdevicequotas", {
            "kind": "ClusterDeviceQuota", "metadata": {"name": team},
            "spec": {"hard": {"memory": "160Gi"},
                     "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}})
        try:
            async def copied() -> bool:
                found = await kube.get_or_none(DQ, "appliedclusterdevicequotas", team, namespace=namespace)
                return bool(found and (found.get("status") or {}).get("reserved") == {"memory": "80Gi", "devices": 1})

            await poll(copied, timeout=30, what="the leader to copy the team quota into its namespace")
        finally:
            await kube.delete(DQ, "clusterdevicequotas", team)
        # The claim watch's deletion frees the reservation: the same claim now fits.
        await kube.delete(RESOURCE_V1, "resourceclaims", "first", namespace=namespace)

        async def admitted() -> bool:
            return await denial(create(kube, setup, "second", dry_run=True)) == ""

        await poll(admitted, timeout=30, what="the released reservation to make room")
        # The metrics port the chart's Service and ServiceMonitor name answers.
        assert any(name.startswith("draquota_") for name, _ in await served.metrics())

        # The denial was recorded as an Event (events.k8s.io create, the events ClusterRole).
        async def recorded() -> bool:
            events = await kube.list("events.k8s.io/v1", "events", namespace=namespace)
            return any(e.get("reason") == "QuotaExceeded" for e in events)

        await poll(recorded, timeout=30, what="the QuotaExceeded Event")
        # Nothing serve did was refused by the API server (Events, requeue, certificates).
        assert "HTTP 403" not in served.log_text()


@pytest.mark.parametrize("method,path,why", [
    ("GET", "/api/v1/secrets", "no Secrets across namespaces"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", "no listing of Secrets, even in its namespace"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/someone-elses", "only its own Secret by name"),
    ("GET", "/api/v1/namespaces/kube-system/secrets/x", "no Secrets in other namespaces"),
    ("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", "no creates of claims"),
    ("PUT", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/x", "claims are only patched (allocation record)"),
    ("PATCH", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/x/status", "never a claim's status"),
    ("PUT", "/apis/draquota.io/v1alpha1/namespaces/default/devicequotas/q", "no writes on DeviceQuota spec"),
    ("PATCH", f"/apis/{ADMISSION}/validatingwebhookconfigurations/someone-elses", "only its own configurations"),
    ("PATCH", "/api/v1/namespaces/default/pods/x", "Pods are read (requeue, Kueue matching), never written"),
    ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads/x", "only our entry on Workload status"),
    ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/admissionchecks/x", "only Active on AdmissionCheck status"),
    ("GET", "/api/v1/configmaps", "no ConfigMaps across namespaces"),
    ("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps", "only its allowlist ConfigMap, by name"),
    ("GET", f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events", "Events are written, never read"),
])
async def test_what_the_chart_does_not_grant_is_forbidden(installed: Installed, method: str, path: str,
                                                          why: str) -> None:
    body = None if method == "GET" else {"metadata": {"name": "x"}}
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    with pytest.raises(ApiError) as refused:
        await installed.token_api.request(method, path, body=body, content_type=content_type)
    assert refused.value.status == 403, (why, refused.value)
    assert f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}" in refused.value.message


async def test_what_the_chart_grants_is_allowed(installed: Installed) -> None:
    """The control for the test above: the same token reaches what the Role and ClusterRole name."""
    api = installed.token_api
    secret = await api.get(Resource("v1", "secrets"), SECRET, namespace=NAMESPACE)
    assert secret["metadata"]["name"] == SECRET
    for plural in ("resourceslices", "deviceclasses", "resourceclaims"):
        await api.list(Resource(RESOURCE_V1, plural))
    await api.list(Resource(DQ, "devicequotas"))
    allowlist = await api.list(Resource("v1", "configmaps"), namespace=NAMESPACE,
                               field_selector="metadata.name=dra-quota-admin-access")
    assert [c["metadata"]["name"] for c in allowlist.items] == ["dra-quota-admin-access"]
    # The metrics' readers are asked about (webhook/metricsserver.py): both reviews may be created.
    review = await api.create(Resource("authentication.k8s.io/v1", "tokenreviews"),
                              {"kind": "TokenReview", "spec": {"token": "not-a-token"}})
    assert review["status"].get("authenticated") is not True
    access = await api.create(Resource("authorization.k8s.io/v1", "subjectaccessreviews"),
                              {"kind": "SubjectAccessReview", "spec": {"user": "nobody", "nonResourceAttributes": {
                                  "path": "/metrics", "verb": "get"}}})
    assert access["status"]["allowed"] is False


async def test_the_deployment_and_its_pods_are_admitted(kube: Kube, installed: Installed,
                                                        make_namespace: MakeNamespace) -> None:
    """The Deployment passes validation and admission (dry run), and its Pod meets the
    "restricted" Pod Security Standard: non-root, no privilege escalation, no
    capabilities, RuntimeDefault seccomp (the PodSecurity admission plugin is on by default)."""
    stored = await apply(kube, DEPLOYMENT, dry_run=True)
    assert stored["spec"]["template"]["spec"]["containers"][0]["args"] == DEPLOYMENT["spec"]["template"]["spec"][
        "containers"][0]["args"]
    namespace = await make_namespace("chart-pss", labels={"pod-security.kubernetes.io/enforce": "restricted"})
    await kube.create("v1", "serviceaccounts", {"kind": "ServiceAccount", "metadata": {"name": ACCOUNT}},
                      namespace=namespace)
    template = DEPLOYMENT["spec"]["template"]
    pod = {"kind": "Pod", "metadata": {"name": "dra-quota", "labels": template["metadata"]["labels"]},
           "spec": template["spec"]}
    await kube.create("v1", "pods", pod, namespace=namespace, dry_run=True)
    # The control: the same Pod with one hardening setting undone is refused by the plugin.
    weaker = copy.deepcopy(pod)
    weaker["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(ApiError) as refused:
        await kube.create("v1", "pods", weaker, namespace=namespace, dry_run=True)
    assert refused.value.status == 403 and "violates PodSecurity" in refused.value.message


async def test_the_monitoring_objects_are_accepted(kube: Kube) -> None:
    """The chart's ServiceMonitor, PrometheusRule and dashboard ConfigMap (switches on) pass the
    API server's validation against the Prometheus Operator's own CRD schemas (from its Go
    module, tests/tools/monitoring_crds.py), field by field: nothing pruned, nothing unknown.
    Dry run: a PrometheusRule stored here would have no operator to act on it anyway."""
    for path in monitoring_crds():
        crd = yaml.safe_load(path.read_text())
        with contextlib.suppress(ApiError):  # 409: installed by an earlier run; shared, never deleted
            await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", crd)
        await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions", crd["metadata"]["name"],
                                      "Established", timeout=60)
    await ensure_namespace(kube, NAMESPACE)
    objects = render(MONITORING, include_crds=False)
    monitor, rule = find(objects, "ServiceMonitor"), find(objects, "PrometheusRule")
    dashboard = find(objects, "ConfigMap", "dra-quota-dashboard")
    for obj in (monitor, rule, dashboard):
        stored = await apply(kube, obj, dry_run=True)
        assert stored["metadata"]["labels"] == obj["metadata"]["labels"]
        assert {k: stored[k] for k in obj if k != "metadata"} == {k: obj[k] for k in obj if k != "metadata"}, obj["kind"]
    # The control: the schema is really applied (a misspelt field is refused, not pruned).
    wrong = copy.deepcopy(monitor)
    wrong["spec"]["endpoints"][0]["honourLabels"] = wrong["spec"]["endpoints"][0].pop("honorLabels")
    with pytest.raises(ApiError) as refused:
        await apply(kube, wrong, dry_run=True)
    # (An apply patch that does not fit the schema is answered 500 by 1.37, not 422: the
    # typed conversion of the patch fails before validation runs.)
    assert "honourLabels: field not declared in schema" in refused.value.message, refused.value


async def test_the_network_policy_is_accepted(kube: Kube) -> None:
    """The opt-in NetworkPolicy passes the API server's validation as rendered (dry run,
    strict fields); no CNI runs here to enforce it (values.yaml says what it admits)."""
    await ensure_namespace(kube, NAMESPACE)
    policy = find(render({"networkPolicy": {"enabled": True, "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]}},
                         include_crds=False), "NetworkPolicy")
    stored = await apply(kube, policy, dry_run=True)
    assert stored["spec"] == policy["spec"]
