"""A paraphrased subset of the cel-spec conformance suite, as boolean selectors.

The cel-spec conformance tests (github.com/google/cel-spec tests/simple/testdata,
shipped as Gherkin by cel-python in `features/*.feature`) were run against this
package during development: 1230 of the 1384 scenarios that need no proto or variable
declarations agreed. The other 154: proto messages (70), literals that Kubernetes'
HomogeneousAggregateLiterals rejects on purpose (46), `type()` values the throwaway
harness could not compare (19), harness artifacts (6), backtick-quoted identifiers
(6, an option Kubernetes does not enable), a pre-2024 lossy int/double comparison (4)
and ext.Strings v3 `reverse` (3, Kubernetes enables v2). The cases below keep the
behaviours a DRA selector can meet, rephrased as `expression == expected` so they run
through the public API.
"""

from __future__ import annotations

import re

import pytest

from quota.cel import CelCompileError, CelRuntimeError, compile_selector
from tests.unit.quota.cel.devices import activation

TRUE = [
    # logic: commutative error absorption
    "!({}.a && false) && ({}.a || true) && (false || true) && !(true && false)",
    '![{"a": 1}, {}].all(v, v.a == 2) && [{"a": 1}, {}].exists(v, v.a == 1)',
    "(true ? 1 : 2) == 1 && (false ? 1 : 2) == 2",
    # integer and unsigned math
    "7 / 2 == 3 && -7 / 2 == -3 && 7 % -2 == 1 && -7 % 2 == -1",
    "42u / 5u == 8u && 42u % 5u == 2u && 5u - 3u == 2u",
    "-(-9223372036854775807) == 9223372036854775807",
    "0x7fffffffffffffff == 9223372036854775807 && 18446744073709551615u > 0u",
    # floating point
    "1.0 / 0.0 == double('Infinity') && -1.0 / 0.0 == double('-Infinity')",
    "double('NaN') != double('NaN') && !(double('NaN') < 1.0) && !(double('NaN') > 1.0)",
    "2.5 * 2.0 == 5.0 && 0.1 + 0.2 != 0.3 && -0.0 == 0.0",
    # cross-type numeric ordering and equality through dyn
    "1 < 1.5 && 2u > 1 && 1.0 <= 1u && dyn(1) == 1u && dyn(2.0) == 2",
    "[1, 2, 3] == [1, 2, 3] && [1, 2] != [2, 1] && {'a': 1} == {'a': 1} && {'a': 1} != {'a': 2}",
    # strings
    "size('πέντε') == 5 && 'hello'.startsWith('he') && 'hello'.endsWith('lo') && 'hello'.contains('ell')",
    "'abc' < 'abd' && 'a' < 'aa' && b'a' < b'b'",
    "'\\x41\\u00e9\\U0001F600' == 'Aé😀' && '\\101' == 'A' && r'\\n' == '\\\\n' && '''a\nb''' == 'a\\nb'",
    "'tacocat'.matches('cat$') && !'tacocat'.matches('^cat') && 'ABC'.matches('(?i)abc')",
    # ext.Strings
    "'%s is %d'.format([dyn('x'), dyn(1)]) == 'x is 1' && '%.3f'.format([1.2345]) == '1.234'",
    "'%b %o %x %X'.format([5, 11, 30, 30]) == '101 13 1e 1E' && '%e'.format([2.71828]) == '2.718280e+00'",
    "'%s'.format([{'b': 2, 'a': 1}]) == '{a: 1, b: 2}' && '%s'.format([[1, 2]]) == '[1, 2]'",
    "'%.0f %.0f'.format([2.5, 3.5]) == '2 4' && '%%'.format([]) == '%'",
    "'hello world'.split(' ') == ['hello', 'world'] && 'a'.split('') == ['a'] && ''.split(',') == ['']",
    "'  \\t x \\n'.trim() == 'x' && 'TacoCat'.lowerAscii() == 'tacocat' && 'é'.upperAscii() == 'é'",
    "'12345'.substring(1, 3) == '23' && 'hello'.indexOf('') == 0 && 'hello'.lastIndexOf('') == 5",
    # lists and maps
    "[1, 2, 3][1] == 2 && size([]) == 0 && 2 in [1, 2] && !(4 in [1, 2])",
    "'b' in {'a': 1, 'b': 2} && {1: 'x'}[1] == 'x' && {1: 'x'}[dyn(1.0)] == 'x' && {1u: 'y'}[dyn(1)] == 'y'",
    "[1, 2] + [3] == [1, 2, 3] && [[1], [2]][1][0] == 2",
    # macros
    "[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2) && [1, 2, 3].exists_one(x, x > 2)",
    "[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x != 2) == [1, 3]",
    "{'a': 1, 'b': 2}.map(k, k) == ['a', 'b'] && {'a': 1}.all(k, k == 'a')",
    "[].all(x, x > 0) && ![].exists(x, x > 0)",
    # optionals
    "optional.of(42).optMap(y, y + 1).value() == 43 && !optional.none().optMap(y, y + 1).hasValue()",
    "{'key': {'subkey': 'v'}}.?key.optFlatMap(k, k.?subkey).value() == 'v'",
    "!{}.?key.optFlatMap(k, k.?subkey).hasValue() && !has({}.?x.y) && has({'x': {'y': 'z'}}.?x.y)",
    "optional.of({'c': {}}).c.missing.or(optional.of(['v'])[0]).orValue('d') == 'v'",
    "{'c': {}}.c[?'missing'].orValue('default') == 'default' && [][?0].orValue(7) == 7",
    "optional.none() == optional.none() && optional.of(1) != optional.none() && type(optional.none()) == optional_type",
    "[?{}.?c, ?optional.of(42), ?optional.none()] == [42]",
    # bindings
    "cel.bind(a, 'hello', cel.bind(b, 'world', a + b + a + b)) == 'helloworldhelloworld'",
    "cel.bind(x, [1, 2, 3], x.all(v, v > 0) && x.size() == 3)",
    # conversions
    "int('-42') == -42 && uint(42) == 42u && double('3.5') == 3.5 && int(3.99) == 3 && int(-3.99) == -3",
    "string(42u) == '42' && string(b'abc') == 'abc' && bytes('é') == b'\\xc3\\xa9' && bool('t')",
]

RUNTIME_ERRORS = [
    ("{}.a && true", "no such key: a"),
    ("9223372036854775807 * 2 == 0", "integer overflow"),
    ("-9223372036854775808 / -1 == 0", "integer overflow"),
    ("0u - 1u == 0u", "unsigned integer overflow"),
    ("int(9.3e18) == 0", "range error"),
    ("uint(-1) == 0u", "range error"),
    ("[1, 2, 3][3] == 0", "out of range"),
    ("'%d %d'.format([1]) == ''", "index 1 out of range"),
    ("'%x'.format([0.5]) == ''", "only integers, byte buffers, and strings can be formatted as hex"),
    ("{'null_key': dyn(null)}.?null_key.invalid.hasValue()", "no such key"),
    ("{true: dyn(0)}[?true].absent.hasValue()", "no such key"),
    ("string(b'\\xff') == ''", "invalid UTF-8"),
]

COMPILE_ERRORS = [
    ("'hello' + 1 == ''", "found no matching overload for '_+_'"),
    ("[1].map(x, x).size() == 1 && x == 1", "undeclared reference to 'x'"),
    ("{'a': 1}.a.b == 1", "type 'int' does not support field selection"),
    ("1 == '1'", "found no matching overload for '_==_'"),
]


@pytest.mark.parametrize("expression", TRUE)
def test_conformance_true(expression: str) -> None:
    assert compile_selector(expression).evaluate(activation()) is True


@pytest.mark.parametrize(("expression", "message"), RUNTIME_ERRORS)
def test_conformance_runtime_error(expression: str, message: str) -> None:
    with pytest.raises(CelRuntimeError, match=re.escape(message)):
        compile_selector(expression).evaluate(activation())


@pytest.mark.parametrize(("expression", "message"), COMPILE_ERRORS)
def test_conformance_compile_error(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError, match=re.escape(message)):
        compile_selector(expression)
