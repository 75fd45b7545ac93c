"""Conformance table: same expression, same device, same outcome as Kubernetes.

Cases are paraphrased from kubernetes/kubernetes
- staging/src/k8s.io/dynamic-resource-allocation/cel/compile_test.go (TestCEL: the DRA
  `device` variable, domains, missing keys, semver/quantity attributes, list-typed
  attributes and `includes`, macros, cel.bind, cost limit);
- staging/src/k8s.io/apiserver/pkg/cel/library/quantity_test.go (TestQuantity);
- staging/src/k8s.io/apiserver/pkg/cel/library/semver_test.go (TestSemver, version 1);
- staging/src/k8s.io/apiserver/pkg/cel/library/cost_test.go (the limit on nested
  comprehensions).
Library cases that return a value upstream are phrased as a boolean comparison with
the upstream expected value. Outcomes: True/False (match), `Compile(text)` (the
compile error contains text), `Runtime(text)` (evaluation error contains text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from quota.cel import CelCompileError, CelRuntimeError, compile_selector
from tests.unit.quota.cel.devices import activation


@dataclass(frozen=True)
class Compile:
    text: str


@dataclass(frozen=True)
class Runtime:
    text: str


Outcome = bool | Compile | Runtime
D = "dra.example.com"
TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"


def case(name: str, expression: str, outcome: Outcome, **device: Any) -> Any:
    return pytest.param(expression, device, outcome, id=name)


DRA_CASES = [
    case("true", "true", True),
    case("false", "false", False),
    case("syntax-error", "?!", Compile("Syntax error")),
    case("type-error", "1", Compile("must evaluate to bool or the unknown type, not int")),
    case("lookup-identifier-unknown-domain",
         'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))', Runtime("no such key: noSuchAttr")),
    case("lookup-map-unknown-domain",
         'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))', Runtime("no such key: noSuchAttr")),
    case("domain-check-negative", '"no-such-domain" in device.attributes', False),
    case("domain-check-positive", '"dra.example.com" in device.attributes', True,
         attributes={"dra.example.com/something": True}),
    case("empty-driver-name", 'device.driver == ""', True),
    case("real-driver-name", 'device.driver == "dra.example.com"', True, driver=D),
    case("driver-name-qualifier", 'device.attributes["dra.example.com"].name', True, driver=D, attributes={"name": True}),
    case("driver-name-qualifier-map-lookup", 'device.attributes["dra.example.com"]["name"]', True,
         driver=D, attributes={"name": True}),
    case("bind", 'cel.bind(dra, device.attributes["dra.example.com"], dra.name)', True,
         driver=D, attributes={"name": True}),
    case("qualified-attribute-name", 'device.attributes["other.example.com"].name', True,
         driver=D, attributes={"other.example.com/name": True}),
    case("bool", 'device.attributes["dra.example.com"].name', True, driver=D, attributes={"name": True}),
    case("int", 'device.attributes["dra.example.com"].name > 0', True, driver=D, attributes={"name": 1}),
    case("string", 'device.attributes["dra.example.com"].name == "fish"', True, driver=D, attributes={"name": "fish"}),
    case("macro-exists-on-int", 'device.attributes["dra.example.com"].name.exists(x, x > 0)',
         Runtime("got 'types.Int', expected iterable type"), driver=D, attributes={"name": 1}),
    case("macro-exists-on-bool", 'device.attributes["dra.example.com"].name.exists(x, x == true)',
         Runtime("got 'types.Bool', expected iterable type"), driver=D, attributes={"name": True}),
    case("macro-exists-on-string", 'device.attributes["dra.example.com"].name.exists(x, x == "fish")',
         Runtime("got 'types.String', expected iterable type"), driver=D, attributes={"name": "fish"}),
    case("macro-exists-on-version", 'device.attributes["dra.example.com"].name.exists(x, x.isGreaterThan(semver("0.0.1")))',
         Runtime("got 'cel.Semver', expected iterable type"), driver=D, attributes={"name": "v:1.0.0"}),
    case("list-result-type-causes-match-error", 'device.attributes["dra.example.com"].names',
         Runtime("CEL result of type list could not be converted to bool"), driver=D, attributes={"names": ["fish", "bird"]}),
    case("list-of-bool", 'device.attributes["dra.example.com"].names.size() == 2', True,
         driver=D, attributes={"names": [True, False]}),
    case("list-of-int", 'device.attributes["dra.example.com"].names.size() == 2', True, driver=D, attributes={"names": [1, 2]}),
    case("list-of-string", 'device.attributes["dra.example.com"].names.size() == 2', True,
         driver=D, attributes={"names": ["fish", "bird"]}),
    case("list-of-semver", 'device.attributes["dra.example.com"].names.size() == 2', True,
         driver=D, attributes={"names": ["v:1.0.0", "v:2.0.0"]}),
    case("macro-on-list-of-int", 'device.attributes["dra.example.com"].names.exists(x, x > 0)', True,
         driver=D, attributes={"names": [1, 2]}),
    case("macro-on-list-of-string", 'device.attributes["dra.example.com"].names.all(x, x != "")', True,
         driver=D, attributes={"names": ["fish", "bird"]}),
    case("macro-on-list-of-semver", 'device.attributes["dra.example.com"].names.all(x, x.isGreaterThan(semver("0.0.1")))',
         True, driver=D, attributes={"names": ["v:1.0.0", "v:2.0.0"]}),
    case("includes-list-evaluates", 'device.attributes["dra.example.com"].name.includes("fish")', True,
         driver=D, attributes={"name": ["fish", "bird"]}),
    case("includes-bool-scalar-positive", 'device.attributes["dra.example.com"].name.includes(true)', True,
         driver=D, attributes={"name": True}),
    case("includes-bool-scalar-negative", 'device.attributes["dra.example.com"].name.includes(true)', False,
         driver=D, attributes={"name": False}),
    case("includes-bool-list-positive", 'device.attributes["dra.example.com"].name.includes(true)', True,
         driver=D, attributes={"name": [True, False]}),
    case("includes-bool-list-negative", 'device.attributes["dra.example.com"].name.includes(false)', False,
         driver=D, attributes={"name": [True, True]}),
    case("includes-int-scalar-positive", 'device.attributes["dra.example.com"].name.includes(1)', True,
         driver=D, attributes={"name": 1}),
    case("includes-int-scalar-negative", 'device.attributes["dra.example.com"].name.includes(1)', False,
         driver=D, attributes={"name": 2}),
    case("includes-int-list-positive", 'device.attributes["dra.example.com"].name.includes(1)', True,
         driver=D, attributes={"name": [1, 2]}),
    case("includes-int-list-negative", 'device.attributes["dra.example.com"].name.includes(3)', False,
         driver=D, attributes={"name": [1, 2]}),
    case("includes-string-scalar-positive", 'device.attributes["dra.example.com"].name.includes("fish")', True,
         driver=D, attributes={"name": "fish"}),
    case("includes-string-scalar-negative", 'device.attributes["dra.example.com"].name.includes("bird")', False,
         driver=D, attributes={"name": "fish"}),
    case("includes-string-list-negative", 'device.attributes["dra.example.com"].name.includes("cat")', False,
         driver=D, attributes={"name": ["fish", "bird"]}),
    case("includes-semver-scalar-positive", 'device.attributes["dra.example.com"].name.includes(semver("1.0.0"))', True,
         driver=D, attributes={"name": "v:1.0.0"}),
    case("includes-semver-scalar-negative", 'device.attributes["dra.example.com"].name.includes(semver("2.0.0"))', False,
         driver=D, attributes={"name": "v:1.0.0"}),
    case("includes-semver-list-positive", 'device.attributes["dra.example.com"].name.includes(semver("1.0.0"))', True,
         driver=D, attributes={"name": ["v:1.0.0", "v:2.0.0"]}),
    case("includes-semver-list-negative", 'device.attributes["dra.example.com"].name.includes(semver("3.0.0"))', False,
         driver=D, attributes={"name": ["v:1.0.0", "v:2.0.0"]}),
    case("includes-very-long-list-positive", 'device.attributes["dra.example.com"].name.includes("value-48")', False,
         driver=D, attributes={"name": [f"value-{i}" for i in range(48)]}),
    case("includes-very-long-list-runtime-error", 'device.attributes["dra.example.com"].name.includes("value-49")',
         Runtime("'includes' function cannot be applied to lists longer than 48 values"),
         driver=D, attributes={"name": [f"value-{i}" for i in range(49)]}),
    case("in-operator-on-list", '1 in device.attributes["dra.example.com"].names', True,
         driver=D, attributes={"names": [1, 2, 3]}),
    case("version", 'device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))', True,
         driver=D, attributes={"name": "v:1.0.0"}),
    case("version_v", 'device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)',
         True, driver=D, attributes={"name": "v:1.0.0"}),
    case("quantity", 'device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))', True,
         driver=D, capacity={"name": "1Mi"}),
    case("check-positive",
         '"name" in device.capacity["dra.example.com"] && device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
         True, driver=D, capacity={"name": "1Mi"}),
    case("check-negative",
         '!("name" in device.capacity["dra.example.com"]) || device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))',
         True),
    case("all", """
device.capacity["dra.example.com"].quantity.isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"].bool &&
device.attributes["dra.example.com"].int > 0 &&
device.attributes["dra.example.com"].string == "fish" &&
device.attributes["dra.example.com"].version.isGreaterThan(semver("0.0.1")) &&
device.capacity["dra.example.com"]["quantity"].isGreaterThan(quantity("1Ki")) &&
device.attributes["dra.example.com"]["bool"] &&
device.attributes["dra.example.com"]["int"] > 0 &&
device.attributes["dra.example.com"]["string"] == "fish" &&
device.attributes["dra.example.com"]["version"].isGreaterThan(semver("0.0.1"))
""", True, driver=D, attributes={"bool": True, "int": 1, "string": "fish", "version": "v:1.0.0"}, capacity={"quantity": "1Mi"}),
    case("many", 'device.attributes["dra.example.com"].a && device.attributes["dra.example.com"].b && device.attributes["dra.example.com"].c',
         True, driver=D, attributes={"a": True, "b": True, "c": True}),
    case("check_attribute_domains", 'device.attributes.exists_one(x, x == "dra.example.com")', True,
         driver=D, attributes={"services": "some_example_value"}),
    case("check_attribute_ids", 'device.attributes["dra.example.com"].exists_one(x, x == "services")', True,
         driver=D, attributes={"services": "some_example_value"}),
    case("split_attribute", 'device.attributes["dra.example.com"].services.split("example").size() >= 2', True,
         driver=D, attributes={"services": "some_example_value"}),
    case("regexp_attribute", 'device.attributes["dra.example.com"].services.matches("[^a]?sym")', True,
         driver=D, attributes={"services": "asymetric"}),
    case("check_capacity_domains", 'device.capacity.exists_one(x, x == "dra.example.com")', True,
         driver=D, capacity={"memory": "1Mi"}),
    case("check_capacity_ids", 'device.capacity["dra.example.com"].exists_one(x, x == "memory")', True,
         driver=D, capacity={"memory": "1Mi"}),
    case("expensive",
         f"{TEN}.all(x, {TEN}.all(y, {TEN}.all(z, {TEN}.all(z2, {TEN}.all(z3, {TEN}.all(z4, {TEN}.all(z5, "
         "int('1'.find('[0-9]*')) < 100)))))))",
         Runtime("actual cost limit exceeded"), driver=D,
         attributes={f"dra.example.com/{'x' * (63 - len(f'-{i}'))}-{i}": "abc" for i in range(32)}),
    case("allow_multiple_allocations", "device.allowMultipleAllocations == true", True,
         driver=D, allow_multiple_allocations=True),
    case("allow_multiple_allocations_default", "device.allowMultipleAllocations == false", True, driver=D),
]

QUANTITY_CASES = [
    case("parse", 'quantity("12Mi") == quantity("12582912")', True),
    case("parseInvalidSuffix", 'quantity("10Mo") == quantity("1")', Runtime("quantities must match the regular expression")),
    case("parseInvalidSuffixPassesRegex", 'quantity("10Mm") == quantity("1")', Runtime("unable to parse quantity's suffix")),
    case("isQuantity", 'isQuantity("20")', True),
    case("isQuantity_megabytes", 'isQuantity("20M")', True),
    case("isQuantity_mebibytes", 'isQuantity("20Mi")', True),
    case("isQuantity_invalidSuffix", 'isQuantity("20Mo")', False),
    case("isQuantity_passingRegex", 'isQuantity("10Mm")', False),
    case("isQuantity_noOverload", "isQuantity([1, 2, 3])", Compile("found no matching overload for 'isQuantity' applied to")),
    case("equality_reflexivity", 'quantity("200M") == quantity("200M")', True),
    case("equality_symmetry", 'quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")', True),
    case("equality_transitivity",
         'quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M") && quantity("0.002G") == quantity("2000k")', True),
    case("inequality", 'quantity("200M") == quantity("0.3G")', False),
    case("binary-equality", 'quantity("64Gi") == quantity("65536Mi")', True),
    case("quantity_less", 'quantity("50M").isLessThan(quantity("50Mi"))', True),
    case("quantity_less_obvious", 'quantity("50M").isLessThan(quantity("100M"))', True),
    case("quantity_less_false", 'quantity("100M").isLessThan(quantity("50M"))', False),
    case("quantity_greater", 'quantity("50Mi").isGreaterThan(quantity("50M"))', True),
    case("quantity_greater_obvious", 'quantity("150Mi").isGreaterThan(quantity("100Mi"))', True),
    case("quantity_greater_false", 'quantity("50M").isGreaterThan(quantity("100M"))', False),
    case("compare_equal", 'quantity("200M").compareTo(quantity("0.2G")) == 0', True),
    case("compare_less", 'quantity("50M").compareTo(quantity("50Mi")) == -1', True),
    case("compare_greater", 'quantity("50Mi").compareTo(quantity("50M")) == 1', True),
    case("add_quantity", 'quantity("50k").add(quantity("20")) == quantity("50.02k")', True),
    case("add_int", 'quantity("50k").add(20).isLessThan(quantity("50020"))', False),
    case("sub_quantity", 'quantity("50k").sub(quantity("20")) == quantity("49.98k")', True),
    case("sub_int", 'quantity("50k").sub(20) == quantity("49980")', True),
    case("multiply", 'quantity("50k").mul(2) == quantity("100000")', True),
    case("divide_float_result", 'quantity("10000").div(3).asApproximateFloat() > 3333.3332 && '
         'quantity("10000").div(3).asApproximateFloat() < 3333.3334', True),
    case("divide_scaled", 'quantity("10k").div(2) == quantity("5000")', True),
    case("integer_division", 'quantity("10000").divInt(3) == quantity("3333")', True),
    case("arith_chain_1", 'quantity("50k").add(20).sub(quantity("100k")).asInteger() == -49980', True),
    case("arith_chain", 'quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() == 20', True),
    case("as_integer", 'quantity("50k").asInteger() == 50000', True),
    case("as_integer_error", 'quantity("9999999999999999999999999999999999999G").asInteger() == 0',
         Runtime("cannot convert value to integer")),
    case("is_integer_false", 'quantity("9999999999999999999999999999999999999G").isInteger()', False),
    case("is_integer", 'quantity("50").isInteger()', True),
    case("as_float", 'quantity("50.703k").asApproximateFloat() == 50703.0', True),
    case("sign", 'sign(quantity("-20")) == -1 && quantity("0").sign() == 0', True),
]

SEMVER_CASES = [
    case("parse", 'semver("1.2.3") == semver("1.2.3")', True),
    case("parseInvalidVersion", 'semver("v1.0") == semver("1.0.0")', Runtime("No Major.Minor.Patch elements found")),
    case("isSemver", 'isSemver("1.2.3-beta.1+build.1")', True),
    case("isSemver_empty_false", 'isSemver("")', False),
    case("isSemver_v_prefix_false", 'isSemver("v1.0.0")', False),
    case("isSemver_v_leading_whitespace_false", 'isSemver(" 1.0.0")', False),
    case("isSemver_v_contains_whitespace_false", 'isSemver("1. 0.0")', False),
    case("isSemver_v_trailing_whitespace_false", 'isSemver("1.0.0 ")', False),
    case("isSemver_leading_zeros_false", 'isSemver("01.01.01")', False),
    case("isSemver_major_only_false", 'isSemver("1")', False),
    case("isSemver_major_minor_only_false", 'isSemver("1.1")', False),
    case("isSemver_empty_normalize_false", 'isSemver("", true)', False),
    case("isSemver_v_leading_whitespace_normalize_false", 'isSemver(" 1.0.0", true)', False),
    case("isSemver_v_contains_whitespace_normalize_false", 'isSemver("1. 0.0", true)', False),
    case("isSemver_v_trailing_whitespace_normalize_false", 'isSemver("1.0.0 ", true)', False),
    case("isSemver_v_prefix_normalize_true", 'isSemver("v1.0.0", true)', True),
    case("isSemver_leading_zeros_normalize_true", 'isSemver("01.01.01", true)', True),
    case("isSemver_major_only_normalize_true", 'isSemver("1", true)', True),
    case("isSemver_major_minor_only_normalize_true", 'isSemver("1.1", true)', True),
    case("isSemver_noOverload", "isSemver([1, 2, 3])", Compile("found no matching overload for 'isSemver' applied to")),
    case("equality_normalize", 'semver("v01.01", true) == semver("1.1.0")', True),
    case("equality_reflexivity", 'semver("1.2.3") == semver("1.2.3")', True),
    case("inequality", 'semver("1.2.3") == semver("1.0.0")', False),
    case("semver_less", 'semver("1.0.0").isLessThan(semver("1.2.3"))', True),
    case("semver_less_false", 'semver("1.0.0").isLessThan(semver("1.0.0"))', False),
    case("semver_greater", 'semver("1.2.3").isGreaterThan(semver("1.0.0"))', True),
    case("semver_greater_false", 'semver("1.0.0").isGreaterThan(semver("1.0.0"))', False),
    case("compare_equal", 'semver("1.2.3").compareTo(semver("1.2.3")) == 0', True),
    case("compare_less", 'semver("1.0.0").compareTo(semver("1.2.3")) == -1', True),
    case("compare_greater", 'semver("1.2.3").compareTo(semver("1.0.0")) == 1', True),
    case("major", 'semver("1.2.3").major() == 1', True),
    case("minor", 'semver("1.2.3").minor() == 2', True),
    case("patch", 'semver("1.2.3").patch() == 3', True),
]


def _outcome(expression: str, device: dict[str, Any]) -> Outcome:
    try:
        selector = compile_selector(expression)
    except CelCompileError as exc:
        return Compile(str(exc))
    try:
        return selector.evaluate(activation(**device))
    except CelRuntimeError as exc:
        return Runtime(str(exc))


@pytest.mark.parametrize(("expression", "device", "expected"), DRA_CASES + QUANTITY_CASES + SEMVER_CASES)
def test_upstream_case(expression: str, device: dict[str, Any], expected: Outcome) -> None:
    actual = _outcome(expression, device)
    if isinstance(expected, bool):
        assert actual is expected
    else:
        assert type(actual) is type(expected), actual
        assert expected.text in actual.text
