"""`dra-quota serve`'s wiring: the caches and their reflectors, the leader's controllers,
the metrics and Events every replica keeps.

Neighbours: `commands.serve` builds `Caches` and runs them, campaigns with `lead` and
tells `observability`'s hook every verdict; `kube.watching.Reflector` keeps `kube.caches`
and `kube.claimstore` current (one reflector per kind); `controllers.*` run on the Lease holder
(`controllers.leader`) over the same caches, told what changed through `Caches.changed`
and `Caches.namespaces_changed`; `webhook.metrics`, `webhook.usagemetrics` and
`kube.events` are the observability.

Start-up order: ResourceSlices, DeviceClasses, Namespaces, DeviceQuotas and
ClusterDeviceQuotas are listed
first; ResourceClaims only once those are synced, because re-deriving a claim's charge
prices it against the inventory and the classes (an empty inventory would price every
existing claim at nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime

from certs.authority import inspect
from certs.manager import CertificateManager
from certs.tls import ReloadingContext
from commands.options import ServeOptions
from controllers.annotator import Annotator, unrecorded_note
from controllers.governed import GovernedLabels
from controllers.kueue import AdmissionCheckController, CheckStore, KueueCaches, PodStore, TemplateStore, WorkloadStore
from controllers.leader import LeaderElector, default_identity
from kube.leasebook import LeaseBook
from quota.accounting.headroom import Sizing
from quota.devices.memorysources import NO_SOURCES, MemorySources
from controllers.applied import AppliedQuotas
from controllers.quotas import QuotaController
from controllers.refine import Refiner
from controllers.requeue import Requeuer
from kube.admissionreview import AdmissionRequest, Verdict
from kube.api import KubeApi, Resource
from kube.caches import ClassStore, NamespaceStore, QuotaStore, QuotasChanged, SliceStore
from kube.claimstore import ClaimStore
from kube.events import DEVICE_QUOTA, EventKey, EventRecorder, KubeSink, Ref, reporting_instance, uid_of
from kube.quotawriter import Reservations
from kube.rebuilds import Rebuilds
from kube.recounts import Recounter
from kube.resources import (
    ADMISSION_CHECKS,
    CLAIMS,
    CLASSES,
    CLUSTER_QUOTAS,
    NAMESPACES,
    PODS,
    QUOTAS,
    RESOURCE_V1,
    SLICES,
    TEMPLATES,
    WORKLOADS,
)
from kube.watching import Progress, Reflector, Store, WatchSettings, trim_claim, trim_object
from quota.accounting.ledger import Ledger, QuotaKey
from quota.accounting.usage import Holders
from quota.accounting.workloads import WORKLOAD_LABEL
from quota.admission.admitter import Admitter
from quota.devices.inventory import Inventory
from quota.objects.claims import Claim
from quota.pricing.pricer import Pricer
from quota.status.breakdown import DEFAULT_SERIES
from quota.values.model import DeviceClass, DeviceClassName, Mode, Namespace
from runtime.slicing import Slicer
from webhook.metrics import Metrics
from webhook.server import Observer
from webhook.usagemetrics import UsageMetrics

__all__ = ["Caches", "lead", "leader_elector", "observability"]

# ResourceSlices and ResourceClaims are listed by a streamed list (`kube.watching`:
# `WatchSettings.stream_list`, each object decoded on its own as it arrives; at 150,000
# claims, pages cost the API server minutes, bench/startup.py); pages only where the
# API server refuses that.
# ResourceSlices a list page: a page is decoded in one piece on the event loop, and a
# slice of 128 GPUs is ~28 KB of JSON (bench/check.py's dump): 500 a page took ~0.1 s.
SLICE_PAGE = 25
# ResourceClaims a list page, for the same reason: 500 claims (~250 KB) decoded in one piece
# with the young collections they trigger held the loop 35-90 ms on a loaded node during a
# relist of 150,000 claims (bench/stalls.py --why); 100 cost a fifth of that, for 1,500
# requests a list instead of 300 (each a page of the API server's watch cache).
CLAIM_PAGE = 100


class Caches:
    """The domain objects the handlers read, and one reflector per kind feeding them."""

    def __init__(self, api: KubeApi, default_pricing: Mode, *, reservation_ttl: float = 120.0,
                 requeue: Requeuer | None = None, also: Sequence[Reflector] = (), kueue: bool = False,
                 leading: Callable[[], bool] | None = None, lease_period: float = 0.0,
                 memory_sources: MemorySources = NO_SOURCES, clock_skew: float = 5.0) -> None:
        """`also`: more reflectors to run and be synced before ready (the adminAccess ConfigMap);
        `leading`: the Lease holder writes our annotations on claims (controllers.annotator);
        `memory_sources`: where devices whose driver publishes no `memory` get theirs."""
        # The CEL parser is imported at the first selector compiled (`quota.cel.selector`,
        # for the CLI's start-up): 0.1-0.3 s in one piece (building the grammar's tables),
        # here, before `serve` runs anything else on its loop, rather than in a review or
        # once the stall watch runs (bench/stalls.py).
        import quota.cel.syntax  # noqa: F401
        self.inventory = Inventory(memory_sources)
        self.classes: dict[DeviceClassName, DeviceClass] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.admitter = Admitter(Pricer(self.inventory, self.classes), Ledger(default_mode=default_pricing))
        # Quotas' windows by the wall clock, allowing for other replicas' (`quota.quotas.windows`).
        self.admitter.ledger.clock, self.admitter.ledger.clock_skew = time.time, clock_skew
        # One slow lane for every review and Workload decision (`runtime.slicing`).
        self.slicer = Slicer()
        # Lists and scrapes in slices, the collector kept off what they build (`kube.rebuilds`).
        self.rebuilds = Rebuilds()
        # Stored claims count at an upper bound until priced after ready (`controllers.refine`).
        self.refiner = Refiner(self.admitter, self.slicer, changed=self._tell, rebuilds=self.rebuilds)
        # A team's part of a namespace counted in slices, not at once (`kube.recounts`).
        self.recounter = Recounter(self.admitter.ledger, self.rebuilds, changed=self._tell)
        self.ready = asyncio.Event()  # set once `serve` announced it is ready
        self.holders = Holders()  # who holds which device: the usage metrics' per-device view
        self.requeue = requeue  # told each deleted claim; its counters are exported
        self.annotator = (Annotator(api, self.admitter.annotations_due, self.admitter.annotations_may_be_due,
                                    leading=leading, run=lambda fn: self.slicer.run(fn, wait=True))
                          if leading is not None else None)
        # The claim watch's progress and the claim store's versions: the persisted
        # reservations' watermark (quota.accounting.reservations) waits on the one, reads the other.
        progress = Progress()
        # The Namespace watch's: a ClusterDeviceQuota's second watermark (namespacesThrough).
        namespace_progress = Progress()
        namespace_store = NamespaceStore(self.namespaces, changed=self._tell_namespace, admitter=self.admitter,
                                         quotas_changed=self._tell, reprice=self.refiner.add)
        claim_store = ClaimStore(self.admitter, freed=self._freed(requeue) if requeue else None,
                                 holders=self.holders, recorder=self.annotator, provisional=self.refiner.add,
                                 changed=self._tell)
        self.reservations = Reservations(api, self.admitter.ledger, ttl=reservation_ttl, progress=progress,
                                         claim_version=claim_store.version,
                                         claim_recorded=claim_store.recorded_version,
                                         namespace_progress=namespace_progress,
                                         namespaces_seen=lambda: namespace_store.newest,
                                         leases=LeaseBook(Sizing(period=lease_period)))
        claim_store.deleted = self.reservations.claim_deleted
        self.reservations.claim_history_known = claim_store.history_known

        # Told the quotas every claim, DeviceQuota and Workload event moved (None: any), as
        # the ledger returns them; the quota controller listens here (controllers.quotas).
        self.changed: list[QuotasChanged] = []
        # Told the namespace of every Namespace event (controllers.governed).
        self.namespaces_changed: list[Callable[[str | None], None]] = []

        def reflector(resource: Resource, store: Store, *, claims: bool = False,
                      settings: WatchSettings = WatchSettings(), moves: Progress | None = None) -> Reflector:
            return Reflector(api, resource, store, trim=trim_claim if claims else trim_object,
                             progress=progress if claims else moves, settings=settings,
                             rebuild=self.rebuilds.relist)

        self.first = [
            reflector(SLICES, SliceStore(self.inventory), settings=WatchSettings(page_size=SLICE_PAGE, stream_list=True)),
            reflector(CLASSES, ClassStore(self.classes)),
            reflector(NAMESPACES, namespace_store, moves=namespace_progress),
            *(reflector(resource, QuotaStore(self.admitter, observe=self.reservations.observe,
                                             drop=self.reservations.drop, reprice=self.refiner.add,
                                             changed=self._tell, cluster=resource is CLUSTER_QUOTAS))
              for resource in (QUOTAS, CLUSTER_QUOTAS)),
            *also,
        ]
        self.claims = reflector(CLAIMS, claim_store, claims=True,
                                settings=WatchSettings(page_size=CLAIM_PAGE, stream_list=True))
        # Kueue (controllers.kueue): started with the claims, once the inventory and classes
        # that price a Workload are synced.
        self.kueue: KueueCaches | None = None
        self.later: list[Reflector] = []
        if kueue:
            self.kueue = KueueCaches(self.admitter, forget=self.reservations.forget_workload, changed=self._tell)
            self.later = [
                reflector(TEMPLATES, TemplateStore(self.kueue)),
                reflector(ADMISSION_CHECKS, CheckStore(self.kueue)),
                reflector(WORKLOADS, WorkloadStore(self.kueue)),
                Reflector(api, PODS, PodStore(self.kueue), label_selector=WORKLOAD_LABEL,
                          rebuild=self.rebuilds.relist),
            ]
        for r in also:
            r.rebuild = self.rebuilds.relist

    def _freed(self, requeue: Requeuer) -> Callable[[str], None]:
        """Quota freed in `namespace`: its waiting Pods retried, and those of every namespace
        of its teams (a ClusterDeviceQuota's room is shared by its namespaces)."""
        ledger = self.admitter.ledger

        def freed(namespace: str) -> None:
            # One deletion, one credit for the whole team (quota.status.requeueing): never a
            # write per namespace of a team of hundreds.
            requeue.quota_freed(namespace, team=[member for quota in ledger.quotas(Namespace(namespace))
                                                 if quota.cluster for member in ledger.members(quota.name)])

        return freed

    def _tell(self, keys: Iterable[QuotaKey] | None) -> None:
        keys = None if keys is None else tuple(keys)
        for listener in self.changed:
            listener(keys)

    def _tell_namespace(self, namespace: str | None) -> None:
        for listener in self.namespaces_changed:
            listener(namespace)

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in (*self.first, self.claims, *self.later))

    @property
    def live(self) -> bool:
        """Every reflector follows the server now (`kube.watching`: not while its watch is
        being reconnected after an error, an API server restart, or relisted after a 410)."""
        return all(r.live for r in (*self.first, self.claims, *self.later))

    async def wait_synced(self) -> None:
        for r in (*self.first, self.claims, *self.later):
            await r.synced.wait()

    async def run(self) -> None:
        """Run every reflector until cancelled; claims start once the others synced (module doc)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.refiner.run(self.ready.wait), name="stored claims")
            group.create_task(self.recounter.run(), name="team recounts")
            for r in self.first:
                group.create_task(r.run(), name=f"reflector {r.resource.plural}")
            await asyncio.gather(*(r.synced.wait() for r in self.first))
            group.create_task(self.claims.run(), name="reflector resourceclaims")
            for r in self.later:
                group.create_task(r.run(), name=f"reflector {r.resource.plural}")


def leader_elector(api: KubeApi, options: ServeOptions) -> LeaderElector:
    election = options.leader_election
    return LeaderElector(api, name=election.lease_name, namespace=election.lease_namespace,
                         identity=election.identity or default_identity(), timing=election.timing)


async def lead(elector: LeaderElector, caches: Caches, options: ServeOptions, recorder: EventRecorder,
               metrics: Metrics) -> None:
    """Campaign for the Lease; while leading, run the quota controller over the caches.

    The controller starts only once every cache has synced: a status computed from a
    half-listed cache would publish too little usage.
    """
    def exceeded(namespace: str, name: str, uid: str, message: str) -> None:
        kind = "DeviceQuota" if namespace else "ClusterDeviceQuota"
        recorder.record(EventKey(Ref(DEVICE_QUOTA, kind, name, namespace, uid), None, "Warning",
                                 "QuotaExceeded", "Reconcile", message))

    def boundary(namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        kind = "DeviceQuota" if namespace else "ClusterDeviceQuota"
        recorder.record(EventKey(Ref(DEVICE_QUOTA, kind, name, namespace, uid), None, "Normal", reason, "Reconcile",
                                 message))

    applied = AppliedQuotas(caches.reservations.api, leading=elector.leading, resync=options.resync_seconds,
                            refresh=options.team_totals_refresh_seconds)
    metrics.applied_writes(lambda: applied.writes)
    controller = QuotaController(caches.admitter.ledger, caches.reservations, leading=elector.leading,
                                 resync=options.resync_seconds, exceeded=exceeded, observe=metrics.reconcile.observe,
                                 published=applied.published, boundary=boundary)
    governed = GovernedLabels(caches.reservations.api, caches.admitter.ledger, caches.namespaces,
                              leading=elector.leading, resync=options.resync_seconds)
    caches.changed.append(controller.changed)
    caches.changed.append(governed.quotas_changed)
    caches.namespaces_changed.append(governed.changed)

    async def work() -> None:
        await caches.wait_synced()
        runs = [controller.run(), governed.run(), applied.run()]
        if caches.kueue is not None:
            runs.append(AdmissionCheckController(caches.reservations.api, caches.kueue, caches.reservations, recorder,
                                                 leading=elector.leading, retry_seconds=options.kueue_retry_seconds,
                                                 slicer=caches.slicer).run())
        await asyncio.gather(*runs)

    await elector.run(work)


def observability(api: KubeApi, caches: Caches, tls: ReloadingContext | None, manager: CertificateManager | None,
                  leading: Callable[[], bool], *, team_series: int = DEFAULT_SERIES,
                  ) -> tuple[Metrics, EventRecorder, Observer]:
    """The process's metrics and Event recorder, and the hook telling both every verdict.

    `leading()`: whether this replica holds the quota controller's Lease (only the leader
    exports the usage metrics, so a sum over replicas never counts twice); `team_series`:
    the namespaces a team exports a part of (`quota.status.breakdown`).
    """
    metrics = Metrics()
    ledger = caches.admitter.ledger
    metrics.namespace.has_quota = lambda namespace: bool(ledger.quotas(Namespace(namespace)))
    if (annotator := caches.annotator) is not None:
        annotator.allocated = metrics.allocated
        metrics.annotations(lambda: annotator.pending if leading() else 0,
                            lambda: annotator.writers if leading() else 0)
    recorder = EventRecorder(KubeSink(api), instance=reporting_instance(),
                             dropped=lambda reason: metrics.events_dropped.labels(reason).inc(),
                             written=lambda operation: metrics.events_written.labels(operation).inc(),
                             quota_uid=lambda namespace, name: uid_of(caches.reservations.newest(namespace, name)))
    if annotator is not None:
        def unrecorded(claim: Claim, why: str) -> None:
            metrics.unrecorded(claim.namespace)
            recorder.record(EventKey(Ref(RESOURCE_V1, "ResourceClaim", claim.name, claim.namespace, claim.uid), None,
                                     "Warning", "AnnotationsRefused", "Annotate", unrecorded_note(why)))

        annotator.unrecorded = unrecorded
    metrics.watch(lambda: (*caches.first, caches.claims))
    metrics.leases(caches.reservations.leases)
    if (requeue := caches.requeue) is not None:
        metrics.requeue(lambda: requeue.credits, lambda: requeue.writes, lambda: requeue.pending)
    UsageMetrics(caches.admitter.ledger, caches.inventory, caches.holders, pending=caches.reservations.pending,
                 leading=leading, team_series=team_series).register(metrics)

    def expirations() -> Iterator[tuple[str, datetime]]:
        if tls is not None:
            yield "serving", tls.not_after
        if manager is not None and manager.material is not None:
            yield "ca", inspect(manager.material.ca.cert_pem).not_after

    metrics.certificates(expirations)

    def observe(path: str, review: AdmissionRequest | None, verdict: Verdict, seconds: float) -> None:
        metrics.review(path, review, verdict, seconds)
        recorder.review(review, verdict)

    return metrics, recorder, observe
