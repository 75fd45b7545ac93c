"""`CompiledSelector.references` and `group_key`: which device paths a selector reads.

The pricing layer (quota.devices.selectors) evaluates one device per group of devices that
agree on the referenced paths, so the table pins the shapes that must resolve and the
ones that must give up (None), and the hypothesis test checks soundness: two devices
that agree on every referenced path (value or absence) get the same outcome. Paths
only tested for presence (`presence_only`) need agree on presence alone: a table and
the same property with their values redrawn.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from quota.cel import CelCompileError, CelRuntimeError, compile_selector
from quota.cel.activation import activation_error, device_activation, projected_activation, projection_of
from tests.unit.quota.cel.devices import activation, make_device

A = 'device.attributes["d1"]'

RESOLVED = [
    ("true", set()),
    ('device.driver == "d1"', {("driver",)}),
    ("device.allowMultipleAllocations", {("allowMultipleAllocations",)}),
    (f'{A}.type == "gpu"', {("attributes", "d1", "type")}),
    (f'{A}["type"] == "gpu"', {("attributes", "d1", "type")}),
    ('device.attributes.d1.type == "gpu"', {("attributes", "d1", "type")}),
    (f"has({A}.x)", {("attributes", "d1", "x")}),
    (f'"x" in {A}', {("attributes", "d1", "x")}),
    (f"{A}.?x.orValue(1) == 1", {("attributes", "d1", "x")}),
    (f'{A}[?"x"].hasValue()', {("attributes", "d1", "x")}),
    ('device.capacity["d1"].memory.compareTo(quantity("40Gi")) >= 0', {("capacity", "d1", "memory")}),
    (f"cel.bind(g, {A}, g.a && g.b)", {("attributes", "d1", "a"), ("attributes", "d1", "b")}),
    ("cel.bind(all, device.attributes, all.d2.z)", {("attributes", "d2", "z")}),
    (f"{A}.list.exists(v, v == 1)", {("attributes", "d1", "list")}),
    ("[1, 2].all(device, device > 0)", set()),  # a local named device shadows the variable
    (f'{A}.a || device.capacity["d2"].c.isInteger()', {("attributes", "d1", "a"), ("capacity", "d2", "c")}),
]

UNRESOLVED = [
    f"{A}.size() > 0",
    '"d1" in device.attributes',
    "has(device.attributes.d1)",
    f'{A}.exists(k, k == "x")',
    "device.attributes.all(d, d != \"\")",
    f'{A}["ty" + "pe"] == "gpu"',
    f"{A} == {{}}",
    f"cel.bind(g, {A}, g.size() == 1)",
    f'(true ? {A} : device.attributes["d2"]).x',
    "device.attributes.?d1.hasValue()",
    f"[{A}][0].x",
    f"{A}.all(k, v, v == 1)",
]


@pytest.mark.parametrize(("expression", "paths"), RESOLVED)
def test_resolved(expression: str, paths: set[tuple[str, ...]]) -> None:
    assert compile_selector(expression).references == frozenset(paths)


PRESENCE_ONLY = [
    (f"has({A}.x)", {("attributes", "d1", "x")}),
    (f'"x" in {A}', {("attributes", "d1", "x")}),
    ('has(device.capacity["d1"].mem)', {("capacity", "d1", "mem")}),
    (f"cel.bind(g, {A}, has(g.x) && !has(g.y))", {("attributes", "d1", "x"), ("attributes", "d1", "y")}),
    (f"has({A}.x) && {A}.x == 1", set()),  # also read by value
    (f'"x" in {A} || {A}.?x.hasValue()', set()),  # optional selection hands the value on
    (f"{A}.x == 1", set()),
    (f"has({A}.x) && {A}.size() > 1", set()),  # unresolved: nothing is presence-only
    ("has(device.driver)", set()),
]


@pytest.mark.parametrize(("expression", "paths"), PRESENCE_ONLY)
def test_presence_only(expression: str, paths: set[tuple[str, ...]]) -> None:
    selector = compile_selector(expression)
    assert selector.presence_only == frozenset(paths)
    assert selector.references is None or selector.presence_only <= selector.references


@pytest.mark.parametrize("expression", UNRESOLVED)
def test_unresolved(expression: str) -> None:
    assert compile_selector(expression).references is None


# --- soundness ------------------------------------------------------------------------

LEAVES = [
    f"{A}.a", f'{A}["b"]', 'device.attributes["d2"].a', 'device.capacity["d1"].mem', "device.driver",
    f"{A}.?a.orValue(0)", f'{A}[?"b"].orValue(false)', "1", '"x"', "true",
    'quantity("1Gi")', 'semver("1.0.0")', f"cel.bind(g, {A}, g.a)",
]
TESTS = [f"has({A}.a)", f'"b" in {A}', f"{A}.size() > 1", '"d2" in device.attributes',
         f'{A}.exists(k, k == "c")', "device.allowMultipleAllocations"]

# "v:1...": the API server's semver regex accepts it, CEL's parser refuses it (uint64).
values = st.sampled_from([None, 0, 1, 2, True, False, "x", "v:1.0.0", "v:2.0.0", [1, 2], ["v:1.0.0"],
                          "v:18446744073709551616.0.0"])


def _expr(depth: int) -> st.SearchStrategy[str]:
    leaf = st.sampled_from(LEAVES + TESTS)
    if depth == 0:
        return leaf
    sub = _expr(depth - 1)
    return st.one_of(
        leaf,
        st.builds(lambda a, b: f"({a} == {b})", sub, sub),
        st.builds(lambda a, b: f"({a} > {b})", sub, sub),
        st.builds(lambda a, b: f"({a} && {b})", sub, sub),
        st.builds(lambda a, b: f"({a} || {b})", sub, sub),
        st.builds(lambda a: f"!({a})", sub),
        st.builds(lambda a, b, c: f"({a} ? {b} : {c})", sub, sub, sub),
        st.builds(lambda a: f"[{a}].exists(v, v == 1)", sub),
        st.builds(lambda a: f"({a}).isGreaterThan(quantity(\"1\"))", sub),
    )


@st.composite
def devices(draw: st.DrawFn) -> dict[str, Any]:
    attributes = {}
    for name in ("d1/a", "d1/b", "d1/c", "d2/a"):
        value = draw(values)
        if value is not None:
            attributes[name] = value
    capacity = {}
    if draw(st.booleans()):
        capacity["d1/mem"] = draw(st.sampled_from(["1Gi", "1024Mi", "2Gi"]))
    return {"driver": draw(st.sampled_from(["d1", "d2"])), "attributes": attributes, "capacity": capacity,
            "allow_multiple_allocations": draw(st.booleans())}


def _outcome(selector: Any, device: dict[str, Any]) -> Any:
    try:
        return selector.evaluate(activation(**device))
    except CelRuntimeError as exc:
        return str(exc)


@settings(max_examples=400, deadline=None)
@given(_expr(3), devices(), devices())
def test_devices_agreeing_on_references_get_the_same_outcome(expression: str, x: dict[str, Any], y: dict[str, Any]) -> None:
    try:
        selector = compile_selector(expression)
    except CelCompileError:
        return
    if selector.references is None:
        return
    # Make y agree with x on every referenced path, keep the rest as drawn.
    for path in selector.references:
        if path == ("driver",):
            y["driver"] = x["driver"]
        elif path == ("allowMultipleAllocations",):
            y["allow_multiple_allocations"] = x["allow_multiple_allocations"]
        else:
            kind, name = path[0], f"{path[1]}/{path[2]}"
            y[kind] = dict(y[kind])
            y[kind].pop(name, None)
            if name in x[kind]:
                y[kind][name] = x[kind][name]
    # A version CEL cannot parse fails the whole device, whatever the selector reads:
    # that is the device's own (quota.devices.columns groups it apart as ERROR), not a path's.
    assume(activation(**x).error == activation(**y).error)
    assert _outcome(selector, x) == _outcome(selector, y)


@settings(max_examples=300, deadline=None)
@given(_expr(3), devices(), st.data())
def test_presence_only_paths_need_agree_on_presence_alone(expression: str, x: dict[str, Any], data: st.DataObject) -> None:
    try:
        selector = compile_selector(expression)
    except CelCompileError:
        return
    if not selector.presence_only:
        return
    y = {**x, "attributes": dict(x["attributes"]), "capacity": dict(x["capacity"])}
    for kind, domain, ident in selector.presence_only:
        name = f"{domain}/{ident}"
        if name in y[kind]:  # present on both, with another value
            pool = ["1Gi", "3"] if kind == "capacity" else [0, True, "y", "v:3.0.0", [2]]
            y[kind][name] = data.draw(st.sampled_from(pool))
    # A version CEL cannot parse fails the whole device (quota.devices.columns groups it apart
    # as ERROR), whatever the selector reads: not a path's doing.
    assume(activation(**x).error == activation(**y).error)
    assert _outcome(selector, x) == _outcome(selector, y)


@settings(max_examples=400, deadline=None)
@given(_expr(3), devices())
def test_the_projected_device_gives_the_full_outcome(expression: str, x: dict[str, Any]) -> None:
    """What quota.devices.verdicts shows CEL: only the referenced paths, the same value or error."""
    try:
        selector = compile_selector(expression)
    except CelCompileError:
        return
    if selector.references is None:
        return
    device = make_device(**x)
    full = device_activation(device)
    assert activation_error(device) == full.error
    projected = projected_activation(device, projection_of(selector.references), full.error)
    assert _outcome_of(selector, projected) == _outcome_of(selector, full)


def _outcome_of(selector: Any, act: Any) -> Any:
    try:
        return selector.evaluate(act)
    except CelRuntimeError as exc:
        return str(exc)


_FOUND = {"driver": "d1", "attributes": {"d1/a": True}, "capacity": {}, "allow_multiple_allocations": False}


@settings(max_examples=300, deadline=None)
@given(_expr(3), devices())
# Found by hypothesis: a comparison of two conditionals, one branch a scalar call or node,
# was estimated unbounded.
@example('!(((device.attributes["d1"].a ? device.attributes["d1"].a : quantity("1Gi")) == '
         '(device.attributes["d1"].a ? device.attributes["d1"].a : quantity("1Gi"))))', _FOUND)
@example('(device.attributes["d1"].a ? device.attributes["d1"].a : has(device.attributes["d1"].a)) == '
         '(device.attributes["d1"].a ? device.attributes["d1"].a : has(device.attributes["d1"].a))', _FOUND)
@example('(device.attributes["d1"][?"b"].orValue(false) == ((device.attributes["d1"][?"b"].orValue(false) ? '
         'device.attributes["d1"].a : device.attributes["d1"].exists(k, k == "c")) == '
         '(device.attributes["d1"][?"b"].orValue(false) ? device.attributes["d1"].a : '
         'device.attributes["d1"].exists(k, k == "c"))))',
         {"driver": "d1", "attributes": {}, "capacity": {}, "allow_multiple_allocations": False})
@example('(true == ((device.attributes["d1"][?"b"].orValue(false) ? device.attributes["d1"].a : '
         'device.allowMultipleAllocations) == (device.attributes["d1"][?"b"].orValue(false) ? '
         'device.attributes["d1"].a : device.allowMultipleAllocations)))',
         {"driver": "d1", "attributes": {}, "capacity": {}, "allow_multiple_allocations": False})
def test_static_estimate_bounds_the_actual_cost(expression: str, device: dict[str, Any]) -> None:
    # Shares the expression generator; lives here rather than in test_limits for that.
    try:
        selector = compile_selector(expression)
    except CelCompileError:
        return
    try:
        _, actual = selector.evaluate_with_cost(activation(**device))
    except CelRuntimeError:
        return
    assert selector.estimated_cost is not None
    assert actual <= selector.estimated_cost
