"""Validating admission of Namespaces: who may touch the adminAccess label.

Neighbours: `webhook.endpoints` dispatches Namespace CREATE and UPDATE here, including
the `status` and `finalize` subresources (on 1.37 both write the whole object, labels
included: k/k pkg/registry/core/namespace/storage, StatusREST and FinalizeREST);
`quota.admission.policy` decides by the allowlist; `review_namespace` then asks RBAC
(`webhook.labelaccess`, a SubjectAccessReview) about a requester the allowlist does not
name, as the shipped ValidatingAdmissionPolicy asks the authorizer. Only the label `resource.kubernetes.io/admin-access` is read:
a Namespace is cluster infrastructure, so anything else about it, however odd, is not
ours to refuse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from kube.admissionreview import AdmissionRequest, UserInfo, Verdict
from quota.admission.admitter import ADMIN_ACCESS_LABEL
from quota.admission.policy import AUDIT_KEY, RBAC_BASIS, AdminAccessPolicy, judge_label_change
from quota.values.raw import dig, show

__all__ = ["MayLabel", "review_namespace", "update_namespace"]

# Whether RBAC lets a user grant adminAccess; None when the API server could not be asked.
MayLabel = Callable[[UserInfo], Awaitable[bool | None]]


def update_namespace(policy: Callable[[], AdminAccessPolicy], request: AdmissionRequest) -> Verdict:
    """CREATE or UPDATE (any subresource): a change of the label needs the allowlist."""
    new = _label(request.object, "request.object")
    old = _label(request.old_object, "request.oldObject") if request.operation == "UPDATE" else None
    if isinstance(new, Verdict):
        return new
    if isinstance(old, Verdict):
        return old
    record = judge_label_change(
        policy(),
        username=request.user.username,
        groups=request.user.groups,
        namespace=request.name or _name(request.object),
        old=old,
        new=new,
    )
    if record is None:
        return Verdict(True)
    audit = {AUDIT_KEY: record.audit_value}
    if record.outcome == "granted":
        return Verdict(True, audit_annotations=audit, records=(record,))
    return Verdict(
        False,
        f"{record.username or '(anonymous)'} may not {record.action}: not on dra-quota's adminAccess allowlist",
        audit_annotations=audit,
        records=(record,),
        cause="admin_access",
    )


async def review_namespace(policy: Callable[[], AdminAccessPolicy], may_label: MayLabel | None,
                           request: AdmissionRequest) -> Verdict:
    """`update_namespace`, and for a requester the allowlist refused, RBAC's answer."""
    verdict = update_namespace(policy, request)
    if verdict.allowed or verdict.cause != "admin_access" or may_label is None:
        return verdict
    (record,) = verdict.records
    allowed = await may_label(request.user)
    if allowed:
        granted = replace(record, outcome="granted", basis=RBAC_BASIS)
        return Verdict(True, audit_annotations={AUDIT_KEY: granted.audit_value}, records=(granted,))
    why = ("and the API server could not be asked whether RBAC allows it to label adminaccess.draquota.io; retry"
           if allowed is None else "and RBAC does not allow it to label adminaccess.draquota.io")
    return replace(verdict, message=f"{verdict.message}, {why}")


def _label(obj: Mapping[str, Any] | None, where: str) -> str | None | Verdict:
    labels = dig(obj, "metadata", "labels")
    if labels is not None and not isinstance(labels, dict):
        return Verdict(False, f"{where}.metadata.labels must be a map, got {show(labels)}", reason="Invalid", code=422,
                       cause="invalid")
    value = (labels or {}).get(ADMIN_ACCESS_LABEL)
    if value is not None and not isinstance(value, str):
        return Verdict(False, f"{where}.metadata.labels[{ADMIN_ACCESS_LABEL!r}] must be a string, got {show(value)}",
                       reason="Invalid", code=422, cause="invalid")
    return value


def _name(obj: Mapping[str, Any] | None) -> str:
    name = dig(obj, "metadata", "name")
    return name if isinstance(name, str) else ""
