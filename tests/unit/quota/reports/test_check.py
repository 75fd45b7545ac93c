"""`dra-quota check` end to end over examples/ and over bad input.

The expected numbers are the hand computations of examples/README.md: the CLI must
agree with a person applying docs/design.md's rules with a pencil.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from commands.cli import main

from ...builders import advised

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
Gi, Mi = 2**30, 2**20


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_json(capsys: pytest.CaptureFixture[str], *paths: str, mode: str = "conservative") -> dict[str, Any]:
    code, out, err = run(capsys, "check", "-f", *paths, "-o", "json", "--mode", mode)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


# (namespace, name) -> (allowed, memory bytes, devices, candidates or None)
EXPECTED = {
    ("team-a", "llm-finetune"): (True, 80 * Gi, 1, None),
    ("team-a", "notebook-alice"): (True, 20 * Gi, 1, None),
    ("team-b", "mig-notebook"): (True, 4864 * Mi, 1, None),
    ("team-c", "rocm-notebook"): (True, 24 * Gi, 1, None),
    ("research", "gpu-health-probe"): (True, 0, 0, None),
    ("team-a", "h100-pair"): (True, 160 * Gi, 2, 8),
    ("team-a", "h200-pair"): (False, 282 * Gi, 2, 8),
    ("team-a", "notebook-bob"): (True, 20 * Gi, 1, 1),
    ("team-a", "notebook-carol"): (True, 9537 * Mi, 1, 1),
    ("team-a", "debug-h100"): (False, 0, 0, 8),
    ("team-a", "a100-typo"): (False, 0, None, 0),
    ("team-b", "mig-3g"): (True, 19968 * Mi, 1, 2),
    ("team-b", "mig-1g-x4"): (True, 4 * 4864 * Mi, 4, 7),
    ("team-b", "a100-full"): (True, 40 * Gi, 1, 1),
    ("team-b", "mig-3g-second"): (False, 19968 * Mi, 1, 2),
    ("team-c", "mi300x-single"): (True, 192 * Gi, 1, 8),
    ("team-c", "cpx-x4"): (True, 96 * Gi, 4, 16),
    ("team-c", "any-amd-x2"): (False, 384 * Gi, 2, 24),
    ("serving", "llm-serve"): (True, 160 * Gi, 2, 8),
    ("serving", "replica-h200"): (True, 141 * Gi, 1, 8),
    ("serving", "whole-h200-node"): (False, 1128 * Gi, 8, 8),
    ("research", "hopper-burn-in"): (True, 1128 * Gi, 8, 16),
    ("research", "h200-debug"): (True, 0, 0, 8),
    ("research", "cuda-cc-above-8"): (True, 141 * Gi, 1, 17),
}


def test_examples_match_the_hand_computed_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    data = check_json(capsys, str(EXAMPLES))
    got = {(o["namespace"], o["name"]): o for o in data["objects"]}
    assert set(got) == set(EXPECTED)
    for key, (allowed, memory, devices, candidates) in EXPECTED.items():
        obj = got[key]
        assert obj["allowed"] is allowed, (key, obj["reason"])
        assert obj["charge"]["memory"] == memory, key
        if devices is not None:
            assert obj["charge"]["devices"] == devices, key
        if candidates is not None:
            assert obj["requests"][0]["candidates"] == candidates, key


def test_examples_end_state(capsys: pytest.CaptureFixture[str]) -> None:
    data = check_json(capsys, str(EXAMPLES))
    quotas = {(q["namespace"], q["name"]): q for q in data["quotas"]}
    assert quotas[("team-a", "gpus")]["used"] == {"memory": 100 * Gi, "devices": 2}
    assert quotas[("team-a", "gpus")]["reserved"] == {"memory": 193857 * Mi, "devices": 4}
    assert quotas[("team-a", "gpus")]["hard"] == {"memory": 320 * Gi, "devices": 8}
    assert quotas[("team-b", "mig-slices")]["reserved"] == {"memory": 39424 * Mi, "devices": 5}
    assert quotas[("team-c", "amd-gpus")]["reserved"] == {"memory": 288 * Gi, "devices": 5}
    assert quotas[("serving", "gpus")]["reserved"] == {"memory": 160 * Gi, "devices": 2}
    assert quotas[("research", "research-audit")]["reserved"] == {"memory": 1269 * Gi, "devices": 9}


def test_denials_and_warnings_tell_the_user_what_happened(capsys: pytest.CaptureFixture[str]) -> None:
    got = {(o["namespace"], o["name"]): o for o in check_json(capsys, str(EXAMPLES))["objects"]}
    # 100 + 282 > 320: more than what is reserved must go; 4.75 + 19.5 <= 48: the 38.5 reserved take the room.
    assert got[("team-a", "h200-pair")]["reason"] == advised(
        'exceeded DeviceQuota "gpus": requested memory=282Gi, used memory=100Gi, '
        "reserved memory=160Gi, limited memory=320Gi")
    assert got[("team-b", "mig-3g-second")]["reason"] == advised(
        'exceeded DeviceQuota "mig-slices": requested memory=19968Mi, used memory=4864Mi, '
        "reserved memory=39424Mi, limited memory=48Gi", "reserved", namespace="team-b")
    assert "resource.kubernetes.io/admin-access: true" in got[("team-a", "debug-h100")]["reason"]
    assert "device class 'nvidia-a100' not found" in got[("team-a", "a100-typo")]["reason"]
    assert got[("serving", "whole-h200-node")]["reason"].startswith("a claim from this template can never fit")
    assert any("do not fit now" in w for w in got[("serving", "replica-h200")]["warnings"])
    assert any("enforcement: Audit" in w for w in got[("research", "cuda-cc-above-8")]["warnings"])


def test_optimistic_mode(capsys: pytest.CaptureFixture[str]) -> None:
    got = {(o["namespace"], o["name"]): o for o in check_json(capsys, str(EXAMPLES), mode="optimistic")["objects"]}
    assert got[("team-c", "any-amd-x2")]["allowed"] and got[("team-c", "any-amd-x2")]["charge"]["memory"] == 48 * Gi
    assert got[("serving", "llm-serve")]["charge"] == {"memory": 141 * Gi, "devices": 1}
    assert got[("serving", "replica-h200")]["warnings"] == []
    assert got[("research", "cuda-cc-above-8")]["charge"]["memory"] == 48 * Gi
    # All, optimistic: the smallest node per dimension (h100-node-1), not h200-node-1's 1128Gi.
    assert got[("research", "hopper-burn-in")]["charge"] == {"memory": 640 * Gi, "devices": 8}


def test_json_contract_shape(capsys: pytest.CaptureFixture[str]) -> None:
    data = check_json(capsys, str(EXAMPLES))
    assert set(data) == {"objects", "quotas", "warnings", "invalidQuotas"}
    for obj in data["objects"]:
        assert set(obj) == {"kind", "namespace", "name", "allowed", "allocated", "reason", "warnings", "charge",
                            "requests"}
        assert set(obj["charge"]) == {"memory", "devices"}
        for req in obj["requests"]:
            assert set(req) == {"name", "candidates", "charge"} and isinstance(req["candidates"], int)
    for quota in data["quotas"]:
        assert set(quota) == {"kind", "namespace", "name", "hard", "used", "reserved"}


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "-f", str(EXAMPLES))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["KIND", "NAMESPACE", "NAME", "DECISION"]
    h200 = next(line for line in lines if "h200-pair" in line)
    assert "DENIED" in h200 and "282Gi" in h200
    assert any(line.startswith("QUOTA") for line in lines)
    gpus = next(line for line in lines if line.startswith("gpus") and "team-a" in line)
    assert "102400Mi / 193857Mi / 327680Mi" in gpus  # one unit a cell: the largest that shows each exactly


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [unclosed", "not valid YAML"),
        ("apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec: {}\n", "spec.driver is required"),
        ("apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: q}\nspec: {hard: {memory: lots}}\n",
         "quantity 'lots'"),
    ],
)
def test_unreadable_input_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 content: str, message: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    code, out, err = run(capsys, "check", "-f", str(bad))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {bad}") and message in err


def test_missing_path_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "check", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such file or directory" in err


def test_unknown_kinds_are_skipped_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n- 1\n- 2\n")
    code, out, err = run(capsys, "check", "-f", str(tmp_path), "-o", "json")
    data = json.loads(out)
    assert code == 0 and (data["objects"], data["quotas"], data["invalidQuotas"]) == ([], [], [])
    assert "kind ConfigMap is not used by dra-quota" in err and "not a Kubernetes object" in err
    # The JSON carries what stderr said.
    assert [w.split(": ", 1)[1] for w in data["warnings"]] == [
        "skipped: not a Kubernetes object (no kind)", "skipped: kind ConfigMap is not used by dra-quota"]


def test_a_malformed_claim_is_denied_not_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c, namespace: n}\n"
        "spec: {devices: {requests: [{name: r, exactly: {count: 1}}]}}\n"
    )
    obj = check_json(capsys, str(tmp_path))["objects"][0]
    assert obj["allowed"] is False
    assert obj["reason"] == "invalid ResourceClaim: spec.devices.requests[0].exactly.deviceClassName is required"


def test_a_reader_that_goes_away_is_not_a_crash() -> None:
    import subprocess
    import sys

    with subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "check", "-f", str(EXAMPLES)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"KIND")
        proc.stdout.close()  # like `| head -1`
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2 and "check" in err


@pytest.mark.parametrize("kind_doc", [
    "apiVersion: draquota.io/v1alpha1\nkind: DeviceQuota\nmetadata: {name: q, namespace: team-a}\nspec: {hard: {memory: 1Gi}}\n",
    "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n",
    "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: c}\n",
])
def test_an_object_defined_twice_exits_2_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     kind_doc: str) -> None:
    # The later one silently replaced the first (a Namespace gaining the adminAccess label,
    # a DeviceQuota another hard): the reviewer reads one, the tool enforced the other.
    path = tmp_path / "twice.yaml"
    path.write_text(kind_doc + "---\n" + kind_doc.replace("1Gi", "1000Gi"))
    code, _, err = run(capsys, "check", "-f", str(path))
    assert code == 2
    assert "is defined twice (first at" in err and f"{path}:1 (document 1)" in err


TEAM = """
apiVersion: draquota.io/v1alpha1
kind: ClusterDeviceQuota
metadata: {name: ml-team}
spec:
  namespaceSelector: {matchLabels: {team.draquota.io/name: ml}}
  hard: {devices: 2}
---
apiVersion: v1
kind: Namespace
metadata: {name: ml-dev, labels: {team.draquota.io/name: ml}}
---
apiVersion: v1
kind: Namespace
metadata: {name: ml-train, labels: {team.draquota.io/name: ml}}
---
apiVersion: v1
kind: Namespace
metadata: {name: web}
"""


def _claim(namespace: str, name: str) -> str:
    return (f"---\napiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
            "spec: {devices: {requests: [{name: r, exactly: {deviceClassName: gpu.example.com}}]}}\n")


def test_a_team_quota_limits_its_namespaces_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "team.yaml").write_text(TEAM + "---\napiVersion: resource.k8s.io/v1\nkind: DeviceClass\n"
                                        "metadata: {name: gpu.example.com}\nspec: {}\n"
                                        + _claim("ml-dev", "a") + _claim("ml-train", "b") + _claim("ml-train", "c")
                                        + _claim("web", "d"))
    data = check_json(capsys, str(tmp_path))
    decisions = {(o["namespace"], o["name"]): (o["allowed"], o["reason"]) for o in data["objects"]}
    assert decisions[("ml-dev", "a")][0] and decisions[("ml-train", "b")][0] and decisions[("web", "d")][0]
    assert decisions[("ml-train", "c")] == (False, advised('exceeded ClusterDeviceQuota "ml-team": requested '
                                                           "devices=1, used devices=0, reserved devices=2, limited "
                                                           "devices=2", "reserved", namespace="ml-train"))
    (team,) = data["quotas"]
    assert team == {"kind": "ClusterDeviceQuota", "namespace": "", "name": "ml-team", "hard": {"devices": 2},
                    "used": {"memory": 0, "devices": 0}, "reserved": {"memory": 0, "devices": 2},
                    "namespaces": [
                        {"namespace": "ml-dev", "used": {"memory": 0, "devices": 0}, "reserved": {"memory": 0, "devices": 1}},
                        {"namespace": "ml-train", "used": {"memory": 0, "devices": 0},
                         "reserved": {"memory": 0, "devices": 1}}]}
    code, out, _ = run(capsys, "check", "-f", str(tmp_path))
    assert code == 0 and any(line.startswith("ml-team") and "(cluster)" in line for line in out.splitlines())


def test_a_team_selector_on_a_tenants_label_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.yaml").write_text(TEAM.replace("team.draquota.io/name: ml}}", "team: ml}}", 1))
    code, _, err = run(capsys, "check", "-f", str(tmp_path))
    assert code == 2 and "may use only the label keys kubernetes.io/metadata.name and team.draquota.io/*" in err
