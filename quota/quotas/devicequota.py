"""DeviceQuota and ClusterDeviceQuota objects (draquota.io/v1alpha1) and the pure admission check.

Neighbours: `quota.accounting.ledger` keeps each quota's usage and calls `check` to admit a claim;
`deploy/crds/devicequota.yaml` and `deploy/crds/clusterdevicequota.yaml` are the schemas
these parsers accept. A ClusterDeviceQuota (a team's quota) is a `DeviceQuota` with no
namespace and a namespace selector (`quota.values.labelselector`); `quota.accounting.teams` keeps which
namespaces it selects. Like the in-tree
`CheckRequest` (staging/src/k8s.io/apiserver/pkg/admission/plugin/resourcequota/
controller.go) the check takes quotas and usage in and returns a decision: inputs are
never modified, and the denial lists requested / used / reserved / limited per
exceeded resource in a stable (sorted) order. `DeviceQuotaStatus` types the status the
writers build (`quota.accounting.reservations`, `quota.status.quotastatus`), field for field as the CRD's
status schema names them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Required, TypedDict

from quota.quotas.advice import advice, case_of, worst
from quota.quotas.scope import Scope, parse_scope
from quota.quotas.windows import Window, effective_for_admission, hard_at, hard_note, parse_windows
from quota.values.labelselector import LabelSelector, parse_label_selector
from quota.values.meta import parse_meta, require_version
from quota.values.model import ZERO, Charge, Limits, Mode, Namespace
from quota.values.quantity import ceil_int, format_quantity, non_negative_amount
from quota.values.raw import show
from quota.values.validation import integer

__all__ = [
    "GOVERNED_LABEL",
    "GROUP",
    "VERSION",
    "KIND",
    "PLURAL",
    "CLUSTER_KIND",
    "CLUSTER_PLURAL",
    "TEAM_LABEL_PREFIX",
    "NAME_LABEL",
    "SELECTOR_KEYS_MESSAGE",
    "Amounts",
    "LimitAmounts",
    "ClaimCounts",
    "Condition",
    "DeviceQuotaStatus",
    "ClusterDeviceQuotaStatus",
    "NamespaceUsage",
    "ReservationEntry",
    "ReservedBy",
    "QuotaError",
    "DeviceQuota",
    "Usage",
    "QuotaCheck",
    "Decision",
    "parse_device_quota",
    "parse_cluster_device_quota",
    "check",
    "in_force",
    "ref_of",
    "format_amount",
    "format_resource",
]

GROUP = "draquota.io"
# The label the quota controller's leader keeps on every namespace a DeviceQuota governs
# (`controllers.governed`): the webhook configuration fails closed there, open elsewhere.
GOVERNED_LABEL = "draquota.io/governed"
VERSION = "v1alpha1"
KIND = "DeviceQuota"
PLURAL = "devicequotas"
CLUSTER_KIND = "ClusterDeviceQuota"
CLUSTER_PLURAL = "clusterdevicequotas"
# The only label keys a namespaceSelector may use (the CRD's rule says the same): labels a
# tenant cannot change. The API server sets `kubernetes.io/metadata.name` and refuses to
# change it; the chart's ValidatingAdmissionPolicy lets only configured principals set a
# `team.draquota.io/` label. A tenant who could relabel its namespace could leave its team.
NAME_LABEL = "kubernetes.io/metadata.name"
TEAM_LABEL_PREFIX = "team.draquota.io/"


class Amounts(TypedDict):
    """`status.used`, `status.reserved`: memory as a quantity (`160Gi`), devices a count."""

    memory: str
    devices: int


class LimitAmounts(TypedDict, total=False):
    """`status.effectiveHard`: as `spec.hard`, only the resources limited."""

    memory: str
    devices: int


class ReservedBy(TypedDict, total=False):
    claims: Amounts
    workloads: Amounts
    leases: Amounts  # replicas' chunks of headroom (`quota.accounting.headroom`), counted whole


class ClaimCounts(TypedDict):
    allocated: int
    pending: int


class Condition(TypedDict, total=False):
    type: Required[str]
    status: Required[str]  # "True" or "False"
    reason: Required[str]
    message: Required[str]
    lastTransitionTime: str
    observedGeneration: int


class ReservationEntry(TypedDict, total=False):
    """One entry of `status.reservations` (by claim or Workload uid)."""

    claim: Required[str]
    memory: Required[str]
    devices: Required[int]
    expires: Required[str]
    source: str  # absent: "Claim"


class NamespaceUsage(TypedDict):
    """One item of a ClusterDeviceQuota's `status.namespaces`: a member's part."""

    namespace: str
    used: Amounts
    reserved: Amounts
    claims: ClaimCounts


class DeviceQuotaStatus(TypedDict, total=False):
    """A DeviceQuota's status as written. Each writer owns some fields (`quota.status.quotastatus`
    says which) and carries the others as read: the API server prunes what the schema does
    not name, so what is read has only these fields."""

    used: Amounts
    reserved: Amounts
    reservedBy: ReservedBy
    claims: ClaimCounts
    observedGeneration: int
    conditions: list[Condition]
    reservations: dict[str, ReservationEntry]
    claimsThrough: str
    # A quota with windows only (`quota.quotas.windows`): the hard in force (spec.hard with the
    # active window's over it), the active window's name (absent: none), and when the hard
    # in force next changes (absent: not within 400 days).
    effectiveHard: LimitAmounts
    activeWindow: str
    nextChange: str


class ClusterDeviceQuotaStatus(DeviceQuotaStatus, total=False):
    """A ClusterDeviceQuota's status: a DeviceQuota's, with the team's totals, and the
    per-namespace breakdown, sorted by namespace."""

    namespaces: list[NamespaceUsage]
    namespacesThrough: str  # the team's second watermark (`quota.accounting.reservations`)

Enforcement = Literal["Enforce", "Audit"]
RESOURCES = ("devices", "memory")  # sorted: the order denial messages use


class QuotaError(ValueError):
    """A DeviceQuota this tool cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class DeviceQuota:
    namespace: Namespace
    name: str
    hard: Limits
    # What it charges: `spec.deviceClassNames` and `spec.devices` (`quota.quotas.scope`).
    scope: Scope = Scope()
    enforcement: Enforcement = "Enforce"
    # None: the global pricing mode applies.
    mode: Mode | None = None
    # A ClusterDeviceQuota's `spec.namespaceSelector`; None for a DeviceQuota.
    selector: LabelSelector | None = None
    # `spec.windows`: other hards in force for a while (`quota.quotas.windows`); `hard` is the
    # quota's own, in force outside every window.
    windows: tuple[Window, ...] = ()
    # Why `hard` is what it is when a window set it or just ended (`in_force`), for a
    # denial to name; "" for a quota as parsed.
    hard_note: str = ""
    # The quota's own `spec.hard` when `hard` is the one in force (`in_force`): a denial
    # says whether the window's end would let the request in. None for a quota as parsed.
    own_hard: Limits | None = None

    @property
    def cluster(self) -> bool:
        """A ClusterDeviceQuota (a team's quota, over the namespaces its selector picks)."""
        return self.selector is not None

    @property
    def kind(self) -> str:
        return CLUSTER_KIND if self.cluster else KIND

    @property
    def ref(self) -> str:
        """How a decision names it (`Decision.denied_by`): a DeviceQuota by its name (the
        claim's namespace is the rest), a ClusterDeviceQuota as `ClusterDeviceQuota/<name>`
        (no name holds a '/'): `ref_of` reads it back."""
        return f"{CLUSTER_KIND}/{self.name}" if self.cluster else self.name


@dataclass(frozen=True, slots=True)
class Usage:
    """A quota's usage: exact from allocated claims, estimated for admitted pending ones."""

    used: Charge = ZERO
    reserved: Charge = ZERO
    allocated_claims: int = 0
    pending_claims: int = 0
    # The part of `reserved` admitted Kueue Workloads hold beyond their Pods' claims
    # (`quota.accounting.workloads`); the rest of `reserved` is claims'.
    workloads: Charge = ZERO
    # Claims counted with devices that have no memory, charged 0 memory under a memory
    # limit (a scope naming an RDMA NIC's class or driver: `Entry.unmetered_in`).
    unmetered_claims: int = 0


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    quota: DeviceQuota
    usage: Usage
    charge: Charge

    def charge_of(self, resource: str) -> int:
        return self.charge.amount(resource)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()
    # Quotas the claim is charged to (Audit ones included), by `DeviceQuota.ref`: the
    # draquota.io/quotas annotation (a team as `ClusterDeviceQuota/<name>`).
    charged: tuple[str, ...] = field(default=())
    # The Enforce quotas that denied it, by `DeviceQuota.ref`: the webhook's Events regard each.
    denied_by: tuple[str, ...] = ()
    # The Audit quotas it exceeds, admitted with a warning: recorded the same way.
    warned_by: tuple[str, ...] = ()


def parse_device_quota(obj: Mapping[str, Any]) -> DeviceQuota:
    """A DeviceQuota, checked against deploy/crds/devicequota.yaml's schema."""
    namespace, name, where, spec = _envelope(obj, KIND)
    return _parse_spec(spec, namespace, name, where)


def _envelope(obj: Mapping[str, Any], kind: str) -> tuple[Namespace, str, str, Mapping[str, Any]]:
    """(namespace, name, how messages name it, spec) of a quota of `kind`."""
    if not isinstance(obj, dict):
        raise QuotaError(f"a {kind} must be an object")
    require_version(obj, kind, QuotaError)
    meta = parse_meta(obj, kind, QuotaError, namespaced=kind == KIND)
    where = f"{kind} {meta.namespace}/{meta.name}" if kind == KIND else f"{kind} {meta.name}"
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise QuotaError(f"{where}: spec is required")
    return Namespace(meta.namespace), meta.name, where, spec


def parse_cluster_device_quota(obj: Mapping[str, Any]) -> DeviceQuota:
    """A ClusterDeviceQuota, checked against deploy/crds/clusterdevicequota.yaml's schema:
    DeviceQuota's spec and a `namespaceSelector` keyed only by labels no tenant can change."""
    _, name, where, spec = _envelope(obj, CLUSTER_KIND)
    if "namespaceSelector" not in spec:
        raise QuotaError(f"{where}: spec.namespaceSelector is required ({{}} selects every namespace)")
    selector = parse_label_selector(spec["namespaceSelector"], f"{where}: spec.namespaceSelector", QuotaError)
    for key in sorted(selector.keys()):
        if key != NAME_LABEL and not key.startswith(TEAM_LABEL_PREFIX):
            raise QuotaError(f"{where}: spec.namespaceSelector: {SELECTOR_KEYS_MESSAGE}, got {show(key)}")
    quota = _parse_spec({k: v for k, v in spec.items() if k != "namespaceSelector"}, Namespace(""), name, where)
    return replace(quota, selector=selector)


# The CRD's x-kubernetes-validations message, word for word.
SELECTOR_KEYS_MESSAGE = (
    "a namespaceSelector may use only the label keys kubernetes.io/metadata.name and team.draquota.io/*: "
    "labels a tenant cannot change (the API server sets the first; dra-quota's ValidatingAdmissionPolicy "
    "lets only cluster admins set the others), so no tenant can move its namespace out of its team"
)


def _parse_spec(spec: Mapping[str, Any], namespace: Namespace, name: str, where: str) -> DeviceQuota:
    hard = spec.get("hard") or {}
    if not isinstance(hard, dict):
        raise QuotaError(f"{where}: spec.hard must be a map, got {show(hard)}")
    limits = _hard(hard, f"{where}: spec.hard")
    windows = parse_windows(spec.get("windows"), where, limits, QuotaError, _hard)
    scope = parse_scope(spec, where, QuotaError)
    enforcement = spec.get("enforcement") or "Enforce"
    if enforcement not in ("Enforce", "Audit"):
        raise QuotaError(f"{where}: spec.enforcement must be Enforce or Audit, got {show(enforcement)}")
    mode = spec.get("pricing")
    if mode not in (None, "Conservative", "Optimistic"):
        raise QuotaError(f"{where}: spec.pricing must be Conservative or Optimistic, got {show(mode)}")
    enforcement_value: Enforcement = "Audit" if enforcement == "Audit" else "Enforce"
    return DeviceQuota(
        namespace=namespace,
        name=name,
        hard=limits,
        scope=scope,
        enforcement=enforcement_value,
        mode=None if mode is None else ("optimistic" if mode == "Optimistic" else "conservative"),
        windows=windows,
    )


def _hard(hard: Mapping[str, Any], where: str) -> Limits:
    """`spec.hard` or a window's `hard`; `where` names it."""
    unknown = [key for key in hard if key not in RESOURCES]
    if unknown:
        names = ", ".join(show(k) for k in unknown[:4])
        raise QuotaError(f"{where}: unsupported resource(s) {names}: use memory, devices")
    devices = hard.get("devices")
    return Limits(
        memory=_limit(hard.get("memory"), f"{where}.memory"),
        # The CRD types devices as a non-negative int64, not a quantity.
        devices=None if devices is None else integer(devices, f"{where}.devices", QuotaError),
    )


def _limit(raw: Any, where: str) -> int | None:
    if raw is None:
        return None
    return ceil_int(non_negative_amount(raw, where, QuotaError))


def in_force(quota: DeviceQuota, at: datetime, skew: timedelta) -> DeviceQuota:
    """`quota` as admission checks it at `at`: its `hard`, per resource, the smallest in force
    within `skew` of `at` (`quota.quotas.windows.effective_for_admission`). For a quota as parsed:
    the result's `hard` is no longer `spec.hard`, so it must not be given here again."""
    if not quota.windows:
        return quota
    hard = effective_for_admission(quota.hard, quota.windows, at, skew)
    # The note explains the instant whose hard admission uses: around a boundary, the side
    # of it the skew picked (a decrease applies early, an increase late).
    when = next((t for t in (at + skew, at - skew) if hard_at(quota.hard, quota.windows, t)[0] == hard), at)
    return replace(quota, hard=hard, hard_note=hard_note(quota.hard, quota.windows, when), own_hard=quota.hard)


def ref_of(ref: str) -> tuple[str, str]:
    """(kind, name) of a `DeviceQuota.ref`."""
    kind, _, name = ref.rpartition("/")
    return (kind or KIND), name


def format_amount(resource: str, value: int) -> str:
    """Memory as a quantity (`80Gi`), devices as a count."""
    return format_quantity(value) if resource == "memory" else str(value)


def format_resource(resource: str, value: int) -> str:
    return f"{resource}={format_amount(resource, value)}"


def check(checks: Sequence[QuotaCheck], *, namespace: str = "") -> Decision:
    """Admit a charge only if `used + reserved + charge <= hard` for every Enforce quota.

    `usage.reserved` already includes reservations still in flight. Audit quotas never
    deny: an excess becomes a warning. A denial is the in-tree form for each quota that
    refused, then what the requester can do about each (`quota.quotas.advice`); `namespace` is
    the requester's, which a team quota's advice names ("": unknown).
    """
    denials, advices, warnings, denied_by, warned_by = [], [], [], [], []
    for item in checks:
        exceeded = [
            r for r in RESOURCES
            if (limit := item.quota.hard.get(r)) is not None
            and item.charge_of(r) > 0
            and item.usage.used.amount(r) + item.usage.reserved.amount(r) + item.charge_of(r) > limit
        ]
        if not exceeded:
            continue
        message = _exceeded_message(item, exceeded)
        if item.quota.enforcement == "Audit":
            warnings.append(f"{message} (enforcement: Audit, admitted)")
            warned_by.append(item.quota.ref)
        else:
            denials.append(message)
            advices.append(_advice(item, exceeded, namespace))
            denied_by.append(item.quota.ref)
    charged = tuple(item.quota.ref for item in checks if not item.charge.is_zero())
    if denials:
        return Decision(False, "; ".join((*denials, *advices)), tuple(warnings), (),
                        tuple(denied_by), tuple(warned_by))
    return Decision(True, "", tuple(warnings), charged, (), tuple(warned_by))


def _advice(item: QuotaCheck, exceeded: list[str], namespace: str) -> str:
    quota = item.quota
    own = quota.own_hard
    cases = [case_of(requested=item.charge_of(r), used=item.usage.used.amount(r), limited=quota.hard.get(r) or 0,
                     own=None if own is None else own.get(r))
             for r in exceeded]
    return advice(kind=quota.kind, name=quota.name, team=quota.cluster,
                  namespace=namespace if quota.cluster else quota.namespace, case=worst(cases))


def _exceeded_message(item: QuotaCheck, exceeded: list[str]) -> str:
    def fmt(values: Charge | Limits) -> str:
        return ",".join(
            format_resource(r, (values.amount(r) if isinstance(values, Charge) else values.get(r)) or 0)
            for r in exceeded
        )

    return (
        f'exceeded {item.quota.kind} "{item.quota.name}": requested {fmt(item.charge)}, used {fmt(item.usage.used)}, '
        f"reserved {fmt(item.usage.reserved)}, limited {fmt(item.quota.hard)}"
        + (f" ({item.quota.hard_note})" if item.quota.hard_note else "")
    )
