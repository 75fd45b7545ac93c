"""The local cluster's admin client (e2e tests, `dra-quota demo`): `kube.api.KubeApi`, the product's own.

The tests and the demo reach the API server through the same client layer `dra-quota serve` uses (one
client, not two), with the admin client certificate. `Kube` only adds what tests want on
top: resources addressed as ``(apiVersion, plural)`` strings, a missing object as None,
and waiting for conditions::

    await kube.create("resource.k8s.io/v1", "resourceclaims", body, namespace="ns")
    await kube.get("v1", "nodes", "node-1")
    await kube.patch("v1", "nodes", "node-1", {"status": ...}, subresource="status")

Rejections are `kube.apierror.ApiError` with the exact status code and the whole
decoded ``Status`` body (admission denials, 422 causes, quota 403s).
Every call talks to the loopback apiserver only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from kube.api import KubeApi, PatchType, Resource
from kube.apierror import ApiError
from kube.loaders import Configuration
from quota.values.raw import Obj

__all__ = ["ApiError", "Kube", "MERGE_PATCH", "Obj", "WaitTimeout", "poll", "resource_path"]

MERGE_PATCH = "application/merge-patch+json"


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
    if subresource is not None and name is None:
        raise ValueError("a subresource needs an object name")
    return Resource(api_version, plural).path(namespace, name, subresource)


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
        configuration = Configuration(host=server.rstrip("/"))
        configuration.ssl_ca_cert, configuration.cert_file, configuration.key_file = ca_file, cert_file, key_file
        self.api = KubeApi(configuration, request_timeout=timeout)
        self.server = self.api.server

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.api.close()

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
    ) -> Obj:
        """One HTTP round trip; the decoded JSON object, :class:`ApiError` on non-2xx.

        ``extra_headers`` are pairs so that a header may repeat (``Impersonate-Group``).
        """
        return await self.api.request(method, path, params=params, body=body, content_type=content_type,
                                      headers=extra_headers)

    # -- CRUD ------------------------------------------------------------------------------------

    async def create(
        self, api_version: str, plural: str, body: Obj, *, namespace: str | None = None, dry_run: bool = False
    ) -> Obj:
        return await self.api.create(Resource(api_version, plural), {"apiVersion": api_version, **body},
                                     namespace=namespace, dry_run=dry_run)

    async def create_warned(
        self, api_version: str, plural: str, body: Obj, *, namespace: str | None = None, dry_run: bool = False
    ) -> tuple[Obj, list[str]]:
        """:meth:`create`, and the warnings of the response (what ``kubectl`` prints as "Warning:")."""
        warnings: list[str] = []
        created = await self.api.request("POST", resource_path(api_version, plural, namespace=namespace),
                                         params={"dryRun": "All"} if dry_run else None,
                                         body={"apiVersion": api_version, **body}, warnings=warnings)
        return created, warnings

    async def get(
        self,
        api_version: str,
        plural: str,
        name: str,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        return await self.api.get(Resource(api_version, plural), name, namespace=namespace, subresource=subresource)

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
        listing = await self.api.list(Resource(api_version, plural), namespace=namespace,
                                      label_selector=label_selector, field_selector=field_selector)
        return listing.items

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
        return await self.api.replace(Resource(api_version, plural), body, namespace=namespace, subresource=subresource)

    async def patch(
        self,
        api_version: str,
        plural: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> Obj:
        return await self.api.patch(Resource(api_version, plural), name, patch, patch_type=patch_type,
                                    namespace=namespace, subresource=subresource)

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
        try:
            return await self.api.delete(Resource(api_version, plural), name, namespace=namespace,
                                         grace_period_seconds=grace_period_seconds,
                                         propagation_policy=propagation_policy)
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
        await self.request("DELETE", resource_path(api_version, plural, namespace=namespace), body=options,
                           params=params)

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

