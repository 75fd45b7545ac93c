"""quota.accounting.ledger with quotas that have windows: admit and allocate check the hard in force by the ledger's clock."""

from datetime import datetime

from quota.accounting.ledger import Ledger

from ...builders import GiB, make_quota
from .test_ledger import entry, ledger

WINDOWED = make_quota("q", memory="100Gi", windows=[
    {"name": "burst", "hard": {"memory": "200Gi"}, "start": "2026-12-21T07:00:00Z", "end": "2026-12-25T17:00:00Z"}])


def clocked(now: str, skew: float = 5.0) -> tuple[Ledger, list[float]]:
    led = ledger(WINDOWED)
    clock = [datetime.fromisoformat(now).timestamp()]
    led.clock, led.clock_skew = lambda: clock[0], skew
    return led, clock


def test_admit_checks_the_hard_in_force() -> None:
    led, _ = clocked("2026-12-22T00:00:00+00:00")
    assert led.admit(entry("a", 150 * GiB)).allowed
    denied = led.admit(entry("b", 60 * GiB))
    assert not denied.allowed and "limited memory=200Gi" in denied.message


def test_the_hard_follows_the_clock_past_a_boundary() -> None:
    led, clock = clocked("2026-12-25T16:59:00+00:00")
    assert led.admit(entry("a", 60 * GiB)).allowed
    assert led.admit(entry("b", 60 * GiB)).allowed  # 120Gi of 200Gi
    clock[0] += 57  # 16:59:57: within the skew of the end, the quota's own 100Gi
    denied = led.admit(entry("c", 1 * GiB))
    assert not denied.allowed and "limited memory=100Gi" in denied.message


def test_allocate_checks_the_excess_against_the_hard_in_force() -> None:
    led, _ = clocked("2026-12-22T00:00:00+00:00")
    assert led.admit(entry("a", 90 * GiB)).allowed
    assert led.allocate(entry("a", 150 * GiB, allocated=True), enforce=True).allowed


def test_without_a_clock_spec_hard() -> None:
    led = ledger(WINDOWED)
    assert not led.admit(entry("a", 150 * GiB)).allowed


def test_a_denial_after_a_window_ended_names_it() -> None:
    led, clock = clocked("2026-12-25T16:00:00+00:00")
    assert led.admit(entry("a", 150 * GiB)).allowed  # in the window: 150Gi of 200Gi
    clock[0] += 3600  # 17:00, the window ended: 150Gi held of 100Gi, nothing evicted
    denied = led.admit(entry("b", 1 * GiB))
    assert not denied.allowed
    assert ("limited memory=100Gi (the limit in force since window 'burst' ended at 2026-12-25T17:00:00Z)"
            in denied.message)


def test_a_denial_in_a_window_names_it() -> None:
    led, _ = clocked("2026-12-22T00:00:00+00:00")
    denied = led.admit(entry("a", 250 * GiB))
    assert not denied.allowed and "limited memory=200Gi (the limit in force during window 'burst')" in denied.message


def test_a_denial_long_after_a_window_names_none() -> None:
    led, _ = clocked("2027-01-05T00:00:00+00:00")
    denied = led.admit(entry("a", 150 * GiB))
    assert not denied.allowed and "limited memory=100Gi" in denied.message and "window" not in denied.message


def test_a_request_over_a_lowering_window_alone_is_told_to_wait_for_its_end() -> None:
    led = ledger(make_quota("q", memory="100Gi", windows=[
        {"name": "day", "hard": {"memory": "40Gi"}, "start": "2026-12-21T07:00:00Z", "end": "2026-12-25T17:00:00Z"}]))
    led.clock, led.clock_skew = lambda: datetime.fromisoformat("2026-12-22T00:00:00+00:00").timestamp(), 5.0
    denied = led.admit(entry("a", 60 * GiB))  # within the quota's own 100Gi, over the window's 40Gi
    assert not denied.allowed and "retry once the window ends" in denied.message, denied.message
    too_big = led.admit(entry("b", 120 * GiB))  # over both: waiting does not help
    assert not too_big.allowed and "make the request smaller" in too_big.message
    assert "retry once the window ends" not in too_big.message
