"""The e2e harness for the tests that run `dra-quota serve`: what they share, in one module.

Every e2e module imports its constants and helpers from here (and never from another test
module); the fixtures built on them (`crd`, `served`, `setup`) are tests/e2e/conftest.py's,
found by name. The process is `devcluster.served.Served` (shared with `dra-quota demo`):
it is ready when its `/readyz` answers 200 (module doc there).

The shipped webhook configurations (deploy/manifests/webhooks.yaml) are applied with what
a shared test cluster needs, as in test_admission_config.py:
- unique object names per test;
- the namespaceSelector also requires a per-test namespace label, so no other e2e
  test's objects are ever sent to this process (the shipped requirements stay);
- clientConfig.service.port -> the process's port (the API server's --loopback-service
  resolver dials 127.0.0.1:<service port> and verifies the certificate for
  dra-quota-webhook.dra-quota-system.svc) and the test CA as caBundle.
The configurations are deleted after each test before the process stops: a
configuration left pointing at a dead server fails every later claim create.
On failure, the process's log is attached to the error.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from devcluster.served import Served as Served  # re-exported: the e2e modules take it from here
from quota.quotas.advice import Case

from ..unit.builders import advised as advised  # re-exported: a denial with its advice
from .cluster import ControlPlane, free_ports
from .driver import RESOURCE_V1, GpuFleet, claim_spec, exact_request
from .kube import ApiError, Kube, Obj, poll
from .webhook_recorder import adapted_webhooks as shipped_for_test

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "deploy/crds/devicequota.yaml").read_text())
# Every CRD `serve` watches: it is ready only once each has listed.
CRDS = [CRD, *(yaml.safe_load((ROOT / "deploy/crds" / name).read_text())
              for name in ("clusterdevicequota.yaml", "appliedclusterdevicequota.yaml"))]
ADMISSION = "admissionregistration.k8s.io/v1"
DQ = "draquota.io/v1alpha1"
RUN_LABEL = "e2e.draquota.io/serve"
QUOTA_HOOK = "quota.resourceclaims.draquota.io"
# Its fail-open copy, which answers for namespaces no DeviceQuota governs.
QUOTA_HOOK_OPEN = "quota-ungoverned.resourceclaims.draquota.io"
# The claim label of the adminAccess policy (deploy/manifests/admin-access-policy.yaml, POLICY_DOCS).
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
POLICY_DOCS = [d for d in yaml.safe_load_all((ROOT / "deploy/manifests/admin-access-policy.yaml").read_text()) if d]
CLIENTS = 4  # admin clients of the `clients` fixture (conftest.py), each its own connection pool
PLURALS = {"ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
           "MutatingWebhookConfiguration": "mutatingwebhookconfigurations"}

MakeNamespace = Callable[..., Awaitable[str]]
MakeFleet = Callable[..., Awaitable[GpuFleet]]


def edit_binding(user: str, name: str = "edit") -> Obj:
    """A RoleBinding of the API server's own `edit` ClusterRole to `user`: a namespace's tenant."""
    return {"kind": "RoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}


def unique(prefix: str) -> str:
    """A DNS-label-safe unique name (tests share one cluster)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- the process (devcluster.served.Served, shared with `dra-quota demo`) ----------------------


async def running(handle: Served) -> AsyncIterator[Served]:
    """Body of a fixture: `handle` started (its log attached to a failure), killed after."""
    try:
        with handle.log_on_failure():
            await handle.start()
        yield handle
    finally:
        await handle.kill()


async def metered(cluster: ControlPlane, tmp_path: Path, *args: str,
                  log_level: str = "debug") -> AsyncIterator[Served]:
    """Body of a fixture: `serve` with the flags `args` and its metrics on a free port, its
    log in `tmp_path`."""
    port, metrics_port = free_ports(2)
    async for handle in running(Served(cluster, port, tmp_path / "serve.log", metrics_port=metrics_port, args=args,
                                       log_level=log_level)):
        yield handle


async def capped(cluster: ControlPlane, tmp_path: Path, cap: int, *,
                 also: tuple[str, ...] = ()) -> AsyncIterator[Served]:
    """`serve` with `--max-connections cap` (and the flags `also`), its log in `tmp_path`
    (the attacked fixtures)."""
    async for handle in metered(cluster, tmp_path, "--max-connections", str(cap), *also, log_level="info"):
        yield handle


def served_context(served: Served) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(served.cluster.ca_file))
    context.check_hostname = False  # the certificate names the Service; we dial 127.0.0.1
    return context


async def review(served: Served, request: Obj, path: str = "/validate") -> bool:
    """Whether serve allows the AdmissionReview `request`, posted to `path` as the API server
    posts it, over a new connection (with --reuse-port the kernel picks a replica for each)."""
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    async with aiohttp.ClientSession() as http, http.post(f"https://127.0.0.1:{served.port}{path}", json=body,
                                                          ssl=served_context(served)) as resp:
        assert resp.status == 200, await resp.text()
        allowed: bool = (await resp.json())["response"]["allowed"]
        return allowed


def rss(served: Served) -> int:
    assert served.process is not None
    for line in Path(f"/proc/{served.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def top(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`dra-quota top ARGS` as a process: its exit code, stdout and stderr."""
    return await dra_quota("top", *args, env=env)


async def dra_quota(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`dra-quota ARGS` as a process: its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "commands.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# -- the webhook configurations -----------------------------------------------------------------


@dataclass
class Setup:
    run: str
    namespace: str
    fleet: GpuFleet
    served: Served
    configs: list[tuple[str, str]]


def adapted_webhooks(run: str, port: int, cluster: ControlPlane) -> list[Obj]:
    return shipped_for_test(run, port, cluster, label=RUN_LABEL, name_suffix="serve", selector="namespaceSelector")


@contextlib.asynccontextmanager
async def installed(kube: Kube, configs: list[Obj]) -> AsyncIterator[list[tuple[str, str]]]:
    """The webhook configurations created; deleted again (newest first) on the way out,
    before whatever they point at stops, so no later request is refused by a dead server.
    Yields the (plural, name) of each one created."""
    created: list[tuple[str, str]] = []
    try:
        for config in configs:
            plural = PLURALS[config["kind"]]
            await kube.create(ADMISSION, plural, config)
            created.append((plural, config["metadata"]["name"]))
        yield created
    finally:
        for plural, name in reversed(created):
            await kube.delete(ADMISSION, plural, name)


@contextlib.asynccontextmanager
async def refusing_deletes(cluster: ControlPlane, kube: Kube, run: str,
                           labels: dict[str, str] | None = None) -> AsyncIterator[list[str]]:
    """A second validating webhook (a policy protecting claims) that refuses every claim
    DELETE in the namespaces with `labels` (default: this test's); yields the uids of the
    DELETEs it refused."""
    refused: list[str] = []

    async def handle(req: Obj) -> Obj:
        refused.append((req.get("oldObject") or {}).get("metadata", {}).get("uid", ""))
        return {"allowed": False, "status": {"code": 403, "message": "claims are protected here"}}

    async with claim_webhook(cluster, kube, f"protect-claims-{run}", "DELETE", handle,
                             labels or {RUN_LABEL: run}):
        yield refused


@contextlib.asynccontextmanager
async def claim_webhook(cluster: ControlPlane, kube: Kube, name: str, operation: str,
                        answer: Callable[[Obj], Awaitable[Obj]], labels: dict[str, str]) -> AsyncIterator[None]:
    """A validating webhook of the test's own (another policy on claims) for `operation`
    on claims in the namespaces with `labels`: `answer` gets each review's request and
    returns its response but the uid."""

    async def handle(request: web.Request) -> web.Response:
        req = (await request.json())["request"]
        response = {**await answer(req), "uid": req["uid"]}
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": response})

    app = web.Application()
    app.router.add_post("/review", handle)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*map(str, cluster.webhook_cert))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    config = {"apiVersion": ADMISSION, "kind": "ValidatingWebhookConfiguration", "metadata": {"name": name},
              "webhooks": [{"name": f"{operation.lower()}.claims.e2e.draquota.io", "admissionReviewVersions": ["v1"],
                            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
                            "clientConfig": {"service": {"namespace": "minik8s-system", "name": "test-webhook",
                                                         "port": port, "path": "/review"},
                                             "caBundle": base64.b64encode(cluster.ca_file.read_bytes()).decode()},
                            "namespaceSelector": {"matchLabels": labels},
                            "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                                       "operations": [operation], "resources": ["resourceclaims"]}]}]}
    try:
        async with installed(kube, [config]):
            yield
    finally:
        await runner.cleanup()


# -- quotas and claims ---------------------------------------------------------------------------


async def governed(kube: Kube, namespace: str, *, timeout: float = 30) -> None:
    """Wait until the leader labelled `namespace` draquota.io/governed=true: from then on
    its claims go to the fail-closed copies of the webhooks (QUOTA_HOOK by name)."""

    async def labelled() -> bool:
        ns = await kube.get("v1", "namespaces", namespace)
        return bool((ns["metadata"].get("labels") or {}).get("draquota.io/governed") == "true")

    await poll(labelled, timeout=timeout, what=f"namespace {namespace} to be labelled draquota.io/governed=true")


async def annotated(kube: Kube, namespace: str, name: str, *, timeout: float = 30) -> dict[str, str]:
    """The claim's annotations once they hold our charge: written in the create itself by
    the mutating webhook (one write), or by the leader on a claim that arrived without one."""

    async def written() -> dict[str, str] | None:
        claim = await kube.get(RESOURCE_V1, "resourceclaims", name, namespace=namespace)
        annotations: dict[str, str] = claim["metadata"].get("annotations") or {}
        return annotations if "draquota.io/charge" in annotations else None

    annotations: dict[str, str] = await poll(written, timeout=timeout, what=f"our charge on {namespace}/{name}")
    return annotations


async def make_quota(kube: Kube, setup: Setup, name: str, memory: str) -> None:
    """A DeviceQuota, then wait until the process enforces it (a dry-run probe it must deny)
    and the leader labelled the namespace governed."""
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": name},
                                           "spec": {"hard": {"memory": memory}}}, namespace=setup.namespace)
    await governed(kube, setup.namespace)

    async def enforced() -> bool:
        # Four GPUs never fit: denied with the quota's message once the webhooks are
        # called and the process has the quota and the fleet's devices in its caches.
        message = await denial(create(kube, setup, "probe", count=4, dry_run=True))
        return f'exceeded DeviceQuota "{name}"' in message

    await poll(enforced, timeout=30, what="the webhook to enforce the DeviceQuota")


def claim_body(setup: Setup, name: str, count: int = 1) -> Obj:
    return {"kind": "ResourceClaim", "metadata": {"name": name},
            "spec": claim_spec(exact_request("gpu", setup.fleet.device_class, count=count))}


async def create(kube: Kube, setup: Setup, name: str, *, count: int = 1, dry_run: bool = False) -> Obj:
    return await kube.create(RESOURCE_V1, "resourceclaims", claim_body(setup, name, count),
                             namespace=setup.namespace, dry_run=dry_run)


async def create_until_decided(client: Kube, namespace: str, body: Obj, errors: dict[str, int], *,
                               patience: float = 90.0) -> str:
    """Create claim `body` until the webhooks decide, as a controller would: "" once it is
    admitted (a 409 "already exists" too: an earlier attempt was persisted after all), else
    the quota's denial (a DeviceQuota's or a ClusterDeviceQuota's). Any other failure (a
    webhook call cut by a SIGKILL, contention, a quota full only by the lease of a replica
    that died) is counted in `errors` and tried again, for up to `patience` seconds: a
    count of attempts ran out before a dead replica's lease expired (period + TTL) once
    such denials took 2 ms."""
    name = body["metadata"]["name"]
    deadline = time.monotonic() + patience
    attempts = 0
    while True:
        attempts += 1
        try:
            await client.create(RESOURCE_V1, "resourceclaims", body, namespace=namespace)
            return ""
        except ApiError as err:
            if "exceeded DeviceQuota" in err.message or "exceeded ClusterDeviceQuota" in err.message:
                return err.message
            if err.status == 409 and "already exists" in err.message:
                return ""
            key = f"{err.status} {err.message[:90]}"
            errors[key] = errors.get(key, 0) + 1
        if time.monotonic() >= deadline:
            raise AssertionError(f"create {namespace}/{name} undecided after {attempts} attempts in {patience:.0f} s: "
                                 f"{errors}")
        await asyncio.sleep(0.05)  # retry pacing, not synchronisation


async def denial(call: Awaitable[Any]) -> str:
    """The API server's message for a denied write ("" when it was allowed)."""
    try:
        await call
    except ApiError as err:
        if err.status in (403, 422):
            return err.message
        raise
    return ""


def exceeded(quota: str, *, used: str, reserved: str, limited: str, requested: str = "80Gi", namespace: str,
             case: Case) -> str:
    """The API server's message for a claim in `namespace` that DeviceQuota `quota` denied."""
    return advised(f'admission webhook "{QUOTA_HOOK}" denied the request: exceeded DeviceQuota "{quota}": '
                   f"requested memory={requested}, used memory={used}, reserved memory={reserved}, "
                   f"limited memory={limited}", case, namespace=namespace)


# -- the DeviceQuota status the leader writes ---------------------------------------------------


async def quota_status(kube: Kube, namespace: str, name: str = "gpus") -> Obj:
    obj = await kube.get(DQ, "devicequotas", name, namespace=namespace)
    status: Obj = obj.get("status") or {}
    return status


async def wait_status(kube: Kube, namespace: str, holds: Callable[[Obj], bool], what: str,
                      timeout: float = 30) -> Obj:
    async def probe() -> Obj | None:
        status = await quota_status(kube, namespace)
        return status if holds(status) else None

    result: Obj = await poll(probe, timeout=timeout, what=what, interval=0.02, max_interval=0.1)
    return result


def amounts(memory_gib: int, devices: int) -> dict[str, object]:
    """As the controller writes them: memory a quantity, devices a count."""
    return {"memory": f"{memory_gib}Gi" if memory_gib else "0", "devices": devices}


def review_latencies(log: str) -> list[float]:
    return [float(m) for m in re.findall(r" uid=\S+ in ([0-9.]+)ms", log)]
