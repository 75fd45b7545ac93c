"""`dra-quota top` as a process against the real API server.

The status read here is written through the `status` subresource by the test itself (the
quota controller writes the same fields; its own e2e tests check what it writes): this
test proves what `top` reads and prints, the kubeconfig handling and the exit codes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .cluster import ControlPlane, free_ports
from .harness import DQ, MakeNamespace, Served, running, top
from .kube import Kube

pytestmark = pytest.mark.e2e

GiB = 1024**3


async def test_top_prints_published_usage(cluster: ControlPlane, kube: Kube, crd: None,
                                          make_namespace: MakeNamespace) -> None:
    counted, fresh = await make_namespace("top"), await make_namespace("top")
    quota = await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                                   "spec": {"hard": {"memory": "320Gi", "devices": 4}}},
                              namespace=counted)
    quota["status"] = {"observedGeneration": quota["metadata"]["generation"],
                       "used": {"memory": 160 * GiB, "devices": 2}, "reserved": {"memory": 80 * GiB, "devices": 1},
                       "claims": {"allocated": 2, "pending": 1},
                       "conditions": [{"type": "Exceeded", "status": "False", "reason": "WithinLimits",
                                       "message": "", "lastTransitionTime": "2026-11-23T00:00:00Z"}]}
    await kube.replace(DQ, "devicequotas", quota, namespace=counted, subresource="status")
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "new"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=fresh)
    kubeconfig = str(cluster.kubeconfig)

    code, out, err = await top("--kubeconfig", kubeconfig, "-o", "json")
    assert code == 0, err
    rows = {(q["namespace"], q["name"]): q for q in json.loads(out)["quotas"]}
    assert rows[(counted, "gpus")] == {
        "namespace": counted, "name": "gpus", "hard": {"memory": 320 * GiB, "devices": 4},
        "used": {"memory": 160 * GiB, "devices": 2}, "reserved": {"memory": 80 * GiB, "devices": 1},
        "claims": {"allocated": 2, "pending": 1}, "exceeded": False, "current": True,
    }
    assert rows[(fresh, "new")]["used"] == {"memory": None, "devices": None}
    assert not rows[(fresh, "new")]["current"]

    code, out, err = await top("--kubeconfig", kubeconfig, "-n", counted)
    assert code == 0, err
    header, line, *rest = out.splitlines()
    assert header.split()[:2] == ["NAMESPACE", "QUOTA"] and not rest
    assert line.split() == [counted, "gpus", "160Gi", "/", "80Gi", "/", "320Gi", "2", "/", "1", "/", "4",
                            "2", "/", "1"]
    code, out, _ = await top("--kubeconfig", kubeconfig, "-n", fresh)
    assert "not counted yet" in out and "- / - / 80Gi" in out


async def test_top_says_why_it_cannot_read(tmp_path: Path, cluster: ControlPlane) -> None:
    closed = tmp_path / "closed.kubeconfig"
    port = free_ports(1)[0]  # nothing listens there
    closed.write_text(cluster.kubeconfig.read_text().replace(cluster.server, f"https://127.0.0.1:{port}"))
    code, out, err = await top("--kubeconfig", str(closed))
    assert (code, out) == (1, "") and "cannot read DeviceQuotas from the API server" in err, err
    missing = tmp_path / "missing.kubeconfig"
    code, _, err = await top("--kubeconfig", str(missing))
    assert code == 1 and "kubeconfig" in err and "Traceback" not in err, err


async def test_every_command_finds_the_cluster_through_kubeconfig(tmp_path: Path, cluster: ControlPlane, kube: Kube,
                                                                  crd: None, make_namespace: MakeNamespace) -> None:
    """`KUBECONFIG=... dra-quota serve` said "cannot reach the cluster: Service host/port is not
    set" while `top` read it (issue 17): both resolve credentials one way now, a list merged
    as kubectl merges it (missing entries skipped, the first current-context wins)."""
    ns = await make_namespace("creds")
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": "80Gi"}}}, namespace=ns)
    # A first file naming the context, the cluster's own file defining it, a missing one between.
    chooser = tmp_path / "chooser.kubeconfig"
    chooser.write_text("apiVersion: v1\nkind: Config\ncurrent-context: minik8s\n")
    listed = os.pathsep.join([str(chooser), str(tmp_path / "missing"), str(cluster.kubeconfig)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")} | {"KUBECONFIG": listed}
    code, out, err = await top("-n", ns, "-o", "json", env=env)
    assert code == 0, err
    assert [q["name"] for q in json.loads(out)["quotas"]] == ["gpus"]

    served = Served(cluster, free_ports(1)[0], tmp_path / "serve.log", kubeconfig_from_env=True)
    async for handle in running(served):
        assert f"credentials: kubeconfig {cluster.kubeconfig} ($KUBECONFIG" in handle.log_text()
