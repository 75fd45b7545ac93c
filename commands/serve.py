"""`dra-quota serve`: the admission webhook over HTTPS, on caches of the live cluster.

Neighbours: `commands.servecommand` parses the flags into `ServeOptions` (`commands.options`);
`commands.wiring` builds the caches (one `kube.watching.Reflector` per kind feeding
`kube.caches` and `kube.claimstore`), the leader's controllers and the metrics; `commands.listeners` reloads
the certificate files and serves the metrics; `commands.shutdown` stops it all in
order; `webhook.endpoints` and `webhook.server` answer the reviews; `certs.tls` serves
the certificate pair; `webhook.connections` bounds the webhook's and the metrics'
listeners; `runtime.stalls` measures the event loop's stalls. This module owns the
process's life: start-up, readiness, signals and shutdown.

`/readyz` answers 200 only after every reflector synced (claims are listed last:
`commands.wiring`), and 503 again once shutdown began, so no review reaches a replica
with a partial view; 503 too while a reflector reconnects after losing its watch (an API
server restarting) or relists after a 410, until each follows the server again; and 503
while the API server does not answer (`kube.contact`: then reviews are answered 503 too,
and the webhooks' failurePolicy decides).

Reservations are persisted on DeviceQuota status before a claim is admitted
(`kube.quotawriter`, protocol and TTL in `quota.accounting.reservations`), so several replicas
share the quotas without over-committing; `--reuse-port` lets them share one port.
The replica holding the Lease (`controllers.leader`) also runs the quota controller
(`controllers.quotas`) over the same caches: it publishes used/reserved/conditions on
each DeviceQuota's status (`quota.status.quotastatus` says how it shares that status with the
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
import contextvars
import faulthandler
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web
from kube.loaders import ConfigException

from certs.manager import CertificateManager, Conflict
from certs.tls import ReloadingContext
from commands.listeners import metrics_listener, pair_stamp, read_pair, reload_certificates
from commands.options import (JsonFormatter, LeaderElection, ServeError, ServeOptions, configure_logging,
                              policy_source)
from commands.shutdown import shut_down
from commands.wiring import Caches, lead, leader_elector, observability
from controllers.kueue import PodLookup, serves_workloads
from controllers.requeue import Requeuer
from kube.api import KubeApi
from kube.apierror import ApiError
from kube.contact import Contact
from kube.resources import QUOTAS
from runtime.stalls import time_collections, watch as watch_stalls
from webhook.certificates import start as start_self_managed
from webhook.claimreview import ClaimContext
from webhook.connections import Connections
from webhook.endpoints import endpoints
from webhook.labelaccess import LabelAccess
from webhook.metricsserver import metrics_limits
from webhook.server import build_app
from webhook.showbackmetrics import Showback
from webhook.tlssite import HTTP_LOG, TlsSite

# What `commands.options` and `commands.wiring` hold is importable from here as before.
__all__ = ["LIMITATIONS", "Caches", "JsonFormatter", "LeaderElection", "ServeError", "ServeOptions",
           "configure_logging", "policy_source", "serve"]

log = logging.getLogger(__name__)

STARTING = "dra-quota is starting: its caches have not listed everything yet; retry"

LIMITATIONS = (
    "Reservations are persisted on DeviceQuota status (several replicas may serve); "
    "the replica holding the Lease writes status.used/reserved and exports the usage metrics."
)


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
            stamp = pair_stamp(options)
            tls = ReloadingContext(read_pair(options))
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
        certificates = reload_certificates(options, tls, stamp)
    else:
        try:
            tls, manager = await start_self_managed(api, options.certificates)
        except (ApiError, Conflict, OSError) as err:
            await api.close()
            raise ServeError(f"cannot set up the self-managed certificate: {err}") from None
        certificates = manager.run()
    stop, hurry = asyncio.Event(), asyncio.Event()  # the first signal; a second one
    loop = asyncio.get_running_loop()

    def signalled() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    # The Lease holder alone runs the controller, requeues waiting Pods and exports the
    # usage metrics; a replica that never campaigns (--no-controller) does none of them.
    elector = leader_elector(api, options) if options.controller else None
    leading: Callable[[], bool] = elector.leading if elector is not None else (lambda: False)
    requeue = Requeuer(api, leading=leading) if options.requeue_waiting_pods else None
    if options.kueue_retry_seconds < 1:
        await api.close()
        raise ServeError(f"--kueue-retry-seconds must be at least 1, got {options.kueue_retry_seconds}")
    kueue = options.kueue == "on" or (options.kueue == "auto" and await serves_workloads(api))
    log.info("Kueue AdmissionCheck controller: %s (--kueue %s)", "on" if kueue else "off", options.kueue)
    caches = Caches(api, options.default_pricing, reservation_ttl=options.reservation_ttl, requeue=requeue,
                    lease_period=options.lease_period, memory_sources=options.memory_sources,
                    clock_skew=options.clock_skew,
                    also=policy.reflectors(api), kueue=kueue, leading=leading if elector is not None else None)
    ctx = ClaimContext(caches.admitter, caches.namespaces.get, policy.policy, caches.reservations,
                       options.allocation_check,
                       learn_pod=PodLookup(api, caches.admitter) if kueue else None, slicer=caches.slicer,
                       recounts=caches.recounter, may_label=LabelAccess(api))
    metrics, recorder, observe = observability(api, caches, tls, manager, leading,
                                               team_series=options.team_namespace_series)
    # GPU-memory-seconds: every replica follows the claims, the leader alone accrues them.
    showback = Showback(caches.admitter.ledger, caches.inventory, lambda: leading() and caches.synced)
    showback.attach()
    showback.register(metrics)
    # Its own connection pool: a probe must not queue behind the writes (`kube.contact`).
    contact = Contact(api.detached())
    metrics.contact(contact.reachable)
    connections = Connections(options.limits)
    metrics_connections = Connections(metrics_limits(options.limits))
    metrics.connections({"webhook": connections, "metrics": metrics_connections})

    def unavailable() -> str:
        # Deciding on caches that have not listed everything could admit a claim its quota
        # governs unchecked: undecided, the webhooks' failurePolicy decides (`kube.contact`).
        return contact.unavailable() if caches.synced else STARTING

    app = build_app(endpoints(ctx), ready=lambda: caches.synced and caches.live and not stop.is_set()
                    and contact.reachable(),
                    observe=observe, connections=connections, unavailable=unavailable)
    runner = web.AppRunner(app, shutdown_timeout=options.shutdown_grace_seconds, access_log=None, handle_signals=False,
                           logger=HTTP_LOG)
    if options.webhook:
        await runner.setup()
    fenced = elector.fenced() if elector is not None else contextvars.copy_context()
    # The leader's writers: stopped before the listener closes (`shut_down`).
    writers = [
        *([asyncio.create_task(lead(elector, caches, options, recorder, metrics), name="leader election")]
          if elector else []),
        # Fenced: each of their writes passes the Lease gate as it is sent (controllers.leader).
        *([asyncio.create_task(requeue.run(), name="requeue", context=fenced)] if requeue else []),
        *([asyncio.create_task(caches.annotator.run(), name="claim annotations", context=fenced)]
          if caches.annotator else []),
    ]
    background = [
        *writers,
        asyncio.create_task(caches.run(), name="caches"),
        asyncio.create_task(contact.run(), name="API server contact"),
        *([asyncio.create_task(certificates, name="certificates")] if certificates else []),
        asyncio.create_task(recorder.run(), name="events"),
        asyncio.create_task(policy.poll(), name="admin-access policy file"),
        asyncio.create_task(watch_stalls(metrics.stalled), name="event loop stalls"),
        asyncio.create_task(time_collections(metrics.collected), name="collections timed"),
        asyncio.create_task(caches.rebuilds.collect(), name="collections on a clock"),
        asyncio.create_task(showback.run(), name="showback"),
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
            hurry.set()  # no shutdown delay: answering on from a dead cache is what this prevents

    for task in background:
        task.add_done_callback(fatal)
    try:
        if options.metrics_port:
            metrics_runner = await metrics_listener(options, metrics, api, tls, metrics_connections, caches.rebuilds)
        site = TlsSite(runner, options.bind_address, options.port, context=tls.context, connections=connections,
                       reuse_port=options.reuse_port) if tls is not None else None
        # On a port shared with SO_REUSEPORT the kernel hands this replica connections as
        # soon as it listens, ready or not (no Service reads its readiness): it listens
        # once its caches have synced. Alone on its port it listens at once, for the probes.
        if site is not None and not options.reuse_port:
            await _listen(site, options)
        await _announce_ready(caches, stop, started)
        if site is not None and options.reuse_port and caches.synced:
            await _listen(site, options)
        await stop.wait()
        connections.drain()  # every answer from now on closes its connection cleanly
        # Only a replica the endpoints may hold needs the delay: one that listens and was ready.
        if options.shutdown_delay_seconds > 0 and options.webhook and caches.ready.is_set() and not failed:
            await _not_ready_for(options.shutdown_delay_seconds, hurry)
        log.info("shutting down: the leader's writers stop, then in-flight reviews finish")
    finally:
        async def drain() -> None:
            # runner.cleanup closes the listener, then waits up to shutdown_timeout for
            # the handlers in flight.
            if options.webhook:
                await runner.cleanup()
                await caches.reservations.close()  # no review in flight: release the leases' idle room
            if metrics_runner is not None:
                await metrics_runner.cleanup()

        await shut_down(writers, [t for t in background if t not in writers], drain,
                        patience=options.shutdown_grace_seconds)
        await api.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 1 if failed else 0


async def _listen(site: TlsSite, options: ServeOptions) -> None:
    await site.start()
    log.info("serving admission reviews on https://%s:%d; %s", options.bind_address, options.port, LIMITATIONS)


async def _not_ready_for(seconds: float, hurry: asyncio.Event) -> None:
    """Answer on, not ready (`/readyz` 503), for `seconds` or until a second signal.

    The kubelet's readiness probe sees the 503 and the endpoints drop this Pod; until they
    do, the API server still sends reviews here (a new connection to a closed listener
    is a failed call: under failurePolicy Fail, a refused create). kube-apiserver's own
    `--shutdown-delay-duration` is the model.
    """
    log.info("SIGTERM: not ready; answering reviews %gs more so the endpoints drop this Pod first "
             "(--shutdown-delay; a second signal stops at once)", seconds)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await hurry.wait()


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
