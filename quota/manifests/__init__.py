"""The API objects the program installs itself, read from the installed package.

`devicequota.yaml` and `clusterdevicequota.yaml` are the DeviceQuota and
ClusterDeviceQuota CRDs (the schemas `quota.quotas.devicequota` parses; `serve` watches both);
`webhooks.yaml` the Mutating- and ValidatingWebhookConfiguration that send the API server's
reviews to `dra-quota serve`. Both are package data (pyproject.toml, `[tool.setuptools.package-data]`),
so `dra-quota demo` (commands/demo.py) and the local cluster's webhook routing
(devcluster/webhooks.py) find them in an installed copy as in a checkout, whose
deploy/crds/*.yaml and deploy/manifests/webhooks.yaml are links to these
files (the chart's crds/ holds a copy, tests/unit/test_chart.py checks it);
`tenant-view.yaml` the ClusterRole through which tenants read their namespaces' quotas (the
chart renders the same, so the demo's tenants see what an installed cluster's do). Read
when asked, never at import.
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

import yaml

__all__ = ["crd", "crds", "documents", "tenant_view_role", "webhook_configurations"]


def documents(resource: Traversable) -> list[dict[str, Any]]:
    """The objects of a packaged YAML file (its empty documents left out)."""
    return [d for d in yaml.safe_load_all(resource.read_text(encoding="utf-8")) if isinstance(d, dict)]


def crd() -> dict[str, Any]:
    """The DeviceQuota CustomResourceDefinition."""
    (definition,) = documents(files(__name__) / "devicequota.yaml")
    return definition


def crds() -> list[dict[str, Any]]:
    """Every CustomResourceDefinition `serve` needs: DeviceQuota's, ClusterDeviceQuota's and
    AppliedClusterDeviceQuota's (a team's numbers in each member namespace)."""
    return [crd(), *documents(files(__name__) / "clusterdevicequota.yaml"),
            *documents(files(__name__) / "appliedclusterdevicequota.yaml")]


def webhook_configurations() -> list[dict[str, Any]]:
    """The shipped webhook configurations, as deploy/manifests/webhooks.yaml has them."""
    return documents(files(__name__) / "webhooks.yaml")


def tenant_view_role() -> dict[str, Any]:
    """The ClusterRole aggregated into view, edit and admin that lets tenants read their quotas."""
    (role,) = documents(files(__name__) / "tenant-view.yaml")
    return role
