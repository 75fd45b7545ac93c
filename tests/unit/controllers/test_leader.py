"""controllers.leader against a scripted Lease API: a hung API server, which the real control
plane cannot be made to be on demand. Taking over, releasing on SIGTERM and SIGKILL are
proven on the real API server in tests/e2e/test_controller.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from controllers.leader import LeaderElector
from kube.api import Resource
from kube.apierror import ApiError
from kube.writegate import WRITE_GATE
from quota.status.leases import Timing

from ..clock import FakeClock, until

TIMING = Timing(lease_duration=0.6, renew_deadline=0.4, retry_period=0.1)


class FakeLeases:
    """One Lease with a resourceVersion; `hang` makes every call wait forever."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.hang = False
        self.writes: list[dict[str, Any]] = []

    async def _maybe_hang(self) -> None:
        await asyncio.sleep(0)
        if self.hang:
            await asyncio.Event().wait()

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        await self._maybe_hang()
        if self.obj is None:
            raise ApiError(404, "NotFound", name)
        return copy.deepcopy(self.obj)

    async def create(self, resource: Resource, body: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        await self._maybe_hang()
        if self.obj is not None:
            raise ApiError(409, "AlreadyExists", "exists")
        return self._store(body)

    async def replace(self, resource: Resource, body: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        await self._maybe_hang()
        assert self.obj is not None
        if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "stale")
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        rv = int((self.obj or {"metadata": {"resourceVersion": "0"}})["metadata"]["resourceVersion"]) + 1
        self.obj = copy.deepcopy({**body, "metadata": {**body["metadata"], "resourceVersion": str(rv)}})
        self.writes.append(copy.deepcopy(self.obj))
        return copy.deepcopy(self.obj)


class Reads:
    """`api` as one candidate calls it, counting its reads: one each attempt."""

    def __init__(self, api: FakeLeases) -> None:
        self.api, self.reads = api, 0

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        self.reads += 1
        return await self.api.get(resource, name, namespace=namespace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.api, name)


def elector(api: FakeLeases, identity: str) -> LeaderElector:
    return LeaderElector(api, name="lease", namespace="ns", identity=identity, timing=TIMING)  # type: ignore[arg-type]


async def test_a_leader_that_cannot_renew_stops_at_the_renew_deadline() -> None:
    api = FakeLeases()
    leader = elector(api, "a")
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    task = asyncio.create_task(leader.run(work))
    try:
        await asyncio.wait_for(started.wait(), 2)
        assert leader.leading() and api.obj is not None and api.obj["spec"]["holderIdentity"] == "a"
        api.hang = True  # every renewal now hangs: the API server is unreachable
        hung = asyncio.get_running_loop().time()
        # A hung renewal is bounded by what is left of the renew deadline, so the work stops;
        # without that bound it would lead forever (the wait is 25 deadlines long: a busy
        # machine cannot fail it, a missing bound does).
        await asyncio.wait_for(cancelled.wait(), 25 * TIMING.renew_deadline)
        # Not before the deadline: the last renewal was at most one retry period before the
        # hang (a lower bound, which load can only make longer).
        assert asyncio.get_running_loop().time() - hung >= TIMING.renew_deadline - TIMING.retry_period
        assert not leader.leading()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_candidate_waits_out_a_live_lease_and_takes_a_released_one_at_once() -> None:
    api = FakeLeases()
    b_api, b_clock = Reads(api), FakeClock()
    a = elector(api, "a")
    b = LeaderElector(b_api, name="lease", namespace="ns", identity="b", timing=TIMING,  # type: ignore[arg-type]
                      clock=b_clock)
    a_leads, b_leads = asyncio.Event(), asyncio.Event()

    async def lead(flag: asyncio.Event) -> None:
        flag.set()
        await asyncio.Event().wait()

    task_a = asyncio.create_task(a.run(lambda: lead(a_leads)))
    await asyncio.wait_for(a_leads.wait(), 2)
    task_b = asyncio.create_task(b.run(lambda: lead(b_leads)))
    try:
        # a renews every retry period: b, whose clock moves only here, never sees the record
        # unchanged for a lease duration (whole seconds in the Lease), though its clock
        # passes two in all.
        assert api.obj is not None
        duration = api.obj["spec"]["leaseDurationSeconds"]
        for _ in range(3):
            b_clock.advance(duration * 2 / 3)
            renewals, reads = len(api.writes), b_api.reads
            await until(lambda: len(api.writes) > renewals and b_api.reads >= reads + 2)  # b saw the renewal
        assert not b_leads.is_set() and api.obj is not None and api.obj["spec"]["holderIdentity"] == "a"
        task_a.cancel()  # SIGTERM: the work stops, the Lease is released
        await asyncio.gather(task_a, return_exceptions=True)
        assert api.obj["spec"]["holderIdentity"] is None
        # No time passes for b now: it cannot wait any lease out, so it leads only because
        # the lease was released.
        await asyncio.wait_for(b_leads.wait(), 25 * TIMING.lease_duration)
        assert api.obj["spec"]["holderIdentity"] == "b" and api.obj["spec"]["leaseTransitions"] == 1
    finally:
        for task in (task_a, task_b):
            task.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)


async def test_a_write_decided_while_leading_is_not_sent_once_frozen_past_the_deadline() -> None:
    """SIGSTOP between a writer's decision and its send: on waking, the gate its write
    passes as it is sent (`kube.writegate.WRITE_GATE`) is closed, though the writer saw itself
    leading; the elector then steps down and reads the Lease again before leading."""
    api, clock = FakeLeases(), FakeClock()
    leader = LeaderElector(api, name="lease", namespace="ns", identity="a", timing=TIMING,  # type: ignore[arg-type]
                           clock=clock)
    decided, frozen = asyncio.Event(), asyncio.Event()
    gates: list[bool] = []
    leads = 0

    async def work() -> None:
        nonlocal leads
        leads += 1
        if leads > 1:
            await asyncio.Event().wait()
        assert leader.leading()
        decided.set()
        await frozen.wait()
        gate = WRITE_GATE.get()
        assert gate is not None
        gates.append(gate())  # what `KubeApi` asks immediately before sending
        await asyncio.Event().wait()

    task = asyncio.create_task(leader.run(work))
    try:
        await asyncio.wait_for(decided.wait(), 2)
        reads = len(api.writes)
        clock.advance(TIMING.renew_deadline)  # frozen: the clock ran, the loop did not
        frozen.set()
        await until(lambda: bool(gates))
        assert gates == [False] and not leader.leading()
        # Awake: it stepped down, read the Lease (still its own: nobody took it) and leads again.
        await until(lambda: leads == 2 and len(api.writes) > reads)
        assert leader.leading()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

