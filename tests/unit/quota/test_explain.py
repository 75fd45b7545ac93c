"""The note a Conservative denial carries (issue 17): why "one GPU" costs 141Gi, and what to change.

Through `quota.check.run_check`, the code the webhook's claim paths share
(`Admitter.explained`); the in-tree prefix is unchanged, the note follows it.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota.check import run_check
from quota.loader import Document

from ..builders import exactly, make_class, make_claim, make_device, make_quota, make_slice, request

H100, H200 = make_device("h100", memory="80Gi"), make_device("h200", memory="141Gi")
PREFIX = ('exceeded DeviceQuota "gpus": requested memory=141Gi, used memory=0, reserved memory=0, '
          'limited memory=100Gi')
NOTE = ('. Priced conservatively: request gpu may get any of the 2 devices that match it and is charged as if it '
        'got the largest: memory=141Gi (the smallest: memory=80Gi). To be charged less, narrow the request with a '
        'selector (a model, a memory capacity) so that only the devices it needs match, or set spec.pricing: '
        'Optimistic on DeviceQuota "gpus" (it charges the smallest candidate; dra-quota check --mode optimistic '
        'shows those prices)')


def reason(*objects: dict[str, Any], mode: str = "conservative") -> str:
    report = run_check([Document(f"doc {i}", o) for i, o in enumerate(objects)], mode=mode)  # type: ignore[arg-type]
    return report.objects[-1].reason


def state(*devices: dict[str, Any], **quota: Any) -> list[dict[str, Any]]:
    return [make_class("gpu", 'device.driver == "gpu.example.com"'), make_slice("s", list(devices)),
            make_quota("gpus", **quota)]


ONE_GPU = make_claim("one", request("gpu", exactly("gpu")))


def test_the_largest_of_several_candidates_is_named_and_how_to_pay_less() -> None:
    assert reason(*state(H100, H200, memory="100Gi"), ONE_GPU) == PREFIX + NOTE


def test_a_template_that_can_never_fit_says_the_same() -> None:
    template = make_claim("t", request("gpu", exactly("gpu")), kind="ResourceClaimTemplate")
    assert reason(*state(H100, H200, memory="100Gi"), template) == f"a claim from this template can never fit: " \
                                                                    f"{PREFIX}{NOTE}"


@pytest.mark.parametrize(("objects", "mode"), [
    # every candidate costs the same: narrowing would not help
    ((*state(H200, make_device("h200-b", memory="141Gi"), memory="100Gi"), ONE_GPU), "conservative"),
    # a selector already picks the large one
    ((*state(H100, H200, memory="100Gi"), make_claim("one", request("gpu", exactly(
        "gpu", 'device.capacity["gpu.example.com"].memory.compareTo(quantity("100Gi")) > 0')))), "conservative"),
])
def test_no_note_where_pricing_is_not_the_story(objects: tuple[dict[str, Any], ...], mode: str) -> None:
    assert reason(*objects, mode=mode) == PREFIX


def test_no_note_when_the_quota_limits_only_what_both_prices_agree_on() -> None:
    two = make_claim("two", request("gpu", exactly("gpu", count=2)))
    assert reason(*state(H100, H200, devices=1), two) == (
        'exceeded DeviceQuota "gpus": requested devices=2, used devices=0, reserved devices=0, limited devices=1')


def test_an_optimistic_quota_prices_at_the_smallest_and_needs_no_note() -> None:
    big = make_claim("big", request("gpu", exactly("gpu", count=2)))
    assert reason(*state(H100, H200, memory="100Gi", pricing="Optimistic"), big) == (
        'exceeded DeviceQuota "gpus": requested memory=160Gi, used memory=0, reserved memory=0, limited memory=100Gi')
