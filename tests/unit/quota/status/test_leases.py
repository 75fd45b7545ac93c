"""quota.status.leases: who may take a Lease when, and what each write says (client-go's rules)."""

from __future__ import annotations

import pytest

from quota.status.leases import (LeaseRecord, Observed, Timing, acquired, may_acquire, micro_time, observe, parse_lease,
                          released)

ME, OTHER = "dra-quota-0", "dra-quota-1"
WALL = 1_800_000_000.25  # 2027-01-15T08:00:00.25Z


def lease(holder: str | None = OTHER, *, renew: str = "2027-01-15T08:00:00.000000Z", duration: int = 15,
          transitions: int = 3, rv: str = "7") -> dict[str, object]:
    return {"metadata": {"name": "dra-quota-controller", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": renew,
                     "acquireTime": "2027-01-15T07:00:00.000000Z", "leaseTransitions": transitions}}


def test_parse_reads_the_spec_and_tolerates_missing_fields() -> None:
    assert parse_lease(lease()) == LeaseRecord(OTHER, 15, "2027-01-15T07:00:00.000000Z",
                                               "2027-01-15T08:00:00.000000Z", 3, "7")
    assert parse_lease({"metadata": {}, "spec": {"leaseDurationSeconds": -4, "leaseTransitions": True}}) == \
        LeaseRecord("", 0, "", "", 0, "")
    assert parse_lease({}) == LeaseRecord("", 0, "", "", 0, "")


@pytest.mark.parametrize(("holder", "seen_for", "allowed"), [
    (OTHER, 0.0, False),
    (OTHER, 14.9, False),
    (OTHER, 15.0, True),  # unchanged for a whole lease duration on our own clock
    ("", 0.0, True),  # released on shutdown: take it at once
    (None, 0.0, True),
    (ME, 0.0, True),  # our own lease from before a restart: no need to wait it out
])
def test_may_acquire(holder: str | None, seen_for: float, allowed: bool) -> None:
    observed = Observed(parse_lease(lease(holder)), since=100.0)
    assert may_acquire(observed, ME, 100.0 + seen_for) is allowed


def test_the_clock_runs_from_the_first_sight_of_a_record_and_restarts_on_each_renewal() -> None:
    first = observe(None, parse_lease(lease(rv="7")), 100.0)
    # A write that renews nothing (another resourceVersion, same renewTime) extends nothing.
    same = observe(first, parse_lease(lease(rv="8")), 110.0)
    assert same.since == 100.0 and may_acquire(same, ME, 115.0)
    renewed = observe(same, parse_lease(lease(renew="2027-01-15T08:00:02.000000Z", rv="9")), 112.0)
    assert renewed.since == 112.0 and not may_acquire(renewed, ME, 115.0)
    # Another holder is another record even with the same renewTime.
    assert observe(renewed, parse_lease(lease(ME, renew="2027-01-15T08:00:02.000000Z")), 113.0).since == 113.0


def test_micro_time_is_utc_with_microseconds() -> None:
    assert micro_time(WALL) == "2027-01-15T08:00:00.250000Z"


def test_acquire_renew_and_release_specs() -> None:
    # Taking over from another holder: a transition, fresh acquireTime.
    taken = acquired(parse_lease(lease()), ME, wall=WALL, duration=15.0)
    assert taken == {"holderIdentity": ME, "leaseDurationSeconds": 15, "acquireTime": "2027-01-15T08:00:00.250000Z",
                     "renewTime": "2027-01-15T08:00:00.250000Z", "leaseTransitions": 4}
    # Renewing our own: acquireTime and the count kept, renewTime moves.
    renewed = acquired(parse_lease(lease(ME)), ME, wall=WALL + 2, duration=15.0)
    assert (renewed["acquireTime"], renewed["renewTime"], renewed["leaseTransitions"]) == \
        ("2027-01-15T07:00:00.000000Z", "2027-01-15T08:00:02.250000Z", 3)
    # A new Lease; a fractional duration rounds up (never shorter than asked).
    assert acquired(None, ME, wall=WALL, duration=2.5)["leaseDurationSeconds"] == 3
    assert acquired(None, ME, wall=WALL, duration=2.5)["leaseTransitions"] == 0
    # Released: no holder, so the next candidate's may_acquire is true at once.
    spec = released(parse_lease(lease(ME)), wall=WALL)
    assert spec["holderIdentity"] is None and spec["leaseTransitions"] == 3 and spec["leaseDurationSeconds"] == 1
    assert may_acquire(Observed(parse_lease({"spec": spec}), 100.0), OTHER, 100.0)


@pytest.mark.parametrize(("timing", "problem"), [
    (Timing(), None),
    (Timing(15, 15, 2), "longer than the renew deadline"),
    (Timing(15, 10, 9), "1.2 x the retry period"),
    (Timing(0, 10, 2), "positive"),
])
def test_timing_problems(timing: Timing, problem: str | None) -> None:
    found = timing.problem()
    assert found is None if problem is None else (found is not None and problem in found)
