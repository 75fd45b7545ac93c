"""webhook.mutating: our annotations on claim CREATE, as an RFC 6902 patch the API server applies."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from quota.model import Charge
from webhook.mutating import annotate_claim, annotation_patch, json_pointer
from webhook.review import Verdict, respond

from ..builders import MiB, exactly, make_claim, make_quota, request
from .test_claims import GPUS, context, gpu_claim, reserved, review_request

CHARGE_80 = '{"memory":85899345920,"devices":1}'


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply(obj: dict[str, Any], patch: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` and `remove`, as the API server's json-patch applies it (enough for our patches)."""
    out = copy.deepcopy(obj)
    for op in patch:
        assert op["op"] in ("add", "remove")
        *parents, last = [unescape(t) for t in op["path"].split("/")[1:]]
        target = out
        for token in parents:
            target = target[token]  # a missing parent fails the patch, as in the API server
        if op["op"] == "remove":
            del target[last]  # a missing member fails the patch, as in the API server
        else:
            target[last] = op["value"]
    return out


def mutating_object(**annotations: Any) -> dict[str, Any]:
    """What the mutating phase of a generateName CREATE sees: no name, no uid."""
    obj = gpu_claim()
    obj["metadata"] = {"generateName": "train-gpu-", "namespace": "team-a"}
    obj["metadata"].update(annotations)
    return obj


@pytest.mark.parametrize(
    ("metadata", "expected_annotations"),
    [
        ({}, {"draquota.io/charge": CHARGE_80, "draquota.io/quotas": "gpus"}),
        ({"annotations": None}, {"draquota.io/charge": CHARGE_80, "draquota.io/quotas": "gpus"}),
        ({"annotations": {"team": "ml", "draquota.io/charge": '{"memory":0,"devices":0}', "draquota.io/quotas": "x"}},
         {"team": "ml", "draquota.io/charge": CHARGE_80, "draquota.io/quotas": "gpus"}),
        ({"annotations": {"draquota.io/allocated-charge": '{"d/p/x":1}'}},
         {"draquota.io/charge": CHARGE_80, "draquota.io/quotas": "gpus"}),
    ],
    ids=["no-map", "null-map", "user-values-replaced", "user-allocation-record-removed"],
)
def test_create_writes_our_annotations(metadata: dict[str, Any], expected_annotations: dict[str, str]) -> None:
    ctx = context(GPUS, make_quota("mig-only", memory="10Gi", classes=["mig"]))
    obj = mutating_object(**metadata)
    verdict = annotate_claim(ctx, review_request(obj, name=""))
    assert verdict.allowed and not verdict.warnings and verdict.message == ""
    patched = apply(obj, list(verdict.patch))
    assert patched["metadata"]["annotations"] == expected_annotations
    assert reserved(ctx) == Charge()  # the mutating phase reserves nothing
    # on the wire: base64 JSON Patch
    response = respond("u", verdict)["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == list(verdict.patch)


def test_quotas_lists_every_quota_charged_sorted_and_none_out_of_scope() -> None:
    ctx = context(make_quota("z-all", memory="1Ti"), make_quota("a-gpu", devices=2, classes=["gpu"]),
                  make_quota("mig", memory="1Ti", classes=["mig"]))
    patched = apply(mutating_object(), list(annotate_claim(ctx, review_request(mutating_object(), name="")).patch))
    assert patched["metadata"]["annotations"]["draquota.io/quotas"] == "a-gpu,z-all"
    mig = make_claim("x", request("m", exactly("mig", count=2)))
    mig["metadata"] = {"generateName": "m-", "namespace": "team-a"}
    ctx = context(make_quota("a-gpu", devices=2, classes=["gpu"]))
    patched = apply(mig, list(annotate_claim(ctx, review_request(mig, name="")).patch))
    assert patched["metadata"]["annotations"] == {"draquota.io/charge": json.dumps({"memory": 2 * 4864 * MiB, "devices": 2}, separators=(",", ":")),
                                                  "draquota.io/quotas": ""}


def test_a_claim_that_does_not_parse_is_left_to_the_validating_webhook() -> None:
    obj = mutating_object()
    obj["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    assert annotate_claim(context(GPUS), review_request(obj, name="")) == Verdict(True)
    assert annotate_claim(context(GPUS), review_request({"kind": "ResourceClaim", "metadata": 3}, name="")) == Verdict(True)


@pytest.mark.parametrize(
    ("token", "escaped"),
    [("draquota.io/charge", "draquota.io~1charge"), ("a~b/c", "a~0b~1c"), ("~1", "~01"), ("plain", "plain")],
)
def test_json_pointer_escaping(token: str, escaped: str) -> None:
    assert json_pointer(token) == escaped
    assert unescape(escaped) == token


def test_patch_with_an_existing_map_touches_only_our_keys() -> None:
    obj = {"metadata": {"annotations": {"a/b": "1"}}}
    patch = annotation_patch(obj, {"draquota.io/quotas": "q"})
    assert patch == [{"op": "add", "path": "/metadata/annotations/draquota.io~1quotas", "value": "q"}]
    assert apply(obj, patch) == {"metadata": {"annotations": {"a/b": "1", "draquota.io/quotas": "q"}}}
