"""`GET /metrics` of `dra-quota serve`: over HTTPS to whom the API server allows, or plain HTTP on loopback.

Neighbours: `webhook.metrics` renders the exposition; `kube.api` asks the API server
who a token is and what it may do; `webhook.connections` bounds the HTTPS listener as it
bounds the webhook's. `commands.serve` starts it (`--metrics-port`, `--metrics-secure`).

The metrics name every tenant's namespaces, claims, Pods, devices and GPU UUIDs, so they
are served as Kubernetes components serve theirs (controller-runtime's
`filters.WithAuthenticationAndAuthorization`, kube-rbac-proxy): the bearer token is
checked with a TokenReview, its user with a SubjectAccessReview for `get` on the
non-resource URL `/metrics`; no token or a token the API server does not accept is 401,
a user without that right 403. `serve` needs `create` on `tokenreviews` and
`subjectaccessreviews`; a scraper, a ClusterRole with `nonResourceURLs: [/metrics],
verbs: [get]` (the chart ships one). Decisions are cached by the token's SHA-256 (never the
token): an allowed one 60 s, a refused one 30 s (controller-runtime caches a token 1 min,
an allowed review for 5 min, a denied one for 30 s), at most `MAX_CACHED` tokens, the least
recently used dropped first; failures to ask are never cached. At most `MAX_ASKING`
reviews are in flight at once: a flood of made-up tokens waits here (each wait bounded
by the listener's request timeout) instead of flooding the API server.

`--no-metrics-secure` serves plain HTTP with no authentication, on a loopback address only
(for a sidecar such as kube-rbac-proxy that does the above itself).

Each scrape is rendered through `render` (`serve`: in slices, `kube.rebuilds`: the
first scrape of a large cluster is seconds of work), one at a time: scrapes that
arrive meanwhile wait for it (the usage metrics' caches are built by one at a time).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import ACCESS_REVIEWS, TOKEN_REVIEWS
from runtime.answers import Answers
from webhook.connections import Connections, Limits
from webhook.metrics import Metrics
from webhook.server import quiet_server_header
from webhook.tlssite import HTTP_LOG, TlsSite, track

__all__ = ["MAX_ASKING", "MAX_CACHED", "METRICS_MAX_CONNECTIONS", "Access", "TokenAccess", "is_loopback",
           "metrics_limits", "serve_metrics"]

log = logging.getLogger(__name__)

PATH = "/metrics"
ALLOWED_TTL = 60.0
REFUSED_TTL = 30.0
MAX_CACHED = 1024
MAX_ASKING = 8
# Prometheus keeps one connection per target (two in an HA pair): the metrics listener
# needs far fewer than the webhook's.
METRICS_MAX_CONNECTIONS = 64
_WRITE_CHUNK = 256 * 1024  # bytes of a scrape's body written at a time


@dataclass(frozen=True, slots=True)
class Access:
    """The answer to a scrape's credentials: 200, 401 or 403, and why (what the scraper is told)."""

    status: int
    message: str


class TokenAccess:
    """Who may `GET /metrics`: TokenReview, then SubjectAccessReview, cached (module doc)."""

    def __init__(self, api: KubeApi, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._clock = clock
        self._cache: Answers[bytes, Access] = Answers(MAX_CACHED)
        self._asking = asyncio.Semaphore(MAX_ASKING)

    async def check(self, authorization: str | None) -> Access:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Access(401, "Unauthorized: send a bearer token (Authorization: Bearer <token>)")
        key = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(key, self._clock())
        if cached is not None:
            return cached
        async with self._asking:
            try:
                access = await self._review(token)
            except (ApiError, OSError, TimeoutError, ValueError) as err:
                log.warning("cannot review a /metrics token with the API server: %s", err)
                return Access(503, "the API server could not review the token; retry")
        self._cache.put(key, access, self._clock() + (ALLOWED_TTL if access.status == 200 else REFUSED_TTL))
        return access

    async def _review(self, token: str) -> Access:
        reviewed = await self._api.create(TOKEN_REVIEWS, {"apiVersion": TOKEN_REVIEWS.api_version,
                                                          "kind": "TokenReview", "spec": {"token": token}})
        status = reviewed.get("status") or {}
        if not status.get("authenticated"):
            return Access(401, "Unauthorized")
        user: dict[str, Any] = status.get("user") or {}
        name = str(user.get("username", ""))
        spec = {"user": name, "uid": user.get("uid", ""), "groups": user.get("groups") or [],
                "extra": user.get("extra") or {}, "nonResourceAttributes": {"path": PATH, "verb": "get"}}
        decided = await self._api.create(ACCESS_REVIEWS, {"apiVersion": ACCESS_REVIEWS.api_version,
                                                          "kind": "SubjectAccessReview", "spec": spec})
        if (decided.get("status") or {}).get("allowed"):
            return Access(200, "")
        return Access(403, f"Forbidden: {name} may not get {PATH}")

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


Render = Callable[[Callable[[], list[bytes]]], Awaitable[list[bytes]]]


async def _at_once(exposition: Callable[[], list[bytes]]) -> list[bytes]:
    return exposition()


def _app(metrics: Metrics, access: TokenAccess | None, connections: Connections | None,
         render: Render) -> web.Application:
    one_at_a_time = asyncio.Lock()

    async def scrape(request: web.Request) -> web.StreamResponse:
        if access is not None:
            answer = await access.check(request.headers.get("Authorization"))
            if answer.status != 200:
                headers = {"WWW-Authenticate": 'Bearer realm="dra-quota"'} if answer.status == 401 else {}
                return web.Response(status=answer.status, text=answer.message, headers=headers)
        if connections is not None:
            connections.deciding(request)
        async with one_at_a_time:
            parts = await render(metrics.exposition_parts)
        # Written a piece at a time, never joined whole: 10 MB handed to the socket at
        # once is copied in one go. And the loop given back between two pieces: a write
        # awaits only when the transport is paused, which a quick reader never makes it,
        # so 20 MB went out in one turn of the loop (50 ms, bench/stalls.py).
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
        response.content_length = sum(len(part) for part in parts)
        await response.prepare(request)
        for chunk in _chunks(parts):
            await response.write(chunk)
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application(middlewares=[track(connections)] if connections is not None else [])
    app.router.add_get(PATH, scrape)
    quiet_server_header()
    return app


def _chunks(parts: list[bytes]) -> Iterator[bytes | memoryview]:
    """`parts` as writes of about `_WRITE_CHUNK` bytes: small parts (a claim's lines)
    gathered, a large one cut."""
    pending: list[bytes] = []
    size = 0
    for part in parts:
        if len(part) >= _WRITE_CHUNK:
            if pending:
                yield b"".join(pending)
                pending, size = [], 0
            view = memoryview(part)
            for start in range(0, len(part), _WRITE_CHUNK):
                yield view[start:start + _WRITE_CHUNK]
            continue
        pending.append(part)
        size += len(part)
        if size >= _WRITE_CHUNK:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def metrics_limits(limits: Limits) -> Limits:
    """The metrics listener's bounds: the webhook's, at most `METRICS_MAX_CONNECTIONS`."""
    return replace(limits, max_connections=min(limits.max_connections, METRICS_MAX_CONNECTIONS))


async def serve_metrics(metrics: Metrics, *, host: str, port: int, context: ssl.SSLContext | None,
                        access: TokenAccess | None, connections: Connections | None = None,
                        render: Render = _at_once) -> tuple[web.AppRunner, int]:
    """`GET /metrics` at host:port: over HTTPS with `context`, bounded by `connections`
    (default: `metrics_limits()` of the defaults), checked by `access`; or, without
    `context`, plain HTTP (loopback only: ValueError otherwise); each scrape rendered
    through `render` (module doc). The runner (the caller cleans it up) and the port."""
    if context is None:
        if not is_loopback(host):
            raise ValueError(f"plain-HTTP metrics are served on a loopback address only, not {host}")
        connections = None
    elif connections is None:
        connections = Connections(metrics_limits(Limits()))
    runner = web.AppRunner(_app(metrics, access, connections, render), access_log=None, handle_signals=False, logger=HTTP_LOG)
    await runner.setup()
    try:
        site: web.BaseSite
        if context is not None and connections is not None:
            site = TlsSite(runner, host, port, context=context, connections=connections)
        else:
            site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]
