"""Reload something from files when they change on disk, by polling their stat.

Neighbours: `commands.serve` reloads the serving certificate pair (`--cert-mode files`)
with it, `webhook.adminpolicy` the adminAccess policy file. One loop for both, so both
behave the same way on a mounted Secret or ConfigMap.

Polling rather than inotify: a mounted Secret or ConfigMap changes by an atomic symlink
swap (kubelet's AtomicWriter renames `..data`), which stat of the path follows, and
an inotify watch on the path would keep watching the old, unlinked target.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

__all__ = ["Stamp", "reload_on_change", "stamp"]

log = logging.getLogger(__name__)

Stamp = tuple[int, ...]


def stamp(*paths: Path) -> Stamp:
    """What changes when any of the files does: mtime, size and inode of each (stat follows symlinks)."""
    stats = [os.stat(p) for p in paths]
    return tuple(v for s in stats for v in (s.st_mtime_ns, s.st_size, s.st_ino))


async def reload_on_change(
    probe: Callable[[], Stamp],
    every: float,
    since: Stamp,
    reload: Callable[[], None],
    what: str,
    errors: tuple[type[Exception], ...] = (OSError, ValueError),
) -> NoReturn:
    """Every `every` seconds, call `reload` if the files' stamp (`probe()`, e.g. `stamp`
    of the paths) moved from `since`.

    `since` is the stamp taken *before* the content in use was read, so a change made
    while it was read is not missed. A `reload` that raises one of `errors` keeps what
    is in use and is tried again at the next poll (a pair read half-written may be
    complete by then); its warning is logged once per state of the files, not at every
    poll.
    """
    warned: Stamp | None = None
    while True:
        await asyncio.sleep(every)
        try:
            current = probe()
            if current == since:
                continue
            reload()
            since = warned = current
        except errors as err:
            try:
                failed: Stamp | None = probe()
            except OSError:
                failed = None
            if failed is None or failed != warned:
                log.warning("cannot reload %s: %s; keeping the current one", what, err)
            warned = failed
