"""A loopback admission webhook that records which requests the API server sends it.

Used by test_admission_config.py to prove what the shipped webhook configuration
(deploy/manifests/webhooks.yaml) selects on the real API server. It allows everything
and mutates nothing.
The test rewrites each webhook's ``clientConfig.service.path`` to
``<shipped path>/<webhook name>`` so every recorded review says which webhook it came from.

Also :func:`adapted_webhooks` (devcluster.webhooks, shared with `dra-quota demo`): the shipped
configurations adapted to the shared test cluster (used by every test that registers them),
and :func:`impersonated`: one API request as another user through the admin client.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from devcluster.webhooks import adapted_webhooks
from quota.manifests import webhook_configurations

# What the tests compare with: the shipped configurations (quota/manifests/webhooks.yaml).
WEBHOOKS = webhook_configurations()

__all__ = ["WEBHOOKS", "Recorder", "Seen", "adapted_webhooks", "impersonated", "serve_recorder"]

from .kube import MERGE_PATCH, Kube, Obj

@dataclass(frozen=True)
class Seen:
    """One review as received: which path/webhook, and the request's main fields."""

    path: str
    webhook: str
    operation: str
    namespace: str
    name: str
    sub_resource: str
    dry_run: bool
    username: str
    request: dict[str, Any] = field(compare=False, repr=False)

    @property
    def object(self) -> dict[str, Any]:
        return self.request.get("object") or {}

    @property
    def old_object(self) -> dict[str, Any]:
        return self.request.get("oldObject") or {}


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Seen] = []

    def clear(self) -> None:
        self.seen.clear()

    def reviews(self, *, webhook: str | None = None, name: str | None = None) -> list[Seen]:
        return [s for s in self.seen if (webhook is None or s.webhook == webhook) and (name is None or s.name == name)]

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        req = review["request"]
        base, _, hook = request.path.lstrip("/").partition("/")
        seen = Seen(
            path="/" + base,
            webhook=hook,
            operation=req.get("operation", ""),
            namespace=req.get("namespace", ""),
            name=req.get("name", ""),
            sub_resource=req.get("subResource", ""),
            dry_run=bool(req.get("dryRun")),
            username=(req.get("userInfo") or {}).get("username", ""),
            request=req,
        )
        self.seen.append(seen)
        response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


@asynccontextmanager
async def serve_recorder(cert_file: str, key_file: str, port: int) -> AsyncIterator[Recorder]:
    """HTTPS on 127.0.0.1:<port> with the test webhook certificate; any path under /validate
    or /admit (the claim CREATE's mutating webhook: allowed untouched here)."""
    recorder = Recorder()
    app = web.Application()
    app.router.add_post("/validate/{hook}", recorder.handle)
    app.router.add_post("/admit/{hook}", recorder.handle)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx)
    await site.start()
    try:
        yield recorder
    finally:
        await runner.cleanup()


async def impersonated(
    kube: Kube,
    method: str,
    path: str,
    *,
    user: str,
    groups: Sequence[str] = (),
    body: Any = None,
    params: Mapping[str, str] | None = None,
    content_type: str = MERGE_PATCH,
) -> Any:
    """``Kube.request`` as ``user`` (and ``groups``), via the admin's impersonate right."""
    headers = [("Impersonate-User", user), *(("Impersonate-Group", g) for g in groups)]
    return await kube.request(method, path, body=body, params=params, content_type=content_type,
                              extra_headers=headers)
