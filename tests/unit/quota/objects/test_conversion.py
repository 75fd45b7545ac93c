"""resource.k8s.io v1beta1/v1beta2 objects: converted to v1 as the API server does, priced alike.

Conversion rules: k/k v1.37 pkg/apis/resource/v1beta1/conversion.go and defaults.go
(see `quota.objects.conversion`). Shapes of the beta manifests come from what users copy:
- k/k v1.37 test/e2e/dra/utils/builder.go `claimSpecWithV1beta1` (a request that names
  only its class) and test/e2e/dra/dra.go "supports requests with alternatives"
  (firstAvailable with counts 2 and 1 under v1beta1);
- the GKE custom-compute-class GPU tutorial's v1beta1 ResourceClaimTemplate
  (`deviceClassName: gpu.nvidia.com`, `allocationMode: All`);
- Intel's QAT resource driver README (v1beta1 template with a CEL selector);
- NVIDIA/k8s-dra-driver-gpu demo/specs/quickstart/gpu-test-count.yaml (v1beta1 template,
  `deviceClassName: gpu.nvidia.com`, `count: 2`);
- a network-DRA KEP's v1beta1 ResourceSlice (`devices[].basic.attributes`) and its
  claim written with `exactly:` under v1beta1, which the API server refuses in strict
  mode and we refuse by name;
- examples/ (this repo) written back as v1beta1 and v1beta2 by tests/unit/betas.py.
The end-to-end comparisons run `dra-quota check -o json` as a process on the beta and
the v1 files and compare the whole JSON.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from commands.cli import main
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim
from quota.objects.claimspec import ClaimError
from quota.objects.conversion import as_v1
from quota.objects.slices import SliceError

from ...betas import downgrade

ROOT = Path(__file__).resolve().parents[4]
EXAMPLES = ROOT / "examples"
BETA_EXAMPLES = Path(__file__).resolve().parent / "beta-examples"
B1, B2, V1 = "resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1"


def claim(version: str, *requests: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": version, "kind": "ResourceClaim",
                           "metadata": {"name": "c", "namespace": "team-a"},
                           "spec": {"devices": {"requests": list(requests)}}}
    if status is not None:
        obj["status"] = status
    return obj


def slice_spec(version: str, spec: dict[str, Any]) -> dict[str, Any]:
    base = {"driver": "gpu.nvidia.com", "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1}}
    return {"apiVersion": version, "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": {**base, **spec}}


CEL = {"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
CAPACITY = {"memory": {"value": "80Gi", "requestPolicy": {"default": "10Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}
ATTRS = {"type": {"string": "gpu"}, "cudaComputeCapability": {"version": "9.0.0"}}
TAINT = {"key": "maintenance", "value": "true", "effect": "NoSchedule"}
ALLOCATION = {"allocation": {"devices": {"results": [
    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0",
     "shareID": "2c5d2c5e-1111-4d2e-9c67-6a1f2b3c4d5e", "consumedCapacity": {"memory": "20Gi"}}]}}}
SUBREQUESTS = [{"name": "sub-request-1", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
               {"name": "sub-request-2", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}]

# (id, beta object, the v1 object the API server would store)
CONVERSIONS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("class only: v1beta1 defaults fill mode and count (e2e claimSpecWithV1beta1)",
     claim(B1, {"name": "my-request", "deviceClassName": "gpu.nvidia.com"}),
     claim(V1, {"name": "my-request", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                                                  "count": 1}})),
    ("All keeps no count (GKE compute-class tutorial)",
     claim(B1, {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}),
     claim(V1, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}})),
    ("every inline field moves under exactly",
     claim(B1, {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "selectors": [CEL], "count": 2, "adminAccess": True,
                "tolerations": [{"key": "maintenance", "operator": "Exists"}],
                "capacity": {"requests": {"memory": "20Gi"}}}),
     claim(V1, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [CEL], "count": 2,
                                           "adminAccess": True, "allocationMode": "ExactCount",
                                           "tolerations": [{"key": "maintenance", "operator": "Exists"}],
                                           "capacity": {"requests": {"memory": "20Gi"}}}})),
    ("firstAvailable converts unchanged (e2e 'supports requests with alternatives')",
     claim(B1, {"name": "request-1", "firstAvailable": SUBREQUESTS}),
     claim(V1, {"name": "request-1", "firstAvailable": SUBREQUESTS})),
    ("Go zero values are not 'set': no exactly beside firstAvailable",
     claim(B1, {"name": "r", "firstAvailable": SUBREQUESTS, "deviceClassName": "", "count": 0, "selectors": None}),
     claim(V1, {"name": "r", "firstAvailable": SUBREQUESTS})),
    ("adminAccess false is set: both exactly and firstAvailable, for validation to refuse",
     claim(B1, {"name": "r", "firstAvailable": SUBREQUESTS, "adminAccess": False}),
     claim(V1, {"name": "r", "firstAvailable": SUBREQUESTS, "exactly": {"adminAccess": False}})),
    ("allocation results read the same in all versions",
     claim(B1, {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 1}, status=ALLOCATION),
     claim(V1, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
                                           "count": 1}}, status=ALLOCATION)),
    ("template: spec.spec converted (Intel QAT driver README shape)",
     {"apiVersion": B1, "kind": "ResourceClaimTemplate", "metadata": {"name": "qat-template-sym"},
      "spec": {"metadata": {"labels": {"a": "b"}}, "spec": {"devices": {"requests": [
          {"name": "qat-request-sym", "deviceClassName": "qat.intel.com", "selectors": [CEL]}]}}}},
     {"apiVersion": V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "qat-template-sym"},
      "spec": {"metadata": {"labels": {"a": "b"}}, "spec": {"devices": {"requests": [
          {"name": "qat-request-sym", "exactly": {"deviceClassName": "qat.intel.com", "selectors": [CEL],
                                                  "allocationMode": "ExactCount", "count": 1}}]}}}}),
    ("slice: basic flattened, nodeName '' and empty lists dropped",
     slice_spec(B1, {"nodeName": "", "allNodes": True, "devices": [
         {"name": "gpu-0", "basic": {"attributes": ATTRS, "capacity": CAPACITY, "allowMultipleAllocations": True,
                                     "consumesCounters": [], "taints": [TAINT], "bindsToNode": True,
                                     "bindingConditions": ["ready"]}},
         {"name": "gpu-1", "basic": {"attributes": {}, "capacity": {"memory": {"value": "80Gi"}}}},
         {"name": "gpu-2"}]}),
     slice_spec(V1, {"allNodes": True, "devices": [
         {"name": "gpu-0", "attributes": ATTRS, "capacity": CAPACITY, "allowMultipleAllocations": True,
          "taints": [TAINT], "bindsToNode": True, "bindingConditions": ["ready"]},
         {"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}},
         {"name": "gpu-2"}]})),
    ("slice: allNodes false means unset",
     slice_spec(B1, {"nodeName": "node-1", "allNodes": False, "devices": []}),
     slice_spec(V1, {"nodeName": "node-1", "devices": []})),
    ("slice: sharedCounters and per-device node selection read the same",
     slice_spec(B1, {"perDeviceNodeSelection": True, "sharedCounters": [
         {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]}),
     slice_spec(V1, {"perDeviceNodeSelection": True, "sharedCounters": [
         {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]})),
    ("slice: consumesCounters and a device's own node move out of basic",
     slice_spec(B1, {"perDeviceNodeSelection": True, "devices": [{"name": "mig-0", "basic": {
         "nodeName": "node-1", "consumesCounters": [{"counterSet": "gpu-0-counters",
                                                     "counters": {"memory": {"value": "10Gi"}}}]}}]}),
     slice_spec(V1, {"perDeviceNodeSelection": True, "devices": [{"name": "mig-0", "nodeName": "node-1",
                                                                  "consumesCounters": [{
                                                                      "counterSet": "gpu-0-counters",
                                                                      "counters": {"memory": {"value": "10Gi"}}}]}]})),
    ("v1beta2 has the v1 shapes: only the version changes",
     claim(B2, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}),
     claim(V1, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}})),
    ("a v1 object is returned as it is",
     claim(V1, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}),
     claim(V1, {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}})),
]


@pytest.mark.parametrize(("beta", "expected"), [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS])
def test_conversion_to_v1(beta: dict[str, Any], expected: dict[str, Any]) -> None:
    before = copy.deepcopy(beta)
    assert as_v1(beta, beta["kind"], ClaimError) == expected
    assert beta == before  # the input is never modified


@pytest.mark.parametrize(("obj", "message"), [
    (claim("resource.k8s.io/v1alpha3", {"name": "r", "deviceClassName": "c"}),
     "ResourceClaim with apiVersion 'resource.k8s.io/v1alpha3' is not supported: use resource.k8s.io/v1 "
     "(dra-quota also reads resource.k8s.io/v1beta1 and resource.k8s.io/v1beta2"),
    (claim("resource.k8s.io/v1beta3", {"name": "r", "exactly": {"deviceClassName": "c"}}),
     "apiVersion 'resource.k8s.io/v1beta3' is not supported: use resource.k8s.io/v1"),
    ({"kind": "ResourceClaim", "metadata": {"name": "c"}}, "ResourceClaim with no apiVersion is not supported"),
    # The network-DRA KEP's claim: v1 `exactly:` under a v1beta1 apiVersion.
    (claim(B1, {"name": "network-request", "exactly": {"deviceClassName": "class-foo-net-blue"}}),
     "spec.devices.requests[0].exactly: unknown field in resource.k8s.io/v1beta1"),
])
def test_unsupported_versions_and_mixed_shapes_are_refused_by_name(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError) as err:
        parse_claim(obj)
    assert message in str(err.value)


@pytest.mark.parametrize(("spec", "message"), [
    ({"nodeName": "n", "devices": [{"name": "g", "capacity": {"memory": {"value": "80Gi"}}}]},
     "ResourceSlice s: spec.devices[0].capacity: unknown field in resource.k8s.io/v1beta1, which keeps it under basic"),
    ({"nodeName": "n", "devices": [{"name": "g", "basic": ["x"]}]},
     "ResourceSlice s: spec.devices[0].basic must be an object, got a list"),
    ({"nodeName": "", "devices": [{"name": "g", "basic": {}}]},
     "ResourceSlice s: spec: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required"),
])
def test_bad_v1beta1_slices_are_refused_by_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(SliceError) as err:
        Inventory().add_or_update_slice(slice_spec(B1, spec))
    assert message in str(err.value)


def test_invalid_converted_requests_are_refused_as_the_api_server_refuses_them() -> None:
    # Validation sees the converted object: the v1 path, as in the API server's message.
    with pytest.raises(ClaimError, match="exactly one of exactly or firstAvailable"):
        parse_claim(claim(B1, {"name": "r", "firstAvailable": SUBREQUESTS, "adminAccess": False}))
    with pytest.raises(ClaimError, match="exactly one of exactly or firstAvailable"):
        parse_claim(claim(B1, {"name": "r", "count": 0}))  # nothing set: neither
    with pytest.raises(ClaimError, match=r"requests\[0\].exactly.deviceClassName"):
        parse_claim(claim(B1, {"name": "r", "count": 2}))  # no class: not defaulted, required


def test_check_reports_conversion_errors_where_it_reports_parse_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A slice stops the run naming file, line, document, kind and field; a claim is denied."""
    bad_claim = claim(B1, {"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}})
    path = write_docs(tmp_path / "in.yaml", [bad_claim])
    assert main(["check", "-f", str(path), "-o", "json"]) == 0
    row = json.loads(capsys.readouterr().out)["objects"][0]
    assert not row["allowed"] and "invalid ResourceClaim: spec.devices.requests[0].exactly: unknown field" in row["reason"]
    bad_slice = slice_spec(B1, {"nodeName": "n", "devices": [{"name": "g", "basic": "x"}]})
    path = write_docs(tmp_path / "in.yaml", [UPSTREAM_V1BETA1[0], bad_slice])
    assert main(["check", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:")
    assert " (document 2): ResourceSlice s: spec.devices[0].basic must be an object, got 'x'" in err


# -- priced alike: `dra-quota check -o json` as a process --------------------------------


def check_json(*paths: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "commands.cli", "check", "-o", "json"]
    for path in paths:
        argv += ["-f", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def write_docs(path: Path, docs: list[Any]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def downgraded_examples(tmp_path: Path, version: str) -> Path:
    out = tmp_path / version
    out.mkdir()
    for source in sorted(EXAMPLES.glob("*.yaml")):
        docs = [downgrade(d, version) for d in yaml.safe_load_all(source.read_text()) if d is not None]
        write_docs(out / source.name, docs)
    return out


@pytest.fixture(scope="module")
def examples_v1() -> dict[str, Any]:
    return check_json(EXAMPLES)


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_the_examples_in_beta_versions_are_priced_exactly_as_in_v1(
        tmp_path: Path, examples_v1: dict[str, Any], version: str) -> None:
    beta = downgraded_examples(tmp_path, version)
    assert "apiVersion: resource.k8s.io/" + version in (beta / "40-claims.yaml").read_text()
    assert len(examples_v1["objects"]) == 24 and sum(o["charge"]["memory"] for o in examples_v1["objects"]) > 0
    assert check_json(beta) == examples_v1


def test_committed_beta_examples_are_priced_as_the_v1_examples(examples_v1: dict[str, Any]) -> None:
    """tests/unit/quota/objects/beta-examples: DeviceClasses in v1beta2, NVIDIA slices and claims in v1beta1.

    They are examples/ written back by tests/unit/betas.py; after editing examples/,
    regenerate them with `python -m tests.unit.quota.objects.test_conversion`.
    """
    files = [BETA_EXAMPLES / "00-deviceclasses.yaml", BETA_EXAMPLES / "10-nvidia-slices.yaml",
             EXAMPLES / "20-amd-slices.yaml", EXAMPLES / "30-teams.yaml", BETA_EXAMPLES / "40-claims.yaml"]
    assert "basic:" in files[1].read_text() and "apiVersion: resource.k8s.io/v1beta2" in files[0].read_text()
    assert check_json(*files) == examples_v1


UPSTREAM_V1BETA1 = [
    {"apiVersion": B1, "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
     "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}},
    slice_spec(B1, {"nodeName": "node-1", "devices": [
        {"name": f"gpu-{i}", "basic": {"attributes": {"type": {"string": "gpu"}},
                                       "capacity": {"memory": {"value": f"{40 * (i + 1)}Gi"}}}} for i in range(2)]}),
    {"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "metadata": {"name": "gpus", "namespace": "team-a"},
     "spec": {"hard": {"memory": "200Gi", "devices": 4}}},
    claim(B1, {"name": "my-request", "deviceClassName": "gpu.nvidia.com"},
          status={"allocation": {"devices": {"results": [
              {"request": "my-request", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}]}}}),
    {**claim(B1, {"name": "request-1", "firstAvailable": SUBREQUESTS}), "metadata": {"name": "alt", "namespace": "team-a"}},
    {"apiVersion": B1, "kind": "ResourceClaimTemplate", "metadata": {"name": "all-gpus", "namespace": "team-a"},
     "spec": {"spec": {"devices": {"requests": [
         {"name": "gpu", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}]}}}},
    {"apiVersion": B1, "kind": "ResourceClaimTemplate", "metadata": {"name": "double-gpu", "namespace": "team-a"},
     "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com", "count": 2}]}}}},
]
UPSTREAM_V1 = [
    {**UPSTREAM_V1BETA1[0], "apiVersion": V1},
    slice_spec(V1, {"nodeName": "node-1", "devices": [
        {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}},
         "capacity": {"memory": {"value": f"{40 * (i + 1)}Gi"}}} for i in range(2)]}),
    UPSTREAM_V1BETA1[2],
    claim(V1, {"name": "my-request", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
          status=UPSTREAM_V1BETA1[3]["status"]),
    {**claim(V1, {"name": "request-1", "firstAvailable": SUBREQUESTS}), "metadata": {"name": "alt", "namespace": "team-a"}},
    {"apiVersion": V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "all-gpus", "namespace": "team-a"},
     "spec": {"spec": {"devices": {"requests": [
         {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}},
    {"apiVersion": V1, "kind": "ResourceClaimTemplate", "metadata": {"name": "double-gpu", "namespace": "team-a"},
     "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                            "count": 2}}]}}}},
]


def test_upstream_v1beta1_shapes_are_priced_as_their_v1_equivalents(tmp_path: Path) -> None:
    beta = check_json(write_docs(tmp_path / "beta.yaml", UPSTREAM_V1BETA1))
    v1 = check_json(write_docs(tmp_path / "v1.yaml", UPSTREAM_V1))
    assert beta == v1
    charges = {o["name"]: (o["allowed"], o["charge"]) for o in v1["objects"]}
    Gi = 2**30
    assert charges == {
        "c": (True, {"memory": 40 * Gi, "devices": 1}),  # allocated gpu-0: used
        "alt": (True, {"memory": 160 * Gi, "devices": 2}),  # 2 x the 80Gi one; 40 + 160 <= 200
        # Templates reserve nothing: each could fit under hard but not now (a warning).
        "all-gpus": (True, {"memory": 120 * Gi, "devices": 2}),  # All: both GPUs of node-1
        "double-gpu": (True, {"memory": 160 * Gi, "devices": 2}),  # 2 x the largest candidate
    }
    assert ["do not fit now" in " ".join(o["warnings"]) for o in v1["objects"]] == [False, False, True, True]


def regenerate_committed_beta_examples() -> None:
    BETA_EXAMPLES.mkdir(exist_ok=True)
    for name, version in (("00-deviceclasses.yaml", "v1beta2"), ("10-nvidia-slices.yaml", "v1beta1"),
                          ("40-claims.yaml", "v1beta1")):
        docs = [downgrade(d, version) for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d is not None]
        header = (f"# examples/{name} written as resource.k8s.io/{version} by tests/unit/betas.py\n"
                  "# (regenerate: python -m tests.unit.quota.objects.test_conversion). `dra-quota check` converts it\n"
                  "# to v1 as the API server does and prices it exactly as the original.\n")
        (BETA_EXAMPLES / name).write_text(header + yaml.safe_dump_all(docs, sort_keys=False))


if __name__ == "__main__":
    regenerate_committed_beta_examples()
