"""Object envelopes: apiVersion and metadata, read the way the API server validates them.

Neighbours: every parser (`quota.slices`, `quota.claims`, `quota.devicequota`) starts
with `parse_meta`, and the DeviceQuota and Namespace parsers with `require_version`
(the resource.k8s.io kinds check theirs in `quota.conversion`, which also reads
v1beta1 and v1beta2); `quota.check` also parses Namespaces here. An object whose
apiVersion we do not understand is refused by name and version rather than half-read.
A missing apiVersion is refused too: the API server never serves an object without
one, and guessing could read fields that are not there. Metadata rules follow
ValidateObjectMeta (staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go): names are DNS
subdomains (Namespaces: DNS labels), labels are qualified names with short values,
annotations are a string map of at most 256 KiB.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quota.raw import show
from quota.validation import dns_label, dns_subdomain, optional_string, string

__all__ = [
    "API_VERSIONS",
    "NamespaceError",
    "ObjectMeta",
    "NamespaceInfo",
    "require_version",
    "parse_meta",
    "parse_namespace",
    "is_label_key",
    "is_label_value",
]

# The only versions of these kinds this release reads (resource.k8s.io: quota.conversion).
API_VERSIONS = {
    "DeviceQuota": "draquota.io/v1alpha1",
    "ClusterDeviceQuota": "draquota.io/v1alpha1",
    "Namespace": "v1",
}
_TOTAL_ANNOTATIONS = 256 * 1024  # TotalAnnotationSizeLimitB
# IsQualifiedName (label keys) and IsValidLabelValue: util/validation/validation.go.
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_PREFIX = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")


class NamespaceError(ValueError):
    """A Namespace this tool cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    name: str
    namespace: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    name: str
    labels: Mapping[str, str]


def require_version(obj: Mapping[str, Any], kind: str, error: type[Exception]) -> None:
    """Refuse an object of `kind` whose apiVersion is not the one this tool reads."""
    if not isinstance(obj, dict):
        raise error(f"a {kind} must be an object, got {show(obj)}")
    expected = API_VERSIONS[kind]
    version = obj.get("apiVersion")
    if version != expected:
        got = "no apiVersion" if version is None else f"apiVersion {show(version)}"
        raise error(f"{kind} with {got} is not supported: dra-quota reads {kind} {expected} only")


def parse_meta(
    obj: Mapping[str, Any], kind: str, error: type[Exception], *, namespaced: bool, generate_name: bool = False
) -> ObjectMeta:
    """metadata, checked: name (or generateName when allowed), namespace, uid, labels, annotations."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise error(f"{kind}: metadata must be a map, got {show(meta)}")
    raw_name = meta.get("name")
    if raw_name is None and generate_name and meta.get("generateName") is not None:
        name = string(meta["generateName"], f"{kind}: metadata.generateName", error)
        # ValidateObjectMeta checks generateName as a name prefix: a trailing '-' is fine.
        dns_subdomain(name.rstrip("-"), f"{kind}: metadata.generateName", error)
    else:
        validate = dns_label if kind == "Namespace" else dns_subdomain
        name = validate(raw_name, f"{kind}: metadata.name", error)
    where = f"{kind} {name}"
    namespace = ""
    if namespaced:
        raw_namespace = meta.get("namespace")
        namespace = "default" if raw_namespace in (None, "") else dns_label(raw_namespace, f"{where}: metadata.namespace", error)
    return ObjectMeta(
        name=name,
        namespace=namespace,
        uid=optional_string(meta.get("uid"), f"{where}: metadata.uid", error, max_length=128),
        labels=_labels(meta.get("labels"), f"{where}: metadata.labels", error),
        annotations=_annotations(meta.get("annotations"), f"{where}: metadata.annotations", error),
    )


def parse_namespace(obj: Mapping[str, Any]) -> NamespaceInfo:
    """A core/v1 Namespace: only its name and labels matter here (the adminAccess label)."""
    require_version(obj, "Namespace", NamespaceError)
    meta = parse_meta(obj, "Namespace", NamespaceError, namespaced=False)
    return NamespaceInfo(meta.name, meta.labels)


def _string_map(raw: Any, where: str, error: type[Exception]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise error(f"{where} must be a map of strings, got {show(raw)}")
    for key, value in raw.items():
        if not isinstance(key, str):
            raise error(f"{where}: key {show(key)} must be a string")
        if not isinstance(value, str):
            raise error(f"{where}[{show(key)}] must be a string, got {show(value)}")
    return raw


def _labels(raw: Any, where: str, error: type[Exception]) -> dict[str, str]:
    labels = _string_map(raw, where, error)
    for key, value in labels.items():
        if not is_label_key(key):
            raise error(f"{where}: key {show(key)} is not a valid label key")
        if not is_label_value(value):
            raise error(f"{where}[{show(key)}]: {show(value)} is not a valid label value")
    return labels


def is_label_key(key: str) -> bool:
    """IsQualifiedName: `[prefix/]name`, name at most 63 characters, prefix a DNS subdomain."""
    prefix, sep, name = key.rpartition("/")
    return not (
        len(name) > 63
        or _LABEL_NAME.fullmatch(name) is None
        or (sep and (len(prefix) > 253 or _LABEL_PREFIX.fullmatch(prefix) is None))
    )


def is_label_value(value: str) -> bool:
    """IsValidLabelValue: empty, or at most 63 alphanumerics with `-_.` inside."""
    return len(value) <= 63 and (not value or _LABEL_NAME.fullmatch(value) is not None)


def _annotations(raw: Any, where: str, error: type[Exception]) -> dict[str, str]:
    annotations = _string_map(raw, where, error)
    if sum(map(len, annotations)) + sum(map(len, annotations.values())) > _TOTAL_ANNOTATIONS:
        raise error(f"{where}: may not be larger than {_TOTAL_ANNOTATIONS} bytes")
    return annotations
