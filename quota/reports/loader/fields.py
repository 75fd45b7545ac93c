"""Where in a YAML file a field is: the line an error about `spec.devices[2].capacity` points at.

Neighbours: `quota.reports.loader` records, per `Document`, the file and document number it came
from; `quota.reports.check` calls `field_source` when an object of the cluster's state is refused
or warned about, with the message that names the field. The fast path builds plain values
without positions (`quota.reports.loader.yamldocs`: marks per node cost gigabytes on a large
dump), so the line is found afterwards, only for the one document at fault, by composing
that file again with PyYAML's node graph (which has the marks). Only small YAML files are
read again (`MAX_LOCATED_BYTES`); anything else keeps the document's own line.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

__all__ = ["MAX_LOCATED_BYTES", "field_line", "field_path"]

# A quota manifest or a folder of claims, not a cluster dump: composing a node graph costs
# about 400 bytes of memory per byte of YAML.
MAX_LOCATED_BYTES = 1024 * 1024
# A field path as the parsers write it: `spec.devices[2] (gpu-2).capacity['memory'].value`,
# `spec.devices.selectors[0].cel.expression`, `metadata.labels`.
_PATH = re.compile(r"\b(?:spec|metadata|status)(?:\.[A-Za-z0-9_-]+|\[\d+\]|\['[^']*'\]| \([^)]*\))*")
_STEP = re.compile(r"\.?([A-Za-z0-9_-]+)|\[(\d+)\]|\['([^']*)'\]| \([^)]*\)")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def field_path(message: str) -> list[str | int]:
    """The steps of the first field path `message` names (keys and list indexes); [] for none."""
    found = _PATH.search(message)
    if found is None:
        return []
    steps: list[str | int] = []
    for key, index, quoted in (m.groups() for m in _STEP.finditer(found.group())):
        if index is not None:
            steps.append(int(index))
        elif key is not None or quoted is not None:
            steps.append(key if key is not None else quoted)
    return steps


def field_line(file: str, number: int, path: list[str | int]) -> int | None:
    """The line of the deepest step of `path` present in document `number` (1-based) of
    YAML `file`; None when the file cannot be read again, is large, or lacks the path's root."""
    try:
        if not path or os.path.getsize(file) > MAX_LOCATED_BYTES:
            return None
        with open(file, "rb") as f:
            data = f.read(MAX_LOCATED_BYTES + 1)
        node = _document(data, number)
    except (OSError, yaml.YAMLError, RecursionError):
        return None
    line = None
    for step in path:
        if isinstance(node, MappingNode) and isinstance(step, str):
            pair = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == step), None)
            if pair is None:
                break
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _document(data: bytes, number: int) -> Any:
    loader = _Loader(data)
    try:
        for index in range(1, number + 1):
            if not loader.check_node():
                return None
            node = loader.get_node()
            if index == number:
                return node
        return None
    finally:
        loader.dispose()
