"""`dra-quota serve`'s certificate files, reloaded when they change, and its metrics listener.

Neighbours: `commands.serve` starts both; `runtime.filepoll` polls the files;
`certs.tls.ReloadingContext` serves the pair read last; `webhook.metricsserver` answers
`GET /metrics` behind `webhook.connections`' bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone

from aiohttp import web

from certs.authority import KeyPair
from certs.rotation import Policy, plan
from certs.tls import ReloadingContext
from commands.options import ServeError, ServeOptions
from kube.api import KubeApi
from kube.rebuilds import Rebuilds
from runtime.filepoll import Stamp, reload_on_change, stamp
from webhook.connections import Connections
from webhook.metrics import Metrics
from webhook.metricsserver import TokenAccess, serve_metrics

__all__ = ["metrics_listener", "pair_stamp", "read_pair", "reload_certificates", "self_signed"]

log = logging.getLogger(__name__)


def read_pair(options: ServeOptions) -> KeyPair:
    assert options.tls_cert_file is not None and options.tls_key_file is not None
    return KeyPair(options.tls_cert_file.read_bytes(), options.tls_key_file.read_bytes())


def pair_stamp(options: ServeOptions) -> Stamp:
    assert options.tls_cert_file is not None and options.tls_key_file is not None
    return stamp(options.tls_cert_file, options.tls_key_file)


async def reload_certificates(options: ServeOptions, tls: ReloadingContext, since: Stamp) -> None:
    """Serve a changed pair from the next handshake on (polled: `runtime.filepoll`).

    A pair read half-written (cert and key not matching yet) fails to load and is
    retried. `since` is the files' state taken before the pair being served was read.
    """

    def reload() -> None:
        if tls.update(read_pair(options)):  # ssl.SSLError is an OSError
            log.info("serving certificate reloaded from %s (serial %x)", options.tls_cert_file, tls.serial)

    await reload_on_change(lambda: pair_stamp(options), options.cert_poll_seconds, since, reload,
                           f"the serving certificate from {options.tls_cert_file}")


async def metrics_listener(options: ServeOptions, metrics: Metrics, api: KubeApi, tls: ReloadingContext | None,
                           connections: Connections, rebuilds: Rebuilds) -> web.AppRunner:
    """The metrics listener (webhook.metricsserver): HTTPS with the serving certificate
    (`--no-webhook`: a self-signed one made now) unless `--no-metrics-secure`."""
    host, port = options.metrics_bind_address, options.metrics_port

    async def render(exposition: Callable[[], list[bytes]]) -> list[bytes]:
        return await rebuilds.run(exposition)

    context = None
    if options.metrics_secure:
        context = (tls or ReloadingContext(self_signed())).context
    try:
        runner, _ = await serve_metrics(metrics, host=host, port=port, context=context,
                                        access=TokenAccess(api) if options.metrics_secure else None,
                                        connections=connections, render=render)
    except (OSError, OverflowError, ValueError) as err:  # OverflowError: a port outside 0-65535
        raise ServeError(f"cannot serve metrics on {host}:{port}: {err}") from None
    log.info("serving metrics on %s://%s:%d/metrics%s", "https" if context else "http", host, port,
             " (TokenReview + SubjectAccessReview)" if context else "")
    return runner


def self_signed() -> KeyPair:
    """A serving pair for a replica that has none (`--no-webhook`), kept in memory only:
    its scrapers cannot verify it (as controller-runtime's self-signed metrics certificate)."""
    minted = plan(None, Policy(dns_names=("dra-quota-metrics",)), now=datetime.now(timezone.utc), trusted=frozenset())
    assert minted is not None  # nothing current: always a plan
    return minted.material.serving
