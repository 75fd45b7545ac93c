"""quota.reports.showbackreport: times, the gap check, rows and totals from Prometheus' answers, the three outputs."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from quota.reports.showbackreport import (
    GIB,
    NO_TEAM,
    TOTAL,
    Gap,
    describe,
    gaps,
    parse_time,
    presence_query,
    queries,
    render,
    rows_of,
    step_for,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
START, END = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(("text", "when"), [
    ("2026-11-01T00:00:00Z", datetime(2026, 11, 1, tzinfo=UTC)),
    ("2026-11-01T01:00:00+01:00", datetime(2026, 11, 1, tzinfo=UTC)),
    ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
    ("now", NOW),
    ("now-30d", NOW - timedelta(days=30)),
    ("now-90m", NOW - timedelta(minutes=90)),
])
def test_times(text: str, when: datetime) -> None:
    assert parse_time(text, NOW) == when


@pytest.mark.parametrize("text", ["yesterday", "now-3y", "2026-13-01", ""])
def test_a_time_that_is_none_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time(text, NOW)


def test_the_gap_check_stays_under_prometheus_point_limit() -> None:
    assert step_for(600) == 60
    assert 30 * 86400 / step_for(30 * 86400) <= 11_000


def test_gaps_are_the_steps_with_no_scrape_or_no_leader_merged() -> None:
    start = 1_000_000.0
    # Ten steps of a minute: 3 and 4 unscraped, 7 scraped with nobody leading.
    points = [(start + 60 * i, 1.0) for i in range(1, 11) if i not in (3, 4, 7)] + [(start + 420, 0.0)]
    at = datetime.fromtimestamp
    assert gaps(points, start, start + 600, 60) == [
        Gap(at(start + 120, UTC), at(start + 240, UTC), "no replica scraped"),
        Gap(at(start + 360, UTC), at(start + 420, UTC), "no replica led"),
    ]
    assert gaps([(start + 60 * i, 1.0) for i in range(1, 11)], start, start + 600, 60) == []


def test_a_step_looks_back_at_least_prometheus_lookback_so_slow_scrapes_are_no_gaps() -> None:
    assert presence_query(60) == "max(max_over_time(draquota_leader[300s]))"
    assert presence_query(600) == "max(max_over_time(draquota_leader[600s]))"


def test_many_gaps_are_summed_up_not_listed() -> None:
    at = datetime(2026, 11, 1, tzinfo=UTC)
    holes = [Gap(at + timedelta(hours=i), at + timedelta(hours=i, minutes=30), "no replica scraped") for i in range(8)]
    text = describe(holes)
    assert text.count("no replica scraped") == 5 and text.endswith("and 3 more (4.0 hours in all)")


def sample(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [END.timestamp(), str(value)]}


HOUR_80 = 80 * GIB * 3600  # 80 GiB for an hour, in byte-seconds


def answers(by: str) -> dict[str, list[dict[str, Any]]]:
    label = {"namespace": "namespace", "model": "model", "team": "team"}[by]
    out = {
        "memory": [sample(2 * HOUR_80, **{label: "a"}), sample(HOUR_80, **{label: "b"})],
        "devices": [sample(2 * 3600, **{label: "a"}), sample(3600, **{label: "b"})],
        "idle": [sample(80 * GIB * 60 / 2, **{label: "a"})],  # 30 one-minute samples of 80 GiB idle
        "total_memory": [sample(3 * HOUR_80)], "total_devices": [sample(3 * 3600)],
        "total_idle": [sample(80 * GIB * 30)],
    }
    if by == "team":
        out.update(unteamed_memory=[sample(HOUR_80 / 2)], unteamed_devices=[sample(1800)], unteamed_idle=[])
    return out


def test_rows_in_gib_hours_and_device_hours_largest_first_with_the_total() -> None:
    report = rows_of("namespace", answers("namespace"), START, END)
    assert [(r.key, r.memory_gib_hours, r.device_hours, r.idle_gib_hours) for r in report.rows] == [
        ("a", 160.0, 2.0, 0.5 * 80), ("b", 80.0, 1.0, 0.0)]
    assert (report.total.key, report.total.memory_gib_hours, report.total.idle_gib_hours) == (TOTAL, 240.0, 40.0)


def test_by_team_a_namespace_in_no_team_is_a_row_of_its_own() -> None:
    report = rows_of("team", answers("team"), START, END)
    assert [(r.key, r.memory_gib_hours) for r in report.rows] == [("a", 160.0), ("b", 80.0), (NO_TEAM, 40.0)]


def test_without_idle_series_idle_is_unknown_not_zero() -> None:
    plain = answers("model") | {"idle": [], "total_idle": []}
    report = rows_of("model", plain, START, END)
    assert {r.idle_gib_hours for r in (*report.rows, report.total)} == {None}
    assert "-" in render(report, "table").splitlines()[2].split()


def test_the_three_outputs() -> None:
    report = rows_of("namespace", answers("namespace"), START, END, ["a warning"])
    table = render(report, "table").splitlines()
    assert table[0] == "GPU allocation from 2026-11-01T00:00:00Z to 2026-12-01T00:00:00Z, by namespace"
    assert table[1].split() == ["NAMESPACE", "GPU-MEMORY", "GiB-HOURS", "DEVICE-HOURS", "IDLE", "GiB-HOURS"]
    assert table[2].split() == ["a", "160.00", "2.00", "40.00"]
    assert table[-1].split() == [TOTAL, "240.00", "3.00", "40.00"]
    rows = list(csv.reader(io.StringIO(render(report, "csv"))))
    assert rows == [["namespace", "gpu_memory_gib_hours", "device_hours", "idle_gpu_memory_gib_hours"],
                    ["a", "160.000000", "2.000000", "40.000000"], ["b", "80.000000", "1.000000", "0.000000"]]
    document = json.loads(render(report, "json"))
    assert document == {
        "from": "2026-11-01T00:00:00Z", "to": "2026-12-01T00:00:00Z", "by": "namespace",
        "rows": [{"namespace": "a", "gpuMemoryGiBHours": 160.0, "deviceHours": 2.0, "idleGpuMemoryGiBHours": 40.0},
                 {"namespace": "b", "gpuMemoryGiBHours": 80.0, "deviceHours": 1.0, "idleGpuMemoryGiBHours": 0.0}],
        "total": {"gpuMemoryGiBHours": 240.0, "deviceHours": 3.0, "idleGpuMemoryGiBHours": 40.0},
        "warnings": ["a warning"]}


def test_the_queries_sum_increase_over_the_whole_range_and_read_what_we_export() -> None:
    asked = queries("team", 30 * 86400)
    assert asked["total_memory"] == "sum(sum by (namespace) (increase(draquota_allocated_memory_byte_seconds_total"\
        "[2592000s])))"
    assert "draquota_cluster_quota_namespace" in asked["memory"] and "unless" in asked["unteamed_memory"]
    assert set(queries("model", 60)) == {"memory", "devices", "idle", "total_memory", "total_devices", "total_idle"}


@pytest.mark.parametrize("by", ["namespace", "team", "model"])
def test_every_query_reads_what_serve_exports_or_the_rules_record(by: str) -> None:
    from ...deploy.queries import unknown

    for expr in queries(by, 3600).values():  # type: ignore[arg-type]
        assert unknown(expr) == set(), expr
