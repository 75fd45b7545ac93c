"""CEL language semantics as cel-go implements them, on the DRA `device` variable.

Not taken from one upstream test file: these pin the behaviours the scheduler relies
on through cel-go (cel-spec langdef; cel-go interpreter and ext libraries as enabled by
k/k staging/src/k8s.io/apiserver/pkg/cel/environment/base.go): error absorption by
`&&`/`||`, optional syntax, `cel.bind`, int64 overflow, heterogeneous equality,
homogeneous literals, the string/list/regex/sets extensions, and the exact wording of
the errors a user sees.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota.cel import CelCompileError, CelRuntimeError, compile_selector
from tests.unit.quota.cel.devices import activation

NV = 'device.attributes["gpu.nvidia.com"]'
DEVICE: dict[str, Any] = {
    "driver": "gpu.nvidia.com",
    "attributes": {
        "type": "gpu", "index": 3, "productName": "NVIDIA H100 80GB HBM3", "cc": "v:9.0.0",
        "names": ["a", "b"], "resource.kubernetes.io/pcieRoot": "pci0000:00",
    },
    "capacity": {"memory": "80Gi", "cores": "132"},
}

MATCHING = [
    # && and || absorb an error when the other side decides (cel-go commutative logic).
    f"!({NV}.missing && false)",
    f"!(false && {NV}.missing)",
    f"true || {NV}.missing",
    f"{NV}.missing || true",
    # all / exists absorb an element's error when another element decides, even a later one.
    f"[1, 0].exists(x, 1 / x == 1) && [0, 1].exists(x, 1 / x == 1)",
    f"![1, 0].all(x, 1 / x == 2) && ![0, 1].all(x, 1 / x == 2)",
    # presence tests and optionals
    f"has({NV}.type) && !has({NV}.nope)",
    f'"type" in {NV} && !("nope" in {NV})',
    f"!{NV}.?nope.hasValue() && {NV}.?type.value() == \"gpu\"",
    f'{NV}[?"index"].orValue(0) > 2',
    'device.attributes["unknown.domain"].?x.orValue(5) == 5',
    f"{NV}.?type.orValue({NV}.missing) == \"gpu\"",
    "optional.of(1).hasValue() && !optional.none().hasValue() && optional.none().orValue(3) == 3",
    "optional.none().or(optional.of(2)).value() == 2",
    "![dyn(0), dyn(false), dyn(''), dyn([]), dyn({}), dyn(0.0), dyn(0u), dyn(null)]"
    ".exists(z, optional.ofNonZeroValue(z).hasValue())",
    "[dyn(1), dyn(true), dyn('a'), dyn([0]), dyn({'k': 0}), dyn(0.5), dyn(1u)]"
    ".all(z, optional.ofNonZeroValue(z).hasValue())",
    "[?optional.of(1), ?optional.none()] == [1]",
    '{"a": 1, ?"b": optional.none()}.size() == 1',
    # cel.bind is a lazy substitution
    f"cel.bind(x, {NV}.missing, true)",
    f"cel.bind(x, {NV}, x.index + 1 == 4)",
    "cel.bind(a, 2, cel.bind(b, a * a, b + a == 6))",
    # numbers
    "-7 / 2 == -3 && -7 % 2 == -1 && 7 % -2 == 1",
    "-9223372036854775808 < 0 && 9223372036854775807 > 0",
    "dyn(1) == 1.0 && dyn(1u) == 1 && 1 < 1.5 && 2u > 1 && 1.0 / 0.0 > 1e308",
    "1u + 1u == 2u && 0x10 == 16 && 1e3 == 1000.0",
    f"{NV}.index * 2 == 6 && {NV}.type != 1",
    "int(\"12\") == 12 && uint(\"3\") == 3u && double(\"1.5\") == 1.5 && int(2.9) == 2 && int(-2.9) == -2",
    'string(1.5) == "1.5" && string(100.0) == "100" && string(1e6) == "1e+06" && string(123456.0) == "123456" && string(0.00001) == "1e-05" && string(true) == "true"',
    'bool("true") && !bool("False") && bytes("a") == b"a" && string(b"\\x61") == "a"',
    'type(1) == int && type("a") == string && type([]) == list && type({}) == map && type(1u) != int',
    # strings (ext.Strings v2)
    f'{NV}.productName.lowerAscii().contains("h100") && "abc".upperAscii() == "ABC"',
    f'{NV}.productName.split(" ")[1] == "H100" && "a,b,c".split(",", 2) == ["a", "b,c"]',
    f'{NV}.productName.substring(7, 11) == "H100" && "héllo".substring(1) == "éllo"',
    f'{NV}.productName.indexOf("H1") == 7 && "aXbX".lastIndexOf("X") == 3 && "aXbX".indexOf("X", 2) == 3',
    f'{NV}.productName.replace(" ", "_") == "NVIDIA_H100_80GB_HBM3" && "aaa".replace("a", "b", 2) == "bba"',
    '"  x ".trim() == "x" && "abc".charAt(1) == "b" && "abc".charAt(3) == ""',
    '["b", "a"].join("-") == "b-a" && ["x", "y"].join() == "xy"',
    'size("héllo") == 5 && "héllo".size() == 5 && b"abc".size() == 3',
    'strings.quote("a\\"b") == "\\"a\\\\\\"b\\""',
    # regex (RE2)
    f'{NV}.productName.matches("^NVIDIA") && matches("abc", "b")',
    f'{NV}.productName.find("[0-9]+GB") == "80GB" && {NV}.productName.findAll("[0-9]+").size() == 3',
    '"abc".find("z") == "" && "a1b2c3".findAll("[0-9]", 2) == ["1", "2"]',
    # lists (Kubernetes lists library, ext.Lists)
    "[3, 1, 2].sort() == [1, 2, 3] && [1, 2, 3].isSorted() && ![2, 1].isSorted()",
    "[1, 2, 3].sum() == 6 && [1, 2, 3].min() == 1 && [1, 2, 3].max() == 3 && [1.5, 2.5].sum() == 4.0",
    "[1, 2, 3].indexOf(2) == 1 && [1, 2, 2].lastIndexOf(2) == 2 && [1].indexOf(5) == -1",
    "[1, 2, 3].slice(1, 2) == [2] && [[1], [2]].flatten() == [1, 2] && [1, 1, 2].distinct() == [1, 2]",
    "[1, 2].reverse() == [2, 1] && lists.range(3) == [0, 1, 2] && [1, 2].first().value() == 1",
    '[3, 1, 2].sortBy(x, x) == [1, 2, 3] && ["bb", "a", "ccc"].sortBy(s, -s.size()) == ["ccc", "bb", "a"]',
    '[{"n": "b", "v": dyn(2)}, {"n": "a", "v": dyn(2)}, {"n": "c", "v": dyn(1)}].sortBy(m, m.v).map(m, m.n) == ["c", "b", "a"]',
    '[quantity("2Gi"), quantity("1Gi")].min() == quantity("1024Mi")',
    "sets.contains([1, 2, 3], [2]) && sets.intersects([1], [1, 2]) && sets.equivalent([1, 2], [2, 1, 1])",
    # macros
    f'{NV}.names.exists(n, n == "b") && {NV}.names.all(n, n.size() == 1)',
    f'{NV}.names.asList().size() == 2 && {NV}.type.asList() == ["gpu"]',
    f'{NV}.names.map(n, n + "!").join(",") == "a!,b!" && {NV}.names.filter(n, n != "a") == ["b"]',
    "[1, 2, 3].map(x, x > 1, x * 10) == [20, 30] && [1, 2, 3].exists_one(x, x == 2)",
    '{"a": 1, "b": 2}.all(k, k.size() == 1) && {"a": 1}.exists(k, k == "a")',
    # the device
    'device.driver.startsWith("gpu.") && !device.allowMultipleAllocations',
    'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',
    '"gpu.nvidia.com" in device.attributes && !("amd.com" in device.attributes) && device.attributes.size() == 2',
    'device.attributes["amd.com"].size() == 0 && device.capacity["amd.com"] == {}',
    f"{NV}.cc.major() == 9 && {NV}.cc == semver(\"9.0.0\") && {NV}.cc != semver(\"9.0.1\")",
    'device.capacity["gpu.nvidia.com"].memory == quantity("80Gi") && device.capacity["gpu.nvidia.com"].memory.asInteger() == 85899345920',
    f"{NV}[\"ty\" + \"pe\"] == \"gpu\"",
    "(1 > 0 ? device.attributes[\"gpu.nvidia.com\"] : device.attributes[\"x\"]).type == \"gpu\"",
    "semver(\"1.0.0-alpha\").isLessThan(semver(\"1.0.0\")) && semver(\"1.0.0-alpha.1\").isLessThan(semver(\"1.0.0-alpha.beta\"))",
    'semver("1.0.0+build1") == semver("1.0.0+build2")',
    "// a comment\ntrue",
]

FAILING_AT_RUNTIME = [
    (f"{NV}.missing && true", "no such key: missing"),
    ("9223372036854775807 + 1 > 0", "integer overflow"),
    ("-9223372036854775808 - 1 < 0", "integer overflow"),
    ("[-9223372036854775808][0] / -1 == 0", "integer overflow"),
    ("1 / 0 == 0", "division by zero"),
    ("5 % 0 == 0", "modulus by zero"),
    ("0u - 1u == 0u", "unsigned integer overflow"),
    ('{"a": 1}.b == 1', "no such key: b"),
    ("[1, 2][5] == 1", "index '5' out of range in list size '2'"),
    ("[1, 2][dyn(1.5)] == 1", "unsupported index value 1.5 in list"),
    (f"{NV}.type > 1", "no such overload"),
    (f'{NV}.index.isGreaterThan(quantity("1"))', "no such overload"),
    ('int("x") == 1', 'cannot convert string "x" to int'),
    ("int(1e30) == 1", "range error"),
    ('double("1_000") == 1000.0', 'cannot convert string "1_000" to double'),
    ('double(" 1.5") == 1.5', "cannot convert string"),
    ("[].min() == 1", "min called on empty list"),
    ("optional.none().value() == 1", "optional.none() dereference"),
    ('"abc".substring(2, 1) == ""', "invalid substring range"),
    ('"abc".matches(["("][0])', "invalid regular expression"),
    (f"{NV}.names", "CEL result of type list could not be converted to bool"),
    (f"{NV}.missing.exists(x, x)", "no such key: missing"),
    ("[1, 0].exists_one(x, 1 / x == 1)", "division by zero"),
    ('[{"a": 1}][0].b == 1', "no such key: b"),
    ("dyn(1) && true", "no such overload"),
]

COMPILE_ERRORS = [
    ("1 == 1.0", "found no matching overload for '_==_' applied to '(int, double)'"),
    ("1 + 1u == 2", "found no matching overload for '_+_' applied to '(int, uint)'"),
    ('[1, "a"].size() == 2', "expected type 'int' but found 'string'"),
    ('{"a": 1, "b": "x"}.size() == 2', "expected type 'int' but found 'string'"),
    ('device["driver"] == "x"', "found no matching overload for '_[_]'"),
    ("device.foo", "undefined field 'foo'"),
    ("foo", "undeclared reference to 'foo' (in container '')"),
    ("device.driver.foo()", "undeclared reference to 'foo'"),
    ('quantity("1").isGreaterThan(semver("1.0.0"))', "found no matching overload for 'isGreaterThan'"),
    ("device.driver", "must evaluate to bool or the unknown type, not string"),
    ('quantity("1")', "must evaluate to bool or the unknown type, not kubernetes.Quantity"),
    ("1.exists(x, x > 0)", "cannot be range of a comprehension"),
    ("has(device)", "invalid argument to has() macro"),
    ("[1].all(x.y, true)", "variable name must be a simple identifier"),
    ("9223372036854775808 > 0", "invalid int literal"),
    ("1 && true", "found no matching overload for '_&&_'"),
    ('device.driver.matches("(")', "invalid matches argument"),
    ("-1u == 1u", "found no matching overload for '-_'"),
    ('url("https://example.com/x").getHost() == "example.com"', "not supported by dra-quota"),
    ('duration("1x") > duration("0s")', "invalid duration argument"),
    ('timestamp("2023-13-01T00:00:00Z") > timestamp(0)', "invalid timestamp argument"),
    ('timestamp(0) + timestamp(0) > timestamp(0)', "found no matching overload for '_+_'"),
    ('url("https://example.com").getHost() == "x"', "not supported by dra-quota"),
    ("device.attributes.x{}", "message construction is not supported"),
    ("while", "reserved identifier 'while'"),
    ('"\\q" == "q"', "invalid escape sequence"),
    ("a +", "Syntax error: mismatched input '<EOF>'"),
    ("1 # 2", "Syntax error: token recognition error at: '#'"),
    ("(" * 300 + "1 < 0" + ")" * 300, "expression recursion limit exceeded"),
]


@pytest.fixture(scope="module")
def device() -> Any:
    return activation(**DEVICE)


@pytest.mark.parametrize("expression", MATCHING)
def test_matches(expression: str, device: Any) -> None:
    assert compile_selector(expression).evaluate(device) is True


@pytest.mark.parametrize(("expression", "message"), FAILING_AT_RUNTIME)
def test_runtime_error(expression: str, message: str, device: Any) -> None:
    selector = compile_selector(expression)
    with pytest.raises(CelRuntimeError) as info:
        selector.evaluate(device)
    assert message in str(info.value)


@pytest.mark.parametrize(("expression", "message"), COMPILE_ERRORS)
def test_compile_error(expression: str, message: str) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expression)
    assert message in str(info.value)


def test_compile_error_points_at_the_problem() -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector('device.attributes["d"].x == 1 &&\n  nope > 2')
    assert str(info.value) == (
        "compilation failed: ERROR: <input>:2:3: undeclared reference to 'nope' (in container '')\n"
        " |   nope > 2\n"
        " | ..^"
    )


def test_compile_errors_are_value_errors_and_cached() -> None:
    with pytest.raises(ValueError):
        compile_selector("nope")
    with pytest.raises(CelCompileError):
        compile_selector("nope")


def test_compiled_selectors_are_cached_and_expose_the_expression() -> None:
    first = compile_selector("device.driver == 'a'")
    assert compile_selector("device.driver == 'a'") is first
    assert first.expression == "device.driver == 'a'"


def test_unparseable_version_fails_every_selector_on_that_device() -> None:
    # compile.go getAttributeValue: the whole match fails with the parse error.
    broken = activation("d", attributes={"v": "v:1.0", "ok": True})
    with pytest.raises(CelRuntimeError, match="parse semantic version: No Major.Minor.Patch"):
        compile_selector('device.attributes["d"].ok').evaluate(broken)


TWO_VARIABLE = [
    "[10, 20].all(i, v, v == (i + 1) * 10)",
    '{"a": 1, "b": 2}.exists(k, v, k == "b" && v == 2)',
    "[1, 2, 3].existsOne(i, v, v == 2) && ![1, 2, 2].exists_one(i, v, v == 2)",
    "[1, 2, 3].transformList(i, v, v * i) == [0, 2, 6]",
    "[1, 2, 3].transformList(i, v, v > 1, v * i) == [2, 6]",
    '{"a": 1}.transformMap(k, v, v + 1) == {"a": 2} && [5, 6].transformMap(i, v, v) == {0: 5, 1: 6}',
    '{"a": 1, "b": 2}.transformMapEntry(k, v, {v: k}) == {1: "a", 2: "b"}',
    f'{NV}.all(k, v, k != "" && (k != "index" || v == 3))',
    "![2, 0].all(i, v, 1 / v == 1) && ![0, 2].all(i, v, 1 / v == 1) && [0, 1].exists(i, v, 1 / v == 1)",
]


@pytest.mark.parametrize("expression", TWO_VARIABLE)
def test_two_variable_comprehensions(expression: str, device: Any) -> None:
    assert compile_selector(expression).evaluate(device) is True


def test_two_variable_comprehension_needs_distinct_names() -> None:
    with pytest.raises(CelCompileError, match="variable names must be different"):
        compile_selector("[1].all(x, x, true)")


TIME = [
    'timestamp("2023-02-03T23:31:20Z") < timestamp("2023-02-03T23:31:21Z")',
    'string(timestamp("2023-02-03T23:31:20.5+01:00")) == "2023-02-03T22:31:20.5Z"',
    'timestamp("2023-01-01T00:00:00Z") - timestamp("2022-12-31T00:00:00Z") == duration("24h")',
    'duration("1h45m47s") == duration("6347s") && string(duration("1h45m47s")) == "6347s" && string(duration("1.5s")) == "1.5s"',
    'timestamp("2023-01-01T00:00:00Z") + duration("1h") > timestamp("2023-01-01T00:59:59Z")',
    'timestamp("2023-03-15T10:20:30.123Z").getFullYear() == 2023 && timestamp("2023-03-15T10:20:30.123Z").getMonth() == 2',
    'timestamp("2023-03-15T10:20:30.123Z").getDate() == 15 && timestamp("2023-03-15T10:20:30.123Z").getDayOfMonth() == 14',
    'timestamp("2023-03-15T10:20:30.123Z").getDayOfWeek() == 3 && timestamp("2023-03-15T10:20:30.123Z").getDayOfYear() == 73',
    'timestamp("2023-03-15T10:20:30.123Z").getMilliseconds() == 123 && timestamp("2023-03-15T10:20:30Z").getHours("+05:30") == 15',
    'duration("-1.5h").getMinutes() == -90 && duration("90m").getHours() == 1 && duration("2s").getMilliseconds() == 2000',
    'int(timestamp("2004-09-16T23:59:59Z")) == 1095379199 && timestamp(1095379199) == timestamp("2004-09-16T23:59:59Z")',
    '"%s".format([duration("2h")]) == "7200s" && "%s".format([timestamp(0)]) == "1970-01-01T00:00:00Z"',
]


@pytest.mark.parametrize("expression", TIME)
def test_timestamps_and_durations(expression: str, device: Any) -> None:
    assert compile_selector(expression).evaluate(device) is True


def test_time_range_errors() -> None:
    with pytest.raises(CelRuntimeError, match="timestamp out of range"):
        compile_selector('timestamp("9999-12-31T23:59:59Z") + duration("1s") > timestamp(0)').evaluate(activation())
    with pytest.raises(CelRuntimeError, match="unknown time zone"):
        compile_selector('timestamp(0).getHours("Mars/Olympus") == 0').evaluate(activation())


NETWORK = [
    'ip("10.0.0.1").family() == 4 && ip("::1").family() == 6',
    'isIP("10.0.0.1") && !isIP("10.0.0.256") && !isIP("::ffff:1.2.3.4") && !isIP("fe80::1%eth0") && !isIP("010.0.0.1")',
    'ip.isCanonical("2001:db8::1") && !ip.isCanonical("2001:DB8::1")',
    'ip("127.0.0.1").isLoopback() && ip("0.0.0.0").isUnspecified() && ip("10.0.0.1").isGlobalUnicast()',
    '!ip("255.255.255.255").isGlobalUnicast() && ip("224.0.0.1").isLinkLocalMulticast() && ip("fe80::1").isLinkLocalUnicast()',
    'cidr("10.0.0.0/8").containsIP(ip("10.1.2.3")) && cidr("10.0.0.0/8").containsIP("10.1.2.3") && !cidr("10.0.0.0/8").containsIP("::1")',
    'cidr("10.0.0.0/8").containsCIDR("10.1.0.0/16") && !cidr("10.1.0.0/16").containsCIDR(cidr("10.0.0.0/8"))',
    'cidr("192.168.0.1/24").ip() == ip("192.168.0.1") && cidr("192.168.0.1/24").masked() == cidr("192.168.0.0/24")',
    'cidr("192.168.0.1/24").prefixLength() == 24 && string(cidr("192.168.0.1/24")) == "192.168.0.1/24"',
    'isCIDR("10.0.0.0/8") && !isCIDR("10.0.0.0") && !isCIDR("10.0.0.0/33")',
    f'cidr("10.0.0.0/8").containsIP({NV}.type == "gpu" ? "10.0.0.9" : "::1")',
]


@pytest.mark.parametrize("expression", NETWORK)
def test_ip_and_cidr_libraries(expression: str, device: Any) -> None:
    assert compile_selector(expression).evaluate(device) is True


def test_ip_errors_name_the_input() -> None:
    with pytest.raises(CelRuntimeError, match='IPv4-mapped IPv6 address "::ffff:1.2.3.4" is not allowed'):
        compile_selector('ip("::ffff:1.2.3.4").family() == 6').evaluate(activation())


@pytest.mark.parametrize("value", [1, None, ["device.driver == 'a'"]])
def test_non_string_expression_is_a_compile_error(value: Any) -> None:
    with pytest.raises(CelCompileError, match="expression must be a string"):
        compile_selector(value)
