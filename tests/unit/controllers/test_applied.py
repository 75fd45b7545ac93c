"""controllers.applied: which AppliedClusterDeviceQuotas the leader writes and deletes for a
team, how often, and why (`quota.status.appliedplan`): a tenant's claim event writes its own
namespace's copy only; the team's totals reach the other members once per refresh period,
at once after an admin's change, and a flip at the edge at most once per period. The
writes themselves are proven against the real API server (tests/e2e/test_applied_quota.py)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from controllers.applied import AppliedQuotas
from kube.apierror import ApiError
from quota.status.applied import applied_quotas

from ..clock import FakeClock, until
from ..quota.status.test_published import BREAKDOWN, part, team

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class RecordingApi:
    """Server-side applies and deletes, as (verb, namespace, name)."""

    def __init__(self, existing: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, str, str]] = []
        self.bodies: dict[str, Any] = {}  # namespace -> the last body applied there
        self.existing = existing

    async def list(self, resource: Any, **kwargs: Any) -> Any:
        assert kwargs == {"label_selector": "app.kubernetes.io/managed-by=dra-quota"}
        return type("Listing", (), {"items": self.existing})()

    async def patch(self, resource: Any, name: str, body: Any, **kwargs: Any) -> Any:
        assert kwargs["patch_type"] == "apply" and kwargs["force"]
        self.calls.append(("apply", kwargs["namespace"], name))
        self.bodies[kwargs["namespace"]] = body
        return body

    async def delete(self, resource: Any, name: str, *, namespace: str) -> Any:
        self.calls.append(("delete", namespace, name))
        if namespace == "gone-already":
            raise ApiError(404, "NotFound", "not found")
        return {}

    def written(self) -> builtins.list[str]:
        """The namespaces written since the last call, sorted."""
        done = sorted(ns for _, ns, _ in self.calls)
        self.calls.clear()
        return done


def owned(breakdown: list[dict[str, Any]], used: str = "480Gi", generation: int = 3) -> dict[str, Any]:
    obj = team(breakdown, generation)
    obj["metadata"]["uid"] = "u1"
    obj["status"]["used"]["memory"] = used
    obj["status"]["observedGeneration"] = generation
    return obj


def controller(api: RecordingApi, clock: FakeClock, **kwargs: Any) -> AppliedQuotas:
    return AppliedQuotas(api, leading=lambda: True, clock=clock,  # type: ignore[arg-type]
                         wall=lambda: EPOCH + timedelta(seconds=clock.now), **kwargs)


@contextlib.asynccontextmanager
async def running(api: RecordingApi, *, refresh: float) -> AsyncIterator[AppliedQuotas]:
    """`run` on the real clock (a team every 10 ms), cancelled after."""
    applied = AppliedQuotas(api, leading=lambda: True, refresh=refresh, interval=0.01)  # type: ignore[arg-type]
    task = asyncio.create_task(applied.run())
    try:
        yield applied
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def round_of(applied: AppliedQuotas, obj: dict[str, Any] | None) -> int:
    applied.published("ml-team", obj)
    return await applied._round("ml-team", asyncio.Semaphore(4))


M = 50  # members of the big team


def big_team(reserved_gi: list[int], generation: int = 3, hard: str = "640Gi") -> dict[str, Any]:
    """A team of M namespaces ml-00.., each holding reserved_gi[i] Gi reserved, no devices."""
    obj = owned([part(f"ml-{i:02}", "0", 0, f"{gi}Gi") for i, gi in enumerate(reserved_gi)], used="0",
                generation=generation)
    obj["spec"]["hard"] = {"memory": hard}
    obj["status"]["used"] = {"memory": "0", "devices": 0}
    obj["status"]["reserved"] = {"memory": f"{sum(reserved_gi)}Gi", "devices": 0}
    return obj


async def test_writes_each_member_once_then_only_what_changed_and_deletes_who_left() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = controller(api, clock)
    assert await round_of(applied, owned(BREAKDOWN)) == 2
    assert sorted(api.calls) == [("apply", "ml-dev", "ml-team"), ("apply", "ml-train", "ml-team")]
    assert applied.writes == {"spec": 2}  # a new team: its members joined
    api.calls.clear()
    clock.advance(3600)
    assert await round_of(applied, owned(BREAKDOWN)) == 0  # the resync, an hour on: nothing changed, nothing sent
    assert api.calls == []
    # ml-train left the team and the totals moved: ml-dev rewritten, ml-train's copy deleted.
    assert await round_of(applied, owned([BREAKDOWN[0]], used="80Gi")) == 2
    assert sorted(api.calls) == [("apply", "ml-dev", "ml-team"), ("delete", "ml-train", "ml-team")]
    assert applied.writes == {"spec": 3, "delete": 1}


async def test_n_claim_events_in_one_member_write_n_copies_and_the_others_after_the_refresh_period() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = controller(api, clock, refresh=60.0)
    reserved = [0] * M
    assert await round_of(applied, big_team(reserved)) == M
    api.written()
    events = 20  # one every 2 s: 40 s, within one refresh period
    for _ in range(events):
        clock.advance(2)
        reserved[0] += 1
        assert await round_of(applied, big_team(reserved)) == 1
        assert api.written() == ["ml-00"]
    assert applied.writes["own"] == events and applied.writes["refresh"] == 0  # not events x members
    # The copy written carries the newest totals, and says when they were read.
    assert api.bodies["ml-00"]["status"]["reserved"] == {"memory": "20Gi", "devices": 0}
    assert api.bodies["ml-00"]["status"]["teamObservedAt"] == "2026-01-01T00:00:40Z"
    assert api.bodies["ml-00"]["status"]["teamRefreshSeconds"] == 60
    assert api.bodies["ml-01"]["status"]["reserved"] == {"memory": "0", "devices": 0}  # stale, for now
    assert applied._stale["ml-team"] == 60.0  # when the others' totals are due
    clock.advance(20)  # the others' totals were written at 0: due now
    assert await applied._round("ml-team", asyncio.Semaphore(4)) == M - 1
    assert api.written() == [f"ml-{i:02}" for i in range(1, M)]
    assert all(body["status"]["reserved"] == {"memory": "20Gi", "devices": 0} for body in api.bodies.values())
    assert applied.writes == {"spec": M, "own": events, "refresh": M - 1}
    assert "ml-team" not in applied._stale  # every copy current: nothing left to do
    clock.advance(600)
    assert await round_of(applied, big_team(reserved)) == 0  # no change, nothing written, however long


async def test_a_big_teams_refresh_is_spread_over_rounds_the_longest_stale_first() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = controller(api, clock, refresh=60.0, batch=20)
    reserved = [0] * M
    await round_of(applied, big_team(reserved))
    api.written()
    clock.advance(61)
    reserved[0] = 1
    assert await round_of(applied, big_team(reserved)) == 1 + 20  # its own, and the first batch
    assert api.written() == ["ml-00", *(f"ml-{i:02}" for i in range(1, 21))]
    assert applied._stale["ml-team"] == clock.now  # the rest: at the next round
    clock.advance(2)
    reserved[7] = 1  # an own write gets in between the batches
    assert await round_of(applied, big_team(reserved)) == 1 + 20
    assert api.written() == ["ml-07", *(f"ml-{i:02}" for i in range(21, 41))]  # those written longest ago
    clock.advance(2)
    assert await applied._round("ml-team", asyncio.Semaphore(4)) == 9
    assert api.written() == [f"ml-{i:02}" for i in range(41, M)]
    # The first batch (and ml-00) missed ml-07's change: due a period after they were written.
    assert applied._stale["ml-team"] == 61.0 + 60


async def test_an_admin_change_refreshes_every_member_at_once() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = controller(api, clock)
    reserved = [0] * M
    await round_of(applied, big_team(reserved))
    api.written()
    clock.advance(2)
    reserved[3] = 10
    await round_of(applied, big_team(reserved))
    assert api.written() == ["ml-03"]
    clock.advance(2)  # within the refresh period: the new hard reaches every copy at once
    assert await round_of(applied, big_team(reserved, generation=4, hard="1Ti")) == M
    assert applied.writes["spec"] == 2 * M
    assert all(body["status"]["hard"] == {"memory": "1Ti"} and body["status"]["teamGeneration"] == 4
               for body in api.bodies.values())
    # A namespace joins with its claims: every member's copy at once, the new one's created.
    clock.advance(2)
    assert await round_of(applied, big_team([*reserved, 40], generation=4, hard="1Ti")) == M + 1
    assert applied.writes["spec"] == 3 * M + 1


async def test_a_tenant_flip_flopping_at_the_edge_costs_the_others_one_write_per_period() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = controller(api, clock, refresh=60.0)
    reserved = [0] * M
    reserved[1] = 560  # 80Gi of headroom left in 640Gi
    await round_of(applied, big_team(reserved))
    api.written()
    flips = 14  # ml-00 takes the last 80Gi, frees it, takes it...: 28 s, within one period
    for i in range(flips):
        clock.advance(2)
        reserved[0] = 80 if i % 2 == 0 else 0
        await round_of(applied, big_team(reserved))
        # The first flip (headroom 0) tells everyone at once; the next ones, ml-00 alone.
        assert api.written() == ([f"ml-{n:02}" for n in range(M)] if i == 0 else ["ml-00"])
    assert applied.writes["refresh"] == M - 1 and applied.writes["own"] == flips
    clock.advance(60)  # a period after the early refresh: the others catch up once
    assert await applied._round("ml-team", asyncio.Semaphore(4)) == M - 1
    assert applied.writes["refresh"] == 2 * (M - 1)


async def test_a_new_leader_writes_only_what_differs_from_what_it_found() -> None:
    clock = FakeClock(1000)
    found = copy.deepcopy(applied_quotas(owned(BREAKDOWN), observed_at="2026-01-01T00:16:10Z", refresh_seconds=60))
    stale = {"metadata": {"name": "ml-team", "namespace": "gone-already", "ownerReferences": [{"uid": "u1"}]},
             "status": {}}
    api = RecordingApi([*found.values(), stale])
    applied = controller(api, clock)
    await applied._list()
    assert await round_of(applied, owned(BREAKDOWN)) == 1  # the stale one, already gone (404 is done)
    assert api.calls == [("delete", "gone-already", "ml-team")]
    api.calls.clear()
    # Totals moved (one more claim allocated, no flip): the copies found were read 30 s
    # ago, so they are due in 30 s.
    moved = owned(BREAKDOWN)
    moved["status"]["claims"]["allocated"] = 7
    assert await round_of(applied, moved) == 0
    assert applied._stale["ml-team"] == 1030.0


async def test_nothing_sent_when_not_leading_and_a_deleted_team_is_left_to_garbage_collection() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = AppliedQuotas(api, leading=lambda: False, clock=clock)  # type: ignore[arg-type]
    assert await round_of(applied, owned(BREAKDOWN)) == 0 and api.calls == []
    applied.leading = lambda: True
    await round_of(applied, owned([part("solo", "1Gi", 1)]))
    api.calls.clear()
    assert await round_of(applied, None) == 0 and api.calls == []
    assert applied._have == {}


async def test_a_copy_deleted_by_hand_is_written_again_after_the_next_list() -> None:
    api, clock = RecordingApi(), FakeClock()
    applied = controller(api, clock)
    await round_of(applied, owned(BREAKDOWN))
    api.existing = list(applied_quotas(owned(BREAKDOWN), observed_at="2026-01-01T00:00:00Z",
                                       refresh_seconds=60).values())[:1]  # ml-train's deleted by hand
    await applied._list()  # the resync's list
    api.calls.clear()
    assert applied._stale == {"ml-team": 0.0}  # looked at again without waiting for a publication
    assert await applied._round("ml-team", asyncio.Semaphore(4)) == 1
    assert api.calls == [("apply", "ml-train", "ml-team")]


async def test_run_writes_a_namespaces_own_copy_at_once_while_the_others_wait_for_the_period() -> None:
    """The loop: a claim event's own write is not held back by the others' refresh due
    a period later."""
    api = RecordingApi()
    async with running(api, refresh=3600) as applied:
        reserved = [0] * 5
        applied.published("ml-team", big_team(reserved))
        await until(lambda: applied.writes["spec"] == 5, "every member's copy created")
        for gi in (10, 20):  # the second event comes while the others' refresh is pending
            reserved[0] = gi
            applied.published("ml-team", big_team(reserved))
            await until(lambda: api.bodies["ml-00"]["status"]["namespace"]["reserved"]["memory"] == f"{gi}Gi",
                        f"ml-00's own copy at {gi}Gi")
        assert applied.writes == {"spec": 5, "own": 2}


async def test_run_writes_the_others_totals_on_its_own_after_the_period() -> None:
    """The loop, not a round called by hand: the stale copies' refresh comes without any
    further publication."""
    api = RecordingApi()
    async with running(api, refresh=0.2) as applied:
        reserved = [0] * 5
        applied.published("ml-team", big_team(reserved))
        await until(lambda: applied.writes["spec"] == 5, "every member's copy created")
        reserved[0] = 10
        applied.published("ml-team", big_team(reserved))
        await until(lambda: applied.writes["refresh"] == 4, "the others' totals refreshed")
        assert applied.writes == {"spec": 5, "own": 1, "refresh": 4}
        assert all(body["status"]["reserved"]["memory"] == "10Gi" for body in api.bodies.values())
