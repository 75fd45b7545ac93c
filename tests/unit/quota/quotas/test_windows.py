"""quota.quotas.windows: which hard is in force when, parsing `spec.windows`, and the boundary rule for replicas."""

from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.quotas import windows as rules
from quota.quotas.devicequota import DeviceQuota, QuotaError, parse_device_quota
from quota.quotas.windows import Window, admission_change_after, effective, effective_for_admission, hard_note
from quota.values.model import Limits

from ...builders import GiB, make_quota

DEADLINE = {"name": "deadline", "hard": {"memory": "640Gi"},
            "start": "2026-12-21T08:00:00+01:00", "end": "2026-12-25T18:00:00+01:00"}
NIGHTS = {"name": "nights", "hard": {"devices": 8}, "schedule": "0 20 * * MON-FRI", "duration": "10h",
          "timeZone": "Europe/Berlin"}


def quota(*windows: dict[str, Any], memory: str | None = "320Gi", devices: int | None = 4) -> DeviceQuota:
    return parse_device_quota(make_quota("q", memory=memory, devices=devices, windows=list(windows)))


def state(q: DeviceQuota, at: datetime) -> tuple[Limits, str | None]:
    now = effective(q.hard, q.windows, at)
    return now.hard, now.window


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


@pytest.mark.parametrize(("at", "hard", "window", "next_change"), [
    ("2026-12-21T06:59:59Z", Limits(320 * GiB, 4), None, "2026-12-21T07:00:00Z"),
    ("2026-12-21T07:00:00Z", Limits(640 * GiB, 4), "deadline", "2026-12-25T17:00:00Z"),
    # Both open: the window listed first wins, whole (its devices are the quota's).
    ("2026-12-22T20:00:00Z", Limits(640 * GiB, 4), "deadline", "2026-12-25T17:00:00Z"),
    ("2026-12-25T17:00:00Z", Limits(320 * GiB, 4), None, "2026-12-25T19:00:00Z"),  # Friday 20:00 CET
    ("2026-12-26T05:00:00Z", Limits(320 * GiB, 4), None, "2026-12-28T19:00:00Z"),  # no Saturday night
    ("2026-12-28T19:00:00Z", Limits(320 * GiB, 8), "nights", "2026-12-29T05:00:00Z"),  # 20:00 CET
    ("2027-07-05T18:00:00Z", Limits(320 * GiB, 8), "nights", "2027-07-06T04:00:00Z"),  # 20:00 CEST
])
def test_effective(at: str, hard: Limits, window: str | None, next_change: str) -> None:
    q = quota(DEADLINE, NIGHTS)
    result = effective(q.hard, q.windows, utc(at))
    assert (result.hard, result.window, result.next_change) == (hard, window, utc(next_change))


def test_a_start_the_spring_forward_skips_opens_the_window_at_the_jump() -> None:
    # Europe/Berlin skips 02:00-03:00 on 2027-03-28 (01:00Z): 02:30 opens at 03:00 CEST.
    q = quota({"name": "maint", "hard": {"devices": 0}, "schedule": "30 2 * * *", "duration": "1h",
               "timeZone": "Europe/Berlin"})
    before = effective(q.hard, q.windows, utc("2027-03-28T00:59:59Z"))
    assert (before.window, before.next_change) == (None, utc("2027-03-28T01:00:00Z"))
    assert effective(q.hard, q.windows, utc("2027-03-28T01:00:00Z")).next_change == utc("2027-03-28T02:00:00Z")


def test_a_start_the_fall_back_repeats_opens_the_window_once() -> None:
    # 02:30 happens twice in Europe/Berlin on 2026-10-25: at 00:30Z (CEST) and 01:30Z (CET).
    q = quota({"name": "maint", "hard": {"devices": 0}, "schedule": "30 2 * * *", "duration": "30m",
               "timeZone": "Europe/Berlin"})
    first = effective(q.hard, q.windows, utc("2026-10-25T00:30:00Z"))
    assert (first.window, first.next_change) == ("maint", utc("2026-10-25T01:00:00Z"))
    assert effective(q.hard, q.windows, utc("2026-10-25T01:30:00Z")).window is None


def test_no_windows_no_change() -> None:
    q = quota()
    assert effective(q.hard, q.windows, utc("2026-01-01T00:00:00Z")).next_change is None


def test_admission_takes_the_smallest_hard_within_the_skew() -> None:
    q = quota(DEADLINE, NIGHTS)
    skew = timedelta(seconds=5)
    # An increase is used `skew` late, a decrease `skew` early.
    assert effective_for_admission(q.hard, q.windows, utc("2026-12-21T07:00:02Z"), skew) == Limits(320 * GiB, 4)
    assert effective_for_admission(q.hard, q.windows, utc("2026-12-21T07:00:06Z"), skew) == Limits(640 * GiB, 4)
    assert effective_for_admission(q.hard, q.windows, utc("2026-12-25T16:59:56Z"), skew) == Limits(320 * GiB, 4)
    assert effective_for_admission(q.hard, q.windows, utc("2026-12-25T16:59:54Z"), skew) == Limits(640 * GiB, 4)


def test_a_window_and_the_next_keep_the_smallest_per_resource() -> None:
    # Two windows meeting at an instant, one lowering memory, the next devices: both low within the skew.
    q = quota({"name": "a", "hard": {"memory": "100Gi", "devices": 9}, "start": "2026-01-01T00:00:00Z",
               "end": "2026-01-01T01:00:00Z"},
              {"name": "b", "hard": {"memory": "900Gi", "devices": 1}, "start": "2026-01-01T01:00:00Z",
               "end": "2026-01-01T02:00:00Z"})
    at = utc("2026-01-01T01:00:00Z")
    assert effective_for_admission(q.hard, q.windows, at, timedelta(seconds=5)) == Limits(100 * GiB, 1)


@pytest.mark.parametrize(("window", "message"), [
    ({**DEADLINE, "end": "2026-12-20T08:00:00+01:00"},
     r"spec.windows\[0\].end \(2026-12-20T08:00:00\+01:00\) must be after its start"),
    ({**DEADLINE, "start": "2026-12-21"}, r"spec.windows\[0\].start must be an RFC 3339 date-time with an offset"),
    ({**DEADLINE, "start": "2026-12-21T08:00:00"}, r"spec.windows\[0\].start must be an RFC 3339 date-time"),
    ({**NIGHTS, "schedule": "0 0 31 2 *"}, r"spec.windows\[0\].schedule: '0 0 31 2 \*' never fires"),
    ({**NIGHTS, "schedule": "0 25 * * *"}, r"spec.windows\[0\].schedule: hour: 25 is out of range 0-23"),
    ({**NIGHTS, "timeZone": "Europe/Gotham"}, r"spec.windows\[0\].timeZone: unknown time zone 'Europe/Gotham'"),
    ({**NIGHTS, "timeZone": "Europe/Nowhere/UTC"}, r"spec.windows\[0\].timeZone: unknown time zone"),
    # A path out of the zone database (built here: the docs' test refuses such paths in files).
    ({**NIGHTS, "timeZone": "/".join(("..", "..", "etc", "hostname"))}, r"spec.windows\[0\].timeZone: unknown time zone"),
    ({**NIGHTS, "duration": "8 hours"}, r"spec.windows\[0\].duration must be a duration such as 8h"),
    ({**NIGHTS, "duration": "0s"}, r"spec.windows\[0\].duration must be between 1m and 744h"),
    ({**NIGHTS, "duration": "745h"}, r"spec.windows\[0\].duration must be between 1m and 744h"),
    ({**NIGHTS, "start": DEADLINE["start"]}, r"spec.windows\[0\]: a window is one-off .* not both"),
    ({"name": "x", "hard": {"devices": 1}, "start": DEADLINE["start"]}, r"spec.windows\[0\].end is required"),
    ({"name": "x", "hard": {"devices": 1}, "schedule": "* * * * *"}, r"schedule and duration \(recurring\)"),
    ({**NIGHTS, "hard": {"gpus": 1}}, r"spec.windows\[0\].hard: unsupported resource\(s\) 'gpus'"),
    ({**NIGHTS, "hard": {}}, r"spec.windows\[0\].hard must be a map with memory or devices"),
    ({**NIGHTS, "hard": {"memory": "-1Gi"}}, r"spec.windows\[0\].hard.memory"),
    ({**NIGHTS, "name": "Nights"}, r"spec.windows\[0\].name must be a lowercase RFC 1123 label"),
])
def test_bad_windows_are_refused_naming_the_field(window: dict[str, Any], message: str) -> None:
    with pytest.raises(QuotaError, match=message):
        quota(window)


def test_a_window_may_change_only_limits_the_quota_has() -> None:
    with pytest.raises(QuotaError, match=r"spec.windows\[0\].hard.memory: the quota's spec.hard does not limit memory"):
        quota(DEADLINE, memory=None)


def test_window_names_are_unique() -> None:
    with pytest.raises(QuotaError, match=r"spec.windows\[1\].name: 'nights' names another window too"):
        quota(NIGHTS, NIGHTS)


# -- properties -------------------------------------------------------------------------------

_ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
_SCHEDULES = ["0 20 * * MON-FRI", "30 2 * * *", "*/45 * * * *", "0 0 1 * *", "15 1,13 * * SAT,SUN", "0 */6 * * *"]
_BASE = datetime(2026, 1, 1, tzinfo=UTC)


@st.composite
def _windows(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index in range(draw(st.integers(0, 4))):
        hard = {"memory": f"{draw(st.integers(0, 900))}Gi"} if draw(st.booleans()) else {"devices": draw(st.integers(0, 9))}
        if draw(st.booleans()):
            start = _BASE + timedelta(minutes=draw(st.integers(0, 60 * 24 * 60)))
            end = start + timedelta(minutes=draw(st.integers(1, 60 * 24 * 10)))
            out.append({"name": f"w{index}", "hard": hard, "start": start.isoformat(), "end": end.isoformat()})
        else:
            out.append({"name": f"w{index}", "hard": hard, "schedule": draw(st.sampled_from(_SCHEDULES)),
                        "duration": f"{draw(st.integers(1, 60 * 30))}m", "timeZone": draw(st.sampled_from(_ZONES))})
    return out


_AT = st.integers(0, 60 * 60 * 24 * 90).map(lambda s: _BASE + timedelta(seconds=s))


@settings(max_examples=60, deadline=None)
@given(_windows(), _AT, st.lists(st.integers(0, 999), max_size=5))
def test_effective_is_constant_until_the_next_change(windows: list[dict[str, Any]], at: datetime,
                                                     thousandths: list[int]) -> None:
    q = quota(*windows)
    now = effective(q.hard, q.windows, at)
    if now.next_change is None:
        return
    assert now.next_change > at
    for part in thousandths:
        between = at + (now.next_change - at) * part // 1000
        assert state(q, between) == state(q, at)
    assert state(q, now.next_change) != state(q, at)


@settings(max_examples=60, deadline=None)
@given(_windows(), _AT, st.integers(0, 3600), st.integers(-3600, 3600))
def test_admission_never_uses_more_than_is_in_force(windows: list[dict[str, Any]], start: datetime, skew: int,
                                                    offset: int) -> None:
    q = quota(*windows)
    # Near a change, where the rule matters: `offset` seconds from the first one after `start`.
    change = effective(q.hard, q.windows, start).next_change
    at = start if change is None else change + timedelta(seconds=offset)
    conservative = effective_for_admission(q.hard, q.windows, at, timedelta(seconds=skew))
    # In force at `at` and at the interval's ends, and exactly `at`'s with no skew.
    for point in (at, at - timedelta(seconds=skew), at + timedelta(seconds=skew)):
        hard = effective(q.hard, q.windows, point).hard
        for resource in ("memory", "devices"):
            assert (conservative.get(resource) or 0) <= (hard.get(resource) or 0)
    assert effective_for_admission(q.hard, q.windows, at, timedelta(0)) == effective(q.hard, q.windows, at).hard


@settings(max_examples=60, deadline=None)
@given(_windows(), _AT, st.integers(0, 3600), st.integers(-3600, 3600), st.lists(st.integers(0, 999), max_size=4))
def test_the_admission_hard_is_constant_until_its_next_change(windows: list[dict[str, Any]], start: datetime,
                                                             skew: int, offset: int, thousandths: list[int]) -> None:
    q = quota(*windows)
    change = effective(q.hard, q.windows, start).next_change
    at = start if change is None else change + timedelta(seconds=offset)
    width = timedelta(seconds=skew)
    now = effective_for_admission(q.hard, q.windows, at, width)
    later = admission_change_after(q.hard, q.windows, at, width)
    if later is None:
        return
    assert later > at
    for part in thousandths:
        assert effective_for_admission(q.hard, q.windows, at + (later - at) * part // 1000, width) == now
    if effective_for_admission(q.hard, q.windows, later, width) == now:
        # Not a change: only where the walk's work budget ran out, which a larger one passes.
        with mock.patch.object(rules, "_BUDGET", rules._BUDGET * 64):
            further = admission_change_after(q.hard, q.windows, at, width)
        assert further is None or further > later


def test_schedules_with_a_boundary_every_minute_cost_a_bounded_walk() -> None:
    # 16 windows open all the time (each minute's start chains onto the last): a boundary
    # every minute that changes nothing, to the horizon. Each answer looks at windows at
    # most the budget's number of times (the walk once took 16 x 4,096 steps a call).
    q = quota(*({"name": f"w{i}", "hard": {"devices": 8}, "schedule": "* * * * *", "duration": "1m"}
                for i in range(16)))
    at, skew = utc("2026-12-22T12:00:30Z"), timedelta(seconds=5)
    looks = 0
    real = Window.boundaries_after

    def counted(self: Window, after: datetime) -> list[datetime]:
        nonlocal looks
        looks += 1
        return real(self, after)

    with mock.patch.object(Window, "boundaries_after", counted):
        for answer in (lambda: effective(q.hard, q.windows, at),
                       lambda: admission_change_after(q.hard, q.windows, at, skew),
                       lambda: hard_note(q.hard, q.windows, at)):
            looks = 0
            answer()
            assert looks <= rules._BUDGET, looks
    # What they answer: the window's hard, nothing changing in the hour the walk covers,
    # and a replica looks again no later than that.
    assert effective(q.hard, q.windows, at).hard == Limits(memory=q.hard.memory, devices=8)
    again = admission_change_after(q.hard, q.windows, at, skew)
    assert again is not None and at + timedelta(hours=1) <= again < at + timedelta(days=1)


def test_the_admission_hard_changes_a_skew_early_down_and_a_skew_late_up() -> None:
    q = quota(DEADLINE)
    skew = timedelta(seconds=5)
    assert admission_change_after(q.hard, q.windows, utc("2026-12-21T00:00:00Z"), skew) == utc("2026-12-21T07:00:05Z")
    assert admission_change_after(q.hard, q.windows, utc("2026-12-22T00:00:00Z"), skew) == utc("2026-12-25T16:59:55Z")
    assert admission_change_after(q.hard, q.windows, utc("2026-12-26T00:00:00Z"), skew) is None


def test_zone_is_kept() -> None:
    assert quota(NIGHTS).windows[0].zone == ZoneInfo("Europe/Berlin")


def test_the_note_names_the_window_in_force_or_the_one_that_ended_within_a_day() -> None:
    q = quota({"name": "deadline", "hard": {"memory": "640Gi"}, "start": "2026-12-21T07:00:00Z",
               "end": "2026-12-25T17:00:00Z"})
    assert hard_note(q.hard, q.windows, utc("2026-12-22T00:00:00Z")) == "the limit in force during window 'deadline'"
    ended = "the limit in force since window 'deadline' ended at 2026-12-25T17:00:00Z"
    for after in ("17:00:00", "17:05:00", "20:00:00"):  # each of the look-backs, nearest first
        assert hard_note(q.hard, q.windows, utc(f"2026-12-25T{after}Z")) == ended
    assert hard_note(q.hard, q.windows, utc("2026-12-26T16:59:59Z")) == ended
    assert hard_note(q.hard, q.windows, utc("2026-12-27T00:00:00Z")) == ""  # old news
    assert hard_note(q.hard, q.windows, utc("2026-12-20T00:00:00Z")) == ""  # not yet open


def test_the_note_of_a_schedule_that_flaps_every_minute_names_the_last_one() -> None:
    q = quota(*({"name": f"w{i}", "hard": {"devices": 8 + i}, "schedule": f"{i}-59/16 * * * *", "duration": "1m"}
                for i in range(15)))
    # w14 opens at :14 and :30; from :15 to :16 none is open: the last to close is named.
    assert hard_note(q.hard, q.windows, utc("2026-12-22T12:15:30Z")) == (
        "the limit in force since window 'w14' ended at 2026-12-22T12:15:00Z")
