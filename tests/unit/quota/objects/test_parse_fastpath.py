"""The claims' parse reads each field once and checks a name it has checked before by a
table look-up (`quota.values.meta.parse_meta`, `quota.objects.claims`' allocation results), and a
slice's devices take their plain capacities and string attributes by a shorter path
(`quota.objects.slices`): each must answer exactly as the field rules do, the same value or the
same error, the first time a name or value is seen and every time after.

The references below are the field-by-field reading the fast paths replaced, kept here as
the oracle: random metadata and allocation results (valid names, names one rule away
from valid, values of the wrong type) are parsed both ways.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from quota.objects import claims as claims_module
from quota.objects import slices as slices_module
from quota.objects.claims import AllocatedDevice, parse_claim
from quota.objects.claimspec import ClaimError, parse_capacities
from quota.objects.slices import SliceError
from quota.values import meta as meta_module
from quota.values.interning import Interned
from quota.values.meta import parse_meta
from quota.values.model import DeviceKey
from quota.values.raw import show
from quota.values.validation import dns_label, dns_subdomain, optional_string, pool_name, string

from ...builders import exactly, make_claim, request

EXAMPLES = 300


def reference_meta(obj: dict[str, Any], kind: str, *, namespaced: bool) -> tuple[str, str, str, Any, Any]:
    """What `parse_meta` read before its fast path (generateName aside: unchanged)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ClaimError(f"{kind}: metadata must be a map")
    validate = dns_label if kind == "Namespace" else dns_subdomain
    name = validate(meta.get("name"), f"{kind}: metadata.name", ClaimError)
    where = f"{kind} {name}"
    namespace = ""
    if namespaced:
        raw = meta.get("namespace")
        namespace = "default" if raw in (None, "") else dns_label(raw, f"{where}: metadata.namespace", ClaimError)
    uid = optional_string(meta.get("uid"), f"{where}: metadata.uid", ClaimError, max_length=128)
    labels = meta_module._labels(meta.get("labels"), f"{where}: metadata.labels", ClaimError)
    annotations = meta_module._string_map(meta.get("annotations"), f"{where}: metadata.annotations", ClaimError)
    if sum(map(len, annotations)) + sum(map(len, annotations.values())) > 256 * 1024:
        raise ClaimError(f"{where}: metadata.annotations: may not be larger than {256 * 1024} bytes")
    return name, namespace, uid, labels, annotations


def reference_result(res: dict[str, Any], where: str) -> AllocatedDevice:
    """What an allocation result read before its names were checked once and held."""
    key = DeviceKey(dns_subdomain(res.get("driver"), f"{where}.driver", ClaimError, max_length=63),
                    pool_name(res.get("pool"), f"{where}.pool", ClaimError),
                    dns_label(res.get("device"), f"{where}.device", ClaimError))
    admin, share = res.get("adminAccess"), res.get("shareID")
    if admin is not None and type(admin) is not bool:
        raise ClaimError(f"{where}.adminAccess must be a boolean, got {show(admin)}")
    return AllocatedDevice(
        request=string(res.get("request"), f"{where}.request", ClaimError, max_length=127),
        key=key, admin_access=admin is True,
        share_id=None if share is None else string(share, f"{where}.shareID", ClaimError, max_length=36),
        consumed_capacity=parse_capacities(res.get("consumedCapacity"), f"{where}.consumedCapacity"))


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except ClaimError as e:
        return "error", str(e)


# Names near the rules' edges: valid ones, one character or one type away, too long.
names = st.one_of(
    st.sampled_from(["gpu-0", "a", "node-1", "team-a", "a.b", "a/b", "default", "x" * 63, "x" * 64, "y" * 253,
                     "y" * 254, "", "-a", "a-", "A", "a_b", "a..b", "/a", "a//b", "ä", "a\n"]),
    st.from_regex(r"[a-z0-9][-a-z0-9.]{0,8}[a-z0-9]", fullmatch=True),
    st.text(alphabet="ab-./_A1", max_size=12),
    st.none(), st.integers(-2, 2), st.booleans(), st.just({}), st.just(["a"]),
)
strings = st.one_of(st.none(), st.text(max_size=6), st.integers(0, 3), st.just("u" * 129), st.just("u" * 128))
string_maps: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.just([]), st.just("a"),
    st.dictionaries(st.sampled_from(["a", "app", "x/y", "draquota.io/charge", "Bad Key", ""]),
                    st.one_of(st.text(alphabet="ab-_.", max_size=5), st.integers(0, 1), st.none()), max_size=3),
)


def fresh_tables() -> None:
    """Empty the checked-names tables, so a parse may take either path."""
    meta_module._namespaces = Interned(meta_module._namespaces.limit)
    for table in ("_drivers", "_pools", "_devices", "_results"):
        setattr(claims_module, table, Interned(getattr(claims_module, table).limit))


@settings(max_examples=EXAMPLES, deadline=None)
@given(name=names, namespace=names, uid=strings, labels=string_maps, annotations=string_maps,
       kind=st.sampled_from(["ResourceClaim", "Namespace", "DeviceClass"]), namespaced=st.booleans())
def test_metadata_reads_as_the_field_rules_say(name: Any, namespace: Any, uid: Any, labels: Any, annotations: Any,
                                              kind: str, namespaced: bool) -> None:
    meta = {k: v for k, v in (("name", name), ("namespace", namespace), ("uid", uid), ("labels", labels),
                              ("annotations", annotations)) if v is not None}
    expected = outcome(reference_meta, {"metadata": meta}, kind, namespaced=namespaced)
    fresh_tables()
    for _ in range(2):  # the first time a namespace is seen, and once it is held
        got = outcome(parse_meta, {"metadata": meta}, kind, ClaimError, namespaced=namespaced)
        if got[0] == "ok":
            m = got[1]
            got = ("ok", (m.name, m.namespace, m.uid, m.labels, m.annotations))
        assert got == expected


results = st.fixed_dictionaries({}, optional={
    "request": names, "driver": names, "pool": names, "device": names,
    "adminAccess": st.one_of(st.booleans(), st.just(1)), "shareID": strings,
})


@settings(max_examples=EXAMPLES, deadline=None)
@given(devices=st.lists(results, min_size=1, max_size=3))
# One text, valid in one field and not in the other: each field's rule holds it apart.
@example(devices=[{"request": "a.b", "driver": "a.b", "pool": "a.b", "device": "a.b"}])
@example(devices=[{"request": "r", "driver": "d", "pool": "x" * 64, "device": "g"},
                  {"request": "r", "driver": "x" * 64, "pool": "p", "device": "g"}])
def test_allocation_results_read_as_the_field_rules_say(devices: list[dict[str, Any]]) -> None:
    expected = outcome(lambda: tuple(reference_result(r, f"status.allocation.devices.results[{i}]")
                                     for i, r in enumerate(devices)))
    fresh_tables()
    for _ in range(2):  # each name checked, then held
        got = outcome(claims_module._allocation, {"devices": {"results": devices}})
        assert got == expected
        if got[0] == "ok":
            # Held once: the same names parse into the same objects.
            again = claims_module._allocation({"devices": {"results": devices}})
            assert again is not None and all(a.key.pool is b.key.pool for a, b in zip(again, got[1], strict=True))


def test_a_claim_parses_the_same_the_second_time() -> None:
    """Its namespace and its results' names held after the first parse: an equal claim."""
    fresh_tables()
    obj = make_claim("c", request("gpu", exactly("gpu.example.com")), namespace="team-z",
                     allocation=[{"request": "gpu", "driver": "gpu.example.com", "pool": "node-9", "device": "gpu-3"}])
    first, again = parse_claim(obj), parse_claim(obj)
    assert first == again and first.allocation is not None and again.allocation is not None
    assert first.namespace is again.namespace and first.allocation[0].key.pool is again.allocation[0].key.pool


quantities = st.one_of(st.sampled_from(["80Gi", "0", "1", "-1", "1.5Gi", "8Ei", "x", "", "1e3"]), st.integers(-1, 2),
                       st.none())
capacities = st.dictionaries(
    st.sampled_from(["memory", "gpu.example.com/memory", "cores", "Bad Name"]),
    st.one_of(st.fixed_dictionaries({"value": quantities}),
              st.fixed_dictionaries({"value": quantities, "requestPolicy": st.just({"default": "1Gi"})}),
              st.just({}), st.just(1)),
    max_size=3)
attribute_values = st.one_of(
    st.fixed_dictionaries({"string": st.one_of(st.text(max_size=4), st.just("s" * 65), st.integers(0, 1))}),
    st.fixed_dictionaries({"int": st.integers(-2, 2)}), st.fixed_dictionaries({"bool": st.booleans()}),
    st.fixed_dictionaries({"string": st.just("a"), "int": st.just(1)}), st.just({}), st.just("a"))
attributes = st.dictionaries(st.sampled_from(["model", "gpu.example.com/uuid", "Bad Name"]), attribute_values,
                             max_size=3)


def reference_attributes(raw: dict[str, Any], driver: str) -> dict[str, dict[str, Any]]:
    """Every attribute through `_attribute`, as before its string case was read inline."""
    out: dict[str, dict[str, Any]] = {}
    for qualified, value in raw.items():
        domain, ident = slices_module._check_name(qualified, "device.attributes")
        try:
            parsed = slices_module._attribute(value)
        except SliceError as err:
            raise SliceError(f"device.attributes[{qualified!r}]: {err}") from None
        out.setdefault(domain or driver, {})[ident] = parsed
    return out


def slice_outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args, **kwargs)
    except SliceError as e:
        return "error", str(e)


class _Unkept(dict[str, Any]):
    """A table that keeps nothing: every capacity parsed the long way."""

    def __setitem__(self, key: str, value: Any) -> None:
        pass


@settings(max_examples=EXAMPLES, deadline=None)
@given(raw=capacities, shared=st.booleans())
# One text with a policy and without: only the one without is a plain capacity.
@example(raw={"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}, "cores": {"value": "80Gi"}},
         shared=True)
def test_device_capacities_read_the_same_the_first_time_and_after(raw: dict[str, Any], shared: bool) -> None:
    """A capacity of a value alone is taken from the table of those seen before: the same
    value (and the same object) as parsing it the long way, errors unchanged."""
    kept = slices_module._PLAIN_CAPACITIES
    try:
        slices_module._PLAIN_CAPACITIES = _Unkept()
        expected = slice_outcome(slices_module._capacities, raw, "d", "device", shared=shared)
    finally:
        slices_module._PLAIN_CAPACITIES = kept
    kept.clear()
    for _ in range(2):  # each value parsed, then taken from the table
        got = slice_outcome(slices_module._capacities, raw, "d", "device", shared=shared)
        assert got == expected
        if got[0] == "ok":
            assert all(a is b for domain, inner in got[1].items() for a, b in
                       zip(inner.values(), expected[1][domain].values(), strict=True))


@settings(max_examples=EXAMPLES, deadline=None)
@given(raw=attributes)
def test_device_attributes_read_as_each_attribute_does(raw: dict[str, Any]) -> None:
    got, expected = (slice_outcome(slices_module._attributes, raw, "d", "device"),
                     slice_outcome(reference_attributes, raw, "d"))
    if got[0] == "ok" and expected[0] == "ok":
        assert got[1] == {k: v for k, v in expected[1].items() if v}
    else:
        assert got == expected
