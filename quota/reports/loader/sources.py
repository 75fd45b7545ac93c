"""The files `dra-quota check -f` names: resolved, refused with their true reason, read bounded.

Neighbours: `quota.reports.loader` decodes what this yields. Rules:
- `-f -` reads standard input (for `kubectl get ... -o json | dra-quota check -f -`),
  once; `-f ""` is refused (it would otherwise mean the current folder).
- Only regular files are read. A FIFO, a device (`/dev/zero`), a socket is refused by
  name; files are opened with O_NONBLOCK and checked with fstat on the open descriptor,
  so neither a FIFO without a writer nor a swap after the check can block the tool.
- Folders are walked depth-first in name order, without following symlinked folders
  (no loops); hidden entries (`.git`, `.github`, editor files) are skipped, as they are
  never manifests; only `.yaml`, `.yml` and `.json` files are read; at most MAX_FILES
  per run. A folder without any such file is an error: a typo'd folder must not check
  nothing and exit 0. Symlinked files inside a folder are read like any named file.
- A file or stdin may hold at most MAX_FILE_BYTES: a 5,000-node ResourceSlice dump as
  kubectl prints it (4-space indented JSON) is 143 MB, so 256 MiB leaves room for
  about 9,000 such nodes while bounding the memory a stray file can take.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_FILE_BYTES", "MAX_FILES", "SUFFIXES", "Source", "SourceError", "read_sources"]

MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_FILES = 10_000
SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class SourceError(Exception):
    """A path that cannot be read; the message names it and says why."""


@dataclass(frozen=True, slots=True)
class Source:
    name: str  # as the user wrote it (or found under a folder), "stdin" for `-`
    data: bytes
    json: bool  # named *.json
    stdin: bool = False  # read from `-`: cannot be read again


def read_sources(paths: Sequence[str]) -> Iterator[Source]:
    """Each file the paths name, read in full, in order (a folder's files sorted)."""
    if sum(raw == STDIN for raw in paths) > 1:
        raise SourceError("-: standard input can be read only once")
    budget = [MAX_FILES]
    for raw in paths:
        if raw == STDIN:
            yield Source("stdin", _bounded(sys.stdin.buffer.fileno(), "stdin", stdin=True), json=False, stdin=True)
        elif raw == "":
            raise SourceError('"": an empty path names no file (use . for the current folder)')
        elif stat.S_ISDIR(_stat(raw).st_mode):
            for path in _walk(Path(raw), budget):
                yield _read(str(path))
        else:
            budget[0] -= 1
            yield _read(raw)


def _stat(raw: str) -> os.stat_result:
    try:
        return os.stat(raw)
    except OSError as err:
        raise SourceError(f"{raw}: {_reason(raw, err)}") from None


def _reason(raw: str, err: OSError) -> str:
    if err.errno == errno.ENOENT and os.path.islink(raw):
        return f"a symlink to {os.readlink(raw)}, which does not exist"
    if err.errno == errno.ENOENT:
        return "no such file or directory"
    if err.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return (err.strerror or str(err)).lower()


def _read(raw: str) -> Source:
    try:
        fd = os.open(raw, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise SourceError(f"{raw}: {_reason(raw, err)}") from None
    try:
        return Source(raw, _bounded(fd, raw, stdin=False), json=raw.endswith(".json"))
    finally:
        os.close(fd)


def _bounded(fd: int, name: str, *, stdin: bool) -> bytes:
    """The whole content of `fd`, a regular file (or stdin: a pipe too), at most MAX_FILE_BYTES."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise SourceError(f"{name}: is a directory")
    if not stat.S_ISREG(mode) and not stdin:
        kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
        raise SourceError(f"{name}: not a regular file ({kind}); only regular files are read")
    chunks, size = [], 0
    try:
        while size <= MAX_FILE_BYTES and (chunk := os.read(fd, min(1 << 22, MAX_FILE_BYTES + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise SourceError(f"{name}: cannot read: {_reason(name, err)}") from None
    if size > MAX_FILE_BYTES:
        raise SourceError(f"{name}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    return b"".join(chunks)


def _walk(top: Path, budget: list[int]) -> list[Path]:
    """YAML/JSON files under `top`, sorted; symlinked folders and hidden entries skipped."""
    found: list[Path] = []
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError as err:
            raise SourceError(f"{folder}: {_reason(str(folder), err)}") from None
        for entry in listed:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                pending.append(folder / entry.name)
            elif entry.name.endswith(SUFFIXES):
                budget[0] -= 1
                if budget[0] < 0:
                    raise SourceError(f"{top}: more than {MAX_FILES} .yaml/.yml/.json files")
                found.append(folder / entry.name)
    if not found:
        raise SourceError(f"{top}: no .yaml, .yml or .json files under this folder")
    return sorted(found)
