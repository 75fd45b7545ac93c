"""Hostile selectors, one table per class of attack: output-sized work is charged
before it is done, Python's own limits never leak, nesting stops where cel-go's
parser stops, and the conformance edges Kubernetes 1.37 defines.

Each hostile case has a legitimate sibling near the limit that must still work.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from quota.cel import COST_EXCEEDED, CelCompileError, CelRuntimeError, compile_selector
from tests.unit.bounds import bounded
from tests.unit.quota.cel.devices import activation

DEVICE = activation("d", attributes={"x": 1, "s": "abc"})
BIG = "1" * 4301


def _runtime_error(expression: str) -> str:
    with bounded(seconds=10, megabytes=256), pytest.raises(CelRuntimeError) as info:
        compile_selector(expression).evaluate(DEVICE)
    return str(info.value)


def _compile_error(expression: str) -> str:
    with bounded(seconds=10, megabytes=256), pytest.raises(CelCompileError) as info:
        compile_selector(expression)
    return str(info.value)


# --- class 1: work bounded by output size ------------------------------------------

OUTPUT_SIZED = [
    "'%.1000000000e'.format([1.0]).size() > 0",
    "'%.100000000f'.format([1.0]).size() > 0",
    "'%.99999999999999999999f'.format([1.0]).size() > 0",
    "lists.range(1000).map(x, '%.100000f'.format([1.0])).size() > 0",
    "'%s'.format([lists.range(500000)]).size() > 0",
    "'%x'.format([lists.range(200000).map(x, 'aaaaaaaaaa').join('')]).size() > 0",
    "cel.bind(s, lists.range(100000).map(x, 'aaaaaaaaaa').join(''), strings.quote(s + s).size() > 0)",
    "cel.bind(s, lists.range(100000).map(x, 'a').join(''), s.replace('a', s).size() > 0)",
    "lists.range(100000).map(x, lists.range(20).map(y, 'abcdefghij').join('')).join('').size() > 0",
    "cel.bind(L, lists.range(100000), lists.range(8000).all(i, L == L))",
    "cel.bind(B, lists.range(1000), cel.bind(L, lists.range(1000).map(i, B), lists.range(100).all(i, L == L)))",
    "cel.bind(L, lists.range(1000).map(i, lists.range(1000)), lists.range(100).exists(i, L[0] in L && false))",
    "cel.bind(s, lists.range(100000).map(x, 'aaaaaaaaaa').join(''), lists.range(100).all(i, s.matches(s)))",
    "lists.range(1000).map(x, lists.range(1000)).flatten().flatten().size() > 0",
    "lists.range(100000).map(x, string(x)).join(',').split(',').size() > 0 && lists.range(900000).size() > 0",
]


@pytest.mark.parametrize("expression", OUTPUT_SIZED)
def test_output_sized_work_stops_at_the_cost_limit(expression: str) -> None:
    assert _runtime_error(expression) == COST_EXCEEDED


@pytest.mark.parametrize(
    "expression",
    [
        "'%.1000f'.format([1e300]).size() == 1302",
        "'%.10000e'.format([1.0]).size() == 10006",
        "'%s %d %x'.format(['a', 1, 'b']) == 'a 1 62'",
        "lists.range(10000).map(x, 'aaaaaaaaaa').join('').size() == 100000",
        "lists.range(1000).map(x, '%.100f'.format([1.0])).size() == 1000",
        "strings.quote(lists.range(1000).map(x, 'a').join('')).size() == 1002",
        "cel.bind(L, lists.range(1000), lists.range(100).all(i, L == L))",
    ],
)
def test_legitimate_output_near_the_limit_still_works(expression: str) -> None:
    with bounded(seconds=10, megabytes=256):
        assert compile_selector(expression).evaluate(DEVICE) is True


# --- class 2: Python's limits never leak ---------------------------------------------

PYTHON_LIMITS_COMPILE = [
    (BIG + " > 0", "invalid int literal"),
    (BIG + "u > 0u", "invalid uint literal"),
    ("0x" + "f" * 5000 + " > 0", "invalid int literal"),
    ("9223372036854775808 > 0", "invalid int literal"),
    ("18446744073709551616u > 0u", "invalid uint literal"),
    ("duration('" + BIG + "s') > duration('1s')", "invalid duration argument"),
    ("duration('2562048h') > duration('1s')", "invalid duration argument"),
    # Go's ParseFloat reports ErrRange past the largest double; Python would say inf.
    (BIG + ".0 > 0.0", "invalid double literal"),
    ("1e400 > 0.0", "invalid double literal"),
]


@pytest.mark.parametrize(("expression", "message"), PYTHON_LIMITS_COMPILE)
def test_oversized_literals_are_compile_errors(expression: str, message: str) -> None:
    assert message in _compile_error(expression)


PYTHON_LIMITS_RUNTIME = [
    (f"int('{BIG}') > 0", "to int: value out of range"),
    (f"int('-{BIG}') > 0", "to int: value out of range"),
    (f"uint('{BIG}') > 0u", "cannot convert string"),
    (f"quantity('{BIG}').sign() > 0", "quantit"),
    (f"semver('{BIG}.0.0').major() > 0", "value out of range"),
    ("int('9223372036854775808') > 0", "value out of range"),
    (f"double('{BIG}') > 0.0", "to double"),
    ("double('1e400') > 0.0", "to double"),
    ("duration('2562047h') + duration('1h') > duration('0s')", "integer overflow"),
    ("timestamp('9999-12-31T00:00:00Z') - timestamp('0001-01-01T00:00:00Z') > duration('0s')", "integer overflow"),
]


@pytest.mark.parametrize(("expression", "message"), PYTHON_LIMITS_RUNTIME)
def test_python_limits_are_runtime_errors(expression: str, message: str) -> None:
    error = _runtime_error(expression)
    assert message in error and len(error) < 300  # the 4301 digits are not echoed back


@pytest.mark.parametrize(
    "expression",
    [
        "9223372036854775807 > 0 && -9223372036854775808 < 0 && 18446744073709551615u > 0u",
        "0x7fffffffffffffff == 9223372036854775807 && 000000000000000000000000001 == 1",
        "double('1.7976931348623157e308') > 1e300 && int('-9223372036854775808') < 0",
        "double('1e-400') == 0.0 && double('-Inf') < 0.0 && 1e-400 == 0.0",
        "duration('2562047h') > duration('1h') && string(1e308) == '1e+308'",
    ],
)
def test_values_at_the_64_bit_edges_work(expression: str) -> None:
    assert compile_selector(expression).evaluate(DEVICE) is True


# --- class 8: nesting stops where cel-go's parser stops -----------------------------

# name -> (expression of n nestings, the largest n cel-go accepts)
NESTING: dict[str, tuple[Callable[[int], str], int]] = {
    "parentheses": (lambda n: "(" * n + "true" + ")" * n, 249),
    "lists": (lambda n: "[" * n + "]" * n + " != []", 250),  # the innermost [] holds no expression
    "maps": (lambda n: "{1: " * n + "1" + "}" * n + " != {}", 249),
    "calls": (lambda n: "dyn(" * n + "true" + ")" * n, 249),
    "member calls": (lambda n: '"a"' + ".lowerAscii()" * n + ' == "a"', 249),
    "indexes": (lambda n: "{}" + '[?"a"]' * n + ".orValue(true)", 247),
    "ternaries": (lambda n: "false ? false : " * n + "true", 249),
    "arithmetic": (lambda n: "1" + " + 1" * n + " > 0", 248),
    "relations": (lambda n: "true" + " == true" * n, 248),
    "macros": (lambda n: "[1].all(x, " * n + "true" + ")" * n, 124),
    "bindings": (lambda n: "cel.bind(x, true, " * n + "x" + ")" * n, 124),
}


@pytest.mark.parametrize("form", NESTING.keys())
def test_nesting_at_the_limit_works_and_one_more_is_refused(form: str) -> None:
    build, limit = NESTING[form]
    with bounded(seconds=10, megabytes=256):
        assert compile_selector(build(limit)).evaluate(DEVICE) is True
        message = _compile_error(build(limit + 1))
    assert "expression recursion limit exceeded: 250" in message


@pytest.mark.parametrize(
    "expression",
    ["!" * 5001 + "false", "-" * 4000 + "1 == 1", "||".join(["false"] * 1200) + "|| true"],
)
def test_runs_are_not_nesting(expression: str) -> None:
    # cel-go: `!`/`-` runs collapse by parity, `&&`/`||` runs are balanced.
    assert compile_selector(expression).evaluate(DEVICE) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("(" * 5000 + "1" + ")" * 5000 + " > 0", "expression recursion limit exceeded: 250"),
        ("a." * 3000 + "b", "expression recursion limit exceeded: 250"),
        # within each per-rule limit, but too deep for cel-go's visitor in all
        ('"a"' + ".lowerAscii()" * 100 + ".size()" + " + 1" * 200 + " > 0", "max recursion depth exceeded"),
        # within cel-go's limits, beyond this evaluator's total depth
        ("![" * 160 + "true" + "]" * 160, "expression nesting too deep: more than 300 levels"),
    ],
)
def test_deep_combinations_are_clear_compile_errors(expression: str, message: str) -> None:
    assert message in _compile_error(expression)


# --- class 9: conformance edges (Kubernetes 1.37's cel-go) ---------------------------

CONFORMANCE_TRUE = [
    "9223372036854775807 < 9223372036854775808.0 && !(9223372036854775807 >= 9223372036854775808.0)",
    "-9223372036854775808 <= -9223372036854775808.0 && 18446744073709551615u < 18446744073709551616.0",
    "dyn(9223372036854775807) != 9223372036854775808.0 && 2u > 1.5",
    "type(ip('1.2.3.4')) == net.IP && type(cidr('10.0.0.0/8')) == net.CIDR",
    "type(timestamp(0)) == google.protobuf.Timestamp && type(duration('1s')) == google.protobuf.Duration",
    "type(quantity('1')) == kubernetes.Quantity && type(semver('1.0.0')) == kubernetes.Semver",
    "'%s %d'.format(['a', 1]) == 'a 1' && '%s %s'.format([[1, 2], 'b']) == '[1, 2] b'",
    "duration('-2562047h') < duration('0s') && timestamp('0001-01-01T00:00:00Z') < timestamp('9999-12-31T23:59:59Z')",
    "!isCIDR('fe80::1%eth0/64') && !isIP('fe80::1%eth0') && isCIDR('fe80::1/64')",
]


@pytest.mark.parametrize("expression", CONFORMANCE_TRUE)
def test_conformance_edges(expression: str) -> None:
    assert compile_selector(expression).evaluate(DEVICE) is True


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("cidr('fe80::1%eth0/64').prefixLength() == 64", "IPv6 zones cannot be present in a prefix"),
        ("ip('fe80::1%eth0').family() == 6", "with zone value is not allowed"),
        ("timestamp('9999-12-31T23:59:59Z') + duration('1s') > timestamp(0)", "timestamp out of range"),
    ],
)
def test_conformance_edge_errors(expression: str, message: str) -> None:
    assert re.search(re.escape(message), _runtime_error(expression))


def test_homogeneous_literals_are_still_required_outside_format() -> None:
    assert "expected type 'string' but found 'int'" in _compile_error("['a', 1].size() == 2")
    assert "undeclared reference to 'net'" in _compile_error("net.Foo == net.Foo")


def test_a_lone_surrogate_is_a_compile_error_not_a_crash() -> None:
    assert "not valid UTF-8 text: a lone surrogate at character 18" in _compile_error('device.driver == "\ud800"')
