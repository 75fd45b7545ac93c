"""Scheduled quotas (spec.windows) on the real control plane.

- A window opening admits a claim its quota denied before; the window closing leaves the
  usage above the hard that follows (nothing is evicted), the next claim is denied naming
  the window that ended, the quota's Exceeded condition turns True, and the leader records
  one WindowOpened and one WindowClosed Event, its status showing the hard in force, the
  open window and the next change on the way.
- Two replicas under creates from four clients across a window that opens and then
  closes a few seconds later: before it opens no more than the quota's own hard is
  persisted, inside it never more than the window's, and nothing is admitted after it
  closed with usage above the quota's own hard.
- The API server refuses bad windows, naming the field.

The windows start a few seconds after the test sets them (wall clock, second precision);
the tests wait on conditions (the status, a create admitted), never on durations.
`serve --clock-skew 1`: the replicas share this machine's clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, Gpu, claim_spec, exact_request
from .harness import (
    DQ, RUN_LABEL, MakeFleet, MakeNamespace, Served, Setup, adapted_webhooks, create, create_until_decided, denial,
    installed, make_quota, review_latencies, running, wait_status,
)
from .kube import ApiError, Kube, Obj, poll

pytestmark = pytest.mark.e2e

EVENTS = "events.k8s.io/v1"
SKEW = "1"


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    """One `serve` whose windows allow for 1 s of clock skew (the default 5 s only slows the test)."""
    async for handle in running(Served(cluster, free_ports(1)[0], tmp_path / "serve.log",
                                       args=("--clock-skew", SKEW))):
        yield handle


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def ahead(seconds: int) -> datetime:
    """A whole second `seconds` from now (the status writes times to the second)."""
    return datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds)


async def boundary_events(kube: Kube, namespace: str) -> list[tuple[str, str]]:
    found = await kube.list(EVENTS, "events", namespace=namespace)
    return sorted((e["reason"], e.get("note", "")) for e in found
                  if e.get("reason") in ("WindowOpened", "WindowClosed", "HardInForceChanged"))


async def recorded(kube: Kube, namespace: str, count: int) -> list[tuple[str, str]] | None:
    """The boundary Events once at least `count` are written (the recorder writes after the status)."""
    events = await boundary_events(kube, namespace)
    return events if len(events) >= count else None


async def test_a_window_opening_admits_and_closing_denies_naming_it(kube: Kube, setup: Setup) -> None:
    ns = setup.namespace
    await make_quota(kube, setup, "gpus", "80Gi")
    start, end = ahead(15), ahead(30)
    await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"windows": [
        {"name": "burst", "hard": {"memory": "240Gi"}, "start": stamp(start), "end": stamp(end)}]}}, namespace=ns)
    status = await wait_status(kube, ns, lambda s: s.get("nextChange") == stamp(start), "the window's opening ahead")
    assert status["effectiveHard"] == {"memory": "80Gi"} and "activeWindow" not in status

    await create(kube, setup, "a")  # 80Gi of 80Gi
    before = await denial(create(kube, setup, "b"))
    assert "limited memory=80Gi" in before and "window" not in before, before

    async def admitted() -> bool:
        return not await denial(create(kube, setup, "b"))

    await poll(admitted, timeout=60, what="the claim denied before the window to be admitted in it")
    assert datetime.now(UTC) >= start  # not before the window opened
    status = await wait_status(kube, ns, lambda s: s.get("activeWindow") == "burst", "the window open in the status")
    assert status["effectiveHard"] == {"memory": "240Gi"} and status["nextChange"] == stamp(end)
    await create(kube, setup, "c")  # 240Gi of 240Gi

    # The window closes with 240Gi held of 80Gi: nothing evicted, Exceeded, denials name it.
    status = await wait_status(kube, ns, lambda s: "activeWindow" not in s and "nextChange" not in s,
                               "the window closed in the status", timeout=60)
    assert status["effectiveHard"] == {"memory": "80Gi"}
    exceeded = next(c for c in status["conditions"] if c["type"] == "Exceeded")
    named = f"(the limit in force since window 'burst' ended at {stamp(end)})"
    assert exceeded["status"] == "True" and exceeded["message"] == (
        f"used + reserved memory=240Gi is above hard memory=80Gi {named}")
    claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)
    assert sorted(c["metadata"]["name"] for c in claims) == ["a", "b", "c"]
    after = await denial(create(kube, setup, "d"))
    assert f"limited memory=80Gi {named}" in after, after

    events = await poll(lambda: recorded(kube, ns, 2), timeout=30, what="the boundaries' Events")
    assert events == [
        ("WindowClosed", "window 'burst' closed: hard in force memory=80Gi (spec.hard)"),
        ("WindowOpened", f"window 'burst' opened: hard in force memory=240Gi until {stamp(end)}"),
    ]


# -- two replicas across the boundaries -----------------------------------------------------------

OWN, WINDOW = 10, 20  # the quota's own hard and the window's, in 80Gi GPUs


async def test_two_replicas_across_a_window_never_over_commit(
        cluster: ControlPlane, kube: Kube, crd: None, clients: list[Kube], make_namespace: MakeNamespace,
        make_fleet: MakeFleet, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    fleet = await make_fleet("windows")
    await fleet.add_node("n1", [Gpu()] * 4)
    ns = await make_namespace("windows", labels={RUN_LABEL: run})
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "gpus"},
                                           "spec": {"hard": {"memory": f"{OWN * 80}Gi"}}}, namespace=ns)
    port = free_ports(1)[0]
    args = ("--reuse-port", "--clock-skew", SKEW)
    a = Served(cluster, port, tmp_path / "a.log", args=args)
    b = Served(cluster, port, tmp_path / "b.log", args=args, lease=a.lease)
    try:
        with a.log_on_failure(), b.log_on_failure():
            await a.start()
            await b.start()
            async with installed(kube, adapted_webhooks(run, port, cluster)):
                await across_the_window(kube, clients, ns, fleet.device_class)
            assert review_latencies(a.log_text()) and review_latencies(b.log_text()), "one replica answered alone"
    finally:
        await a.kill()
        await b.kill()


async def across_the_window(kube: Kube, clients: list[Kube], ns: str, device_class: str) -> None:
    """Creates from every client from before the window opens until after it closed."""
    opens, closes = ahead(12), ahead(22)
    await kube.patch(DQ, "devicequotas", "gpus", {"spec": {"windows": [
        {"name": "burst", "hard": {"memory": f"{WINDOW * 80}Gi"}, "start": stamp(opens),
         "end": stamp(closes)}]}}, namespace=ns)
    await wait_status(kube, ns, lambda s: s.get("nextChange") == stamp(opens), "the window ahead", timeout=60)

    claim = claim_spec(exact_request("gpu", device_class))
    errors: dict[str, int] = {}
    stop = closes + timedelta(seconds=5)
    counter = iter(range(100_000))

    async def load(client: Kube) -> None:
        # Creates from now until after the window closed: each decided (admitted or
        # denied for quota), failures of any other kind retried, as a controller would.
        while datetime.now(UTC) < stop:
            body = {"kind": "ResourceClaim", "metadata": {"name": f"c{next(counter)}"}, "spec": claim}
            await create_until_decided(client, ns, body, errors)
            await asyncio.sleep(0.05)  # pacing, not synchronisation

    # Four loops a client: the API server opens a connection per concurrent call beyond the
    # two it keeps idle, and the kernel hands each new one to either replica (SO_REUSEPORT).
    await asyncio.wait_for(asyncio.gather(*(load(c) for c in clients for _ in range(4))), 120)
    claims = await kube.list(RESOURCE_V1, "resourceclaims", namespace=ns)
    created = sorted(datetime.fromisoformat(c["metadata"]["creationTimestamp"]) for c in claims)
    early = [t for t in created if t < opens]  # persisted before the window opened
    late = [t for t in created if t >= closes + timedelta(seconds=1)]  # after it closed
    assert len(early) <= OWN, (len(early), errors)
    assert len(created) == WINDOW, (len(created), errors)  # filled to the window's hard, never past it
    assert late == [], (late, errors)  # 20 held of 10 after it closed: nothing more admitted
    status = await wait_status(kube, ns, lambda s: any(c["type"] == "Exceeded" and c["status"] == "True"
                                                       for c in s.get("conditions") or []),
                               "Exceeded after the window closed")
    assert status["effectiveHard"] == {"memory": f"{OWN * 80}Gi"}
    events = await poll(lambda: recorded(kube, ns, 2), timeout=30, what="the boundaries' Events")
    assert [reason for reason, _ in events] == ["WindowClosed", "WindowOpened"]  # one each, whichever replica leads


# -- the schema refuses bad windows -----------------------------------------------------------------

START, END = "2026-12-21T08:00:00+01:00", "2026-12-25T18:00:00+01:00"
BAD: list[tuple[str, Obj, list[Obj], tuple[str, ...]]] = [
    ("end before start", {"memory": "320Gi"}, [{"name": "w", "hard": {"memory": "640Gi"}, "start": END, "end": START}],
     ("spec.windows[0].end", "end must be after start")),
    # 08:00+01:00 is 07:00Z: before 07:30Z although it sorts after it as a string (the
    # schema's date-time fields are timestamps in its rules, compared as instants).
    ("end before start across offsets", {"memory": "320Gi"},
     [{"name": "w", "hard": {"memory": "640Gi"}, "start": "2026-12-21T07:30:00Z", "end": "2026-12-21T08:00:00+01:00"}],
     ("spec.windows[0].end", "end must be after start")),
    ("start without end", {"memory": "320Gi"}, [{"name": "w", "hard": {"memory": "640Gi"}, "start": START}],
     ("spec.windows[0]", "a one-off window needs both start and end")),
    ("schedule without duration", {"memory": "320Gi"}, [{"name": "w", "hard": {"memory": "640Gi"}, "schedule": "0 20 * * *"}],
     ("spec.windows[0]", "a recurring window needs both schedule and duration")),
    ("both kinds", {"memory": "320Gi"}, [{"name": "w", "hard": {"memory": "640Gi"}, "start": START, "end": END,
                                          "schedule": "0 20 * * *", "duration": "8h"}],
     ("spec.windows[0]", "a window is one-off (start, end) or recurring (schedule, duration), not both")),
    ("timeZone on a one-off", {"memory": "320Gi"},
     [{"name": "w", "hard": {"memory": "640Gi"}, "start": START, "end": END, "timeZone": "Europe/Berlin"}],
     ("spec.windows[0]", "timeZone applies to a recurring window (schedule) only")),
    ("two windows, one name", {"memory": "320Gi"},
     [{"name": "w", "hard": {"memory": "640Gi"}, "start": START, "end": END},
      {"name": "w", "hard": {"memory": "480Gi"}, "schedule": "0 20 * * *", "duration": "8h"}],
     ("spec.windows[1]", "Duplicate value")),
    ("a resource spec.hard does not limit", {"memory": "320Gi"},
     [{"name": "w", "hard": {"devices": 8}, "start": START, "end": END}],
     ("spec.windows", "a window's hard may name only resources spec.hard limits")),
    ("a malformed duration", {"memory": "320Gi"},
     [{"name": "w", "hard": {"memory": "640Gi"}, "schedule": "0 20 * * *", "duration": "8 hours"}],
     ("spec.windows[0].duration",)),
]


@pytest.mark.parametrize(("case", "hard", "windows", "named"), BAD, ids=[c[0] for c in BAD])
async def test_the_api_server_refuses_bad_windows_naming_the_field(
        kube: Kube, crd: None, namespace: str, case: str, hard: Obj, windows: list[Obj], named: tuple[str, ...]) -> None:
    body = {"kind": "DeviceQuota", "metadata": {"name": "bad"}, "spec": {"hard": hard, "windows": windows}}
    with pytest.raises(ApiError) as refused:
        await kube.create(DQ, "devicequotas", body, namespace=namespace)
    assert refused.value.status == 422, refused.value.message
    for words in named:
        assert words in refused.value.message, (case, refused.value.message)
