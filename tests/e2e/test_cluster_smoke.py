"""Smoke tests proving the minik8s control plane is the real thing.

Each test asserts behaviour that only a real kube-apiserver / kube-scheduler /
kube-controller-manager produces, so a broken or faked control plane fails them.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from .cluster import WEBHOOK_SERVICES, ControlPlane, free_ports
from .driver import (
    DRIVER, Gpu, GpuFleet, allocation_results, claim_spec, create_claim, create_claim_template, create_pod,
    exact_request, free_pod, wait_pod_allocated,
)
from .kube import ApiError, Kube, poll

pytestmark = pytest.mark.e2e

MakeFleet = Callable[..., Awaitable[GpuFleet]]
MakeNamespace = Callable[..., Awaitable[str]]


async def test_version_and_resource_v1_served(kube: Kube) -> None:
    version = await kube.request("GET", "/version")
    # build.sh stamps the pinned release; the placeholder would be v0.0.0-master+$Format:%H$.
    assert version["gitVersion"].startswith("v1.37."), version
    assert (version["major"], version["minor"]) == ("1", "37"), version

    group = await kube.request("GET", "/apis/resource.k8s.io")
    assert "v1" in {v["version"] for v in group["versions"]}
    assert group["preferredVersion"]["version"] == "v1"

    resources = {r["name"]: r for r in (await kube.request("GET", "/apis/resource.k8s.io/v1"))["resources"]}
    for name in ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"):
        assert name in resources, sorted(resources)
    assert "resourceclaims/status" in resources
    assert resources["resourceclaims"]["namespaced"] is True

    # Text endpoints through the same client (bench/admission.py reads the API server's metrics).
    metrics = await kube.api.text("/metrics")
    assert "# TYPE apiserver_request_total counter" in metrics
    assert resources["resourceslices"]["namespaced"] is False


async def test_admin_kubeconfig_works_with_kubernetes_asyncio(cluster: ControlPlane, namespace: str) -> None:
    """The product talks to Kubernetes through kubernetes_asyncio with raw dicts; the
    minted kubeconfig (embedded EC client key, CA) must work with it unchanged."""
    from kubernetes_asyncio import client, config

    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    async with api:
        assert api.configuration.host == cluster.server
        version = await client.VersionApi(api).get_code()
        assert version.git_version.startswith("v1.37.")
        resp = await client.CustomObjectsApi(api).list_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaims", _preload_content=False
        )
        body = json.loads(await resp.read())
        assert body["kind"] == "ResourceClaimList" and body["items"] == []


async def test_scheduler_allocates_template_claim(kube: Kube, namespace: str, make_fleet: MakeFleet) -> None:
    fleet = await make_fleet()
    await fleet.add_node("a", [Gpu("NVIDIA A100-SXM4-80GB", "80Gi")] * 2)
    node_b = await fleet.add_node("b", [Gpu("NVIDIA A100-SXM4-80GB", "80Gi"), Gpu("NVIDIA H100-SXM5-80GB", "80Gi")])

    # Only node b's gpu-1 matches: proves the scheduler evaluated our CEL against our slices.
    await create_claim_template(
        kube,
        namespace,
        "h100",
        claim_spec(
            exact_request(
                "gpu",
                fleet.device_class,
                selectors=[f'device.attributes["{DRIVER}"].productName == "NVIDIA H100-SXM5-80GB"'],
            )
        ),
    )
    await create_pod(kube, namespace, "trainer", template="h100", node_selector=fleet.node_selector)
    pod, claim = await wait_pod_allocated(kube, namespace, "trainer")

    assert pod["spec"]["nodeName"] == node_b
    results = allocation_results(claim)
    assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in results] == [
        ("gpu", DRIVER, node_b, "gpu-1")
    ]
    # Node-local pool: the allocation is pinned to that node (see nodeNameFromAllocation,
    # k8s.io/kubernetes pkg/registry/resource/utils.go).
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == [node_b]
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == {pod["metadata"]["uid"]}

    # Created by the resourceclaim controller from the template, owned by the pod.
    meta = claim["metadata"]
    assert meta["name"] != "h100" and meta["name"].startswith("trainer-gpu-"), meta["name"]
    assert meta["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    owners = meta["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == [
        ("Pod", "trainer", pod["metadata"]["uid"], True)
    ]
    assert "resource.kubernetes.io/delete-protection" in meta.get("finalizers", [])
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == fleet.device_class

    # A second pod wanting the only H100 cannot be placed while the first holds it ...
    await create_pod(kube, namespace, "waiter", template="h100", node_selector=fleet.node_selector)
    await kube.wait_for(
        "v1",
        "pods",
        "waiter",
        lambda p: any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in (p.get("status") or {}).get("conditions") or []
        ),
        namespace=namespace,
        what="reported unschedulable",
    )
    # ... and gets it once the first pod is deleted and its claim freed.
    await free_pod(kube, namespace, "trainer")
    pod2, claim2 = await wait_pod_allocated(kube, namespace, "waiter")
    assert pod2["spec"]["nodeName"] == node_b
    assert [(r["pool"], r["device"]) for r in allocation_results(claim2)] == [(node_b, "gpu-1")]
    await free_pod(kube, namespace, "waiter")


async def test_admin_access_needs_namespace_label(kube: Kube, make_namespace: MakeNamespace, make_fleet: MakeFleet) -> None:
    fleet = await make_fleet()
    spec = claim_spec(exact_request("gpu", fleet.device_class, admin_access=True))

    plain = await make_namespace("noadmin")
    with pytest.raises(ApiError) as err:
        await create_claim(kube, plain, "monitor", spec)
    # In-tree rule in REST storage (k8s.io/kubernetes pkg/registry/resource/utils.go,
    # AuthorizedForAdmin): Forbidden field error -> 422 Invalid.
    assert err.value.status == 422, err.value.body
    assert err.value.reason == "Invalid"
    causes = err.value.body["details"]["causes"]
    assert causes[0]["field"] == "spec.devices.requests[0].adminAccess", causes
    assert "resource.kubernetes.io/admin-access: true" in causes[0]["message"]
    # The same rule guards templates.
    with pytest.raises(ApiError) as err:
        await create_claim_template(kube, plain, "monitor", spec)
    assert err.value.status == 422

    admin = await make_namespace("admin", labels={"resource.kubernetes.io/admin-access": "true"})
    created = await create_claim(kube, admin, "monitor", spec)
    assert created["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True

    # The label value must be exactly "true".
    wrong = await make_namespace("wrong", labels={"resource.kubernetes.io/admin-access": "True"})
    with pytest.raises(ApiError) as err:
        await create_claim(kube, wrong, "monitor", spec)
    assert err.value.status == 422


async def test_resourcequota_devices_per_deviceclass(kube: Kube, namespace: str, make_fleet: MakeFleet) -> None:
    fleet = await make_fleet()
    other = await make_fleet("other")
    quota_key = f"{fleet.device_class}.deviceclass.resource.k8s.io/devices"
    await kube.create(
        "v1",
        "resourcequotas",
        {"kind": "ResourceQuota", "metadata": {"name": "gpus"}, "spec": {"hard": {quota_key: "2"}}},
        namespace=namespace,
    )
    # Admission only enforces a quota once the resourcequota controller has
    # computed its status (k8s.io/apiserver/pkg/admission/plugin/resourcequota).
    await kube.wait_for(
        "v1",
        "resourcequotas",
        "gpus",
        lambda q: quota_key in ((q.get("status") or {}).get("hard") or {}),
        namespace=namespace,
        what="status.hard computed",
    )

    await create_claim(kube, namespace, "one", claim_spec(exact_request("gpu", fleet.device_class, count=1)))
    with pytest.raises(ApiError) as err:
        await create_claim(kube, namespace, "two", claim_spec(exact_request("gpu", fleet.device_class, count=2)))
    assert err.value.status == 403, err.value.body
    assert "exceeded quota: gpus" in err.value.message
    assert f"requested: {quota_key}=2, used: {quota_key}=1, limited: {quota_key}=2" in err.value.message

    # Another class is not limited by this quota, and the counted usage is exact.
    await create_claim(kube, namespace, "elsewhere", claim_spec(exact_request("gpu", other.device_class, count=4)))
    await create_claim(kube, namespace, "fits", claim_spec(exact_request("gpu", fleet.device_class, count=1)))
    quota = await kube.wait_for(
        "v1",
        "resourcequotas",
        "gpus",
        lambda q: (q.get("status") or {}).get("used", {}).get(quota_key) == "2",
        namespace=namespace,
        what=f"used {quota_key}=2",
    )
    assert quota["status"]["hard"][quota_key] == "2"
    with pytest.raises(ApiError) as err:
        await create_claim(kube, namespace, "three", claim_spec(exact_request("gpu", fleet.device_class)))
    assert err.value.status == 403


# -- admission webhook through the Service resolver override ---------------------------------


class RecordingWebhook:
    """A tiny validating webhook: denies ConfigMaps labelled ``deny=yes``, records every review."""

    DENIAL = "denied by the minik8s test webhook"

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.hosts: list[str] = []
        self.server_names: list[str | None] = []  # TLS SNI of each handshake

    def sni(self, _sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        self.server_names.append(name)

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        self.reviews.append(req)
        self.hosts.append(request.host)
        labels = (req.get("object") or {}).get("metadata", {}).get("labels") or {}
        allowed = labels.get("deny") != "yes"
        response: dict[str, Any] = {"uid": req["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": self.DENIAL}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


@pytest_asyncio.fixture(loop_scope="session")
async def webhook_server(cluster: ControlPlane) -> AsyncIterator[tuple[RecordingWebhook, int]]:
    hook = RecordingWebhook()
    app = web.Application()
    app.router.add_post("/validate", hook.handle)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert, key = cluster.webhook_cert
    ctx.load_cert_chain(str(cert), str(key))
    ctx.sni_callback = hook.sni
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)[0]
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
    await site.start()
    try:
        yield hook, port
    finally:
        await runner.cleanup()


async def create_configmap_webhook(
    kube: Kube,
    cluster: ControlPlane,
    namespace: str,
    *,
    config_name: str,
    webhook_name: str,
    service_namespace: str,
    service_name: str,
    port: int,
) -> None:
    """A ValidatingWebhookConfiguration for ConfigMap CREATEs in `namespace` only (other
    tests share the cluster), calling the webhook through a Service reference as
    production manifests do: the apiserver's --loopback-service rule dials
    127.0.0.1:<port> and verifies the certificate for <svc>.<ns>.svc."""
    await kube.create(
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        {
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": config_name},
            "webhooks": [
                {
                    "name": webhook_name,
                    "clientConfig": {
                        "service": {"namespace": service_namespace, "name": service_name, "port": port,
                                    "path": "/validate"},
                        "caBundle": base64.b64encode(cluster.ca_file.read_bytes()).decode(),
                    },
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        },
    )


async def test_webhook_called_through_service_reference(
    kube: Kube, cluster: ControlPlane, namespace: str, webhook_server: tuple[RecordingWebhook, int]
) -> None:
    hook, port = webhook_server
    svc_ns, svc_name = WEBHOOK_SERVICES[0]
    config_name = f"minik8s-smoke-{namespace}"
    await create_configmap_webhook(
        kube, cluster, namespace, config_name=config_name, webhook_name="smoke.minik8s.test",
        service_namespace=svc_ns, service_name=svc_name, port=port,
    )
    try:
        denied_cm = {"kind": "ConfigMap", "metadata": {"name": "denied", "labels": {"deny": "yes"}}}

        # The apiserver picks up webhook configurations through an informer; poll
        # (dry-run, so nothing is persisted) until the denial shows up.
        async def denied() -> ApiError | None:
            try:
                await kube.create("v1", "configmaps", denied_cm, namespace=namespace, dry_run=True)
            except ApiError as e:
                return e
            return None

        err = await poll(denied, timeout=30, what="the webhook configuration to take effect")
        assert err.status == 403, err.body
        assert err.message == f'admission webhook "smoke.minik8s.test" denied the request: {hook.DENIAL}'
        assert await kube.get_or_none("v1", "configmaps", "denied", namespace=namespace) is None

        allowed = await kube.create("v1", "configmaps", {"kind": "ConfigMap", "metadata": {"name": "fine"}}, namespace=namespace)
        assert allowed["metadata"]["name"] == "fine"

        seen = [(r["operation"], r["namespace"], r["name"], r["dryRun"]) for r in hook.reviews]
        assert ("CREATE", namespace, "denied", True) in seen
        assert seen[-1] == ("CREATE", namespace, "fine", False)
        assert "system:masters" in hook.reviews[-1]["userInfo"]["groups"]
        # The apiserver addressed the Service (Host header and TLS SNI/verification
        # use "<svc>.<ns>.svc"); only the dial went to 127.0.0.1.
        assert set(hook.hosts) == {f"{svc_name}.{svc_ns}.svc:{port}"}
        assert set(hook.server_names) == {f"{svc_name}.{svc_ns}.svc"}
    finally:
        await kube.delete("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", config_name)


async def test_webhook_tls_server_name_is_verified(
    kube: Kube, cluster: ControlPlane, namespace: str, webhook_server: tuple[RecordingWebhook, int]
) -> None:
    """A Service name outside the certificate's SANs must fail TLS: the override changes
    only where the apiserver dials, not what it verifies."""
    hook, port = webhook_server
    config_name = f"minik8s-badname-{namespace}"
    await create_configmap_webhook(
        kube, cluster, namespace, config_name=config_name, webhook_name="badname.minik8s.test",
        service_namespace="elsewhere", service_name="not-in-cert", port=port,
    )
    try:
        cm = {"kind": "ConfigMap", "metadata": {"name": "x"}}

        async def failed() -> ApiError | None:
            try:
                await kube.create("v1", "configmaps", cm, namespace=namespace, dry_run=True)
            except ApiError as e:
                return e
            return None

        err = await poll(failed, timeout=30, what="the webhook configuration to take effect")
        assert err.status == 500, err.body
        assert 'failed calling webhook "badname.minik8s.test"' in err.message
        assert "not-in-cert.elsewhere.svc" in err.message  # x509: certificate is valid for ..., not ...
        assert not hook.reviews, "the handshake must fail before any request reaches the webhook"
        # It did reach our loopback listener, asking for the Service's name.
        assert "not-in-cert.elsewhere.svc" in hook.server_names
    finally:
        await kube.delete("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", config_name)


def test_control_plane_components_alive(cluster: ControlPlane) -> None:
    """Runs last in this module: every component survived the tests above."""
    cluster.check_alive()
    assert {c.name for c in cluster.components} == {"etcd", "apiserver", "controller-manager", "scheduler"}
