"""`dra-quota top` against an API server that serves DeviceQuotas and no ClusterDeviceQuota CRD.

The real control plane keeps the ClusterDeviceQuota CRD installed once any test installed
it (tests/e2e share one cluster), so the 404 of a cluster without it is served here by a
loopback HTTP server answering as the API server does for a resource it does not know;
`top` runs as a process with a kubeconfig pointing at it. tests/e2e/test_top.py reads
real teams, and a real 403.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from ..builders import GiB, make_quota

ROOT = Path(__file__).resolve().parents[3]
DEVICEQUOTAS = "/apis/draquota.io/v1alpha1/devicequotas"
CLUSTERDEVICEQUOTAS = "/apis/draquota.io/v1alpha1/clusterdevicequotas"


def not_found(request: web.Request) -> web.Response:
    """The API server's answer for a path no installed API serves."""
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "the server "
                              "could not find the requested resource", "reason": "NotFound", "code": 404}, status=404)


async def test_without_the_cluster_crd_top_shows_the_namespaces_alone(tmp_path: Path) -> None:
    quota = make_quota("gpus", memory="80Gi")
    quota["metadata"].update({"generation": 1, "resourceVersion": "1"})
    quota["status"] = {"observedGeneration": 1, "used": {"memory": 80 * GiB}}
    asked: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        asked.append(request.path)
        if request.path == DEVICEQUOTAS:
            return web.json_response({"kind": "DeviceQuotaList", "apiVersion": "draquota.io/v1alpha1",
                                      "metadata": {"resourceVersion": "1"}, "items": [quota]})
        return not_found(request)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", answer)
    async with TestServer(app, host="127.0.0.1") as server:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": str(server.make_url(""))}}],
            "users": [{"name": "fake", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "commands.cli", "top", "--kubeconfig", str(kubeconfig), "-o", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT)
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert (process.returncode, err.decode()) == (0, "")
    assert [(q["kind"], q["name"]) for q in json.loads(out)["quotas"]] == [("DeviceQuota", "gpus")]
    assert CLUSTERDEVICEQUOTAS in asked  # it asked, and took the 404 for "no teams"
