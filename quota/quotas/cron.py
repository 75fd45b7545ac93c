"""Five-field cron expressions (minute hour day-of-month month day-of-week), on wall-clock time.

Neighbours: `quota.quotas.windows` opens a recurring window at each time a `Cron` matches, in the
window's time zone. Vixie cron's syntax and semantics, written here rather than taken as a
dependency: `*`, numbers, ranges `a-b`, steps `*/s`, `a-b/s` and `a/s` (`a` to the field's
last value), lists joined by `,`, names JAN-DEC and SUN-SAT (any case), 7 as Sunday. When
both day-of-month and day-of-week are restricted a day matches when either does; a field
that starts with `*` (`*/2` too) counts as unrestricted, as in Vixie cron and Kubernetes
CronJobs. Pure: naive wall-clock datetimes in and out, no time zones here.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import date, datetime, timedelta

__all__ = ["Cron", "CronError", "parse_cron"]

_MONTHS = {name.upper(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
# (name, low, high, names) of each field, in order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
# The longest run of days without a match of an expression that fires at all: February 29th
# on one weekday recurs within 40 years (the 400-year Gregorian cycle bounds it).
_HORIZON_DAYS = 401 * 366
_MAX_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February 29th exists in leap years


class CronError(ValueError):
    """An expression this module cannot read, or one that never fires; the message says which part."""


@dataclass(frozen=True, slots=True)
class Cron:
    text: str
    minutes: tuple[int, ...]  # sorted
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool  # day of month starts with `*`
    weekday_star: bool

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = day.isoweekday() % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            return in_month and in_week
        return in_month or in_week

    def matches(self, at: datetime) -> bool:
        """Whether it fires at this wall-clock minute (seconds ignored)."""
        return self.matches_day(at.date()) and at.hour in self.hours and at.minute in self.minutes

    def next_after(self, at: datetime) -> datetime:
        """The first wall-clock minute strictly after `at` at which it fires."""
        start = at.replace(second=0, microsecond=0) + timedelta(minutes=1)
        day, hour, minute = start.date(), start.hour, start.minute
        for _ in range(_HORIZON_DAYS):
            if self.matches_day(day):
                found = self._first_time(hour, minute)
                if found is not None:
                    return datetime(day.year, day.month, day.day, found[0], found[1])
            day, hour, minute = day + timedelta(days=1), 0, 0
        raise CronError(f"{self.text!r} does not fire within 400 years")  # parse_cron refuses these

    def _first_time(self, hour: int, minute: int) -> tuple[int, int] | None:
        for h in self.hours:
            if h < hour:
                continue
            for m in self.minutes:
                if h > hour or m >= minute:
                    return h, m
        return None


def parse_cron(text: str) -> Cron:
    """A `Cron`; CronError names the field that is wrong, or says that it never fires."""
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"{text!r} has {len(parts)} fields: want 5 (minute hour day-of-month month day-of-week)")
    values = [_field(part, *spec) for part, spec in zip(parts, _FIELDS)]
    cron = Cron(
        text=text,
        minutes=tuple(sorted(values[0])),
        hours=tuple(sorted(values[1])),
        days=frozenset(values[2]),
        months=frozenset(values[3]),
        weekdays=frozenset(d % 7 for d in values[4]),
        day_star=parts[2].startswith("*"),
        weekday_star=parts[4].startswith("*"),
    )
    # Only a day of month that no listed month has can make it never fire: every date
    # falls on every weekday in some year, and a restricted weekday otherwise widens it.
    if (cron.day_star or cron.weekday_star) and not any(
        d <= _MAX_DAYS[m - 1] for m in cron.months for d in cron.days
    ):
        raise CronError(f"{text!r} never fires: no month it names has day {min(cron.days)}")
    return cron


def _field(part: str, name: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    out: set[int] = set()
    for item in part.split(","):
        out.update(_item(item, name, low, high, names))
    return out


def _item(item: str, name: str, low: int, high: int, names: dict[str, int]) -> range:
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
            raise CronError(f"{name}: step {step_text!r} in {item!r} must be a positive number")
        step = int(step_text)
    if body == "*":
        first, last = low, high
    else:
        first_text, dash, last_text = body.partition("-")
        first = _value(first_text, name, low, high, names)
        # `a/s` runs from `a` to the field's end, as robfig/cron (Kubernetes CronJobs) reads it.
        last = _value(last_text, name, low, high, names) if dash else (high if slash else first)
        if last < first:
            raise CronError(f"{name}: range {item!r} runs backwards")
    return range(first, last + 1, step)


def _value(text: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    if text.upper() in names:
        return names[text.upper()]
    if not (text.isascii() and text.isdigit()):
        raise CronError(f"{name}: {text!r} is not a number" + (" or a name" if names else ""))
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{name}: {value} is out of range {low}-{high}")
    return value
