"""`dra-quota check --at`: quotas with windows checked against the hard in force at that instant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_check import _claim, run

Gi = 2**30

QUOTA = """
apiVersion: draquota.io/v1alpha1
kind: DeviceQuota
metadata: {name: gpus, namespace: team-a}
spec:
  hard: {devices: 1}
  windows:
    - {name: deadline, hard: {devices: 3}, start: "2026-12-21T08:00:00+01:00", end: "2026-12-25T18:00:00+01:00"}
    - {name: nights, hard: {devices: 2}, schedule: "0 20 * * MON-FRI", duration: 10h, timeZone: Europe/Berlin}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec: {}
"""


@pytest.fixture
def files(tmp_path: Path) -> str:
    (tmp_path / "q.yaml").write_text(QUOTA + "".join(_claim("team-a", name) for name in ("a", "b", "c")))
    return str(tmp_path)


@pytest.mark.parametrize(("at", "admitted", "hard", "window", "next_change"), [
    ("2026-12-24T18:00:00Z", 3, 3, "deadline", "2026-12-25T17:00:00Z"),
    ("2026-12-28T20:00:00Z", 2, 2, "nights", "2026-12-29T05:00:00Z"),  # 21:00 in Berlin, a Monday
    ("2026-12-28T12:00:00+01:00", 1, 1, None, "2026-12-28T19:00:00Z"),
])
def test_at_checks_against_the_hard_in_force(files: str, capsys: pytest.CaptureFixture[str], at: str,
                                             admitted: int, hard: int, window: str | None, next_change: str) -> None:
    code, out, err = run(capsys, "check", "-f", files, "-o", "json", "--at", at)
    assert code == 0, err
    data = json.loads(out)
    assert [o["allowed"] for o in data["objects"]] == [i < admitted for i in range(3)]
    (quota,) = data["quotas"]
    assert (quota["hard"], quota["window"], quota["nextChange"]) == ({"devices": hard}, window, next_change)


def test_the_table_names_the_active_window(files: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "-f", files, "--at", "2026-12-24T18:00:00Z")
    header, row = [line.split() for line in out.split("\n\n")[1].splitlines()]
    assert code == 0 and header[-1] == "WINDOW" and row[0] == "gpus" and row[-1] == "deadline"


def test_no_window_column_without_windows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "q.yaml").write_text("apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\n"
                                     "metadata: {name: gpus, namespace: team-a}\nspec: {hard: {devices: 1}}\n")
    code, out, _ = run(capsys, "check", "-f", str(tmp_path), "--at", "2026-12-24T18:00:00Z")
    assert code == 0 and "WINDOW" not in out
    code, out, _ = run(capsys, "check", "-f", str(tmp_path), "-o", "json")
    assert "window" not in json.loads(out)["quotas"][0]


@pytest.mark.parametrize("at", ["2026-12-24", "2026-12-24T18:00:00", "tomorrow"])
def test_a_bad_instant_exits_2(files: str, capsys: pytest.CaptureFixture[str], at: str) -> None:
    code, _, err = run(capsys, "check", "-f", files, "--at", at)
    assert code == 2
    assert "--at must be an RFC 3339 date-time with an offset (e.g. 2026-12-24T18:00:00Z)" in err


def test_a_bad_window_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "q.yaml").write_text(QUOTA.replace("0 20 * * MON-FRI", "0 0 31 2 *"))
    code, _, err = run(capsys, "check", "-f", str(tmp_path))
    assert code == 2
    assert "DeviceQuota team-a/gpus: spec.windows[1].schedule: '0 0 31 2 *' never fires" in err
