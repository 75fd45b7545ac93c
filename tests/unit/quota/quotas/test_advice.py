"""quota.quotas.advice: what a requester refused by a full quota can do, after the in-tree numbers.

The wording is pinned here, case by case; the other tests build it with
`builders.advised` and pin the numbers and which case applies.
"""

from __future__ import annotations

from typing import Any

import pytest

from quota.quotas.advice import Case, case_of, worst
from quota.quotas.devicequota import (
    DeviceQuota,
    QuotaCheck,
    Usage,
    check,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.reports.check import run_check
from quota.reports.loader import Document
from quota.values.model import Charge

from ...builders import (GiB, exactly, make_class, make_claim, make_cluster_quota, make_device, make_quota, make_slice,
                        request)

GPUS = parse_device_quota(make_quota("gpus", memory="320Gi", devices=8))
TEAM = parse_cluster_device_quota(make_cluster_quota("ml-team", memory="320Gi"))
FULL = Usage(used=Charge(280 * GiB, 3))  # 280 + 80 > 320: claims that hold devices must go
RESERVED = Usage(used=Charge(240 * GiB, 3), reserved=Charge(40 * GiB, 1))  # 240 + 80 fit: pending claims hold the rest
ASK_GPUS = 'ask the cluster admin to raise the limit of DeviceQuota "gpus"'
ASK_TEAM = 'ask the cluster admin to raise the limit of ClusterDeviceQuota "ml-team"'


def denial(quota: DeviceQuota, usage: Usage, charge: int, *, namespace: str = "team-a") -> str:
    decision = check([QuotaCheck(quota, usage, Charge(charge * GiB, 1))], namespace=namespace)
    assert not decision.allowed
    return decision.message


@pytest.mark.parametrize(("quota", "usage", "charge", "expected"), [
    (GPUS, FULL, 80,
     'exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=280Gi, reserved memory=0, limited memory=320Gi; '
     f"to fit, free room in namespace team-a (delete claims it no longer needs) or {ASK_GPUS}"),
    (GPUS, RESERVED, 80,
     'exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=240Gi, reserved memory=40Gi, '
     "limited memory=320Gi; to fit, free room in namespace team-a (claims not allocated yet hold the room at their "
     f"estimate until they are allocated or deleted) or {ASK_GPUS}"),
    (GPUS, Usage(), 400,
     'exceeded DeviceQuota "gpus": requested memory=400Gi, used memory=0, reserved memory=0, limited memory=320Gi; '
     f"requested alone is over the limit: make the request smaller, or {ASK_GPUS}"),
    (TEAM, FULL, 80,
     'exceeded ClusterDeviceQuota "ml-team": requested memory=80Gi, used memory=280Gi, reserved memory=0, '
     'limited memory=320Gi; to fit, free room in team "ml-team" (its namespaces share this limit: kubectl get acdq '
     f"-n team-a) or {ASK_TEAM}"),
    (TEAM, RESERVED, 80,
     'exceeded ClusterDeviceQuota "ml-team": requested memory=80Gi, used memory=240Gi, reserved memory=40Gi, '
     'limited memory=320Gi; to fit, free room in team "ml-team" (its namespaces share this limit: kubectl get acdq '
     "-n team-a; claims not allocated yet hold the room at their estimate until they are allocated or deleted) or "
     f"{ASK_TEAM}"),
    (TEAM, Usage(), 400,
     'exceeded ClusterDeviceQuota "ml-team": requested memory=400Gi, used memory=0, reserved memory=0, '
     f"limited memory=320Gi; requested alone is over the limit: make the request smaller, or {ASK_TEAM}"),
], ids=["quota-full", "quota-reserved", "quota-never", "team-full", "team-reserved", "team-never"])
def test_a_denial_is_the_in_tree_form_then_what_the_requester_can_do(
        quota: DeviceQuota, usage: Usage, charge: int, expected: str) -> None:
    assert denial(quota, usage, charge) == expected


def test_a_team_denial_names_no_namespace_where_the_caller_knows_none() -> None:
    assert denial(TEAM, FULL, 80, namespace="").endswith(
        f'free room in team "ml-team" (its namespaces share this limit: kubectl get acdq) or {ASK_TEAM}')


def test_a_quota_names_its_own_namespace_whoever_asks() -> None:
    # A DeviceQuota counts the claims of its namespace only: that is where room can be freed.
    assert "free room in namespace team-a " in denial(GPUS, FULL, 80, namespace="")


def test_every_quotas_numbers_come_before_any_advice() -> None:
    """Log lines, Event notes and warnings keep a message's beginning: the numbers, and the
    in-tree form a queue manager greps for, are never behind a sentence of advice."""
    small = parse_device_quota(make_quota("small", devices=2))
    decision = check([QuotaCheck(GPUS, FULL, Charge(80 * GiB, 1)), QuotaCheck(TEAM, RESERVED, Charge(80 * GiB, 1)),
                      QuotaCheck(small, Usage(), Charge(80 * GiB, 3))], namespace="team-a")
    assert decision.message == (
        'exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=280Gi, reserved memory=0, '
        'limited memory=320Gi; exceeded ClusterDeviceQuota "ml-team": requested memory=80Gi, used memory=240Gi, '
        'reserved memory=40Gi, limited memory=320Gi; exceeded DeviceQuota "small": requested devices=3, used '
        "devices=0, reserved devices=0, limited devices=2; "
        f"to fit, free room in namespace team-a (delete claims it no longer needs) or {ASK_GPUS}; "
        'to fit, free room in team "ml-team" (its namespaces share this limit: kubectl get acdq -n team-a; claims not '
        f"allocated yet hold the room at their estimate until they are allocated or deleted) or {ASK_TEAM}; "
        'requested alone is over the limit: make the request smaller, or ask the cluster admin to raise the limit of '
        'DeviceQuota "small"')


def test_an_audit_excess_is_a_warning_with_no_advice() -> None:
    audit = parse_device_quota(make_quota("audit", memory="10Gi", enforcement="Audit"))
    decision = check([QuotaCheck(audit, Usage(), Charge(80 * GiB, 1))], namespace="team-a")
    assert decision.allowed and decision.warnings == (
        'exceeded DeviceQuota "audit": requested memory=80Gi, used memory=0, reserved memory=0, limited memory=10Gi '
        "(enforcement: Audit, admitted)",)


@pytest.mark.parametrize(("requested", "used", "limited", "case"), [
    (80, 280, 320, "full"),
    (80, 240, 320, "reserved"),  # used + requested == limited: only the reservations are over
    (80, 0, 80, "reserved"),
    (81, 0, 80, "never"),
    (80, 400, 320, "full"),  # usage above a lowered limit
])
def test_case_of_one_resource(requested: int, used: int, limited: int, case: Case) -> None:
    assert case_of(requested=requested, used=used, limited=limited) == case


@pytest.mark.parametrize(("requested", "limited", "own", "case"), [
    (81, 80, 100, "window"),  # over a window's lower limit, within the quota's own
    (101, 80, 100, "never"),  # over both: the window's end does not help
    (101, 100, 80, "never"),  # a window raised it and it is still over
])
def test_case_of_one_resource_under_a_window(requested: int, limited: int, own: int, case: Case) -> None:
    assert case_of(requested=requested, used=0, limited=limited, own=own) == case


@pytest.mark.parametrize(("cases", "case"), [
    (["reserved", "full"], "full"),  # freeing reservations alone would not do
    (["reserved", "reserved"], "reserved"),
    (["full", "never"], "never"),
    (["window", "reserved"], "window"),
    (["window", "never"], "never"),
])
def test_the_worst_resource_decides(cases: list[Case], case: Case) -> None:
    assert worst(cases) == case


def reasons(*objects: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    report = run_check([Document(f"doc {i}", o) for i, o in enumerate(objects)], mode="conservative")
    return [(o.reason, o.warnings) for o in report.objects]


def test_a_template_says_never_once_and_now_as_a_warning_with_the_advice() -> None:
    """"can never fit" is the template's own word: the advice says only what helps."""
    objects = [make_class("gpu", 'device.driver == "gpu.example.com"'),
               make_slice("s", [make_device(f"g{i}") for i in range(4)]), make_quota("gpus", memory="200Gi"),
               make_claim("held", request("gpu", exactly("gpu", count=2)))]
    never = make_claim("never", request("gpu", exactly("gpu", count=3)), kind="ResourceClaimTemplate")
    now = make_claim("now", request("gpu", exactly("gpu", count=2)), kind="ResourceClaimTemplate")
    *_, (never_reason, _), (now_reason, now_warnings) = reasons(*objects, never, now)
    assert never_reason == (
        'a claim from this template can never fit: exceeded DeviceQuota "gpus": requested memory=240Gi, used memory=0, '
        'reserved memory=0, limited memory=200Gi; requested alone is over the limit: make the request smaller, or ask '
        'the cluster admin to raise the limit of DeviceQuota "gpus"')
    assert not now_reason and now_warnings == (
        'claims from this template do not fit now: exceeded DeviceQuota "gpus": requested memory=160Gi, used memory=0, '
        'reserved memory=160Gi, limited memory=200Gi; to fit, free room in namespace team-a (claims not allocated yet '
        'hold the room at their estimate until they are allocated or deleted) or ask the cluster admin to raise the '
        'limit of DeviceQuota "gpus"',)
