"""`dra-quota check` as a CI gate reads it: exit statuses, what it says when no
quota applies, typo'd kinds, typed Lists and unknown fields.

Through `commands.cli.main`, as a pipeline runs the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .builders import exactly, make_class, make_claim, make_device, make_quota, make_slice, request
from .quota.reports.test_check import EXAMPLES, run

CLASS = make_class("gpu", 'device.driver == "gpu.example.com"')
SLICE = make_slice("node-1", [make_device("d0"), make_device("d1")])


def write(path: Path, *objects: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(objects))
    return str(path)


def claim(name: str, namespace: str = "team-a", **body: Any) -> dict[str, Any]:
    return make_claim(name, request("gpu", body or exactly("gpu")), namespace=namespace)


# -- exit statuses ------------------------------------------------------------------------------


def test_fail_on_deny_exits_1_when_anything_is_denied(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "-f", str(EXAMPLES), "--fail-on-deny")
    assert code == 1 and "DENIED" in out  # the report is printed either way
    assert err.strip().endswith("error: 6 of 24 claims and templates denied (--fail-on-deny)")
    assert run(capsys, "check", "-f", str(EXAMPLES))[0] == 0  # without the flag: it ran


def test_fail_on_deny_exits_0_when_everything_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "ok.yaml", CLASS, SLICE, make_quota("gpus", memory="160Gi"), claim("a"))
    assert run(capsys, "check", "-f", path, "--fail-on-deny")[0] == 0


def test_unreadable_input_stays_2_with_fail_on_deny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("kind: [")
    assert run(capsys, "check", "-f", str(tmp_path / "bad.yaml"), "--fail-on-deny")[0] == 2


# -- no quota applies ---------------------------------------------------------------------------


def test_a_claim_no_quota_counts_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scoped = make_quota("other", namespace="team-b", memory="1Gi")
    scoped["spec"]["deviceClassNames"] = ["another-class"]
    path = write(tmp_path / "in.yaml", CLASS, SLICE, scoped, claim("free", namespace="team-c"),
                 claim("unscoped", namespace="team-b"))
    code, out, _ = run(capsys, "check", "-f", path)
    rows = {line.split()[2]: line for line in out.splitlines()[1:] if line.startswith("ResourceClaim")}
    assert code == 0
    assert rows["free"].endswith("no DeviceQuota in namespace team-c: no quota applies")
    assert rows["unscoped"].endswith("no DeviceQuota of namespace team-b counts its device classes or devices: no quota applies")


# -- kinds --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("doc", "kind"), [
    ({**make_quota("gpus", memory="80Gi"), "kind": "DeviceQuotas"}, "DeviceQuotas"),
    ({"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuotaLis", "items": []}, "DeviceQuotaLis"),
    ({"apiVersion": "draquota.io/v1alpha1", "kind": "ClusterQuotaList",
      "items": [{"metadata": {"name": "team"}}]}, "ClusterQuota"),
])
def test_an_unknown_kind_of_our_group_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    doc: dict[str, Any], kind: str) -> None:
    """Skipped with a warning, a typo'd quota left every claim of its namespace allowed."""
    path = write(tmp_path / "q.yaml", CLASS, doc, claim("a"))
    code, out, err = run(capsys, "check", "-f", path)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {path}:") and f"unknown kind '{kind}' in draquota.io: dra-quota knows " \
                                                 "DeviceQuota" in err


def typed_list(kind: str, api_version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """As the API server (`kubectl get --raw`) and client libraries print a collection:
    its items carry neither kind nor apiVersion."""
    bare = [{k: v for k, v in item.items() if k not in ("kind", "apiVersion")} for item in items]
    return {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": "7"}, "items": bare}


@pytest.mark.parametrize("form", ["yaml", "json", "json, apiVersion last", "json, kubectl's key order"])
def test_typed_lists_are_read_like_kind_list(tmp_path: Path, capsys: pytest.CaptureFixture[str], form: str) -> None:
    slices = typed_list("ResourceSliceList", "resource.k8s.io/v1", [SLICE])
    quotas = typed_list("DeviceQuotaList", "draquota.io/v1alpha1", [make_quota("gpus", memory="80Gi")])
    paths = []
    for name, value in (("slices", slices), ("quotas", quotas)):
        if form == "yaml":
            paths.append(write(tmp_path / f"{name}.yaml", value))
            continue
        if form == "json, apiVersion last":
            value = {k: v for k, v in value.items() if k != "apiVersion"} | {"apiVersion": value["apiVersion"]}
        text = json.dumps(value, sort_keys=form.endswith("order"), indent=2)
        (tmp_path / f"{name}.json").write_text(text)
        paths.append(str(tmp_path / f"{name}.json"))
    code, out, err = run(capsys, "check", "-f", write(tmp_path / "class.yaml", CLASS), "-f", *paths,
                         "-f", write(tmp_path / "claims.yaml", claim("one"), claim("two")), "-o", "json")
    assert code == 0 and "skipped" not in err, err
    report = json.loads(out)
    assert [(o["name"], o["allowed"], o["requests"][0]["candidates"]) for o in report["objects"]] == [
        ("one", True, 2), ("two", False, 2)]
    assert report["quotas"][0]["used"] == {"memory": 0, "devices": 0}


# -- unknown fields -----------------------------------------------------------------------------


def test_a_misspelt_claim_field_is_named_as_the_api_server_names_it(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "c.yaml", CLASS, SLICE, claim("typo", deviceClassname="gpu"))
    code, out, _ = run(capsys, "check", "-f", path, "-o", "json")
    (obj,) = json.loads(out)["objects"]
    assert (code, obj["allowed"]) == (0, False)
    assert obj["reason"] == ('invalid ResourceClaim: strict decoding error: unknown field '
                             '"spec.devices.requests[0].exactly.deviceClassname"')


@pytest.mark.parametrize(("doc", "named"), [
    ({**CLASS, "spec": {"selector": [{"cel": {"expression": "true"}}]}}, 'DeviceClass gpu: strict decoding error: '
     'unknown field "spec.selector"'),
    (make_slice("s", [{**make_device("d0"), "capacity": {"memory": {"vaule": "80Gi"}}}]),
     'ResourceSlice s: strict decoding error: unknown field "spec.devices[0].capacity.memory.vaule"'),
    ({**make_quota("gpus", memory="80Gi"), "spec": {"hrad": {"memory": "80Gi"}}},
     'DeviceQuota gpus: strict decoding error: unknown field "spec.hrad"'),
])
def test_an_unknown_field_in_the_clusters_state_stops_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             doc: dict[str, Any], named: str) -> None:
    path = write(tmp_path / "state.yaml", doc)
    code, out, err = run(capsys, "check", "-f", path)
    # The line of the unknown field, not the document's first.
    unknown = named.rpartition(".")[2].rstrip('"')
    (line,) = [i + 1 for i, text in enumerate(Path(path).read_text().splitlines()) if f"{unknown}:" in text]
    assert (code, out) == (2, "") and err == f"error: {path}:{line} (document 1): {named}\n"


# -- what a gate needs said plainly -------------------------------------------------------------


def test_claims_without_any_device_class_say_no_device_classes_were_loaded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "claims.yaml", claim("a"))
    code, _, err = run(capsys, "check", "-f", path)
    assert code == 0 and "warning: no DeviceClasses were loaded" in err
    code, out, _ = run(capsys, "check", "-f", path, "-o", "json")
    assert any(w.startswith("no DeviceClasses were loaded") for w in json.loads(out)["warnings"])
    with_class = write(tmp_path / "both.yaml", CLASS, SLICE, claim("a"))
    assert "no DeviceClasses" not in run(capsys, "check", "-f", with_class)[2]


BAD_SELECTOR = 'device.driver == '


def test_a_quota_whose_selector_does_not_compile_fails_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quota = make_quota("gpus", memory="160Gi", selectors=[BAD_SELECTOR])
    path = write(tmp_path / "quota.yaml", CLASS, SLICE, quota)
    code, _, err = run(capsys, "check", "-f", path)
    assert code == 0 and "DeviceQuota team-a/gpus selects every device" in err
    code, out, err = run(capsys, "check", "-f", path, "--fail-on-deny", "-o", "json")
    assert code == 1 and "1 quota selectors do not compile (--fail-on-deny)" in err
    assert len(json.loads(out)["invalidQuotas"]) == 1


def test_cel_errors_print_readably_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quota = make_quota("gpus", memory="160Gi", selectors=[BAD_SELECTOR])
    bad = make_claim("bad", request("gpu", exactly("gpu", 'device.attributes["x"].model ==')))
    path = write(tmp_path / "in.yaml", CLASS, SLICE, quota, bad)
    _, out, err = run(capsys, "check", "-f", path)
    assert "\\x0a" not in err and "\\x0a" not in out
    assert ("DeviceQuota team-a/gpus selects every device, as its selector does not compile: "
            "spec.devices.selectors[0].cel.expression: compilation failed: ERROR: <input>:1:15: Syntax error: "
            "mismatched input '<EOF>' in 'device.driver =='") in err
    row = next(line for line in out.splitlines() if line.startswith("ResourceClaim") and " bad " in line)
    assert "mismatched input '<EOF>' in 'device.attributes[\"x\"].model =='" in row


def test_the_json_says_which_objects_were_allocated(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", "-f", str(EXAMPLES), "-o", "json")
    got = {o["name"]: o for o in json.loads(out)["objects"]}
    assert got["gpu-health-probe"]["allocated"] is True and got["h200-pair"]["allocated"] is False


# -- locations ----------------------------------------------------------------------------------

SLICE_WITH_A_NEGATIVE = """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: node-7}
spec:
  driver: gpu.example.com
  nodeName: node-7
  pool: {name: node-7, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    capacity:
      memory: {value: 80Gi}
  - name: gpu-1
    capacity:
      memory: {value: -80Gi}
"""


def test_an_error_points_at_the_line_of_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dump.yaml"
    path.write_text(SLICE_WITH_A_NEGATIVE)
    code, _, err = run(capsys, "check", "-f", str(path))
    assert code == 2 and err.startswith(f"error: {path}:18 (document 2): "), err  # the `memory:` of gpu-1
    assert "spec.devices[1] (gpu-1).capacity['memory'].value: must not be negative" in err


def test_a_warning_points_at_the_selector_that_does_not_compile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quota = make_quota("gpus", memory="160Gi", selectors=['device.driver == "gpu.example.com"', BAD_SELECTOR])
    path = write(tmp_path / "quota.yaml", quota)
    lines = Path(path).read_text().splitlines()
    expression = [i + 1 for i, line in enumerate(lines) if BAD_SELECTOR.strip() in line and "==" in line]
    code, _, err = run(capsys, "check", "-f", path)
    assert code == 0 and f"warning: {path}:{expression[-1]} (document 1): DeviceQuota team-a/gpus selects" in err


def test_stdin_keeps_the_line_of_its_document(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    piped = tmp_path / "piped.yaml"
    piped.write_text(SLICE_WITH_A_NEGATIVE)
    # A file named like the source in the current folder: stdin is never read again.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stdin").write_text(SLICE_WITH_A_NEGATIVE.replace("apiVersion", "# a decoy\napiVersion"))
    with open(piped) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        code, _, err = run(capsys, "check", "-f", "-")
    assert code == 2 and err.startswith("error: stdin:5 (document 2): "), err


def test_the_gate_over_a_dump_of_the_cluster_state_decides_as_the_examples(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's gate offline: the state as one `kind: List` of mixed kinds, as `kubectl
    get deviceclasses,resourceslices,namespaces,devicequotas,clusterdevicequotas -A -o json`
    prints it, then the claims (tests/e2e/test_check_gate.py runs it against an API server)."""
    state = [doc for name in ("00-deviceclasses.yaml", "10-nvidia-slices.yaml", "20-amd-slices.yaml", "30-teams.yaml")
             for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]
    dump = tmp_path / "state.json"
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": state}))
    claims = str(EXAMPLES / "40-claims.yaml")
    code, out, err = run(capsys, "check", "-f", str(dump), "-f", claims, "-o", "json", "--fail-on-deny")
    expected = json.loads(run(capsys, "check", "-f", str(EXAMPLES), "-o", "json")[1])["objects"]
    assert code == 1 and "no DeviceClasses were loaded" not in err
    assert [(o["name"], o["allowed"]) for o in json.loads(out)["objects"]] == [
        (o["name"], o["allowed"]) for o in expected]
    # Without the state, what the README's old gate did: every claim "class not found".
    code, out, err = run(capsys, "check", "-f", claims, "-o", "json")
    assert "warning: no DeviceClasses were loaded" in err
    pending = [o for o in json.loads(out)["objects"] if not o["allocated"]]
    assert all(not o["allowed"] for o in pending)
    assert [o["name"] for o in pending if "not found" not in o["reason"]] == ["debug-h100", "h200-debug"]
