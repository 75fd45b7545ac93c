"""webhook.namespaces: only allowlisted principals touch the admin-access label, on every path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kube.admissionreview import Verdict
from quota.admission.policy import PolicyRecord
from webhook.namespaces import review_namespace, update_namespace

from .test_claimreview import ADMIN, ALICE, POLICY, review_request

NAMESPACES = {"group": "", "version": "v1", "resource": "namespaces"}
LABEL = "resource.kubernetes.io/admin-access"


def namespace(label: str | None = None, *, phase: str = "Active") -> dict[str, Any]:
    labels = {"kubernetes.io/metadata.name": "team-a"}
    if label is not None:
        labels[LABEL] = label
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "team-a", "uid": "0d7c1e3a-2f4b-4a6d-9e8f-1b2c3d4e5f60", "labels": labels},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": phase},
    }


def decide(obj: dict[str, Any], old: dict[str, Any] | None, *, user: dict[str, Any], sub: str = "") -> Verdict:
    operation = "CREATE" if old is None else "UPDATE"
    request = review_request(obj, operation=operation, gvr=NAMESPACES, sub=sub, old=old, user=user, name="team-a")
    return update_namespace(lambda: POLICY, request)


def recorded(outcome: str, username: str, action: str, basis: str, message: str = "") -> Verdict:
    record = PolicyRecord(outcome, username, action, basis, "Namespace", "", "team-a")  # type: ignore[arg-type]
    return Verdict(outcome == "granted", message, audit_annotations={"admin-access": record.audit_value},
                   records=(record,), cause="none" if outcome == "granted" else "admin_access")


ADD = f"add label {LABEL}='true' to Namespace team-a"
REMOVE = f"remove label {LABEL} from Namespace team-a"
CHANGE = f"change label {LABEL} from 'true' to 'TRUE' on Namespace team-a"
NOT_LISTED = "not on the adminAccess allowlist"
GROUP = "allowlisted group gpu-admins"


def refused(action: str) -> Verdict:
    return recorded("refused", "alice", action, NOT_LISTED, f"alice may not {action}: not on dra-quota's adminAccess allowlist")


@pytest.mark.parametrize(
    ("new", "old", "user", "sub", "expected"),
    [
        (namespace("true"), None, ALICE, "", refused(ADD)),
        (namespace("true"), None, ADMIN, "", recorded("granted", "root-ops", ADD, GROUP)),
        (namespace("true"), namespace(), ALICE, "", refused(ADD)),
        (namespace("true"), namespace(), ALICE, "status", refused(ADD)),
        (namespace("true"), namespace(), ALICE, "finalize", refused(ADD)),
        (namespace("true"), namespace(), ADMIN, "finalize", recorded("granted", "root-ops", ADD, GROUP)),
        (namespace(), namespace("true"), ALICE, "", refused(REMOVE)),
        (namespace("TRUE"), namespace("true"), ALICE, "", refused(CHANGE)),
        # anything else about a namespace is not ours
        (namespace("true", phase="Terminating"), namespace("true"), ALICE, "status", Verdict(True)),
        (namespace(), None, ALICE, "", Verdict(True)),
        (namespace(), namespace(), ALICE, "", Verdict(True)),
    ],
    ids=["create-refused", "create-granted", "add-refused", "status-refused", "finalize-refused", "finalize-granted",
         "remove-refused", "change-refused", "unchanged-status", "create-without", "update-without"],
)
def test_label_changes(new: dict[str, Any], old: dict[str, Any] | None, user: dict[str, Any], sub: str,
                       expected: Verdict) -> None:
    assert decide(new, old, user=user, sub=sub) == expected


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("x", "request.object.metadata.labels must be a map, got 'x'"),
        ({LABEL: 1}, "request.object.metadata.labels['resource.kubernetes.io/admin-access'] must be a string, got 1"),
    ],
)
def test_unreadable_labels_are_denied_naming_the_field(labels: Any, message: str) -> None:
    obj = copy.deepcopy(namespace())
    obj["metadata"]["labels"] = labels
    assert decide(obj, namespace(), user=ADMIN) == Verdict(False, message, "Invalid", 422, cause="invalid")


def test_unrelated_oddities_are_not_refused() -> None:
    obj = namespace()
    obj["metadata"]["annotations"] = {"x": 1}  # not ours to judge: the API server already did
    assert decide(obj, namespace(), user=ALICE) == Verdict(True)


# -- RBAC beside the allowlist (review_namespace) ------------------------------------------------

RBAC_BASIS = "RBAC allows label on adminaccess.draquota.io"


def rbac(answer: bool | None) -> tuple[Any, list[str]]:
    asked: list[str] = []

    async def may_label(user: Any) -> bool | None:
        asked.append(user.username)
        return answer

    return may_label, asked


async def review(obj: dict[str, Any], old: dict[str, Any] | None, *, user: dict[str, Any],
                 may_label: Any) -> Verdict:
    request = review_request(obj, operation="CREATE" if old is None else "UPDATE", gvr=NAMESPACES, old=old,
                             user=user, name="team-a")
    return await review_namespace(lambda: POLICY, may_label, request)


@pytest.mark.asyncio
@pytest.mark.parametrize(("answer", "expected"), [
    (True, recorded("granted", "alice", ADD, RBAC_BASIS)),
    (False, recorded("refused", "alice", ADD, NOT_LISTED, f"alice may not {ADD}: not on dra-quota's adminAccess "
                     "allowlist, and RBAC does not allow it to label adminaccess.draquota.io")),
    # Fail closed: a review that could not be asked refuses, and says to retry.
    (None, recorded("refused", "alice", ADD, NOT_LISTED, f"alice may not {ADD}: not on dra-quota's adminAccess "
                    "allowlist, and the API server could not be asked whether RBAC allows it to label "
                    "adminaccess.draquota.io; retry")),
], ids=["rbac-allows", "rbac-refuses", "cannot-ask"])
async def test_rbac_decides_who_the_allowlist_does_not_name(answer: bool | None, expected: Verdict) -> None:
    may_label, asked = rbac(answer)
    assert await review(namespace("true"), namespace(), user=ALICE, may_label=may_label) == expected
    assert asked == ["alice"]


@pytest.mark.asyncio
async def test_rbac_is_asked_only_when_the_allowlist_refuses_a_label_change() -> None:
    may_label, asked = rbac(True)
    listed = await review(namespace("true"), namespace(), user=ADMIN, may_label=may_label)
    assert listed == recorded("granted", "root-ops", ADD, GROUP)
    assert await review(namespace(), namespace(), user=ALICE, may_label=may_label) == Verdict(True)
    bad = namespace()
    bad["metadata"]["labels"] = ["not", "a", "map"]
    assert (await review(bad, namespace(), user=ALICE, may_label=may_label)).cause == "invalid"
    assert asked == []
    # Without a reviewer (no API server), the allowlist alone decides.
    assert await review(namespace("true"), namespace(), user=ALICE, may_label=None) == refused(ADD)
