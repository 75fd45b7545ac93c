"""Fuzzing the parsers and the admission path: bad input gets our own error, never a crash.

Random JSON values are spliced into valid objects at random places; every outcome must
be a successful parse or SliceError/ClaimError/QuotaError, and a claim that parses is
always priced and decided without an exception.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.admission import Admitter
from quota.claims import ClaimError, parse_claim
from quota.devicequota import QuotaError, parse_device_quota
from quota.inventory import Inventory
from quota.ledger import Ledger
from quota.pricing import Pricer
from quota.slices import SliceError

from .builders import exactly, first_available, make_claim, make_device, make_quota, make_slice, request, result
from .test_pricing import CLASSES, inventory

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


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

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.data(), json_values)
def test_slices(data: st.DataObject, value: Any) -> None:
    raw = copy.deepcopy(SLICE)
    raw = splice(raw, data.draw(st.sampled_from(paths(raw))), value)
    try:
        Inventory().add_or_update_slice(raw)
    except SliceError as err:
        assert str(err)


@FUZZ
@given(st.data(), json_values)
def test_quotas(data: st.DataObject, value: Any) -> None:
    raw = copy.deepcopy(QUOTA)
    raw = splice(raw, data.draw(st.sampled_from(paths(raw))), value)
    try:
        parse_device_quota(raw)
    except QuotaError as err:
        assert str(err)


ADMITTER_INVENTORY = inventory()


@FUZZ
@given(st.data(), json_values)
def test_claims_are_parsed_or_refused_and_always_decided(data: st.DataObject, value: Any) -> None:
    raw = copy.deepcopy(CLAIM)
    raw = splice(raw, data.draw(st.sampled_from(paths(raw))), value)
    try:
        claim = parse_claim(raw)
    except ClaimError as err:
        assert str(err)
        return
    admitter = Admitter(Pricer(ADMITTER_INVENTORY, CLASSES), Ledger())
    admitter.ledger.add_or_update_quota(parse_device_quota(QUOTA))
    if claim.allocation is not None:
        assert admitter.account_allocated(claim).allowed
    else:
        decision = admitter.admit_claim(claim, namespace_labels={})
        assert decision.allowed or decision.reason
