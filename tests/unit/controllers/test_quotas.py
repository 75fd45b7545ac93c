"""controllers.quotas against the scripted API server of test_reservations: debouncing,
write-only-on-change, the leadership fence and a conflict with the webhook's writer, on
demand. The real control plane: tests/e2e/test_controller.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from controllers.quotas import QuotaController

from quota.status import quotastatus
from quota.values.model import Namespace

from ..builders import GiB, make_cluster_quota, make_quota
from ..clock import FakeClock, until
from ..quota.accounting.test_ledger import entry
from ..kube.scripted import FakeApi
from ..kube.test_quotawriter import GPU, NS, setup

Running = tuple[FakeApi, QuotaController, list[bool]]


@contextlib.asynccontextmanager
async def running(*, min_interval: float = 0.0, clock: Callable[[], float] | None = None) -> AsyncIterator[Running]:
    """A controller running on a one-quota fake (a context, not a fixture: fixtures run on
    the session's loop, the tests on their own); by default writing as often as it debounces."""
    api, reservations, _ = setup(make_quota("gpus", memory="400Gi"))
    reservations.observe(await api.get(None, "gpus"))  # type: ignore[arg-type]  # as the watch would
    leading = [True]
    controller = QuotaController(reservations.ledger, reservations, leading=lambda: leading[0], debounce=0.05,
                                 min_interval=min_interval, clock=clock)
    task = asyncio.create_task(controller.run())
    try:
        yield api, controller, leading
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def looked(controller: QuotaController, since: int) -> None:
    """Until a reconcile pass after `since` passes completed and nothing is left to do:
    what the controller did about the events before it is then all written."""
    await until(lambda: controller.passes > since and not controller._dirty, f"a pass after pass {since}")


async def postponed(controller: QuotaController) -> None:
    """Until the controller looked at the marked quota and left it to its timer."""
    await until(lambda: not controller._dirty and (NS, "gpus") in controller._timers, "the quota left to its timer")


async def settled(api: FakeApi, writes: int) -> None:
    """Until the fake saw `writes` writes."""
    await until(lambda: api.writes >= writes, f"{writes} write(s)")


async def test_a_burst_of_claim_events_is_one_write() -> None:
    async with running() as (api, controller, _):
        await settled(api, 1)  # the first pass: the status appears
        ledger = controller.ledger
        passes = controller.passes
        for i in range(50):  # 50 claim events in one debounce window
            ledger.add_or_update_claim(entry(f"u{i}", 8 * GiB, allocated=True))
            controller.changed([(NS, "gpus")])
        await looked(controller, passes)
        assert api.writes == 2
        status = api.objects["gpus"]["status"]
        assert status["used"] == {"memory": "400Gi", "devices": 50}
        assert status["claims"] == {"allocated": 50, "pending": 0}


async def test_while_admissions_write_a_quota_the_controller_writes_it_once_per_min_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Claim events in every debounce window while admissions into the quota are being
    # written (a burst of creates): written once, then again only once min_interval has
    # passed on the controller's clock, with all that changed meanwhile.
    clock = FakeClock(1_000.0)
    admitting = [True]
    async with running(min_interval=0.5, clock=clock) as (api, controller, _):
        monkeypatch.setattr(controller.reservations, "admitting", lambda key: admitting[0])
        await settled(api, 1)  # the first pass
        ledger = controller.ledger
        for i in range(6):  # six passes' worth of events, the clock standing still
            ledger.add_or_update_claim(entry(f"u{i}", 8 * GiB, allocated=True))
            controller.changed([(NS, "gpus")])
            await postponed(controller)
            assert api.writes == 1
        clock.advance(0.5)  # the interval passed: the timer's pass writes everything at once
        await settled(api, 2)
        assert api.objects["gpus"]["status"]["used"] == {"memory": "48Gi", "devices": 6}
        # With no admission being written (allocations landing), the debounce alone.
        admitting[0] = False
        ledger.add_or_update_claim(entry("u6", 8 * GiB, allocated=True))
        controller.changed([(NS, "gpus")])
        await settled(api, 3)
        assert api.objects["gpus"]["status"]["used"] == {"memory": "56Gi", "devices": 7}


async def test_nothing_is_written_without_a_change_or_without_the_lease() -> None:
    async with running() as (api, controller, leading):
        await settled(api, 1)
        passes = controller.passes
        controller.changed(None)
        await looked(controller, passes)
        assert api.writes == 1  # recomputed, equal, not written
        leading[0] = False
        passes = controller.passes
        controller.ledger.add_or_update_claim(entry("u1", 80 * GiB, allocated=True))
        controller.changed([(NS, "gpus")])
        await looked(controller, passes)
        assert api.writes == 1  # the fence: not leading, not written


async def test_a_conflict_with_the_webhook_is_re_read_and_keeps_its_entry() -> None:
    async with running() as (api, controller, _):
        await settled(api, 1)
        # The webhook persisted an entry the controller's copy does not have yet.
        reservations = controller.reservations
        decision = await reservations.admit({next(iter(controller.ledger.quotas())): GPU}, uid="w1", claim="team-a/c")
        assert decision.allowed
        stale = api.objects["gpus"]["status"]["reservations"]
        reservations.observe({**api.objects["gpus"], "metadata": {**api.objects["gpus"]["metadata"],
                                                                  "resourceVersion": "1"}, "status": {}})
        controller.ledger.add_or_update_claim(entry("u1", 80 * GiB, allocated=True))
        controller.changed([(NS, "gpus")])
        await settled(api, 3)
        status = api.objects["gpus"]["status"]
        assert status["reservations"] == stale  # not erased by the write computed from the stale copy
        assert status["used"] == {"memory": "80Gi", "devices": 1}
        assert status["reserved"] == {"memory": "80Gi", "devices": 1}  # the unconfirmed entry


async def test_turning_exceeded_is_told_once() -> None:
    async with running() as (api, controller, _):
        told: list[tuple[str, str, str, str]] = []
        controller.exceeded = lambda *args: told.append(args)
        await settled(api, 1)
        api.objects["gpus"]["metadata"]["uid"] = "dq-uid"  # the API server sets one; the fake does not
        for i in range(6):  # 480Gi allocated under a 400Gi hard (lowered after they were admitted)
            controller.ledger.add_or_update_claim(entry(f"u{i}", 80 * GiB, allocated=True))
        controller.changed([(NS, "gpus")])
        await settled(api, 2)
        controller.ledger.add_or_update_claim(entry("u6", 80 * GiB, allocated=True))
        controller.changed([(NS, "gpus")])
        await settled(api, 3)  # still Exceeded, with new numbers: not told again
        assert told == [("team-a", "gpus", "dq-uid", "used + reserved memory=480Gi is above hard memory=400Gi")]


async def test_each_pass_is_timed() -> None:
    async with running() as (api, controller, _):
        seconds: list[float] = []
        controller.observe = seconds.append  # before its task first runs: every pass is seen
        await settled(api, 1)
        passes = controller.passes
        controller.ledger.add_or_update_claim(entry("u1", 80 * GiB, allocated=True))
        controller.changed([(NS, "gpus")])
        await looked(controller, passes)
        assert len(seconds) == controller.passes >= 2
        assert all(s >= 0 for s in seconds)  # how long a pass takes is bench/controller.py's to say


def test_it_looks_again_at_the_quotas_it_is_told_that_the_ledger_still_holds() -> None:
    """Told the keys an event moved (`kube.caches`, `kube.claimstore`): a quota deleted meanwhile has no
    status left to write; None means every quota."""
    _, reservations, _ = setup(make_quota("gpus", memory="400Gi"), make_quota("other", memory="1Ti"))
    controller = QuotaController(reservations.ledger, reservations, leading=lambda: True)
    controller.changed([(NS, "gpus"), (NS, "deleted")])
    assert controller._dirty == {(NS, "gpus")}
    controller.changed(None)
    assert controller._dirty == {(NS, "gpus"), (NS, "other")}


async def test_a_team_status_has_its_breakdown_and_turning_exceeded_by_a_join_is_told() -> None:
    api, reservations, _ = setup(make_cluster_quota("ml", memory="100Gi"))
    ledger = reservations.ledger
    reservations.observe(await api.get(None, "ml"))  # type: ignore[arg-type]
    api.objects["ml"]["metadata"]["uid"] = "cdq-uid"
    ledger.add_or_update_claim(entry("a", 60 * GiB, allocated=True))  # team-a, a member (setup)
    ledger.add_or_update_claim(entry("b", 60 * GiB, allocated=True, ns=Namespace("team-b")))
    told: list[tuple[str, str, str, str]] = []
    published: list[tuple[str, Any]] = []  # what controllers.applied copies into the members
    controller = QuotaController(ledger, reservations, leading=lambda: True, debounce=0.01, min_interval=0.0,
                                 exceeded=lambda *args: told.append(args),
                                 published=lambda name, team: published.append((name, team)))
    task = asyncio.create_task(controller.run())
    try:
        await settled(api, 1)
        status = api.objects["ml"]["status"]
        assert status["used"] == {"memory": "60Gi", "devices": 1}
        assert [(n["namespace"], n["used"]) for n in status["namespaces"]] == [("team-a", {"memory": "60Gi", "devices": 1})]
        # team-b joins the team (a relabel): over hard, told once, nothing evicted.
        controller.changed(ledger.set_namespace(Namespace("team-b"), {"team.draquota.io/name": "ml"}))
        await settled(api, 2)
        status = api.objects["ml"]["status"]
        assert status["used"] == {"memory": "120Gi", "devices": 2}
        assert [n["namespace"] for n in status["namespaces"]] == ["team-a", "team-b"]
        assert told == [("", "ml", "cdq-uid", "used + reserved memory=120Gi is above hard memory=100Gi")]
        # Each reconcile tells the team as written, so its copies follow the join.
        await until(lambda: len(published) >= 2, "the team told after both writes")
        name, team = published[-1]
        assert name == "ml" and [n["namespace"] for n in team["status"]["namespaces"]] == ["team-a", "team-b"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_team_being_recounted_gets_no_status_until_its_count_is_whole() -> None:
    api, reservations, _ = setup(make_cluster_quota("ml", memory="100Gi"))
    ledger = reservations.ledger
    ledger.defer_recounts(lambda: None)  # as `serve` (kube.recounts): run by hand here
    reservations.observe(await api.get(None, "ml"))  # type: ignore[arg-type]
    ledger.add_or_update_claim(entry("a", 60 * GiB, allocated=True))  # team-a, a member (setup)
    ledger.add_or_update_claim(entry("b", 60 * GiB, allocated=True, ns=Namespace("team-b")))
    controller = QuotaController(ledger, reservations, leading=lambda: True, debounce=0.01, min_interval=0.0)
    task = asyncio.create_task(controller.run())
    try:
        await settled(api, 1)
        controller.changed(ledger.set_namespace(Namespace("team-b"), {"team.draquota.io/name": "ml"}))
        assert ledger.recounting("ml")
        await looked(controller, controller.passes)
        assert api.writes == 1 and api.objects["ml"]["status"]["used"] == {"memory": "60Gi", "devices": 1}
        controller.changed(ledger.recount())  # what kube.recounts tells once the count is whole
        await settled(api, 2)
        assert api.objects["ml"]["status"]["used"] == {"memory": "120Gi", "devices": 2}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_team_past_the_listed_breakdown_is_logged_once_per_transition(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(quotastatus, "MAX_NAMESPACES", 1)  # 2,000 namespaces made small
    api, reservations, _ = setup(make_cluster_quota("ml", memory="1Ti"))
    ledger = reservations.ledger
    reservations.observe(await api.get(None, "ml"))  # type: ignore[arg-type]
    ledger.add_or_update_claim(entry("a", 60 * GiB, allocated=True))  # team-a, a member (setup)
    controller = QuotaController(ledger, reservations, leading=lambda: True, debounce=0.01, min_interval=0.0)
    task = asyncio.create_task(controller.run())

    def lines() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records if "member namespaces" in r.getMessage()]

    try:
        with caplog.at_level(logging.INFO, logger="controllers.quotas"):
            await settled(api, 1)
            assert lines() == []  # listed from the first write: nothing to say
            controller.changed(ledger.set_namespace(Namespace("team-b"), {"team.draquota.io/name": "ml"}))
            await settled(api, 2)
            listed = _listed(api.objects["ml"]["status"])
            assert listed["status"] == "False" and listed["reason"] == "TooManyNamespaces"
            assert lines() == [(logging.WARNING, f"ClusterDeviceQuota ml: {listed['message']}")]
            for i, ns in enumerate(["team-b", "team-a", "team-b"]):  # writes past the cap: no new line
                ledger.add_or_update_claim(entry(f"b{i}", GiB, allocated=True, ns=Namespace(ns)))
                controller.changed([(Namespace(""), "ml")])
                await settled(api, 3 + i)
            assert len(lines()) == 1
            controller.changed(ledger.set_namespace(Namespace("team-b"), {}))  # back under: told once
            await settled(api, 6)
            assert _listed(api.objects["ml"]["status"])["status"] == "True"
            assert [level for level, _ in lines()] == [logging.WARNING, logging.INFO]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _listed(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "NamespacesListed")


async def test_at_a_window_boundary_it_rewrites_the_status_and_tells_it_once() -> None:
    # The window closes at 00:20:00Z, 1200 s after the epoch; the controller's clock is at 1000 s.
    window = {"name": "burst", "hard": {"memory": "800Gi"}, "start": "1970-01-01T00:00:00Z",
              "end": "1970-01-01T00:20:00Z"}
    api, reservations, _ = setup(make_quota("gpus", memory="400Gi", windows=[window]))
    reservations.observe(await api.get(None, "gpus"))  # type: ignore[arg-type]
    clock = FakeClock(1000.0)
    told: list[tuple[str, ...]] = []
    controller = QuotaController(reservations.ledger, reservations, leading=lambda: True, debounce=0.05,
                                 min_interval=0.0, clock=clock, boundary=lambda *args: told.append(args))
    for i in range(6):  # 480Gi allocated, within the window's 800Gi
        controller.ledger.add_or_update_claim(entry(f"u{i}", 80 * GiB, allocated=True))
    task = asyncio.create_task(controller.run())
    try:
        await settled(api, 1)
        status = api.objects["gpus"]["status"]
        assert (status["activeWindow"], status["effectiveHard"]) == ("burst", {"memory": "800Gi"})
        assert controller._timers[(NS, "gpus")] == 1200.0  # it wakes at the boundary, with no event
        assert [args[3] for args in told] == ["WindowOpened"]  # the first write found it open
        clock.advance(200)
        controller._wake.set()  # the real sleep is 200 s: the timer is what is tested, not the wait
        await settled(api, 2)
        status = api.objects["gpus"]["status"]
        assert "activeWindow" not in status and status["effectiveHard"] == {"memory": "400Gi"}
        assert next(c for c in status["conditions"] if c["type"] == "Exceeded")["status"] == "True"
        assert [args[3:] for args in told[1:]] == [
            ("WindowClosed", "window 'burst' closed: hard in force memory=400Gi (spec.hard)")]
        passes = controller.passes
        controller.changed([(NS, "gpus")])
        await looked(controller, passes)
        assert len(told) == 2  # nothing changed: no second Event
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
