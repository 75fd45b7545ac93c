"""quota.top: a DeviceQuota's published usage, read as `dra-quota top` prints it."""

from typing import Any

import pytest

from quota.devicequota import QuotaError
from quota.top import quota_usage

from ..builders import GiB, make_quota


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
        "namespace": "team-a", "name": "gpus", "hard": {"memory": 320 * GiB, "devices": 8},
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
