"""Fuzzing the parsers and the admission path: bad input gets our own error, never a crash.

Random JSON values, and hostile ones (4,400-digit integers, deep nesting, wrong types,
negative quantities, control characters, lone surrogates), are spliced into valid
objects at random places (also in the resource.k8s.io/v1beta1 and v1beta2 shapes, which
`quota.objects.conversion` reads as v1); every outcome must be a successful parse or
SliceError/ClaimError/QuotaError/NamespaceError, within `bounded()`'s time and memory;
a claim that parses is always priced and decided, its charge never negative, and an
admission never takes a quota's usage over `hard`. DRA_QUOTA_FUZZ_EXAMPLES sets the
number of examples per test (bench/ runs a long one).
"""

from __future__ import annotations

import copy
from typing import Any, TypedDict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim
from quota.objects.claimspec import ClaimError
from quota.objects.slices import SliceError
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import QuotaError, parse_device_quota
from quota.values.meta import NamespaceError, parse_namespace

from ...betas import downgrade
from ...bounds import bounded, fuzz_examples
from ...builders import exactly, first_available, make_claim, make_device, make_quota, make_slice, request, result
from ..pricing.test_pricer import CLASSES, inventory

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


HOSTILE_TEXT = ["\n", "\x1b[31m", "\u202e", "\ud800", "\x00", "-", "1" * 4301, "\u0661"]
hostile_values = st.one_of(
    st.sampled_from([10**4400, -(10**4400), 2**63, -(2**63) - 1, -1, 0, 2**63 - 1, True, 1.5, float("inf")]),
    st.builds(nested, st.integers(50, 3000)),
    st.sampled_from(["-500Gi", "-1", "1" * 4301 + "Gi", "1e99999", "9" * 20 + "Ei", "0.0000000001", "8Ei"]),
    st.lists(st.sampled_from(HOSTILE_TEXT), min_size=1, max_size=4).map("".join),
    st.text(alphabet=st.characters(codec=None, categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Ll")), max_size=20),
    st.dictionaries(st.integers(), st.integers(), min_size=1, max_size=2),
    st.lists(st.just({"name": "x"}), min_size=33, max_size=200),
)
values = json_values | hostile_values
EXAMPLES = fuzz_examples(150)


class _Bound(TypedDict):
    """`bounded()`'s keyword arguments, typed so `bounded(**BOUND)` is checked."""

    seconds: float
    megabytes: int


BOUND: _Bound = {"seconds": 10.0, "megabytes": 256}


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.extend(paths(value, (*prefix, key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out.extend(paths(value, (*prefix, i)))
    return out


def splice(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    target = obj
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return obj


SLICE = make_slice("s", [make_device("d", shared=True, policy={"default": "1Gi", "validValues": ["1Gi", "2Gi"]},
                                     taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])])
CLAIM = make_claim(
    "c",
    request("a", exactly("gpu", "device.driver == 'x'", count=2, capacity={"memory": "1Gi"},
                         tolerations=[{"key": "k", "operator": "Exists"}])),
    first_available("b", ("s", exactly("mig", mode="All"))),
    allocation=[result("a", "gpu-0", consumed={"memory": "1Gi"})],
    annotations={"draquota.io/charge": '{"memory": 1, "devices": 1}'},
)
QUOTA = make_quota("q", memory="1Gi", devices=2, classes=["gpu"], enforcement="Audit", pricing="Optimistic")

FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


NAMESPACE = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "team-a", "labels": {"resource.kubernetes.io/admin-access": "true"}}}


def spliced(base: dict[str, Any], data: st.DataObject, value: Any) -> Any:
    raw = copy.deepcopy(base)
    return splice(raw, data.draw(st.sampled_from(paths(raw))), value)


def assert_ours(err: ValueError) -> None:
    message = str(err)
    assert message and len(message) < 2000


@FUZZ
@given(st.data(), values)
def test_slices(data: st.DataObject, value: Any) -> None:
    raw = spliced(SLICE, data, value)
    with bounded(**BOUND):
        try:
            Inventory().add_or_update_slice(raw)
        except SliceError as err:
            assert_ours(err)


@FUZZ
@given(st.data(), values)
def test_quotas(data: st.DataObject, value: Any) -> None:
    raw = spliced(QUOTA, data, value)
    with bounded(**BOUND):
        try:
            quota = parse_device_quota(raw)
        except QuotaError as err:
            assert_ours(err)
            return
    assert all(v >= 0 for v in quota.hard.as_json().values())


@FUZZ
@given(st.data(), values)
def test_namespaces(data: st.DataObject, value: Any) -> None:
    raw = spliced(NAMESPACE, data, value)
    with bounded(**BOUND):
        try:
            parse_namespace(raw)
        except NamespaceError as err:
            assert_ours(err)


ADMITTER_INVENTORY = inventory()


# The seeds in the resource.k8s.io/v1beta1 (request fields inline, device fields under
# basic) and v1beta2 shapes: conversion to v1 (quota.objects.conversion) must give only our errors.
BETA_SEEDS = [downgrade(seed, version) for seed in (SLICE, CLAIM) for version in ("v1beta1", "v1beta2")]


@FUZZ
@given(st.data(), st.sampled_from(BETA_SEEDS), values)
def test_beta_versions_are_converted_or_refused(data: st.DataObject, seed: dict[str, Any], value: Any) -> None:
    raw = spliced(seed, data, value)
    with bounded(**BOUND):
        try:
            if seed["kind"] == "ResourceSlice":
                Inventory().add_or_update_slice(raw)
            else:
                claim = parse_claim(raw)
                Pricer(ADMITTER_INVENTORY, CLASSES).estimate(claim.spec)
        except (SliceError, ClaimError) as err:
            assert_ours(err)


ENFORCED = make_quota("hard", memory="100Gi", devices=3)


@FUZZ
@given(st.data(), values)
def test_claims_are_parsed_or_refused_and_always_decided(data: st.DataObject, value: Any) -> None:
    raw = spliced(CLAIM, data, value)
    with bounded(**BOUND):
        try:
            claim = parse_claim(raw)
        except ClaimError as err:
            assert_ours(err)
            return
        admitter = Admitter(Pricer(ADMITTER_INVENTORY, CLASSES), Ledger())
        for quota in (QUOTA, ENFORCED):
            admitter.ledger.add_or_update_quota(parse_device_quota(quota))
        if claim.allocation is not None:
            admission = admitter.account_allocated(claim)
            assert admission.allowed
        else:
            admission = admitter.admit_claim(claim, namespace_labels={"resource.kubernetes.io/admin-access": "true"})
            assert admission.allowed or admission.reason
    assert admission.charge.memory >= 0 and admission.charge.devices >= 0
    if not admission.allowed or claim.allocation is not None:
        return
    usage = admitter.ledger.usage(claim.namespace, "hard")
    hard = parse_device_quota(ENFORCED).hard
    total = usage.used + usage.reserved
    assert total.memory <= (hard.memory or 0) and total.devices <= (hard.devices or 0)
