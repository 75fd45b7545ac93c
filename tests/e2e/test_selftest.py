"""`dra-quota selftest`, the chart's `helm test`, as a process against the real API server.

There is no kubelet, so the test hook's Pod cannot run: its arguments run as a local
process, with a kubeconfig holding a TokenRequest token of the hook's own ServiceAccount
after the hook's Role and RoleBinding are applied (tests/e2e/test_chart.py does the same
for `serve`), so the rights the chart gives the test are proven enough, and no more.
The webhook configurations are the shipped ones adapted for the shared cluster
(tests/e2e/harness.py): with `serve` up the selftest passes; with no configuration
selecting its namespace, or `serve` down under either failure policy, it fails and says why.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from commands.selftest import probe_claim
from kube.api import KubeApi
from kube.resources import CLAIMS, NAMESPACES

from ..tools.chart import NAMESPACE, find, render
from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1
from .harness import RUN_LABEL, MakeNamespace, Setup, adapted_webhooks, dra_quota, installed
from .kube import ApiError, Kube
from .shipped import apply, ensure_namespace, resource, token_kubeconfig

pytestmark = pytest.mark.e2e

NOT_CALLED = "error: no dra-quota webhook answered for namespace"


@contextlib.asynccontextmanager
async def chart_hook(cluster: ControlPlane, kube: Kube, namespace: str, tmp_path: Path
                     ) -> AsyncIterator[tuple[list[str], KubeApi]]:
    """The chart's test hook for selftest.namespace=`namespace`: its ServiceAccount, Role and
    RoleBinding applied; yields its Pod's arguments, completed with a kubeconfig holding
    that account's token, and a client with the same token. The account is deleted after
    (the Role and binding go with the test's namespace)."""
    objects = render({"selftest": {"namespace": namespace}}, tests=True, include_crds=False,
                     show_only="templates/tests/selftest.yaml")
    pod = find(objects, "Pod")
    await ensure_namespace(kube, NAMESPACE)
    account = find(objects, "ServiceAccount")
    for obj in objects:
        if obj["kind"] != "Pod":
            await apply(kube, obj)
    try:
        answer = await kube.request(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account['metadata']['name']}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}})
        kubeconfig = token_kubeconfig(cluster, answer["status"]["token"], tmp_path / "selftest.kubeconfig")
        args = [*pod["spec"]["containers"][0]["args"], f"--kubeconfig={kubeconfig}"]
        async with await KubeApi.from_kubeconfig(str(kubeconfig)) as api:
            yield args, api
    finally:
        with contextlib.suppress(ApiError):
            await kube.api.delete(resource(account), account["metadata"]["name"], namespace=NAMESPACE)


async def test_the_charts_selftest_passes_through_the_webhook(cluster: ControlPlane, kube: Kube, setup: Setup,
                                                              tmp_path: Path) -> None:
    with setup.served.log_on_failure():
        async with chart_hook(cluster, kube, setup.namespace, tmp_path) as (args, api):
            code, out, err = await dra_quota(*args)
            assert (code, err) == (0, ""), err
            assert out == (f"ok: the dra-quota webhook admitted a dry-run ResourceClaim in namespace {setup.namespace} "
                           '(draquota.io/charge={"memory":0,"devices":0}, quotas charged: none)\n')
            # Least privilege: the create in its namespace, nothing else.
            for call in (api.list(CLAIMS, namespace=setup.namespace),
                         api.create(CLAIMS, probe_claim(), namespace="default", dry_run=True),
                         api.list(NAMESPACES)):
                with pytest.raises(ApiError) as refused:
                    await call
                assert refused.value.status == 403, refused.value
    # The dry run stored nothing.
    assert await kube.list(RESOURCE_V1, "resourceclaims", namespace=setup.namespace) == []


async def test_the_selftest_fails_where_no_webhook_is_called(kube: Kube, cluster: ControlPlane, crd: None,
                                                             make_namespace: MakeNamespace) -> None:
    # Another test's configurations require their own run label: none selects this namespace.
    namespace = await make_namespace("selftest")
    code, out, err = await dra_quota("selftest", "-n", namespace, "--kubeconfig", str(cluster.kubeconfig))
    assert (code, out) == (1, "")
    assert err.startswith(f"{NOT_CALLED} {namespace}: the API server admitted the dry-run ResourceClaim without "
                          "the draquota.io/charge annotation"), err

    code, out, err = await dra_quota("selftest", "-n", f"absent-{uuid.uuid4().hex[:8]}",
                                     "--kubeconfig", str(cluster.kubeconfig))
    assert (code, out) == (2, "")
    assert err.startswith("error: cannot send the claim: namespaces \"absent-"), err


async def test_the_selftest_fails_when_serve_is_down(kube: Kube, cluster: ControlPlane, crd: None,
                                                     make_namespace: MakeNamespace) -> None:
    run = uuid.uuid4().hex[:8]
    ungoverned = await make_namespace("selftest", labels={RUN_LABEL: run})
    governed = await make_namespace("selftest", labels={RUN_LABEL: run, "draquota.io/governed": "true"})
    # The shipped configurations, pointing at a port nobody listens on.
    async with installed(kube, adapted_webhooks(run, free_ports(1)[0], cluster)):
        # failurePolicy Ignore: the claim is admitted as if there were no webhook.
        code, out, err = await dra_quota("selftest", "-n", ungoverned, "--kubeconfig", str(cluster.kubeconfig))
        assert (code, out) == (1, "")
        assert err.startswith(f"{NOT_CALLED} {ungoverned}"), err
        # failurePolicy Fail: refused, not by us.
        code, out, err = await dra_quota("selftest", "-n", governed, "--kubeconfig", str(cluster.kubeconfig))
        assert (code, out) == (1, "")
        assert err.startswith("error: the API server called the dra-quota webhook quota.resourceclaims.draquota.io "
                              f"for namespace {governed} and got no answer (failurePolicy: Fail): is dra-quota serve "
                              "running and ready?"), err
