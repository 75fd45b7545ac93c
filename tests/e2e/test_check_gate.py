"""README's CI gate for `dra-quota check`, run as written against a real API server.

The gate needs the cluster's state beside the claims: the README's dump (`kubectl get
deviceclasses,resourceslices,namespaces,devicequotas,clusterdevicequotas -A -o json`) and
`check --from-cluster` (the same kinds, listed with the user's kubeconfig) must both give
the decisions `check -f examples/` gives offline. A cluster of its own: the examples'
classes and slices would otherwise be seen by (and see) the other tests' objects.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import ControlPlane, private_cluster
from .harness import CRDS
from .kubectl import Kubectl, KubectlError
from .kubectl import build as build_kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
STATE = ("00-deviceclasses.yaml", "10-nvidia-slices.yaml", "20-amd-slices.yaml", "30-teams.yaml")


@pytest.fixture(scope="module")
def gate_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with private_cluster(tmp_path_factory.mktemp("minik8s-gate")) as cp:
        yield cp


def readme_gates() -> list[str]:
    """The README's gate commands, as a user copies them (their comments dropped)."""
    text = (ROOT / "README.md").read_text()
    lines = [line for line in text.splitlines() if "--fail-on-deny" in line and "dra-quota check" in line
             and not line.startswith(("Exit", "`"))]
    return [re.sub(r"\s+#.*$", "", line) for line in lines]


def offline_decisions() -> dict[tuple[str, str], bool]:
    out = subprocess.run([sys.executable, "-m", "commands.cli", "check", "-f", str(EXAMPLES), "-o", "json"],
                         capture_output=True, text=True, check=True, cwd=ROOT, timeout=120).stdout
    return {(o["namespace"], o["name"]): o["allowed"] for o in json.loads(out)["objects"]}


def decisions(table: str) -> dict[tuple[str, str], bool]:
    rows = [line.split() for line in table.splitlines() if line.startswith("ResourceClaim")]
    return {(row[1], row[2]): row[3] != "DENIED" for row in rows}


async def test_the_readme_gates_decide_as_check_does_offline(gate_cluster: ControlPlane, tmp_path: Path) -> None:
    try:
        binary = build_kubectl()
    except KubectlError as e:
        pytest.fail(f"cannot build kubectl:\n{e}", pytrace=False)
    async with gate_cluster.client() as kube:
        for definition in CRDS:
            await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", definition)
            await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                          definition["metadata"]["name"], "Established", timeout=60)
    (tmp_path / "cache").mkdir()
    ours = Kubectl(binary, gate_cluster.kubeconfig, tmp_path / "cache")
    for name in STATE:
        await ours("apply", "-f", str(EXAMPLES / name))
    shutil.copy(EXAMPLES / "40-claims.yaml", tmp_path / "claims.yaml")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(binary)
    (bin_dir / "dra-quota").write_text(f"#!/bin/sh\nexec {sys.executable} -m commands.cli \"$@\"\n")
    (bin_dir / "dra-quota").chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECONFIG": str(gate_cluster.kubeconfig),
           "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}  # kubectl caches discovery under $HOME
    expected = offline_decisions()
    assert sum(not allowed for allowed in expected.values()) == 6
    gates = readme_gates()
    assert len(gates) == 2 and "--from-cluster" in gates[1], gates
    for gate in gates:
        done = subprocess.run(["bash", "-o", "pipefail", "-c", gate], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 1, (gate, done.stderr)  # the examples' six denials
        assert decisions(done.stdout) == expected, (gate, done.stdout)
        assert "no DeviceClasses were loaded" not in done.stderr
        assert done.stderr.strip().endswith("error: 6 of 24 claims and templates denied (--fail-on-deny)"), (
            gate, done.stderr)


async def test_from_cluster_says_why_it_cannot_list(tmp_path: Path) -> None:
    missing = tmp_path / "missing.kubeconfig"
    done = subprocess.run([sys.executable, "-m", "commands.cli", "check", "--from-cluster", "--kubeconfig",
                           str(missing), "-f", str(EXAMPLES / "40-claims.yaml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and "cannot reach the cluster" in done.stderr, done.stderr
