"""quota.status.published and quota.reports.tables.top_tables: a DeviceQuota's and a ClusterDeviceQuota's published
usage, read as `dra-quota top` prints it."""

import io
from typing import Any

import pytest

from quota.quotas.devicequota import QuotaError
from quota.reports.tables import print_rows, top_tables
from quota.status.published import quota_usage, team_usage

from ...builders import GiB, make_cluster_quota, make_quota


def with_status(status: dict[str, Any] | None, generation: int = 2) -> dict[str, Any]:
    obj = make_quota("gpus", memory="320Gi", devices=8)
    obj["metadata"]["generation"] = generation
    if status is not None:
        obj["status"] = status
    return obj


def test_reads_the_controllers_status_as_integers() -> None:
    row = quota_usage(with_status({
        "observedGeneration": 2,
        "used": {"memory": "160Gi", "devices": 2},
        "reserved": {"memory": 80 * GiB, "devices": 1},
        "claims": {"allocated": 2, "pending": 1},
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "Exceeded", "status": "False"}],
    }))
    assert row == {
        "kind": "DeviceQuota", "namespace": "team-a", "name": "gpus", "hard": {"memory": 320 * GiB, "devices": 8},
        "used": {"memory": 160 * GiB, "devices": 2}, "reserved": {"memory": 80 * GiB, "devices": 1},
        "claims": {"allocated": 2, "pending": 1}, "exceeded": False, "current": True,
    }


def test_missing_or_stale_status_is_not_counted_yet_rather_than_zero() -> None:
    missing = quota_usage(with_status(None))
    assert missing["used"] == {"memory": None, "devices": None} and not missing["current"]
    stale = quota_usage(with_status({"observedGeneration": 1, "used": {"memory": 0, "devices": 0}}))
    assert stale["used"] == {"memory": 0, "devices": 0} and not stale["current"]


def test_exceeded_condition() -> None:
    row = quota_usage(with_status({"observedGeneration": 2, "conditions": [{"type": "Exceeded", "status": "True"}]}))
    assert row["exceeded"] and row["current"]


@pytest.mark.parametrize(("status", "field"), [
    ({"used": {"memory": "lots"}}, "status.used.memory"),
    ({"reserved": {"devices": -1}}, "status.reserved.devices"),
    ({"claims": {"pending": "3"}}, "status.claims.pending"),
])
def test_unreadable_status_names_the_field(status: dict[str, Any], field: str) -> None:
    with pytest.raises(QuotaError, match=field.replace(".", r"\.")):
        quota_usage(with_status(status))


def test_odd_shapes_are_empty_not_crashes() -> None:
    row = quota_usage(with_status({"used": [], "claims": 3, "conditions": {"Exceeded": "True"}}))
    assert row["used"] == {"memory": None, "devices": None} and row["claims"] == {"allocated": None, "pending": None}
    assert not row["exceeded"]


# -- team quotas ------------------------------------------------------------------------------

def team(namespaces: Any, generation: int = 3) -> dict[str, Any]:
    obj = make_cluster_quota("ml-team", memory="640Gi", devices=8)
    obj["metadata"]["generation"] = generation
    obj["status"] = {"observedGeneration": 3, "used": {"memory": "480Gi", "devices": 6},
                     "reserved": {"memory": "160Gi", "devices": 2}, "claims": {"allocated": 6, "pending": 2},
                     "namespaces": namespaces}
    return obj


def part(namespace: str, used: str, devices: int, reserved: str = "0", pending: int = 0) -> dict[str, Any]:
    return {"namespace": namespace, "used": {"memory": used, "devices": devices},
            "reserved": {"memory": reserved, "devices": pending}, "claims": {"allocated": devices, "pending": pending}}


BREAKDOWN = [part("ml-dev", "80Gi", 1), part("ml-train", "400Gi", 5, "160Gi", 2)]


def test_a_team_shows_its_totals_and_each_namespaces_part() -> None:
    row = team_usage(team(BREAKDOWN))
    assert row == {
        "kind": "ClusterDeviceQuota", "namespace": "", "name": "ml-team",
        "hard": {"memory": 640 * GiB, "devices": 8},
        "used": {"memory": 480 * GiB, "devices": 6}, "reserved": {"memory": 160 * GiB, "devices": 2},
        "claims": {"allocated": 6, "pending": 2}, "exceeded": False, "current": True,
        "namespaces": [
            {"namespace": "ml-dev", "used": {"memory": 80 * GiB, "devices": 1},
             "reserved": {"memory": 0, "devices": 0}, "claims": {"allocated": 1, "pending": 0}},
            {"namespace": "ml-train", "used": {"memory": 400 * GiB, "devices": 5},
             "reserved": {"memory": 160 * GiB, "devices": 2}, "claims": {"allocated": 5, "pending": 2}},
        ],
    }


def test_with_a_namespace_only_its_part_and_no_team_that_does_not_list_it() -> None:
    row = team_usage(team(BREAKDOWN), "ml-train")
    assert row is not None and [p["namespace"] for p in row["namespaces"]] == ["ml-train"]
    assert row["used"]["memory"] == 480 * GiB  # the team's total, still
    assert team_usage(team(BREAKDOWN), "elsewhere") is None


def test_a_team_without_a_breakdown_yet_is_not_counted_and_has_no_namespaces() -> None:
    obj = make_cluster_quota("ml-team", memory="640Gi")
    obj["metadata"]["generation"] = 1
    row = team_usage(obj)
    assert row is not None and row["namespaces"] == [] and not row["current"]
    assert row["used"] == {"memory": None, "devices": None}


@pytest.mark.parametrize(("namespaces", "field"), [
    ([{"used": {"memory": "1Gi"}}], r"status\.namespaces\[0\]\.namespace"),
    ([part("a", "1Gi", 1), {"namespace": "b", "used": {"memory": "lots"}}], r"status\.namespaces\[1\]\.used\.memory"),
    ([{"namespace": "a", "claims": {"pending": -1}}], r"status\.namespaces\[0\]\.claims\.pending"),
])
def test_an_unreadable_breakdown_names_the_field(namespaces: Any, field: str) -> None:
    with pytest.raises(QuotaError, match=f"ClusterDeviceQuota ml-team: {field}"):
        team_usage(team(namespaces))


def test_odd_breakdown_shapes_are_empty_not_crashes() -> None:
    row = team_usage(team({"ml-dev": {}}))
    assert row is not None and row["namespaces"] == []
    row = team_usage(team(["ml-dev", part("ml-train", "1Gi", 1)]))
    assert row is not None and [p["namespace"] for p in row["namespaces"]] == ["ml-train"]


def test_the_tables_put_the_teams_after_the_namespaces_with_their_parts() -> None:
    quota = quota_usage(with_status({"observedGeneration": 2, "used": {"memory": "80Gi", "devices": 1},
                                     "reserved": {"memory": 0, "devices": 0}, "claims": {"allocated": 1, "pending": 0}}))
    exceeded = team(BREAKDOWN)
    exceeded["status"]["conditions"] = [{"type": "Exceeded", "status": "True"}]
    teams = [team_usage(exceeded), team_usage(make_cluster_quota("cv-team", devices=2))]
    namespaced, cluster = top_tables([*(t for t in teams if t is not None), quota])
    out = io.StringIO()
    print_rows(namespaced, out)
    out.write("\n")
    print_rows(cluster, out)
    assert out.getvalue() == """\
NAMESPACE  QUOTA  MEMORY used/reserved/hard  DEVICES used/reserved/hard  CLAIMS allocated/pending  STATUS
team-a     gpus   80Gi / 0 / 320Gi           1 / 0 / 8                   1 / 0

CLUSTERDEVICEQUOTA  NAMESPACE  MEMORY used/reserved/hard  DEVICES used/reserved/hard  CLAIMS allocated/pending  STATUS
ml-team             (total)    480Gi / 160Gi / 640Gi      6 / 2 / 8                   6 / 2                     Exceeded
ml-team             ml-dev     80Gi / 0                   1 / 0                       1 / 0
ml-team             ml-train   400Gi / 160Gi              5 / 2                       5 / 2
cv-team             (total)    - / - / -                  - / - / 2                   - / -                     \
not counted yet (no status for this spec generation)
"""


def test_a_quota_with_windows_shows_the_hard_in_force_and_the_window() -> None:
    obj = with_status({"observedGeneration": 2, "used": {"memory": "400Gi", "devices": 2},
                       "reserved": {"memory": "0", "devices": 0}, "claims": {"allocated": 2, "pending": 0},
                       "effectiveHard": {"memory": "640Gi", "devices": 8}, "activeWindow": "deadline",
                       "nextChange": "2026-12-25T17:00:00Z"})
    obj["spec"]["windows"] = [{"name": "deadline", "hard": {"memory": "640Gi"}, "start": "2026-12-21T07:00:00Z",
                               "end": "2026-12-25T17:00:00Z"}]
    row = quota_usage(obj)
    assert row["hard"] == {"memory": 640 * GiB, "devices": 8}
    assert (row["window"], row["nextChange"]) == ("deadline", "2026-12-25T17:00:00Z")
    namespaced, _ = top_tables([row])
    assert namespaced[1][-1] == "window deadline"
    assert "window" not in quota_usage(with_status(None))  # no windows: check's shape, unchanged
