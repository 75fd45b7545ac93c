"""webhook.pods: the Pod CREATE warning for DRA-backed extended resources (never a denial)."""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube.admissionreview import AdmissionRequest, Verdict, parse_review, respond
from quota.objects.claims import parse_device_class
from quota.pricing.pricer import Pricer
from quota.values.model import Charge, Namespace
from quota.values.work import CLAIM_COST_BUDGET, COMPILE_UNITS_PER_BYTE
from runtime.slicing import Slicer
from webhook.claimreview import ClaimContext
from webhook.pods import create_pod

from ..bounds import bounded, fuzz_examples
from ..builders import advised, make_class, make_quota
from ..quota.objects.test_fuzz_parsers import paths, splice, values
from ..quota.pricing.test_pricer import CLASSES, D, inventory
from ..runtime.test_slicing import Ticker
from .test_claimreview import World, admit, raw_review, review_request, run, stored

GPU = "example.com/gpu"
POD_GVR = {"group": "", "version": "v1", "resource": "pods"}
NS = Namespace("team-a")


def _ext_class() -> dict[str, Any]:
    raw = make_class("gpu-ext", f"device.driver == '{D}' && device.attributes['{D}'].type == 'gpu'")
    raw["spec"]["extendedResourceName"] = GPU
    return raw


EXT = parse_device_class(_ext_class())
PRICER = Pricer(inventory(), {**CLASSES, EXT.name: EXT})  # gpu-ext: 4 x 80Gi (h100) + 2 x 141Gi (h200)
WHAT = "the ResourceClaim the scheduler creates for this Pod's 'example.com/gpu'"


def context(*quotas: dict[str, Any], pricer: Pricer = PRICER) -> ClaimContext:
    return World(*quotas, pricer=pricer).ctx


def pod(requests: dict[str, str], *, init: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "pause", "resources": {"limits": requests,
                                                                                          "requests": requests}}]}
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": "pause", "resources": {"requests": init}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"}, "spec": spec}


def review(obj: Any, **kw: Any) -> Any:
    return review_request(obj, gvr=POD_GVR, name="train", **kw)


def judge(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    return asyncio.run(create_pod(ctx, request))


DEVICES = make_quota("gpus", devices=2, classes=["gpu-ext"])
NEVER_FITS = advised(f"{WHAT}: 3 (DeviceClass gpu-ext) can never fit (the Pod stays Pending while dra-quota denies "
                     'that claim): exceeded DeviceQuota "gpus": requested devices=3, used devices=0, reserved devices=0, '
                     "limited devices=2", "never")


def test_a_pod_whose_claim_can_never_fit_is_allowed_with_a_warning() -> None:
    verdict = judge(context(DEVICES), review(pod({GPU: "3"})))
    assert verdict == Verdict(True, warnings=(NEVER_FITS,))


def test_a_pod_that_does_not_fit_now_is_warned_and_nothing_is_reserved() -> None:
    replica = World(DEVICES, pricer=PRICER)
    ctx = replica.ctx
    claim = stored({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"generateName": "x-"},
                    "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu-ext"}}]}}})
    assert admit(ctx, review_request(claim)).allowed  # one of two devices held
    replica.created(claim)  # what "now" is checked against: this replica's cache
    before = ctx.admitter.ledger.usage(NS, "gpus")
    verdict = judge(ctx, review(pod({GPU: "2"})))
    assert verdict.allowed and len(verdict.warnings) == 1
    assert verdict.warnings[0].startswith(f"{WHAT}: 2 (DeviceClass gpu-ext) does not fit now (the Pod stays Pending "
                                          "while dra-quota denies that claim): exceeded DeviceQuota "
                                          '"gpus": requested devices=2, used devices=0, reserved devices=1'), verdict
    assert ctx.admitter.ledger.usage(NS, "gpus") == before
    # What fits is silent.
    assert judge(ctx, review(pod({GPU: "1"}))) == Verdict(True)


def test_memory_quotas_price_the_class_like_any_claim() -> None:
    # Conservative pricing: each device at the largest candidate, a 141Gi h200.
    verdict = judge(context(make_quota("mem", memory="200Gi")), review(pod({GPU: "2"})))
    assert verdict.allowed
    assert 'requested memory=282Gi, used memory=0, reserved memory=0, limited memory=200Gi' in verdict.warnings[0]


def test_the_implicit_class_name_and_init_containers() -> None:
    ctx = context(DEVICES)
    implicit = judge(ctx, review(pod({"deviceclass.resource.kubernetes.io/gpu-ext": "3"})))
    assert "'deviceclass.resource.kubernetes.io/gpu-ext': 3 (DeviceClass gpu-ext) can never fit" in implicit.warnings[0]
    # The init container reuses the main container's 2 devices: 2 in all, which fits.
    assert judge(ctx, review(pod({GPU: "2"}, init={GPU: "2"}))) == Verdict(True)
    # Its 3 need one more: 3 in all.
    assert "(DeviceClass gpu-ext) can never fit" in judge(ctx, review(pod({GPU: "2"}, init={GPU: "3"}))).warnings[0]


def test_pods_that_are_not_ours_pass_silently() -> None:
    ctx = context(DEVICES)
    for obj in (pod({"cpu": "1", "memory": "1Gi"}), pod({"example.com/fpga": "9"}), None,
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": "nonsense"}):
        assert judge(ctx, review(obj)) == Verdict(True)


def test_a_class_nobody_can_price_is_a_warning_not_a_denial() -> None:
    broken = parse_device_class({**_ext_class(), "metadata": {"name": "gpu-none"},
                                 "spec": {"extendedResourceName": "example.com/none", "selectors": [
                                     {"cel": {"expression": "device.attributes['x'].nosuch == 1"}}]}})
    ctx = context(make_quota("mem", memory="100Gi"), pricer=Pricer(inventory(), {broken.name: broken}))
    verdict = judge(ctx, review(pod({"example.com/none": "1"})))
    assert verdict.allowed and "would be denied" in verdict.warnings[-1], verdict


def test_the_validate_endpoint_routes_pod_creates_only() -> None:
    ctx = context(DEVICES)
    assert run("/validate", ctx, review(pod({GPU: "3"}))).warnings
    assert run("/validate", ctx, review(pod({GPU: "3"}), operation="UPDATE", old=pod({GPU: "3"}))) == Verdict(True)
    assert run("/mutate", ctx, review(pod({GPU: "3"}))) == Verdict(True)


BASE = raw_review(pod({GPU: "3", "cpu": "1"}, init={GPU: "1"}), gvr=POD_GVR)


@settings(max_examples=fuzz_examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data(), values)
def test_fuzz_every_pod_review_is_allowed_and_reserves_nothing(data: st.DataObject, value: Any) -> None:
    body = splice(copy.deepcopy(BASE), data.draw(st.sampled_from(paths(BASE))), value)
    ctx = context(DEVICES)
    with bounded(seconds=10, megabytes=256):
        try:
            request = parse_review(body)
        except ValueError:
            return
        verdict = run("/validate", ctx, request)
        assert verdict.allowed
        json.dumps(respond(request.uid, verdict), ensure_ascii=False).encode("utf-8")
    usage = ctx.admitter.ledger.usage(NS, "gpus")
    assert usage.reserved == usage.used == Charge()




# -- what one Pod review may cost the event loop ----------------------------------------------


def many_containers(containers: int, requests: dict[str, str], *, asking: int | None = None) -> dict[str, Any]:
    """A Pod of `containers` containers, the first `asking` of them (all: None) asking `requests`."""
    spec = [{"name": f"c{i}", "image": "pause",
             "resources": {"limits": requests if asking is None or i < asking else {"cpu": "1"}}}
            for i in range(containers)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "team-a"},
            "spec": {"containers": spec}}


FOUR_CLASSES = {f"deviceclass.resource.kubernetes.io/{c}": "1" for c in ("gpu-ext", *sorted(CLASSES)[:3])}


async def turns_of(ctx: ClaimContext, request: AdmissionRequest) -> tuple[Verdict, int]:
    with Ticker() as ticker:
        await asyncio.sleep(0)  # let it start
        before = ticker.turns
        verdict = await create_pod(ctx, request)
        return verdict, ticker.turns - before


def sliced(slicer: Slicer) -> ClaimContext:
    """`context(DEVICES)` whose slicer yields at every pause point (slices of no time): the
    loop's turns during a review count its pause points, whatever the machine's speed."""
    return replace(context(DEVICES), slicer=slicer)


async def test_a_pod_of_1024_containers_x_4_classes_gives_the_loop_back_at_every_container() -> None:
    slicer = Slicer(first_slice=0.0, slice_seconds=0.0)
    verdict, turns = await turns_of(sliced(slicer), review(many_containers(1024, FOUR_CLASSES)))
    # 4,096 requests: the API server would refuse the scheduler's claim, and nothing is priced.
    assert verdict.allowed and len(verdict.warnings) == 1, verdict
    assert verdict.warnings[0].startswith("the ResourceClaim the scheduler creates for this Pod cannot be created: its "
                                          "'deviceclass.resource.kubernetes.io/")
    assert "would take more than 32 requests" in verdict.warnings[0]
    # Never more than one container read (four resources) between two turns of the loop.
    assert turns >= 1024 and slicer.slow_calls == 1


async def test_a_pod_of_1024_containers_within_a_claims_requests_is_priced_in_slices() -> None:
    slicer = Slicer(first_slice=0.0, slice_seconds=0.0)
    verdict, turns = await turns_of(sliced(slicer), review(many_containers(1024, {GPU: "1"}, asking=3)))
    assert verdict == Verdict(True, warnings=(NEVER_FITS,))
    assert turns >= 1024 and slicer.slow_calls == 1


async def test_a_pod_past_a_full_slow_lane_is_allowed_unchecked_with_a_warning_never_denied() -> None:
    verdict = await create_pod(sliced(Slicer(first_slice=0.0, queue=0)), review(many_containers(8, {GPU: "3"})))
    assert verdict == Verdict(True, warnings=(
        "dra-quota is busy pricing other expensive requests and did not check this Pod's extended resources; the "
        "ResourceClaim the scheduler creates for them is still checked against the quota",))


def test_a_pod_whose_claim_is_over_budget_is_warned_with_the_claims_budget_message() -> None:
    def heavy(n: int) -> Any:  # ~630,000 units each: four of them are past a claim's budget
        return parse_device_class({**_ext_class(), "metadata": {"name": f"heavy-{n}"}, "spec": {
            "extendedResourceName": f"example.com/heavy-{n}",
            "selectors": [{"cel": {"expression": f"lists.range(300).all(i, lists.range(300).all(j, i + j >= -{n}))"}}]}})

    classes = {c.name: c for c in map(heavy, range(4))}
    ctx = context(make_quota("mem", memory="100Gi"), pricer=Pricer(inventory(), classes))
    verdict = judge(ctx, review(pod({f"example.com/heavy-{n}": "1" for n in range(4)})))
    assert verdict.allowed and verdict.warnings[-1].endswith(
        "would be denied: pricing this claim (all its requests, subrequests and selectors) exceeded the per-claim "
        f"budget of {CLAIM_COST_BUDGET:,} CEL cost units (each selector is charged its evaluations over the inventory "
        f"and {COMPILE_UNITS_PER_BYTE} units per byte to compile): make the selectors cheaper (no loops over lists or "
        "ranges), read attributes by name so devices with equal values are evaluated once, or use fewer requests and "
        "subrequests"), verdict
