"""kube.quotawriter with quotas that have windows: persisted admissions check the hard in force."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from quota.values.model import Charge

from ..builders import make_quota
from .test_quotawriter import leased

ONE = Charge(0, 1)
START, END = "2026-12-21T07:00:00+00:00", "2026-12-25T17:00:00+00:00"
# 1 device, 3 during the window, 0 for an hour each night at 02:00 UTC.
QUOTA = make_quota("gpus", devices=1, windows=[
    {"name": "burst", "hard": {"devices": 3}, "start": START, "end": END},
    {"name": "maint", "hard": {"devices": 0}, "schedule": "0 2 * * *", "duration": "1h"},
])


def at(text: str, seconds: float = 0.0) -> float:
    return datetime.fromisoformat(text).timestamp() + seconds


async def admitted(now: float, *, skew: float = 5.0, quota: dict[str, Any] = QUOTA, count: int = 5) -> list[bool]:
    clock = [now]
    api, reservations, (parsed,) = leased(quota, now=clock)
    reservations.ledger.clock, reservations.ledger.clock_skew = lambda: clock[0], skew
    decisions = [await reservations.admit({parsed: ONE}, uid=f"u{i}", claim=f"team-a/c{i}") for i in range(count)]
    await reservations.close()
    # With windows every admission is its own entry: no lease was sized on a hard a boundary may lower.
    assert not any(uid.startswith("lease.") for uid in api.objects["gpus"].get("status", {}).get("reservations", {}))
    return [d.allowed for d in decisions]


@pytest.mark.parametrize(("now", "expected"), [
    (at(START, -60), 1),
    (at(START, 60), 3),
    (at(START, 2), 1),  # an increase: used only once the skew has passed
    (at(START, 6), 3),
    (at(END, -2), 1),  # a decrease: used a skew early
    (at(END, -6), 3),
    (at("2026-12-28T02:30:00+00:00"), 0),
])
async def test_admissions_check_the_hard_in_force_allowing_for_the_skew(now: float, expected: int) -> None:
    assert await admitted(now) == [True] * expected + [False] * (5 - expected)


async def test_the_denial_names_the_hard_in_force() -> None:
    clock = [at(END, -30)]
    _, reservations, (quota,) = leased(QUOTA, now=clock)
    reservations.ledger.clock, reservations.ledger.clock_skew = lambda: clock[0], 5.0
    for i in range(3):
        assert (await reservations.admit({quota: ONE}, uid=f"u{i}", claim=f"team-a/c{i}")).allowed
    denied = await reservations.admit({quota: ONE}, uid="u3", claim="team-a/c3")
    assert "limited devices=3" in denied.message
    # The window closes (within the skew): the next claim is denied against the quota's own
    # hard, the three admitted keep their entries (the reservation TTL is 60 s).
    clock[0] = at(END, -2)
    denied = await reservations.admit({quota: ONE}, uid="u4", claim="team-a/c4")
    assert not denied.allowed and "reserved devices=3, limited devices=1" in denied.message
    await reservations.close()


async def test_without_a_clock_the_quotas_own_hard_applies() -> None:
    clock = [at(START, 60)]
    _, reservations, (quota,) = leased(QUOTA, now=clock)
    decisions = [await reservations.admit({quota: ONE}, uid=f"u{i}", claim=f"team-a/c{i}") for i in range(2)]
    assert [d.allowed for d in decisions] == [True, False]
    await reservations.close()


async def test_a_quota_with_windows_takes_no_lease_however_far_from_hard() -> None:
    far = make_quota("gpus", devices=100, windows=[{"name": "later", "hard": {"devices": 1},
                                                    "start": "2030-01-01T00:00:00Z", "end": "2030-01-02T00:00:00Z"}])
    api, reservations, (quota,) = leased(far, now=[1_000.0])
    for i in range(3):
        assert (await reservations.admit({quota: ONE}, uid=f"u{i}", claim=f"team-a/c{i}")).allowed
    assert api.writes == 3 and sorted(api.objects["gpus"]["status"]["reservations"]) == ["u0", "u1", "u2"]
    await reservations.close()


async def test_a_kueue_workload_is_checked_against_the_hard_in_force() -> None:
    # The AdmissionCheck's decision (`controllers.kueue`) goes through the same persisted admit.
    clock = [at(START, 60)]
    _, reservations, (quota,) = leased(QUOTA, now=clock)
    reservations.ledger.clock, reservations.ledger.clock_skew = lambda: clock[0], 5.0
    decisions = [await reservations.admit({quota: ONE}, uid=f"w{i}", claim=f"team-a/job-{i}", source="Workload")
                 for i in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert "limited devices=3 (the limit in force during window 'burst')" in decisions[-1].message
    await reservations.close()
