"""`dra-quota check`: the admission and accounting code, run offline over YAML files.

Neighbours: `commands.checkcommand` parses flags and prints; `quota.admission.admitter.Admitter` decides,
exactly as the webhook does. Order of evaluation: the cluster's state comes first
(DeviceClasses, ResourceSlices, Namespaces, DeviceQuotas, ClusterDeviceQuotas; a
namespace with no Namespace document has only its name label, as the API server sets
it, for the teams' selectors), then allocated claims, which
are existing usage, then unallocated claims and templates in document order, each
admitted (and reserving) or denied as the webhook would. Results keep document order.
A quota with `spec.windows` is checked against the `hard` in force at `at` (`quota.quotas.windows`;
one process, so no clock skew to allow for).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admission, Admitter
from quota.devices.inventory import Inventory
from quota.devices.memorysources import NO_SOURCES, MemorySources
from quota.objects.claims import Claim, parse_claim, parse_device_class
from quota.objects.claimspec import ClaimError
from quota.objects.conversion import require_dra_version
from quota.objects.knownfields import strict_error
from quota.objects.slices import SliceError
from quota.pricing.priced import Pricing
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import (
    CLUSTER_KIND,
    GROUP,
    KIND,
    DeviceQuota,
    QuotaError,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.quotas.scope import selection_problems
from quota.quotas.windows import Effective, effective, hard_note
from quota.reports.loader import CheckInputError, Document
from quota.reports.printable import for_json
from quota.values.meta import NamespaceError, parse_namespace
from quota.values.model import ZERO, Charge, DeviceClass, DeviceClassName, Mode, Namespace
from quota.values.raw import show

__all__ = ["NO_CLASSES", "ObjectResult", "Report", "run_check"]

# Said when claims were given without any class: each is then denied "class not found",
# which reads like a verdict on the claims, not on the input.
NO_CLASSES = ("no DeviceClasses were loaded: every claim is denied as \"device class not found\"; give check the "
              "cluster's state too (kubectl get deviceclasses,resourceslices,namespaces,devicequotas,"
              "clusterdevicequotas -A -o json, or --from-cluster)")

_CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
_STATE_KINDS = ("DeviceClass", "ResourceSlice", KIND, CLUSTER_KIND)  # the cluster's state: unreadable stops the run


@dataclass(frozen=True, slots=True)
class ObjectResult:
    kind: str
    namespace: str
    name: str
    allowed: bool
    reason: str
    warnings: tuple[str, ...]
    charge: Charge
    requests: tuple[tuple[str, int, Charge], ...]
    allocated: bool = False
    # Why no DeviceQuota counts it, when admitted so (the table's DETAILS; not in the JSON,
    # whose shape is docs/design.md's contract, "CLI").
    unlimited: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "allowed": self.allowed,
            # The table's `allocated` decision: existing usage, accounted, never admitted.
            "allocated": self.allocated,
            "reason": self.reason,
            "warnings": list(self.warnings),
            "charge": self.charge.as_json(),
            "requests": [
                {"name": n, "candidates": c, "charge": ch.as_json()} for n, c, ch in self.requests
            ],
        }


@dataclass(slots=True)
class Report:
    objects: list[ObjectResult] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Quotas whose selectors do not compile (each also a warning): they select every
    # device meanwhile, which a CI gate over quota manifests must not pass.
    invalid_quotas: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"objects": [o.as_json() for o in self.objects], "quotas": self.quotas,
                "warnings": self.warnings, "invalidQuotas": self.invalid_quotas}

    def dumps(self) -> str:
        return json.dumps(for_json(self.as_json()), indent=2, sort_keys=False)


def run_check(docs: Iterable[Document], *, mode: Mode = "conservative",
              memory_sources: MemorySources = NO_SOURCES, at: datetime | None = None) -> Report:
    """`at`: the instant whose windows apply (None: every quota's own `spec.hard`)."""
    report = Report()
    in_force: dict[tuple[str, str], Effective] = {}
    inventory = Inventory(memory_sources)
    classes: dict[DeviceClassName, DeviceClass] = {}
    namespaces: dict[str, Mapping[str, str]] = {}
    ledger = Ledger(default_mode=mode)
    admitter = Admitter(Pricer(inventory, classes), ledger)
    claims: list[Document] = []
    seen: dict[tuple[str, str, str], str] = {}
    for doc in docs:
        kind = doc.obj["kind"]
        try:
            if kind in _STATE_KINDS and (problem := strict_error(doc.obj)) is not None:
                raise CheckInputError(f"{doc.located(problem)}: {kind} {_name(doc.obj)}: {problem}")
            if kind == "DeviceClass":
                cls = parse_device_class(doc.obj)
                _once(seen, doc, kind, "", cls.name)
                classes[cls.name] = cls
            elif kind == "ResourceSlice":
                inventory.add_or_update_slice(doc.obj)
                _once(seen, doc, kind, "", str(doc.obj["metadata"]["name"]))
            elif kind == "Namespace":
                ns = parse_namespace(doc.obj)
                _once(seen, doc, kind, "", ns.name)
                namespaces[ns.name] = ns.labels
                admitter.set_namespace(Namespace(ns.name), ns.labels)
            elif kind in (KIND, CLUSTER_KIND):
                quota = parse_device_quota(doc.obj) if kind == KIND else parse_cluster_device_quota(doc.obj)
                _once(seen, doc, kind, quota.namespace, quota.name)
                if at is not None and quota.windows:
                    now = in_force[(quota.namespace, quota.name)] = effective(quota.hard, quota.windows, at)
                    quota = replace(quota, hard=now.hard, hard_note=hard_note(quota.hard, quota.windows, at),
                                    own_hard=quota.hard)
                admitter.add_or_update_quota(quota)  # before any claim: nothing to price again
                shown = f"{quota.namespace}/{quota.name}" if quota.namespace else quota.name
                problems = [f"{doc.located(problem)}: {kind} {shown} selects every device, as its selector does not "
                            f"compile: {problem}" for problem in selection_problems(quota.scope.devices.expressions)]
                report.warnings.extend(problems)
                report.invalid_quotas.extend(problems)
            elif kind in _CLAIM_KINDS:
                # An unknown version stops the run like any unreadable object; other
                # defects of a claim are that claim's denial, as in the webhook.
                require_dra_version(doc.obj, kind, ClaimError)
                claims.append(doc)
            elif _group(doc.obj.get("apiVersion")) == GROUP:
                # A typo in our own kinds (`DeviceQuotas`) skipped with a warning would
                # leave its namespace without the quota and every claim there allowed.
                raise CheckInputError(f"{doc.source}: unknown kind {show(kind)} in {GROUP}: "
                                      f"dra-quota knows {KIND}, {CLUSTER_KIND}")
            else:
                report.warnings.append(f"{doc.source}: skipped: kind {kind} is not used by dra-quota")
        except (SliceError, ClaimError, QuotaError, NamespaceError) as err:
            raise CheckInputError(f"{doc.located(str(err))}: {err}") from None
    if claims and not classes:
        report.warnings.append(NO_CLASSES)
    for pool, reason in sorted(inventory.unusable_pools().items()):
        report.warnings.append(f"pool {pool[0]}/{pool[1]} is not usable ({reason}): its devices are not candidates")
    parsed = [_parse(doc) for doc in claims]
    for namespace in dict.fromkeys(namespace for _, namespace, _, _ in parsed if namespace not in namespaces):
        admitter.set_namespace(Namespace(namespace), {})
    results: dict[int, ObjectResult] = {}
    # Allocated claims are existing state: account them before admitting anything.
    for index, (kind, namespace, name, claim) in enumerate(parsed):
        if isinstance(claim, Claim) and kind == "ResourceClaim" and claim.allocation is not None:
            admission = admitter.account_allocated(claim)
            results[index] = _result(kind, namespace, name, admission, ledger, allocated=True)
    for index, (kind, namespace, name, claim) in enumerate(parsed):
        if index in results:
            continue
        if isinstance(claim, ClaimError):
            results[index] = ObjectResult(kind, namespace, name, False, f"invalid {kind}: {claim}", (), ZERO, ())
            continue
        labels = namespaces.get(namespace)
        if kind == "ResourceClaimTemplate":
            admission = admitter.admit_template(claim, namespace_labels=labels)
        else:
            admission = admitter.admit_claim(claim, namespace_labels=labels)
        results[index] = _result(kind, namespace, name, admission, ledger, allocated=False)
    report.objects = [results[i] for i in sorted(results)]
    report.quotas = [_quota_json(q, ledger, in_force.get((q.namespace, q.name)))
                     for q in sorted(ledger.quotas(), key=lambda q: (q.namespace, q.name))]
    return report


def _quota_json(quota: DeviceQuota, ledger: Ledger, now: Effective | None) -> dict[str, Any]:
    """One `quotas[]` item; a ClusterDeviceQuota's (namespace "") has its team's totals and
    `namespaces`, each member's part. `hard` is the one in force; a quota with windows also
    has `window` (the active one's name, or null) and `nextChange` (null: none within 400 days)."""
    usage = ledger.usage(quota.namespace, quota.name)
    out: dict[str, Any] = {"kind": quota.kind, "namespace": quota.namespace, "name": quota.name,
                           "hard": quota.hard.as_json(), "used": usage.used.as_json(),
                           "reserved": usage.reserved.as_json()}
    if now is not None:
        out["window"] = now.window
        out["nextChange"] = None if now.next_change is None else now.next_change.strftime("%Y-%m-%dT%H:%M:%SZ")
    if quota.cluster:
        out["namespaces"] = [{"namespace": ns, "used": (part := ledger.usage_in(quota.name, ns)).used.as_json(),
                              "reserved": part.reserved.as_json()} for ns in ledger.members(quota.name)]
    return out


def _group(api_version: Any) -> str:
    return api_version.rpartition("/")[0] if isinstance(api_version, str) else ""


def _once(seen: dict[tuple[str, str, str], str], doc: Document, kind: str, namespace: str, name: str) -> None:
    """Refuse a second definition of one object: which one `check` used would be a guess.

    A later Namespace without the label, or a DeviceQuota with another `hard`, silently
    replaced the first: a reviewer reads one file, the tool enforces the other (the same
    reason duplicate YAML keys are refused).
    """
    key = (kind, namespace, name)
    if seen.get(key) == doc.source:
        return  # the same file named twice (`-f dir -f dir/file`): the same definition
    if key in seen:
        shown = f"{namespace}/{name}" if namespace else name
        raise CheckInputError(f"{doc.source}: {kind} {shown} is defined twice (first at {seen[key]})")
    seen[key] = doc.source


def _parse(doc: Document) -> tuple[str, str, str, Claim | ClaimError]:
    """(kind, namespace, name, the claim or why it could not be read)."""
    meta = doc.obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    kind = str(doc.obj["kind"])
    namespace = _text(meta.get("namespace")) or "default"
    name = _text(meta.get("name")) or _text(meta.get("generateName"))
    # Unknown fields first: a misspelt field would otherwise be reported as the field it
    # should have been, missing (`deviceClassname`: "deviceClassName is required").
    problem = strict_error(doc.obj)
    if problem is not None:
        return kind, namespace, name, ClaimError(problem)
    try:
        return kind, namespace, name, parse_claim(doc.obj)
    except ClaimError as err:
        return kind, namespace, name, err


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return _text(meta.get("name")) if isinstance(meta, dict) else ""


def _text(value: Any) -> str:
    """A name for the report row of an object that may not parse: strings only."""
    return value if isinstance(value, str) else ""


def _result(kind: str, namespace: str, name: str, admission: Admission, ledger: Ledger, *,
            allocated: bool) -> ObjectResult:
    pricing: Pricing = admission.pricing
    return ObjectResult(
        kind=kind,
        namespace=namespace,
        name=name,
        allowed=admission.allowed,
        reason=admission.reason,
        warnings=admission.warnings,
        charge=pricing.total,
        requests=tuple((r.name, r.candidates, r.charge) for r in pricing.requests),
        allocated=allocated,
        unlimited=_unlimited(namespace, admission, ledger),
    )


def _unlimited(namespace: str, admission: Admission, ledger: Ledger) -> str:
    """Why an admitted object counts against no DeviceQuota ("" when one charges it)."""
    if not admission.allowed or admission.charge.is_zero():
        return ""
    quotas = ledger.quotas(Namespace(namespace))
    if not quotas:
        teams = " and no ClusterDeviceQuota selects it" if any(q.cluster for q in ledger.quotas()) else ""
        return f"no DeviceQuota in namespace {namespace}{teams}: no quota applies"
    if not any(admission.pricing.in_scope(q.scope) for q in quotas):
        return f"no DeviceQuota of namespace {namespace} counts its device classes or devices: no quota applies"
    return ""
