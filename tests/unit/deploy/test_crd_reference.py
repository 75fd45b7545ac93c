"""What `kubectl explain` and `kubectl get` show of our CRDs: every field described, and a
default view that fits 120 columns (the rest under `-o wide`).

The e2e side (tests/e2e/test_devicequota_crd.py) measures the printed width with the real
kubectl; this one keeps the schemas from regressing without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CRDS = sorted((Path(__file__).resolve().parents[3] / "deploy" / "crds").glob("*.yaml"))
QUOTA_COLUMNS = ["Hard Memory", "Used Memory", "Reserved Memory", "Hard Devices", "Used Devices", "Exceeded"]
DEFAULT_COLUMNS = {
    "devicequota.yaml": QUOTA_COLUMNS,
    "clusterdevicequota.yaml": QUOTA_COLUMNS,
    # A tenant's copy of its team's budget: memory, headroom and this namespace's part.
    "appliedclusterdevicequota.yaml": ["Hard Memory", "Used Memory", "Reserved Memory", "Headroom", "NS Used",
                                       "NS Reserved", "Age"],
}


def undescribed(node: Any, path: str) -> Iterator[str]:
    # metadata is ObjectMeta, described by the API server: a CRD may give it nothing else.
    if not isinstance(node, dict) or path == ".metadata":
        return
    if "description" not in node:
        yield path or "(root)"
    for name, child in (node.get("properties") or {}).items():
        yield from undescribed(child, f"{path}.{name}")
    if "items" in node:
        yield from undescribed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from undescribed(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("crd", CRDS, ids=[c.name for c in CRDS])
def test_kubectl_explain_has_a_description_for_every_field(crd: Path) -> None:
    (version,) = yaml.safe_load(crd.read_text())["spec"]["versions"]
    assert list(undescribed(version["schema"]["openAPIV3Schema"], "")) == []


@pytest.mark.parametrize("crd", CRDS, ids=[c.name for c in CRDS])
def test_the_default_columns_leave_room_for_namespace_and_name(crd: Path) -> None:
    (version,) = yaml.safe_load(crd.read_text())["spec"]["versions"]
    default = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert default == DEFAULT_COLUMNS[crd.name]
    # kubectl pads columns with 3 spaces; values here are shorter than their headers
    # (282Gi, 8, True, 5m). NAMESPACE and NAME share what is left of 120 columns.
    width = sum(len(name) for name in default) + 3 * (len(default) + 1)
    assert 120 - width >= 30


# What a CRD's structural schema may hold; anything else is a field the API server drops
# (a flow-style `{description: Why, for a person.}` parses as a key "for a person.").
SCHEMA_KEYWORDS = {
    "type", "description", "properties", "items", "additionalProperties", "required", "maxLength", "minLength",
    "maxItems", "minItems", "maxProperties", "minProperties", "minimum", "maximum", "enum", "pattern", "format",
    "default", "nullable", "anyOf", "oneOf", "allOf", "not", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string", "x-kubernetes-validations", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-embedded-resource",
}


def unknown_keywords(node: Any, path: str) -> Iterator[str]:
    if not isinstance(node, dict):
        return
    yield from (f"{path}: {key}" for key in node if key not in SCHEMA_KEYWORDS)
    for name, child in (node.get("properties") or {}).items():
        yield from unknown_keywords(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from unknown_keywords(node[key], f"{path}[{key}]")


@pytest.mark.parametrize("crd", CRDS, ids=[c.name for c in CRDS])
def test_every_schema_key_is_a_keyword_the_api_server_keeps(crd: Path) -> None:
    (version,) = yaml.safe_load(crd.read_text())["spec"]["versions"]
    assert list(unknown_keywords(version["schema"]["openAPIV3Schema"], "")) == []
