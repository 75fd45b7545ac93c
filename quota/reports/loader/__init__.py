"""Reading `dra-quota check`'s input: files, folders and stdin into Kubernetes object documents.

Neighbours: `quota.reports.check` runs admission over the `Document`s this package yields;
`commands.checkcommand` maps `CheckInputError` to exit code 2. Nothing here knows about
kinds beyond List expansion (`kind: List` and typed Lists): parsing objects is the parsers' job
(`quota.objects.slices`, `quota.objects.claims`, `quota.quotas.devicequota`). Modules: `sources` (paths, bounded
reads), `jsondocs` and `yamldocs` (decoding, bounded), `lists` (List items), `limits`
(the bounds and why).

JSON or YAML: a file named `*.json`, or any input whose first character (after a
byte-order mark and whitespace) is `{` or `[`, goes through the stdlib's C JSON
decoder; `kubectl -o json` output piped in on stdin is recognised that way. Content that
starts with `{` but is not JSON (a YAML flow mapping) falls back to YAML unless the
file is named `*.json`. Everything else goes through libyaml (PyYAML's pure-Python
loader when libyaml is missing). The same bounds hold on both paths.

Text must be UTF-8 (as the API server requires); a UTF-8 byte-order mark is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from quota.reports.loader import lists
from quota.reports.loader.fields import field_line, field_path
from quota.reports.loader.jsondocs import (
    depth_within_bound,
    has_surrogate_escapes,
    json_documents,
    value_count_within_bound,
)
from quota.reports.loader.limits import TOO_MANY_VALUES, DecodeError
from quota.reports.loader.sources import Source, SourceError, read_sources
from quota.reports.loader.yamldocs import yaml_documents

__all__ = ["MAX_VALUES", "CheckInputError", "Document", "iter_documents", "load_documents", "read_values"]

_BOM = b"\xef\xbb\xbf"
# Documents and List items per run: empty YAML documents cost ~5 us each, so a
# 256 MiB file of `---` lines would otherwise keep the tool busy for minutes. A
# 100,000-slice cluster dump plus claims stays well inside.
MAX_VALUES = 500_000
_JSON_START = re.compile(rb"[ \t\r\n]*[{\[]")
# A line opening with a document marker, a directive or a comment is YAML: JSON has no
# such token, and its strings cannot hold a raw newline, so no JSON line starts so.
# (`{...}` documents separated by `---` are a common way to write YAML by hand.)
_YAML_ONLY_LINE = re.compile(rb"^(?:---|\.\.\.|%|#)", re.MULTILINE)
_Value = tuple[int, int | None, Any]  # line, List item index (None: a document), value


class CheckInputError(Exception):
    """Input that cannot be read at all: exit code 2, with this message."""


@dataclass(frozen=True, slots=True)
class Document:
    source: str
    obj: Mapping[str, Any]
    # The file to read again for a field's line (`located`): "" for stdin, a List's
    # items and objects that came from no file.
    file: str = ""
    number: int = 0  # the document's number in `file`

    def located(self, message: str) -> str:
        """`source` pointing at the line of the field `message` names, where the file tells it."""
        line = field_line(self.file, self.number, field_path(message)) if self.file else None
        return self.source if line is None else f"{self.file}:{line} (document {self.number})"


def load_documents(paths: Sequence[str]) -> tuple[list[Document], list[str]]:
    """Every object in the files and folders given (folders recursively, sorted by name)."""
    warnings: list[str] = []
    return list(iter_documents(paths, warnings)), warnings


def iter_documents(paths: Sequence[str], warnings: list[str]) -> Iterator[Document]:
    """The objects of `load_documents` one at a time, read file by file, a `List`'s
    items one by one: a caller that parses each and lets it go never holds the raw
    objects of a large dump all at once. Warnings are appended as they arise."""
    sources, budget = read_sources(paths), [MAX_VALUES]
    while True:
        source = _next_source(sources)
        if source is None:
            return
        name, decoded, again = source.name, _decode(source), not source.stdin
        del source  # the raw bytes: only the text is needed from here on
        with _reading(name):
            yield from _documents(name, decoded, warnings, budget, again)


def read_values(path: str) -> list[Any]:
    """The top-level values of one small file (a configuration, not a dump), with the
    same bounds and strictness as `check`'s input: duplicate keys, deep nesting, alias
    bombs and out-of-range integers are refused. CheckInputError says why."""
    source = _next_source(read_sources([path]))
    if source is None:
        raise CheckInputError(f"{path}: nothing to read")
    with _reading(source.name):
        return [value for _, _, value in _decode(source)]


def _next_source(sources: Iterator[Source]) -> Source | None:
    try:
        return next(sources, None)
    except SourceError as err:
        raise CheckInputError(str(err)) from None


@contextmanager
def _reading(name: str) -> Iterator[None]:
    """Decoding errors of source `name` as CheckInputError, with the line where known."""
    try:
        yield
    except DecodeError as err:
        at = f"{name}:{err.line}" if err.line is not None else name
        raise CheckInputError(f"{at}: {err.message}") from None
    except (RecursionError, MemoryError) as err:
        # The bounds should make these unreachable; if one still happens it is the
        # input's fault, and it must not surface as a traceback.
        raise CheckInputError(f"{name}: too large or too deeply nested ({type(err).__name__})") from None


def _documents(name: str, decoded: Iterator[_Value], warnings: list[str], budget: list[int],
               again: bool) -> Iterator[Document]:
    number = 0
    for line, index, value in decoded:
        budget[0] -= 1
        if budget[0] < 0:
            raise CheckInputError(f"{name}:{line}: more than {MAX_VALUES:,} documents and List items in all")
        if not index:  # a document, or the first item of a List document
            number += 1
        where = f"{name}:{line} (document {number}" + (f", List item {index + 1})" if index is not None else ")")
        for item in _expand(value):
            if not isinstance(item, Mapping) or not isinstance(item.get("kind"), str):
                warnings.append(f"{where}: skipped: not a Kubernetes object (no kind)")
                continue
            yield Document(where, item, name if again and index is None else "", number)


def _decode(source: Source) -> Iterator[_Value]:
    """The values of one source, by the decoder its name or first character calls for."""
    data = source.data[len(_BOM):] if source.data.startswith(_BOM) else source.data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise CheckInputError(f"{source.name}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x})") from None
    if not source.json and (not _JSON_START.match(data) or _YAML_ONLY_LINE.search(data)):
        del text  # libyaml reads the bytes; the text was only the UTF-8 check
        return yaml_documents(data)
    if not value_count_within_bound(data):
        raise CheckInputError(f"{source.name}: {TOO_MANY_VALUES}")
    values = json_documents(text, depth_checked=depth_within_bound(data),
                            surrogate_escapes=has_surrogate_escapes(data))
    return values if source.json else _json_else_yaml(values, text)


def _json_else_yaml(values: Iterator[_Value], text: str) -> Iterator[_Value]:
    """JSON if its first value parses as JSON, else YAML (a flow mapping is not JSON)."""
    try:
        first = next(values, None)
    except DecodeError as err:
        if not err.message.startswith("not valid JSON"):
            raise
        yield from yaml_documents(text.encode())
        return
    if first is not None:
        yield first
        yield from values


def _expand(obj: Any) -> Iterator[Any]:
    """A List the decoders did not stream (a JSON typed List whose apiVersion came last)."""
    if obj is None:
        return
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    if lists.is_list_kind(kind) and isinstance(obj, Mapping) and isinstance(obj.get("items"), list):
        yield from (lists.item(value, kind, obj.get("apiVersion")) for value in obj["items"])
    else:
        yield obj
