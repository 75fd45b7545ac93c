"""quota.values.quantity: the apimachinery quantity grammar, exactly."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota.values.quantity import QuantityError, ceil_int, format_quantities, format_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("65536Mi", 64 * 2**30),
        ("1k", 1000),
        ("1M", 10**6),
        ("500m", Fraction(1, 2)),
        ("1.5Gi", 3 * 2**29),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("+12", 12),
        ("-2Ki", -2048),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("0", 0),
        (" 7Gi ", 7 * 2**30),
        (40, 40),
    ],
)
def test_parses(text: str | int, value: int | Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1GiB", "1gi", "1.2.3", "ten", "1e", "1e9999", "--1", "1 Gi", "0x10"])
def test_rejects_with_a_clear_message(text: str) -> None:
    with pytest.raises(QuantityError, match="quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("bad", [True, None, [], float("inf")])
def test_rejects_non_quantities(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "text"),
    [(80 * 2**30, "80Gi"), (1536 * 2**20, "1536Mi"), (1000, "1000"), (0, "0"), (Fraction(1, 2), "500m"), (2**60, "1Ei")],
)
def test_formats(value: int | Fraction, text: str) -> None:
    assert format_quantity(value) == text


@given(st.integers(min_value=0, max_value=2**62))
def test_format_round_trips(value: int) -> None:
    assert parse_quantity(format_quantity(value)) == value


@given(st.fractions(min_value=0, max_value=10**12))
def test_ceil_never_undercounts(value: Fraction) -> None:
    assert value <= ceil_int(value) < value + 1


@pytest.mark.parametrize(("values", "shown"), [
    ([100 * 2**30, 193857 * 2**20, 320 * 2**30], ["102400Mi", "193857Mi", "327680Mi"]),
    ([0, 160 * 2**30, 320 * 2**30], ["0", "160Gi", "320Gi"]),
    ([1, 2**30], ["1", "1073741824"]),  # no unit divides them all: plain bytes
    ([], []),
])
def test_side_by_side_quantities_share_one_exact_unit(values: list[int], shown: list[str]) -> None:
    assert format_quantities(values) == shown
