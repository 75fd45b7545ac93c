"""Reading `dra-quota check`'s input: files and folders into Kubernetes object documents.

Neighbours: `quota.check` runs admission over the `Document`s this module yields;
`quota.cli` maps `CheckInputError` to exit code 2. Nothing here knows about kinds beyond
`kind: List` expansion: parsing objects is the parsers' job (`quota.slices`,
`quota.claims`, `quota.devicequota`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["CheckInputError", "Document", "load_documents"]

_SUFFIXES = (".yaml", ".yml", ".json")
# A YAML bomb or a stray multi-gigabyte file must not take the tool down.
MAX_FILE_BYTES = 64 * 1024 * 1024


class CheckInputError(Exception):
    """Input that cannot be read at all: exit code 2, with this message."""


@dataclass(frozen=True, slots=True)
class Document:
    source: str
    obj: Mapping[str, Any]


def load_documents(paths: Sequence[str]) -> tuple[list[Document], list[str]]:
    """Every object in the files and folders given (folders recursively, sorted by name)."""
    docs: list[Document] = []
    warnings: list[str] = []
    for path in _files(paths):
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise CheckInputError(f"{path}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
            text = path.read_text(encoding="utf-8")
            loaded = list(yaml.safe_load_all(text))
        except (OSError, UnicodeDecodeError) as err:
            raise CheckInputError(f"{path}: cannot read: {err}") from None
        except yaml.YAMLError as err:
            raise CheckInputError(f"{path}: not valid YAML: {err}") from None
        for index, obj in enumerate(loaded):
            where = f"{path} (document {index + 1})"
            for item in _expand(obj):
                if not isinstance(item, Mapping) or not isinstance(item.get("kind"), str):
                    warnings.append(f"{where}: skipped: not a Kubernetes object (no kind)")
                    continue
                docs.append(Document(where, item))
    return docs, warnings


def _files(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
            yield from found
        elif path.is_file() or raw == os.devnull:
            yield path
        else:
            raise CheckInputError(f"{raw}: no such file or directory")


def _expand(obj: Any) -> Iterator[Any]:
    if obj is None:
        return
    if isinstance(obj, Mapping) and obj.get("kind") == "List" and isinstance(obj.get("items"), list):
        yield from obj["items"]
    else:
        yield obj
