"""The e2e tests' control plane: :mod:`devcluster.controlplane` (its binary from `devcluster.binary`, its
processes in `devcluster.processes`), shared with `dra-quota demo`.

It moved there so installed code can start the same cluster; the names stay importable
from here for the tests. `REPO_ROOT` is the tests' own: installed code never reads the checkout.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from devcluster.binary import BUILD_SCRIPT, DEFAULT_BINARY, ControlPlaneError, build
from devcluster.controlplane import AUDIT_POLICY, KCM_CONTROLLERS, WEBHOOK_SERVICES, ControlPlane, audit_event
from devcluster.processes import Component, free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["AUDIT_POLICY", "BUILD_SCRIPT", "DEFAULT_BINARY", "KCM_CONTROLLERS", "REPO_ROOT", "WEBHOOK_SERVICES",
           "Component", "ControlPlane", "ControlPlaneError", "audit_event", "build", "free_ports", "private_cluster"]


@contextmanager
def private_cluster(workdir: Path, extra_args: dict[str, tuple[str, ...]] | None = None) -> Iterator[ControlPlane]:
    """A control plane of a module's own (other API flags, or objects the shared cluster's
    tests must not see), stopped at the end; failing to build or start it fails the test."""
    try:
        cp = ControlPlane(binary=build(), workdir=workdir, extra_args=extra_args or {})
    except ControlPlaneError as e:
        pytest.fail(f"cannot build the minik8s control plane: {e}", pytrace=False)
    try:
        cp.start()
    except ControlPlaneError as e:
        cp.stop()
        pytest.fail(f"cannot start the minik8s control plane: {e}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()
