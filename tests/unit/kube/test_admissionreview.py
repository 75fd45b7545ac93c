"""kube.admissionreview: every body gets a well-formed review; requests are read field by field."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube.admissionreview import AdmissionRequest, ReviewError, Verdict, parse_review, respond

from ..bounds import bounded, fuzz_examples
from ..quota.objects.test_fuzz_parsers import paths, splice, values

REVIEW: dict[str, Any] = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
        "requestKind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "name": "gpu-x7k2q",
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": "alice", "uid": "u-1", "groups": ["team-a", "system:authenticated"],
                     "extra": {"scopes.authorization.openshift.io": ["user:full"], "authentication.kubernetes.io/pod-name": ["p"]}},
        "object": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu-x7k2q"}},
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    },
}


def review(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(REVIEW)
    for key, value in changes.items():
        out["request"][key] = value
    return out


def test_a_request_is_read_whole() -> None:
    request = parse_review(review(subResource="status", dryRun=True))
    assert request.uid == REVIEW["request"]["uid"]
    assert (request.kind.kind, request.resource.resource, request.sub_resource) == ("ResourceClaim", "resourceclaims", "status")
    assert (request.name, request.namespace, request.operation, request.dry_run) == ("gpu-x7k2q", "team-a", "CREATE", True)
    assert request.user.extra == (("authentication.kubernetes.io/pod-name", ("p",)),
                                  ("scopes.authorization.openshift.io", ("user:full",)))
    assert request.user.username == "alice" and request.user.groups == ("team-a", "system:authenticated")
    assert request.object is not None and request.old_object is None


@pytest.mark.parametrize(
    ("body", "message", "uid"),
    [
        ([], "the body must be a JSON object", ""),
        ({**REVIEW, "apiVersion": "admission.k8s.io/v1beta1"}, "expected apiVersion admission.k8s.io/v1 kind AdmissionReview, got apiVersion 'admission.k8s.io/v1beta1'", REVIEW["request"]["uid"]),
        ({**REVIEW, "request": None}, "request is missing or not an object", ""),
        (review(uid=7), "request.uid is missing or not a string", ""),
        (review(operation="PATCH"), "request.operation must be one of CREATE, UPDATE, DELETE, CONNECT, got 'PATCH'", REVIEW["request"]["uid"]),
        (review(kind="ResourceClaim"), "request.kind is missing or not an object", REVIEW["request"]["uid"]),
        (review(userInfo={"username": "a", "groups": "admins"}), "request.userInfo.groups must be a list of strings", REVIEW["request"]["uid"]),
        (review(userInfo={"username": "a", "extra": {"scopes": "user:full"}}), "request.userInfo.extra must map names to lists of strings", REVIEW["request"]["uid"]),
        (review(object=["x"]), "request.object must be an object", REVIEW["request"]["uid"]),
        (review(namespace=["team-a"]), "request.namespace must be a string", REVIEW["request"]["uid"]),
    ],
)
def test_a_bad_review_is_refused_naming_the_field_and_keeping_the_uid(body: Any, message: str, uid: str) -> None:
    with pytest.raises(ReviewError) as caught:
        parse_review(body)
    assert str(caught.value).startswith(message)
    assert caught.value.uid == uid


def test_a_denial_carries_status_and_no_patch() -> None:
    out = respond("u", Verdict(False, 'exceeded DeviceQuota "gpus"', patch=[{"op": "add", "path": "/x", "value": 1}]))
    assert out == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u", "allowed": False,
                     "status": {"code": 403, "reason": "Forbidden", "message": 'exceeded DeviceQuota "gpus"'}},
    }


def test_an_admission_carries_its_patch_warnings_and_audit_annotations() -> None:
    patch = [{"op": "add", "path": "/metadata/annotations", "value": {"draquota.io/charge": "{}"}}]
    out = respond("u", Verdict(True, warnings=("w\x1b[31m\nforged", "x" * 2000), patch=patch,
                               audit_annotations={"admin-access-grant": "alice"}))["response"]
    assert json.loads(base64.b64decode(out["patch"])) == patch and out["patchType"] == "JSONPatch"
    assert out["warnings"][0] == "w\\x1b[31m\\x0aforged"
    assert len(out["warnings"][1]) == 512 and out["warnings"][1].endswith("…")
    assert out["auditAnnotations"] == {"admin-access-grant": "alice"}


@pytest.mark.parametrize("key", ["draquota.io/grant", "", "a" * 64, "-x"])
def test_an_audit_key_the_api_server_would_drop_is_a_bug_we_refuse(key: str) -> None:
    with pytest.raises(ValueError, match="one name segment"):
        respond("u", Verdict(True, audit_annotations={key: "v"}))


def test_lone_surrogates_and_bidi_overrides_never_reach_the_wire() -> None:
    out = respond("u", Verdict(False, "name \ud800 \u202eevil", warnings=("\udfff",)))
    text = json.dumps(out, ensure_ascii=False)
    text.encode("utf-8")  # would raise on a lone surrogate
    assert "\u202e" not in text


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(st.data())
def test_fuzz_any_mutation_of_a_review_is_read_or_refused_cleanly(data: st.DataObject) -> None:
    body = copy.deepcopy(REVIEW)
    path = data.draw(st.sampled_from(paths(body)))
    body = splice(body, path, data.draw(values))
    with bounded(seconds=2, megabytes=64):
        try:
            request = parse_review(body)
        except ReviewError as err:
            out = respond(err.uid, Verdict(False, f"malformed AdmissionReview: {err}", reason="BadRequest", code=400))
        else:
            assert isinstance(request, AdmissionRequest)
            out = respond(request.uid, Verdict(True))
    json.dumps(out, ensure_ascii=False).encode("utf-8")
