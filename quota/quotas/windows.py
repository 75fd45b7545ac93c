"""A quota's windows: other `hard`s in force for a while, once (`start`, `end`) or on a schedule.

Neighbours: `quota.quotas.devicequota` parses `spec.windows` with `parse_windows` and keeps them on
the `DeviceQuota`; `quota.reports.check` (`check --at`) asks `effective`; `quota.accounting.ledger.Ledger.in_force`
(the ledger's checks and `kube.statuswriter`'s persisted ones in `serve`) asks
`effective_for_admission`, and `admission_change_after` for how long its answer holds.
Pure: the clock is an argument.

Rules (docs/scheduled-quotas.md says them to operators):
- A window's `hard` replaces the quota's `hard` for the resources it names; the others keep
  the quota's. It may name only resources the quota's `hard` limits.
- Where windows overlap the one listed first wins, whole: the effective `hard` is the
  quota's with that one window's `hard` over it, and that window is the active one.
- A one-off window is in force over [start, end). A recurring one opens at each minute its
  cron schedule matches on the wall clock of its time zone and stays open for `duration` of
  elapsed time; starts whose intervals touch or overlap form one open stretch.
- DST: a start that falls in the hour a spring-forward skips opens the window at the jump
  (02:30 in Europe/Berlin on the last Sunday of March opens it at 03:00 CEST); a start in the
  hour a fall-back repeats opens it at the first of the two (PEP 495's fold=0).
- Replicas whose clocks differ by up to `skew` admit against `effective_for_admission`: per
  resource the smallest `hard` in force anywhere in [at - skew, at + skew]. Around a decrease
  every replica already uses the smaller one; around an increase none uses the larger early.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from quota.quotas.cron import Cron, CronError, parse_cron
from quota.values.goduration import parse_go_duration
from quota.values.model import Limits
from quota.values.raw import show

__all__ = ["MAX_WINDOWS", "MAX_DURATION", "Effective", "Window", "admission_change_after", "effective",
           "effective_for_admission", "hard_at", "hard_note", "last_change", "parse_windows", "parse_time",
           "utc_stamp"]

MAX_WINDOWS = 16  # the CRD's maxItems: each admission may look at every one
MAX_DURATION = timedelta(days=31)  # the longest a recurring window stays open per start
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # an RFC 1123 label, as Events and metrics show it
# How far `effective` looks for the next change before saying there is none.
_HORIZON = timedelta(days=400)
# The work one answer may take, in looks at a window (its next boundaries, or whether it is
# open: a cron step or two, ~12 us; ~25 ms in all): schedules whose open stretches chain
# (`* * * * *` for 1m, up to 16 of them) have a boundary every minute that changes nothing,
# and walking them all to the horizon held the event loop for seconds. A minute has at most
# one recurring boundary, so the budget covers about an hour of any quota's boundaries (16
# windows: 2 looks each a step, 64 steps) and every caller looks again within the hour.
_BUDGET = 2048
_MAX_STEPS = 4096
# How far back `hard_note` looks for the window whose end put the quota's own hard in
# force, nearest first (the latest change found in a shorter look is the latest), and how
# many changes `last_change` steps through: a denial names a window that ended within a
# day; one that ended earlier is old news, and the cost stays bounded.
_LOOKBACKS = (timedelta(minutes=10), timedelta(hours=2), timedelta(days=1))
_MAX_CHANGES = 256
_RESOURCES = ("memory", "devices")


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    hard: Limits  # None for a resource: the quota's own hard applies
    start: datetime | None = None  # a one-off window: aware datetimes
    end: datetime | None = None
    schedule: Cron | None = None  # a recurring one
    duration: timedelta = timedelta(0)
    zone: ZoneInfo = ZoneInfo("UTC")

    def active_at(self, at: datetime) -> bool:
        if self.start is not None and self.end is not None:
            return self.start <= at < self.end
        return self._start_after(at - self.duration) <= at

    def boundaries_after(self, at: datetime) -> list[datetime]:
        """Instants after `at` where this window may open or close (a superset of where it does)."""
        if self.start is not None and self.end is not None:
            return [t for t in (self.start, self.end) if t > at]
        out = [self._start_after(at)]
        first = self._start_after(at - self.duration)
        if first <= at:
            out.append(first + self.duration)
        return out

    def _start_after(self, after: datetime) -> datetime:
        """The first instant strictly after `after` at which this recurring window opens."""
        assert self.schedule is not None
        local = after.astimezone(self.zone).replace(tzinfo=None)
        while True:
            local = self.schedule.next_after(local)
            instant = _instant(local, self.zone)
            # In a fall-back's repeated hour the wall clock goes back: its first occurrence
            # (fold=0) may be before `after`.
            if instant > after:
                return instant


def _instant(local: datetime, zone: ZoneInfo) -> datetime:
    """The UTC instant of a wall-clock time: the first of two in a fall-back, the jump in a spring-forward."""
    probe = local
    for _ in range(48 * 60):  # the longest gap a zone has had is a day (Pacific/Apia, 2011)
        aware = probe.replace(tzinfo=zone)
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == probe:
            return aware.astimezone(UTC)
        probe += timedelta(minutes=1)
    raise ValueError(f"no wall-clock time after {local} exists in {zone}")


@dataclass(frozen=True, slots=True)
class Effective:
    hard: Limits
    window: str | None  # the active window's name; None: the quota's own hard
    next_change: datetime | None  # None: no change within 400 days (or within the walk `_BUDGET` allows)


def _state(base: Limits, windows: Sequence[Window], at: datetime) -> tuple[Limits, str | None]:
    for window in windows:
        if window.active_at(at):
            overrides = {r: v for r in _RESOURCES if (v := window.hard.get(r)) is not None}
            return replace(base, **overrides), window.name
    return base, None


class _Budget:
    """What is left of `_BUDGET` for one answer (`_next_change` spends it)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = _BUDGET


class _Exhausted(Exception):
    """The budget ran out: nothing changes in (start, point], beyond is unknown."""

    def __init__(self, point: datetime) -> None:
        super().__init__(point)
        self.point = point


def _next_change(base: Limits, windows: Sequence[Window], at: datetime,
                 now: tuple[Limits, str | None], until: datetime, budget: _Budget) -> datetime | None:
    """The first instant in (at, until] where the state differs from `now`; None if none is found.
    Raises `_Exhausted` when `budget` runs out first."""
    point = at
    while True:
        budget.left -= 2 * len(windows)
        if budget.left < 0:
            raise _Exhausted(point)
        candidates = [t for window in windows for t in window.boundaries_after(point)]
        if not candidates or (point := min(candidates)) > until:
            return None
        if _state(base, windows, point) != now:
            return point


def hard_at(base: Limits, windows: Sequence[Window], at: datetime) -> tuple[Limits, str | None]:
    """The `hard` in force at `at` and the window that sets it (None: the quota's own):
    `effective` without looking for the next change, for readers that need only the present."""
    return _state(base, windows, at)


def last_change(base: Limits, windows: Sequence[Window], at: datetime, lookback: timedelta,
                budget: _Budget | None = None) -> tuple[datetime, str | None] | None:
    """The latest change of the `hard` in force in (at - lookback, at], with the window in force
    just before it (None: the quota's own); None when none is found (or too many to step through)."""
    point = at - lookback
    state = _state(base, windows, point)
    found: tuple[datetime, str | None] | None = None
    budget = budget or _Budget()
    for _ in range(_MAX_CHANGES):
        try:
            change = _next_change(base, windows, point, state, at, budget)
        except _Exhausted:
            return None
        if change is None:
            return found
        found = (change, state[1])
        point, state = change, _state(base, windows, change)
    return None


def hard_note(base: Limits, windows: Sequence[Window], at: datetime) -> str:
    """Why the `hard` in force at `at` is what it is, for a denial or a condition to name:
    the window in force, or the window whose end (within a day) put the quota's own back;
    "" when no window is involved."""
    _, name = _state(base, windows, at)
    if name is not None:
        return f"the limit in force during window '{name}'"
    budget = _Budget()  # one for the three looks back
    last = next((found for lookback in _LOOKBACKS
                 if (found := last_change(base, windows, at, lookback, budget))), None)
    if last is None or last[1] is None:
        return ""
    return f"the limit in force since window '{last[1]}' ended at {utc_stamp(last[0])}"


def utc_stamp(at: datetime) -> str:
    """RFC 3339 in UTC to the second, as metav1.Time is written (`2026-12-25T17:00:00Z`)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def effective(base: Limits, windows: Sequence[Window], at: datetime) -> Effective:
    """The `hard` in force at `at`, the window that sets it, and when that next changes."""
    hard, name = _state(base, windows, at)
    if not windows:
        return Effective(hard, name, None)
    try:
        change = _next_change(base, windows, at, (hard, name), at + _HORIZON, _Budget())
    except _Exhausted:
        change = None  # a schedule too dense to look further: nothing changes for over an hour
    return Effective(hard, name, change)


def effective_for_admission(base: Limits, windows: Sequence[Window], at: datetime, skew: timedelta) -> Limits:
    """Per resource the smallest `hard` in force anywhere in [at - skew, at + skew].

    Two replicas whose clocks differ by at most `skew` then never admit against a `hard`
    the other would not yet (or no longer) allow: a decrease applies `skew` early, an
    increase `skew` late. A resource the quota does not limit stays unlimited.
    """
    return _smallest_in_force(base, windows, at, skew, _Budget())


def _smallest_in_force(base: Limits, windows: Sequence[Window], at: datetime, skew: timedelta,
                       budget: _Budget) -> Limits:
    point = at - skew
    state = _state(base, windows, point)
    smallest = state[0]
    try:
        while (change := _next_change(base, windows, point, state, at + skew, budget)) is not None:
            point, state = change, _state(base, windows, change)
            smallest = _least(smallest, state[0])
    except _Exhausted:
        # Too many boundaries within the skew to walk: the least any window could put in
        # force, which admits nothing a walk would have refused.
        for window in windows:
            smallest = _least(smallest, replace(base, **{r: v for r in _RESOURCES if (v := window.hard.get(r)) is not None}))
    return smallest


def _least(a: Limits, b: Limits) -> Limits:
    """Per resource the smaller limit; a resource unlimited in `a` stays so (a window limits
    only what the quota's own hard limits)."""
    return replace(a, **{r: min(x, y) for r in _RESOURCES if (x := a.get(r)) is not None and (y := b.get(r)) is not None})


def admission_change_after(base: Limits, windows: Sequence[Window], at: datetime,
                           skew: timedelta) -> datetime | None:
    """The first instant after `at` where `effective_for_admission` may change (None: not within
    400 days).

    It can change only where a change of the `hard` in force enters or leaves the skew
    interval: at `c - skew` or `c + skew` for a change `c`. A replica re-reads its limits
    then, not at the boundaries themselves. When the work budget runs out first (a schedule
    with a boundary every minute), an earlier instant: where the walk stopped, less the
    skew, and never sooner than a second from `at`.
    """
    budget = _Budget()
    now = _smallest_in_force(base, windows, at, skew, budget)
    candidates: list[datetime] = []
    point = at - skew
    state = _state(base, windows, point)
    try:
        upcoming = _next_change(base, windows, point, state, at + _HORIZON, budget)
        for _ in range(_MAX_STEPS):  # changes of the hard in force that leave this one unchanged
            # Every change whose `c - skew` could come before the earliest candidate, known.
            while upcoming is not None and (not candidates or upcoming - skew <= min(candidates)):
                candidates.extend(t for t in (upcoming - skew, upcoming + skew) if t > at)
                point, state = upcoming, _state(base, windows, upcoming)
                upcoming = _next_change(base, windows, point, state, at + _HORIZON, budget)
            if not candidates:
                return None
            candidate = min(candidates)
            candidates.remove(candidate)
            if _smallest_in_force(base, windows, candidate, skew, budget) != now:
                return candidate
            if budget.left < 0:
                raise _Exhausted(candidate + skew)
    except _Exhausted as stopped:
        return max(min([stopped.point - skew, *candidates]), at + timedelta(seconds=1))
    return None


def parse_time(raw: Any, where: str, error: type[Exception]) -> datetime:
    """An RFC 3339 date-time with an offset (`2026-12-24T18:00:00Z`), as an aware datetime."""
    if not isinstance(raw, str):
        raise error(f"{where} must be an RFC 3339 date-time (e.g. 2026-12-24T18:00:00Z), got {show(raw)}")
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None or "T" not in raw.upper():
        raise error(f"{where} must be an RFC 3339 date-time with an offset (e.g. 2026-12-24T18:00:00Z), got {show(raw)}")
    return value.astimezone(UTC)


def parse_windows(raw: Any, where: str, base: Limits, error: type[Exception],
                  parse_hard: Callable[[Mapping[str, Any], str], Limits]) -> tuple[Window, ...]:
    """`spec.windows`, checked: the messages name the field (`spec.windows[1].schedule`)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise error(f"{where}: spec.windows must be a list, got {show(raw)}")
    if len(raw) > MAX_WINDOWS:
        raise error(f"{where}: spec.windows has {len(raw)} windows: at most {MAX_WINDOWS}")
    windows: list[Window] = []
    for index, item in enumerate(raw):
        window = _window(item, f"{where}: spec.windows[{index}]", base, error, parse_hard)
        if any(w.name == window.name for w in windows):
            raise error(f"{where}: spec.windows[{index}].name: {window.name!r} names another window too")
        windows.append(window)
    return tuple(windows)


def _window(item: Any, where: str, base: Limits, error: type[Exception],
            parse_hard: Callable[[Mapping[str, Any], str], Limits]) -> Window:
    if not isinstance(item, dict):
        raise error(f"{where} must be an object, got {show(item)}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise error(f"{where}.name must be a lowercase RFC 1123 label (e.g. nights), got {show(name)}")
    hard = item.get("hard")
    if not isinstance(hard, dict) or not hard:
        raise error(f"{where}.hard must be a map with memory or devices, got {show(hard)}")
    for key in hard:
        if key in _RESOURCES and base.get(key) is None:
            raise error(f"{where}.hard.{key}: the quota's spec.hard does not limit {key}: a window changes "
                        "only limits the quota has")
    window = Window(name=name, hard=parse_hard(hard, f"{where}.hard"))
    once = [key for key in ("start", "end") if key in item]
    recurring = [key for key in ("schedule", "duration", "timeZone") if key in item]
    if once and recurring:
        raise error(f"{where}: a window is one-off (start, end) or recurring (schedule, duration, timeZone), "
                    f"not both: it has {', '.join(once + recurring)}")
    if once:
        return _one_off(window, item, where, error)
    if "schedule" not in item or "duration" not in item:
        raise error(f"{where}: a window needs start and end (one-off) or schedule and duration (recurring)")
    return _recurring(window, item, where, error)


def _one_off(window: Window, item: Mapping[str, Any], where: str, error: type[Exception]) -> Window:
    for key in ("start", "end"):
        if key not in item:
            raise error(f"{where}.{key} is required in a one-off window")
    start = parse_time(item["start"], f"{where}.start", error)
    end = parse_time(item["end"], f"{where}.end", error)
    if end <= start:
        raise error(f"{where}.end ({item['end']}) must be after its start ({item['start']})")
    return replace(window, start=start, end=end)


def _recurring(window: Window, item: Mapping[str, Any], where: str, error: type[Exception]) -> Window:
    schedule, duration, zone = item["schedule"], item["duration"], item.get("timeZone", "UTC")
    if not isinstance(schedule, str):
        raise error(f"{where}.schedule must be a 5-field cron expression, got {show(schedule)}")
    try:
        cron = parse_cron(schedule)
    except CronError as err:
        raise error(f"{where}.schedule: {err}") from None
    try:
        if not isinstance(duration, str):
            raise ValueError(f"got {show(duration)}")
        length = timedelta(microseconds=parse_go_duration(duration) // 1000)  # nanoseconds in
    except ValueError as err:
        raise error(f"{where}.duration must be a duration such as 8h or 1h30m: {err}") from None
    if not timedelta(minutes=1) <= length <= MAX_DURATION:
        raise error(f"{where}.duration must be between 1m and 744h (31 days), got {duration}")
    if not isinstance(zone, str) or not zone:
        raise error(f"{where}.timeZone must be an IANA time zone name (e.g. Europe/Berlin), got {show(zone)}")
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise error(f"{where}.timeZone: unknown time zone {zone!r}: use an IANA name such as Europe/Berlin or UTC") \
            from None
    return replace(window, schedule=cron, duration=length, zone=tz)

