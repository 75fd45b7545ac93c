"""Property tests for the quantity and semver CEL libraries.

Quantity comparisons must agree with exact arithmetic on the parsed values
(apiserver/pkg/cel/library/quantity.go compares resource.Quantity exactly, so
"1Gi" == "1024Mi"); semver ordering must follow semver 2.0.0 precedence as blang/semver
implements it (apiserver/pkg/cel/library/semverlib.go).
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.cel import compile_selector
from quota.values.quantity import parse_quantity
from tests.unit.quota.cel.devices import activation

SUFFIXES = ["", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "n", "u", "e3", "E-2"]

quantities = st.builds(
    lambda sign, whole, frac, suffix: f"{sign}{whole}{'.' + frac if frac else ''}{suffix}",
    st.sampled_from(["", "-", "+"]),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "5", "25", "125"]),
    st.sampled_from(SUFFIXES),
)
DEVICE = activation("d")


def _true(expression: str) -> bool:
    return compile_selector(expression).evaluate(DEVICE)


def _sign(value: Fraction) -> int:
    return (value > 0) - (value < 0)


@settings(max_examples=200, deadline=None)
@given(quantities, quantities)
def test_quantity_comparisons_agree_with_exact_values(a: str, b: str) -> None:
    fa, fb = parse_quantity(a), parse_quantity(b)
    qa, qb = f'quantity("{a}")', f'quantity("{b}")'
    assert _true(f"{qa}.compareTo({qb}) == {_sign(fa - fb)}")
    assert _true(f"{qa}.isGreaterThan({qb})") is (fa > fb)
    assert _true(f"{qa}.isLessThan({qb})") is (fa < fb)
    assert _true(f"{qa} == {qb}") is (fa == fb)
    assert _true(f"{qa}.add({qb}).sub({qb}) == {qa}")
    assert _true(f"{qa}.sign() == {_sign(fa)}")


@settings(max_examples=100, deadline=None)
@given(quantities)
def test_quantity_integer_conversion(a: str) -> None:
    value = parse_quantity(a)
    integral = value.denominator == 1 and -(2**63) <= value <= 2**63 - 1
    assert _true(f'quantity("{a}").isInteger()') is integral
    if integral:
        assert _true(f'quantity("{a}").asInteger() == {int(value)}')


identifiers = st.one_of(st.integers(min_value=0, max_value=20).map(str), st.sampled_from(["alpha", "beta", "rc", "x-1"]))
versions = st.tuples(
    st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=3), st.integers(min_value=0, max_value=3),
    st.lists(identifiers, max_size=2),
)


def _text(version: tuple[int, int, int, list[str]]) -> str:
    major, minor, patch, pre = version
    return f"{major}.{minor}.{patch}" + ("-" + ".".join(pre) if pre else "")


def _precedence(version: tuple[int, int, int, list[str]]) -> tuple[object, ...]:
    # semver.org item 11: no pre-release ranks highest; numeric identifiers rank below
    # alphanumeric ones and compare numerically; a longer identifier list ranks higher.
    major, minor, patch, pre = version
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre)
    return (major, minor, patch, 1 if not pre else 0, parts)


@settings(max_examples=200, deadline=None)
@given(versions, versions)
def test_semver_order_follows_semver_precedence(a: tuple[int, int, int, list[str]], b: tuple[int, int, int, list[str]]) -> None:
    pa, pb = _precedence(a), _precedence(b)
    expected = (pa > pb) - (pa < pb)
    sa, sb = f'semver("{_text(a)}")', f'semver("{_text(b)}")'
    assert _true(f"{sa}.compareTo({sb}) == {expected}")
    assert _true(f"{sa} == {sb}") is (expected == 0)
    assert _true(f"{sa}.isGreaterThan({sb})") is (expected == 1)
