"""Extended resources backed by DRA: the ResourceClaim the scheduler makes for a Pod's request.

Neighbours: `webhook.pods` builds the claim here at Pod CREATE and prices it through
`quota.admission.admitter.Admitter.fit` (nothing is reserved: the scheduler's own claim CREATE is
admitted by `webhook.claimreview` like any other claim); `quota.objects.claims` parses the
DeviceClasses whose `extendedResourceName` this reads. Pure.

What the 1.37 scheduler does (k/k pkg/scheduler/framework/plugins/dynamicresources/
extendeddynamicresources.go): a container request for a resource that a DeviceClass maps
(`spec.extendedResourceName`, or the implicit `deviceclass.resource.kubernetes.io/<class>`
every class has; k8s.io/dynamic-resource-allocation deviceclass/extendedresourcecache)
becomes, on a node that does not offer it through a device plugin, one `exactly` request
per container, named `container-<i>-request-<j>` (i: the container's index in init
containers then containers, j: the resource's index in the container's sorted request
names), ExactCount, `count` = the container's request. Init containers that are not
sidecars run before the others and reuse what later long-lived containers request: only
the largest shortfall among them is requested again (createRequestsAndMappings). All of
it goes in one claim per Pod, generateName `<pod>-extended-resources-`, the Pod as its
controlling owner, annotation `resource.kubernetes.io/extended-resource-claim: "true"`.
This module rebuilds that claim the same way, so the Pod warning prices what the
scheduler will ask for.

A Pod may have 1,024 containers here (`_MAX_CONTAINERS`) and each container any number
of resources: reading them has a pause point per container and per few resources
(`quota.values.work`), so a sliced review (`webhook.pods`) gives the event loop back however
large the Pod. The claim is built only up to the API server's limit of requests a
ResourceClaim may have (`TooManyRequests`): past it, the scheduler's create is refused
whatever the quota says, and there is nothing to price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quota.objects.claims import Claim
from quota.objects.claimspec import ClaimSpec, DeviceRequirement, Request
from quota.values.meta import parse_meta
from quota.values.model import ClaimUid, DeviceClass, DeviceClassName, Namespace
from quota.values.quantity import non_negative_amount
from quota.values.raw import as_list, as_map, show
from quota.values.validation import MAX_DEVICE_REQUESTS, MAX_INT64
from quota.values.work import paced, pause_point

__all__ = [
    "CLASS_PREFIX",
    "EXTENDED_CLAIM_ANNOTATION",
    "ExtendedClaim",
    "PodError",
    "TooManyRequests",
    "attempt_series",
    "device_class_for",
    "extended_claim",
    "generated_base",
    "in_series",
    "is_dra_extended_resource",
]

# TYPES: ResourceDeviceClassPrefix and ExtendedResourceClaimAnnotation.
CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# ValidatePodSpec has no limit on containers; this bounds what one review may cost.
_MAX_CONTAINERS = 1024
# apiserver names.SimpleNameGenerator: the base is cut to 58 characters, 5 random follow.
_GENERATED_BASE = 58
_GENERATED_SUFFIX = 5
# Resources of one container read between two pause points (each a few microseconds).
_PAUSE_RESOURCES = 16


class TooManyRequests(ValueError):
    """The claim the scheduler would create has more requests than a ResourceClaim may have."""

    def __init__(self, resources: list[str]) -> None:
        self.resources = resources  # those that made it so many, in the scheduler's order
        super().__init__(f"its {', '.join(map(show, resources))} would take more than {MAX_DEVICE_REQUESTS} requests "
                         f"(one per container and resource), and a ResourceClaim may have at most "
                         f"{MAX_DEVICE_REQUESTS}: the API server refuses the scheduler's claim, and the Pod stays "
                         "Pending wherever these resources are not served by a device plugin")


class PodError(ValueError):
    """A Pod whose containers' resources cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """The claim the scheduler would create, and what it maps: (resource, class, devices)."""

    claim: Claim
    resources: tuple[tuple[str, DeviceClassName, int], ...]

    def describe(self) -> str:
        """`'example.com/gpu': 2 (DeviceClass gpu)`, for messages (names through `show`)."""
        return ", ".join(f"{show(r)}: {n} (DeviceClass {c})" for r, c, n in self.resources)


def is_dra_extended_resource(name: str) -> bool:
    """schedutil.IsDRAExtendedResourceName: an extended resource name, or the class prefix.

    v1helper.IsExtendedResourceName: not native (a name without '/' or in a
    kubernetes.io domain), not `requests.`-prefixed, and `requests.<name>` a qualified name.
    """
    if name.startswith(CLASS_PREFIX):
        return True
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, ident = f"requests.{name}".rpartition("/")
    return _k8s_qualified(prefix, ident)


def device_class_for(resource: str, classes: Mapping[DeviceClassName, DeviceClass]) -> DeviceClass | None:
    """The DeviceClass that serves extended resource `resource`, or None.

    The implicit name is unique by construction; an explicit one that several classes
    claim goes to the newest, ties to the lexically first name (extendedresourcecache
    updateResourceName2class: "we prefer the newer DeviceClass. The name serves as
    tie-breaker"). RFC 3339 timestamps from the API server sort as text.
    """
    if resource.startswith(CLASS_PREFIX):
        return classes.get(DeviceClassName(resource[len(CLASS_PREFIX):]))
    best: DeviceClass | None = None
    for cls in classes.values():
        if cls.extended_resource_name != resource:
            continue
        if best is None or cls.created > best.created or (cls.created == best.created and cls.name < best.name):
            best = cls
    return best


def attempt_series(claim: Mapping[str, Any]) -> str:
    """`<namespace>/<name base>` shared by every claim the scheduler makes for one Pod's
    extended resources, "" for any other claim.

    One Pod has at most one such claim at a time: the scheduler makes a new one only when
    it finds none (findExtendedResourceClaim), and deletes the one it made when the
    attempt fails (unreserveExtendedResourceClaim). So an earlier attempt of the same
    series is dead or dying when the next one is created: one that another admission step
    refused after us (the in-tree ResourceQuota runs after the webhooks) was never
    persisted at all. Recognised by the scheduler's own marks: the annotation, the Pod as
    controlling owner, and generateName `<pod>-extended-resources-`. Who may claim a
    series is the caller's business (a tenant can write all three marks).
    """
    meta = claim.get("metadata") if isinstance(claim, dict) else None
    if not isinstance(meta, dict) or as_map(meta.get("annotations")).get(EXTENDED_CLAIM_ANNOTATION) != "true":
        return ""
    generate, namespace = meta.get("generateName"), meta.get("namespace")
    owners = meta.get("ownerReferences")
    if not isinstance(generate, str) or not isinstance(namespace, str) or not isinstance(owners, list):
        return ""
    pods = [o for o in owners if isinstance(o, dict) and o.get("controller") is True and o.get("kind") == "Pod"
            and o.get("apiVersion") == "v1" and isinstance(o.get("name"), str)]
    if len(pods) != 1 or generate != f"{pods[0]['name']}-extended-resources-":
        return ""
    return f"{namespace}/{generated_base(generate)}"


def generated_base(generate_name: str) -> str:
    """What of a `generateName` the API server keeps before the random suffix."""
    return generate_name[:_GENERATED_BASE]


def in_series(claim: str, series: str) -> bool:
    """Whether `claim` (`<namespace>/<name>`) was generated from `series`' base, or is named
    by that base itself: the one-write admission (`webhook.claimadmit`) sees a `generateName`
    create before the API server generated its name, and names its entry by the base."""
    return claim.startswith(series) and len(claim) in (len(series), len(series) + _GENERATED_SUFFIX)


def extended_claim(pod: Mapping[str, Any], classes: Mapping[DeviceClassName, DeviceClass]) -> ExtendedClaim | None:
    """The claim the scheduler creates for `pod`'s DRA-backed extended resources, None if none.

    Assumes the node offers none of them through a device plugin (then the scheduler
    asks DRA for them all), which is what a DeviceClass mapping is for. Raises
    `TooManyRequests` as soon as the claim would pass the API server's limit.
    """
    if not isinstance(pod, dict):
        raise PodError("a Pod must be an object")
    meta = parse_meta(pod, "Pod", PodError, namespaced=True, generate_name=True)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise PodError("spec must be an object")
    inits = as_list(spec.get("initContainers"), "spec.initContainers", PodError)
    regular = as_list(spec.get("containers"), "spec.containers", PodError)
    if len(inits) + len(regular) > _MAX_CONTAINERS:
        raise PodError(f"spec: more than {_MAX_CONTAINERS} containers")
    containers = [_container(c, f"spec.initContainers[{i}]", init=True) for i, c in paced(enumerate(inits), 1)]
    containers += [_container(c, f"spec.containers[{i}]", init=False) for i, c in paced(enumerate(regular), 1)]

    wanted = sorted({r for c in containers for r in c.extended})
    requests: list[DeviceRequirement] = []
    resources: list[tuple[str, DeviceClassName, int]] = []
    for resource in wanted:
        cls = device_class_for(resource, classes)
        if cls is None:
            continue  # served by a device plugin, or by nothing: not ours to price
        mine = _requests_for(containers, resource=resource, cls=cls.name)
        if mine:
            requests.extend(mine)
            resources.append((resource, cls.name, sum(r.count for r in mine)))
            if len(requests) > MAX_DEVICE_REQUESTS:
                raise TooManyRequests([r for r, _, _ in resources])
    if not requests:
        return None
    spec_out = ClaimSpec(tuple(Request(r.name, (r,)) for r in sorted(requests, key=lambda r: r.name)))
    claim = Claim(kind="ResourceClaim", namespace=Namespace(meta.namespace),
                  name=f"{meta.name}-extended-resources-", uid=ClaimUid(""), spec=spec_out)
    return ExtendedClaim(claim, tuple(resources))


@dataclass(frozen=True, slots=True)
class _Container:
    names: tuple[str, ...]  # every request name, sorted: the scheduler's request index
    extended: Mapping[str, int]  # DRA extended resources with a whole, non-zero request
    short_lived: bool  # an init container that is not a sidecar


def _container(raw: Any, where: str, *, init: bool) -> _Container:
    if not isinstance(raw, dict):
        raise PodError(f"{where} must be an object")
    resources = raw.get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise PodError(f"{where}.resources must be an object, got {show(resources)}")
    # Pod defaulting copies each limit missing from requests into requests
    # (SetDefaults_Pod) before admission; merged here as well for an undefaulted object.
    merged: dict[str, Any] = {}
    for field in ("limits", "requests"):
        values = (resources or {}).get(field)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise PodError(f"{where}.resources.{field} must be a map of resource name to quantity")
        merged.update(values)
    extended: dict[str, int] = {}
    for name, value in paced(merged.items(), _PAUSE_RESOURCES):
        if not isinstance(name, str):
            raise PodError(f"{where}.resources: resource name {show(name)} must be a string")
        if not is_dra_extended_resource(name):
            continue
        amount = non_negative_amount(value, f"{where}.resources.requests[{show(name)}]", PodError)
        # Quantity.AsInt64: a fractional request is not one (the API server refuses those).
        if amount.denominator == 1 and 0 < amount <= MAX_INT64:
            extended[name] = int(amount)
    sidecar = raw.get("restartPolicy") == "Always"
    return _Container(tuple(sorted(n for n in merged if isinstance(n, str))), extended, init and not sidecar)


def _requests_for(containers: list[_Container], *, resource: str, cls: DeviceClassName) -> list[DeviceRequirement]:
    """createRequestsAndMappings for one resource: one request per long-lived container,
    plus the largest shortfall of the short-lived ones after what they can reuse."""
    long_lived: list[DeviceRequirement | None] = [None] * len(containers)
    for i, c in paced(enumerate(containers), _PAUSE_RESOURCES):
        if not c.short_lived:
            long_lived[i] = _request(i, c, resource=resource, cls=cls, reusable=[])
    largest: DeviceRequirement | None = None
    for i, c in enumerate(containers):
        pause_point()  # what it may reuse is a walk over the containers after it
        if c.short_lived:
            # Reusable: the long-lived requests at this index and after (the scheduler's
            # longLivedResourceRequests[i:]).
            own = _request(i, c, resource=resource, cls=cls, reusable=[r for r in long_lived[i:] if r is not None])
            if own is not None and (largest is None or largest.count < own.count):
                largest = own
    return [*([largest] if largest is not None else []), *(r for r in long_lived if r is not None)]


def _request(index: int, c: _Container, *, resource: str, cls: DeviceClassName,
             reusable: list[DeviceRequirement]) -> DeviceRequirement | None:
    wanted = c.extended.get(resource, 0)
    if wanted == 0:
        return None
    reused = 0
    for r in reusable:
        reused += r.count
        if reused >= wanted:
            return None
    return DeviceRequirement(name=f"container-{index}-request-{c.names.index(resource)}", device_class=cls,
                             count=wanted - reused)


_LABEL_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


def _k8s_qualified(prefix: str, name: str) -> bool:
    """apimachinery IsQualifiedName (label-key rules), not DRA's C-identifier QualifiedName."""
    if not 0 < len(name) <= 63 or not set(name) <= _NAME_CHARS or not (name[0].isalnum() and name[-1].isalnum()):
        return False
    labels = prefix.split(".")
    return (0 < len(prefix) <= 253 and set(prefix) <= _LABEL_PREFIX_CHARS
            and all(p and p[0].isalnum() and p[-1].isalnum() for p in labels))

