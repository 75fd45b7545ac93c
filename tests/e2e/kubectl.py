"""A real kubectl for the end-to-end tests: what an operator types, against the test control plane.

`tests/cluster/build.sh kubectl` builds k8s.io/kubernetes's own cmd/kubectl, from the same
go.mod (and so the same release) as the control plane, into .cache/kubectl/kubectl.
conftest.py's session fixture ``kubectl`` builds it (a no-op when up to date) and runs it
with the cluster's admin kubeconfig and a discovery cache of its own under the session's
temporary directory (kubectl caches discovery in ~/.kube/cache otherwise: outside the
clone, and stale for a test that has just installed a CRD).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.tools import gobuild

from .cluster import BUILD_SCRIPT, REPO_ROOT

BINARY = REPO_ROOT / ".cache" / "kubectl" / "kubectl"


class KubectlError(RuntimeError):
    pass


def build() -> Path:
    """Run `tests/cluster/build.sh kubectl` (a fast no-op when up to date); the binary's path."""
    try:
        return gobuild.build(BUILD_SCRIPT, "kubectl", binary=BINARY)
    except gobuild.BuildError as e:
        raise KubectlError(str(e)) from None


@dataclass(frozen=True, slots=True)
class Kubectl:
    binary: Path
    kubeconfig: Path
    cache_dir: Path

    async def __call__(self, *args: str) -> str:
        """kubectl's standard output; KubectlError with its standard error when it fails."""
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache_dir}", *args]
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        proc = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env)
        if proc.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout
