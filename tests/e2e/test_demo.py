"""`dra-quota demo` as a newcomer runs it: a process, its own control plane, its own `serve`.

It does not use the session's cluster: the demo starts (and stops) one of its own from the
same binary, and these tests check what it showed against what docs/design.md promises (the
denial's exact message, `used` moving with the scheduler's allocations), that `--keep`
leaves a cluster `dra-quota top` can read and its stop script ends, and that nothing it
started survives it. TMPDIR points into tmp_path, so every process it started names a
path there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import http.client
import socket
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .cluster import REPO_ROOT, build
from .kubectl import build as build_kubectl
from .harness import advised

pytestmark = pytest.mark.e2e

GiB = 1 << 30
QUOTA_HOOK = "quota.resourceclaims.draquota.io"
H200_DENIED = advised(f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded DeviceQuota "gpus": '
                      "requested memory=282Gi, used memory=160Gi, reserved memory=0, limited memory=320Gi", "full",
                      namespace="team-a")


def demo_env(tmp_path: Path) -> dict[str, str]:
    build()  # the session's binary (a no-op when built); the demo finds the same one
    return {**os.environ, "TMPDIR": str(tmp_path)}


def started_by(tmp_path: Path) -> list[str]:
    """Command lines of live (not zombie) processes that name a path under tmp_path."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(tmp_path) in cmdline and state != "Z":
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def team_a(step: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = next(r for r in step["usage"] if (r["namespace"], r["name"]) == ("team-a", "gpus"))
    return row


def check_story(summary: dict[str, Any]) -> None:
    steps = summary["steps"]
    by_number = {s["step"]: s for s in steps}
    assert [s["decision"] for s in steps] == ["admitted", "denied", "admitted", "admitted", "denied",
                                              "deleted", "admitted"]
    # Two H100s reserved 160Gi at admission; the scheduler allocated them; the controller counted them.
    first = by_number[1]
    assert first["charge"] == {"memory": 160 * GiB, "devices": 2}
    assert len(first["devices"]) == 2 and all(d.startswith("h100-node-1/") for d in first["devices"])
    assert team_a(first)["used"] == {"memory": 160 * GiB, "devices": 2}
    assert team_a(first)["reserved"] == {"memory": 0, "devices": 0}
    # The live webhook's denial, in docs/design.md's words and numbers.
    assert by_number[2]["message"] == H200_DENIED
    assert by_number[5]["message"].startswith(f'admission webhook "{QUOTA_HOOK}" denied the request: '
                                              'exceeded DeviceQuota "mig-slices": requested memory=19968Mi')
    # Usage goes back down when the claim is deleted, and the H200s then fit.
    assert team_a(by_number[6])["used"] == {"memory": 0, "devices": 0}
    assert by_number[7]["charge"] == {"memory": 282 * GiB, "devices": 2}
    assert team_a(by_number[7])["used"] == {"memory": 282 * GiB, "devices": 2}


def test_the_demo_denies_a_claim_and_moves_usage_then_stops_everything(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "commands.cli", "demo", "-o", "json"], cwd=REPO_ROOT,
                          env=demo_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    summary = json.loads(proc.stdout)
    check_story(summary)
    # What the newcomer reads (stderr with -o json): the denial and the final table.
    assert f"DENIED by the webhook: {H200_DENIED}" in proc.stderr
    assert "team-a     gpus        282Gi / 0 / 320Gi" in proc.stderr
    print(f"demo timings (s, warm binary): {summary['seconds']}")
    assert started_by(tmp_path) == []
    assert not list(tmp_path.glob("dra-quota-demo-*")), "the demo's files are removed after a clean run"


def test_keep_leaves_a_cluster_top_reads_and_its_stop_script_ends_it(tmp_path: Path) -> None:
    env = demo_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "commands.cli", "demo", "--keep", "-o", "json"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    kept: dict[str, str] = {}
    try:
        assert proc.returncode == 0, proc.stderr[-5000:]
        kept = json.loads(proc.stdout)["kept"]
        assert f"export KUBECONFIG={kept['kubeconfig']}" in proc.stderr
        assert f"Stop it all: sh {kept['stop']}" in proc.stderr
        assert started_by(tmp_path), "still running after the demo exited"
        top = subprocess.run([sys.executable, "-m", "commands.cli", "top", "--kubeconfig", kept["kubeconfig"],
                              "-o", "json"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert top.returncode == 0, top.stderr
        rows = {(q["namespace"], q["name"]): q for q in json.loads(top.stdout)["quotas"]}
        assert rows[("team-a", "gpus")]["used"] == {"memory": 282 * GiB, "devices": 2}
        # A tenant sees its namespace's quota as on an installed cluster (the chart's aggregated
        # role, installed by the demo too), running the commands the demo printed.
        kubectl = [str(build_kubectl()), "--kubeconfig", kept["kubeconfig"]]
        bind = "kubectl create rolebinding tina-views --clusterrole=view --user=tina -n team-a"
        view = "kubectl get devicequotas -n team-a --as=tina"
        assert bind in proc.stderr and view in proc.stderr
        bound = subprocess.run(kubectl + bind.split()[1:], env=env, capture_output=True, text=True, timeout=60)
        assert bound.returncode == 0, bound.stderr
        deadline = time.monotonic() + 60  # the controller manager aggregates the role into view
        while (seen := subprocess.run(kubectl + f"{view} -o name".split()[1:], env=env, capture_output=True,
                                      text=True, timeout=60)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == ["devicequota.draquota.io/gpus"]
        other = subprocess.run(kubectl + "get devicequotas -n team-b --as=tina".split(), env=env,
                               capture_output=True, text=True, timeout=60)
        assert other.returncode != 0 and "forbidden" in other.stderr
        # How to scrape is printed (HTTPS, a token allowed to get /metrics), and it answers
        # with the quota it just showed, to that token only.
        assert kept["metrics"] in proc.stderr and kept["metrics_token"] in proc.stderr
        host, port = urllib.parse.urlsplit(kept["metrics"]).hostname, urllib.parse.urlsplit(kept["metrics"]).port
        context = ssl.create_default_context(cafile=kept["ca"])
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
        connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                                              server_hostname=host)  # the certificate names the Service
        token = Path(kept["metrics_token"]).read_text()
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        scraped = connection.getresponse()
        assert scraped.status == 200
        text = scraped.read().decode()
        connection.close()
        used = {"namespace": "team-a", "quota": "gpus", "resource": "memory", "type": "used"}
        assert [s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "draquota_quota" and s.labels == used] == [282 * GiB]
    finally:
        if kept:
            stopped = subprocess.run(["sh", kept["stop"]], capture_output=True, text=True, timeout=60)
            assert stopped.returncode == 0, stopped.stderr
    assert started_by(tmp_path) == []
    assert not Path(kept["workdir"]).exists()


async def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "commands.cli", "demo", cwd=REPO_ROOT, env=demo_env(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    assert process.stdout is not None
    seen: list[str] = []
    async with asyncio.timeout(300):  # read every line as it comes: the scenario takes about a second
        while not (seen and seen[-1].startswith("step 1/")):
            line = (await process.stdout.readline()).decode()
            assert line, "the demo ended before its scenario started:\n" + "".join(seen)
            seen.append(line)
    assert started_by(tmp_path), "the cluster and serve run"
    process.send_signal(signal.SIGINT)
    rest = (await asyncio.wait_for(process.stdout.read(), 60)).decode()
    assert await process.wait() == 130, rest
    assert "interrupted; everything it started is stopped" in rest
    assert started_by(tmp_path) == []
    assert not list(tmp_path.glob("dra-quota-demo-*")), rest
