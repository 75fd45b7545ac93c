"""CEL timestamps and durations (google.protobuf.Timestamp / Duration in cel-go).

Selectors rarely need them (a device carries no time), but they are part of the
standard environment the scheduler compiles against, so an expression using them
must not be refused. Values are whole nanoseconds: `Timestamp` since the Unix epoch
(UTC, years 1 to 9999), `Duration` signed (int64 nanoseconds, as cel-go). Parsing
follows Go: RFC 3339 for `timestamp()`, time.ParseDuration for `duration()`. Operators
live in `quota.cel.ops`, getters and conversions are registered here into
`quota.cel.library.REGISTRY` (imported by `quota.cel.checker`).
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

from quota.cel.library import check_int, register
from quota.cel.types import register_runtime_type
from quota.cel.values import EvalError
from quota.values.goduration import MAX_NS, MIN_NS, NANOS, parse_go_duration

_MIN_NS = -62135596800 * NANOS  # 0001-01-01T00:00:00Z
_MAX_NS = 253402300799 * NANOS + NANOS - 1  # 9999-12-31T23:59:59.999999999Z
# cel-go holds a duration in Go's time.Duration, int64 nanoseconds (about ±292 years;
# common/types/duration.go), and reports arithmetic past it as an integer overflow.
# cel-spec allows ±10,000 years; Kubernetes 1.37 runs cel-go, so cel-go's range holds.
_MIN_DURATION_NS = MIN_NS
_MAX_DURATION_NS = MAX_NS


class Timestamp:
    __slots__ = ("ns",)
    cel_type_name = "google.protobuf.Timestamp"

    def __init__(self, ns: int) -> None:
        if not _MIN_NS <= ns <= _MAX_NS:
            raise EvalError("timestamp out of range")
        self.ns = ns

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and self.ns == other.ns

    def __lt__(self, other: Timestamp) -> bool:
        return self.ns < other.ns

    def __le__(self, other: Timestamp) -> bool:
        return self.ns <= other.ns

    def __hash__(self) -> int:
        return hash(self.ns)


class Duration:
    __slots__ = ("ns",)
    cel_type_name = "google.protobuf.Duration"

    def __init__(self, ns: int) -> None:
        if not _MIN_DURATION_NS <= ns <= _MAX_DURATION_NS:
            raise EvalError("integer overflow")
        self.ns = ns

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and self.ns == other.ns

    def __lt__(self, other: Duration) -> bool:
        return self.ns < other.ns

    def __le__(self, other: Duration) -> bool:
        return self.ns <= other.ns

    def __hash__(self) -> int:
        return hash(self.ns)


register_runtime_type("google.protobuf.Timestamp", Timestamp)
register_runtime_type("google.protobuf.Duration", Duration)

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$"
)


@register("timestamp", "string -> google.protobuf.Timestamp")
def parse_timestamp(text: str) -> Timestamp:
    match = _RFC3339.match(text)
    if match is None:
        raise EvalError(f'timestamp("{text}"): not an RFC 3339 timestamp')
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    try:
        dt.datetime(year, month, day, hour, minute, second)
    except ValueError as exc:
        raise EvalError(f'timestamp("{text}"): {exc}') from None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if match.group(9):
        offset = (int(match.group(10)) * 60 + int(match.group(11))) * 60
        seconds -= offset if match.group(9) == "+" else -offset
    fraction = (match.group(7) or "").ljust(9, "0")
    return Timestamp(seconds * NANOS + int(fraction or "0"))


@register("timestamp", "int -> google.protobuf.Timestamp")
def _timestamp_from_seconds(seconds: int) -> Timestamp:
    return Timestamp(seconds * NANOS)


@register("timestamp", "google.protobuf.Timestamp -> google.protobuf.Timestamp")
@register("duration", "google.protobuf.Duration -> google.protobuf.Duration")
def _identity(value: Timestamp | Duration) -> Timestamp | Duration:
    return value


@register("duration", "string -> google.protobuf.Duration")
def parse_duration(text: str) -> Duration:
    """Go's time.ParseDuration (`quota.values.goduration`), as CEL's `duration(string)`."""
    try:
        return Duration(parse_go_duration(text))
    except ValueError as err:
        raise EvalError(str(err)) from None


def _seconds_text(ns: int) -> str:
    whole, rest = divmod(abs(ns), NANOS)
    text = str(whole) + (f".{rest:09d}".rstrip("0") if rest else "")
    return ("-" if ns < 0 else "") + text


@register("string", "google.protobuf.Timestamp -> string")
def format_timestamp(ts: Timestamp) -> str:
    seconds, nanos = divmod(ts.ns, NANOS)
    m = dt.datetime(1970, 1, 1) + dt.timedelta(seconds=seconds)
    fraction = f".{nanos:09d}".rstrip("0") if nanos else ""
    return f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}{fraction}Z"


@register("string", "google.protobuf.Duration -> string")
def format_duration(d: Duration) -> str:
    return _seconds_text(d.ns) + "s"


@register("int", "google.protobuf.Timestamp -> int")
def _timestamp_seconds(ts: Timestamp) -> int:
    return ts.ns // NANOS


def _local(ts: Timestamp, zone: str | None) -> dt.datetime:
    seconds, _ = divmod(ts.ns, NANOS)
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=seconds)
    if zone is None or zone == "UTC":
        return moment
    offset = re.fullmatch(r"([+-])?(\d{2}):(\d{2})", zone)
    if offset:
        delta = dt.timedelta(hours=int(offset.group(2)), minutes=int(offset.group(3)))
        return moment.astimezone(dt.timezone(-delta if offset.group(1) == "-" else delta))
    try:
        from zoneinfo import ZoneInfo  # stdlib; needs the system or `tzdata` database

        return moment.astimezone(ZoneInfo(zone))
    except Exception:  # unknown zone names and a missing database alike
        raise EvalError(f"unknown time zone {zone!r}") from None


def _getter(name: str, pick: object) -> None:
    def get(ts: Timestamp, zone: str | None = None) -> int:
        return check_int(pick(_local(ts, zone), ts))  # type: ignore[operator]

    register(name, "google.protobuf.Timestamp -> int", member=True)(get)
    register(name, "google.protobuf.Timestamp, string -> int", member=True)(get)


# cel-spec: months, days of month and days of year count from 0; getDate from 1.
_getter("getFullYear", lambda t, ts: t.year)
_getter("getMonth", lambda t, ts: t.month - 1)
_getter("getDayOfMonth", lambda t, ts: t.day - 1)
_getter("getDate", lambda t, ts: t.day)
_getter("getDayOfWeek", lambda t, ts: (t.weekday() + 1) % 7)
_getter("getDayOfYear", lambda t, ts: t.timetuple().tm_yday - 1)
_getter("getHours", lambda t, ts: t.hour)
_getter("getMinutes", lambda t, ts: t.minute)
_getter("getSeconds", lambda t, ts: t.second)
_getter("getMilliseconds", lambda t, ts: (ts.ns % NANOS) // 10**6)


def _duration_getter(name: str, unit: int) -> None:
    def get(d: Duration) -> int:
        whole = abs(d.ns) // unit  # Go truncates toward zero
        return -whole if d.ns < 0 else whole

    register(name, "google.protobuf.Duration -> int", member=True)(get)


_duration_getter("getHours", 3600 * NANOS)
_duration_getter("getMinutes", 60 * NANOS)
_duration_getter("getSeconds", NANOS)
_duration_getter("getMilliseconds", 10**6)
