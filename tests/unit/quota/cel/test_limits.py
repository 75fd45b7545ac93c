"""Limits: expression length, nesting depth and the runtime cost budget.

The scheduler compiles selectors with a runtime cost limit of 1,000,000
(resourceapi.CELSelectorExpressionMaxCost, dynamic-resource-allocation/cel/compile.go)
and the API server refuses expressions longer than 10 KiB
(CELSelectorExpressionMaxLength). The hostile expressions below must end quickly with
"actual cost limit exceeded" instead of hanging or exhausting memory; compile_test.go's
"expensive" case is in test_conformance.py. "Quickly" is a CPU-time bound (tests/unit/bounds.py,
as the fuzz suites), never the wall clock: other processes' load must not fail it; how long
they take is printed by bench/hostile.py (`-k cel -v`).
"""

from __future__ import annotations

import pytest

from quota.cel import COST_LIMIT, MAX_EXPRESSION_BYTES, CelCompileError, CelRuntimeError, compile_selector, extlib
from quota.cel.values import EvalError
from ...bounds import bounded
from tests.unit.quota.cel.devices import activation


def _doubling(seed: str, levels: int) -> str:
    expression = f"v{levels}.size() > 0"
    for i in range(levels, 0, -1):
        expression = f"cel.bind(v{i}, v{i - 1} + v{i - 1}, {expression})"
    return f"cel.bind(v0, {seed}, {expression})"


HOSTILE = {
    "string doubling": _doubling('"xxxxxxxxxx"', 40),
    "list doubling": _doubling("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", 40),
    "huge range": "lists.range(100000000).size() > 0",
    "nested map": "lists.range(1000).map(x, lists.range(1000).map(y, x * y)).size() > 0",
    "nested exists": "lists.range(100).exists(a, lists.range(100).exists(b, lists.range(100).exists(c, a + b + c < 0)))",
    "replace blowup": f'cel.bind(s, "{"a" * 5000}", s.replace("a", s).size() > 0)',
    "quadratic distinct": "lists.range(5000).distinct().size() > 0",
    "quadratic sets": "sets.contains(lists.range(100000), lists.range(100000))",
    "device map loops": 'device.attributes["d"].all(a, lists.range(2000).all(b, lists.range(2000).all(c, c >= 0)))',
}


@pytest.mark.parametrize("expression", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_expression_stops_at_the_cost_limit(expression: str) -> None:
    selector = compile_selector(expression)
    with bounded(seconds=5), pytest.raises(CelRuntimeError, match="^operation cancelled: actual cost limit exceeded$"):
        selector.evaluate(activation("d", attributes={"x": 1}))


def test_regex_cannot_backtrack_catastrophically() -> None:
    selector = compile_selector('"' + "a" * 40 + '!".matches("(a+)+$")')
    # A backtracking engine needs about 2^40 steps here (hours of CPU): RE2 answers at once.
    with bounded(seconds=5):
        if extlib.HAVE_RE2:
            assert selector.evaluate(activation("d")) is False
        else:  # Python's engine would take minutes: the fallback refuses the pattern
            with pytest.raises(CelRuntimeError, match="needs google-re2"):
                selector.evaluate(activation("d"))


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [
        ("H100|H200", None), ("^NVIDIA (A|H)[0-9]+.*$", None), ("(?:ab)+c", None), ("[(]+x", None),
        ("(a+)+$", "nested repetition"), ("(x{2,3})+", "nested repetition"),
        ("a*a*a*a*b", "more than 3 repetitions"), ("(a)\\1", "not RE2 syntax"), ("(?=x)y", "not RE2 syntax"),
    ],
)
def test_fallback_engine_refuses_what_could_backtrack(pattern: str, refused: str | None) -> None:
    # Only used without google-re2, but always tested: CI may lack the wheel.
    if refused is None:
        extlib.check_backtracking_risk(pattern)
    else:
        with pytest.raises(EvalError, match=refused):
            extlib.check_backtracking_risk(pattern)


def test_a_smaller_budget_can_be_given() -> None:
    selector = compile_selector("lists.range(100).all(x, x >= 0)")
    assert selector.evaluate(activation("d")) is True
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        selector.evaluate(activation("d"), cost_limit=50)


def test_cost_is_per_evaluation() -> None:
    selector = compile_selector("lists.range(300).all(x, lists.range(400).all(y, y >= 0))")
    runs = [selector.evaluate_with_cost(activation("d")) for _ in range(3)]
    # One evaluation spends over half the limit: a budget carried over from the one
    # before would stop the second; each reports its own cost, the same every time.
    assert runs[0][1] > COST_LIMIT // 2
    assert runs == [(True, runs[0][1])] * 3


def test_expression_length_limit_is_10_kib_in_bytes() -> None:
    at_limit = "true" + " " * (MAX_EXPRESSION_BYTES - 4)
    assert compile_selector(at_limit).evaluate(activation("d")) is True
    with pytest.raises(CelCompileError, match="may not be more than 10240 bytes"):
        compile_selector(at_limit + " ")
    ten_kib_of_characters = '"é"' + " " * (MAX_EXPRESSION_BYTES - 3)  # é is two bytes
    with pytest.raises(CelCompileError, match="10241 bytes"):
        compile_selector(ten_kib_of_characters)


def test_deep_nesting_is_a_compile_error_not_a_crash() -> None:
    with pytest.raises(CelCompileError, match="recursion limit"):
        compile_selector("[" * 400 + "]" * 400 + " == []")


def test_evaluate_with_cost_reports_what_was_spent() -> None:
    device = activation("d", attributes={"x": 1})
    flat, flat_cost = compile_selector('device.attributes["d"].x == 1').evaluate_with_cost(device)
    loop, loop_cost = compile_selector("lists.range(1000).all(i, i >= 0)").evaluate_with_cost(device)
    assert flat is True and loop is True
    assert 0 < flat_cost < 10
    assert loop_cost > 1000 * 3  # every step pays for its body


def test_long_alternatives_are_balanced_not_deep() -> None:
    # cel-go balances && / || runs, so hundreds of alternatives are fine...
    expression = "||".join(f'device.driver=="d{i}"' for i in range(400))
    assert compile_selector(expression).evaluate(activation("d399")) is True
    assert compile_selector("&&".join(["true"] * 1500)).evaluate(activation("d")) is True
    # ...and so are runs of `!` / `-`, which collapse by parity (cel-go VisitLogicalNot)...
    assert compile_selector("!" * 1001 + "false").evaluate(activation("d")) is True
    assert compile_selector("-" * 3000 + "1 < 5").evaluate(activation("d")) is True
    # ...while other nesting that deep is refused, without a RecursionError.
    with pytest.raises(CelCompileError, match="recursion limit exceeded: 250"):
        compile_selector("+".join(["1"] * 2500) + " > 0")


TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"


@pytest.mark.parametrize(
    ("expression", "low", "high"),
    [
        ('device.attributes["d"].x == 1', 1, 10),
        # one pass over the (at most 32) domains or ids of a device
        ('device.attributes.exists_one(x, x == "dra.example.com")', 32, 500),
        ('cel.bind(g, device.attributes["d"], g.all(k, g[k] == 1))', 32, 500),
        # compile_test.go "expensive": far beyond the API server's 1,000,000
        (f"{TEN}.all(x, {TEN}.all(y, {TEN}.all(z, {TEN}.all(z2, {TEN}.all(z3, {TEN}.all(z4, "
         f"{TEN}.all(z5, int('1'.find('[0-9]*')) < 100)))))))", 10**7, 10**9),
        ("lists.range(1000).all(x, x > 0)", 1000, 10_000),
    ],
)
def test_estimated_cost_bounds(expression: str, low: int, high: int) -> None:
    estimated = compile_selector(expression).estimated_cost
    assert estimated is not None and low <= estimated <= high


def test_estimate_is_none_when_a_loop_has_no_size_bound() -> None:
    assert compile_selector('lists.range(device.attributes["d"].n).all(x, true)').estimated_cost is None


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["d"].names.all(x, x != "")',
        'device.attributes["d"].s.split("-").exists(w, w.startsWith("H"))',
        "[1, 2].map(x, [x, x]).all(y, y.all(z, z > 0))",
    ],
)
def test_estimate_covers_the_actual_cost(expression: str) -> None:
    selector = compile_selector(expression)
    device = activation("d", attributes={"names": [f"n{i}" for i in range(48)], "s": "x-" * 31 + "H"})
    _, actual = selector.evaluate_with_cost(device)
    assert selector.estimated_cost is not None and actual <= selector.estimated_cost
