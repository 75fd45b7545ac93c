"""Runtime values of the DRA CEL environment and the errors evaluation raises.

CEL values are plain Python values where the mapping is exact (int, float, str, bytes,
bool, None, tuple for lists, dict for maps) plus the small classes below for what Python
lacks: `Uint`, Kubernetes `Quantity` (apiserver/pkg/cel/quantity.go) and `Semver`
(apiserver/pkg/cel/semver.go, blang/semver ordering), CEL `optional_type` and type
values. `quota.cel.library` implements functions over these, `quota.cel.evaluator`
evaluates expressions with them, `quota.cel.activation` builds them from devices.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Final

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1


class EvalError(Exception):
    """A CEL error value: `&&`, `||` and the macros may absorb it (cel-go semantics)."""


class CostLimitExceeded(Exception):
    """The runtime cost budget is spent; never absorbed, always aborts the evaluation."""


class Uint(int):
    """CEL `uint`: an int that remembers its type (`1u != 1` only in type(), not in ==)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


class Quantity:
    """A Kubernetes resource.Quantity, held exactly; equality and order are by value.

    `cmp` is the value as a plain int when it is whole (nearly always: bytes, counts),
    because comparing Fractions costs more than the rest of a typical selector."""

    __slots__ = ("value", "cmp")

    def __init__(self, value: Fraction) -> None:
        self.value = value
        self.cmp: int | Fraction = value.numerator if value.denominator == 1 else value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.cmp == other.cmp

    def __hash__(self) -> int:
        return hash(self.cmp)

    def __repr__(self) -> str:
        return f"quantity({self.value})"


# Semver 2.0.0 as blang/semver/v4 parses it (the library semverlib.go calls semver.Parse).
_NUMERIC = re.compile(r"^(0|[1-9][0-9]*)$")
_IDENT_CHARS = re.compile(r"^[0-9A-Za-z-]+$")


class Semver:
    """A semantic version; `==` and ordering ignore build metadata, like blang/semver."""

    __slots__ = ("major", "minor", "patch", "pre", "build")

    def __init__(self, major: int, minor: int, patch: int, pre: tuple[int | str, ...], build: tuple[str, ...]) -> None:
        self.major = major
        self.minor = minor
        self.patch = patch
        self.pre = pre
        self.build = build

    def compare(self, other: Semver) -> int:
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        return _compare_pre(self.pre, other.pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __repr__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return f"semver({text})"


def _compare_pre(a: tuple[int | str, ...], b: tuple[int | str, ...]) -> int:
    # A version without pre-release ranks above any pre-release of the same core.
    if not a or not b:
        return (not a) - (not b)
    for x, y in zip(a, b):
        if x == y:
            continue
        if isinstance(x, int) and isinstance(y, int):
            return -1 if x < y else 1
        if isinstance(x, int):
            return -1  # numeric identifiers rank below alphanumeric ones
        if isinstance(y, int):
            return 1
        return -1 if x < y else 1
    return (len(a) > len(b)) - (len(a) < len(b))


def parse_semver(text: str) -> Semver:
    """blang/semver/v4 `Parse`, step by step and with its error wording (the scheduler
    surfaces it verbatim): split in three at the first two dots, then patch/pre/build."""
    if not text:
        raise EvalError("Version string empty")
    parts = text.split(".", 2)
    if len(parts) != 3:
        raise EvalError("No Major.Minor.Patch elements found")
    major = _core_number("major", parts[0])
    minor = _core_number("minor", parts[1])
    rest = parts[2]
    pre_at, build_at = rest.find("-"), rest.find("+")
    if pre_at != -1 and build_at != -1 and build_at < pre_at:
        pre_at = -1  # a '-' inside build metadata does not start a pre-release
    cut = min(i for i in (pre_at, build_at, len(rest)) if i != -1)
    patch = _core_number("patch", rest[:cut])
    pre: list[int | str] = []
    if pre_at != -1:
        pre_text = rest[pre_at + 1 : build_at if build_at != -1 else len(rest)]
        pre = [_pre_release(ident) for ident in pre_text.split(".")]
    build: list[str] = []
    if build_at != -1:
        for ident in rest[build_at + 1 :].split("."):
            if not ident:
                raise EvalError("Build meta data is empty")
            if not _IDENT_CHARS.match(ident):
                raise EvalError(f'Invalid character(s) found in build meta data "{ident}"')
            build.append(ident)
    return Semver(major, minor, patch, tuple(pre), tuple(build))


def _core_number(name: str, part: str) -> int:
    if not part.isascii() or not part.isdigit():
        raise EvalError(f'Invalid character(s) found in {name} number "{part}"')
    if len(part) > 1 and part[0] == "0":
        raise EvalError(f'{name.capitalize()} number must not contain leading zeroes "{part}"')
    # Length first: int() refuses more than 4300 digits with an error of its own.
    number = int(part) if len(part) <= 20 else UINT64_MAX + 1
    if number > UINT64_MAX:
        raise EvalError(f'strconv.ParseUint: parsing "{part[:64]}": value out of range')
    return number


def _pre_release(ident: str) -> int | str:
    if not ident:
        raise EvalError("Prerelease is empty")
    if not _IDENT_CHARS.match(ident):
        raise EvalError(f'Invalid character(s) found in prerelease "{ident}"')
    if ident.isdigit():
        if not _NUMERIC.match(ident):
            raise EvalError(f'Leading zeroes are not allowed in numeric prerelease "{ident}"')
        if len(ident) > 20 or int(ident) > UINT64_MAX:  # blang/semver: strconv.ParseUint
            raise EvalError(f'strconv.ParseUint: parsing "{ident[:64]}": value out of range')
        return int(ident)
    return ident


def normalize_and_parse_semver(text: str) -> Semver:
    """semverlib.go `normalizeAndParse`: drop a leading v, leading zeros, fill minor/patch."""
    if text.startswith("v"):
        text = text[1:]
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in "0123456789":
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise EvalError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return parse_semver(".".join(parts))


_ABSENT: Final = object()


class Optional:
    """CEL `optional_type` (cel-go OptionalTypes, enabled in the Kubernetes base env)."""

    __slots__ = ("_value",)

    def __init__(self, value: Any = _ABSENT) -> None:
        self._value = value

    @property
    def has_value(self) -> bool:
        return self._value is not _ABSENT

    @property
    def value(self) -> Any:
        if self._value is _ABSENT:
            raise EvalError("optional.none() dereference")
        return self._value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optional) or self.has_value != other.has_value:
            return False
        return not self.has_value or cel_equal(self._value, other._value)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"optional.of({self._value!r})" if self.has_value else "optional.none()"


OPTIONAL_NONE: Final = Optional()


class CelType:
    """A CEL type value, the result of `type(x)` or the identifiers `int`, `string`, ..."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and self.name == other.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name


_INFINITY_SPELLINGS = frozenset({"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


def go_parse_float(text: str) -> float:
    """strconv.ParseFloat(text, 64) as cel-go calls it for literals and double(string).

    Python's float() turns a finite number too large for a double into inf where Go
    reports ErrRange (and cel-go an error), and accepts blanks and `_` separators that
    Go refuses. Raises ValueError for anything Go would refuse.
    """
    if text != text.strip() or "_" in text:
        raise ValueError(text)
    value = float(text)
    if math.isinf(value) and text.lower() not in _INFINITY_SPELLINGS:
        raise ValueError(f"{text}: value out of range")
    return value


def type_name(value: Any) -> str:
    """The CEL type name of a runtime value, as used in error messages and `type()`."""
    kind = type(value)
    name = _TYPE_NAMES.get(kind)
    if name is not None:
        return name
    if isinstance(value, Uint):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, dict):
        return "map"
    return str(getattr(kind, "cel_type_name", kind.__name__))


_TYPE_NAMES: Final[dict[type, str]] = {
    bool: "bool",
    int: "int",
    Uint: "uint",
    float: "double",
    str: "string",
    bytes: "bytes",
    tuple: "list",
    list: "list",
    dict: "map",
    type(None): "null_type",
    Quantity: "kubernetes.Quantity",
    Semver: "kubernetes.Semver",
    Optional: "optional_type",
    CelType: "type",
}

# cel-go reports dynamic dispatch failures with its Go type names (compile_test.go expects
# "got 'types.Int', expected iterable type"); keep that wording for the same situations.
_GO_NAMES: Final[dict[str, str]] = {
    "bool": "types.Bool",
    "int": "types.Int",
    "uint": "types.Uint",
    "double": "types.Double",
    "string": "types.String",
    "bytes": "types.Bytes",
    "null_type": "types.Null",
    "kubernetes.Quantity": "cel.Quantity",
    "kubernetes.Semver": "cel.Semver",
    "optional_type": "*types.Optional",
    "type": "*types.Type",
}


def go_type_name(value: Any) -> str:
    name = type_name(value)
    return _GO_NAMES.get(name, name)


_NUMBERS: Final = (int, Uint, float)


def cel_equal(a: Any, b: Any) -> bool:
    """CEL heterogeneous equality: numbers compare by value across int/uint/double,
    other kinds only equal their own kind (so `true != 1` although Python says so)."""
    ta = type(a)
    tb = type(b)
    if ta is tb:
        if ta is tuple:
            return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b))
        if ta is dict:
            return _map_equal(a, b)
        return bool(a == b)
    if ta in _NUMBERS and tb in _NUMBERS:
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):  # DomainMap vs a map literal
        return _map_equal(a, b)
    return False


def _map_equal(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    if len(a) != len(b):
        return False
    for key, value in a.items():
        if key not in b or type(key) is bool and not any(type(k) is bool for k in b):
            return False
        if not cel_equal(value, b[key]):
            return False
    return True
