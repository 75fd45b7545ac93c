"""Robustness: any text compiles or fails with CelCompileError, and any compiled
selector evaluates to a bool or fails with CelRuntimeError, never another exception,
a hang or a memory blow-up (the webhook must answer every AdmissionReview).

Every example runs under `tests.unit.bounds.bounded`. `DRA_QUOTA_FUZZ_EXAMPLES`
overrides the example count of each test, so `bench/` can run the same suite long.
"""

from __future__ import annotations


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quota.cel import CelCompileError, CelRuntimeError, compile_selector
from tests.unit.bounds import bounded, fuzz_examples
from tests.unit.quota.cel.devices import activation

EXAMPLES = fuzz_examples(150)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DEVICES = [
    activation("d", attributes={"x": 1, "s": "a,b", "l": [1, 2], "v": "v:1.2.3"}, capacity={"memory": "1Gi"}),
    activation("d", attributes={"x": -9223372036854775808, "s": "é" * 64, "l": ["x"] * 48}),
    activation("other"),
]


def _check(expression: str) -> None:
    with bounded(seconds=10, megabytes=256):
        try:
            selector = compile_selector(expression)
        except CelCompileError:
            return
        for device in DEVICES:
            try:
                assert isinstance(selector.evaluate(device), bool)
            except CelRuntimeError:
                pass


# --- token soup and arbitrary text -----------------------------------------------

TOKENS = [
    "device", ".", "attributes", "capacity", "driver", "allowMultipleAllocations", '["d"]', "[0]", ".x", ".?x",
    "[?'x']", "(", ")", "[", "]", "{", "}", ":", ",", "&&", "||", "!", "-", "+", "*", "/", "%", "==", "!=", "<",
    ">=", " in ", "?", "1", "0", "1u", "2.5", "'s'", "b'b'", "true", "null", "has(", "size(", ".size()",
    ".all(v, ", ".exists(i, v, ", ".map(v, ", "v", "i", "cel.bind(v, ", "quantity('1Gi')", "semver('1.0.0')",
    ".compareTo(", ".isGreaterThan(", "optional.of(", ".orValue(", ".matches('a+')", ".split(',')",
    "lists.range(3)", "'%s'.format([", "dyn(", "int(", "string(", "ip('1.2.3.4')", ".includes(",
    "timestamp(0)", "duration('1h')", ".getHours(", "timestamp('2023-01-01T00:00:00Z')",
]


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=14).map("".join))
def test_token_soup_never_crashes(expression: str) -> None:
    _check(expression)


@FUZZ
@given(st.text(max_size=40))
def test_arbitrary_text_never_crashes(expression: str) -> None:
    _check(expression)


# --- grammar-aware expressions with hostile arguments -------------------------------

BIG_INTS = ["9223372036854775807", "9223372036854775808", "18446744073709551615u", "18446744073709551616u",
            "1" * 4301, "0x" + "f" * 17, "-9223372036854775808"]
STRINGS = st.one_of(
    st.sampled_from(["''", "'a'", "'%s'", "'abc'", "'" + "a" * 2000 + "'", "'\\u00e9'", "'1Gi'", "'1.2.3'"]),
    st.integers(0, 4301).map(lambda n: "'" + "9" * n + "'"),
)
FORMATS = st.builds(
    lambda width, precision, verb: f"'%{width}{precision}{verb}'",
    st.sampled_from(["", "10", "999999999"]),
    st.sampled_from(["", ".0", ".3", ".1000", ".100000000", ".99999999999999"]),
    st.sampled_from(list("sdfeboxX%") + ["", "q"]),
)
ATOMS = st.one_of(
    st.sampled_from(BIG_INTS + ["1", "0", "2.5", "1e308", "-0.0", "true", "null", "[]", "{}",
                                "device.driver", 'device.attributes["d"].x', 'device.attributes["d"].s',
                                'device.attributes["d"].l', 'device.capacity["d"].memory', "v", "lists.range(100)"]),
    STRINGS,
)

UNARY_CALLS = ["size({})", "string({})", "int({})", "uint({})", "double({})", "dyn({})", "type({})", "[{}]",
               "quantity({})", "semver({})", "duration({})", "timestamp({})", "ip({})", "cidr({})",
               "strings.quote({})", "lists.range({})", "({}).lowerAscii()", "({}).split('')", "({}).join('')",
               "({}).flatten()", "({}).distinct()", "({}).sort()", "({}).reverse()", "({}).findAll('.')",
               "({}).size()", "!{}", "-{}", "({})", "{{'k': {}}}", "optional.of({})", "({}).matches('a*')"]
BINARY_OPS = ["+", "-", "*", "/", "%", "==", "!=", "<", ">=", "&&", "||", "in"]
BINARY_CALLS = ["({}).replace('a', {})", "({}).format([{}])", "({}).indexOf({})", "({}).contains({})",
                "sets.contains({}, {})", "({}).map(v, {})", "({}).filter(v, {})", "({}).all(v, {})",
                "({}).exists(v, {})", "cel.bind(v, {}, {})", "({}).transformList(i, v, {})"]


NESTINGS = ["({})", "[{}]", "{{1: {}}}", "dyn({})", "!{}", "-{}", "[1].map(x, {})", "false ? 1 : {}", "{}.size()"]


def _nested(depth: int, wrap: str, inner: str) -> str:
    """`inner` wrapped `depth` times: deep nesting around hostile arguments."""
    prefix, suffix = wrap.replace("{{", "{").replace("}}", "}").split("{}")
    return prefix * depth + inner + suffix * depth


def _expressions(atoms: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.recursive(
        atoms,
        lambda inner: st.one_of(
            st.builds(str.format, st.sampled_from(UNARY_CALLS), inner),
            st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(BINARY_OPS), inner),
            st.builds(lambda f, a, b: f.format(a, b), st.sampled_from(BINARY_CALLS), inner, inner),
            st.builds(lambda f, a, b: f"{f}.format([{a}, {b}])", FORMATS, inner, inner),
            st.builds(lambda c, a, b: f"{c} ? {a} : {b}", inner, inner, inner),
            st.builds(_nested, st.integers(0, 300), st.sampled_from(NESTINGS), inner),
        ),
        max_leaves=12,
    )


@FUZZ
@given(_expressions(ATOMS))
def test_grammar_aware_hostile_expressions_stay_bounded(expression: str) -> None:
    _check(expression)


@FUZZ
@given(_expressions(ATOMS).map(lambda e: f"{e} == true"), st.integers(0, 3))
def test_comprehensions_building_strings_and_lists_stay_bounded(expression: str, doublings: int) -> None:
    seed = "lists.range(1000).map(x, 'abcdefghij')"
    for _ in range(doublings):
        seed = f"cel.bind(w, {seed}, w + w)"
    _check(f"cel.bind(v, {seed}, v.join('').size() > 0 || {expression})")
