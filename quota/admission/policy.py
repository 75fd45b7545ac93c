"""The adminAccess policy: who may use adminAccess, and who may grant it to a namespace.

Neighbours: `webhook.claimreview` asks it about claims and templates that request
`adminAccess: true`, `webhook.namespaces` about changes to the namespace label
`resource.kubernetes.io/admin-access`; the server turns each `PolicyRecord` into an
audit annotation, an Event and a metric. Pure: the configuration arrives as a dict
(a ConfigMap's data or flags) and `parse_policy` names any field it refuses.

Why an allowlist on top of the in-tree label rule (k/k pkg/registry/resource/utils.go,
AuthorizedForAdmin): the label is all the API server checks, so anyone who may update
their own namespace can grant themselves privileged access to devices other tenants use
(k/k#141293). The allowlist is the product's answer; the label rule stays as defence in
depth (`quota.admission.admitter`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from quota.values.raw import as_map, dig, show
from quota.values.validation import dns_label, dns_subdomain

__all__ = [
    "ADMIN_ACCESS_GRANT",
    "AUDIT_KEY",
    "CLAIM_CONTROLLER",
    "POD_CLAIM_NAME_ANNOTATION",
    "AdminAccessPolicy",
    "PolicyError",
    "PolicyRecord",
    "RBAC_BASIS",
    "judge_claim",
    "judge_label_change",
    "parse_policy",
    "stamped_from_pod",
]

# Who RBAC allows to add, change or remove the admin-access label: the (API group,
# resource, verb) of a cluster-scoped pseudo-resource of ours, asked of the authorizer by
# the ValidatingAdmissionPolicy (deploy/manifests/admin-access-policy.yaml) and by the
# webhook's SubjectAccessReview (`webhook.labelaccess`) alike. A verb no built-in role
# holds, so only `*` (cluster-admin) or the ClusterRole dra-quota-admin-access-labeler
# grants it; cluster-scoped, so a RoleBinding in one's own namespace does not.
ADMIN_ACCESS_GRANT = ("draquota.io", "adminaccess", "label")
RBAC_BASIS = "RBAC allows label on adminaccess.draquota.io"
# The one audit annotation key (the API server stores it as `<webhook name>/admin-access`).
AUDIT_KEY = "admin-access"
# kube-controller-manager builds the resourceclaim controller's client with
# NewClient("resource-claim-controller") (k/k cmd/kube-controller-manager/app/core.go):
# with --use-service-account-credentials (kubeadm's default) that is this account; a
# controller manager running on its own credentials creates claims as
# `system:kube-controller-manager`, which operators then list in claimControllers.
CLAIM_CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"
# Set by that controller on every claim it stamps out of a Pod's template
# (k/k pkg/controller/resourceclaim/controller.go, podResourceClaimAnnotation).
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_SERVICE_ACCOUNT = "system:serviceaccount:"
_FIELDS = ("users", "groups", "serviceAccounts", "claimControllers")
_WHITESPACE = re.compile(r"\s")
_SEPARATORS = re.compile(r"[,\n]")

Outcome = Literal["granted", "refused"]


class PolicyError(ValueError):
    """A policy configuration this tool cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class AdminAccessPolicy:
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    # "<namespace>:<name>", or "<namespace>:*" for every account of a namespace.
    service_accounts: frozenset[str] = frozenset()
    claim_controllers: frozenset[str] = frozenset({CLAIM_CONTROLLER})

    def basis(self, username: str, groups: Sequence[str]) -> str | None:
        """Why the requester is on the allowlist, or None when it is not."""
        if username in self.users:
            return f"allowlisted user {username}"
        if username.startswith(_SERVICE_ACCOUNT):
            namespace, _, name = username[len(_SERVICE_ACCOUNT):].partition(":")
            for entry in (f"{namespace}:{name}", f"{namespace}:*"):
                if entry in self.service_accounts:
                    return f"allowlisted service account {entry}"
        group = next((g for g in groups if g in self.groups), None)
        return None if group is None else f"allowlisted group {group}"


@dataclass(frozen=True, slots=True)
class PolicyRecord:
    """One grant or refusal: an audit annotation now, an Event and a metric in the server."""

    outcome: Outcome
    username: str
    # e.g. "create ResourceClaim team-a/gpu-x7k2q with adminAccess"
    action: str
    # why: "allowlisted user alice", "not on the adminAccess allowlist", ...
    basis: str
    kind: str
    namespace: str
    name: str

    @property
    def audit_value(self) -> str:
        return f"{self.outcome}: {self.username or '(anonymous)'} may{'' if self.outcome == 'granted' else ' not'} {self.action} ({self.basis})"


def judge_claim(
    policy: AdminAccessPolicy,
    *,
    username: str,
    groups: Sequence[str],
    kind: str,
    namespace: str,
    name: str,
    from_pod: bool = False,
) -> PolicyRecord:
    """May this requester create a claim or template asking for adminAccess?

    Claims stamped out of a Pod's template (`from_pod`, see `stamped_from_pod`) are
    created by the resourceclaim controller, not by the Pod's author: they are judged by
    their template, which was judged at its own CREATE and whose spec is immutable
    (k/k pkg/apis/resource/validation, ValidateResourceClaimTemplateUpdate), so the
    controller's account is allowed for them and for nothing else.
    """
    action = f"create {kind} {namespace}/{name} with adminAccess"
    basis = policy.basis(username, groups)
    if basis is None and from_pod and username in policy.claim_controllers:
        basis = "stamped from a Pod's ResourceClaimTemplate, judged at the template's CREATE"
    if basis is None:
        return PolicyRecord("refused", username, action, "not on the adminAccess allowlist", kind, namespace, name)
    return PolicyRecord("granted", username, action, basis, kind, namespace, name)


def judge_label_change(
    policy: AdminAccessPolicy,
    *,
    username: str,
    groups: Sequence[str],
    namespace: str,
    old: str | None,
    new: str | None,
) -> PolicyRecord | None:
    """May this requester add, change or remove the admin-access label? None: unchanged."""
    if old == new:
        return None
    if old is None:
        action = f"add label resource.kubernetes.io/admin-access={show(new)} to Namespace {namespace}"
    elif new is None:
        action = f"remove label resource.kubernetes.io/admin-access from Namespace {namespace}"
    else:
        action = f"change label resource.kubernetes.io/admin-access from {show(old)} to {show(new)} on Namespace {namespace}"
    basis = policy.basis(username, groups)
    outcome: Outcome = "refused" if basis is None else "granted"
    return PolicyRecord(outcome, username, action, basis or "not on the adminAccess allowlist", "Namespace", "", namespace)


def stamped_from_pod(obj: Mapping[str, Any]) -> bool:
    """Whether a claim looks like one the resourceclaim controller made for a Pod.

    Both marks the controller sets (k/k pkg/controller/resourceclaim/controller.go,
    handleClaim): the pod-claim-name annotation and a controlling ownerReference to the
    Pod. Anyone may forge them, which is why they only count together with the
    controller's own account (`judge_claim`).
    """
    annotations = as_map(dig(obj, "metadata", "annotations"))
    owners = dig(obj, "metadata", "ownerReferences")
    return POD_CLAIM_NAME_ANNOTATION in annotations and isinstance(owners, list) and any(
        isinstance(o, dict) and o.get("apiVersion") == "v1" and o.get("kind") == "Pod" and o.get("controller") is True
        for o in owners
    )


def parse_policy(raw: Mapping[str, Any]) -> AdminAccessPolicy:
    """The policy from a ConfigMap's data or flags: each field a list, or names separated by commas or newlines."""
    if not isinstance(raw, dict):
        raise PolicyError(f"the adminAccess policy must be a map, got {show(raw)}")
    unknown = [k for k in raw if k not in _FIELDS]
    if unknown:
        raise PolicyError(f"adminAccess policy: unknown field {show(unknown[0])}: use {', '.join(_FIELDS)}")
    users = _names(raw.get("users"), "users")
    groups = _names(raw.get("groups"), "groups")
    accounts = _names(raw.get("serviceAccounts"), "serviceAccounts")
    for i, account in enumerate(accounts):
        namespace, sep, name = account.partition(":")
        where = f"adminAccess policy: serviceAccounts[{i}]"
        if not sep:
            raise PolicyError(f"{where}: {show(account)} must be <namespace>:<name> or <namespace>:*")
        dns_label(namespace, f"{where}: namespace", PolicyError)
        if name != "*":
            dns_subdomain(name, f"{where}: name", PolicyError)
    controllers = _names(raw["claimControllers"], "claimControllers") if "claimControllers" in raw else (CLAIM_CONTROLLER,)
    return AdminAccessPolicy(frozenset(users), frozenset(groups), frozenset(accounts), frozenset(controllers))


def _names(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        # As the ValidatingAdmissionPolicy reads the same ConfigMap (deploy/manifests/
        # admin-access-policy.yaml): commas or newlines separate names.
        value = [part.strip() for part in _SEPARATORS.split(value) if part.strip()]
    if not isinstance(value, list):
        raise PolicyError(f"adminAccess policy: {field} must be a list of names or a comma-separated string, got {show(value)}")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or len(name) > 1024 or _WHITESPACE.search(name):
            raise PolicyError(f"adminAccess policy: {field}[{i}] must be a non-empty name without spaces, got {show(name)}")
    return tuple(value)
