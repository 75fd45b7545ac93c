"""Bounds every input file is held to, and the error the decoders raise.

Neighbours: `quota.reports.loader.sources` bounds files and folders, `quota.reports.loader.jsondocs`
and `quota.reports.loader.yamldocs` bound what one file may decode into; `quota.reports.loader` turns
a `DecodeError` into a `CheckInputError` naming the file.

Why these numbers:
- Depth 100. The deepest object we read (a ResourceSlice's
  items > spec > devices > capacity > memory > requestPolicy > validRange > min, or
  managedFields' fieldsV1 of a claim's status) is under 25 levels deep. The API server
  allows 10,000 (its Go decoder grows its stack); every recursive Python consumer of
  these objects (deepcopy, json.dumps, a parser's walk) stops near 1,000 frames, and
  libyaml's C composer overflows the C stack somewhere below 100,000. 100 leaves 4x
  headroom over real objects and keeps every consumer far from those walls.
- Integers within int64, as every integer field of the API (count, generation,
  resourceSliceCount, int attributes) is; Python's own 4,300-digit limit would
  otherwise surface as a ValueError traceback.
- YAML aliases may add at most as many nodes as the document has (and at least
  10,000): anchors for shared labels stay usable, a "billion laughs" does not.
- At most 8,000,000 values (scalars and collections) per file. Small values cost up
  to ~30x their bytes once decoded (`{},` is 3 bytes and a 64-byte dict), so the file
  size bound alone would let a dense 256 MiB file take several GB. A 5,000-node
  kubectl dump holds 4,400,000 values (room for ~9,000 nodes, as the size bound);
  the bound keeps a hostile file under ~1 GB (measured: 40M `- []` lines, 0.8 GB).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "INT64_MIN",
    "INT64_MAX",
    "ALIAS_EXPANSION_FLOOR",
    "MAX_VALUES_PER_FILE",
    "TOO_MANY_VALUES",
    "DecodeError",
    "check_int",
    "replace_lone_surrogates",
]

MAX_DEPTH = 100
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# An int64 has at most 19 digits; YAML spellings (0b..., 1_000) are longer but bounded.
_MAX_INT_SPELLING = 80
ALIAS_EXPANSION_FLOOR = 10_000
MAX_VALUES_PER_FILE = 8_000_000
TOO_MANY_VALUES = f"more than {MAX_VALUES_PER_FILE:,} values in one file"

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class DecodeError(Exception):
    """What is wrong with one file's content; `line` is 1-based when known."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def check_int(spelling: str, value: int | None = None) -> int:
    """`int(spelling)` (or `value`, already converted), refused outside int64."""
    if len(spelling) > _MAX_INT_SPELLING:
        raise DecodeError(f"integer {spelling[:20]}... ({len(spelling)} characters) is out of range: "
                          "Kubernetes integers are 64-bit")
    number = int(spelling) if value is None else value
    if not INT64_MIN <= number <= INT64_MAX:
        raise DecodeError(f"integer {spelling} is out of range: Kubernetes integers are 64-bit")
    return number


def replace_lone_surrogates(obj: Any) -> Any:
    """Lone UTF-16 surrogates (from `\\ud800` escapes) replaced with U+FFFD, as Go's
    encoding/json does: the API server would store that, and no text output can print
    a lone surrogate. Called only when the raw text holds such an escape."""
    if isinstance(obj, str):
        return _LONE_SURROGATE.sub("\ufffd", obj)
    if isinstance(obj, list):
        return [replace_lone_surrogates(v) for v in obj]
    if isinstance(obj, dict):
        return {replace_lone_surrogates(k): replace_lone_surrogates(v) for k, v in obj.items()}
    return obj
