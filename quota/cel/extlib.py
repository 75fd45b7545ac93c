"""The extension libraries of the Kubernetes CEL base environment, over `quota.cel.values`.

Registered into `quota.cel.library.REGISTRY` on import:
- cel-go ext.Strings version 2 (base.go enables it from 1.29): charAt, indexOf,
  lastIndexOf, lowerAscii, upperAscii, replace, split, substring, trim, join, strings.quote;
- Kubernetes regex library (apiserver/pkg/cel/library/regex.go): find, findAll, and
  cel's `matches`, all with RE2 semantics (google-re2 when installed, so a hostile
  pattern cannot backtrack for ever);
- Kubernetes lists library (library/lists.go): isSorted, sum, min, max, indexOf,
  lastIndexOf; and the cel-go ext.Lists functions slice, flatten, distinct, reverse,
  sort, first, last, lists.range;
- cel-go ext.Sets: sets.contains, sets.equivalent, sets.intersects.
Sizes feed the runtime cost (`scan_cost`), which `quota.cel.runtime` enforces;
`format` lives in `quota.cel.strformat`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from quota.cel.library import check_int, register, scan_cost
from quota.cel.values import (
    OPTIONAL_NONE,
    EvalError,
    Optional,
    Quantity,
    Semver,
    Uint,
    cel_equal,
    type_name,
)

try:  # RE2 like cel-go: linear time, no backreferences or lookaround.
    import re2 as _re2  # type: ignore[import-untyped,import-not-found,unused-ignore]

    _OPTIONS = _re2.Options()
    _OPTIONS.log_errors = False
    HAVE_RE2 = True
except ImportError:  # pragma: no cover - depends on the environment
    _re2 = None
    HAVE_RE2 = False


# --- ext.Strings v2 ---------------------------------------------------------------


@register("charAt", "string, int -> string", member=True)
def _char_at(s: str, i: int) -> str:
    if i < 0 or i > len(s):
        raise EvalError(f"index out of range: {i}")
    return s[i : i + 1]


@register("indexOf", "string, string -> int", member=True, cost=scan_cost)
def _index_of(s: str, sub: str, start: int = 0) -> int:
    if start < 0 or start > len(s):
        raise EvalError(f"index out of range: {start}")
    return s.find(sub, start)


register("indexOf", "string, string, int -> int", member=True, cost=scan_cost)(_index_of)


@register("lastIndexOf", "string, string -> int", member=True, cost=scan_cost)
def _last_index_of(s: str, sub: str, end: int | None = None) -> int:
    if end is None:
        return s.rfind(sub)
    if end < 0 or end >= len(s) and s:
        raise EvalError(f"index out of range: {end}")
    return s.rfind(sub, 0, end + len(sub))


register("lastIndexOf", "string, string, int -> int", member=True, cost=scan_cost)(_last_index_of)


# str.translate runs in C: a per-character Python loop over a megabyte-long string
# would take a second while charging only a tenth of its length.
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@register("lowerAscii", "string -> string", member=True, cost=scan_cost)
def _lower_ascii(s: str) -> str:
    return s.translate(_LOWER)


@register("upperAscii", "string -> string", member=True, cost=scan_cost)
def _upper_ascii(s: str) -> str:
    return s.translate(_UPPER)


def _replace_cost(s: str, old: str, new: str, n: int = -1) -> int:
    # Charge for the result before building it: a replacement can multiply the length.
    grows = max(len(new) - len(old), 0) * (s.count(old) if old else len(s) + 1)
    return (len(s) + grows) // 10


@register("replace", "string, string, string -> string", member=True, cost=_replace_cost)
def _replace(s: str, old: str, new: str, n: int = -1) -> str:
    if n < 0:
        return s.replace(old, new)
    return s.replace(old, new, n)


register("replace", "string, string, string, int -> string", member=True, cost=_replace_cost)(_replace)


def _element_cost(s: str, *_: Any) -> int:
    # Functions that build one list element per character (at worst) pay for each:
    # harmless for attribute-sized strings, and it bounds memory for a hostile one.
    return len(s) // 2


@register("split", "string, string -> list(string)", member=True, cost=_element_cost)
def _split(s: str, sep: str, n: int = -1) -> tuple[str, ...]:
    if n == 0:
        return ()
    if sep == "":  # Go's strings.Split with "" splits into characters
        chars = list(s)
        if 0 < n < len(chars):
            chars = chars[: n - 1] + ["".join(chars[n - 1 :])]
        return tuple(chars)
    return tuple(s.split(sep, n - 1 if n > 0 else -1))


register("split", "string, string, int -> list(string)", member=True, cost=_element_cost)(_split)


@register("substring", "string, int -> string", member=True, cost=scan_cost)
def _substring(s: str, start: int, end: int | None = None) -> str:
    stop = len(s) if end is None else end
    if start < 0 or start > len(s):
        raise EvalError(f"index out of range: {start}")
    if stop < 0 or stop > len(s):
        raise EvalError(f"index out of range: {stop}")
    if start > stop:
        raise EvalError(f"invalid substring range. start: {start}, end: {stop}")
    return s[start:stop]


register("substring", "string, int, int -> string", member=True, cost=scan_cost)(_substring)


@register("trim", "string -> string", member=True, cost=scan_cost)
def _trim(s: str) -> str:
    return s.strip()


def _join_cost(items: tuple[str, ...], sep: str = "") -> int:
    return (sum(len(i) for i in items) + len(sep) * len(items)) // 10


@register("join", "list(string) -> string", member=True, cost=_join_cost)
def _join(items: tuple[Any, ...], sep: str = "") -> str:
    if not all(type(i) is str for i in items):
        raise EvalError("join: list must contain only strings")
    return sep.join(items)


register("join", "list(string), string -> string", member=True, cost=_join_cost)(_join)


@register("strings.quote", "string -> string", cost=lambda s: len(s) // 5)  # escapes double it at most
def _quote(s: str) -> str:
    escaped = s.replace("\\", "\\\\").replace('"', '\\"')
    for raw, esc in (("\a", "\\a"), ("\b", "\\b"), ("\f", "\\f"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\v", "\\v")):
        escaped = escaped.replace(raw, esc)
    return f'"{escaped}"'


# --- regular expressions ------------------------------------------------------------


# Patterns longer than this are compiled per call, not cached: a selector building
# megabyte-long patterns per device must not fill the cache with them.
_CACHED_PATTERN = 1024


def compile_regex(pattern: str) -> Any:
    """Compile with RE2 (cached: patterns are nearly always short literals)."""
    return _compile_cached(pattern) if len(pattern) <= _CACHED_PATTERN else _compile_regex(pattern)


@functools.lru_cache(maxsize=256)
def _compile_cached(pattern: str) -> Any:
    return _compile_regex(pattern)


def _compile_regex(pattern: str) -> Any:
    try:
        if _re2 is not None:
            return _re2.compile(pattern, _OPTIONS)
        check_backtracking_risk(pattern)
        return re.compile(pattern, re.ASCII)
    except EvalError:
        raise
    except Exception as exc:  # re2.error / re.error: both mean a bad pattern
        raise EvalError(f"invalid regular expression {pattern!r}: {exc}") from None


_NOT_RE2 = re.compile(r"\\(?:[1-9]|k<)|\(\?<?[=!]")


def check_backtracking_risk(pattern: str) -> None:
    """Without google-re2, Python's backtracking engine runs the pattern: refuse what
    RE2 would refuse (lookaround, backreferences) and what could backtrack for ever
    (a quantified group that itself repeats or alternates, more than 3 quantifiers)."""
    if _NOT_RE2.search(pattern):
        raise EvalError(f"invalid regular expression {pattern!r}: lookaround and backreferences are not RE2 syntax")
    groups = [False]  # per open group: does it contain repetition or alternation?
    quantifiers, i, in_class = 0, 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class or char == "[":
            in_class = char != "]" or (in_class and pattern[i - 1] == "[")
        elif char == "(":
            groups.append(False)
        elif char == ")" and len(groups) > 1:
            inner = groups.pop()
            if inner and pattern[i + 1 : i + 2] in ("*", "+", "?", "{"):
                raise EvalError(f"regular expression {pattern!r} needs google-re2 (nested repetition)")
            groups[-1] = groups[-1] or inner
        elif char == "|" or (char in "*+{" or (char == "?" and pattern[i - 1 : i] not in ("*", "+", "?", "}", "("))):
            quantifiers += char != "|"
            groups[-1] = True
        i += 1
    if quantifiers > 3:
        raise EvalError(f"regular expression {pattern!r} needs google-re2 (more than 3 repetitions)")


def _regex_cost(s: str, pattern: str, *_: Any) -> int:
    # Compiling is linear in the pattern, matching in the subject (RE2).
    return (len(s) + len(pattern)) // 10


@register("matches", "string, string -> bool", member=True, cost=_regex_cost)
@register("matches", "string, string -> bool", cost=_regex_cost)
def _matches(s: str, pattern: str) -> bool:
    return compile_regex(pattern).search(s) is not None


@register("find", "string, string -> string", member=True, cost=_regex_cost)
def _find(s: str, pattern: str) -> str:
    match = compile_regex(pattern).search(s)
    return "" if match is None else str(match.group(0))


def _find_all_cost(s: str, pattern: str, *_: Any) -> int:
    return _element_cost(s) + len(pattern) // 10


@register("findAll", "string, string -> list(string)", member=True, cost=_find_all_cost)
def _find_all(s: str, pattern: str, limit: int = -1) -> tuple[str, ...]:
    if limit == 0:
        return ()
    found = tuple(str(m.group(0)) for m in compile_regex(pattern).finditer(s))
    return found if limit < 0 else found[:limit]


register("findAll", "string, string, int -> list(string)", member=True, cost=_find_all_cost)(_find_all)


# --- Kubernetes lists library and cel-go ext.Lists ------------------------------------


def _comparable(items: tuple[Any, ...]) -> None:
    kinds = {type_name(i) for i in items}
    numeric = kinds <= {"int", "uint", "double"}
    if len(kinds) > 1 and not numeric or kinds & {"list", "map", "null_type", "optional_type", "type"}:
        raise EvalError(f"no such overload: list elements of types {sorted(kinds)} are not comparable")


def _key(item: Any) -> Any:
    if type(item) is Quantity:
        return item.cmp
    if type(item) is Semver:
        return (item.major, item.minor, item.patch, _SemverOrder(item))
    return item


class _SemverOrder:
    __slots__ = ("v",)

    def __init__(self, v: Semver) -> None:
        self.v = v

    def __lt__(self, other: _SemverOrder) -> bool:
        return self.v.compare(other.v) < 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SemverOrder) and self.v.compare(other.v) == 0


@register("isSorted", "list(A) -> bool", member=True, cost=scan_cost)
def _is_sorted(items: tuple[Any, ...]) -> bool:
    _comparable(items)
    return all(not _key(b) < _key(a) for a, b in zip(items, items[1:]))


@register("sum", "list(A) -> A", member=True, cost=scan_cost)
def _sum(items: tuple[Any, ...]) -> Any:
    if not items:
        return 0
    _comparable(items)
    if type(items[0]) is Quantity:
        return Quantity(sum((i.value for i in items), start=items[0].value * 0))
    if type(items[0]) is float:
        return float(sum(items))
    if type(items[0]) is Uint:
        return Uint(sum(items))
    if type(items[0]) is not int:
        raise EvalError(f"no such overload: sum over {type_name(items[0])}")
    return check_int(sum(items))


@register("min", "list(A) -> A", member=True, cost=scan_cost)
def _min(items: tuple[Any, ...]) -> Any:
    if not items:
        raise EvalError("min called on empty list")
    _comparable(items)
    return min(items, key=_key)


@register("max", "list(A) -> A", member=True, cost=scan_cost)
def _max(items: tuple[Any, ...]) -> Any:
    if not items:
        raise EvalError("max called on empty list")
    _comparable(items)
    return max(items, key=_key)


@register("indexOf", "list(A), A -> int", member=True, cost=scan_cost)
def _list_index_of(items: tuple[Any, ...], value: Any) -> int:
    return next((i for i, item in enumerate(items) if cel_equal(item, value)), -1)


@register("lastIndexOf", "list(A), A -> int", member=True, cost=scan_cost)
def _list_last_index_of(items: tuple[Any, ...], value: Any) -> int:
    return next((i for i in range(len(items) - 1, -1, -1) if cel_equal(items[i], value)), -1)


@register("slice", "list(A), int, int -> list(A)", member=True, cost=scan_cost)
def _slice(items: tuple[Any, ...], start: int, end: int) -> tuple[Any, ...]:
    if start < 0 or end < 0 or start > end or end > len(items):
        raise EvalError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return items[start:end]


def _flatten_cost(items: tuple[Any, ...], *_: Any) -> int:
    return sum(len(i) if type(i) is tuple else 1 for i in items) // 2


@register("flatten", "list(A) -> list(dyn)", member=True, cost=_flatten_cost)
def _flatten(items: tuple[Any, ...], depth: int = 1) -> tuple[Any, ...]:
    if depth < 0:
        raise EvalError("level must be non-negative")
    out: list[Any] = []
    for item in items:
        out.extend(_flatten(item, depth - 1) if type(item) is tuple and depth > 0 else (item,))
    return tuple(out)


register("flatten", "list(A), int -> list(dyn)", member=True, cost=_flatten_cost)(_flatten)


@register("distinct", "list(A) -> list(A)", member=True, cost=lambda items: len(items) ** 2 // 10)
def _distinct(items: tuple[Any, ...]) -> tuple[Any, ...]:
    out: list[Any] = []
    for item in items:
        if not any(cel_equal(item, seen) for seen in out):
            out.append(item)
    return tuple(out)


@register("reverse", "list(A) -> list(A)", member=True, cost=scan_cost)
def _reverse(items: tuple[Any, ...]) -> tuple[Any, ...]:
    return items[::-1]


@register("sort", "list(A) -> list(A)", member=True, cost=scan_cost)
def _sort(items: tuple[Any, ...]) -> tuple[Any, ...]:
    _comparable(items)
    return tuple(sorted(items, key=_key))


def sort_keys(keys: list[Any]) -> list[int]:
    """Positions in the stable order of `keys` (for the sortBy macro)."""
    _comparable(tuple(keys))
    return sorted(range(len(keys)), key=lambda i: _key(keys[i]))


@register("first", "list(A) -> optional_type(A)", member=True)
def _first(items: tuple[Any, ...]) -> Optional:
    return Optional(items[0]) if items else OPTIONAL_NONE


@register("last", "list(A) -> optional_type(A)", member=True)
def _last(items: tuple[Any, ...]) -> Optional:
    return Optional(items[-1]) if items else OPTIONAL_NONE


@register("lists.range", "int -> list(int)", cost=lambda n: max(n, 0))
def _range(n: int) -> tuple[int, ...]:
    return tuple(range(max(n, 0)))


# --- cel-go ext.Sets ---------------------------------------------------------------


def _pair_cost(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    return len(a) * len(b) // 10


@register("sets.contains", "list(A), list(A) -> bool", cost=_pair_cost)
def _sets_contains(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(any(cel_equal(x, y) for y in a) for x in b)


@register("sets.equivalent", "list(A), list(A) -> bool", cost=_pair_cost)
def _sets_equivalent(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


@register("sets.intersects", "list(A), list(A) -> bool", cost=_pair_cost)
def _sets_intersects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return any(cel_equal(x, y) for x in a for y in b)
