"""AdmissionReview v1 on the wire: a request body in, a review to send back out.

Neighbours: the aiohttp server hands request bodies to `parse_review` and sends what
`respond` builds; the per-kind handlers turn an `AdmissionRequest` into a `Verdict`.
Shapes: k/k staging/src/k8s.io/api/admission/v1/types.go. Every body gets a
well-formed review back, however broken it is: a review that cannot be read is
denied with a message saying what is wrong (and echoes the uid when one was found),
never answered with a 500. The JSON on both sides is typed (`ReviewRequest` in, every
field untrusted until parsed; `AdmissionReview` out), so a misspelt field is a type error.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Required, TypedDict, cast, get_args

from quota.admission.policy import PolicyRecord
from quota.reports.printable import for_terminal
from quota.values.raw import show

__all__ = [
    "API_VERSION",
    "AdmissionRequest",
    "AdmissionReview",
    "ReviewRequest",
    "ReviewResponse",
    "ReviewStatus",
    "CAUSES",
    "Cause",
    "GroupVersionKind",
    "GroupVersionResource",
    "ReviewError",
    "UserInfo",
    "Verdict",
    "parse_review",
    "respond",
]

API_VERSION = "admission.k8s.io/v1"
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
# Why a review was denied (or admitted with warnings), as a closed set: the `reason`
# label of draquota_admission_requests_total (webhook.metrics), so never free text.
# quota: a DeviceQuota's hard (denied, or admitted over an Audit quota); admin_access: the allowlist or the namespace label;
# pricing: the claim cannot be priced (CEL error, unknown class, no memory to charge);
# annotations: a change to our annotations; invalid: a malformed review or object;
# unavailable: the reservation could not be persisted; timeout, error: ours.
Cause = Literal["none", "quota", "admin_access", "pricing", "annotations", "invalid", "unavailable", "timeout", "error"]
CAUSES: tuple[Cause, ...] = get_args(Cause)
_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
# Audit annotation keys: the API server stores `<webhook name>/<key>` and silently drops
# keys that do not make a valid qualified name, so the key must be one name segment.
_AUDIT_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Warnings travel as HTTP Warning headers: the API server truncates long ones (k8s.io/
# apiserver pkg/endpoints/filters/warning.go), so keep each readable and bounded.
MAX_WARNING_CHARS = 512
_SURROGATE = re.compile("[\ud800-\udfff]")


class ReviewRequest(TypedDict, total=False):
    """`request` of an AdmissionReview as received: every value is unchecked (`object`)
    until `parse_review` has read it; the keys are the only thing typed."""

    uid: object
    kind: object
    resource: object
    subResource: object
    name: object
    namespace: object
    operation: object
    userInfo: object
    object: object
    oldObject: object
    dryRun: object


class ReviewStatus(TypedDict):
    """metav1.Status, as much of it as a denial carries."""

    code: int
    reason: str
    message: str


class ReviewResponse(TypedDict, total=False):
    uid: Required[str]
    allowed: Required[bool]
    status: ReviewStatus
    warnings: list[str]
    patchType: Literal["JSONPatch"]
    patch: str  # base64 of a JSON Patch
    auditAnnotations: dict[str, str]


class AdmissionReview(TypedDict):
    """The review we send back."""

    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: ReviewResponse


class ReviewError(ValueError):
    """A body that is not an AdmissionReview request we can answer; `uid` if one was read."""

    def __init__(self, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.uid = uid


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True, slots=True)
class GroupVersionResource:
    group: str
    version: str
    resource: str


@dataclass(frozen=True, slots=True)
class UserInfo:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    # The authenticator's extra attributes, key -> values, sorted: a webhook authorizer (and
    # OpenShift's scoped tokens) decide on them, so an access review must carry them.
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    sub_resource: str
    name: str
    namespace: str
    operation: Operation
    user: UserInfo
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a handler decided; `respond` turns it into the review's `response`."""

    allowed: bool
    message: str = ""
    # metav1.StatusReason and HTTP code of a denial (in-tree quota uses Forbidden/403).
    reason: str = "Forbidden"
    code: int = 403
    warnings: tuple[str, ...] = ()
    patch: Sequence[Mapping[str, Any]] = ()
    audit_annotations: Mapping[str, str] = field(default_factory=dict)
    # adminAccess grants and refusals: not on the wire; the server turns each into an
    # Event and a metric (the audit annotation already carries it in the response).
    records: tuple[PolicyRecord, ...] = ()
    # Not on the wire either: why it was denied (the metric's reason) and, for a quota
    # denial, the DeviceQuotas that denied it (each gets an Event). An admission over an
    # Audit quota's hard is allowed with cause "quota" and that quota in `quotas`.
    cause: Cause = "none"
    quotas: tuple[str, ...] = ()
    # An admitted allocation whose exact charge is above the one recorded at admission:
    # the note of the claim's ChargedAboveReservation Event (`kube.events`), else "".
    charged_above: str = ""


def parse_review(review: Any) -> AdmissionRequest:
    """The request of a decoded AdmissionReview (ReviewError naming the field otherwise)."""
    if not isinstance(review, dict):
        raise ReviewError("the body must be a JSON object (an AdmissionReview)")
    raw = review.get("request")
    request = cast(ReviewRequest, raw) if isinstance(raw, dict) else None
    found = request.get("uid") if request is not None else None
    uid = found if isinstance(found, str) else ""
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise ReviewError(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got apiVersion "
            f"{show(review.get('apiVersion'))} kind {show(review.get('kind'))} "
            "(set admissionReviewVersions: [v1] in the webhook configuration)",
            uid,
        )
    if request is None:
        raise ReviewError("request is missing or not an object", uid)
    if not uid:
        raise ReviewError("request.uid is missing or not a string")
    operation = request.get("operation")
    if operation not in _OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(_OPERATIONS)}, got {show(operation)}", uid)
    return AdmissionRequest(
        uid=uid,
        kind=GroupVersionKind(*_strings(request.get("kind"), "request.kind", ("group", "version", "kind"), uid)),
        resource=GroupVersionResource(
            *_strings(request.get("resource"), "request.resource", ("group", "version", "resource"), uid)
        ),
        sub_resource=_string(request.get("subResource"), "request.subResource", uid),
        name=_string(request.get("name"), "request.name", uid),
        namespace=_string(request.get("namespace"), "request.namespace", uid),
        operation=cast(Operation, operation),
        user=_user(request.get("userInfo"), uid),
        object=_object(request.get("object"), "request.object", uid),
        old_object=_object(request.get("oldObject"), "request.oldObject", uid),
        dry_run=request.get("dryRun") is True,
    )


def respond(uid: str, verdict: Verdict) -> AdmissionReview:
    """The AdmissionReview to send back for request `uid`."""
    # The API server's uids are UUIDs; anything else cannot match its request anyway,
    # and a lone surrogate in it would make the answer unencodable (a 500).
    response: ReviewResponse = {"uid": for_terminal(uid), "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {
            "code": verdict.code,
            "reason": verdict.reason,
            "message": for_terminal(verdict.message),
        }
    if verdict.warnings:
        response["warnings"] = [_warning(w) for w in verdict.warnings]
    if verdict.patch and verdict.allowed:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode("ascii")
    annotations = {k: for_terminal(v) for k, v in verdict.audit_annotations.items()}
    for key in annotations:
        if not _AUDIT_KEY.match(key):
            raise ValueError(f"audit annotation key {key!r} is not one name segment of at most 63 characters")
    if annotations:
        response["auditAnnotations"] = annotations
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _warning(text: str) -> str:
    text = for_terminal(text)
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 1] + "…"


def _string(value: Any, where: str, uid: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"{where} must be a string", uid)
    return value


def _strings(value: Any, where: str, keys: tuple[str, str, str], uid: str) -> tuple[str, str, str]:
    if not isinstance(value, dict):
        raise ReviewError(f"{where} is missing or not an object", uid)
    a, b, c = (_string(value.get(k), f"{where}.{k}", uid) for k in keys)
    return a, b, c


def _user(value: Any, uid: str) -> UserInfo:
    if value is None:
        return UserInfo("")
    if not isinstance(value, dict):
        raise ReviewError("request.userInfo must be an object", uid)
    groups = value.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups must be a list of strings", uid)
    extra = value.get("extra") or {}
    if not isinstance(extra, dict) or not all(
            isinstance(values, list) and all(isinstance(v, str) for v in values) for values in extra.values()):
        raise ReviewError("request.userInfo.extra must map names to lists of strings", uid)
    return UserInfo(
        _string(value.get("username"), "request.userInfo.username", uid),
        _string(value.get("uid"), "request.userInfo.uid", uid),
        tuple(groups),
        tuple(sorted((str(key), tuple(values)) for key, values in extra.items())),
    )


def _object(value: Any, where: str, uid: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"{where} must be an object", uid)
    if _holds_lone_surrogate(value):
        # Python's json accepts a "\ud800" escape; Go's encoding/json (the API server)
        # never sends one (it decodes it to U+FFFD). Such a string cannot be encoded as
        # UTF-8, which every layer below (CEL, messages, patches) assumes.
        raise ReviewError(f"{where} holds a lone UTF-16 surrogate, which the API server never sends", uid)
    return value


def _holds_lone_surrogate(value: Any) -> bool:
    """Any string in `value` (keys included) with a lone surrogate; iterative, for any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
