"""`dra-quota serve`: the admission webhook over HTTPS, on caches of the live cluster.

Neighbours: `commands.cli` parses the flags into `ServeOptions`; `kube.api` talks to
the API server and `kube.watching.Reflector` keeps `kube.caches` current;
`webhook.endpoints` and `webhook.server` answer the reviews; `certs.tls` serves the
certificate pair; `webhook.connections` bounds the webhook's and the metrics' listeners;
`runtime.stalls` measures the event loop's stalls. This module only wires them together
and owns the process's life: start-up, readiness, certificate reload, signals and shutdown.

Start-up order: ResourceSlices, DeviceClasses, Namespaces and DeviceQuotas are listed
first; ResourceClaims only once those are synced, because re-deriving a claim's charge
prices it against the inventory and the classes (an empty inventory would price every
existing claim at nothing). `/readyz` answers 200 only after every reflector synced,
and 503 again once shutdown began, so no review reaches a replica with a partial view.

Reservations are persisted on DeviceQuota status before a claim is admitted
(`kube.quotawriter`, protocol and TTL in `quota.reservations`), so several replicas
share the quotas without over-committing; `--reuse-port` lets them share one port.
The replica holding the Lease (`controllers.leader`) also runs the quota controller
(`controllers.quotas`) over the same caches: it publishes used/reserved/conditions on
each DeviceQuota's status (`quota.quotastatus` says how it shares that status with the
webhooks). `--no-webhook` skips the listener and the certificates, `--no-controller`
the Lease and the controller.
With `--kueue` (auto: when Kueue's v1beta2 API is served) every replica also caches
Kueue's Workloads and the leader runs their AdmissionCheck (`controllers.kueue`).

Limitations of this version:
- Metrics on `--metrics-port`: admission, watch, certificate, Event, connection and
  event-loop ones (`webhook.metrics`), usage (`webhook.usagemetrics`, the leader only);
  over HTTPS to tokens the API server allows (`webhook.metricsserver`).
  Certificates: self-managed by default (`webhook.certificates`: Secret, caBundles, renewal and CA rollover), or
  from files (`--cert-mode files`, e.g. cert-manager), reloaded when they change on
  disk. The adminAccess policy follows its ConfigMap or file (`webhook.adminpolicy`).
- Admission counts allocated claims from each replica's own cache, not from
  `status.used` (which the leader publishes from the same kind of cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from kube.loaders import ConfigException

from certs.authority import KeyPair
from certs.authority import inspect
from certs.manager import CertificateManager, Conflict
from certs.rotation import Policy, plan
from certs.tls import ReloadingContext
from controllers.annotator import Annotator
from controllers.governed import GovernedLabels
from controllers.kueue import (ADMISSION_CHECKS, PODS, TEMPLATES, WORKLOADS, AdmissionCheckController, CheckStore,
                           KueueCaches, PodLookup, PodStore, TemplateStore, WorkloadStore, serves_workloads)
from controllers.leader import LeaderElector, default_identity
from controllers.quotas import QuotaController
from controllers.refine import Refiner
from controllers.requeue import Requeuer
from kube.admissionreview import AdmissionRequest, Verdict
from kube.api import ApiError, KubeApi, Resource
from kube.caches import ClaimStore, ClassStore, NamespaceStore, QuotaStore, QuotasChanged, SliceStore
from kube.events import DEVICE_QUOTA, EventKey, EventRecorder, KubeSink, Ref, reporting_instance, uid_of
from kube.quotawriter import Reservations
from kube.rebuilds import Rebuilds, collect_young
from kube.watching import Progress, Reflector, Store, WatchSettings, trim_claim, trim_object
from quota.admission import Admitter
from quota.inventory import Inventory
from quota.leases import Timing
from quota.ledger import Ledger, QuotaKey
from quota.model import DeviceClass, DeviceClassName, Mode, Namespace
from quota.policy import PolicyError
from quota.pricing import Pricer
from quota.usage import Holders
from quota.workloads import WORKLOAD_LABEL
from runtime.filepoll import Stamp, reload_on_change, stamp
from runtime.slicing import Slicer
from runtime.stalls import watch as watch_stalls
from webhook.adminpolicy import PolicySource
from webhook.certificates import SelfManaged
from webhook.certificates import start as start_self_managed
from webhook.claimreview import AllocationCheck, ClaimContext
from webhook.connections import HTTP_LOG, Connections, Limits, TlsSite
from webhook.endpoints import endpoints
from webhook.metrics import DEFAULT_METRICS_PORT, Metrics
from webhook.metricsserver import TokenAccess, metrics_limits, serve_metrics
from webhook.server import Observer, build_app
from webhook.usagemetrics import UsageMetrics

__all__ = ["LIMITATIONS", "QUOTAS", "LeaderElection", "ServeError", "ServeOptions", "configure_logging",
           "policy_source", "serve"]

log = logging.getLogger(__name__)

LIMITATIONS = (
    "Reservations are persisted on DeviceQuota status (several replicas may serve); "
    "the replica holding the Lease writes status.used/reserved and exports the usage metrics."
)
SLICES = Resource("resource.k8s.io/v1", "resourceslices")
CLASSES = Resource("resource.k8s.io/v1", "deviceclasses")
NAMESPACES = Resource("v1", "namespaces")
QUOTAS = Resource("draquota.io/v1alpha1", "devicequotas")
CLAIMS = Resource("resource.k8s.io/v1", "resourceclaims")
# ResourceSlices a list page: a page is decoded in one piece on the event loop, and a
# slice of 128 GPUs is ~28 KB of JSON (bench/check.py's dump): 500 a page took ~0.1 s.
SLICE_PAGE = 25


class ServeError(Exception):
    """A start-up failure worth one line (bad flag value, unreadable file)."""


@dataclass(frozen=True, slots=True)
class LeaderElection:
    lease_name: str = "dra-quota-controller"
    lease_namespace: str = "dra-quota-system"
    timing: Timing = Timing()
    identity: str = ""  # "": controllers.leader.default_identity() (POD_NAME, else the host name)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    # --cert-mode files: both paths; --cert-mode self: `certificates`, and no paths.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    certificates: SelfManaged | None = None
    kubeconfig: str | None = None  # None: $KUBECONFIG, in-cluster, ~/.kube/config (kube.credentials)
    bind_address: str = "0.0.0.0"
    port: int = 8443
    # The adminAccess allowlist: a file polled every policy_poll_seconds, or a ConfigMap
    # (namespace, name) watched through the API; at most one (webhook.adminpolicy).
    admin_access_policy: Path | None = None
    admin_access_configmap: tuple[str, str] | None = None
    policy_poll_seconds: float = 5.0
    allocation_check: AllocationCheck = "enforce"
    default_pricing: Mode = "conservative"
    cert_poll_seconds: float = 5.0
    # How long a persisted reservation whose claim never appears holds before any replica
    # may drop it (quota.reservations: longer than the API server's request timeout plus
    # any replica's claim watch lag).
    reservation_ttl: float = 120.0
    # SO_REUSEPORT: several processes on one host serve one port (the e2e test's replicas).
    reuse_port: bool = False
    # In-flight reviews get this long to finish after SIGTERM; the API server's webhook
    # timeout (timeoutSeconds, 5 in deploy/) bounds them anyway.
    shutdown_grace_seconds: float = 10.0
    # Touch the templates Pods wait on when quota frees (controllers.requeue).
    requeue_waiting_pods: bool = True
    # GET /metrics (webhook.metricsserver); port 0: no metrics listener. Secure: HTTPS
    # with the serving certificate, to whom TokenReview + SubjectAccessReview allow;
    # else plain HTTP, on a loopback address only.
    metrics_bind_address: str = "0.0.0.0"
    metrics_port: int = DEFAULT_METRICS_PORT
    metrics_secure: bool = True
    # The HTTPS listeners' connection cap and timeouts (webhook.connections).
    limits: Limits = Limits()
    # All replicas serve the webhooks; the one holding the Lease runs the quota
    # controller (controllers.leader, controllers.quotas). --no-webhook: no HTTPS listener
    # and no certificates at all (a controller-only Deployment).
    webhook: bool = True
    controller: bool = True
    leader_election: LeaderElection = LeaderElection()
    # Every quota's status is recomputed this often even without events (seconds).
    resync_seconds: float = 300.0
    # The Kueue AdmissionCheck controller (controllers.kueue): "auto" runs it when the API
    # server serves kueue.x-k8s.io/v1beta2 workloads at start-up.
    kueue: Literal["auto", "on", "off"] = "auto"
    kueue_retry_seconds: int = 15


# -- logging ------------------------------------------------------------------------------------

# The fields webhook.server attaches to each review's log line.
_EXTRA_FIELDS = ("uid", "operation", "resource", "namespace", "object_name", "allowed", "duration_ms")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the review fields a handler attached as `extra`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: getattr(record, k) for k in _EXTRA_FIELDS if hasattr(record, k)})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(log_format: Literal["text", "json"], level: str = "INFO") -> None:
    """`level` for our packages; libraries stay at INFO (asyncio and the kubeconfig loader
    are chatty at DEBUG and say nothing about reviews)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=max(logging.INFO, logging.getLevelName(level.upper())), handlers=[handler], force=True)
    for package in ("quota", "runtime", "kube", "controllers", "webhook", "commands", "certs"):
        logging.getLogger(package).setLevel(level.upper())


# -- configuration ------------------------------------------------------------------------------


def policy_source(options: ServeOptions) -> PolicySource:
    """The adminAccess policy's source (`webhook.adminpolicy`); a file is read now."""
    if options.admin_access_configmap is not None:
        return PolicySource.from_configmap(*options.admin_access_configmap)
    if options.admin_access_policy is None:
        return PolicySource()
    try:
        return PolicySource.from_file(options.admin_access_policy, poll_seconds=options.policy_poll_seconds)
    except PolicyError as err:
        raise ServeError(f"--admin-access-policy {err}") from None


def _read_pair(options: ServeOptions) -> KeyPair:
    assert options.tls_cert_file is not None and options.tls_key_file is not None
    return KeyPair(options.tls_cert_file.read_bytes(), options.tls_key_file.read_bytes())


def _stamp(options: ServeOptions) -> Stamp:
    assert options.tls_cert_file is not None and options.tls_key_file is not None
    return stamp(options.tls_cert_file, options.tls_key_file)


async def _reload_certificates(options: ServeOptions, tls: ReloadingContext, since: Stamp) -> None:
    """Serve a changed pair from the next handshake on (polled: `runtime.filepoll`).

    A pair read half-written (cert and key not matching yet) fails to load and is
    retried. `since` is the files' state taken before the pair being served was read.
    """

    def reload() -> None:
        if tls.update(_read_pair(options)):  # ssl.SSLError is an OSError
            log.info("serving certificate reloaded from %s (serial %x)", options.tls_cert_file, tls.serial)

    await reload_on_change(lambda: _stamp(options), options.cert_poll_seconds, since, reload,
                           f"the serving certificate from {options.tls_cert_file}")


# -- the process --------------------------------------------------------------------------------


class Caches:
    """The domain objects the handlers read, and one reflector per kind feeding them."""

    def __init__(self, api: KubeApi, default_pricing: Mode, *, reservation_ttl: float = 120.0,
                 requeue: Requeuer | None = None, also: Sequence[Reflector] = (), kueue: bool = False,
                 leading: Callable[[], bool] | None = None) -> None:
        """`also`: more reflectors to run and be synced before ready (the adminAccess ConfigMap);
        `leading`: the Lease holder writes our annotations on claims (controllers.annotator)."""
        self.inventory = Inventory()
        self.classes: dict[DeviceClassName, DeviceClass] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.admitter = Admitter(Pricer(self.inventory, self.classes), Ledger(default_mode=default_pricing))
        # One slow lane for every review and Workload decision (`runtime.slicing`).
        self.slicer = Slicer()
        # Lists and scrapes in slices, the collector kept off what they build (`kube.rebuilds`).
        self.rebuilds = Rebuilds()
        # Stored claims count at an upper bound until priced after ready (`controllers.refine`).
        self.refiner = Refiner(self.admitter, self.slicer, changed=self._tell, rebuilds=self.rebuilds)
        self.ready = asyncio.Event()  # set once `serve` announced it is ready
        self.holders = Holders()  # who holds which device: the usage metrics' per-device view
        self.annotator = (Annotator(api, self.admitter.annotations_due, self.admitter.annotations_may_be_due,
                                    leading=leading, run=lambda fn: self.slicer.run(fn, wait=True))
                          if leading is not None else None)
        # The claim watch's progress and the claim store's versions: the persisted
        # reservations' watermark (quota.reservations) waits on the one, reads the other.
        progress = Progress()
        claim_store = ClaimStore(self.admitter, freed=requeue.quota_freed if requeue else None,
                                 holders=self.holders, recorder=self.annotator, provisional=self.refiner.add,
                                 changed=self._tell)
        self.reservations = Reservations(api, self.admitter.ledger, ttl=reservation_ttl, progress=progress,
                                         claim_version=claim_store.version,
                                         claim_recorded=claim_store.recorded_version)
        claim_store.deleted = self.reservations.claim_deleted

        # Told the quotas every claim, DeviceQuota and Workload event moved (None: any), as
        # the ledger returns them; the quota controller listens here (controllers.quotas).
        self.changed: list[QuotasChanged] = []
        # Told the namespace of every Namespace event (controllers.governed).
        self.namespaces_changed: list[Callable[[str | None], None]] = []

        def reflector(resource: Resource, store: Store, *, claims: bool = False,
                      settings: WatchSettings = WatchSettings()) -> Reflector:
            return Reflector(api, resource, store, trim=trim_claim if claims else trim_object,
                             progress=progress if claims else None, settings=settings,
                             rebuild=self.rebuilds.relist)

        self.first = [
            reflector(SLICES, SliceStore(self.inventory), settings=WatchSettings(page_size=SLICE_PAGE)),
            reflector(CLASSES, ClassStore(self.classes)),
            reflector(NAMESPACES, NamespaceStore(self.namespaces, changed=self._tell_namespace)),
            reflector(QUOTAS, QuotaStore(self.admitter, observe=self.reservations.observe, drop=self.reservations.drop,
                                         reprice=self.refiner.add, changed=self._tell)),
            *also,
        ]
        self.claims = reflector(CLAIMS, claim_store, claims=True)
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

    async def wait_synced(self) -> None:
        for r in (*self.first, self.claims, *self.later):
            await r.synced.wait()

    async def run(self) -> None:
        """Run every reflector until cancelled; claims start once the others synced (module doc)."""
        # The CEL parser is imported at the first selector compiled (`quota.cel.selector`,
        # for the CLI's start-up): ~0.3 s in one piece, here rather than in a review.
        import quota.cel.syntax  # noqa: F401
        async with asyncio.TaskGroup() as group:
            group.create_task(self.refiner.run(self.ready.wait), name="stored claims")
            for r in self.first:
                group.create_task(r.run(), name=f"reflector {r.resource.plural}")
            await asyncio.gather(*(r.synced.wait() for r in self.first))
            group.create_task(self.claims.run(), name="reflector resourceclaims")
            for r in self.later:
                group.create_task(r.run(), name=f"reflector {r.resource.plural}")


async def serve(options: ServeOptions) -> int:
    """Serve until SIGTERM or SIGINT; 0 after a clean shutdown, 1 when a background task died."""
    started = time.monotonic()
    # SIGUSR1 writes every thread's stack to stderr (the log) and serve goes on: how an
    # operator, or a test whose serve did not exit, sees where it is stuck. (Not when
    # stderr is no file, as under an in-process test's capture.)
    with contextlib.suppress(OSError, ValueError):  # io.UnsupportedOperation is both
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    policy = policy_source(options)
    tls: ReloadingContext | None = None
    if options.webhook and options.certificates is None:
        try:
            stamp = _stamp(options)
            tls = ReloadingContext(_read_pair(options))
        except (OSError, ValueError) as err:
            raise ServeError(f"cannot load the serving certificate: {err}") from None
    try:
        api = await KubeApi.connect(options.kubeconfig)
    except (ConfigException, OSError, ValueError) as err:
        raise ServeError(f"cannot reach the cluster: {err}") from None
    log.info("API server %s, credentials: %s", api.server, api.credentials.describe() if api.credentials else "?")
    manager: CertificateManager | None = None
    certificates: Coroutine[Any, Any, None] | None = None
    if not options.webhook:
        pass  # no listener, so no certificate to load, mint or watch
    elif options.certificates is None:
        assert tls is not None
        certificates = _reload_certificates(options, tls, stamp)
    else:
        try:
            tls, manager = await start_self_managed(api, options.certificates)
        except (ApiError, Conflict, OSError) as err:
            await api.close()
            raise ServeError(f"cannot set up the self-managed certificate: {err}") from None
        certificates = manager.run()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The Lease holder alone runs the controller, requeues waiting Pods and exports the
    # usage metrics; a replica that never campaigns (--no-controller) does none of them.
    elector = _elector(api, options) if options.controller else None
    leading: Callable[[], bool] = elector.leading if elector is not None else (lambda: False)
    requeue = Requeuer(api, leading=leading) if options.requeue_waiting_pods else None
    if options.kueue_retry_seconds < 1:
        await api.close()
        raise ServeError(f"--kueue-retry-seconds must be at least 1, got {options.kueue_retry_seconds}")
    kueue = options.kueue == "on" or (options.kueue == "auto" and await serves_workloads(api))
    log.info("Kueue AdmissionCheck controller: %s (--kueue %s)", "on" if kueue else "off", options.kueue)
    caches = Caches(api, options.default_pricing, reservation_ttl=options.reservation_ttl, requeue=requeue,
                    also=policy.reflectors(api), kueue=kueue, leading=leading if elector is not None else None)
    ctx = ClaimContext(caches.admitter, caches.namespaces.get, policy.policy, caches.reservations,
                       options.allocation_check,
                       learn_pod=PodLookup(api, caches.admitter) if kueue else None, slicer=caches.slicer)
    metrics, recorder, observe = _observability(api, caches, tls, manager, leading)
    connections = Connections(options.limits)
    metrics_connections = Connections(metrics_limits(options.limits))
    metrics.connections({"webhook": connections, "metrics": metrics_connections})
    app = build_app(endpoints(ctx), ready=lambda: caches.synced and not stop.is_set(), observe=observe,
                    connections=connections)
    runner = web.AppRunner(app, shutdown_timeout=options.shutdown_grace_seconds, access_log=None, handle_signals=False,
                           logger=HTTP_LOG)
    if options.webhook:
        await runner.setup()
    # The leader's writers: stopped before the listener closes (`_shut_down`).
    writers = [
        *([asyncio.create_task(_lead(elector, caches, options, recorder, metrics), name="leader election")]
          if elector else []),
        *([asyncio.create_task(requeue.run(), name="requeue")] if requeue else []),
        *([asyncio.create_task(caches.annotator.run(), name="claim annotations")] if caches.annotator else []),
    ]
    background = [
        *writers,
        asyncio.create_task(caches.run(), name="caches"),
        *([asyncio.create_task(certificates, name="certificates")] if certificates else []),
        asyncio.create_task(recorder.run(), name="events"),
        asyncio.create_task(policy.poll(), name="admin-access policy file"),
        asyncio.create_task(watch_stalls(metrics.stalled), name="event loop stalls"),
        asyncio.create_task(collect_young(), name="young collections"),
    ]
    metrics_runner: web.AppRunner | None = None
    failed: list[str] = []

    def fatal(task: asyncio.Task[None]) -> None:
        # A dead reflector means a frozen cache: answering from it would admit against
        # stale usage, so stop (the Deployment restarts us) rather than serve on.
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed, shutting down", task.get_name(), exc_info=task.exception())
            failed.append(task.get_name())
            stop.set()

    for task in background:
        task.add_done_callback(fatal)
    try:
        if options.metrics_port:
            metrics_runner = await _serve_metrics(options, metrics, api, tls, metrics_connections, caches.rebuilds)
        if tls is not None:
            site = TlsSite(runner, options.bind_address, options.port, context=tls.context, connections=connections,
                           reuse_port=options.reuse_port)
            await site.start()
            log.info("serving admission reviews on https://%s:%d; %s", options.bind_address, options.port, LIMITATIONS)
        await _announce_ready(caches, stop, started)
        await stop.wait()
        log.info("shutting down: the leader's writers stop, then in-flight reviews finish")
    finally:
        async def drain() -> None:
            # runner.cleanup closes the listener, then waits up to shutdown_timeout for
            # the handlers in flight.
            if options.webhook:
                await runner.cleanup()
            if metrics_runner is not None:
                await metrics_runner.cleanup()

        await _shut_down(writers, [t for t in background if t not in writers], drain,
                         patience=options.shutdown_grace_seconds)
        await api.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 1 if failed else 0


async def _shut_down(writers: Sequence[asyncio.Task[None]], rest: Sequence[asyncio.Task[None]],
                     drain: Callable[[], Awaitable[None]], *, patience: float) -> None:
    """Stop in the order that keeps every write and every review answered.

    1. The leader's writers (the controller and its Lease, claim annotations, requeues):
       their writes pass through our own webhooks (the claim-annotation guard's policy is
       Fail), so they end while our listener still answers: closing it first failed them
       with 500s. The Lease is released here, so another replica leads at once.
    2. `drain`: the listener closes and the reviews in flight finish (the grace).
    3. The rest: the reflectors those reviews read, the Event recorder they feed.
    """
    await _cancel(writers, patience)
    await drain()
    await _cancel(rest, patience)


async def _cancel(tasks: Sequence[asyncio.Task[None]], patience: float) -> None:
    """Cancel `tasks` and wait until they end.

    One still running `patience` seconds after its cancellation lost it (Python 3.11's
    `wait_for` drops a cancellation that races its inner future; a library may do the
    same) or is stuck in its clean-up: its stack is logged and it is cancelled again, so
    a lost cancellation delays the exit instead of hanging it.
    """
    for task in tasks:
        task.cancel()
    pending = {task for task in tasks if not task.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=patience)
        for task in pending:
            stack = io.StringIO()
            task.print_stack(file=stack)
            log.error("%s still running %gs after it was cancelled; cancelling it again. %s",
                      task.get_name(), patience, stack.getvalue())
            task.cancel()


async def _serve_metrics(options: ServeOptions, metrics: Metrics, api: KubeApi, tls: ReloadingContext | None,
                         connections: Connections, rebuilds: Rebuilds) -> web.AppRunner:
    """The metrics listener (webhook.metricsserver): HTTPS with the serving certificate
    (`--no-webhook`: a self-signed one made now) unless `--no-metrics-secure`."""
    host, port = options.metrics_bind_address, options.metrics_port

    async def render(exposition: Callable[[], bytes]) -> bytes:
        return await rebuilds.run(exposition)

    context = None
    if options.metrics_secure:
        context = (tls or ReloadingContext(_self_signed())).context
    try:
        runner, _ = await serve_metrics(metrics, host=host, port=port, context=context,
                                        access=TokenAccess(api) if options.metrics_secure else None,
                                        connections=connections, render=render)
    except (OSError, OverflowError, ValueError) as err:  # OverflowError: a port outside 0-65535
        raise ServeError(f"cannot serve metrics on {host}:{port}: {err}") from None
    log.info("serving metrics on %s://%s:%d/metrics%s", "https" if context else "http", host, port,
             " (TokenReview + SubjectAccessReview)" if context else "")
    return runner


def _self_signed() -> KeyPair:
    """A serving pair for a replica that has none (`--no-webhook`), kept in memory only:
    its scrapers cannot verify it (as controller-runtime's self-signed metrics certificate)."""
    minted = plan(None, Policy(dns_names=("dra-quota-metrics",)), now=datetime.now(timezone.utc), trusted=frozenset())
    assert minted is not None  # nothing current: always a plan
    return minted.material.serving


def _elector(api: KubeApi, options: ServeOptions) -> LeaderElector:
    election = options.leader_election
    return LeaderElector(api, name=election.lease_name, namespace=election.lease_namespace,
                         identity=election.identity or default_identity(), timing=election.timing)


async def _lead(elector: LeaderElector, caches: Caches, options: ServeOptions, recorder: EventRecorder,
                metrics: Metrics) -> None:
    """Campaign for the Lease; while leading, run the quota controller over the caches.

    The controller starts only once every cache has synced: a status computed from a
    half-listed cache would publish too little usage.
    """
    def exceeded(namespace: str, name: str, uid: str, message: str) -> None:
        recorder.record(EventKey(Ref(DEVICE_QUOTA, "DeviceQuota", name, namespace, uid), None, "Warning",
                                 "QuotaExceeded", "Reconcile", message))

    controller = QuotaController(caches.admitter.ledger, caches.reservations, leading=elector.leading,
                                 resync=options.resync_seconds, exceeded=exceeded, observe=metrics.reconcile.observe)
    governed = GovernedLabels(caches.reservations.api, caches.admitter.ledger, caches.namespaces,
                              leading=elector.leading, resync=options.resync_seconds)
    caches.changed.append(controller.changed)
    caches.changed.append(governed.quotas_changed)
    caches.namespaces_changed.append(governed.changed)

    async def work() -> None:
        await caches.wait_synced()
        runs = [controller.run(), governed.run()]
        if caches.kueue is not None:
            runs.append(AdmissionCheckController(caches.reservations.api, caches.kueue, caches.reservations, recorder,
                                                 leading=elector.leading, retry_seconds=options.kueue_retry_seconds,
                                                 slicer=caches.slicer).run())
        await asyncio.gather(*runs)

    await elector.run(work)


def _observability(api: KubeApi, caches: Caches, tls: ReloadingContext | None, manager: CertificateManager | None,
                   leading: Callable[[], bool]) -> tuple[Metrics, EventRecorder, Observer]:
    """The process's metrics and Event recorder, and the hook telling both every verdict.

    `leading()`: whether this replica holds the quota controller's Lease (only the leader
    exports the usage metrics, so a sum over replicas never counts twice).
    """
    metrics = Metrics()
    ledger = caches.admitter.ledger
    metrics.namespace.has_quota = lambda namespace: bool(ledger.quotas(Namespace(namespace)))
    if caches.annotator is not None:
        caches.annotator.allocated = metrics.allocated
    recorder = EventRecorder(KubeSink(api), instance=reporting_instance(),
                             dropped=lambda reason: metrics.events_dropped.labels(reason).inc(),
                             quota_uid=lambda namespace, name: uid_of(caches.reservations.newest(namespace, name)))
    metrics.watch(lambda: (*caches.first, caches.claims))
    UsageMetrics(caches.admitter.ledger, caches.inventory, caches.holders, pending=caches.reservations.pending,
                 leading=leading).register(metrics)

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


async def _announce_ready(caches: Caches, stop: asyncio.Event, started: float) -> None:
    """Wait for every reflector's first sync (or shutdown) and log how long it took."""

    tasks = [asyncio.create_task(caches.wait_synced()), asyncio.create_task(stop.wait())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    if caches.synced:
        # Each list froze what it built (`kube.rebuilds`): no full collection walks
        # the caches (58,000 devices: ~0.5 s, bench/admission.py).
        log.info("ready after %.2fs: %d devices, %d classes, %d namespaces, %d quotas, %d claims "
                 "(%d counted at their upper bound until priced)",
                 time.monotonic() - started, len(caches.inventory.usable()), len(caches.classes),
                 len(caches.namespaces), len(caches.admitter.ledger.quotas()),
                 sum(1 for _ in caches.admitter.ledger.entries()), caches.refiner.pending)
        caches.ready.set()
