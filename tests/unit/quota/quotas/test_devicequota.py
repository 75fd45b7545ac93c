"""quota.quotas.devicequota: parsing and the pure admission check with in-tree style messages."""

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from quota.quotas.devicequota import (
    SELECTOR_KEYS_MESSAGE,
    DeviceQuota,
    QuotaCheck,
    QuotaError,
    Usage,
    check,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.quotas.scope import Scope
from quota.values.model import Charge, DeviceClassName, Limits, Namespace

from ...builders import GiB, advised, make_cluster_quota, make_quota

ROOT = Path(__file__).resolve().parents[4]


def test_parses_quantities_scope_and_modes() -> None:
    q = parse_device_quota(make_quota("gpus", memory="320Gi", devices=8, classes=["mig.nvidia.com"],
                                      enforcement="Audit", pricing="Optimistic"))
    assert q == DeviceQuota(Namespace("team-a"), "gpus", Limits(320 * GiB, 8),
                            Scope(frozenset({DeviceClassName("mig.nvidia.com")})), "Audit", "optimistic")
    assert q.scope.admits_class(DeviceClassName("mig.nvidia.com"))
    assert not q.scope.admits_class(DeviceClassName("gpu.nvidia.com"))
    assert parse_device_quota(make_quota("all")).scope.everything


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (make_quota("q", memory="lots"), "spec.hard.memory: quantity 'lots'"),
        (make_quota("q", memory="-1Gi"), "must not be negative"),
        (make_quota("q", enforcement="Sometimes"), "Enforce or Audit"),
        (make_quota("q", pricing="Cheap"), "Conservative or Optimistic"),
        ({**make_quota("q"), "spec": {"hard": {"cpu": "1"}}}, "unsupported resource"),
        ({"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota", "metadata": {}}, "metadata.name is required"),
    ],
)
def test_rejects_bad_quotas(raw: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(QuotaError, match=message):
        parse_device_quota(raw)


GPUS = parse_device_quota(make_quota("gpus", memory="320Gi", devices=8))


def test_denial_names_the_quota_and_numbers_in_tree_style() -> None:
    decision = check([QuotaCheck(GPUS, Usage(used=Charge(240 * GiB, 3), reserved=Charge(40 * GiB, 1)), Charge(80 * GiB, 1))])
    assert not decision.allowed
    # 240 + 80 <= 320: what is used leaves room, the 40Gi reserved take it.
    assert decision.message == advised(
        'exceeded DeviceQuota "gpus": requested memory=80Gi, used memory=240Gi, '
        "reserved memory=40Gi, limited memory=320Gi", "reserved")


def test_several_exceeded_resources_are_listed_sorted() -> None:
    decision = check([QuotaCheck(GPUS, Usage(used=Charge(300 * GiB, 8)), Charge(80 * GiB, 1))])
    assert decision.message == advised(
        'exceeded DeviceQuota "gpus": requested devices=1,memory=80Gi, used devices=8,memory=300Gi, '
        "reserved devices=0,memory=0, limited devices=8,memory=320Gi")


def test_exactly_at_the_limit_is_allowed_and_charged() -> None:
    decision = check([QuotaCheck(GPUS, Usage(used=Charge(240 * GiB, 7)), Charge(80 * GiB, 1))])
    assert decision.allowed and decision.charged == ("gpus",)


def test_audit_admits_with_a_warning() -> None:
    audit = parse_device_quota(make_quota("audit", memory="10Gi", enforcement="Audit"))
    decision = check([QuotaCheck(audit, Usage(), Charge(80 * GiB, 1))])
    assert decision.allowed and decision.charged == ("audit",)
    assert decision.warnings == ('exceeded DeviceQuota "audit": requested memory=80Gi, used memory=0, '
                                 "reserved memory=0, limited memory=10Gi (enforcement: Audit, admitted)",)


def test_zero_charge_never_denied_even_over_the_limit() -> None:
    decision = check([QuotaCheck(GPUS, Usage(used=Charge(400 * GiB, 9)), Charge())])
    assert decision.allowed and decision.charged == ()


def test_all_quotas_must_admit() -> None:
    small = parse_device_quota(make_quota("small", devices=1))
    decision = check([QuotaCheck(GPUS, Usage(), Charge(80 * GiB, 2)), QuotaCheck(small, Usage(), Charge(80 * GiB, 2))])
    assert not decision.allowed and decision.message.startswith('exceeded DeviceQuota "small": requested devices=2')
    assert decision.denied_by == ("small",)


def test_denied_by_names_the_enforce_quotas_warned_by_the_audit_ones() -> None:
    audit = parse_device_quota(make_quota("audit", memory="10Gi", enforcement="Audit"))
    tight = parse_device_quota(make_quota("tight", memory="10Gi"))
    decision = check([QuotaCheck(q, Usage(), Charge(80 * GiB, 1)) for q in (audit, GPUS, tight)])
    assert (decision.allowed, decision.denied_by, decision.warned_by) == (False, ("tight",), ("audit",))
    admitted = check([QuotaCheck(audit, Usage(), Charge(80 * GiB, 1))])
    assert (admitted.allowed, admitted.denied_by, admitted.warned_by) == (True, (), ("audit",))


@given(used=st.integers(0, 10**13), reserved=st.integers(0, 10**13), charge=st.integers(1, 10**13), hard=st.integers(0, 10**13))
def test_check_is_exactly_the_inequality(used: int, reserved: int, charge: int, hard: int) -> None:
    quota = DeviceQuota(Namespace("n"), "q", Limits(memory=hard))
    decision = check([QuotaCheck(quota, Usage(Charge(used, 0), Charge(reserved, 0)), Charge(charge, 0))])
    assert decision.allowed is (used + reserved + charge <= hard)


# -- ClusterDeviceQuota ------------------------------------------------------------------------


def test_a_cluster_quota_is_a_device_quota_with_no_namespace_and_a_selector() -> None:
    q = parse_cluster_device_quota(make_cluster_quota("ml", team="ml", memory="320Gi", devices=8,
                                                      classes=["gpu"], pricing="Optimistic"))
    assert (q.namespace, q.name, q.hard, q.mode, q.cluster, q.kind) == (
        Namespace(""), "ml", Limits(320 * GiB, 8), "optimistic", True, "ClusterDeviceQuota")
    assert q.selector is not None and q.selector.matches({"team.draquota.io/name": "ml"})
    assert not q.selector.matches({"team.draquota.io/name": "web"})
    plain = parse_device_quota(make_quota("gpus", memory="1Gi"))
    assert (plain.cluster, plain.kind, plain.selector) == (False, "DeviceQuota", None)


@pytest.mark.parametrize("selector", [
    {},
    {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}},
    {"matchExpressions": [{"key": "team.draquota.io/tier", "operator": "Exists"}]},
])
def test_a_selector_on_labels_no_tenant_can_change_is_accepted(selector: dict[str, Any]) -> None:
    assert parse_cluster_device_quota(make_cluster_quota("t", selector=selector, memory="1Gi")).cluster


@pytest.mark.parametrize(("raw", "message"), [
    (make_cluster_quota("t", selector={"matchLabels": {"team": "ml"}}, memory="1Gi"),
     "may use only the label keys kubernetes.io/metadata.name and team.draquota.io/*"),
    # The governed label is ours, and any tenant-writable label would let a tenant leave its team.
    (make_cluster_quota("t", selector={"matchExpressions": [{"key": "draquota.io/governed", "operator": "Exists"}]},
                        memory="1Gi"), "got 'draquota.io/governed'"),
    (make_cluster_quota("t", selector={"matchExpressions": [{"key": "team.draquota.io/x", "operator": "Is"}]},
                        memory="1Gi"), "spec.namespaceSelector.matchExpressions[0].operator"),
    ({**make_cluster_quota("t", memory="1Gi"), "spec": {"hard": {"memory": "1Gi"}}}, "namespaceSelector is required"),
    ({**make_cluster_quota("t", memory="1Gi"), "apiVersion": "draquota.io/v1"}, "reads ClusterDeviceQuota draquota.io/v1alpha1"),
    (make_cluster_quota("t", memory="lots"), "ClusterDeviceQuota t: spec.hard.memory"),
])
def test_rejects_bad_cluster_quotas(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(QuotaError) as err:
        parse_cluster_device_quota(raw)
    assert message in str(err.value)


def test_the_key_rule_is_the_crds_word_for_word() -> None:
    crd = yaml.safe_load((ROOT / "quota" / "manifests" / "clusterdevicequota.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    (rule,) = spec["properties"]["namespaceSelector"]["x-kubernetes-validations"]
    assert rule["message"] == SELECTOR_KEYS_MESSAGE


def test_a_team_denial_names_the_kind_and_the_teams_numbers() -> None:
    team = parse_cluster_device_quota(make_cluster_quota("ml-team", memory="320Gi"))
    decision = check([QuotaCheck(team, Usage(used=Charge(240 * GiB, 3), reserved=Charge(40 * GiB, 1)),
                                 Charge(80 * GiB, 1))])
    assert not decision.allowed
    assert decision.message == advised('exceeded ClusterDeviceQuota "ml-team": requested memory=80Gi, '
                                       "used memory=240Gi, reserved memory=40Gi, limited memory=320Gi", "reserved",
                                       namespace="")
