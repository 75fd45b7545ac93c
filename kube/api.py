"""The Kubernetes API as plain dicts: the one client the webhook and the controller share.

Neighbours: `kube.watching` builds reflectors (list + watch) on `KubeApi.list` and
`KubeApi.watch`; the pure stores (`quota.devices.inventory`, `quota.accounting.ledger`) never see this module.

Configuration comes from kubernetes_asyncio (`load_kube_config` for a kubeconfig file and
context, `load_incluster_config` for the service account; through `kube.loaders`,
which loads them without the library's generated API), so the TLS material, the
`tls-server-name`, `proxy-url` and the bearer token are read exactly as that library reads
them. Requests go through our own aiohttp session rather than the generated
`ApiClient.call_api(..., _preload_content=False)`, because that path
(kubernetes_asyncio client/api_client.py, client/rest.py) keeps every response in
`last_response` (a watch stream would stay referenced), deep-copies every body through
`sanitize_for_serialization`, honours `*_PROXY` from the environment (trust_env) and
gives no handle on the connector or read buffer. The token is still fetched per request
through `Configuration.auth_settings()`, which runs the `refresh_api_key_hook` that
`load_incluster_config` installs: the projected service-account token is re-read as
kubernetes_asyncio does it (incluster_config.py, every TOKEN_REFRESH_PERIOD).

Objects are never turned into generated models: DRA fields newer than the models would be
lost, and model construction costs more than the JSON decoding itself. Every HTTP failure
is one `kube.apierror.ApiError` carrying the status code, the `Status` reason and message;
transport failures stay `aiohttp.ClientError` / `TimeoutError`. Tokens and headers are
never logged. Beside it: `kube.writegate` (a leader's writes refused once it stops
leading), `kube.watchlines` (a watch stream's lines and events).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDict

from kube.apierror import ApiError
from kube.credentials import Credentials, CredentialsError, resolve
from kube.loaders import (
    SERVICE_CERT_FILENAME,
    SERVICE_TOKEN_FILENAME,
    ConfigException,
    Configuration,
    load_incluster_config,
    load_kube_config,
)
from kube.watchlines import LineBuffer, decode_event
from kube.writegate import WRITE_GATE, Gated, GatedBody, NotLeading, gate_at_send, refused_as_not_leading
from quota.values.raw import Obj

__all__ = [
    "KubeApi",
    "Listing",
    "METADATA_LIST",
    "PatchType",
    "Resource",
    "warning_text",
]

logger = logging.getLogger(__name__)

PatchType = Literal["merge", "json", "strategic", "apply"]
_PATCH_CONTENT_TYPES: dict[PatchType, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",  # JSON is YAML: the API server accepts it
}
# A list of metadata only (PartialObjectMetadataList): what a list costs to decode then
# grows with the number of objects, not with what their specs hold.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
# A list restarted this many times because its continue token expired gives up: each
# restart is a full list, and a cluster compacting faster than we can page is broken.
_MAX_LIST_RESTARTS = 3


# A 429 (the API server's priority and fairness queue is full) is tried again this many
# times, each after its Retry-After, at most MAX_RETRY_AFTER seconds (`KubeApi._round_trip`).
TOO_MANY_REQUESTS_RETRIES = 5
MAX_RETRY_AFTER = 1.0


def _retry_after(header: str | None) -> float:
    """Seconds a Retry-After header asks for (delta-seconds); 1 when absent or unreadable."""
    try:
        return max(float(header or "1"), 0.0)
    except ValueError:
        return 1.0


@dataclass(frozen=True, slots=True)
class Resource:
    """A REST collection: `Resource("resource.k8s.io/v1", "resourceclaims")`."""

    api_version: str
    plural: str

    @property
    def group(self) -> str:
        """The API group ("" for the core group), as RBAC rules and admission reviews name it."""
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base]
        if namespace is not None:
            parts += ["namespaces", quote(namespace, safe="")]
        parts.append(self.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


@dataclass(frozen=True, slots=True)
class Listing:
    """A complete list: its items and the resourceVersion to watch from."""

    items: list[Obj]
    resource_version: str


def _query(params: Mapping[str, str | int | bool | None]) -> dict[str, str]:
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in params.items() if v is not None}


class KubeApi:
    """Async REST client for one API server. Build it with `connect` (the commands' way to
    find credentials), or `from_kubeconfig` / `in_cluster` for one source.

    Every call but `watch` is bounded by `request_timeout` (seconds, whole round trip);
    connecting is bounded by `connect_timeout`; a watch is bounded by its `silence`
    (the longest wait for one read) instead.
    """

    def __init__(self, configuration: Configuration, *, request_timeout: float = 30.0, connect_timeout: float = 10.0) -> None:
        self._config = configuration
        self.server = str(configuration.host).rstrip("/")
        self._ssl = _ssl_context(configuration)
        self._server_hostname: str | None = configuration.tls_server_name or None
        self._proxy: str | None = configuration.proxy or None
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=connect_timeout)
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self.credentials: Credentials | None = None  # set by `connect`

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, *, context: str | None = None,
                      request_timeout: float = 30.0, connect_timeout: float = 10.0) -> KubeApi:
        """A client with the credentials every command uses (`kube.credentials.resolve`:
        --kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config); `credentials` says which.
        Raises ConfigException when none apply or they cannot be loaded."""
        try:
            found = resolve(kubeconfig, context=context)
        except CredentialsError as err:
            raise ConfigException(str(err)) from None
        if found.kind == "in-cluster":
            api = cls.in_cluster(request_timeout=request_timeout, connect_timeout=connect_timeout)
        else:
            api = await cls.from_kubeconfig(os.pathsep.join(found.files), context=found.context,
                                            request_timeout=request_timeout, connect_timeout=connect_timeout)
        api.credentials = found
        return api

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, *, context: str | None = None, **kwargs: float) -> KubeApi:
        """A client from kubeconfig files (`path`: one, or several joined by os.pathsep and
        merged; default: $KUBECONFIG or ~/.kube/config) and a context."""
        # kubernetes_asyncio reports a missing file as "Expected key current-context".
        candidates = (path or os.environ.get("KUBECONFIG", "~/.kube/config")).split(os.pathsep)
        if not any(c and os.path.isfile(os.path.expanduser(c)) for c in candidates):
            raise ConfigException(f"kubeconfig {os.pathsep.join(candidates)}: no such file")
        configuration = Configuration()
        await load_kube_config(config_file=path, context=context, client_configuration=configuration, persist_config=False)
        return cls(configuration, **kwargs)

    @classmethod
    def in_cluster(cls, *, token_file: str = SERVICE_TOKEN_FILENAME, ca_file: str = SERVICE_CERT_FILENAME,
                   **kwargs: float) -> KubeApi:
        """A client from the Pod's service account (KUBERNETES_SERVICE_HOST/PORT), its token re-read as it rotates.

        The files are those of the projected service-account volume unless a Pod mounts its
        token elsewhere.
        """
        configuration = Configuration()
        load_incluster_config(  # type: ignore[no-untyped-call]  # untyped upstream
            client_configuration=configuration, token_filename=token_file, cert_filename=ca_file
        )
        return cls(configuration, **kwargs)

    def detached(self) -> KubeApi:
        """A client of the same server, with the same credentials and timeouts, on a connection
        pool of its own: a probe that must not queue behind this client's writes (`kube.contact`)."""
        twin = KubeApi(self._config, request_timeout=self._timeout.total or 30.0, connect_timeout=self._connect_timeout)
        twin.credentials = self.credentials
        return twin

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        # Created lazily so that the session binds to the running event loop.
        if self._session is None or self._session.closed:
            gating = aiohttp.TraceConfig()
            gating.on_connection_reuseconn.append(gate_at_send)
            gating.on_connection_create_start.append(gate_at_send)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=64),
                trace_configs=[gating],
                timeout=self._timeout,
                trust_env=False,  # only the kubeconfig's proxy-url, never *_PROXY
            )
        return self._session

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        # auth_settings() runs refresh_api_key_hook: the in-cluster token is re-read here.
        auth = (await self._config.auth_settings()).get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = str(auth["value"])
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool | None] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        warnings: list[str] | None = None,
    ) -> Obj:
        """One round trip to `path`; the decoded JSON object, or `ApiError`.

        `headers` are extra (name, value) pairs, repeatable (`Impersonate-Group`); an
        `Accept` among them replaces the default `application/json`.
        `warnings`, when given, receives the text of each `Warning` response header
        (admission webhooks' warnings, deprecations: what kubectl prints as "Warning:").
        """
        raw = await self._round_trip(method, path, params=params, body=body, content_type=content_type,
                                     headers=headers, warnings=warnings)
        decoded = json.loads(raw) if raw else {}
        if not isinstance(decoded, dict):
            raise ApiError(200, "BadResponse", f"expected a JSON object, got {raw[:200]!r}", where=f"{method} {path}")
        return decoded

    async def text(self, path: str) -> str:
        """GET an endpoint that answers text, not JSON (the API server's `/metrics`), or `ApiError`."""
        return (await self._round_trip("GET", path, accept="text/plain")).decode("utf-8", "replace")

    async def _round_trip(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool | None] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
        warnings: list[str] | None = None,
        accept: str = "application/json",
    ) -> bytes:
        started = time.monotonic()
        data = None if body is None else json.dumps(body)
        sent = CIMultiDict(await self._headers(content_type if data is not None else None))
        sent["Accept"] = accept
        for name, value in headers:
            if name.lower() == "accept":
                sent[name] = value  # replaces the default (a Table, `as=Table;g=meta.k8s.io;v=v1`)
            else:
                sent.add(name, value)
        gate = WRITE_GATE.get() if method != "GET" else None
        gated = None if gate is None else Gated(gate, f"{method} {path}")
        payload: str | GatedBody | None = data
        if gated is not None and data is not None:
            payload = GatedBody(data.encode(), gated)
        for attempt in range(TOO_MANY_REQUESTS_RETRIES + 1):
            if gated is not None and not gated.gate():
                raise NotLeading(gated.where)
            async with refused_as_not_leading(), self._http().request(
                method,
                self.server + path,
                params=_query(params or {}),
                data=payload,
                headers=sent,
                proxy=self._proxy,
                server_hostname=self._server_hostname,
                trace_request_ctx=gated,
            ) as resp:
                raw = await resp.read()
                if warnings is not None:
                    warnings.extend(warning_text(h) for h in resp.headers.getall("Warning", ()))
            logger.debug("%s %s -> %d in %.3fs", method, path, resp.status, time.monotonic() - started)
            if resp.status != 429 or attempt == TOO_MANY_REQUESTS_RETRIES:
                break
            # The API server's priority and fairness refused the request before doing
            # anything (a full queue): any verb may go again after its Retry-After, as
            # client-go's rest.Request does (checkWait, up to 10 times). Capped and spread,
            # so a burst of our own writes does not come back all at once; the callers'
            # deadlines (an admission's answer, a write's retries) still bound the whole.
            await asyncio.sleep(min(_retry_after(resp.headers.get("Retry-After")), MAX_RETRY_AFTER)
                                * random.uniform(0.5, 1.0))
        if resp.status >= 300:
            raise ApiError.from_body(resp.status, raw, where=f"{method} {path}")
        return raw

    # -- reads -----------------------------------------------------------------------------------

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None, subresource: str | None = None) -> Obj:
        return await self.request("GET", resource.path(namespace, name, subresource))

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        transform: Callable[[Obj], Obj] | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Listing:
        """All items, `limit` per page, each passed through `transform` as its page arrives.

        `headers` as `request`'s: `(("Accept", METADATA_LIST),)` lists metadata only.

        `transform` runs page by page so a caller that trims objects never holds the full
        list of untrimmed ones. Items get the `apiVersion` and `kind` the API server leaves
        out of list items, so they read like watched objects. When a continue token has
        expired (410, etcd compacted past it) the list starts over, as client-go's pager
        falls back to a full list (k8s.io/client-go tools/pager/pager.go).
        """
        path = resource.path(namespace)
        for _ in range(_MAX_LIST_RESTARTS + 1):
            items: list[Obj] = []
            params: dict[str, str | int | bool | None] = {
                "limit": limit, "labelSelector": label_selector, "fieldSelector": field_selector,
            }
            try:
                while True:
                    page = await self.request("GET", path, params=params, headers=headers)
                    api_version = page.get("apiVersion", resource.api_version)
                    kind = str(page.get("kind", "")).removesuffix("List")
                    for item in page.get("items") or []:
                        item.setdefault("apiVersion", api_version)
                        item.setdefault("kind", kind)
                        items.append(transform(item) if transform else item)
                    meta = page.get("metadata") or {}
                    if not meta.get("continue"):
                        return Listing(items, str(meta.get("resourceVersion", "")))
                    params["continue"] = meta["continue"]
            except ApiError as e:
                if e.status != 410 or "continue" not in params:
                    raise
                logger.info("list %s in %s: continue token expired after %d items, listing again",
                            resource.plural, namespace or "all namespaces", len(items))
        raise ApiError(410, "Expired", f"list {path}: continue token expired {_MAX_LIST_RESTARTS + 1} times in a row")

    async def watch(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int = 300,
        silence: float = 90.0,
        label_selector: str | None = None,
        field_selector: str | None = None,
        send_initial_events: bool = False,
        opened: Callable[[], None] = lambda: None,
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """Stream (type, object) events until the server ends the watch after `timeout_seconds`.

        Bookmarks are always requested: BOOKMARK events carry only a resourceVersion, so a
        quiet collection's watch still advances and a reconnect does not fall behind the
        watch cache (KEP-956). A read waiting longer than `silence` raises a timeout (an
        `aiohttp.ServerTimeoutError`): a dead peer behind a half-open TCP connection would
        otherwise keep us waiting forever. `send_initial_events` asks for the existing
        objects as ADDED events first, closed by a BOOKMARK annotated
        `k8s.io/initial-events-end` (KEP-3157 streaming lists). `opened` is told once
        the server accepted the watch, before its first event (a quiet kind may send none
        for a minute).
        """
        params: dict[str, str | int | bool | None] = {
            "watch": True,
            "allowWatchBookmarks": True,
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        if send_initial_events:
            params.update(sendInitialEvents=True, resourceVersionMatch="NotOlderThan")
        path = resource.path(namespace)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout, sock_read=silence)
        async with self._http().get(
            self.server + path,
            params=_query(params),
            headers=await self._headers(None),
            timeout=timeout,
            proxy=self._proxy,
            server_hostname=self._server_hostname,
        ) as resp:
            if resp.status >= 300:
                raise ApiError.from_body(resp.status, await resp.read(), where=f"WATCH {path}")
            opened()
            lines = LineBuffer()
            async for chunk in resp.content.iter_any():
                for line in lines.feed(chunk):
                    yield decode_event(line)
            if rest := lines.rest():
                yield decode_event(rest)

    # -- writes ----------------------------------------------------------------------------------

    async def create(
        self, resource: Resource, body: Obj, *, namespace: str | None = None,
        field_manager: str | None = None, dry_run: bool = False,
    ) -> Obj:
        params = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
        return await self.request("POST", resource.path(namespace), params=params, body=body)

    async def replace(
        self, resource: Resource, body: Obj, *, namespace: str | None = None,
        subresource: str | None = None, field_manager: str | None = None,
    ) -> Obj:
        """PUT: optimistic concurrency through `metadata.resourceVersion` in `body` (409 on conflict)."""
        path = resource.path(namespace, body["metadata"]["name"], subresource)
        return await self.request("PUT", path, params={"fieldManager": field_manager}, body=body)

    async def update_status(self, resource: Resource, body: Obj, *, namespace: str | None = None,
                            field_manager: str | None = None) -> Obj:
        return await self.replace(resource, body, namespace=namespace, subresource="status", field_manager=field_manager)

    async def patch(
        self, resource: Resource, name: str, patch: Any, *, patch_type: PatchType = "merge",
        namespace: str | None = None, subresource: str | None = None,
        field_manager: str | None = None, force: bool = False,
    ) -> Obj:
        """PATCH; `apply` is server-side apply, which needs a `field_manager` (`force` takes fields over)."""
        if patch_type == "apply" and not field_manager:
            raise ValueError("server-side apply needs a field_manager")
        params = {"fieldManager": field_manager, "force": True if force else None}
        return await self.request("PATCH", resource.path(namespace, name, subresource), params=params,
                                   body=patch, content_type=_PATCH_CONTENT_TYPES[patch_type])

    async def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None,
        grace_period_seconds: int | None = None, propagation_policy: str | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> Obj:
        """DELETE; returns the deleted object (or a Status). `preconditions` fence on uid/resourceVersion."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if preconditions:
            options["preconditions"] = dict(preconditions)
        return await self.request("DELETE", resource.path(namespace, name), body=options)


# RFC 7234 warning-value as the API server writes it: `299 - "<text>"`, with `"` and
# `\\` escaped in the text (k8s.io/apiserver pkg/endpoints/handlers/responsewriters).
_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def warning_text(header: str) -> str:
    """The text of one `Warning` header value (the value itself when it is not RFC 7234)."""
    match = _WARNING.match(header)
    return re.sub(r"\\(.)", r"\1", match.group(1)) if match else header


def _ssl_context(configuration: Configuration) -> ssl.SSLContext:
    """The TLS context kubernetes_asyncio's own RESTClientObject would build (client/rest.py)."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
