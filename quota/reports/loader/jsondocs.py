"""JSON input through the stdlib's C decoder, bounded, with a List's items streamed.

Neighbours: `quota.reports.loader` picks this module for `.json` files and for content that
starts with `{` or `[`; `quota.reports.loader.limits` holds the bounds. The fast path only
detects that something is wrong (a cheap depth check on the raw bytes, hooks for
duplicate keys, big integers and NaN); a slow scan then says where, on the error path
only.

A `kubectl get ... -o json` dump is one `List` whose `items` hold the objects. Its items
are decoded and handed out one at a time, so the decoded objects of a 58,000-device
dump are never all alive at once: the caller parses one and drops it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, NoReturn

from quota.reports.loader import lists
from quota.reports.loader.limits import MAX_DEPTH, MAX_VALUES_PER_FILE, DecodeError, check_int, replace_lone_surrogates

__all__ = ["depth_within_bound", "has_surrogate_escapes", "json_documents", "value_count_within_bound"]

_WS = re.compile(r"[ \t\n\r]*")
# Bytes that can matter for nesting depth, and the letters that may follow a backslash
# in a JSON string, kept so that escapes still pair up (`\n` must not become `\`).
_NOT_DEPTH_OR_ESCAPE = bytes(c for c in range(256) if c not in b'"[]{}\\/bfnrtu')
_NOT_DEPTH = bytes(c for c in range(256) if c not in b'"[]{}')
_SKELETON_STRING = re.compile(rb'"[^"]*"')
# Tokens of the slow scan: a string (possibly unterminated) or a structural character.
_TOKEN = re.compile(r'"[^"\\]*(?:\\(?:.|\Z)[^"\\]*)*(?:"|\Z)|[{}\[\]:]', re.S)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"
_SLOW_SCAN_TOKENS = 2_000_000


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return obj


def _constant(name: str) -> NoReturn:
    raise DecodeError(f"{name} is not a JSON number (the API server refuses it)")


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_int=check_int, parse_constant=_constant)


def json_documents(text: str, *, depth_checked: bool, surrogate_escapes: bool) -> Iterator[tuple[int, int | None, Any]]:
    """(line, List item index or None, value) for each top-level JSON value in `text`.

    `depth_checked`: `depth_within_bound` passed on the raw bytes (when not, the slow
    scan says where). `surrogate_escapes`: `has_surrogate_escapes` of the raw bytes.
    Several concatenated values (`jq -c` output) are several documents.
    """
    if not depth_checked:
        _fail_at_first_problem(text, 0, _TOO_DEEP)
    fixed = replace_lone_surrogates if surrogate_escapes else _same
    pos = _skip(text, 0)
    line, counted = 1, 0
    while pos < len(text):
        line += text.count("\n", counted, pos)  # counted once: a file may hold a million values
        counted = pos
        if text.startswith("{", pos) and lists.is_list_kind(kind := _tail_kind(text)):
            reader = _ListReader(text, pos, line, kind)
            for item_line, index, value in reader.values():
                yield item_line, index, fixed(value)
            pos = reader.end
        else:
            value, pos = _decode(text, pos)
            yield line, None, fixed(value)
        pos = _skip(text, pos)


def value_count_within_bound(data: bytes) -> bool:
    """Whether the file may hold at most MAX_VALUES_PER_FILE values: every value but a
    container's first is preceded by `,` or `:`, and every container opens with a
    bracket (those inside strings count too: an overestimate, C-speed)."""
    separators = sum(data.count(c) for c in (b",", b":", b"{", b"["))
    return separators < MAX_VALUES_PER_FILE


def has_surrogate_escapes(data: bytes) -> bool:
    """Whether the raw JSON holds a `\\udXXX` escape, the only way to a lone surrogate."""
    return _SURROGATE_ESCAPE.search(data) is not None


def _same(value: Any) -> Any:
    return value


def depth_within_bound(data: bytes) -> bool:
    """Whether no bracket outside strings is nested deeper than MAX_DEPTH.

    Works on a skeleton of the bytes (C-speed translate/replace, ~0.3 s for a 143 MB
    dump, against ~1.3 s for walking the decoded objects): escapes removed so that
    quotes pair up, strings removed, then matched `[]`/`{}` pairs peeled off one level
    per round. Invalid JSON may pass or fail; the decoder then reports it.
    """
    skeleton = data.translate(None, _NOT_DEPTH_OR_ESCAPE)
    skeleton = skeleton.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_DEPTH)
    # An adjacent pair of quotes closes one string and opens the next (or is an empty
    # string): removing it keeps every bracket on the same side of the quotes.
    skeleton = _SKELETON_STRING.sub(b"", skeleton.replace(b'""', b""))
    for _ in range(MAX_DEPTH):
        peeled = skeleton.replace(b"[]", b"").replace(b"{}", b"")
        if peeled == skeleton:
            return True  # nothing left, or mismatched brackets the decoder will report
        skeleton = peeled
    return not skeleton


def _decode(text: str, pos: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as err:
        raise DecodeError(f"not valid JSON: {err.msg} (column {err.colno})", line=err.lineno) from None
    except _Duplicate as err:
        _fail_at_first_problem(text, pos, f'duplicate key "{err.key}"')
    except RecursionError:  # invalid JSON the skeleton cannot judge: `[[[..."]]]`
        _fail_at_first_problem(text, pos, _TOO_DEEP)
    except DecodeError as err:
        raise DecodeError(err.message, line=_line_of_literal(text, pos, err.message)) from None


class _ListReader:
    """A top-level object decoded key by key, its `items` streamed if it is a List.

    kubectl prints `items` before `kind`; `_tail_kind` already said the object is a
    List (`kind`: `List` or a typed List), and the `kind` decoded here must agree. A
    typed List's items are streamed only once its apiVersion is known (kubectl prints
    it first, the API server before `items` too); otherwise `quota.reports.loader` expands it.
    """

    def __init__(self, text: str, pos: int, line: int, kind: str) -> None:
        self.text, self.start, self.line, self.kind = text, pos, line, kind
        self.end = len(text)

    def values(self) -> Iterator[tuple[int, int | None, Any]]:
        text, streamed = self.text, False
        rest: dict[str, Any] = {}
        pos = _skip(text, self.start + 1)
        while not text.startswith("}", pos):
            if rest or streamed:
                pos = _skip(text, self._expect(pos, ",") + 1)
            if not text.startswith('"', pos):
                self._syntax(pos, "expecting property name enclosed in double quotes")
            key, pos = _key(text, pos)
            if key in rest or (key == "items" and streamed):
                raise DecodeError(f'duplicate key "{key}"', line=_line(text, pos))
            pos = _skip(text, self._expect(_skip(text, pos), ":") + 1)
            if (key == "items" and text.startswith("[", pos) and rest.get("kind", self.kind) == self.kind
                    and (self.kind == "List" or "apiVersion" in rest)):
                pos = yield from self._items(pos + 1, rest.get("apiVersion"))
                streamed = True
            else:
                rest[key], pos = _decode(text, pos)
            pos = _skip(text, pos)
        self.end = pos + 1
        if not streamed:
            yield self.line, None, rest
        elif rest.get("kind") != self.kind:
            raise DecodeError(f"its items were read as a {self.kind}'s, but its kind is not {self.kind}",
                              line=self.line)

    def _items(self, pos: int, api_version: Any) -> Generator[tuple[int, int | None, Any], None, int]:
        text, index, line, counted = self.text, 0, self.line, self.start
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return pos + 1
        while True:
            line += text.count("\n", counted, pos)
            counted = pos
            item, pos = _decode(text, pos)
            yield line, index, lists.item(item, self.kind, api_version)
            del item  # the caller holds it only while it parses it
            index += 1
            pos = _skip(text, pos)
            if text.startswith("]", pos):
                return pos + 1
            pos = _skip(text, self._expect(pos, ",") + 1)

    def _expect(self, pos: int, delimiter: str) -> int:
        if not self.text.startswith(delimiter, pos):
            self._syntax(pos, f"expecting '{delimiter}' delimiter")
        return pos

    def _syntax(self, pos: int, message: str) -> NoReturn:
        raise DecodeError(f"not valid JSON: {message}", line=_line(self.text, pos))


def _key(text: str, pos: int) -> tuple[str, int]:
    """The property name whose opening quote is at `pos`, and the position after it."""
    try:
        return scanstring(text, pos + 1, True)  # type: ignore[no-any-return]
    except json.JSONDecodeError as err:
        raise DecodeError(f"not valid JSON: {err.msg} (column {err.colno})", line=err.lineno) from None


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


def _tail_kind(text: str) -> Any:
    """The top-level `kind` when the text ends with the object it belongs to.

    kubectl prints keys sorted, so `kind` comes after `items`: take the last `"kind"`
    and accept it only if the keys after it close exactly one object and end the text,
    which no nested `"kind"` can do (nor one inside a string: its quotes are escaped).
    """
    at = text.rfind('"kind"')
    pos = _skip(text, at + len('"kind"'))
    if at < 0 or not text.startswith(":", pos):
        return None
    try:
        kind, pos = _DECODER.raw_decode(text, _skip(text, pos + 1))
        pos = _skip(text, pos)
        while text.startswith(",", pos):
            pos = _skip(text, pos + 1)
            if not text.startswith('"', pos):
                return None
            _, pos = scanstring(text, pos + 1, True)
            pos = _skip(text, pos)
            if not text.startswith(":", pos):
                return None
            _, pos = _DECODER.raw_decode(text, _skip(text, pos + 1))
            pos = _skip(text, pos)
    except (ValueError, DecodeError, _Duplicate, RecursionError):
        return None
    return kind if text.startswith("}", pos) and _skip(text, pos + 1) == len(text) else None


def _fail_at_first_problem(text: str, pos: int, problem: str) -> NoReturn:
    """The error path: scan token by token from `pos` for the first over-deep bracket
    or duplicate key, and raise naming its line. `problem` is what the fast path found:
    the message, without a line, when the scan gives up (a bounded number of tokens,
    so a 256 MiB file costs seconds, not minutes)."""
    stack: list[set[str] | None] = []
    previous = ""
    for count, token in enumerate(_TOKEN.finditer(text, pos)):
        if count > _SLOW_SCAN_TOKENS:
            break
        kind = token.group()
        if kind in ("{", "["):
            stack.append(set() if kind == "{" else None)
            if len(stack) > MAX_DEPTH:
                raise DecodeError(_TOO_DEEP, line=_line(text, token.start()))
        elif kind in ("}", "]"):
            if stack:
                stack.pop()
        elif kind == ":" and previous.startswith('"') and stack and stack[-1] is not None:
            key = json.loads(previous)
            if key in stack[-1]:
                raise DecodeError(f'duplicate key "{key}"', line=_line(text, token.start()))
            stack[-1].add(key)
        previous = kind
    raise DecodeError(problem)


def _line_of_literal(text: str, pos: int, message: str) -> int | None:
    """The line of the first refused literal (a big integer, NaN) named in `message`."""
    named = re.search(r"integer (-?[0-9]+)|^(-?Infinity|NaN)", message)
    if named is None:
        return None
    literal = re.escape(named.group(1) or named.group(2))
    found = re.compile(rf"(?<![0-9.\"a-zA-Z]){literal}").search(text, pos)
    return _line(text, found.start()) if found else None


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1
