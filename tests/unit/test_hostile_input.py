"""Hostile input, class by class: each gets our own error naming the field, never a traceback.

Mirrors the hostile selectors' classes (tests/unit/quota/cel/test_hostile.py) for the
parsers: Python's limits (huge integers and strings), wrong types in metadata, values the
API server would refuse, unknown apiVersions, output that could lie, and claims no device
can price. Each row asserts the exact outcome.
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from commands.checkcommand import render_table
from commands.cli import main
from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.devices.memorysources import NO_SOURCES, MemorySources
from quota.objects.claims import parse_claim, parse_device_class
from quota.objects.claimspec import ClaimError
from quota.objects.slices import SliceError
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import QuotaError, parse_device_quota
from quota.reports.check import ObjectResult, Report
from quota.values.meta import NamespaceError, parse_namespace
from quota.values.model import ZERO, DeviceClassName
from quota.values.quantity import QuantityError, parse_amount, parse_quantity

from .builders import (
    exactly,
    first_available,
    make_class,
    make_claim,
    make_device,
    make_quota,
    make_slice,
    request,
    result,
)

HUGE = 10**4400
Mutation = Callable[[dict[str, Any]], object]


def slice_() -> dict[str, Any]:
    return make_slice("s", [make_device("gpu-0"), make_device("gpu-1", shared=True, policy={
        "default": "1Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}})])


SLICE_CASES: list[tuple[str, Mutation, str]] = [
    ("huge generation", lambda s: s["spec"]["pool"].update(generation=HUGE), "generation must be at most"),
    ("negative generation", lambda s: s["spec"]["pool"].update(generation=-1), "generation must be at least 0"),
    ("zero slice count", lambda s: s["spec"]["pool"].update(resourceSliceCount=0), "resourceSliceCount must be at least 1"),
    ("huge slice count", lambda s: s["spec"]["pool"].update(resourceSliceCount=HUGE), "resourceSliceCount must be at most"),
    ("bool count", lambda s: s["spec"]["pool"].update(resourceSliceCount=True), "must be an integer, got True"),
    ("huge quantity string", lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": "1" * 4301 + "Gi"}),
     "is longer than 64 characters"),
    ("huge quantity int", lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": HUGE}), "out of range"),
    ("int64 overflow", lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": "8Ei"}),
     "magnitude must be at most 2^63-1"),
    ("negative capacity", lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": "-500Gi"}),
     "must not be negative"),
    ("huge int attribute", lambda s: s["spec"]["devices"][0]["attributes"].update(n={"int": HUGE}), "out of the int64 range"),
    ("long string attribute", lambda s: s["spec"]["devices"][0]["attributes"].update(n={"string": "x" * 65}),
     "at most 64 characters"),
    ("bad attribute name", lambda s: s["spec"]["devices"][0]["attributes"].update({"a b": {"int": 1}}), "C identifier"),
    ("non-string attribute name", lambda s: s["spec"]["devices"][0]["attributes"].update({7: {"int": 1}}), "must be a string"),
    ("duplicate device", lambda s: s["spec"]["devices"].append(make_device("gpu-0")), "duplicate device name 'gpu-0'"),
    ("device name not a DNS label", lambda s: s["spec"]["devices"][0].update(name="GPU_0"), "must be a DNS label"),
    ("129 devices", lambda s: s["spec"].update(devices=[make_device(f"d{i}") for i in range(129)]), "at most 128 items"),
    ("33 attributes", lambda s: s["spec"]["devices"][0]["attributes"].update({f"a{i}": {"int": i} for i in range(33)}),
     "must not exceed 32"),
    ("policy on an unshared device", lambda s: s["spec"]["devices"][0]["capacity"]["memory"].update(
        requestPolicy={"default": "1Gi"}), "allowMultipleAllocations must be true"),
    ("validValues not ascending", lambda s: s["spec"]["devices"][1]["capacity"]["memory"].update(
        requestPolicy={"default": "2Gi", "validValues": ["2Gi", "1Gi"]}), "sorted in ascending order"),
    ("validValues duplicated", lambda s: s["spec"]["devices"][1]["capacity"]["memory"].update(
        requestPolicy={"default": "1Gi", "validValues": ["1Gi", "1Gi"]}), "unique"),
    ("default outside validValues", lambda s: s["spec"]["devices"][1]["capacity"]["memory"].update(
        requestPolicy={"default": "3Gi", "validValues": ["1Gi", "2Gi"]}), "is not one of validValues"),
    ("min above max", lambda s: s["spec"]["devices"][1]["capacity"]["memory"]["requestPolicy"].update(
        default="10Gi", validRange={"min": "10Gi", "max": "2Gi"}), "min is larger than max"),
    ("zero step", lambda s: s["spec"]["devices"][1]["capacity"]["memory"]["requestPolicy"]["validRange"].update(step="0"),
     "step: must be greater than zero"),
    ("default off-step", lambda s: s["spec"]["devices"][1]["capacity"]["memory"]["requestPolicy"].update(default="1.5Gi"),
     "not min plus a whole number of steps"),
    ("metadata a string", lambda s: s.update(metadata="s"), "metadata must be a map"),
    ("labels a list", lambda s: s["metadata"].update(labels=["a"]), "metadata.labels must be a map"),
    ("name not a string", lambda s: s["metadata"].update(name=["s"]), "metadata.name must be a string"),
    ("v1alpha3", lambda s: s.update(apiVersion="resource.k8s.io/v1alpha3"),
     "apiVersion 'resource.k8s.io/v1alpha3' is not supported: use resource.k8s.io/v1 (dra-quota also reads "),
    ("v1 devices labelled v1beta1", lambda s: s.update(apiVersion="resource.k8s.io/v1beta1"),
     "attributes: unknown field in resource.k8s.io/v1beta1, which keeps it under basic"),
    ("no apiVersion", lambda s: s.pop("apiVersion"), "with no apiVersion is not supported"),
    ("two node scopes", lambda s: s["spec"].update(allNodes=True), "exactly one of nodeName"),
]


@pytest.mark.parametrize(("mutate", "message"), [c[1:] for c in SLICE_CASES], ids=[c[0] for c in SLICE_CASES])
def test_hostile_slices_are_refused_by_field(mutate: Mutation, message: str) -> None:
    raw = slice_()
    mutate(raw)
    with pytest.raises(SliceError, match=message.replace("(", r"\(").replace("^", r"\^")):
        Inventory().add_or_update_slice(raw)


def claim_() -> dict[str, Any]:
    return make_claim("c", request("r", exactly("gpu", capacity={"memory": "1Gi"})),
                      allocation=[result("r", "gpu-0", consumed={"memory": "1Gi"})])


CLAIM_CASES: list[tuple[str, Mutation, str]] = [
    ("negative consumedCapacity", lambda c: c["status"]["allocation"]["devices"]["results"][0].update(
        consumedCapacity={"memory": "-500Gi"}), "consumedCapacity\\[memory\\]: must not be negative"),
    ("negative capacity request", lambda c: c["spec"]["devices"]["requests"][0]["exactly"]["capacity"].update(
        requests={"memory": "-1Gi"}), "capacity.requests\\[memory\\]: must not be negative"),
    ("huge count", lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=HUGE), "count must be at most"),
    ("negative count", lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=-3), "count must be at least 1"),
    ("count with All", lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=2, allocationMode="All"),
     "must not be specified when allocationMode is All"),
    ("33 requests", lambda c: c["spec"]["devices"].update(
        requests=[request(f"r{i}", exactly("gpu")) for i in range(33)]), "at most 32 items"),
    ("duplicate request names", lambda c: c["spec"]["devices"]["requests"].append(request("r", exactly("gpu"))),
     "duplicate name 'r'"),
    ("9 subrequests", lambda c: c["spec"]["devices"].update(requests=[first_available(
        "f", *((f"s{i}", exactly("gpu")) for i in range(9)))]), "at most 8 items"),
    ("33 selectors", lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(
        selectors=[{"cel": {"expression": "true"}}] * 33), "at most 32 items"),
    ("33 results", lambda c: c["status"]["allocation"]["devices"].update(
        results=[result("r", f"gpu-{i}") for i in range(33)]), "at most 32 items"),
    ("request name not a label", lambda c: c["spec"]["devices"]["requests"][0].update(name="R\n"),
     "must be a DNS label"),
    ("class name not a subdomain", lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(
        deviceClassName="Gpu!"), "must be a DNS subdomain"),
    ("bad capacity name", lambda c: c["spec"]["devices"]["requests"][0]["exactly"]["capacity"].update(
        requests={"x/y/z": "1"}), "C identifier"),
    ("namespace not a string", lambda c: c["metadata"].update(namespace=7), "metadata.namespace must be a string"),
    ("uid not a string", lambda c: c["metadata"].update(uid={"a": 1}), "metadata.uid must be a string"),
    ("annotations a list", lambda c: c["metadata"].update(annotations=["x"]), "metadata.annotations must be a map"),
    ("annotation value not a string", lambda c: c["metadata"].update(annotations={"a": 1}), "must be a string"),
    ("label value with a newline", lambda c: c["metadata"].update(labels={"a": "b\nc"}), "not a valid label value"),
    ("v1alpha3", lambda c: c.update(apiVersion="resource.k8s.io/v1alpha3"), "is not supported: use resource.k8s.io/v1"),
    ("v1 requests labelled v1beta1", lambda c: c.update(apiVersion="resource.k8s.io/v1beta1"),
     "exactly: unknown field in resource.k8s.io/v1beta1, which writes deviceClassName"),
    ("status a string", lambda c: c.update(status="x"), "status must be an object"),
]


@pytest.mark.parametrize(("mutate", "message"), [c[1:] for c in CLAIM_CASES], ids=[c[0] for c in CLAIM_CASES])
def test_hostile_claims_are_refused_by_field(mutate: Mutation, message: str) -> None:
    raw = claim_()
    mutate(raw)
    with pytest.raises(ClaimError, match=message):
        parse_claim(raw)


@pytest.mark.parametrize("annotation", [
    "1" * 300, '{"memory": ' + "9" * 30 + ', "devices": 1}', "[" * 200 + "]" * 200, '{"memory": -1, "devices": 1}',
    '{"memory": NaN, "devices": 1}', '{"memory": 1.5, "devices": 1}', '{"memory": true, "devices": 1}', "\ud800",
])
def test_a_charge_annotation_that_is_not_ours_is_ignored(annotation: str) -> None:
    raw = claim_()
    raw["metadata"]["annotations"] = {"draquota.io/charge": annotation}
    assert parse_claim(raw).recorded_charge is None


QUOTA_CASES: list[tuple[str, Mutation, str]] = [
    ("non-string hard key", lambda q: q["spec"]["hard"].update({1: "1Gi"}), "unsupported resource\\(s\\) 1"),
    ("huge devices", lambda q: q["spec"]["hard"].update(devices=HUGE), "devices must be at most"),
    ("negative devices", lambda q: q["spec"]["hard"].update(devices=-1), "devices must be at least 0"),
    ("devices as a quantity", lambda q: q["spec"]["hard"].update(devices="2"), "devices must be an integer"),
    ("huge memory", lambda q: q["spec"]["hard"].update(memory="1" * 4301), "longer than 64"),
    ("negative memory", lambda q: q["spec"]["hard"].update(memory="-1Gi"), "must not be negative"),
    ("metadata a string", lambda q: q.update(metadata="x"), "metadata must be a map"),
    ("wrong version", lambda q: q.update(apiVersion="draquota.io/v1"), "dra-quota reads DeviceQuota draquota.io/v1alpha1"),
    ("class name a list", lambda q: q["spec"].update(deviceClassNames=[["gpu"]]), "must be a string"),
]


@pytest.mark.parametrize(("mutate", "message"), [c[1:] for c in QUOTA_CASES], ids=[c[0] for c in QUOTA_CASES])
def test_hostile_quotas_are_refused_by_field(mutate: Mutation, message: str) -> None:
    raw = make_quota("q", memory="1Gi", devices=2)
    mutate(raw)
    with pytest.raises(QuotaError, match=message):
        parse_device_quota(raw)


@pytest.mark.parametrize(("raw", "message"), [
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "labels": ["x"]}}, "labels must be a map"),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a", "labels": {"k": 1}}}, "must be a string"),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": "a"}, "metadata must be a map"),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}}, "must be a DNS label"),
    ({"apiVersion": "v2", "kind": "Namespace", "metadata": {"name": "a"}}, "dra-quota reads Namespace v1 only"),
])
def test_hostile_namespaces_are_refused_by_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(NamespaceError, match=message):
        parse_namespace(raw)


def test_device_class_rules() -> None:
    raw = make_class("gpu", *(["true"] * 33))
    with pytest.raises(ClaimError, match="at most 32 items"):
        parse_device_class(raw)
    with pytest.raises(ClaimError, match="at most 10240 characters"):
        parse_device_class(make_class("gpu", "x" * 10241))


@pytest.mark.parametrize("value", ["1" * 4301, "1e" + "9" * 4301, HUGE, float("inf"), "0x10", "1Gi\n1"],
                         ids=["digits", "exponent", "int", "inf", "hex", "newline"])
def test_quantities_never_leak_python_limits(value: Any) -> None:
    with pytest.raises(QuantityError):
        parse_amount(value)


def test_quantities_round_up_to_nano_like_apimachinery() -> None:
    assert parse_quantity("0.0000000001") * 10**9 == 1
    assert parse_quantity("-0.0000000001") * 10**9 == -1
    assert parse_quantity("9999999999999999999999999999999999999G") > 2**63  # CEL's quantity() stays unbounded


# -- check end to end ---------------------------------------------------------------


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *docs: dict[str, Any] | str,
        output: str = "json") -> tuple[int, str, str]:
    path = tmp_path / "in.json"
    path.write_text("\n".join(d if isinstance(d, str) else json.dumps(d) for d in docs))
    code = main(["check", "-f", str(path), "-o", output])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_v1alpha3_slice_stops_check_naming_file_document_kind_and_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alpha = {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourceSlice", "metadata": {"name": "s"},
             "spec": {"driver": "d", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "nodeName": "n",
                      "devices": [{"name": "g", "basic": {"capacity": {"memory": {"value": "80Gi"}}}}]}}
    code, out, err = run(tmp_path, capsys, alpha)
    assert code == 2 and out == ""
    assert str(tmp_path / "in.json") in err and "(document 1)" in err
    assert "ResourceSlice with apiVersion 'resource.k8s.io/v1alpha3' is not supported: use resource.k8s.io/v1" in err


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_a_claim_of_an_unknown_version_stops_check(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    claim = make_claim("c", request("r", exactly("gpu")), kind=kind)
    claim["apiVersion"] = "resource.k8s.io/v1beta3"
    code, _, err = run(tmp_path, capsys, claim)
    assert code == 2 and f"{kind} with apiVersion 'resource.k8s.io/v1beta3' is not supported: use resource.k8s.io/v1" in err


@pytest.mark.parametrize(("doc", "message"), [
    (make_quota("q", memory="-500Gi"), "spec.hard.memory: must not be negative"),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "labels": ["a"]}}, "metadata.labels must be a map"),
    ({"apiVersion": "v1", "kind": "Namespace", "metadata": "n"}, "Namespace: metadata must be a map"),
    ('{"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "metadata": {"name": "q", "namespace": "n"}, '
     '"spec": {"hard": {"devices": ' + "9" * 4301 + '}}}', ""),
])
def test_bad_objects_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: Any, message: str) -> None:
    code, out, err = run(tmp_path, capsys, doc)
    assert code == 2 and out == "" and err.startswith("error: ") and message in err
    assert "Traceback" not in err


def test_negative_consumed_capacity_denies_the_claim_instead_of_admitting_over_quota(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    allocated = make_claim("a", request("r", exactly("gpu")), namespace="team-a",
                           allocation=[result("r", "gpu-0", consumed={"memory": "-500Gi"})])
    code, out, _ = run(tmp_path, capsys, make_class("gpu"), slice_(), make_quota("q", memory="80Gi"), allocated)
    assert code == 0
    obj = json.loads(out)["objects"][0]
    assert obj["allowed"] is False and "consumedCapacity[memory]: must not be negative" in obj["reason"]
    assert json.loads(out)["quotas"][0]["used"] == {"memory": 0, "devices": 0}


FORGERY = "x\n\x1b[31mResourceClaim  team-a  fake  allowed\u202e\ud800"


def test_names_and_reasons_cannot_forge_table_rows() -> None:
    report = Report(
        objects=[ObjectResult("ResourceClaim", FORGERY, FORGERY, False, FORGERY, (FORGERY,), ZERO, ())],
        quotas=[{"namespace": FORGERY, "name": FORGERY, "hard": {"memory": 1}, "used": {"memory": 0, "devices": 0},
                 "reserved": {"memory": 0, "devices": 0}}],
    )
    out = io.StringIO()
    render_table(report, out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[1].startswith("ResourceClaim") and "DENIED" in lines[1]
    for char in ("\x1b", "\u202e", "\ud800"):
        assert char not in out.getvalue() and ascii(char)[1:-1] in out.getvalue()


def test_warnings_on_stderr_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(tmp_path, capsys, {"apiVersion": "v1", "kind": FORGERY, "metadata": {"name": "x"}})
    assert code == 0 and len(err.splitlines()) == 1 and r"\x1b[31m" in err and "\x1b" not in err


def test_json_output_is_valid_utf8_with_lone_surrogates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claim = make_claim("c", request("r", exactly("gpu", FORGERY)))
    code, out, _ = run(tmp_path, capsys, json.dumps(claim))
    assert code == 0
    out.encode("utf-8")  # no lone surrogate survives
    assert "\\ud800" not in out and json.loads(out)["objects"][0]["allowed"] is False


# -- free claims -------------------------------------------------------------------

D = "gpu.example.com"


def admitter(*, enforcement: str | None = None, classes: list[str] | None = None,
             accelerators: bool = True) -> Admitter:
    # `accelerators`: the driver is a known accelerator driver (listed in the memory
    # sources, none applying), so its devices without a memory are unpriced, not NICs.
    inv = Inventory(MemorySources({D: ()}) if accelerators else NO_SOURCES)
    inv.add_or_update_slice(make_slice("s", [make_device("gpu-0", memory="80Gi"),
                                             make_device("nic-0", memory=None, attrs={"type": "nic"})], driver=D))
    cls = {DeviceClassName(n): parse_device_class(make_class(n, *sel)) for n, sel in {
        "gpu": ("device.attributes['gpu.example.com'].type == 'gpu'",),
        "nothing": ("false",),
        "nic": ("device.attributes['gpu.example.com'].type == 'nic'",),
    }.items()}
    adm = Admitter(Pricer(inv, cls), Ledger())
    adm.ledger.add_or_update_quota(parse_device_quota(
        make_quota("mem", memory="100Gi", enforcement=enforcement, classes=classes)))
    return adm


FREE_CASES = [
    ("class with no devices", request("r", exactly("nothing"))),
    ("class with memoryless devices", request("r", exactly("nic"))),
    ("All over memoryless devices", request("r", exactly("nic", mode="All"))),
    ("firstAvailable with an empty alternative", first_available("r", ("a", exactly("gpu")), ("b", exactly("nothing")))),
]


@pytest.mark.parametrize("req", [c[1] for c in FREE_CASES], ids=[c[0] for c in FREE_CASES])
@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_claims_no_device_can_price_are_denied_under_a_memory_quota(req: dict[str, Any], kind: str) -> None:
    adm = admitter()
    claim = parse_claim(make_claim("c", req, kind=kind))
    for _ in range(3):  # never admitted, however many are made
        admission = (adm.admit_template(claim, namespace_labels={}) if kind == "ResourceClaimTemplate"
                     else adm.admit_claim(claim, namespace_labels={}))
        assert not admission.allowed
        assert 'DeviceQuota "mem" limits memory but request r' in admission.reason
        assert "cannot be priced" in admission.reason and "A cluster admin can" in admission.reason
    assert adm.ledger.usage(claim.namespace, "mem").reserved.is_zero()


@pytest.mark.parametrize("req", [c[1] for c in FREE_CASES[1:3]], ids=[c[0] for c in FREE_CASES[1:3]])
def test_devices_of_no_accelerator_driver_without_memory_are_outside_a_quota_with_no_scope(
        req: dict[str, Any]) -> None:
    # Not an accelerator driver (no memory source lists it): an RDMA NIC, say. Free, and
    # not counted, under a quota with no scope; the class with no devices stays denied.
    adm = admitter(accelerators=False)
    claim = parse_claim(make_claim("c", req))
    admission = adm.admit_claim(claim, namespace_labels={})
    assert admission.allowed and admission.charge.is_zero() and admission.warnings == ()
    assert adm.ledger.usage(claim.namespace, "mem").pending_claims == 0
    assert not adm.admit_claim(parse_claim(make_claim("d", FREE_CASES[0][1])), namespace_labels={}).allowed


def test_audit_admits_unpriceable_claims_with_a_warning() -> None:
    adm = admitter(enforcement="Audit")
    admission = adm.admit_claim(parse_claim(make_claim("c", request("r", exactly("nothing")))), namespace_labels={})
    assert admission.allowed
    assert any("cannot be priced" in w and "enforcement: Audit, admitted" in w for w in admission.warnings)


def test_unpriceable_classes_out_of_the_quotas_scope_are_admitted() -> None:
    adm = admitter(classes=["gpu"])
    admission = adm.admit_claim(parse_claim(make_claim("c", request("r", exactly("nic")))), namespace_labels={})
    assert admission.allowed and admission.reason == ""


def test_a_request_matching_nothing_in_a_priced_class_is_charged_the_largest() -> None:
    adm = admitter()
    claim = parse_claim(make_claim("c", request("r", exactly("gpu", "device.attributes['gpu.example.com'].type == 'x'"))))
    admission = adm.admit_claim(claim, namespace_labels={})
    assert admission.allowed and admission.charge.memory == 80 * 2**30


def test_a_quota_without_a_memory_limit_admits_unpriceable_claims() -> None:
    adm = admitter()
    adm.ledger.delete_quota(adm.ledger.quotas()[0].namespace, "mem")
    adm.ledger.add_or_update_quota(parse_device_quota(make_quota("dev", devices=4)))
    admission = adm.admit_claim(parse_claim(make_claim("c", request("r", exactly("nothing")))), namespace_labels={})
    assert admission.allowed and admission.charge.devices == 1


def test_builders_stay_valid() -> None:
    """The hostile rows mutate valid objects: the bases themselves parse."""
    Inventory().add_or_update_slice(slice_())
    parse_claim(copy.deepcopy(claim_()))
