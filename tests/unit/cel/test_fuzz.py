"""Robustness: any text compiles or fails with CelCompileError, and any compiled
selector evaluates to a bool or fails with CelRuntimeError, never another exception
(the webhook must answer every AdmissionReview; DESIGN.md "never a 500").
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.cel import CelCompileError, CelRuntimeError, compile_selector
from tests.unit.cel.devices import activation

TOKENS = [
    "device", ".", "attributes", "capacity", "driver", "allowMultipleAllocations", '["d"]', "[0]", ".x", ".?x",
    "[?'x']", "(", ")", "[", "]", "{", "}", ":", ",", "&&", "||", "!", "-", "+", "*", "/", "%", "==", "!=", "<",
    ">=", " in ", "?", "1", "0", "1u", "2.5", "'s'", "b'b'", "true", "null", "has(", "size(", ".size()",
    ".all(v, ", ".exists(i, v, ", ".map(v, ", "v", "i", "cel.bind(v, ", "quantity('1Gi')", "semver('1.0.0')",
    ".compareTo(", ".isGreaterThan(", "optional.of(", ".orValue(", ".matches('a+')", ".split(',')",
    "lists.range(3)", "'%s'.format([", "dyn(", "int(", "string(", "ip('1.2.3.4')", ".includes(",
    "timestamp(0)", "duration('1h')", ".getHours(", "timestamp('2023-01-01T00:00:00Z')",
]
DEVICE = activation(
    "d", attributes={"x": 1, "s": "a,b", "l": [1, 2], "v": "v:1.2.3"}, capacity={"memory": "1Gi"},
)


def _check(expression: str) -> None:
    try:
        selector = compile_selector(expression)
    except CelCompileError:
        return
    try:
        assert isinstance(selector.evaluate(DEVICE), bool)
    except CelRuntimeError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=14).map("".join))
def test_token_soup_never_crashes(expression: str) -> None:
    _check(expression)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_never_crashes(expression: str) -> None:
    _check(expression)
