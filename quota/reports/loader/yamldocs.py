"""YAML input: libyaml's C parser where present, values built straight from its events.

Neighbours: `quota.reports.loader` sends every file that is not JSON here; bounds come from
`quota.reports.loader.limits`. PyYAML's own loaders compose a node graph (with two position
marks per node) before constructing anything: for a 5,000-node kubectl dump that graph
alone took 1.8 GB and 40 s. Here the parser's events (C under libyaml, PyYAML's
pure-Python parser otherwise) are turned into plain values directly, which also makes
every bound a counter rather than a recursion:
- depth: at most MAX_DEPTH open collections (libyaml's C composer, which this does not
  use, recurses on the C stack and crashes the process past ~100,000 levels);
- duplicate keys are refused (a reviewer reads one `hard`, a tool would enforce the
  other; the API server's strict decoding refuses them too); keys merged in with `<<`
  may still be overridden, as YAML intends;
- aliases: an alias to a node still open (a cycle) is refused, and aliases may add at
  most as many nodes as the document has composed so far (at least 10,000);
- values stay JSON values, as the API server's YAML-to-JSON conversion leaves them:
  timestamps stay strings, integers stay within int64, and `!!binary`, `!!set`,
  `!!omap`, `!!pairs` and unknown tags are refused.
Scalars are typed by PyYAML's resolver and constructors (YAML 1.1, like go-yaml v2).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml import events
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode

from quota.devices.inventory import gc_paused
from quota.reports.loader import lists
from quota.reports.loader.limits import (
    ALIAS_EXPANSION_FLOOR,
    MAX_DEPTH,
    MAX_VALUES_PER_FILE,
    TOO_MANY_VALUES,
    DecodeError,
    check_int,
    replace_lone_surrogates,
)

__all__ = ["yaml_documents", "WITH_LIBYAML"]

WITH_LIBYAML: bool = bool(yaml.__with_libyaml__)
# Used for its parser (events) and resolver (implicit tags) only.
_Parser: type[yaml.SafeLoader] = yaml.CSafeLoader if WITH_LIBYAML else yaml.SafeLoader  # type: ignore[assignment]
_UNICODE_ESCAPE = re.compile(rb"\\[uU]")
_TAG = "tag:yaml.org,2002:"
_STR, _MERGE, _INT, _TIMESTAMP = _TAG + "str", _TAG + "merge", _TAG + "int", _TAG + "timestamp"
_MAP_TAGS = (None, "!", _TAG + "map")
_SEQ_TAGS = (None, "!", _TAG + "seq")
_REFUSED = {_TAG + name for name in ("binary", "set", "omap", "pairs")}
# Resolved tags of plain scalars by text: PyYAML tries its implicit-type regexes on
# every plain scalar, and the same keys and values recur throughout a dump. Bounded so
# that unique values cannot grow it.
_RESOLVED: dict[str, str] = {}
_CACHED_LENGTH, _CACHED_COUNT = 40, 100_000
_NO_KEY = object()
# A position in the text: yaml.error.Mark, or libyaml's own Mark class.
_Mark = Any
_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"
_SCANNER_TOO_DEEP = "exceeded maximum nesting depth"
_CONSTRUCTORS = SafeConstructor.yaml_constructors


class _Collection:
    """A mapping or sequence being built: its value, node count and height so far."""

    __slots__ = ("value", "anchor", "nodes", "height", "key", "merges")

    def __init__(self, value: dict[Any, Any] | list[Any], anchor: str | None) -> None:
        self.value, self.anchor = value, anchor
        self.nodes, self.height = 1, 1
        self.key: Any = _NO_KEY
        self.merges: list[dict[Any, Any]] = []

    def add(self, value: Any, mark: _Mark) -> None:
        if isinstance(self.value, list):
            self.value.append(_plain(value))
        elif self.key is _NO_KEY:
            if isinstance(value, (dict, list)):
                raise _Refused("a mapping or sequence cannot be a key here", mark)
            self.key = value
        else:
            key, self.key = self.key, _NO_KEY
            if key is _MERGE_KEY:
                self._merge(value, mark)
            elif key in self.value:
                raise _Refused(f"duplicate key {key!r}", mark)
            else:
                self.value[key] = _plain(value)

    def _merge(self, value: Any, mark: _Mark) -> None:
        merged = value if isinstance(value, list) else [value]
        if not all(isinstance(m, dict) for m in merged):
            raise _Refused("a merge key (<<) needs a mapping or a list of mappings", mark)
        self.merges.extend(merged)

    def finish(self) -> Any:
        if not self.merges or not isinstance(self.value, dict):
            return self.value
        # The node's own keys win, then the merged mappings in the order given.
        result: dict[Any, Any] = {}
        for merged in self.merges:
            for key, value in merged.items():
                result.setdefault(key, value)
        result.update(self.value)
        return result


class _MergeKey:
    """A plain `<<` scalar: a merge key in a key's place, the text "<<" elsewhere."""


_MERGE_KEY = _MergeKey()


def _plain(value: Any) -> Any:
    return "<<" if value is _MERGE_KEY else value


class _Refused(Exception):
    """Input this loader refuses (a bound, a duplicate key), at `mark`."""

    def __init__(self, message: str, mark: _Mark) -> None:
        super().__init__(message)
        self.message = message
        self.line: int | None = mark.line + 1 if mark is not None else None


class _Builder:
    """Plain values from one file's parser events."""

    def __init__(self, data: bytes) -> None:
        # PyYAML's stubs leave the parser's event methods untyped; events are typed below.
        self.parser: Any = _Parser(data)
        self.constructor = SafeConstructor()
        self.values = 0  # in the file so far, aliases expanded

    def documents(self) -> Iterator[tuple[int, Any]]:
        parser = self.parser
        parser.get_event()  # StreamStart
        while not parser.check_event(events.StreamEndEvent):
            start = parser.get_event()  # DocumentStart
            # The line of the object's first node, not of its `---`: what an error points
            # at (an empty document has no node but an empty scalar: its `---`).
            node = parser.peek_event()
            empty = type(node) is events.ScalarEvent and node.value == "" and node.implicit[0]
            first = (start if empty else node).start_mark.line + 1
            with gc_paused():  # millions of acyclic objects: the collector's scans cost more than the build
                value = self._document()
            parser.get_event()  # DocumentEnd
            yield first, value

    def _document(self) -> Any:
        get_event = self.parser.get_event
        stack: list[_Collection] = []
        anchors: dict[str, tuple[Any, int, int]] = {}  # value, nodes, height
        composed = aliased = 0
        while True:
            event = get_event()
            kind = type(event)
            if kind is events.ScalarEvent:
                value, nodes, height, anchor = self._scalar(event), 1, 0, event.anchor
                composed += 1
            elif kind is events.MappingStartEvent or kind is events.SequenceStartEvent:
                stack.append(self._open(event))
                if len(stack) > MAX_DEPTH:
                    raise _Refused(_TOO_DEEP, event.start_mark)
                continue
            elif kind is events.AliasEvent:
                if event.anchor not in anchors:
                    cycle = any(c.anchor == event.anchor for c in stack)
                    raise _Refused("an alias refers to a node that contains it" if cycle
                                   else f"found undefined alias {event.anchor!r}", event.start_mark)
                value, nodes, height = anchors[event.anchor]
                anchor = None
                aliased += nodes
                if aliased > max(composed, ALIAS_EXPANSION_FLOOR):
                    raise _Refused('aliases expand this document too much (a "billion laughs")', event.start_mark)
                if len(stack) + height > MAX_DEPTH:
                    raise _Refused(_TOO_DEEP, event.start_mark)
            else:  # MappingEndEvent or SequenceEndEvent
                done = stack.pop()
                value, nodes, height, anchor = done.finish(), done.nodes, done.height, done.anchor
                composed += 1
            # Counted as they are built (aliases expanded): a flat list of a hundred
            # million zeros must stop early, not when it closes.
            self.values += 1 if kind is not events.AliasEvent else nodes
            if self.values > MAX_VALUES_PER_FILE:
                raise _Refused(TOO_MANY_VALUES, event.start_mark)
            if anchor is not None:
                anchors[anchor] = (value, nodes, height)
            if not stack:
                return _plain(value)
            parent = stack[-1]
            parent.nodes += nodes
            parent.height = max(parent.height, height + 1)
            parent.add(value, event.start_mark)

    def _open(self, event: events.CollectionStartEvent) -> _Collection:
        mapping = type(event) is events.MappingStartEvent
        if event.tag not in (_MAP_TAGS if mapping else _SEQ_TAGS):
            refused = event.tag in _REFUSED
            raise _Refused(f"tag {event.tag} is not allowed in Kubernetes objects" if refused
                           else f"could not determine a constructor for the tag {event.tag!r}", event.start_mark)
        return _Collection({} if mapping else [], event.anchor)

    def _scalar(self, event: events.ScalarEvent) -> Any:
        text, tag = event.value, event.tag
        if tag is None or tag == "!":
            tag = _RESOLVED.get(text) if event.implicit[0] else _STR
            if tag is None:
                tag = str(self.parser.resolve(ScalarNode, text, event.implicit))
                if len(text) <= _CACHED_LENGTH and len(_RESOLVED) < _CACHED_COUNT:
                    _RESOLVED[text] = tag
        if tag == _STR or tag == _TIMESTAMP:  # timestamps stay text, as in JSON
            return text
        if tag == _MERGE:
            return _MERGE_KEY
        if tag in _REFUSED:
            raise _Refused(f"tag {tag} is not allowed in Kubernetes objects", event.start_mark)
        node = ScalarNode(tag, text, event.start_mark, None, event.style)  # type: ignore[arg-type]  # libyaml marks are marks too
        if tag == _INT:
            try:
                return check_int(text, None if len(text) > 80 else self.constructor.construct_yaml_int(node))
            except DecodeError as err:
                raise _Refused(err.message, event.start_mark) from None
        # Called directly: construct_object would remember every scalar until the end.
        construct = _CONSTRUCTORS.get(tag) or _CONSTRUCTORS[None]
        return construct(self.constructor, node)


def yaml_documents(data: bytes) -> Iterator[tuple[int, int | None, Any]]:
    """(line, List item index or None, value) for each document of UTF-8 `data` (checked
    by the caller; bytes, since libyaml would otherwise hold a UTF-8 copy of a str);
    a List's items one by one (`quota.reports.loader.lists`)."""
    fixed = replace_lone_surrogates if _UNICODE_ESCAPE.search(data) else _same
    builder = _Builder(data)
    try:
        for line, value in builder.documents():
            kind = value.get("kind") if isinstance(value, dict) else None
            if not (lists.is_list_kind(kind) and isinstance(items := value.get("items"), list)):
                yield line, None, fixed(value)
                continue
            # Hand the items out one by one, letting each go (from the end: pop is O(1)).
            items.reverse()
            api_version = value.get("apiVersion")
            del value
            for index in range(len(items)):
                yield line, index, fixed(lists.item(items.pop(), kind, api_version))
    except _Refused as err:
        raise DecodeError(err.message, line=err.line) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        problem = err.problem or str(err)
        if problem == _SCANNER_TOO_DEEP:
            # libyaml >= 0.2.5's scanner (PyYAML 6.0.4's wheels) stops flow nesting at
            # 1,000 levels while tokenizing ahead of our depth count: the same bound hit
            # first, so the same words, whichever PyYAML runs.
            raise DecodeError(_TOO_DEEP, line=mark.line + 1 if mark else None) from None
        raise DecodeError(f"not valid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as err:
        raise DecodeError(f"not valid YAML: {err}") from None
    finally:
        builder.parser.dispose()


def _same(value: Any) -> Any:
    return value
