"""A small asyncio Kubernetes client for the end-to-end tests: plain dicts, no models.

Why not kubernetes_asyncio's generated API classes: DESIGN.md keeps objects as plain
JSON dicts (the models are slow and lag behind new DRA fields), and the tests need
arbitrary resources addressed by ``apiVersion`` + plural, exact HTTP status codes and
the raw ``Status`` bodies of rejections (admission denials, 422s, quota 403s). A thin
aiohttp client with the admin client certificate does exactly that and nothing else.

Resources are addressed the way the REST API addresses them::

    await kube.create("resource.k8s.io/v1", "resourceclaims", body, namespace="ns")
    await kube.get("v1", "nodes", "node-1")
    await kube.patch("v1", "nodes", "node-1", {"status": ...}, subresource="status")

Every call talks to the loopback apiserver only.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDict

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """A non-2xx answer from the apiserver, with the decoded ``Status`` body when there is one."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body: Obj = body if isinstance(body, dict) else {"message": str(body)}
        self.reason: str = self.body.get("reason", "")
        self.message: str = self.body.get("message", "")
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {self.message}")


class WaitTimeout(AssertionError):
    """A condition polled by :meth:`Kube.wait_for` did not hold before the deadline."""


def resource_path(
    api_version: str,
    plural: str,
    name: str | None = None,
    namespace: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or object: ``/api/v1/...`` for the core group, else ``/apis/<g>/<v>/...``."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [base]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        if name is None:
            raise ValueError("a subresource needs an object name")
        parts.append(subresource)
    return "/".join(parts)


class Kube:
    """Admin client for one apiserver. Use as ``async with Kube(...) as kube`` or call :meth:`close`."""

    def __init__(
        self,
        server: str,
        *,
        ca_file: str,
        cert_file: str,
        key_file: str,
        timeout: float = 30.0,
    ) -> None:
        if not server.startswith("https://127.0.0.1:") and not server.startswith("https://localhost:"):
            # Tests must never send traffic to a non-loopback address.
            raise ValueError(f"refusing non-loopback apiserver URL {server!r}")
        self.server = server.rstrip("/")
        self._ssl = ssl.create_default_context(cafile=ca_file)
        self._ssl.load_cert_chain(cert_file, key_file)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        # Created lazily so the session binds to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=16),
                timeout=self._timeout,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- raw -----------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int | bool] | None = None,
        content_type: str = "application/json",
        extra_headers: Sequence[tuple[str, str]] = (),
    ) -> Any:
        """One HTTP round trip; returns the decoded JSON (or text) body, raises :class:`ApiError` on non-2xx.

        ``extra_headers`` are pairs so that a header may repeat (``Impersonate-Group``).
        """
        headers = CIMultiDict({"Accept": "application/json"})
        for name, value in extra_headers:
            headers.add(name, value)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        async with self._http().request(
            method, self.server + path, data=data, params=query, headers=headers
        ) as resp:
            text = await resp.text()
            try:
                decoded: Any = json.loads(text) if text else None
            except ValueError:
                decoded = text
            if resp.status >= 300:
                raise ApiError(method, path, resp.status, decoded)
            return decoded

    # -- CRUD ------------------------------------------------------------------------------------

    async def create(
        self, api_version: str, plural: str, body: Obj, *, namespace: str | None = None, dry_run: bool = False
    ) -> Obj:
        body = {"apiVersion": api_version, **body}
        params = {"dryRun": "All"} if dry_run else None
        result: Obj = await self.request(
            "POST", resource_path(api_version, plural, namespace=namespace), body=body, params=params
        )
        return result

    async def get(
        self,
        api_version: str,
        plural: str,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        result: Obj = await self.request("GET", resource_path(api_version, plural, name, namespace, subresource))
        return result

    async def get_or_none(
        self, api_version: str, plural: str, name: str, *, namespace: str | None = None
    ) -> Obj | None:
        try:
            return await self.get(api_version, plural, name, namespace=namespace)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self,
        api_version: str,
        plural: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """All items (follows ``continue`` tokens); ``namespace=None`` lists across namespaces."""
        items: list[Obj] = []
        params: dict[str, str | int | bool] = {"limit": 500}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        while True:
            page: Obj = await self.request("GET", resource_path(api_version, plural, namespace=namespace), params=params)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token

    async def replace(
        self,
        api_version: str,
        plural: str,
        body: Obj,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        """PUT (optimistic concurrency through ``metadata.resourceVersion`` in ``body``)."""
        name = body["metadata"]["name"]
        result: Obj = await self.request(
            "PUT", resource_path(api_version, plural, name, namespace, subresource), body=body
        )
        return result

    async def patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: str = MERGE_PATCH,
    ) -> Obj:
        result: Obj = await self.request(
            "PATCH",
            resource_path(api_version, plural, name, namespace, subresource),
            body=patch,
            content_type=patch_type,
        )
        return result

    async def delete(
        self,
        api_version: str,
        plural: str,
        name: str,
        *,
        namespace: str | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
        missing_ok: bool = True,
    ) -> Obj | None:
        """DELETE; returns the apiserver's answer, or None when the object was already gone and ``missing_ok``."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        try:
            result: Obj = await self.request(
                "DELETE", resource_path(api_version, plural, name, namespace), body=options
            )
            return result
        except ApiError as e:
            if e.status == 404 and missing_ok:
                return None
            raise

    async def delete_collection(
        self,
        api_version: str,
        plural: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> None:
        """DELETE on the collection (``deletecollection`` verb), optionally filtered by labels."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        params = {"labelSelector": label_selector} if label_selector else None
        await self.request(
            "DELETE", resource_path(api_version, plural, namespace=namespace), body=options, params=params
        )

    # -- waiting ---------------------------------------------------------------------------------

    async def wait_for(
        self,
        api_version: str,
        plural: str,
        name: str,
        predicate: Callable[[Obj], bool],
        *,
        namespace: str | None = None,
        timeout: float = 60.0,
        what: str = "condition",
    ) -> Obj:
        """Poll the object until ``predicate(obj)`` holds; return it. A missing object counts as not yet.

        Raises :class:`WaitTimeout` with the last observed object, so a failing test shows what
        the cluster actually did.
        """
        last: Obj | None = None

        async def probe() -> Obj | None:
            nonlocal last
            last = await self.get_or_none(api_version, plural, name, namespace=namespace)
            return last if last is not None and predicate(last) else None

        where = f"{namespace}/{name}" if namespace else name
        try:
            found: Obj = await poll(probe, timeout=timeout, what=f"{plural} {where}: {what}")
            return found
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}; last seen: {json.dumps(last, indent=1)[:4000]}") from None

    async def wait_for_condition(
        self,
        api_version: str,
        plural: str,
        name: str,
        condition_type: str,
        *,
        status: str = "True",
        namespace: str | None = None,
        timeout: float = 60.0,
    ) -> Obj:
        """Wait until ``status.conditions[type == condition_type].status == status``."""

        def holds(obj: Obj) -> bool:
            return any(
                c.get("type") == condition_type and c.get("status") == status
                for c in (obj.get("status") or {}).get("conditions") or []
            )

        return await self.wait_for(
            api_version,
            plural,
            name,
            holds,
            namespace=namespace,
            timeout=timeout,
            what=f"condition {condition_type}={status}",
        )

    async def wait_deleted(
        self, api_version: str, plural: str, name: str, *, namespace: str | None = None, timeout: float = 60.0
    ) -> None:
        async def gone() -> bool:
            return await self.get_or_none(api_version, plural, name, namespace=namespace) is None

        where = f"{namespace}/{name}" if namespace else name
        await poll(gone, timeout=timeout, what=f"{plural} {where} to be deleted")


async def poll(
    probe: Callable[[], Awaitable[Any]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    max_interval: float = 0.5,
) -> Any:
    """Call ``probe`` until it returns something truthy, with capped exponential back-off and a hard deadline.

    This is condition polling, not sleeping-as-synchronisation: every wake-up re-checks the
    real state and the only fixed quantity is the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(min(interval, remaining))
        interval = min(interval * 2, max_interval)


def _param(v: str | int | bool) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
