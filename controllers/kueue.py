"""Kueue: the Workload caches every replica keeps, and the leader's AdmissionCheck controller.

Neighbours: `quota.accounting.workloads` says what a Workload is, when it holds its price and how
its Pods' claims are matched to it (read its docstring); `quota.admission.admitter.Admitter`
prices it like the claims it will stamp; `quota.accounting.ledger` counts what it holds
(`set_holding`), so claims from anywhere see it, and lets its Pods' claims draw on it;
`kube.quotawriter` checks it against the namespace's DeviceQuotas exactly as a
claim is checked (the same persisted, conflict-safe write, the same denial text);
`commands.serve` wires the stores into `Caches` and runs `AdmissionCheckController`
while leading.

Every replica (webhooks too) derives "Workload W holds charge C" from the Workload
itself (`KueueCaches.refresh`): nothing but our check entry is ever written, and a new
leader rebuilds it from a list. The one window the derivation leaves, between the
leader's Ready and another replica's Workload watch delivering it, is covered the way a
claim's is: the leader's check persists a TTL entry for the Workload on each
DeviceQuota's `status.reservations` (`quota.accounting.reservations`), which stops counting once
the replica's cache holds the Workload (`Ledger.counts`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.caches import parse_or_skip
from kube.events import EventKey, EventRecorder, Ref
from kube.quotawriter import Reservations
from kube.resources import ADMISSION_CHECKS, KUEUE, PODS, TEMPLATES, WORKLOADS
from quota.accounting.ledger import QuotaKey
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.accounting.workloads import (
    CONTROLLER_NAME,
    WORKLOAD_LABEL,
    Workload,
    charge_message,
    check_active,
    entry_patch,
    holds,
    needs_decision,
    our_checks,
    parse_workload,
    too_many_claims,
)
from quota.admission.admitter import Admitter
from quota.objects.claims import Claim, parse_claim
from quota.values.model import Namespace
from quota.values.raw import Obj, dig
from runtime.guard import guarded
from runtime.slicing import Busy, Slicer

__all__ = ["AdmissionCheckController", "KueueCaches", "PodLookup", "serves_workloads"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "dra-quota"
_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)


async def serves_workloads(api: KubeApi) -> bool:
    """Whether the API server serves kueue.x-k8s.io/v1beta2 workloads (`--kueue auto`)."""
    try:
        found = await api.request("GET", f"/apis/{KUEUE}")
    except _FAILURES:
        return False
    if not isinstance(found, dict):
        return False
    return any(r.get("name") == "workloads" for r in found.get("resources") or [] if isinstance(r, dict))


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or "")


class KueueCaches:
    """AdmissionChecks, Workloads, the claim templates they name and their Pods' labels,
    kept from four reflectors (the stores below) and turned into ledger holdings."""

    def __init__(self, admitter: Admitter, *, forget: Callable[[str], None],
                 changed: Callable[[Iterable[QuotaKey] | None], None]) -> None:
        self.admitter = admitter
        self.ledger = admitter.ledger
        # The persisted TTL entry of a Workload no longer held must stop counting at once.
        self.forget = forget
        # Told the quotas whose holdings changed (the ledger's keys; None: any): the quota
        # controller rewrites their status.
        self.changed = changed
        self.checks: dict[str, Obj] = {}  # AdmissionCheck name -> object
        self.workloads: dict[str, Workload] = {}  # uid -> Workload
        self.templates: dict[tuple[str, str], Claim] = {}
        self.wake: Callable[[], None] = lambda: None  # the leader's controller, when running
        # Workloads the leader decided Ready whose Ready this cache has not seen yet: their
        # holding stands even when an older event of theirs (still Pending) arrives, else
        # the next decision of the same pass would not count them.
        self.deciding: set[str] = set()

    def ours(self) -> frozenset[str]:
        return our_checks({n: str(dig(o, "spec", "controllerName") or "") for n, o in self.checks.items()})

    def price(self, workload: Workload) -> Entry | str:
        """The Workload's price (`quota.accounting.workloads`), or why it has none."""
        if problem := too_many_claims(workload):
            return problem
        counts: Counter[str] = Counter()
        for pod_set in workload.pod_sets:
            for template in pod_set.templates:
                counts[template] += pod_set.count
        claims: list[tuple[Claim, int]] = []
        for template, count in sorted(counts.items()):
            claim = self.templates.get((workload.namespace, template))
            if claim is None:
                return f'ResourceClaimTemplate "{template}" not found in namespace {workload.namespace}'
            claims.append((claim, count))
        return self.admitter.workload_entry(Namespace(workload.namespace), ClaimRef(workload.uid), claims)

    def refresh(self, uids: Iterable[str]) -> None:
        """Re-derive what each Workload holds; tell who counts it."""
        ours = self.ours()
        touched: dict[QuotaKey, None] = {}
        for uid in uids:
            workload = self.workloads.get(uid)
            if workload is not None and holds(workload, ours):
                self.deciding.discard(uid)  # seen Ready: from now on derived as on every replica
            elif uid in self.deciding and workload is not None and not (
                    workload.finished or workload.evicted or not workload.active):
                continue
            else:
                self.deciding.discard(uid)
            if workload is not None and holds(workload, ours):
                admitted = workload
                priced = guarded(f"pricing Workload {admitted.namespace}/{admitted.name}",
                                 lambda: self.price(admitted))
                if priced is None:
                    continue  # keep whatever it holds: counting less could over-commit
                entry: Entry | str | None = priced
            else:
                entry = None
            if isinstance(entry, str):
                assert workload is not None
                log.warning("Workload %s/%s is admitted but cannot be priced (%s): it holds nothing",
                            workload.namespace, workload.name, entry)
                entry = None
            if entry is not None:
                if self.ledger.holding(ClaimRef(uid)) != entry:
                    touched.update(dict.fromkeys(self.ledger.set_holding(entry)))
            else:
                held = self.ledger.holding(ClaimRef(uid))
                if held is not None:
                    touched.update(dict.fromkeys(self.ledger.drop_holding(ClaimRef(uid))))
                    self.forget(uid)
        if touched:
            self.changed(touched)
        self.wake()

    def refresh_namespace(self, namespace: str | None) -> None:
        self.refresh([u for u, w in self.workloads.items() if namespace is None or w.namespace == namespace])


class CheckStore:
    def __init__(self, caches: KueueCaches) -> None:
        self.caches = caches

    def replace(self, objects: list[Obj]) -> None:
        self.caches.checks = {_meta(o)[1]: o for o in objects}
        self.caches.refresh_namespace(None)

    def upsert(self, obj: Obj) -> None:
        self.caches.checks[_meta(obj)[1]] = obj
        self.caches.refresh_namespace(None)

    def delete(self, obj: Obj) -> None:
        self.caches.checks.pop(_meta(obj)[1], None)
        self.caches.refresh_namespace(None)


class WorkloadStore:
    def __init__(self, caches: KueueCaches) -> None:
        self.caches = caches

    def _parse(self, obj: Obj) -> Workload | None:
        return parse_or_skip("Workload", obj, parse_workload)

    def replace(self, objects: list[Obj]) -> None:
        parsed = [w for w in map(self._parse, objects) if w is not None]
        before = set(self.caches.workloads)
        self.caches.workloads = {w.uid: w for w in parsed}
        self.caches.refresh(before | set(self.caches.workloads))

    def upsert(self, obj: Obj) -> None:
        workload = self._parse(obj)
        if workload is not None:
            self.caches.workloads[workload.uid] = workload
            self.caches.refresh([workload.uid])

    def delete(self, obj: Obj) -> None:
        uid = _meta(obj)[2]
        self.caches.workloads.pop(uid, None)
        self.caches.refresh([uid])


class TemplateStore:
    """ResourceClaimTemplates, parsed as the claim they stamp: a Workload's price."""

    def __init__(self, caches: KueueCaches) -> None:
        self.caches = caches

    def _parse(self, obj: Obj) -> Claim | None:
        return parse_or_skip("ResourceClaimTemplate", {**obj, "kind": "ResourceClaimTemplate"}, parse_claim)

    def replace(self, objects: list[Obj]) -> None:
        parsed = [c for c in map(self._parse, objects) if c is not None]
        self.caches.templates = {(c.namespace, c.name): c for c in parsed}
        self.caches.refresh_namespace(None)

    def upsert(self, obj: Obj) -> None:
        claim = self._parse(obj)
        if claim is not None:
            self.caches.templates[(claim.namespace, claim.name)] = claim
            self.caches.refresh_namespace(claim.namespace)

    def delete(self, obj: Obj) -> None:
        namespace, name, _ = _meta(obj)
        self.caches.templates.pop((namespace, name), None)
        self.caches.refresh_namespace(namespace)


class PodStore:
    """The Pods labelled `draquota.io/workload` (the reflector's label selector): which
    Workload each belongs to, for matching its claims (`quota.accounting.workloads`)."""

    def __init__(self, caches: KueueCaches) -> None:
        self.caches = caches
        self._namespaces: dict[str, str] = {}  # pod uid -> namespace

    def replace(self, objects: list[Obj]) -> None:
        keep = {_meta(o)[2] for o in objects}
        for uid in [u for u in self._namespaces if u not in keep]:
            self.caches.ledger.set_pod(uid, None)
            self._namespaces.pop(uid, None)
        for obj in objects:
            self.upsert(obj, notify=False)
        self.caches.changed(None)

    def upsert(self, obj: Obj, *, notify: bool = True) -> None:
        namespace, _, uid = _meta(obj)
        workload = dig(obj, "metadata", "labels", WORKLOAD_LABEL)
        if not uid:
            return
        self._namespaces[uid] = namespace
        keys = self.caches.ledger.set_pod(uid, ClaimRef(workload) if isinstance(workload, str) and workload else None)
        if notify:
            self.caches.changed(keys)

    def delete(self, obj: Obj) -> None:
        _, _, uid = _meta(obj)
        keys = self.caches.ledger.set_pod(uid, None)
        self._namespaces.pop(uid, None)
        self.caches.changed(keys)


class PodLookup:
    """A claim's Pod the Pod cache does not know yet (its watch lags the resourceclaim
    controller): one GET, only where some Workload holds quota, so the claim can draw on
    its Workload's holding instead of being checked on top of it. Pods read without our
    label are remembered (a bounded set: the label comes with the Pod's creation, from
    the Job's template), so a namespace's other claims cost one GET per Pod at most."""

    def __init__(self, api: KubeApi, admitter: Admitter, *, remember: int = 4096) -> None:
        self.api = api
        self.ledger = admitter.ledger
        self.remember = remember
        self._unlabelled: dict[str, None] = {}  # insertion-ordered: the oldest go first

    async def __call__(self, claim: Claim, owner_name: str) -> None:
        ledger = self.ledger
        if (not claim.owner or ledger.knows_pod(claim.owner) or claim.owner in self._unlabelled
                or not any(ledger.holdings_in(claim.namespace))):
            return
        try:
            pod = await self.api.get(PODS, owner_name, namespace=claim.namespace)
        except _FAILURES as err:
            log.debug("cannot read Pod %s/%s of claim %s: %s", claim.namespace, owner_name, claim.name, err)
            return
        if dig(pod, "metadata", "uid") != claim.owner:
            return  # another Pod of that name: the claim's owner is gone
        workload = dig(pod, "metadata", "labels", WORKLOAD_LABEL)
        if isinstance(workload, str) and workload:
            ledger.set_pod(claim.owner, ClaimRef(workload))
            return
        self._unlabelled[claim.owner] = None
        while len(self._unlabelled) > self.remember:
            del self._unlabelled[next(iter(self._unlabelled))]


class AdmissionCheckController:
    """The leader's writes: `Active` on our AdmissionChecks, our entry on each Workload
    waiting for it (`quota.accounting.workloads.needs_decision`)."""

    def __init__(self, api: KubeApi, caches: KueueCaches, reservations: Reservations, recorder: EventRecorder, *,
                 leading: Callable[[], bool], retry_seconds: int = 15, resync: float = 30.0,
                 clock: Callable[[], float] = time.time, slicer: Slicer | None = None) -> None:
        self.api = api
        self.caches = caches
        self.reservations = reservations
        self.recorder = recorder
        self.leading = leading
        self.retry_seconds = retry_seconds
        self.resync = resync
        self.clock = clock
        # A Workload is priced like a review: in slices, expensive ones in the slow lane.
        self.slicer = slicer if slicer is not None else Slicer()
        self.decisions = 0  # entries written (tests wait on it)
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        self.caches.wake = self.wake
        try:
            while True:
                self._wake.clear()
                if self.leading():
                    await self.reconcile()
                try:
                    async with asyncio.timeout(self.resync):  # not wait_for: 3.11's can drop a cancellation
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            self.caches.wake = lambda: None

    async def reconcile(self) -> None:
        ours = self.caches.ours()
        for name in sorted(ours):
            await self._activate(name)
        # Oldest first (Kueue's order within a priority): of Workloads waiting together,
        # the one queued first gets the room.
        for workload in sorted(self.caches.workloads.values(), key=lambda w: (w.created, w.namespace, w.name)):
            for check in needs_decision(workload, ours):
                try:
                    await self.decide(workload, check)
                except (*_FAILURES, Busy) as err:
                    log.warning("cannot decide check %s of Workload %s/%s: %s", check, workload.namespace,
                                workload.name, err)
                except Exception:
                    # A bug or a hostile Workload fails this Workload, never the loop (and
                    # so never the leader, nor each next one that would meet the same Workload).
                    log.exception("deciding check %s of Workload %s/%s failed", check, workload.namespace,
                                  workload.name)
                    self.recorder.record(EventKey(Ref(KUEUE, "Workload", workload.name, workload.namespace), None,
                                                  "Warning", "DeviceQuotaCheckFailed", "AdmissionCheck",
                                                  f"check {check}: dra-quota failed to decide this Workload "
                                                  "(see its logs); it is retried at the next resync"))

    async def _activate(self, name: str) -> None:
        obj = self.caches.checks.get(name) or {}
        generation = dig(obj, "metadata", "generation")
        generation = generation if isinstance(generation, int) else 0
        active = next((c for c in dig(obj, "status", "conditions") or []
                       if isinstance(c, dict) and c.get("type") == "Active"), {})
        if active.get("status") == "True" and active.get("observedGeneration") == generation:
            return
        body = {"apiVersion": ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck", "metadata": {"name": name},
                "status": {"conditions": [check_active(generation, self.clock())]}}
        try:
            await self.api.patch(ADMISSION_CHECKS, name, body, patch_type="apply", subresource="status",
                                 field_manager=FIELD_MANAGER, force=True)
            log.info("AdmissionCheck %s (controllerName %s) is Active", name, CONTROLLER_NAME)
        except _FAILURES as err:
            log.warning("cannot mark AdmissionCheck %s Active: %s", name, err)

    async def decide(self, workload: Workload, check: str) -> None:
        """Price, check and reserve like a claim; write Ready or Retry (our entry only)."""
        if self.caches.ledger.holding(ClaimRef(workload.uid)) is not None:
            # Decided Ready already and our write is not in the cache yet: deciding again
            # would check the Workload against its own holding and refuse it (seen on the
            # e2e cluster: an Admitted Workload turned Retry, and Kueue evicted it).
            return
        ledger = self.caches.ledger
        if ledger.has_teams() and not ledger.knows_namespace(Namespace(workload.namespace)):
            # As for a claim (`webhook.claimreview.create_claim`): checked against its
            # namespace's DeviceQuotas alone, it would be held without reserving on its team.
            await self._write(workload, check, "Retry", f"namespace {workload.namespace} is not in dra-quota's "
                              "cache yet, and ClusterDeviceQuotas select namespaces by their labels: retry")
            return
        entry = await self.slicer.run(lambda: self.caches.price(workload))
        if isinstance(entry, str):
            await self._write(workload, check, "Retry", f"cannot be priced: {entry}")
            return
        charges = self.caches.admitter.workload_charges(entry)
        decision = await self.reservations.admit({q: c for q, c in charges.items() if not c.is_zero()},
                                                 uid=workload.uid, claim=f"{workload.namespace}/{workload.name}",
                                                 source="Workload")
        if not decision.allowed:
            await self._write(workload, check, "Retry", decision.message)
            return
        keys = ledger.set_holding(entry)  # at once: the next Workload of this pass must see it
        self.caches.deciding.add(workload.uid)
        try:
            await self._write(workload, check, "Ready", charge_message(charges))
        except BaseException:
            self.caches.deciding.discard(workload.uid)
            ledger.drop_holding(entry.ref)
            await self.reservations.release(workload.namespace, workload.uid)
            raise
        self.caches.changed(keys)

    async def _write(self, workload: Workload, check: str, state: str, message: str) -> None:
        previous = workload.check(check)
        patch = entry_patch(workload, check, "Ready" if state == "Ready" else "Retry", message, now=self.clock(),
                            requeue_after=self.retry_seconds)
        await self.api.patch(WORKLOADS, workload.name, patch, patch_type="apply", namespace=workload.namespace,
                             subresource="status", field_manager=FIELD_MANAGER, force=True)
        self.decisions += 1
        log.info("Workload %s/%s: check %s %s: %s", workload.namespace, workload.name, check, state, message)
        if previous is None or previous.state != state or previous.message != message:
            reason, kind = ("DeviceQuotaReserved", "Normal") if state == "Ready" else ("DeviceQuotaExceeded", "Warning")
            self.recorder.record(EventKey(Ref(KUEUE, "Workload", workload.name, workload.namespace), None, kind,
                                          reason, "AdmissionCheck", f"check {check}: {message}"))
