"""The e2e tests' control plane: :mod:`devcluster.controlplane`, shared with `dra-quota demo`.

It moved there so installed code can start the same cluster; the names stay importable
from here for the tests. `REPO_ROOT` is the tests' own: installed code never reads the checkout.
"""

from pathlib import Path

from devcluster.controlplane import (
    AUDIT_POLICY,
    BUILD_SCRIPT,
    DEFAULT_BINARY,
    KCM_CONTROLLERS,
    WEBHOOK_SERVICES,
    Component,
    ControlPlane,
    ControlPlaneError,
    audit_event,
    build,
    free_ports,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["AUDIT_POLICY", "BUILD_SCRIPT", "DEFAULT_BINARY", "KCM_CONTROLLERS", "REPO_ROOT", "WEBHOOK_SERVICES",
           "Component", "ControlPlane", "ControlPlaneError", "audit_event", "build", "free_ports"]
