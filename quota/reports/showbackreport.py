"""`dra-quota report`'s domain: the PromQL it asks, the rows it makes of the answers, the gaps.

Neighbours: `commands.report` asks Prometheus' HTTP API and prints; the counters are
`webhook.showbackmetrics`'s, the idle series the chart's recording rules
(deploy/prometheus/dra-quota-rules.yaml). Pure: the answers come in as Prometheus' JSON
samples, the time as arguments.

Totals over [from, to] are `increase()` at `to` over the range, summed over every
series (replicas, restarts: only the leader's grow, a restart is a counter reset):
exact within about one scrape interval at each end. Teams are the ClusterDeviceQuotas
selecting each namespace at `to` (draquota_cluster_quota_namespace); a namespace in no
team is the row `(no team)`, one in two teams is billed in each (the total is
the namespaces', counted once). Idle is the chart's per-minute idle series summed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from quota.reports.tables import print_rows

__all__ = ["By", "Gap", "Report", "Row", "describe", "gaps", "parse_time", "presence_query", "queries", "render",
           "rows_of", "step_for"]

By = Literal["namespace", "team", "model"]
GIB = 2**30
MEMORY = "draquota_allocated_memory_byte_seconds_total"
DEVICES = "draquota_allocated_device_seconds_total"
LEADER = "draquota_leader"
IDLE = "namespace_model:draquota_idle_memory_bytes:rate5m"
NO_TEAM = "(no team)"
TOTAL = "(total)"  # no namespace or team can be named so (object names)
# One sample a minute (the recording rules' group interval): summed, byte-minutes.
IDLE_SPACING = 60.0
_MEMBERS = 'group by (namespace, team) (label_replace(draquota_cluster_quota_namespace, "team", "$1", "quota", "(.*)"))'
_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: datetime) -> datetime:
    """RFC 3339 (`2026-11-01T00:00:00Z`), a date (`2026-11-01`, midnight UTC), `now` or
    `now-30d` (s, m, h, d, w). ValueError with what was wrong."""
    if match := _RELATIVE.match(text.strip()):
        amount, unit = match.groups()
        return now - timedelta(seconds=int(amount) * _UNITS[unit]) if amount else now
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01), "
                         "now or now-30d") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _increase(metric: str, seconds: int) -> str:
    return f"increase({metric}[{seconds}s])"


def queries(by: By, seconds: int) -> dict[str, str]:
    """The instant queries at `to` for a range of `seconds`: memory (byte-seconds), devices
    (device-seconds), idle (byte-minutes), each by `by`, and the totals."""
    idle = f"sum_over_time({IDLE}[{max(seconds - 1, 1)}s])"  # one sample short: as the rules do
    per_ns = {"memory": f"sum by (namespace) ({_increase(MEMORY, seconds)})",
              "devices": f"sum by (namespace) ({_increase(DEVICES, seconds)})",
              "idle": f"sum by (namespace) ({idle})"}
    out = {f"total_{k}": f"sum({v})" for k, v in per_ns.items()}
    if by == "namespace":
        out.update(per_ns)
    elif by == "model":
        out.update({"memory": f"sum by (model) ({_increase(MEMORY, seconds)})",
                    "devices": f"sum by (model) ({_increase(DEVICES, seconds)})",
                    "idle": f"sum by (model) ({idle})"})
    else:
        for key, expr in per_ns.items():
            out[key] = f"sum by (team) ({_MEMBERS} * on (namespace) group_left () {expr})"
            out[f"unteamed_{key}"] = f"sum({expr} unless on (namespace) {_MEMBERS})"
    return out


def step_for(seconds: int) -> int:
    """The gap check's resolution: a minute, or coarser so a range stays under 10,000 points."""
    return max(60, math.ceil(seconds / 10_000))


# A step looks back at least this far for a sample: Prometheus' own lookback (staleness)
# window, so a scrape interval up to 5 minutes is never taken for a gap.
LOOKBACK = 300


def presence_query(step: int) -> str:
    """1 at each step where a scraped replica led during it (or the lookback before it), 0
    where replicas were scraped and none led, nothing where none was scraped (a
    query_range with this step)."""
    return f"max(max_over_time({LEADER}[{max(step, LOOKBACK)}s]))"


def describe(holes: Sequence[Gap], shown: int = 5) -> str:
    """The first `shown` gaps, and how many more and how long in all."""
    listed = "; ".join(map(str, holes[:shown]))
    if len(holes) <= shown:
        return listed
    total = sum((g.end - g.start).total_seconds() for g in holes)
    return f"{listed}; and {len(holes) - shown} more ({total / 3600:.1f} hours in all)"


@dataclass(frozen=True, slots=True)
class Gap:
    start: datetime
    end: datetime
    why: str  # "no replica scraped" or "no replica led"

    def __str__(self) -> str:
        return f"{_iso(self.start)} to {_iso(self.end)}: {self.why}"


def gaps(points: Sequence[tuple[float, float]], start: float, end: float, step: int) -> list[Gap]:
    """Stretches of [start, end] (the query_range's steps, each covering the `step` before
    it) with no point (nobody scraped) or a 0 (nobody led, so nobody accrued)."""
    seen = {round(t): v for t, v in points}
    out: list[Gap] = []
    t = start + step
    while t <= end + 0.5:
        value = seen.get(round(t))
        why = "no replica scraped" if value is None else "no replica led" if value < 1 else ""
        if why:
            low, high = datetime.fromtimestamp(t - step, UTC), datetime.fromtimestamp(min(t, end), UTC)
            if out and out[-1].why == why and out[-1].end == low:
                out[-1] = Gap(out[-1].start, high, why)
            else:
                out.append(Gap(low, high, why))
        t += step
    return out


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    memory_gib_hours: float
    device_hours: float
    idle_gib_hours: float | None  # None: no idle series (no dcgm-exporter, or no recording rules)


@dataclass(frozen=True, slots=True)
class Report:
    by: By
    start: datetime
    end: datetime
    rows: tuple[Row, ...]
    total: Row
    warnings: tuple[str, ...] = ()


def _by_key(samples: Iterable[Mapping[str, Any]], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample in samples:
        key = sample["metric"].get(label, "")
        out[key] = out.get(key, 0.0) + float(sample["value"][1])
    return out


def rows_of(by: By, answers: Mapping[str, Sequence[Mapping[str, Any]]], start: datetime, end: datetime,
            warnings: Sequence[str] = ()) -> Report:
    """The report from the answers to `queries(by, ...)`, by name."""
    label = by
    memory, devices, idle = (_by_key(answers[k], label) for k in ("memory", "devices", "idle"))
    has_idle = bool(answers["total_idle"])
    if by == "team":
        for key, table in (("memory", memory), ("devices", devices), ("idle", idle)):
            left = sum(float(s["value"][1]) for s in answers[f"unteamed_{key}"])
            if left:
                table[NO_TEAM] = left
    keys = sorted({*memory, *devices}, key=lambda k: (-memory.get(k, 0.0), k))
    rows = tuple(_row(k, memory.get(k, 0.0), devices.get(k, 0.0), idle.get(k, 0.0) if has_idle else None)
                 for k in keys)

    def total(key: str) -> float:
        return sum(float(s["value"][1]) for s in answers[key])

    return Report(by, start, end, rows, _row(TOTAL, total("total_memory"), total("total_devices"),
                                                total("total_idle") if has_idle else None), tuple(warnings))


def _row(key: str, byte_seconds: float, device_seconds: float, idle_byte_minutes: float | None) -> Row:
    return Row(key, byte_seconds / GIB / 3600, device_seconds / 3600,
               None if idle_byte_minutes is None else idle_byte_minutes * IDLE_SPACING / GIB / 3600)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(report: Report, output: Literal["table", "csv", "json"]) -> str:
    if output == "json":
        def row(r: Row) -> dict[str, Any]:
            return {report.by: r.key, "gpuMemoryGiBHours": r.memory_gib_hours, "deviceHours": r.device_hours,
                    "idleGpuMemoryGiBHours": r.idle_gib_hours}

        total = row(report.total)
        del total[report.by]
        return json.dumps({"from": _iso(report.start), "to": _iso(report.end), "by": report.by,
                           "rows": [row(r) for r in report.rows], "total": total,
                           "warnings": list(report.warnings)}, indent=2) + "\n"
    if output == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([report.by, "gpu_memory_gib_hours", "device_hours", "idle_gpu_memory_gib_hours"])
        for r in report.rows:
            writer.writerow([r.key, f"{r.memory_gib_hours:.6f}", f"{r.device_hours:.6f}",
                             "" if r.idle_gib_hours is None else f"{r.idle_gib_hours:.6f}"])
        return buffer.getvalue()
    out = io.StringIO()
    out.write(f"GPU allocation from {_iso(report.start)} to {_iso(report.end)}, by {report.by}\n")
    table = [[report.by.upper(), "GPU-MEMORY GiB-HOURS", "DEVICE-HOURS", "IDLE GiB-HOURS"]]
    table += [[r.key, _number(r.memory_gib_hours), _number(r.device_hours), _number(r.idle_gib_hours)]
              for r in (*report.rows, report.total)]
    print_rows(table, out)
    return out.getvalue()
