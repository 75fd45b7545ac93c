"""quota.admission.policy: the adminAccess allowlist, its records, and its configuration."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

from quota.admission.policy import (
    CLAIM_CONTROLLER,
    AdminAccessPolicy,
    PolicyError,
    PolicyRecord,
    judge_claim,
    judge_label_change,
    parse_policy,
    stamped_from_pod,
)

POLICY = parse_policy({
    "users": ["alice"],
    "groups": "gpu-admins,\n sre\n",
    "serviceAccounts": ["ops:deployer", "platform:*"],
})
SA = "system:serviceaccount:"
AUTH = ("system:authenticated",)


@pytest.mark.parametrize(
    ("username", "groups", "basis"),
    [
        ("alice", AUTH, "allowlisted user alice"),
        ("bob", ("sre", *AUTH), "allowlisted group sre"),
        (f"{SA}ops:deployer", ("system:serviceaccounts", "system:serviceaccounts:ops"), "allowlisted service account ops:deployer"),
        (f"{SA}platform:anything", (), "allowlisted service account platform:*"),
        (f"{SA}ops:other", ("system:serviceaccounts:ops",), None),
        ("ops:deployer", (), None),  # not a service account's username
        ("", (), None),
        ("mallory", ("gpu-admins-not",), None),
    ],
)
def test_basis(username: str, groups: tuple[str, ...], basis: str | None) -> None:
    assert POLICY.basis(username, groups) == basis


FROM_POD: dict[str, Any] = {"metadata": {
    "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "uid": "u", "controller": True,
                         "blockOwnerDeletion": True}],
}}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (FROM_POD, True),
        ({"metadata": {"annotations": FROM_POD["metadata"]["annotations"]}}, False),
        ({"metadata": {"ownerReferences": FROM_POD["metadata"]["ownerReferences"]}}, False),
        ({"metadata": {**FROM_POD["metadata"], "ownerReferences": [{"apiVersion": "v1", "kind": "Pod"}]}}, False),
        ({"metadata": {**FROM_POD["metadata"], "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Pod", "controller": True}]}}, False),
        ({"metadata": {**FROM_POD["metadata"], "ownerReferences": "x"}}, False),
        ({"metadata": None}, False),
    ],
)
def test_stamped_from_pod(obj: dict[str, Any], expected: bool) -> None:
    assert stamped_from_pod(obj) is expected


class _Claim(TypedDict):
    """`judge_claim()`'s claim keywords, typed so `judge_claim(..., **CLAIM)` is checked."""

    kind: str
    namespace: str
    name: str


CLAIM: _Claim = {"kind": "ResourceClaim", "namespace": "team-a", "name": "trainer-0-gpu-x7k2q"}
ACTION = "create ResourceClaim team-a/trainer-0-gpu-x7k2q with adminAccess"


@pytest.mark.parametrize(
    ("username", "from_pod", "expected"),
    [
        ("alice", False, PolicyRecord("granted", "alice", ACTION, "allowlisted user alice", **CLAIM)),
        ("bob", False, PolicyRecord("refused", "bob", ACTION, "not on the adminAccess allowlist", **CLAIM)),
        (CLAIM_CONTROLLER, True, PolicyRecord(
            "granted", CLAIM_CONTROLLER, ACTION,
            "stamped from a Pod's ResourceClaimTemplate, judged at the template's CREATE", **CLAIM)),
        # the controller's account alone, or the marks alone, grant nothing
        (CLAIM_CONTROLLER, False, PolicyRecord("refused", CLAIM_CONTROLLER, ACTION, "not on the adminAccess allowlist", **CLAIM)),
        ("bob", True, PolicyRecord("refused", "bob", ACTION, "not on the adminAccess allowlist", **CLAIM)),
    ],
)
def test_judge_claim(username: str, from_pod: bool, expected: PolicyRecord) -> None:
    assert judge_claim(POLICY, username=username, groups=AUTH, from_pod=from_pod, **CLAIM) == expected


LABEL = "label resource.kubernetes.io/admin-access"


@pytest.mark.parametrize(
    ("username", "old", "new", "outcome", "action"),
    [
        ("alice", None, "true", "granted", f"add {LABEL}='true' to Namespace team-a"),
        ("bob", None, "true", "refused", f"add {LABEL}='true' to Namespace team-a"),
        ("bob", "true", None, "refused", f"remove {LABEL} from Namespace team-a"),
        ("bob", "true", "false", "refused", f"change {LABEL} from 'true' to 'false' on Namespace team-a"),
        ("alice", "false", "true", "granted", f"change {LABEL} from 'false' to 'true' on Namespace team-a"),
    ],
)
def test_judge_label_change(username: str, old: str | None, new: str | None, outcome: str, action: str) -> None:
    record = judge_label_change(POLICY, username=username, groups=AUTH, namespace="team-a", old=old, new=new)
    assert record is not None
    assert (record.outcome, record.action, record.kind, record.name) == (outcome, action, "Namespace", "team-a")


def test_an_unchanged_label_is_not_judged() -> None:
    assert judge_label_change(POLICY, username="bob", groups=(), namespace="n", old="true", new="true") is None
    assert judge_label_change(POLICY, username="bob", groups=(), namespace="n", old=None, new=None) is None


def test_audit_value_says_who_and_what() -> None:
    record = judge_claim(POLICY, username="bob", groups=(), **CLAIM)
    assert record.audit_value == f"refused: bob may not {ACTION} (not on the adminAccess allowlist)"
    assert judge_claim(POLICY, username="alice", groups=(), **CLAIM).audit_value.startswith(f"granted: alice may {ACTION}")


def test_parse_defaults_and_lists() -> None:
    assert parse_policy({}) == AdminAccessPolicy()
    assert AdminAccessPolicy().claim_controllers == frozenset({CLAIM_CONTROLLER})
    assert POLICY.groups == frozenset({"gpu-admins", "sre"})
    custom = parse_policy({"claimControllers": "system:kube-controller-manager"})
    assert custom.claim_controllers == frozenset({"system:kube-controller-manager"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "the adminAccess policy must be a map, got a list"),
        ({"user": ["a"]}, "adminAccess policy: unknown field 'user': use users, groups, serviceAccounts, claimControllers"),
        ({"users": 3}, "adminAccess policy: users must be a list of names or a comma-separated string, got 3"),
        ({"groups": ["ok", ""]}, "adminAccess policy: groups[1] must be a non-empty name without spaces, got ''"),
        ({"groups": ["a b"]}, "adminAccess policy: groups[0] must be a non-empty name without spaces, got 'a b'"),
        ({"users": [None]}, "adminAccess policy: users[0] must be a non-empty name without spaces, got None"),
        ({"serviceAccounts": ["ops"]}, "adminAccess policy: serviceAccounts[0]: 'ops' must be <namespace>:<name> or <namespace>:*"),
        ({"serviceAccounts": ["Ops:x"]}, "adminAccess policy: serviceAccounts[0]: namespace"),
        ({"serviceAccounts": ["ops:bad_name"]}, "adminAccess policy: serviceAccounts[0]: name"),
    ],
)
def test_parse_names_the_bad_field(raw: Any, message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(raw)
    assert str(err.value).startswith(message)
