"""quota.objects.jsonclaims and quota.objects.claims' memos: a spec parsed by its content (`parse_json_claim`)
and a recorded charge by its annotation read exactly as parsing them afresh would."""

from __future__ import annotations

import copy
import json
import marshal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.objects.claims import parse_claim
from quota.objects.claimspec import ClaimError, ClaimSpec
from quota.objects.jsonclaims import parse_json_claim
from quota.values.model import Charge

from ...builders import exactly, make_claim, request, result

H100 = "device.attributes['gpu.example.com'].model == 'h100'"


def gpu_claim(name: str = "c", **fields: Any) -> dict[str, Any]:
    obj = make_claim(name, request("gpu", exactly("gpu", H100)))
    obj["spec"]["devices"]["requests"][0]["exactly"].update(fields)
    return obj


@pytest.mark.parametrize("fields", [{}, {"count": 2}, {"allocationMode": "All"}, {"adminAccess": True},
                                    {"capacity": {"requests": {"memory": "10Gi"}}}])
def test_a_memoised_spec_is_the_spec_parsed_afresh(fields: dict[str, Any]) -> None:
    first = parse_json_claim(gpu_claim("a", **fields))
    again = parse_json_claim(gpu_claim("b", **copy.deepcopy(fields)))
    assert again.spec is first.spec  # the memo's
    assert again.spec == parse_claim(gpu_claim("b", **fields)).spec
    assert again.name == "b"


@pytest.mark.parametrize(("kept", "other"), [
    ({"count": 1}, {"count": True}),  # equal in Python, not in JSON: true is no integer
    ({"count": 1}, {"count": 1.0}),
    ({"adminAccess": True}, {"adminAccess": 1}),
])
def test_values_python_finds_equal_are_not_taken_for_each_other(kept: dict[str, Any], other: dict[str, Any]) -> None:
    parse_json_claim(gpu_claim(**kept))
    with pytest.raises(ClaimError):
        parse_json_claim(gpu_claim(**other))


def test_a_refused_spec_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(ClaimError, match="count must be at least 1"):
            parse_json_claim(gpu_claim(count=-1))


def test_keys_that_are_not_strings_are_never_read_from_the_memo() -> None:
    """YAML may decode a key true, which JSON text would write as "true": the memo's key
    tells them apart, and a key that is not a string is refused."""
    parse_json_claim(gpu_claim(capacity={"requests": {"true": "10Gi"}}))
    with pytest.raises(ClaimError, match="must be a string"):
        parse_json_claim(gpu_claim(capacity={"requests": {True: "10Gi"}}))
    with pytest.raises(ClaimError, match="must be a string"):
        parse_claim(gpu_claim(capacity={"requests": {True: "10Gi"}}))


def test_a_spec_is_hashed_once() -> None:
    """A spec is part of every memo key a claim is counted by: its requests are not hashed again."""
    hashed: list[int] = []

    class Counted:
        alternatives = ()  # a request with none: the spec reads its classes once too

        def __hash__(self) -> int:
            hashed.append(1)
            return 7

    spec = ClaimSpec((Counted(),))  # type: ignore[arg-type]
    assert hash(spec) == hash(spec) and len(hashed) == 1
    first, again = parse_json_claim(gpu_claim("a")).spec, parse_claim(gpu_claim("b")).spec
    assert first == again and hash(first) == hash(again) and first is not again


@pytest.mark.parametrize(("raw", "charge"), [
    ('{"memory":85899345920,"devices":1}', Charge(85899345920, 1)),
    ('{"memory":1,"devices":-1}', None),
    ('{"memory":1.0,"devices":1}', None),
    ("not json", None),
    ('{"memory":1,"devices":1}' + " " * 300, None),  # longer than ours ever is
])
def test_a_recorded_charge_reads_the_same_each_time(raw: str, charge: Charge | None) -> None:
    for name in ("a", "b"):
        assert parse_json_claim(make_claim(name, request("gpu", exactly("gpu")),
                                           annotations={"draquota.io/charge": raw})).recorded_charge == charge


def test_claims_decoded_apart_share_one_copy_of_their_namespace_kind_and_allocated_names() -> None:
    """A cache of 150,000 claims held a copy of each of these per claim, as decoded."""
    def decoded(name: str) -> Any:
        text = json.dumps(make_claim(name, request("gpu", exactly("gpu")), allocation=[result("gpu", "gpu-0")]))
        return parse_json_claim(json.loads(text))

    one, two = decoded("a"), decoded("b")
    assert one.namespace == two.namespace == "team-a" and one.namespace is two.namespace
    assert one.kind is two.kind
    assert one.allocation is not None and two.allocation is not None
    (first,), (second,) = one.allocation, two.allocation
    assert first == second
    for a, b in ((first.request, second.request), (first.key.driver, second.key.driver),
                 (first.key.pool, second.key.pool), (first.key.device, second.key.device)):
        assert a is b, a


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from([0.0, -0.0, 1.0, 1e300]) | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=500, deadline=None)
@given(a=json_values, b=json_values)
def test_the_memo_key_tells_apart_exactly_what_json_text_does(a: Any, b: Any) -> None:
    """Two decoded values share a memo key if and only if they have one JSON text (1, 1.0
    and true apart, key order kept), whatever objects they share inside."""
    def key(value: Any) -> bytes:
        return marshal.dumps(value, 0)  # as quota.objects.jsonclaims keys a spec

    assert (key(a) == key(b)) == (json.dumps(a) == json.dumps(b))
    shared = [a, a]
    assert key(shared) == key([copy.deepcopy(a), copy.deepcopy(a)])
