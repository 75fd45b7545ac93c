"""One object's failure stays that object's: the helper every per-object callback runs under.

Neighbours: the reflector stores (`kube.caches`, `kube.claimstore`, `controllers.kueue`), the leader's
annotator (`controllers.annotator`) and the Kueue decision loop call the domain
once per object. The domain raises only what it documents, but a bug, or a tenant's
object that reaches an unbounded path, must cost that object its decision and nothing
more: a store that raises stops its reflector (`kube.watching.Store`), and `serve`
stops the process when a background task dies, so the next leader would meet the same
object and die too (a Workload's count of 2^31-1, priced Pod by Pod, is a MemoryError in
every leader in turn).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

__all__ = ["guarded"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def guarded(what: str, fn: Callable[[], T]) -> T | None:
    """`fn()`, or None after logging (with the traceback) that `what` failed.

    `Exception` only: cancellation and interpreter exit still unwind. MemoryError and
    RecursionError are Exceptions, and are exactly the failures a hostile object causes.
    """
    try:
        return fn()
    except Exception:
        log.exception("%s failed; that object is skipped, everything else goes on", what)
        return None
