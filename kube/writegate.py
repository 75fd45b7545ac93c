"""The write gate: a leader-only writer's writes are refused once it stops leading, up to the last byte.

Neighbours: `controllers.leader.LeaderElector.fenced` sets `WRITE_GATE` for its writers;
`kube.api.KubeApi` asks the gate before each attempt of a write, hooks `gate_at_send`
on its session, sends a gated write's body as `GatedBody` and raises what the gate
refused as `NotLeading` (`refused_as_not_leading`); `ungated` gives a shared writer a
context free of the gate of whichever writer started it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from kube.apierror import ApiError

__all__ = ["WRITE_GATE", "Gated", "GatedBody", "NotLeading", "gate_at_send", "refused_as_not_leading", "ungated"]

# The write gate of the task that sends: a leader-only writer runs in a context where it
# is set (`controllers.leader.LeaderElector.fenced`), and every write it sends (any verb
# but GET) is refused unless the gate still holds when it goes out: asked before each
# attempt, again once the request has its connection (`gate_at_send`: a write may wait
# for one in the pool for as long as the writes ahead of it take), and last as aiohttp
# writes its body (`GatedBody`). A writer that decided while leading and was suspended
# before sending (a frozen process, a full connection pool, a 429's Retry-After) thus
# never sends after losing the Lease.
WRITE_GATE: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("write_gate", default=None)


def ungated() -> contextvars.Context:
    """A context without a write gate, for a task a writer starts on behalf of every
    writer (a quota's batch of status writes, a lease's renewals): it must not inherit
    the gate of the leader's writer that happened to start it, or every replica's
    admissions it carries would be refused once this replica stops leading."""
    context = contextvars.copy_context()
    context.run(WRITE_GATE.set, None)
    return context


class NotLeading(ApiError):
    """A write refused by this task's write gate (`WRITE_GATE`) before it was sent."""

    def __init__(self, where: str) -> None:
        super().__init__(0, "NotLeading", "this replica no longer holds the leader Lease: write not sent", where=where)


@dataclass(frozen=True, slots=True)
class Gated:
    gate: Callable[[], bool]
    where: str


async def gate_at_send(_session: aiohttp.ClientSession, context: Any, _params: object) -> None:
    """aiohttp's trace hook as a request takes a pooled connection or starts a new one
    (`WRITE_GATE`). aiohttp releases the connection (or its slot) when a hook raises."""
    gated = context.trace_request_ctx
    if isinstance(gated, Gated) and not gated.gate():
        raise NotLeading(gated.where)


class GatedBody(aiohttp.BytesPayload):
    """A write's body that asks the gate as aiohttp writes it, in the task that writes the
    request once it has its connection (its headers go out with the body): the last step
    before its bytes reach the socket. Refused, nothing of the request is complete, so the
    API server does nothing with it; aiohttp reports a ClientConnectionError caused by
    the `NotLeading`, which `_round_trip` raises as it is."""

    def __init__(self, value: bytes, gated: Gated) -> None:
        super().__init__(value, content_type="application/json")
        self.gated = gated

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        if not self.gated.gate():
            raise NotLeading(self.gated.where)
        await super().write_with_length(writer, content_length)


@contextlib.asynccontextmanager
async def refused_as_not_leading() -> AsyncIterator[None]:
    """A write its gated body refused (`GatedBody`) raised as the `NotLeading` it is."""
    try:
        yield
    except aiohttp.ClientConnectionError as err:
        if isinstance(err.__cause__, NotLeading):
            raise err.__cause__ from None
        raise
