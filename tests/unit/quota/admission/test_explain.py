"""The note a Conservative denial carries: why "one GPU" costs 141Gi, what the requester can change,
and what to ask the cluster admin for (naming the quota's kind).

Through `quota.reports.check.run_check`, the code the webhook's claim paths share
(`Admitter.explained`); the in-tree prefix is unchanged, the note follows it.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota.reports.check import run_check
from quota.reports.loader import Document

from ...builders import (advised, exactly, first_available, make_class, make_claim, make_cluster_quota, make_device,
                        make_quota, make_slice, request)

H100, H200 = make_device("h100", memory="80Gi"), make_device("h200", memory="141Gi")
# The in-tree numbers and what the requester can do (`quota.quotas.advice`): 141Gi alone is over 100Gi.
PREFIX = advised('exceeded DeviceQuota "gpus": requested memory=141Gi, used memory=0, reserved memory=0, '
                 'limited memory=100Gi', "never")
NOTE = ('. Priced conservatively: request gpu may get any of the 2 devices that match it and is charged as if it '
        'got the largest: memory=141Gi (the smallest: memory=80Gi). To be charged less, narrow request gpu with a '
        'selector (a model, a memory capacity) so that only the devices it needs match; or ask the cluster admin to '
        'set spec.pricing: Optimistic on DeviceQuota "gpus" (it charges the smallest candidate; dra-quota check '
        '--mode optimistic shows those prices)')
ADMIN = ('; or ask the cluster admin to set spec.pricing: Optimistic on {} (it charges the smallest candidate; '
         'dra-quota check --mode optimistic shows those prices)')


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
    assert reason(*state(H100, H200, devices=1), two) == advised(
        'exceeded DeviceQuota "gpus": requested devices=2, used devices=0, reserved devices=0, limited devices=1',
        "never")


def test_an_optimistic_quota_prices_at_the_smallest_and_needs_no_note() -> None:
    big = make_claim("big", request("gpu", exactly("gpu", count=2)))
    assert reason(*state(H100, H200, memory="100Gi", pricing="Optimistic"), big) == advised(
        'exceeded DeviceQuota "gpus": requested memory=160Gi, used memory=0, reserved memory=0, limited memory=100Gi',
        "never")


MODEL = 'device.attributes["gpu.example.com"].model == "{}"'
H100_M, H200_M = (make_device(n, memory=m, attrs={"model": n}) for n, m in (("h100", "80Gi"), ("h200", "141Gi")))


def test_a_team_budget_is_named_by_its_kind_and_left_to_the_cluster_admin() -> None:
    team_ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {
        "team.draquota.io/name": "ml-team"}}}
    objects = (make_class("gpu", 'device.driver == "gpu.example.com"'), make_slice("s", [H100, H200]), team_ns,
               make_cluster_quota("ml-team", memory="100Gi"), ONE_GPU)
    got = reason(*objects)
    assert got.startswith('exceeded ClusterDeviceQuota "ml-team": requested memory=141Gi, used memory=0, ')
    assert got.endswith(ADMIN.format('ClusterDeviceQuota "ml-team"'))
    assert "DeviceQuota ml-team" not in got and 'on DeviceQuota "ml-team"' not in got


def test_first_available_describes_each_subrequest_and_never_asks_to_narrow_a_narrow_one() -> None:
    claim = make_claim("either", first_available("gpu", ("big", exactly("gpu", MODEL.format("h200"))),
                                                  ("small", exactly("gpu", MODEL.format("h100")))))
    got = reason(*state(H100_M, H200_M, memory="100Gi"), claim)
    assert got == (PREFIX + '. Priced conservatively: request gpu may get any of its subrequests and is charged as '
                   'the most expensive: memory=141Gi (subrequest gpu/big matches 1 device, charged memory=141Gi, '
                   'subrequest gpu/small matches 1 device, charged memory=80Gi). To be charged less, drop subrequest '
                   'gpu/big (a firstAvailable request is charged as its most expensive subrequest)'
                   + ADMIN.format('DeviceQuota "gpus"'))
    assert "narrow" not in got


def test_first_available_asks_to_narrow_only_the_subrequest_whose_candidates_differ() -> None:
    claim = make_claim("either", first_available("gpu", ("any", exactly("gpu")),
                                                  ("small", exactly("gpu", MODEL.format("h100")))))
    got = reason(*state(H100_M, H200_M, memory="100Gi"), claim)
    assert ('(subrequest gpu/any matches 2 devices, charged the largest memory=141Gi (the smallest: memory=80Gi), '
            'subrequest gpu/small matches 1 device, charged memory=80Gi)') in got
    assert ('To be charged less, drop subrequest gpu/any (a firstAvailable request is charged as its most expensive '
            'subrequest), or narrow subrequest gpu/any with a selector') in got
    assert "narrow subrequest gpu/small" not in got


def test_the_note_is_left_out_beyond_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each alternative is priced alone for the note, within one claim's budget (the same
    matches as the claim's own pricing, each charged once): a claim whose note would cost
    more is denied with the in-tree words alone."""
    from quota.admission import explain

    monkeypatch.setattr(explain, "NOTE_BUDGET", 1)
    assert reason(*state(H100, H200, memory="100Gi"), ONE_GPU) == PREFIX
