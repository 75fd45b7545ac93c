"""quota.objects.extended: the claim the scheduler makes for a Pod's DRA-backed extended resources.

The request-building cases are those of k/k pkg/scheduler/framework/plugins/
dynamicresources/extendeddynamicresources_test.go (Test_createRequestsAndMappings_requests),
so the Pod warning prices exactly what the 1.37 scheduler will ask for.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.objects.claims import parse_device_class
from quota.objects.claimspec import ClaimError, DeviceRequirement
from quota.objects.extended import (
    PodError,
    TooManyRequests,
    attempt_series,
    device_class_for,
    extended_claim,
    in_series,
    is_dra_extended_resource,
)
from quota.values.model import DeviceClass, DeviceClassName

from ...bounds import bounded, fuzz_examples
from ...builders import make_class
from .test_fuzz_parsers import paths, splice, values

GPU = "example.com/gpu"


def cls(name: str, ext: str | None = None, created: str = "2026-11-01T00:00:00Z") -> DeviceClass:
    return DeviceClass(DeviceClassName(name), (), ext, created)


def classes(*items: DeviceClass) -> dict[DeviceClassName, DeviceClass]:
    return {c.name: c for c in items}


def container(name: str, requests: dict[str, str], *, limits: dict[str, str] | None = None,
              sidecar: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "pause", "resources": {"requests": requests}}
    if limits is not None:
        out["resources"]["limits"] = limits
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"}, "spec": spec}


def shape(requirements: list[DeviceRequirement]) -> list[tuple[str, str, int]]:
    return [(r.name, r.device_class, r.count) for r in requirements]


def requests_of(p: dict[str, Any], known: dict[DeviceClassName, DeviceClass]) -> list[tuple[str, str, int]]:
    made = extended_claim(p, known)
    if made is None:
        return []
    assert all(len(r.alternatives) == 1 and not r.first_available for r in made.claim.spec.requests)
    return shape([r.alternatives[0] for r in made.claim.spec.requests])


@pytest.mark.parametrize(("name", "expected"), [
    ("example.com/gpu", True),
    ("nvidia.com/gpu", True),
    ("deviceclass.resource.kubernetes.io/gpu", True),
    ("cpu", False), ("memory", False), ("ephemeral-storage", False), ("hugepages-2Mi", False),
    ("kubernetes.io/anything", False), ("storage.kubernetes.io/x", False),  # native: a kubernetes.io domain
    ("requests.example.com/gpu", False),
    ("example.com/bad name", False), ("Example.com/gpu", False), ("example.com/", False),
])
def test_which_names_are_dra_extended_resources(name: str, expected: bool) -> None:
    assert is_dra_extended_resource(name) is expected


def test_a_class_serves_its_extended_resource_name_and_the_implicit_one() -> None:
    known = classes(cls("gpu", GPU), cls("other"))
    assert device_class_for(GPU, known) == known[DeviceClassName("gpu")]
    assert device_class_for("deviceclass.resource.kubernetes.io/other", known) == known[DeviceClassName("other")]
    assert device_class_for("deviceclass.resource.kubernetes.io/nope", known) is None
    assert device_class_for("example.com/fpga", known) is None


def test_a_contested_name_goes_to_the_newest_class_then_the_first_name() -> None:
    old, new = cls("b-old", GPU, "2026-01-01T00:00:00Z"), cls("c-new", GPU, "2026-06-01T00:00:00Z")
    assert device_class_for(GPU, classes(old, new)).name == "c-new"  # type: ignore[union-attr]
    twin = cls("a-twin", GPU, "2026-06-01T00:00:00Z")
    assert device_class_for(GPU, classes(old, new, twin)).name == "a-twin"  # type: ignore[union-attr]


def test_device_classes_carry_their_extended_resource_name_and_creation_time() -> None:
    raw = make_class("gpu")
    raw["spec"]["extendedResourceName"] = GPU
    raw["metadata"]["creationTimestamp"] = "2026-11-23T18:30:00Z"
    parsed = parse_device_class(raw)
    assert (parsed.extended_resource_name, parsed.created) == (GPU, "2026-11-23T18:30:00Z")


# The scheduler's own cases (see the module docstring), "example.com/gpu" + suffixes.
MAPPED = classes(cls("class", GPU), cls("class1", GPU + "1"), cls("classInit", GPU + "init"))


def test_one_request_per_container_and_mapped_resource() -> None:
    one = pod(container("c0", {GPU: "1", GPU + "1": "2"}))
    assert requests_of(one, classes(cls("class", GPU))) == [("container-0-request-0", "class", 1)]
    assert requests_of(one, MAPPED) == [("container-0-request-0", "class", 1), ("container-0-request-1", "class1", 2)]
    two = pod(container("c0", {GPU: "1"}), container("c1", {GPU + "1": "2"}))
    assert requests_of(two, MAPPED) == [("container-0-request-0", "class", 1), ("container-1-request-0", "class1", 2)]


def test_the_request_index_counts_every_resource_of_the_container() -> None:
    # Sorted names: cpu, example.com/gpu, memory -> the GPU is request 1.
    mixed = pod(container("c0", {"memory": "1Gi", GPU: "3", "cpu": "1"}))
    assert requests_of(mixed, MAPPED) == [("container-0-request-1", "class", 3)]


def test_init_containers_ask_only_for_their_largest_shortfall() -> None:
    init_then_main = pod(container("main", {GPU: "1"}), init=(container("i0", {GPU + "init": "2"}),))
    assert requests_of(init_then_main, MAPPED) == [
        ("container-0-request-0", "classInit", 2), ("container-1-request-0", "class", 1)]
    two_inits = pod(container("main", {GPU: "1"}),
                    init=(container("i0", {GPU + "init": "1"}), container("i1", {GPU + "init": "2"})))
    assert requests_of(two_inits, MAPPED) == [
        ("container-1-request-0", "classInit", 2), ("container-2-request-0", "class", 1)]
    # A sidecar is long-lived: its devices are its own, and init containers before it reuse them.
    with_sidecar = pod(container("main", {GPU: "1"}), init=(
        container("i0", {GPU + "init": "1"}), container("side", {GPU + "init": "1"}, sidecar=True),
        container("i2", {GPU + "init": "2"})))
    assert requests_of(with_sidecar, MAPPED) == [
        ("container-1-request-0", "classInit", 1), ("container-2-request-0", "classInit", 2),
        ("container-3-request-0", "class", 1)]


def test_an_init_container_reuses_what_the_main_container_asks() -> None:
    reused = pod(container("main", {GPU: "2"}), init=(container("i0", {GPU: "3"}),))
    assert requests_of(reused, MAPPED) == [("container-0-request-0", "class", 1), ("container-1-request-0", "class", 2)]
    covered = pod(container("main", {GPU: "2"}), init=(container("i0", {GPU: "2"}),))
    assert requests_of(covered, MAPPED) == [("container-1-request-0", "class", 2)]


def test_the_claim_and_its_summary() -> None:
    made = extended_claim(pod(container("c0", {GPU: "2"}), container("c1", {GPU: "1"})), MAPPED)
    assert made is not None
    assert (made.claim.kind, made.claim.namespace, made.claim.name, made.claim.uid) == (
        "ResourceClaim", "team-a", "train-extended-resources-", "")
    assert made.resources == ((GPU, "class", 3),)
    assert made.describe() == "'example.com/gpu': 3 (DeviceClass class)"


@pytest.mark.parametrize("p", [
    pod(container("c0", {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "2Mi"})),
    pod(container("c0", {"example.com/fpga": "1"})),  # no class maps it: a device plugin's
    pod(container("c0", {GPU: "0"})),
    pod(container("c0", {GPU: "500m"})),  # not a whole number: not AsInt64, skipped
    pod(container("c0", {}), init=(container("i0", {}),)),
])
def test_no_claim_without_a_whole_mapped_request(p: dict[str, Any]) -> None:
    assert extended_claim(p, MAPPED) is None


def test_limits_stand_for_missing_requests() -> None:
    # The API server's defaulting copies limits into requests; an undefaulted object reads the same.
    undefaulted = pod(container("c0", {}, limits={GPU: "2"}))
    assert requests_of(undefaulted, MAPPED) == [("container-0-request-0", "class", 2)]


@pytest.mark.parametrize(("mangle", "field"), [
    (lambda p: p.update(spec=[]), "spec must be an object"),
    (lambda p: p["spec"].update(containers={}), "spec.containers must be a list"),
    (lambda p: p["spec"]["containers"][0].update(resources=[]), "spec.containers[0].resources must be an object"),
    (lambda p: p["spec"]["containers"][0]["resources"].update(requests={GPU: "-1"}), "must not be negative"),
    (lambda p: p["spec"]["containers"][0]["resources"].update(requests={GPU: "lots"}), "spec.containers[0]"),
    (lambda p: p["spec"].update(containers=[{"name": str(i)} for i in range(1025)]), "more than 1024 containers"),
])
def test_unreadable_pods_raise_pod_error_naming_the_field(mangle: Any, field: str) -> None:
    p = pod(container("c0", {GPU: "1"}))
    mangle(p)
    with pytest.raises(PodError, match=field.replace("[", r"\[").replace("]", r"\]")):
        extended_claim(p, MAPPED)


BASE = pod(container("c0", {GPU: "2", "cpu": "1"}, limits={GPU: "2"}),
           init=(container("i0", {GPU + "init": "1"}), container("s0", {GPU: "1"}, sidecar=True)))


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(st.data(), values)
def test_any_pod_is_read_or_refused_with_pod_error(data: st.DataObject, value: Any) -> None:
    raw = copy.deepcopy(BASE)
    raw = splice(raw, data.draw(st.sampled_from(paths(raw))), value)
    with bounded(seconds=10, megabytes=256):
        try:
            made = extended_claim(raw, MAPPED)
        except PodError as err:
            assert str(err) and len(str(err)) < 2000
            return
    if made is not None:
        assert all(r.alternatives[0].count > 0 for r in made.claim.spec.requests)


def scheduler_claim(pod_name: str = "train", **meta: Any) -> dict[str, Any]:
    """The claim as the scheduler creates it (createExtendedResourceClaimInAPI)."""
    base: dict[str, Any] = {
        "namespace": "team-a", "generateName": f"{pod_name}-extended-resources-",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": "p1", "controller": True}],
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
    }
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {**base, **meta}}


def test_the_schedulers_attempts_for_one_pod_form_a_series() -> None:
    series = attempt_series(scheduler_claim())
    assert series == "team-a/train-extended-resources-"
    assert in_series("team-a/train-extended-resources-x7k2q", series)
    assert not in_series("team-a/train-extended-resources-x7k2", series)
    assert not in_series("team-b/train-extended-resources-x7k2q", series)
    # The API server cuts a long base to 58 characters before the 5 random ones.
    long = "p" * 60
    cut = attempt_series(scheduler_claim(long))
    assert cut == f"team-a/{(long + '-extended-resources-')[:58]}"
    assert in_series(f"{cut}abcde", cut)


@pytest.mark.parametrize("meta", [
    {"annotations": {}},
    {"annotations": {"resource.kubernetes.io/extended-resource-claim": "false"}},
    {"generateName": "other-"},
    {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train", "uid": "p1"}]},  # not controller
    {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train", "controller": True}]},
    {"ownerReferences": "nonsense"},
])
def test_other_claims_have_no_series(meta: dict[str, Any]) -> None:
    assert attempt_series(scheduler_claim(**meta)) == ""


@pytest.mark.parametrize(("field", "value", "message"), [
    ("extendedResourceName", 5, "spec.extendedResourceName"),
    ("extendedResourceName", "x" * 254, "spec.extendedResourceName"),
    ("creationTimestamp", {"when": "now"}, "metadata.creationTimestamp"),
    ("creationTimestamp", "9" * 65, "metadata.creationTimestamp"),
])
def test_hostile_class_fields_are_refused_by_field(field: str, value: Any, message: str) -> None:
    raw = make_class("gpu")
    (raw["metadata"] if field == "creationTimestamp" else raw["spec"])[field] = value
    with pytest.raises(ClaimError, match=message):
        parse_device_class(raw)


@given(st.data(), values)
@settings(max_examples=fuzz_examples(150), deadline=None)
def test_any_claim_has_a_series_or_none_and_never_raises(data: st.DataObject, value: Any) -> None:
    raw = splice(scheduler_claim(), data.draw(st.sampled_from(paths(scheduler_claim()))), value)
    assert isinstance(attempt_series(raw), str)


def test_a_claim_past_the_requests_a_resourceclaim_may_have_is_not_built() -> None:
    """The API server refuses a ResourceClaim of more than 32 requests (DeviceRequestsMaxSize),
    the scheduler's too: past it there is nothing to price, and nothing more is built."""
    mapped = classes(cls("gpu", GPU), cls("fpga", "example.com/fpga"))
    assert len(requests_of(pod(*(container(f"c{i}", {GPU: "1"}) for i in range(32))), mapped)) == 32
    with pytest.raises(TooManyRequests, match=r"^its 'example\.com/gpu' would take more than 32 requests"):
        extended_claim(pod(*(container(f"c{i}", {GPU: "1"}) for i in range(33))), mapped)
    # Counted across resources: 17 containers of two each, the fpga's (sorted first) and the gpu's.
    with pytest.raises(TooManyRequests) as raised:
        extended_claim(pod(*(container(f"c{i}", {GPU: "1", "example.com/fpga": "1"}) for i in range(17))), mapped)
    assert raised.value.resources == ["example.com/fpga", GPU]
