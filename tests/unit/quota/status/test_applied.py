"""quota.status.applied: what a team quota's AppliedClusterDeviceQuota holds in one member
namespace (the team's numbers and this namespace's part, nothing of the other members), and
quota.status.published.applied_usage reading it back as `top -n` prints it."""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from quota.quotas.devicequota import QuotaError
from quota.reports.tables import top_tables
from quota.status.applied import APPLIED_KIND, applied_quotas, headroom
from quota.status.published import applied_usage, team_usage

from ...builders import GiB
from .test_published import BREAKDOWN, part, team

CRD = yaml.safe_load((Path(__file__).resolve().parents[4] / "deploy" / "crds" / "appliedclusterdevicequota.yaml").read_text())


def owned_team() -> dict[str, Any]:
    obj = team(BREAKDOWN)
    obj["metadata"]["uid"] = "uid-ml-team"
    return obj


def test_one_per_listed_member_named_after_the_team_owned_by_it() -> None:
    applied = applied_quotas(owned_team())
    assert sorted(applied) == ["ml-dev", "ml-train"]
    body = applied["ml-dev"]
    assert body["kind"] == APPLIED_KIND and body["apiVersion"] == "draquota.io/v1alpha1"
    assert body["metadata"]["name"] == "ml-team" and body["metadata"]["namespace"] == "ml-dev"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "draquota.io/v1alpha1", "kind": "ClusterDeviceQuota",
                                                    "name": "ml-team", "uid": "uid-ml-team", "controller": True}]


def test_the_team_totals_headroom_and_this_namespaces_part_only() -> None:
    status = applied_quotas(owned_team(), observed_at="2026-01-01T00:00:40Z", refresh_seconds=59.5)["ml-dev"]["status"]
    assert status == {
        "hard": {"memory": "640Gi", "devices": 8},
        "used": {"memory": "480Gi", "devices": 6}, "reserved": {"memory": "160Gi", "devices": 2},
        "headroom": {"memory": "0", "devices": 0},
        "claims": {"allocated": 6, "pending": 2}, "exceeded": False, "counted": True,
        # How current the team's numbers are: the spec they were counted for, when they were read.
        "teamGeneration": 3, "teamObservedAt": "2026-01-01T00:00:40Z", "teamRefreshSeconds": 60,
        "namespace": {"name": "ml-dev", "used": {"memory": "80Gi", "devices": 1},
                      "reserved": {"memory": "0", "devices": 0}, "claims": {"allocated": 1, "pending": 0}},
    }


def test_never_another_members_name_or_numbers() -> None:
    applied = applied_quotas(owned_team())
    assert "ml-train" not in json.dumps(applied["ml-dev"])
    assert "ml-dev" not in json.dumps(applied["ml-train"])
    assert "400Gi" not in json.dumps(applied["ml-dev"])  # ml-train's part


def test_headroom_per_limit_set_never_negative() -> None:
    row = {"hard": {"memory": 100 * GiB}, "used": {"memory": 30 * GiB, "devices": 9},
           "reserved": {"memory": None, "devices": 1}}
    assert headroom(row) == {"memory": 70 * GiB}
    assert headroom({**row, "used": {"memory": 120 * GiB, "devices": 0}}) == {"memory": 0}


def test_no_member_listed_no_copies_and_no_uid_no_owner() -> None:
    assert applied_quotas(team([])) == {}
    assert applied_quotas(team([part("solo", "1Gi", 1)]))["solo"]["metadata"]["ownerReferences"] == []


def test_an_unreadable_team_status_is_an_error_not_a_copy() -> None:
    with pytest.raises(QuotaError, match=r"status\.namespaces\[0\]"):
        applied_quotas(team([{"namespace": ""}]))


def test_top_reads_it_back_as_the_teams_row_for_that_namespace() -> None:
    obj = team(BREAKDOWN)
    body = applied_quotas(obj, observed_at="2026-01-01T00:00:00Z", refresh_seconds=60)["ml-train"]
    row = applied_usage(body)
    expected = team_usage(obj, "ml-train")
    assert expected is not None
    assert row == {**expected, "applied": True, "headroom": {"memory": 0, "devices": 0},
                   "observedAt": "2026-01-01T00:00:00Z", "refreshSeconds": 60}
    namespaced, teams = top_tables([row], datetime(2026, 1, 1, 0, 0, 40, tzinfo=UTC))
    assert [cells[:2] for cells in teams[1:]] == [("ml-team", "(total)"), ("ml-team", "ml-train")]
    # The total says how old the team's numbers may be; this namespace's own part is current.
    assert teams[1][-1] == "team totals as of 40s ago (refreshed within 60s of a change)"
    assert teams[2][-1] == ""
    later = top_tables([row], datetime(2026, 1, 1, 3, 0, 0, tzinfo=UTC))[1]
    assert later[1][-1] == "team totals as of 3h ago (refreshed within 60s of a change)"


def test_a_copy_that_does_not_say_when_is_shown_without_an_age() -> None:
    body = applied_quotas(team(BREAKDOWN))["ml-dev"]  # written by an older dra-quota
    row = applied_usage(body)
    assert (row["observedAt"], row["refreshSeconds"]) == (None, None)
    assert top_tables([row], datetime(2026, 1, 1, tzinfo=UTC))[1][1][-1] == ""


def test_top_names_the_object_of_an_unreadable_copy() -> None:
    with pytest.raises(QuotaError, match=r"AppliedClusterDeviceQuota ml-dev/t: status\.used\.memory"):
        applied_usage({"metadata": {"name": "t", "namespace": "ml-dev"}, "status": {"used": {"memory": "lots"}}})


def test_the_crd_describes_every_field_it_holds() -> None:
    (version,) = CRD["spec"]["versions"]
    assert CRD["spec"]["scope"] == "Namespaced" and CRD["spec"]["names"]["shortNames"] == ["acdq"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]

    def undescribed(node: dict[str, Any], path: str) -> list[str]:
        missing = [] if "description" in node else [path]
        return missing + [m for key, child in (node.get("properties") or {}).items()
                          for m in undescribed(child, f"{path}.{key}")]

    assert undescribed(schema, "status") == []
    held = applied_quotas(owned_team(), observed_at="2026-01-01T00:00:40Z", refresh_seconds=60)["ml-dev"]["status"]
    assert set(held) == set(schema["properties"])
    assert set(held["namespace"]) == set(schema["properties"]["namespace"]["properties"])


def test_a_team_with_windows_shows_its_members_the_hard_in_force() -> None:
    obj = owned_team()
    obj["spec"]["windows"] = [{"name": "nights", "hard": {"devices": 16}, "schedule": "0 20 * * *", "duration": "10h"}]
    obj["status"]["effectiveHard"] = {"memory": "640Gi", "devices": 16}
    obj["status"]["activeWindow"] = "nights"
    status = applied_quotas(obj)["ml-dev"]["status"]
    assert status["hard"] == {"memory": "640Gi", "devices": 16}
    assert status["headroom"] == {"memory": "0", "devices": 8}
