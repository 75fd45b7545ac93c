"""Validating admission of ResourceClaims and ResourceClaimTemplates: requests in, Verdicts out.

Neighbours: `webhook.endpoints` dispatches here by resource, subresource and operation;
`quota.admission.admitter.Admitter` prices; `kube.quotawriter.Reservations` checks a claim
against the reservations persisted on each DeviceQuota's status and persists its own
(the one admission protocol: `dra-quota serve`'s, with several replicas or one);
`quota.admission.policy` judges adminAccess. A thin adapter in kueue's pkg/webhooks style: read
the object, call the domain, say what it decided. The ledger only prices a claim CREATE
(it holds what this replica's cache holds, not what other replicas admitted); the one
await between the check and the answer is the conditional status write, made safe by
its resourceVersion precondition (`kube.statuswriter`). No other Kubernetes I/O:
namespace labels and the policy come from the caller's caches.

Reservations are keyed by the claim's uid (`quota.admission.admitter.claim_ref`): a validating
webhook sees the name and uid the API server generated for a `generateName` create,
a name collision re-runs admission under a new name and uid, and the same uid seen twice
(a retried call) replaces its reservation instead of counting twice. The scheduler's
attempts at one Pod's extended-resource claim replace each other's unconfirmed
reservations (`_series`), so attempts refused after us do not pile up until their TTL.

Our annotations (`draquota.io/charge`, `draquota.io/quotas`, and after allocation the
allocation record, `quota.objects.allocationrecord`) are written by the quota controller's leader once the
claim exists (`controllers.annotator`), so a create costs one webhook call. A new claim
or template may not carry them (`supplied`) and a later change by anyone but us is
refused (`update_claim`): queue managers and dashboards read them as ours, so a tenant
cannot publish a smaller charge than the one counted. The ledger keeps its own record
of each claim's charge; the annotations are what others read, and a floor when a
claim is priced again.

A claim DELETE is not ours to judge: a reservation ends when the claim watch delivers
the deletion (`kube.claimstore.ClaimStore.delete`), never at the DELETE's admission,
which a later admission step may still refuse: a claim whose DELETE is refused lives on
and must keep its charge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kube.admissionreview import AdmissionRequest, Cause, UserInfo, Verdict
from kube.quotawriter import Reservations
from kube.recounts import Recounter
from quota.accounting.excess import allocation_key
from quota.accounting.ledgerentry import Entry
from quota.accounting.reservationrecord import parse_version
from quota.admission.admissiontoken import ADMISSION_ANNOTATION
from quota.admission.admitter import ADMIN_ACCESS_MESSAGE, Admission, Admitter, claim_ref, object_ref
from quota.admission.policy import AUDIT_KEY, AdminAccessPolicy, PolicyRecord, judge_claim, stamped_from_pod
from quota.objects.allocationrecord import ALLOCATED_CHARGE_ANNOTATION, RECORD_ANNOTATIONS, record_annotations
from quota.objects.claims import CHARGE_ANNOTATION, QUOTAS_ANNOTATION, Claim, claim_record, pod_owner
from quota.objects.claimspec import ClaimError
from quota.objects.extended import attempt_series
from quota.objects.jsonclaims import parse_json_claim
from quota.values.model import RecordKey
from quota.values.raw import as_map, dig, show
from quota.values.work import Budget
from runtime.slicing import Slicer

__all__ = [
    "Admitted",
    "AllocationCheck",
    "ClaimContext",
    "admit_new",
    "allocate_claim",
    "create_claim",
    "create_template",
    "parse_request_claim",
    "supplied",
    "update_claim",
    "with_namespace",
]

AllocationCheck = Literal["enforce", "account-only"]
NamespaceLabels = Callable[[str], Mapping[str, str] | None]
OUR_ANNOTATIONS = (CHARGE_ANNOTATION, QUOTAS_ANNOTATION)
# Every annotation only dra-quota writes (the leader, `controllers.annotator`): none may
# come with a new claim or template.
WRITTEN_BY_US = (*OUR_ANNOTATIONS, *RECORD_ANNOTATIONS, ADMISSION_ANNOTATION)
# kube-scheduler's identity (its bootstrap ClusterRole binds this user): it creates the
# claims for Pods' extended resources.
SCHEDULER = "system:kube-scheduler"


@dataclass(frozen=True, slots=True)
class ClaimContext:
    """What the claim handlers need: the domain, and the caches the server keeps."""

    admitter: Admitter
    # Labels of a namespace from the cache, None when it is not known (yet).
    namespace_labels: NamespaceLabels
    # Called per request, so a reloaded ConfigMap applies to the next review.
    policy: Callable[[], AdminAccessPolicy]
    # The reservations persisted on DeviceQuota status (`kube.quotawriter`): what a
    # claim CREATE is checked against and reserves in.
    reservations: Reservations
    allocation_check: AllocationCheck = "enforce"
    # Set when Kueue is on (`controllers.kueue.PodLookup`): reads a claim's Pod the Pod cache
    # does not know yet, so a claim of an admitted Workload draws on its holding.
    learn_pod: Callable[[Claim, str], Awaitable[None]] | None = None
    # Runs pricing in slices, expensive reviews in a bounded slow lane (`runtime.slicing`).
    slicer: Slicer = field(default_factory=Slicer)
    # The teams' recounts (`kube.recounts`): a claim charged to a team being recounted waits for it.
    recounts: Recounter | None = None
    # Whether RBAC lets a user grant adminAccess (`webhook.labelaccess`), asked about a
    # namespace label change the allowlist refused; None: the allowlist alone decides.
    may_label: Callable[[UserInfo], Awaitable[bool | None]] | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A claim CREATE's verdict, and the claim as priced when it was (its charge
    annotations are built from it: `Annotating.charge_annotations`)."""

    verdict: Verdict
    entry: Entry | None = None
    # Some quota was charged: the admission left an entry (or a lease's part) to settle.
    reserved: bool = False


async def create_claim(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """ResourceClaim CREATE (validating): `admit_new`, the reservation keyed by the claim's uid."""
    claim = parse_request_claim(request)
    if isinstance(claim, Verdict):
        return claim
    if (denied := supplied(request.object)) is not None:
        return denied
    if not claim.uid:
        return _invalid("metadata.uid is missing: the API server sets it before validating admission")
    return (await admit_new(ctx, request, claim)).verdict


async def admit_new(ctx: ClaimContext, request: AdmissionRequest, claim: Claim) -> Admitted:
    """adminAccess policy, then price, check every quota and reserve, the reservation
    persisted on each DeviceQuota's status, keyed by `claim_ref(claim)` (the uid, or the
    token key the one-write admission puts in its place: `webhook.claimadmit`).

    The ledger only prices (it holds what this replica's cache holds, not what other
    replicas admitted); the quota check proper runs against the persisted
    reservations, in `kube.quotawriter`.
    """
    record = _judge(ctx, request, claim)
    if record is not None and record.outcome == "refused":
        return Admitted(_refusal(record))
    labels = ctx.namespace_labels(claim.namespace)
    if labels is None and ctx.admitter.ledger.has_teams():
        # A namespace created a moment ago: which ClusterDeviceQuotas select it is in its
        # labels, which this replica's Namespace watch has not brought yet. Deny by default.
        return Admitted(Verdict(False, f"namespace {claim.namespace} is not in dra-quota's cache yet, and "
                                       "ClusterDeviceQuotas select namespaces by their labels: retry in a moment",
                                cause="unavailable"))
    # Priced once, within this review's budget (`quota.values.work`), in slices (`runtime.slicing`)
    # unless its estimate is memoised: then it ends well within a first slice, and the
    # slicer's greenlet switches cost more than the pricing (a template's claims share one).
    review = Budget.review()
    entry = ctx.admitter.price_if_priced(claim, namespace_labels=labels, budget=review)
    if entry is None:
        entry = await ctx.slicer.run(lambda: ctx.admitter.price_for_admission(claim, namespace_labels=labels,
                                                                              budget=review))
    if isinstance(entry, Admission):
        return Admitted(_verdict(entry, record))  # adminAccess label, pricing errors: no quota decides those
    if ctx.learn_pod is not None and (owner := pod_owner(request.object or {})) is not None:
        await ctx.learn_pod(claim, owner[0])
    charges = {q: c for q, c in ctx.admitter.charges(entry).items() if not c.is_zero()}
    if ctx.recounts is not None and (busy := [q.name for q in charges
                                              if q.cluster and ctx.admitter.ledger.recounting(q.name)]):
        # A team's usage is partial until its recount ends: wait for it, bounded. Past the
        # bound the decision refuses, as it does for every writer (fail closed).
        await ctx.recounts.wait(busy)
    decision = await ctx.reservations.admit(charges, uid=str(claim_ref(claim)), claim=f"{claim.namespace}/{claim.name}",
                                            dry_run=request.dry_run, series=_series(request))
    pricing = entry.pricing[ctx.admitter.ledger.default_mode]
    warnings = (*ctx.admitter.pricing_warnings(claim, pricing), *decision.warnings)
    if not decision.allowed and not decision.denied_by:  # conflicts, API errors: no quota said no
        return Admitted(Verdict(False, decision.message, warnings=warnings, cause="unavailable"))
    message = ctx.admitter.explained(claim, decision.message, decision.denied_by)
    return Admitted(_verdict(Admission(decision.allowed, message, warnings, pricing, decision.charged,
                                       decision.denied_by, decision.warned_by), record), entry, bool(charges))


def _series(request: AdmissionRequest) -> str:
    """The scheduler's attempts at one Pod's extended-resource claim replace each other's
    unconfirmed reservations (`quota.objects.extended.attempt_series`). Only for the scheduler's
    own creates: a tenant can write the same marks, and a burst of claims that replaced
    each other's in-flight reservations would over-commit."""
    if request.user.username != SCHEDULER or request.object is None:
        return ""
    return attempt_series(with_namespace(request.object, request.namespace))


def create_template(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """ResourceClaimTemplate CREATE: denied if its claim could never fit; reserves nothing."""
    claim = parse_request_claim(request)
    if isinstance(claim, Verdict):
        return claim
    if (denied := supplied(dig(request.object, "spec"))) is not None:
        return denied
    record = _judge(ctx, request, claim)
    if record is not None and record.outcome == "refused":
        return _refusal(record)
    admission = ctx.admitter.admit_template(claim, namespace_labels=ctx.namespace_labels(claim.namespace))
    return _verdict(admission, record)


async def allocate_claim(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """`resourceclaims/status` UPDATE: only the one that sets `status.allocation` is ours.

    The scheduler writes the allocation once, in PreBind (k/k pkg/scheduler/framework/
    plugins/dynamicresources); deallocation, Unreserve and drivers' `status.devices`
    writes pass untouched, so a quota can never block a claim's release. A review of a
    claim this replica's watch already saw go (`Reservations.claim_outlived`) passes
    untouched too: the API server validated a stale copy and its write will fail, and a
    charge counted then would outlive the claim, as no event would come to release it.

    An allocation that charges more than its claim holds in some Enforce quota has that
    excess reserved in the quota's persisted record first (`quota.accounting.excess`), keyed by the
    claim and the old object's resourceVersion, so two replicas' excesses never both
    take the same room. Within what the claim holds (the common case) nothing is written.
    A claim whose history this replica cannot vouch for (`ClaimStore.history_known`: a
    list brought it unallocated, so its last allocation may have charged less than this
    replica counts it at, with the difference given to other claims since) has its whole
    allocation persisted and checked against the rest of the quota
    (`Admitter.excess_to_persist`).
    """
    if dig(request.old_object, "status", "allocation") is not None or dig(request.object, "status", "allocation") is None:
        return Verdict(True)
    claim = parse_request_claim(request)
    if isinstance(claim, Verdict):
        return claim
    uid = str(claim_ref(claim))
    before = parse_version(dig(request.old_object, "metadata", "resourceVersion"))
    if ctx.reservations.claim_outlived(uid, before):
        return Verdict(True)
    enforce = ctx.allocation_check == "enforce"
    allocation = await ctx.slicer.run(lambda: ctx.admitter.price_allocation(claim))
    known = ctx.reservations.claim_history_known(uid)
    excess = ctx.admitter.excess_to_persist(allocation, history_known=known) if enforce else {}
    persisted = None
    if excess:
        if before is None:
            return _invalid("oldObject.metadata.resourceVersion is missing or not a resourceVersion: the API server "
                            "sends the stored claim on a status UPDATE")
        persisted = await ctx.reservations.admit(excess, uid=allocation_key(uid, before),
                                                 claim=f"{claim.namespace}/{claim.name}", dry_run=request.dry_run,
                                                 own="" if known else uid)
        if not persisted.allowed and not persisted.denied_by:  # conflicts, API errors: no quota said no
            return Verdict(False, persisted.message, warnings=persisted.warnings, cause="unavailable")
    admission = ctx.admitter.allocated(allocation, enforce=enforce, dry_run=request.dry_run, persisted=persisted,
                                       excess=list(excess), account=False, whole=not known)
    return _verdict(admission, None)


def update_claim(ctx: ClaimContext, request: AdmissionRequest) -> Verdict:
    """ResourceClaim UPDATE (main resource): our annotations change only as dra-quota writes them.

    Spec is immutable and status is reset on this path (dra-api.md §8), so metadata is
    all a tenant can change here. The charge and quota annotations may be added once, to
    a claim that carries no charge, and only with the values this replica's ledger says
    are due (`Admitter.annotations_due`: what the leader writes, `controllers.annotator`);
    never changed or removed afterwards. The allocation record may change only to what
    the allocation says (`_record_problem`). Any writer may write them that way: the
    shipped configuration skips our own ServiceAccount, and this holds for the rest.
    """
    old = as_map(dig(request.old_object, "metadata", "annotations"))
    new = as_map(dig(request.object, "metadata", "annotations"))
    if old.get(ADMISSION_ANNOTATION) != new.get(ADMISSION_ANNOTATION):
        # It names the claim's reservation (`quota.admission.admissiontoken`): added to another
        # claim, it would settle an admission still in flight, counted nowhere.
        return Verdict(False, f"annotation {ADMISSION_ANNOTATION} is written by dra-quota when the claim is created "
                              f"and may not be changed (was {show(old.get(ADMISSION_ANNOTATION))}, now "
                              f"{show(new.get(ADMISSION_ANNOTATION))})", cause="annotations")
    changed = [key for key in OUR_ANNOTATIONS if old.get(key) != new.get(key)]
    if changed and not _first_charge(ctx, request, old, new):
        return Verdict(
            False,
            f"annotation {changed[0]} is written by dra-quota once the claim exists and may not be changed "
            f"(was {show(old.get(changed[0]))}, now {show(new.get(changed[0]))})",
            cause="annotations",
        )
    if any(old.get(key) != new.get(key) for key in RECORD_ANNOTATIONS):
        problem = _record_problem(ctx, request, old, new)
        if problem:
            return Verdict(False, problem, cause="annotations")
    return Verdict(True)


def _first_charge(ctx: ClaimContext, request: AdmissionRequest, old: Mapping[str, Any],
                  new: Mapping[str, Any]) -> bool:
    """Whether the update adds the charge and quota annotations to a claim that had no
    charge, with exactly the values dra-quota would write."""
    if CHARGE_ANNOTATION in old or request.object is None:
        return False
    try:
        claim = parse_json_claim(with_namespace(request.object, request.namespace))
    except ClaimError:
        return False
    due = ctx.admitter.annotations_due(claim, {k: v for k, v in old.items() if isinstance(v, str)})
    return bool(due) and all(new.get(key) == due.get(key) for key in OUR_ANNOTATIONS)


def _record_problem(ctx: ClaimContext, request: AdmissionRequest, old: Mapping[str, Any],
                    new: Mapping[str, Any]) -> str:
    """Why a change of the allocation record (`quota.objects.allocationrecord`) is refused, "" when
    each annotation changed says what the leader writes.

    The leader writes it (`controllers.annotator`) as `Pricer.allocation_record` says; any
    writer may, but only that value: a tenant could otherwise lower what a device charges
    once it has left the inventory (the record is then all that prices it), or what a
    replica started after a deallocation counts."""
    changed = [key for key in RECORD_ANNOTATIONS if old.get(key) != new.get(key)]
    where = f"annotation {changed[0]}"
    if old.get(ALLOCATED_CHARGE_ANNOTATION) is not None and new.get(ALLOCATED_CHARGE_ANNOTATION) is None:
        return f"annotation {ALLOCATED_CHARGE_ANNOTATION} records what the allocated devices charge and may not be removed"
    if request.object is None:
        return f"{where}: the request carries no object"
    try:
        claim = parse_json_claim(with_namespace(request.object, request.namespace))
        claim = replace(claim, recorded_devices=claim_record(claim.spec, old))
    except ClaimError as err:
        return f"{where}: cannot read the claim: {err}"
    if claim.allocation is None:
        # A deallocated claim's record is its last allocation, which replicas started since
        # count it at (`Counting.recorded_allocation`): only to what this replica saw land
        # last (`Annotating.record_due`: the leader catching up), else with the next one.
        due = ctx.admitter.record_due(claim)
        # Only from a cache holding the stored copy: one behind it may hold an older
        # allocation than the record it would replace.
        held_at = ctx.reservations.claim_version(str(claim_ref(claim)))
        current = held_at is not None and held_at == parse_version(dig(request.old_object, "metadata",
                                                                       "resourceVersion"))
        if due is not None and current and not _unlike(claim, due, changed, new):
            return ""
        return (f"{where} records the claim's last allocation: it is written by dra-quota, and changes "
                "when the claim is allocated again")
    expected = ctx.admitter.pricer.allocation_record(claim)
    wrong = _unlike(claim, expected, changed, new)
    if not wrong:
        return ""
    key = wrong[0]
    return (f"annotation {key} is written by dra-quota from the claim's allocation and the devices it charged: "
            f"expected {show(record_annotations(claim, expected).get(key))}, got {show(new.get(key))}")


def _unlike(claim: Claim, record: Mapping[RecordKey, int], changed: list[str], new: Mapping[str, Any]) -> list[str]:
    """The changed annotations of the record that do not read exactly as the leader writes
    `record` (one it does not write for it may not change at all)."""
    due = record_annotations(claim, record)
    return [key for key in changed if key not in due or new.get(key) != due[key]]


def supplied(obj: Any, keys: tuple[str, ...] = WRITTEN_BY_US) -> Verdict | None:
    """A denial when `obj`'s metadata (a claim's, or the one a template stamps) carries an
    annotation only dra-quota writes (of `keys`).

    Queue managers and dashboards read them as ours, the allocation record prices a
    device that left the inventory, and the charge is a floor when a claim is priced
    again: a value the tenant chose must never be taken for one of them. (Until issue
    16 a mutating webhook replaced them; one webhook call per create is the price.)"""
    annotations = as_map(dig(obj, "metadata", "annotations"))
    found = [key for key in keys if key in annotations]
    if not found:
        return None
    return Verdict(False, f"annotation {found[0]} is written by dra-quota once the claim exists and may not be "
                          "set by its creator: remove it (an object exported from a cluster carries it)",
                   cause="annotations")


def with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """`obj` with the request's namespace when its metadata names none.

    The create handler copies the request's namespace into the object before admission
    (k/k staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go,
    EnsureObjectNamespaceMatchesRequestNamespace); `parse_json_claim` would read a missing
    one as "default", which must never charge another namespace's quotas.
    """
    meta = obj.get("metadata")
    if namespace and isinstance(meta, dict) and not meta.get("namespace"):
        return {**obj, "metadata": {**meta, "namespace": namespace}}
    return obj


def parse_request_claim(request: AdmissionRequest) -> Claim | Verdict:
    """The request's claim (or template), or the denial of an object we cannot read."""
    obj = request.object
    if obj is None:
        return _invalid(f"request.object is missing on a {request.operation} of {request.resource.resource}")
    try:
        return parse_json_claim(with_namespace(obj, request.namespace))
    except ClaimError as err:
        kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "ResourceClaim"
        return _invalid(f"invalid {kind}: {err}")


def _judge(ctx: ClaimContext, request: AdmissionRequest, claim: Claim) -> PolicyRecord | None:
    if not claim.admin_access:
        return None
    return judge_claim(
        ctx.policy(),
        username=request.user.username,
        groups=request.user.groups,
        kind=claim.kind,
        namespace=claim.namespace,
        name=claim.name,
        from_pod=claim.kind == "ResourceClaim" and request.object is not None and stamped_from_pod(request.object),
    )


def _refusal(record: PolicyRecord) -> Verdict:
    return Verdict(
        False,
        f"{record.username or '(anonymous)'} may not {record.action}: not on dra-quota's adminAccess allowlist",
        audit_annotations={AUDIT_KEY: record.audit_value},
        records=(record,),
        cause="admin_access",
    )


def _verdict(admission: Admission, record: PolicyRecord | None) -> Verdict:
    if not admission.allowed:
        # Nothing was granted: the claim does not exist.
        return Verdict(False, admission.reason, warnings=admission.warnings, cause=_cause(admission),
                       quotas=admission.denied_by)
    # Admitted over a quota's hard (Audit, or account-only allocation): recorded like a denial.
    cause: Cause = "quota" if admission.warned_by else "none"
    if record is None:
        return Verdict(True, warnings=admission.warnings, cause=cause, quotas=admission.warned_by,
                       charged_above=admission.charged_above)
    return Verdict(True, warnings=admission.warnings, audit_annotations={AUDIT_KEY: record.audit_value},
                   records=(record,), cause=cause, quotas=admission.warned_by, charged_above=admission.charged_above)


def _cause(denial: Admission) -> Cause:
    if denial.denied_by:
        return "quota"
    # The one other denial `Admitter` makes before pricing; the rest are pricing's.
    return "admin_access" if denial.reason == ADMIN_ACCESS_MESSAGE else "pricing"


def _invalid(message: str) -> Verdict:
    return Verdict(False, message, reason="Invalid", code=422, cause="invalid")
