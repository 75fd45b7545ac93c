"""webhook.leader against a scripted Lease API: a hung API server, which the real control
plane cannot be made to be on demand. Taking over, releasing on SIGTERM and SIGKILL are
proven on the real API server in tests/e2e/test_controller.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from quota.kubeapi import ApiError, Resource
from quota.leases import Timing
from webhook.leader import LeaderElector

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


def elector(api: FakeLeases, identity: str) -> LeaderElector:
    return LeaderElector(api, name="lease", namespace="ns", identity=identity, timing=TIMING)  # type: ignore[arg-type]


async def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline() -> None:
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
        await asyncio.wait_for(cancelled.wait(), 2)
        # The work stops no later than the renew deadline after the last renewal (+ one tick).
        assert asyncio.get_running_loop().time() - hung <= TIMING.renew_deadline + TIMING.retry_period + 0.1
        assert not leader.leading()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_candidate_waits_out_a_live_lease_and_takes_a_released_one_at_once() -> None:
    api = FakeLeases()
    a, b = elector(api, "a"), elector(api, "b")
    a_leads, b_leads = asyncio.Event(), asyncio.Event()

    async def lead(flag: asyncio.Event) -> None:
        flag.set()
        await asyncio.Event().wait()

    task_a = asyncio.create_task(a.run(lambda: lead(a_leads)))
    await asyncio.wait_for(a_leads.wait(), 2)
    task_b = asyncio.create_task(b.run(lambda: lead(b_leads)))
    try:
        # a renews every retry period: b never sees the record unchanged for a lease duration.
        await asyncio.sleep(TIMING.lease_duration * 2)  # a span of time is the subject here, not a sync
        assert not b_leads.is_set() and api.obj is not None and api.obj["spec"]["holderIdentity"] == "a"
        task_a.cancel()  # SIGTERM: the work stops, the Lease is released
        await asyncio.gather(task_a, return_exceptions=True)
        assert api.obj["spec"]["holderIdentity"] is None
        released = asyncio.get_running_loop().time()
        await asyncio.wait_for(b_leads.wait(), 2)
        assert asyncio.get_running_loop().time() - released < TIMING.lease_duration  # not waited out
        assert api.obj["spec"]["holderIdentity"] == "b" and api.obj["spec"]["leaseTransitions"] == 1
    finally:
        for task in (task_a, task_b):
            task.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
