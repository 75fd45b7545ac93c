"""Object envelopes: apiVersion and metadata, read the way the API server validates them.

Neighbours: every parser (`quota.objects.slices`, `quota.objects.claims`, `quota.quotas.devicequota`) starts
with `parse_meta`, and the DeviceQuota and Namespace parsers with `require_version`
(the resource.k8s.io kinds check theirs in `quota.objects.conversion`, which also reads
v1beta1 and v1beta2); `quota.reports.check` also parses Namespaces here. An object whose
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
from typing import Any, cast

from quota.values.interning import Interned
from quota.values.raw import show
from quota.values.validation import dns_label, dns_subdomain, is_dns_label, is_dns_subdomain, optional_string, string

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

# The only versions of these kinds this release reads (resource.k8s.io: quota.objects.conversion).
API_VERSIONS = {
    "DeviceQuota": "draquota.io/v1alpha1",
    "ClusterDeviceQuota": "draquota.io/v1alpha1",
    "Namespace": "v1",
}
_TOTAL_ANNOTATIONS = 256 * 1024  # TotalAnnotationSizeLimitB
# IsQualifiedName (label keys) and IsValidLabelValue: util/validation/validation.go.
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# Namespaces checked already, each held once: a list brings thousands of objects per
# namespace. Bounded (`quota.values.interning`): past the limit a namespace is checked each time.
_namespaces: Interned[str] = Interned(65536)
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
    """metadata, checked: name (or generateName when allowed), namespace, uid, labels, annotations.

    Each field checked as it is read, and the message naming it built only when the
    check fails: every claim a list brings comes through here (150,000 at start)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise error(f"{kind}: metadata must be a map, got {show(meta)}")
    raw_name = meta.get("name")
    if raw_name is None and generate_name and meta.get("generateName") is not None:
        name = string(meta["generateName"], f"{kind}: metadata.generateName", error)
        # ValidateObjectMeta checks generateName as a name prefix: a trailing '-' is fine.
        dns_subdomain(name.rstrip("-"), f"{kind}: metadata.generateName", error)
    elif is_dns_label(raw_name) if kind == "Namespace" else is_dns_subdomain(raw_name):
        name = cast(str, raw_name)
    else:
        validate = dns_label if kind == "Namespace" else dns_subdomain
        name = validate(raw_name, f"{kind}: metadata.name", error)
    namespace = ""
    if namespaced:
        raw_namespace = meta.get("namespace")
        held = _namespaces.held(raw_namespace) if type(raw_namespace) is str else None
        if held is not None:
            namespace = held
        elif raw_namespace in (None, ""):
            namespace = "default"
        else:
            namespace = _namespaces(dns_label(raw_namespace, f"{kind} {name}: metadata.namespace", error))
    uid = meta.get("uid")
    if type(uid) is not str or len(uid) > 128:
        uid = optional_string(uid, f"{kind} {name}: metadata.uid", error, max_length=128)
    labels = meta.get("labels")
    return ObjectMeta(
        name=name,
        namespace=namespace,
        uid=uid,
        labels={} if labels is None else _labels(labels, f"{kind} {name}: metadata.labels", error),
        annotations=_annotations(meta.get("annotations"), kind, name, error),
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


def _annotations(raw: Any, kind: str, name: str, error: type[Exception]) -> dict[str, str]:
    """A string map of at most `_TOTAL_ANNOTATIONS` bytes, checked in one pass (`_string_map`
    names what fails)."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        size = 0
        for key, value in raw.items():
            if type(key) is not str or type(value) is not str:
                break
            size += len(key) + len(value)
        else:
            if size <= _TOTAL_ANNOTATIONS:
                return raw
    where = f"{kind} {name}: metadata.annotations"
    annotations = _string_map(raw, where, error)
    if sum(map(len, annotations)) + sum(map(len, annotations.values())) > _TOTAL_ANNOTATIONS:
        raise error(f"{where}: may not be larger than {_TOTAL_ANNOTATIONS} bytes")
    return annotations
