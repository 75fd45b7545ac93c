"""quota.quotas.cron: five-field cron expressions, checked against a minute-by-minute scan."""

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.quotas.cron import CronError, parse_cron


@pytest.mark.parametrize(("text", "at", "expected"), [
    ("0 20 * * MON-FRI", datetime(2026, 12, 4, 20, 0), datetime(2026, 12, 7, 20, 0)),  # Friday -> Monday
    ("*/15 * * * *", datetime(2026, 1, 1, 0, 14, 59), datetime(2026, 1, 1, 0, 15)),
    ("0 0 29 2 *", datetime(2026, 1, 1), datetime(2028, 2, 29)),  # leap years only
    ("30 8 1,15 * *", datetime(2026, 1, 15, 8, 30), datetime(2026, 2, 1, 8, 30)),
    # Both days restricted: either matches (Vixie). The 13th, or any Friday.
    ("0 0 13 * FRI", datetime(2026, 2, 1), datetime(2026, 2, 6)),
    # A day of month starting with `*` counts as unrestricted: both must match.
    ("0 0 */2 * FRI", datetime(2026, 2, 1), datetime(2026, 2, 13)),
    ("0 0 * * 7", datetime(2026, 12, 1), datetime(2026, 12, 6)),  # 7 is Sunday
    ("5/20 1-3/2 * jan,Dec sun", datetime(2026, 1, 1), datetime(2026, 1, 4, 1, 5)),
])
def test_next_after(text: str, at: datetime, expected: datetime) -> None:
    assert parse_cron(text).next_after(at) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("0 0 31 2 *", "never fires: no month it names has day 31"),
    ("0 0 30,31 2 *", "never fires: no month it names has day 30"),
    ("0 0 31 4,6,9,11 *", "never fires"),
    ("0 0 * *", "has 4 fields: want 5"),
    ("0 0 * * * *", "has 6 fields: want 5"),
    ("60 * * * *", "minute: 60 is out of range 0-59"),
    ("* 24 * * *", "hour: 24 is out of range 0-23"),
    ("* * 0 * *", "day of month: 0 is out of range 1-31"),
    ("* * * 13 *", "month: 13 is out of range 1-12"),
    ("* * * * 8", "day of week: 8 is out of range 0-7"),
    ("* * * * FUNDAY", "day of week: 'FUNDAY' is not a number or a name"),
    ("*/0 * * * *", "minute: step '0' in '*/0' must be a positive number"),
    ("5-1 * * * *", "minute: range '5-1' runs backwards"),
    ("x * * * *", "minute: 'x' is not a number"),
    ("@daily", "has 1 fields"),
])
def test_refused(text: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("*", r"\*")):
        parse_cron(text)


def test_both_days_restricted_fires_even_on_a_day_no_month_has() -> None:
    # Vixie: the 31st of February or any Monday: every Monday of February.
    assert parse_cron("0 0 31 2 MON").next_after(datetime(2026, 1, 1)) == datetime(2026, 2, 2)


# -- property: matching agrees with the expression's meaning -------------------------------------

_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


@st.composite
def _item(draw: st.DrawFn, low: int, high: int) -> tuple[str, set[int]]:
    kind = draw(st.sampled_from(["star", "star-step", "value", "range", "range-step"]))
    if kind == "star":
        return "*", set(range(low, high + 1))
    if kind == "star-step":
        step = draw(st.integers(1, high - low + 1))
        return f"*/{step}", set(range(low, high + 1, step))
    a = draw(st.integers(low, high))
    if kind == "value":
        return str(a), {a}
    b = draw(st.integers(a, high))
    if kind == "range":
        return f"{a}-{b}", set(range(a, b + 1))
    step = draw(st.integers(1, high - low + 1))
    return f"{a}-{b}/{step}", set(range(a, b + 1, step))


@st.composite
def _expression(draw: st.DrawFn) -> tuple[str, list[set[int]], bool, bool]:
    texts, sets = [], []
    for low, high in _FIELDS:
        items = draw(st.lists(_item(low, high), min_size=1, max_size=3))
        texts.append(",".join(text for text, _ in items))
        sets.append(set().union(*(values for _, values in items)))
    return " ".join(texts), sets, texts[2].startswith("*"), texts[4].startswith("*")


def _fires(sets: list[set[int]], day_star: bool, weekday_star: bool, at: datetime) -> bool:
    minutes, hours, days, months, weekdays = sets
    weekday = at.isoweekday() % 7
    in_week = weekday in weekdays or (weekday == 0 and 7 in weekdays)
    in_month = at.day in days
    day = (in_month and in_week) if day_star or weekday_star else (in_month or in_week)
    return at.minute in minutes and at.hour in hours and at.month in months and day


@settings(max_examples=300, deadline=None)
@given(_expression(), st.datetimes(datetime(2000, 1, 1), datetime(2099, 12, 31)))
def test_matching_agrees_with_the_expressions_meaning(expr: tuple[str, list[set[int]], bool, bool],
                                                       at: datetime) -> None:
    text, sets, day_star, weekday_star = expr
    try:
        cron = parse_cron(text)
    except CronError as err:
        assert "never fires" in str(err)
        return
    # A scan of the next two days, minute by minute: `next_after` is the first minute that fires.
    found = cron.next_after(at)
    assert found > at and _fires(sets, day_star, weekday_star, found)
    minute = at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while minute < min(found, at + timedelta(days=2)):
        assert not cron.matches(minute) and not _fires(sets, day_star, weekday_star, minute), minute
        minute += timedelta(minutes=1)
    assert cron.matches(found)
