"""Leader election: one replica of `dra-quota serve` runs the quota controller at a time.

Neighbours: `quota.status.leases` holds the Lease record and the pure decisions (read its
docstring for the rules and why they are client-go's); `kube.api` does the HTTP;
`commands.serve` runs `LeaderElector.run` with the controller (`controllers.quotas`) as
the work to do while leading, and the controller asks `leading()` before each write.
`kube.writegate.WRITE_GATE` asks it again for every write the leader's writers send.

Why not kubernetes_asyncio's `leaderelection`: its Lease calls have no
timeout (a hung renew keeps a replica "leading" forever), it never releases the lease
on shutdown (the next replica waits out the whole duration) and it stamps local time as
UTC. This loop bounds every attempt, releases on cancellation, and writes real UTC.

Each attempt reads the Lease and, if `quota.status.leases.may_acquire` allows, writes it back
with the resourceVersion it read (a PUT: 409 when someone wrote in between), so two
candidates never both succeed. The leader renews every retry period; when it has not
renewed for the renew deadline, or sees another holder, it stops leading at once: the
work is cancelled before the next candidate may take over (the lease duration is longer
than the renew deadline and candidates count it from their own observation).

Fencing (a leader frozen by SIGSTOP, a paused VM, a loop stalled past its deadline):
`leading()` is the one write gate. It holds only while this replica's newest observation
of the Lease (its own last write, or the renew loop's last read) names it as the holder,
AND its last successful renew started within the renew deadline on a clock that keeps
counting while the process or the machine is suspended (CLOCK_BOOTTIME). Every write of
the leader's writers passes it immediately before it is sent (`fenced`: the work runs in
a context that sets `kube.writegate.WRITE_GATE`), not only when the writer decided to write:
a writer that was mid-write or queued when the process froze finds the gate closed on
waking and sends nothing. A replica that wakes past its deadline has stopped leading; it
reads the Lease again (a campaign) before it may lead, and so write, again. What a gate
cannot stop, a write already on the wire when the process froze, is refused by the API
server where it carries the resourceVersion it was computed from (the quota status).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import LEASES
from kube.writegate import WRITE_GATE
from quota.status.leases import Observed, Timing, acquired, may_acquire, observe, parse_lease, released
from quota.values.raw import Obj

__all__ = ["LeaderElector", "default_identity"]

log = logging.getLogger(__name__)

_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def suspend_aware_clock() -> float:
    """Seconds on a clock that also counts time the machine was suspended (Linux
    CLOCK_BOOTTIME; elsewhere the monotonic clock): a VM paused past the renew deadline
    wakes with its lease expired by this clock, as every other replica sees it."""
    return time.clock_gettime(_BOOTTIME)


def default_identity() -> str:
    """The Pod's name (stable across restarts of one replica: a restart retakes its own
    lease at once), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


class LeaderElector:
    def __init__(self, api: KubeApi, *, name: str, namespace: str, identity: str, timing: Timing,
                 clock: Callable[[], float] = suspend_aware_clock, wall: Callable[[], float] = time.time) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.wall = wall
        self._observed: Observed | None = None
        self._held: Obj | None = None  # the Lease as we last wrote it while leading
        self._renewed: float | None = None  # monotonic start of the last successful attempt
        self._last_error = ""

    def leading(self) -> bool:
        """The write gate (module doc): the newest Lease this replica observed names it as
        the holder, and its last renewal is younger than the renew deadline."""
        return (self._renewed is not None and self.clock() < self._renewed + self.timing.renew_deadline
                and self._observed is not None and self._observed.record.holder == self.identity)

    def fenced(self) -> contextvars.Context:
        """A context whose tasks' writes pass `leading()` immediately before each is sent
        (`kube.writegate.WRITE_GATE`): for every task that writes only while leading."""
        context = contextvars.copy_context()
        context.run(WRITE_GATE.set, self.leading)
        return context

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign, run `lead()` while leading, campaign again after losing; until cancelled.

        On cancellation (shutdown) the work is cancelled first, then the lease released.
        An exception from `lead()` ends this loop with it (the process should stop).
        """
        try:
            while True:
                await self._campaign()
                log.info("leading: Lease %s/%s held by %s", self.namespace, self.name, self.identity)
                work = asyncio.create_task(lead(), name="quota controller", context=self.fenced())
                try:
                    await self._renew_while(work)
                finally:
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                self._renewed = None
                log.warning("stopped leading: Lease %s/%s not renewed within %ss", self.namespace, self.name,
                            self.timing.renew_deadline)
        finally:
            await self._release()

    async def _campaign(self) -> None:
        while True:
            if await self._attempt(timeout=self.timing.renew_deadline):
                return
            # client-go's JitterFactor 1.2: candidates do not retry in lock step.
            await asyncio.sleep(self.timing.retry_period * (1 + 0.2 * random.random()))

    async def _renew_while(self, work: asyncio.Task[None]) -> None:
        while True:
            done, _ = await asyncio.wait({work}, timeout=self.timing.retry_period)
            if done:
                work.result()  # raises what the work raised
                raise RuntimeError("the quota controller returned")
            assert self._renewed is not None
            remaining = self._renewed + self.timing.renew_deadline - self.clock()
            if remaining <= 0 or not await self._attempt(timeout=remaining):
                if not self.leading() or self._taken():
                    return

    def _taken(self) -> bool:
        holder = self._observed.record.holder if self._observed is not None else ""
        return holder not in ("", self.identity)

    async def _attempt(self, *, timeout: float) -> bool:
        """One bounded try to acquire or renew; False on any failure (logged)."""
        started = self.clock()
        try:
            async with asyncio.timeout(timeout):
                written = await self._try_write(started)
        except _FAILURES as err:
            # A leader's failure always counts; a candidate's is said once per new error
            # (a missing namespace or RBAC rule would otherwise go unseen, or flood the log).
            text = str(err) or type(err).__name__
            level = logging.WARNING if self._renewed is not None or text != self._last_error else logging.DEBUG
            self._last_error = text
            log.log(level, "Lease %s/%s: %s", self.namespace, self.name, text)
            return False
        self._last_error = ""
        if written is None:
            return False
        self._held = written
        self._observed = observe(None, parse_lease(written), started)
        self._renewed = started
        return True

    async def _try_write(self, now: float) -> Obj | None:
        try:
            obj = await self.api.get(LEASES, self.name, namespace=self.namespace)
        except ApiError as err:
            if err.status != 404:
                raise
            body = {"apiVersion": LEASES.api_version, "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": acquired(None, self.identity, wall=self.wall(), duration=self.timing.lease_duration)}
            return await self._conditional(self.api.create(LEASES, body, namespace=self.namespace))
        record = parse_lease(obj)
        self._observed = observe(self._observed, record, now)
        if not may_acquire(self._observed, self.identity, now):
            return None
        spec = {**(obj.get("spec") or {}),
                **acquired(record, self.identity, wall=self.wall(), duration=self.timing.lease_duration)}
        return await self._conditional(self.api.replace(LEASES, {**obj, "spec": spec}, namespace=self.namespace))

    async def _conditional(self, write: Coroutine[Any, Any, Obj]) -> Obj | None:
        """The write's answer, or None when another writer got there first (409)."""
        try:
            return await write
        except ApiError as err:
            if err.status == 409:
                return None
            raise

    async def _release(self) -> None:
        """Clear the holder so the next candidate takes over at once, not after the duration.

        Only the Lease we last wrote, by its resourceVersion: if anyone wrote since, the
        lease is no longer ours to release.
        """
        held, self._held = self._held, None
        if held is None or not self.leading():
            return
        self._renewed = None
        spec = {**(held.get("spec") or {}), **released(parse_lease(held), wall=self.wall())}
        try:
            async with asyncio.timeout(self.timing.retry_period):
                await self.api.replace(LEASES, {**held, "spec": spec}, namespace=self.namespace)
            log.info("released Lease %s/%s", self.namespace, self.name)
        except _FAILURES as err:
            log.warning("cannot release Lease %s/%s (the next leader waits for it to expire): %s",
                        self.namespace, self.name, err or type(err).__name__)
