"""Admission benchmark: the webhook on the path a user's claim takes.

Prints, and writes to bench/results/admission.json:
(a) reviews per CPU-second in-process on the generated inventory (5,000 nodes: 40,000
    GPUs published as 58,000 devices), claim CREATE reviews of the generated claim mix
    (seen selectors: a first pass warms the pricing caches) as JSON bodies through the
    aiohttp app's own route handler (`webhook.server.build_app` over
    `webhook.endpoints`: decoding, parsing, pricing, the quota check, the answer's
    encoding) with each admission persisted as `serve` persists it: the real
    `kube.quotawriter` (`kube.statuswriter`: batch, watermark, conditional status write) against a
    `StatusWriter` that stands in for the API server in this process, whose events
    (the status write, the claim created, the leader's charge on it) reach `serve`'s own
    stores; one at a time, then 16 at a time; the caches frozen (`gc.freeze()`) as
    `serve` freezes them once synced; the Admitter alone (its pricing and charges) beside it;
(b) HTTPS p50/p99 of reviews that write nothing (a claim in a namespace without a
    DeviceQuota, a claim a DeviceQuota denies, a template, the scheduler's allocation of
    a claim) posted to a running `dra-quota serve` at 1,000/s offered, then at rising
    rates up to the highest that keeps p99 <= 5 ms; and the latency of claim CREATE
    reviews that persist a reservation on a DeviceQuota's status in the real API server
    (one at a time, then open-loop at a few rates, a fresh quota each; the API server's
    own count and latency of the status writes beside them);
(c) claim creates per second through the real API server into a namespace our webhooks
    serve with a DeviceQuota, against a namespace of the same shape with only an
    in-tree ResourceQuota on `<class>.deviceclass.resource.k8s.io/devices` whose claims
    dra-quota writes nothing to (alternating phases, one run; a third namespace has our
    webhooks and no DeviceQuota: the call without the status writes), 16 in flight, with
    where the time goes: CPU milliseconds per create of each process (the shipped
    configuration writes the charge in the create itself: one write, no leader patch;
    bench/floor.py measures the validating design beside it), the API server's
    own measure of its creates, our webhook calls, the ResourceQuota plugin, the
    DeviceQuota status writes and the leader's patches, and the DeviceQuota's largest
    size, sampled; ratios of rate and of API-server CPU against ResourceQuota's;
(d) p99 of other namespaces' reviews (the mix of (b) at 200/s) with and without a noisy
    namespace posting claims whose selectors read attribute names no selector read
    before, at 10/s;
(e) RSS of `serve` with the inventory and N ResourceClaims created in the real API
    server (150,000 by default): how long the creates took, RSS sampled as they land,
    then a fresh `serve` process's time to ready and RSS;
(f) sustained: 200 creates/s offered for 5 minutes into one DeviceQuota with room
    (at most 64 in flight, as a controller's workers), then the same into a namespace
    with only a ResourceQuota: failed creates, p50/p99 from each create's due time, and
    the DeviceQuota object's largest size, sampled every 0.5 s.

`serve` runs as the chart's Deployment runs it: its ServiceAccount with the chart's RBAC
(so the leader's own writes of our annotations skip our annotation webhook, as the
shipped configuration says) and the Deployment's flags, but for where it listens and
where its certificate comes from.

Latency in (b) and (d) is measured by an open-loop generator: request i is due at
start + i/rate and sent then however many are still in flight; its latency runs from
that due time, so queueing (in the server or in the generator) is never hidden
(coordinated omission). The generator runs in this process, `serve` in its own; the
API server, etcd and the rest of the control plane are tests/e2e/cluster.py's, started
here on loopback. Not a timed test: run `python bench/admission.py [--quick]`; the
sections can be picked (`--only a,b`) and sized (`--nodes`, `--claims`, `--seconds`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import gc
import json
import os
import re
import ssl
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from check_data import novel_selector  # noqa: E402
from inventory import generate_claims, generate_device_classes, generate_namespaces, generate_slices  # noqa: E402
from pricing import rss_mib, summary  # noqa: E402

from kube.watching import Progress  # noqa: E402
from quota.accounting.ledger import Ledger  # noqa: E402
from quota.accounting.ledgerentry import Entry  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.admission.policy import parse_policy  # noqa: E402
from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import parse_claim, parse_device_class  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.values.model import DeviceClassName  # noqa: E402
from devcluster.webhooks import adapted_webhooks as shipped_for_test, json_patched  # noqa: E402
from tests.e2e.cluster import ControlPlane, build, free_ports  # noqa: E402
from tests.e2e.harness import ADMISSION, CRDS, DQ, PLURALS, RUN_LABEL, Served  # noqa: E402
from tests.e2e.kube import ApiError, Kube, poll  # noqa: E402
from tests.e2e.shipped import DEPLOYMENT, chart_kubeconfig  # noqa: E402
from kube.caches import QuotaStore  # noqa: E402
from kube.claimstore import ClaimStore  # noqa: E402
from commands.options import ServeOptions  # noqa: E402
from kube.leasebook import LeaseBook  # noqa: E402
from kube.quotawriter import Reservations  # noqa: E402
from quota.accounting.headroom import Sizing  # noqa: E402
from webhook.claimreview import ClaimContext  # noqa: E402
from webhook.endpoints import endpoints  # noqa: E402
from webhook.server import build_app  # noqa: E402

JSON = dict[str, Any]
RESOURCE_V1 = "resource.k8s.io/v1"
CLAIMS_GVR = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}
TEMPLATES_GVR = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaimtemplates"}
USER = {"username": "alice", "uid": "u-1", "groups": ["team", "system:authenticated"]}
HEADERS = {"Content-Type": "application/json"}
GPU_CLASS = "gpu.nvidia.com"
H100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
ROOMY = {"devices": 10_000_000, "memory": "1000000Ti"}
TIGHT = {"memory": "1Gi"}  # every GPU of the inventory has more: each claim is denied
NAMESPACES = 50  # of the generated claim mix (team-000 ...)
SERVE_LEASE_PERIOD = ServeOptions().lease_period  # `serve`'s default, what (a) measures unless told
TARGETS = {"a_reviews_per_cpu_s": 5000, "b_p99_ms": 5.0, "c_ratio": 0.8, "c_cpu_ratio": 1.5, "d_p99_ms": 50.0}
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONNECTIONS = 64


# -- reviews ------------------------------------------------------------------------------------


def review(obj: JSON, *, gvr: dict[str, str] = CLAIMS_GVR, namespace: str, dry_run: bool = False,
           old: JSON | None = None, subresource: str = "") -> JSON:
    """The AdmissionReview the API server sends for a CREATE of `obj` in `namespace`, or
    for an UPDATE of `old` to `obj` (of `subresource`)."""
    kind = {"group": gvr["group"], "version": gvr["version"], "kind": obj["kind"]}
    operation, options = ("CREATE", "CreateOptions") if old is None else ("UPDATE", "UpdateOptions")
    request: JSON = {
        "uid": str(uuid.uuid4()), "kind": kind, "resource": gvr, "requestKind": kind, "requestResource": gvr,
        "name": obj["metadata"]["name"], "namespace": namespace, "operation": operation, "userInfo": USER,
        "object": obj, "oldObject": old, "dryRun": dry_run,
        "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
    }
    if subresource:
        request["subResource"] = request["requestSubResource"] = subresource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def allocation_reviews(slices: list[JSON], namespace: str, n: int) -> list[JSON]:
    """The scheduler's `status` UPDATE setting the allocation of a claim of the generated mix
    (real devices of `slices`) in `namespace`, as dryRun: checked against the quota like any
    other, but leaving `serve`'s ledger as it was (the claim never exists there)."""
    out = []
    for c in generate_claims(4 * n, NAMESPACES, 13, slices, allocated_fraction=1.0):
        if (c.get("status") or {}).get("allocation") and not any(
                r.get("exactly", {}).get("adminAccess") for r in c["spec"]["devices"]["requests"]):
            c["metadata"]["namespace"] = namespace
            old = {k: v for k, v in c.items() if k != "status"}
            out.append(review(c, namespace=namespace, dry_run=True, old=old, subresource="status"))
        if len(out) == n:
            break
    return out


def claim(spec: JSON, namespace: str, name: str | None = None, *, kind: str = "ResourceClaim") -> JSON:
    """A claim (or template) as the API server shows it to a validating webhook: with the
    uid it generated."""
    name = name or f"c-{uuid.uuid4().hex[:10]}"
    meta: JSON = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}
    body: JSON = {"apiVersion": RESOURCE_V1, "kind": kind, "metadata": meta}
    body["spec"] = {"spec": copy.deepcopy(spec)} if kind == "ResourceClaimTemplate" else copy.deepcopy(spec)
    return body


def one_gpu(selector: str = H100, count: int = 1) -> JSON:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": GPU_CLASS, "count": count, "selectors": [{"cel": {"expression": selector}}]}}]}}


def claim_mix(n: int, slices: list[JSON], seed: int = 7) -> list[JSON]:
    """The generated claim mix (bench/inventory.py), unallocated, in team-000 ... ."""
    return generate_claims(n, NAMESPACES, seed, slices, allocated_fraction=0.0)


def mix_specs(slices: list[JSON], n: int = 400) -> list[JSON]:
    """Specs of the generated mix without adminAccess (which a namespace label decides)."""
    return [c["spec"] for c in claim_mix(n, slices)
            if not any(r.get("exactly", {}).get("adminAccess") for r in c["spec"]["devices"]["requests"])]


# Where the shipped configuration sends a claim CREATE (the mutating one-write admission,
# docs/development/one-write.md); templates and allocations stay on /validate.
ADMIT = "/admit"


def encoded(path: str, body: JSON) -> tuple[str, bytes]:
    return path, json.dumps(body).encode()


def patched(obj: JSON, answer: bytes) -> JSON:
    """`obj` with an allowed answer's JSON patch applied, as the API server stores it."""
    response = json.loads(answer).get("response") or {}
    if not response.get("patch"):
        return obj
    return json_patched(obj, json.loads(base64.b64decode(response["patch"])))


# -- measuring ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_of(pid: int, key: str = "VmRSS") -> float:
    """MiB of /proc/<pid>/status `key` (VmRSS now, VmHWM the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@dataclass
class Load:
    """One open-loop run: latencies from each request's due time, in ms."""

    rate: float
    latencies: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)  # how late the generator sent each one
    allowed: int = 0
    denied: int = 0
    failed: int = 0  # not HTTP 200, or no answer
    seconds: float = 0.0
    generator_cpu: float = 0.0  # this process's CPU share during the run
    server_cpu: float = float("nan")  # the server process's CPU share during the run

    def row(self, name: str) -> JSON:
        return {"name": name, "offered_per_s": self.rate, "n": len(self.latencies),
                "achieved_per_s": round(len(self.latencies) / self.seconds, 1) if self.seconds else 0,
                "p50_ms": round(percentile(self.latencies, 0.5), 2), "p99_ms": round(percentile(self.latencies, 0.99), 2),
                "max_ms": round(max(self.latencies, default=float("nan")), 2),
                "generator_late_p99_ms": round(percentile(self.late, 0.99), 2),
                "generator_late_max_ms": round(max(self.late, default=float("nan")), 2),
                "allowed": self.allowed, "denied": self.denied, "failed": self.failed,
                "generator_cpu": round(self.generator_cpu, 2), "server_cpu": round(self.server_cpu, 2),
                "server_cpu_ms_per_review": round(self.server_cpu * self.seconds / max(1, len(self.latencies)) * 1000, 3)}


def show(row: JSON, target: float | None = None) -> None:
    ratio = f"  p99/target={row['p99_ms'] / target:.2f}" if target else ""
    print(f"  {row['name']:<46} offered {row['offered_per_s']:>6.0f}/s got {row['achieved_per_s']:>7.1f}/s "
          f"p50 {row['p50_ms']:7.2f} ms p99 {row['p99_ms']:8.2f} ms max {row['max_ms']:8.1f} ms "
          f"(allowed {row['allowed']}, denied {row['denied']}, failed {row['failed']}; "
          f"generator late p99 {row['generator_late_p99_ms']:.1f} ms max {row['generator_late_max_ms']:.0f} ms, "
          f"cpu {row['generator_cpu']:.0%}; "
          f"serve cpu {row['server_cpu']:.0%}, {row['server_cpu_ms_per_review']:.2f} ms a review){ratio}")


async def open_loop(session: aiohttp.ClientSession, base: str, bodies: Sequence[tuple[str, bytes]],
                    rate: float, seconds: float, server: int | None = None) -> Load:
    """Send bodies[i % len] at start + i/rate, whatever is still in flight; `server`: the
    pid whose CPU share to record."""
    loop = asyncio.get_running_loop()
    out = Load(rate)
    n = max(1, int(rate * seconds))

    async def one(path: str, body: bytes, due: float) -> None:
        out.late.append((loop.time() - due) * 1000)
        try:
            async with session.post(base + path, data=body, headers=HEADERS) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, OSError):
            out.failed += 1
            return
        out.latencies.append((loop.time() - due) * 1000)
        if status != 200:
            out.failed += 1
        elif b'"allowed": true' in raw:
            out.allowed += 1
        else:
            out.denied += 1

    cpu, started = time.process_time(), loop.time()
    server_cpu = cpu_seconds(server) if server else float("nan")
    start = started + 0.01
    tasks = []
    for i in range(n):
        due = start + i / rate
        if (delay := due - loop.time()) > 0:
            await asyncio.sleep(delay)
        path, body = bodies[i % len(bodies)]
        tasks.append(asyncio.create_task(one(path, body, due)))
    await asyncio.gather(*tasks)
    out.seconds = loop.time() - start
    out.generator_cpu = (time.process_time() - cpu) / out.seconds
    out.server_cpu = (cpu_seconds(server) - server_cpu) / out.seconds if server else float("nan")
    return out


async def closed_loop(session: aiohttp.ClientSession, base: str, bodies: Sequence[tuple[str, bytes]]) -> Load:
    """One at a time: each review's latency alone."""
    out = Load(0.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for path, body in bodies:
        sent = loop.time()
        async with session.post(base + path, data=body, headers=HEADERS) as resp:
            raw = await resp.read()
        out.latencies.append((loop.time() - sent) * 1000)
        out.allowed += b'"allowed": true' in raw
        out.denied += b'"allowed": false' in raw
    out.seconds = loop.time() - started
    out.rate = len(bodies) / out.seconds
    return out


# -- (a) in-process -----------------------------------------------------------------------------


class StatusWriter:
    """What (a) puts where the API server is, in this process: the DeviceQuota objects,
    each status PUT checked against its resourceVersion and answered at once, and the
    watch events `serve` gets from it, delivered to `serve`'s own stores: its status
    write coming back, each admitted claim's ADDED event and then the MODIFIED one with
    the charge the leader writes on it (`Admitter.annotations_due`, as `controllers.annotator`
    computes it). Everything crosses as JSON text, encoded and decoded as on the wire.

    Simulated (not measured): the API server's own work, the network, TLS, and every
    delay: a write is answered and its events delivered before the next review starts.
    """

    def __init__(self, admitter: Admitter) -> None:
        self.admitter = admitter
        self.objects: dict[tuple[str, str], JSON] = {}
        self.revision = 0  # etcd's: one counter for every object
        self.writes = 0
        self.progress = Progress()
        self.claims = ClaimStore(admitter)
        self.quotas = QuotaStore(admitter)

    def attach(self, reservations: Reservations) -> None:
        self.claims.deleted = reservations.claim_deleted
        self.quotas.observe = reservations.observe

    def _stamp(self, obj: JSON) -> JSON:
        self.revision += 1
        obj["metadata"]["resourceVersion"] = str(self.revision)
        return obj

    def add_quota(self, obj: JSON) -> None:
        stored = self._stamp(copy.deepcopy(obj))
        self.objects[(stored["metadata"]["namespace"], stored["metadata"]["name"])] = stored
        self.quotas.upsert(json.loads(json.dumps(stored)))

    async def get(self, resource: Any, name: str, *, namespace: str | None = None) -> JSON:
        return dict(json.loads(json.dumps(self.objects[(str(namespace), name)])))

    async def update_status(self, resource: Any, body: JSON, *, namespace: str | None = None) -> JSON:
        sent: JSON = json.loads(json.dumps(body))
        key = (str(namespace), sent["metadata"]["name"])
        if sent["metadata"].get("resourceVersion") != self.objects[key]["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self.writes += 1
        stored = self.objects[key] = self._stamp(sent)
        text = json.dumps(stored)
        self.quotas.upsert(json.loads(text))  # the watch event
        return dict(json.loads(text))  # the answer

    def created(self, obj: JSON) -> None:
        """An admitted claim stored, then annotated by the leader: both watch events."""
        added = self._stamp(json.loads(json.dumps(obj)))
        self.claims.upsert(json.loads(json.dumps(added)))
        self.progress.advance(added["metadata"]["resourceVersion"])
        due = self.admitter.annotations_due(parse_claim(added), {})
        added["metadata"]["annotations"] = due
        modified = self._stamp(added)
        self.claims.upsert(json.loads(json.dumps(modified)))
        self.progress.advance(modified["metadata"]["resourceVersion"])


def persisted(admitter: Admitter, *, ttl: float = 120.0,
              lease_period: float = 0.0) -> tuple[Reservations, StatusWriter]:
    """`serve`'s persisted reservations (`kube.quotawriter`) over a `StatusWriter`, fed
    by its watch events as `serve`'s caches feed them; leases of `lease_period` (0: none)."""
    api = StatusWriter(admitter)
    reservations = Reservations(api, admitter.ledger, ttl=ttl, progress=api.progress,  # type: ignore[arg-type]
                                claim_version=api.claims.version, claim_recorded=api.claims.recorded_version,
                                leases=LeaseBook(Sizing(period=lease_period)))
    api.attach(reservations)
    return reservations, api


def in_process_context(slices: list[JSON], *, ttl: float = 120.0,
                       lease_period: float = 0.0) -> tuple[ClaimContext, StatusWriter]:
    """`serve`'s admission path in this process: its caches' domain objects, the persisted
    reservations (`kube.quotawriter`, leases of `lease_period`) writing to a
    `StatusWriter`, one DeviceQuota with room in each namespace of the claim mix."""
    inventory = Inventory()
    inventory.replace_all(slices)
    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    admitter = Admitter(Pricer(inventory, classes), Ledger())
    reservations, api = persisted(admitter, ttl=ttl, lease_period=lease_period)
    labels: dict[str, dict[str, str]] = {}
    for ns in generate_namespaces(NAMESPACES):
        name = ns["metadata"]["name"]
        labels[name] = {"kubernetes.io/metadata.name": name, **ns["metadata"].get("labels", {})}
        api.add_quota({"apiVersion": DQ, "kind": "DeviceQuota", "metadata": {"name": "gpus", "namespace": name},
                       "spec": {"hard": ROOMY}, "status": {}})
    policy = parse_policy({})
    return ClaimContext(admitter, labels.get, lambda: policy, reservations), api


class _Body:
    """The body stream as `webhook.server` reads it: in one piece here."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def readany(self) -> bytes:
        data, self.data = self.data, b""
        return data


@dataclass(frozen=True)
class Posted:
    """What the review handler reads of an aiohttp request: the body, its length, the query."""

    content: _Body
    query: dict[str, str] = field(default_factory=dict)

    @property
    def content_length(self) -> int:
        return len(self.content.data)


async def through_handler(app: web.Application, bodies: Sequence[tuple[str, bytes]], *, at_once: int = 1,
                          answered: Callable[[bytes, bytes], None] = lambda body, answer: None,
                          ) -> tuple[list[float], float, float]:
    """Each body through the app's own route handler (webhook.server's, for its path),
    without the HTTP transport, `at_once` at a time (their status writes share a batch
    when they share a quota); `answered(body, answer)` after each. (ms per group of
    `at_once` reviews, wall s, CPU s)."""
    handlers = {route.resource.canonical: route.handler for route in app.router.routes()
                if route.method == "POST" and route.resource is not None}

    async def one(path: str, body: bytes) -> None:
        response = await handlers[path](Posted(_Body(body)))  # type: ignore[arg-type]
        assert response.status == 200 and isinstance(response, web.Response) and response.body is not None
        answered(body, bytes(response.body))  # type: ignore[arg-type]

    times = []
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(bodies), at_once):
        began = time.perf_counter()
        await asyncio.gather(*(one(path, body) for path, body in bodies[start:start + at_once]))
        times.append((time.perf_counter() - began) * 1000)
    return times, time.perf_counter() - wall, time.process_time() - cpu


@contextlib.contextmanager
def collections_timed() -> Iterator[list[tuple[int, float]]]:
    """(generation, seconds) of every garbage collection inside the block."""
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


def section_a(slices: list[JSON], claims: int, lease_period: float = SERVE_LEASE_PERIOD) -> JSON:
    print(f"\n(a) in-process: {claims} claim CREATE reviews of the generated mix through the app's handler, "
          "each reservation persisted as `serve` does (kube.quotawriter), on a simulated API server; "
          + (f"leases of {lease_period:g} s" if lease_period else "no leases"))
    started = time.perf_counter()
    ctx, api = in_process_context(slices, lease_period=lease_period)
    print(f"  inventory of {len(ctx.admitter.pricer.inventory.usable())} devices built in "
          f"{time.perf_counter() - started:.1f} s; RSS {rss_mib():.0f} MiB")
    app = build_app(endpoints(ctx), ready=lambda: True)
    mix = claim_mix(claims, slices)

    def bodies() -> list[tuple[str, bytes]]:
        return [encoded(ADMIT, review(claim(c["spec"], c["metadata"]["namespace"]),
                                      namespace=c["metadata"]["namespace"])) for c in mix]

    allowed = [0]

    def answered(body: bytes, answer: bytes) -> None:
        """An allowed claim is created: the API server stores it as our answer patched it
        (its charge and the token its reservation settles by)."""
        if b'"allowed": true' in answer:
            allowed[0] += 1
            api.created(patched(json.loads(body)["request"]["object"], answer))

    async def run() -> JSON:
        await through_handler(app, bodies(), answered=answered)  # first sight of each selector: warms the caches
        # As `serve` does once its caches first synced (commands/serve.py `_announce_ready`).
        gc.collect()
        gc.freeze()
        out: JSON = {"devices": len(ctx.admitter.pricer.inventory.usable())}
        try:
            for at_once in (1, 16):
                measured, writes, allowed[0] = bodies(), api.writes, 0
                with collections_timed() as pauses:
                    times, wall, cpu = await through_handler(app, measured, at_once=at_once, answered=answered)
                name = "one at a time" if at_once == 1 else f"{at_once} at a time"
                full = [p for generation, p in pauses if generation == 2]
                out[name.replace(" ", "_")] = row = {
                    **summary(f"(a) persisted review, {name} (ms per {at_once})", times, None),
                    "reviews": len(measured), "allowed": allowed[0], "status_writes": api.writes - writes,
                    "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                    "reviews_per_cpu_s": round(len(measured) / cpu), "reviews_per_s": round(len(measured) / wall),
                    "gc_collections": len(pauses), "gc_s": round(sum(p for _, p in pauses), 3),
                    "gc_full_collections": len(full), "gc_full_s": round(sum(full), 3)}
                print(f"  {name}: {row['reviews_per_cpu_s']} reviews per CPU-second ({row['reviews_per_s']}/s wall; "
                      f"target {TARGETS['a_reviews_per_cpu_s']}, ratio "
                      f"{row['reviews_per_cpu_s'] / TARGETS['a_reviews_per_cpu_s']:.2f}); {row['allowed']} allowed, "
                      f"{row['status_writes']} status writes; garbage collection {len(pauses)} times, "
                      f"{row['gc_s']:.2f} s ({len(full)} full, {row['gc_full_s']:.2f} s) with the caches frozen")
        finally:
            gc.unfreeze()
        out["largest_record_at_end"] = max(len((o.get("status") or {}).get("reservations") or {})
                                           for o in api.objects.values())
        # The Admitter alone on the same claims, as the review asks it (pricing, then each
        # quota's charge; nothing checked or persisted): the share of the review that is
        # not pricing.
        parsed = [parse_claim(claim(c["spec"], c["metadata"]["namespace"])) for c in mix]
        start_cpu = time.process_time()
        for p in parsed:
            entry = ctx.admitter.price_for_admission(p, namespace_labels=ctx.namespace_labels(p.namespace))
            if isinstance(entry, Entry):
                ctx.admitter.charges(entry)
        out["admitter_only_admissions_per_cpu_s"] = round(len(parsed) / (time.process_time() - start_cpu))
        return out

    out = asyncio.run(run())
    print(f"  the Admitter alone (pricing and charges): {out['admitter_only_admissions_per_cpu_s']} claims per "
          f"CPU-second; at the end "
          f"the largest record holds {out['largest_record_at_end']} entries")
    return out


# -- the cluster --------------------------------------------------------------------------------


@dataclass
class Bench:
    cluster: ControlPlane
    kube: Kube
    served: Served
    slices: list[JSON]
    http: aiohttp.ClientSession
    base: str
    results: JSON
    specs: list[JSON] = field(default_factory=list)
    rss_after: dict[str, float] = field(default_factory=dict)

    def note_rss(self, section: str) -> None:
        assert self.served.process is not None
        self.rss_after[section] = round(rss_of(self.served.process.pid))
        print(f"  serve RSS after ({section}): {self.rss_after[section]:.0f} MiB; load average {load_average()}")

    @property
    def serve_pid(self) -> int:
        assert self.served.process is not None
        return self.served.process.pid

    def pids(self) -> dict[str, int]:
        out = {c.name: c.pid for c in self.cluster.components if c.pid}
        assert self.served.process is not None
        out["serve"] = self.served.process.pid
        out["bench"] = os.getpid()
        return {k: v for k, v in out.items() if v is not None}


async def create_many(clients: Sequence[Kube], items: Iterable[tuple[str, str, JSON, str | None]],
                      workers: int) -> tuple[int, float]:
    """Create every (apiVersion, plural, body, namespace) with `workers` in flight; (count, seconds)."""
    iterator = iter(items)
    done = 0

    async def work(client: Kube) -> None:
        nonlocal done
        for api_version, plural, body, namespace in iterator:
            for attempt in range(5):
                try:
                    await client.create(api_version, plural, body, namespace=namespace)
                    break
                except ApiError as err:
                    if err.status == 409 and "already exists" in err.message:
                        break
                    if attempt == 4 or err.status not in (429, 500, 503, 504):
                        raise
                    await asyncio.sleep(0.2 * (attempt + 1))  # retry pacing
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(work(clients[i % len(clients)]) for i in range(workers)))
    return done, time.monotonic() - started


async def namespace(kube: Kube, name: str, labels: dict[str, str] | None = None) -> str:
    meta: JSON = {"name": name, **({"labels": labels} if labels else {})}
    await kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": meta})
    return name


async def device_quota(kube: Kube, ns: str, hard: JSON, name: str = "gpus") -> None:
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": name},
                                           "spec": {"hard": hard}}, namespace=ns)


async def enforced(bench: Bench, ns: str) -> None:
    """Wait until `serve` holds the namespace's DeviceQuota: a claim of 10^8 GPUs is denied."""
    body = encoded(ADMIT, review(claim(one_gpu(count=100_000_000), ns), namespace=ns, dry_run=True))[1]

    async def probe() -> bool:
        async with bench.http.post(bench.base + ADMIT, data=body, headers=HEADERS) as resp:
            return b"exceeded DeviceQuota" in await resp.read()

    await poll(probe, timeout=60, what=f"serve to enforce the DeviceQuota of {ns}")


# The Deployment's flags `Served` replaces with its own for loopback: where serve listens
# and where its certificate comes from (the test CA's, not one it mints into a Secret).
LOCAL_FLAGS = {"--port", "--metrics-port", "--cert-mode", "--namespace", "--service-name", "--cert-secret",
               "--webhook-configurations"}


def deployment_flags() -> tuple[str, ...]:
    """`serve`'s flags in the chart's Deployment (default values), but for LOCAL_FLAGS."""
    args = DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve"
    return tuple(a for a in args[1:] if a.partition("=")[0] not in LOCAL_FLAGS)


@contextlib.asynccontextmanager
async def control_plane(args: argparse.Namespace, workdir: Path, *, metrics_port: int = 0,
                        log_level: str = "info",
                        trace: Sequence[aiohttp.TraceConfig] = ()) -> AsyncIterator[Bench]:
    """The control plane with the generated inventory, and `serve` (its metrics on
    `metrics_port`, 0: off; `log_level` "debug" logs every review with its latency);
    `trace`: the honest client's aiohttp trace hooks."""
    cluster = ControlPlane(binary=build(), workdir=workdir)
    started = time.monotonic()
    cluster.start()
    print(f"\ncontrol plane ready in {cluster.startup_seconds:.1f} s")
    kube = cluster.client()
    served: Served | None = None
    http: aiohttp.ClientSession | None = None
    try:
        for definition in CRDS:  # serve watches both quota kinds: it is not ready without either
            await kube.create("apiextensions.k8s.io/v1", "customresourcedefinitions", definition)
            await kube.wait_for_condition("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                          definition["metadata"]["name"], "Established", timeout=60)
        for cls in generate_device_classes():
            await kube.create(RESOURCE_V1, "deviceclasses", cls)
        slices = generate_slices(args.nodes)
        for s in slices:  # the API server assigns these
            s["metadata"].pop("uid")
            s["metadata"].pop("resourceVersion")
        clients = [cluster.client() for _ in range(4)]
        try:
            count, seconds = await create_many(
                clients, ((RESOURCE_V1, "resourceslices", s, None) for s in slices), workers=32)
        finally:
            for c in clients:
                await c.close()
        print(f"{count} ResourceSlices ({args.nodes} nodes) created in {seconds:.1f} s ({count / seconds:.0f}/s)")
        ttl = () if args.reservation_ttl is None else ("--reservation-ttl", str(args.reservation_ttl))
        # The other benches (connections, attacks, teams) run serve with its default.
        period = getattr(args, "lease_period", None)
        leases = () if period is None else ("--lease-period", str(period))
        # As a Deployment of the chart runs it: its ServiceAccount and RBAC (so the leader's
        # own claim writes skip our annotation webhook, as `not-dra-quota-itself` says) and
        # its flags, but for where it listens and where its certificate comes from.
        kubeconfig = await chart_kubeconfig(cluster, kube, workdir / "chart.kubeconfig")
        served = Served(cluster, free_ports(1)[0], workdir / "serve.log", kubeconfig=kubeconfig,
                        # ::1 too: bench/connections.py and attacks.py attack from there, as a
                        # Pod would from its own address (the honest reviews use 127.0.0.1).
                        args=(*deployment_flags(), "--log-level", log_level, *ttl, *leases, "--bind-address", "127.0.0.1,::1"),
                        ready_timeout=900,
                        metrics_port=metrics_port)
        await served.start()
        assert served.process is not None
        fresh_rss = rss_of(served.process.pid)
        print(f"dra-quota serve ready in {served.ready_seconds:.1f} s, RSS {fresh_rss:.0f} MiB")
        ctx = ssl.create_default_context(cafile=str(cluster.ca_file))
        ctx.check_hostname = False  # the certificate names the Service, we dial 127.0.0.1
        # A bounded pool, opened before measuring: a TLS handshake in the middle of a run
        # would cost both sides milliseconds of CPU (the API server keeps its connections too).
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=CONNECTIONS),
                                     trace_configs=list(trace))
        async with http.get(f"https://127.0.0.1:{served.port}/healthz") as resp:
            assert resp.status == 200
        results = {"slices": count, "slices_create_s": round(seconds, 1),
                   "serve_ready_s": round(served.ready_seconds, 1), "serve_rss_mib": round(fresh_rss),
                   "setup_s": round(time.monotonic() - started, 1)}
        bench = Bench(cluster, kube, served, slices, http, f"https://127.0.0.1:{served.port}", results)
        bench.specs = mix_specs(slices)
        yield bench
    except BaseException:
        if served is not None:
            print(f"--- serve log tail ---\n{served.log_text()[-4000:]}")
        raise
    finally:
        if http is not None:
            await http.close()
        if served is not None:
            await served.kill()
        await kube.close()
        cluster.stop()


# -- (b) reviews that write nothing, and persisted admissions -----------------------------------


async def warm(bench: Bench, bodies: Sequence[tuple[str, bytes]]) -> None:
    """Every body once (first sight of its selectors), CONNECTIONS at a time: opens the pool."""
    for start in range(0, len(bodies), CONNECTIONS):
        await asyncio.gather(*(closed_loop(bench.http, bench.base, [b]) for b in bodies[start:start + CONNECTIONS]))


async def write_nothing_bodies(bench: Bench, count: int = 256) -> list[tuple[str, bytes]]:
    """Round-robin, what the API server sends that writes nothing: a claim where no
    DeviceQuota applies, a claim a DeviceQuota denies, a template, the scheduler's
    allocation of a claim (the check against the ledger); the generated mix's selectors."""
    free, tight, roomy = "bench-free", "bench-tight", "bench-roomy"
    for ns, hard in ((free, None), (tight, TIGHT), (roomy, ROOMY)):
        if await bench.kube.get_or_none("v1", "namespaces", ns) is None:
            await namespace(bench.kube, ns)
            if hard is not None:
                await device_quota(bench.kube, ns, hard)
    for ns in (tight, roomy):
        await enforced(bench, ns)
    allocations = allocation_reviews(bench.slices, roomy, count // 4)
    out = []
    for i in range(count):
        spec = bench.specs[i % len(bench.specs)]
        kind = i % 4
        if kind == 0:
            out.append(encoded(ADMIT, review(claim(spec, free), namespace=free)))
        elif kind == 1:
            out.append(encoded(ADMIT, review(claim(spec, tight), namespace=tight)))
        elif kind == 2:
            out.append(encoded("/validate", review(claim(spec, roomy, kind="ResourceClaimTemplate"),
                                                   gvr=TEMPLATES_GVR, namespace=roomy)))
        else:
            out.append(encoded("/validate", allocations[(i // 4) % len(allocations)]))
    return out


async def section_b(bench: Bench, seconds: float, rates: Sequence[float]) -> JSON:
    print("\n(b) HTTPS to `dra-quota serve`, reviews that write nothing (free claim, denied claim, template, "
          "allocation)")
    bodies = await write_nothing_bodies(bench)
    await warm(bench, bodies)
    at_1000 = (await open_loop(bench.http, bench.base, bodies, 1000, seconds, bench.serve_pid)).row("(b) write nothing at 1,000/s")
    show(at_1000, TARGETS["b_p99_ms"])

    def good(row: JSON) -> bool:
        return bool(row["p99_ms"] <= TARGETS["b_p99_ms"] and not row["failed"])

    # Up from 1,000/s while p99 holds; down from it until p99 holds when it did not.
    order = sorted((r for r in rates if r > 1000) if good(at_1000) else (r for r in rates if r < 1000),
                   reverse=not good(at_1000))
    steps, best = [], 1000.0 if good(at_1000) else 0.0
    for rate in order:
        row = (await open_loop(bench.http, bench.base, bodies, rate, seconds, bench.serve_pid)).row(f"(b) write nothing at {rate:.0f}/s")
        show(row, TARGETS["b_p99_ms"])
        steps.append(row)
        if good(row) and rate > best:
            best = rate
        if good(row) != good(at_1000):
            break
    print(f"  highest offered rate tried with p99 <= {TARGETS['b_p99_ms']} ms: {best:.0f}/s")
    return {"at_1000": at_1000, "steps": steps, "max_rate_p99_5ms": best}


async def section_b_persisted(bench: Bench, count: int, rates: Sequence[float], seconds: float) -> JSON:
    print("\n(b) HTTPS to `dra-quota serve`, claim CREATEs that persist a reservation on a DeviceQuota's status")
    out: JSON = {"steps": []}

    async def quota_ns(tag: str) -> str:
        ns = await namespace(bench.kube, f"bench-persist-{tag}")
        await device_quota(bench.kube, ns, ROOMY)
        await enforced(bench, ns)
        return ns

    def bodies(ns: str, n: int) -> list[tuple[str, bytes]]:
        return [encoded(ADMIT, review(claim(bench.specs[i % len(bench.specs)], ns), namespace=ns))
                for i in range(n)]

    async def writes(before: str) -> JSON:
        """The API server's own count and mean latency of the DeviceQuota status writes."""
        calls, ms = histogram_delta(before, await bench.kube.api.text("/metrics"), *STATUS_PUT)
        return {"status_writes": int(calls), "status_write_ms": ms}

    ns = await quota_ns("serial")
    before = await bench.kube.api.text("/metrics")
    row = (await closed_loop(bench.http, bench.base, bodies(ns, count))).row("(b) persisted, one at a time")
    row.update(await writes(before))
    show(row)
    print(f"    {row['status_writes']} status writes, {row['status_write_ms']} ms each in the API server")
    out["serial"] = row
    for rate in rates:
        ns = await quota_ns(f"{rate:.0f}")
        before = await bench.kube.api.text("/metrics")
        load = await open_loop(bench.http, bench.base, bodies(ns, int(rate * seconds)), rate, seconds, bench.serve_pid)
        row = load.row(f"(b) persisted at {rate:.0f}/s")
        row.update(await writes(before))
        quota = await bench.kube.get(DQ, "devicequotas", "gpus", namespace=ns)
        row["status_entries"] = len((quota.get("status") or {}).get("reservations") or {})
        row["object_bytes"] = len(json.dumps(quota))
        show(row)
        print(f"    {row['status_writes']} status writes, {row['status_write_ms']} ms each in the API server; "
              f"the DeviceQuota now holds {row['status_entries']} reservations, {row['object_bytes']} bytes")
        out["steps"].append(row)
    return out


# -- (d) a noisy namespace ----------------------------------------------------------------------


async def section_d(bench: Bench, seconds: float, rate: float, noisy_rate: float) -> JSON:
    print(f"\n(d) other namespaces at {rate:.0f}/s (the mix of (b)), without then with a noisy namespace "
          f"at {noisy_rate:.0f} claims/s whose selectors read attribute names never read before")
    bodies = await write_nothing_bodies(bench)
    await warm(bench, bodies)
    noisy_ns = await namespace(bench.kube, "bench-noisy")
    quiet = (await open_loop(bench.http, bench.base, bodies, rate, seconds, bench.serve_pid)).row("(d) others, no noisy namespace")
    show(quiet, TARGETS["d_p99_ms"])
    # Invented attribute names only (novel_selector's shapes 0 and 1), each used once.
    noisy_bodies = []
    for i in (j for j in range(1_000_000, 10_000_000) if j % 4 in (0, 1)):
        spec = one_gpu(novel_selector(i))
        noisy_bodies.append(encoded(ADMIT, review(claim(spec, noisy_ns), namespace=noisy_ns)))
        if len(noisy_bodies) >= int(noisy_rate * seconds):
            break
    noisy_task = asyncio.create_task(open_loop(bench.http, bench.base, noisy_bodies, noisy_rate, seconds))
    loud = (await open_loop(bench.http, bench.base, bodies, rate, seconds, bench.serve_pid)).row("(d) others, with the noisy namespace")
    noisy = (await noisy_task).row("(d) the noisy namespace's own reviews")
    show(loud, TARGETS["d_p99_ms"])
    show(noisy)
    return {"without": quiet, "with": loud, "noisy": noisy}


# -- (c) creates through the API server ---------------------------------------------------------


def metric_sums(text: str, metric: str, match: Callable[[str], bool]) -> tuple[float, float]:
    """(sum, count) over the series of a Prometheus histogram whose labels `match`."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(metric + "_sum{") and match(line):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(metric + "_count{") and match(line):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def histogram_delta(before: str, after: str, metric: str, *labels: str) -> tuple[float, float]:
    """(observations, mean ms) between two scrapes of a histogram, over its series holding every label."""
    (s0, c0), (s1, c1) = (metric_sums(t, metric, lambda line: all(x in line for x in labels)) for t in (before, after))
    return c1 - c0, round((s1 - s0) / (c1 - c0) * 1000, 2) if c1 > c0 else 0.0


STATUS_PUT = ("apiserver_request_duration_seconds", 'resource="devicequotas"', 'subresource="status"', 'verb="PUT"')


HOOK = "apiserver_admission_webhook_admission_duration_seconds"
# The ResourceQuota baseline's claims carry a charge already, so that the leader's
# annotator (which charges every claim of the cluster it sees without one) writes nothing
# there: the baseline is a create as the API server does it without dra-quota.
CHARGED = {"draquota.io/charge": '{"memory":85899345920,"devices":1}', "draquota.io/quotas": ""}
# What the API server spends on a create, by its own metrics: (field, metric and labels).
COSTS = {
    "create": ("apiserver_request_duration_seconds", 'resource="resourceclaims"', 'subresource=""', 'verb="POST"'),
    "quota_webhook": (HOOK, 'name="quota.resourceclaims.draquota.io"'),
    "quota_webhook_ungoverned": (HOOK, 'name="quota-ungoverned.resourceclaims.draquota.io"'),
    # The one-write prototype's mutating call (bench/floor.py's `one-write` mode).
    "admit_webhook": (HOOK, 'name="admit.resourceclaims.draquota.io"'),
    # bench/floor.py's do-nothing webhooks (validating and mutating).
    "floor_webhook": (HOOK, 'floor.bench.draquota.io"'),
    # Should stay 0: the leader's own writes of our annotations skip it (not-dra-quota-itself).
    "annotations_webhook": (HOOK, 'name="annotations'),
    "resourcequota_plugin": ("apiserver_admission_controller_admission_duration_seconds", 'name="ResourceQuota"',
                             'operation="CREATE"'),
    "status_write": STATUS_PUT,
    # The leader's draquota.io/charge on each new claim (controllers/annotator.py).
    "annotation_patch": ("apiserver_request_duration_seconds", 'resource="resourceclaims"', 'subresource=""',
                         'verb="PATCH"'),
}


def api_server_costs(before: str, after: str) -> JSON:
    """Per COSTS entry, the count and the mean ms between two scrapes of the API server's metrics."""
    out: JSON = {}
    for name, (metric, *labels) in COSTS.items():
        calls, ms = histogram_delta(before, after, metric, *labels)
        out[f"{name}_calls"], out[f"{name}_ms"] = int(calls), ms
    return out


def costs_line(row: JSON) -> str:
    return ", ".join(f"{row[f'{name}_calls']} {name.replace('_', ' ')} of {row[f'{name}_ms']} ms"
                     for name in COSTS if row[f"{name}_calls"])


async def sample_quota(kube: Kube, ns: str, done: Callable[[], bool], name: str = "gpus", every: float = 0.25) -> JSON:
    """The DeviceQuota's largest size until `done()`, read every `every` seconds: its
    entries and its bytes as the API server sends it (JSON)."""
    entries = size = samples = 0
    loop = asyncio.get_running_loop()
    shown_at = loop.time()
    while True:
        quota = await kube.get(DQ, "devicequotas", name, namespace=ns)
        samples += 1
        held = (quota.get("status") or {}).get("reservations") or {}
        entries = max(entries, len(held))
        size = max(size, len(json.dumps(quota, separators=(",", ":"))))
        if loop.time() - shown_at >= 10:  # progress, so that a long run shows how the record moves
            shown_at = loop.time()
            leases = sum(1 for r in held.values() if r.get("source") == "Lease")
            print(f"    {ns}: {len(held)} entries ({leases} leases), largest so far {entries}; "
                  f"load average {load_average()}", flush=True)
        if done():
            return {"max_entries": entries, "max_bytes": size, "samples": samples}
        await asyncio.sleep(every)  # a sampling period, not a wait for a condition


async def served_counts(served: Served) -> dict[str, float]:
    """`serve`'s reservations admitted by path and its lease writes, as its metrics count them."""
    samples = await served.metrics()
    return {"admitted_lease": samples.get(("draquota_reservation_admissions_total", frozenset({("path", "lease")})), 0.0),
            "admitted_exact": samples.get(("draquota_reservation_admissions_total", frozenset({("path", "exact")})), 0.0),
            "lease_writes": sum(v for (name, _), v in samples.items() if name == "draquota_lease_writes_total")}


async def sample_backlog(served: Served, done: Callable[[], bool], every: float = 5.0) -> float:
    """The most charges the leader had yet to write on claims, scraped every `every`
    seconds until `done()` (a scrape costs `serve` CPU: seldom)."""
    most = 0.0
    while not done():
        samples = await served.metrics()
        most = max(most, samples.get(("draquota_charge_annotations_pending", frozenset()), 0.0))
        await asyncio.sleep(every)  # a sampling period, not a wait for a condition
    return most


@contextlib.asynccontextmanager
async def our_webhooks(bench: Bench, shipped: list[JSON] | None = None, name_suffix: str = "serve"
                       ) -> AsyncIterator[str]:
    """The shipped webhook configurations (or `shipped`) pointed at `serve`, for namespaces
    labelled with the run label this yields; deleted on the way out."""
    run = uuid.uuid4().hex[:8]
    configs = shipped_for_test(run, bench.served.port, bench.cluster, label=RUN_LABEL, name_suffix=name_suffix,
                               shipped=shipped)
    for config in configs:
        await bench.kube.create(ADMISSION, PLURALS[config["kind"]], config)
    try:
        yield run
    finally:
        for config in configs:
            await bench.kube.delete(ADMISSION, PLURALS[config["kind"]], config["metadata"]["name"])


async def resource_quota_namespace(kube: Kube, name: str) -> str:
    """A namespace with only an in-tree ResourceQuota on the GPU class's devices (with room)."""
    ns = await namespace(kube, name)
    key = f"{GPU_CLASS}.deviceclass.resource.k8s.io/devices"
    await kube.create("v1", "resourcequotas", {"kind": "ResourceQuota", "metadata": {"name": "gpus"},
                                               "spec": {"hard": {key: "100000000"}}}, namespace=ns)
    await kube.wait_for("v1", "resourcequotas", "gpus", lambda q: key in ((q.get("status") or {}).get("used") or {}),
                        namespace=ns, timeout=60, what="the ResourceQuota's status")
    return ns


def claim_body(name: str, ns: str, charged: Collection[str]) -> JSON:
    """A one-GPU claim; in the namespaces `charged` (the ResourceQuota baseline's)
    carrying a charge already (CHARGED), so dra-quota writes nothing there."""
    meta: JSON = {"name": name, **({"annotations": CHARGED} if ns in charged else {})}
    return {"kind": "ResourceClaim", "metadata": meta, "spec": one_gpu()}


async def annotations_landed(kube: Kube, before: str, creates: int, timeout: float = 60.0) -> None:
    """Wait until the API server counted a PATCH of resourceclaims (the leader's charge) for
    each of `creates` claims since the scrape `before`: their work belongs to their phase."""

    async def done() -> bool:
        patches, _ = histogram_delta(before, await kube.api.text("/metrics"), *COSTS["annotation_patch"])
        return patches >= creates

    await poll(done, timeout=timeout, what=f"the leader's charge on {creates} claims")


async def section_c(bench: Bench, seconds: float, rounds: int, workers: int) -> JSON:
    print(f"\n(c) claim creates through the API server, {workers} in flight, {rounds} rounds of {seconds:.0f} s "
          "per mode: our webhooks + a DeviceQuota, our webhooks and no DeviceQuota, only a ResourceQuota")
    async with our_webhooks(bench) as run:
        ours = await namespace(bench.kube, "bench-webhook", {RUN_LABEL: run})
        await device_quota(bench.kube, ours, ROOMY)
        # Our webhooks called, no DeviceQuota in scope: the calls without the status writes.
        unquoted = await namespace(bench.kube, "bench-webhook-noquota", {RUN_LABEL: run})
        theirs = await resource_quota_namespace(bench.kube, "bench-resourcequota")
        await enforced(bench, ours)
        phases = await creates_per_second(bench, seconds, rounds, workers,
                                          {"webhook": ours, "webhook-noquota": unquoted, "resourcequota": theirs},
                                          charged={theirs}, patched=())
    rate, cpu = rates(phases), apiserver_cpu(phases)
    ratio, ratio_noquota = (rate[m] / rate["resourcequota"] for m in ("webhook", "webhook-noquota"))
    cpu_ratio, cpu_ratio_noquota = (cpu[m] / cpu["resourcequota"] for m in ("webhook", "webhook-noquota"))
    print(f"  webhook {rate['webhook']:.1f}/s vs ResourceQuota {rate['resourcequota']:.1f}/s: ratio {ratio:.2f} "
          f"(target >= {TARGETS['c_ratio']}); API server CPU a create {cpu['webhook']:.2f} vs "
          f"{cpu['resourcequota']:.2f} ms: {cpu_ratio:.2f}x (target <= {TARGETS['c_cpu_ratio']}x); webhook without a "
          f"DeviceQuota in scope {rate['webhook-noquota']:.1f}/s, ratio {ratio_noquota:.2f}, "
          f"API server CPU {cpu_ratio_noquota:.2f}x; load average {load_average()}")
    return {"phases": phases, "per_s": {m: round(v, 1) for m, v in rate.items()}, "ratio": round(ratio, 3),
            "ratio_noquota": round(ratio_noquota, 3),
            "apiserver_cpu_ms_per_create": {m: round(v, 3) for m, v in cpu.items()},
            "apiserver_cpu_ratio": round(cpu_ratio, 3), "apiserver_cpu_ratio_noquota": round(cpu_ratio_noquota, 3),
            "load_average": load_average()}


def rates(phases: dict[str, list[JSON]]) -> dict[str, float]:
    """Creates per second of each mode over all its phases."""
    return {m: sum(r["creates"] for r in rows) / sum(r["seconds"] for r in rows) for m, rows in phases.items()}


def apiserver_cpu(phases: dict[str, list[JSON]]) -> dict[str, float]:
    """The API server's CPU milliseconds per create of each mode over all its phases."""
    return {m: sum(r["cpu_ms_per_create"]["apiserver"] * r["creates"] for r in rows) / sum(r["creates"] for r in rows)
            for m, rows in phases.items()}


async def creates_per_second(bench: Bench, seconds: float, rounds: int, workers: int, modes: dict[str, str], *,
                             charged: Collection[str], patched: Collection[str],
                             more_pids: dict[str, int] | None = None,
                             quotas: Collection[str] = ("webhook",)) -> dict[str, list[JSON]]:
    """(c)'s alternating phases, `workers` creates in flight in each mode's namespace:
    each phase's row, by mode. Claims in the namespaces `charged` carry a charge already
    (`claim_body`); a phase of a mode in `patched` ends once the leader charged its claims.
    `more_pids`: other processes whose CPU per create each row shows, by name; `quotas`:
    the modes whose namespace's DeviceQuota `gpus` is sampled (`sample_quota`)."""
    clients = [bench.cluster.client() for _ in range(max(1, workers // 8))]
    phases: dict[str, list[JSON]] = {mode: [] for mode in modes}
    counter = iter(range(10**9))

    async def phase(mode: str, ns: str) -> JSON:
        pids = bench.pids() | (more_pids or {})
        cpu = {k: cpu_seconds(p) for k, p in pids.items()}
        metrics = await bench.kube.api.text("/metrics")
        latencies: list[float] = []
        failed = 0
        deadline = time.monotonic() + seconds
        sampled = (asyncio.create_task(sample_quota(bench.kube, ns, lambda: time.monotonic() >= deadline))
                   if mode in quotas else None)

        async def work(client: Kube) -> None:
            nonlocal failed
            while time.monotonic() < deadline:
                sent = time.monotonic()
                try:
                    await client.create(RESOURCE_V1, "resourceclaims",
                                        claim_body(f"c-{next(counter):07d}", ns, charged), namespace=ns)
                except ApiError:
                    failed += 1
                    continue
                latencies.append((time.monotonic() - sent) * 1000)

        started = time.monotonic()
        await asyncio.gather(*(work(clients[i % len(clients)]) for i in range(workers)))
        wall = time.monotonic() - started
        record = await sampled if sampled is not None else {}
        if mode in patched:  # the leader's patches of these creates count here, not in the next phase
            await annotations_landed(bench.kube, metrics, len(latencies))
        after = await bench.kube.api.text("/metrics")
        used = {k: round((cpu_seconds(p) - cpu[k]) / max(1, len(latencies)) * 1000, 3) for k, p in pids.items()}
        row = {"mode": mode, "creates": len(latencies), "failed": failed, "seconds": round(wall, 2),
               "creates_per_s": round(len(latencies) / wall, 1),
               "p50_ms": round(percentile(latencies, 0.5), 1), "p99_ms": round(percentile(latencies, 0.99), 1),
               "cpu_ms_per_create": used, **api_server_costs(metrics, after), **record, "load_average": load_average()}
        print(f"  {mode:<16} {row['creates_per_s']:7.1f} creates/s (n={row['creates']}, failed {failed}) "
              f"p50 {row['p50_ms']:.1f} ms p99 {row['p99_ms']:.1f} ms; CPU ms per create {used}; "
              f"load average {row['load_average']}")
        print("    API server: " + costs_line(row) + (f"; the DeviceQuota at most {row['max_entries']} entries, "
                                                     f"{row['max_bytes']} bytes" if record else ""))
        return row

    try:
        for _ in range(rounds):
            for mode, ns in modes.items():
                phases[mode].append(await phase(mode, ns))
    finally:
        for client in clients:
            await client.close()
    return phases


# -- (f) sustained creates into one DeviceQuota ---------------------------------------------------


async def section_f(bench: Bench, rate: float, seconds: float, limit: int) -> JSON:
    print(f"\n(f) {rate:.0f} claim creates/s offered for {seconds:.0f} s, at most {limit} in flight, into one "
          "DeviceQuota with room (our webhooks), then the same into a namespace with only a ResourceQuota")
    async with our_webhooks(bench) as run:
        ours = await namespace(bench.kube, "bench-sustained", {RUN_LABEL: run})
        await device_quota(bench.kube, ours, ROOMY)
        theirs = await resource_quota_namespace(bench.kube, "bench-sustained-resourcequota")
        await enforced(bench, ours)
        out = {"webhook": await sustained(bench, ours, theirs, rate, seconds, limit),
               "resourcequota": await sustained(bench, theirs, theirs, rate, seconds, limit)}
    print(f"  p99 create latency {out['webhook']['p99_ms']:.0f} ms with our webhooks + a DeviceQuota, "
          f"{out['resourcequota']['p99_ms']:.0f} ms with only a ResourceQuota; the DeviceQuota object at most "
          f"{out['webhook']['max_bytes']} bytes ({out['webhook']['max_bytes'] / 1024:.1f} KiB, target <= 64 KiB), "
          f"{out['webhook']['max_entries']} entries; failed creates {out['webhook']['failed']} "
          f"(ResourceQuota {out['resourcequota']['failed']}); load average {load_average()}")
    return out


async def on_schedule(n: int, rate: float, start: float,
                      one: Callable[[int, float], Coroutine[Any, Any, None]]) -> None:
    """Start `one(i, due)` at due = start + i/rate, whatever is still in flight (an open
    loop: a backlog shows in the latencies, never hidden); return once every one ended."""
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    for i in range(n):
        due = start + i / rate
        if (delay := due - loop.time()) > 0:
            await asyncio.sleep(delay)  # the open loop's schedule
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)


async def sustained(bench: Bench, ns: str, baseline: str, rate: float, seconds: float, limit: int) -> JSON:
    """Creates due at start + i/rate, at most `limit` in flight (as a controller's workers
    create claims: beyond them a create waits for a worker), each timed from its due
    time, so a backlog shows in the latencies; the namespace's DeviceQuota sampled."""
    loop = asyncio.get_running_loop()
    clients = [bench.cluster.client() for _ in range(8)]
    workers = asyncio.Semaphore(limit)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    in_flight = most = 0
    n = int(rate * seconds)
    start = loop.time() + 0.05
    finished = asyncio.Event()
    ours = ns != baseline
    sampler = asyncio.create_task(sample_quota(bench.kube, ns, finished.is_set, every=0.5)) if ours else None
    backlog = asyncio.create_task(sample_backlog(bench.served, finished.is_set)) if ours else None
    before = await served_counts(bench.served) if ours else {}

    async def one(i: int, due: float) -> None:
        nonlocal in_flight, most
        async with workers:
            in_flight += 1
            most = max(most, in_flight)
            try:
                await clients[i % len(clients)].create(RESOURCE_V1, "resourceclaims",
                                                       claim_body(f"s-{i:07d}", ns, {baseline}), namespace=ns)
                latencies.append((loop.time() - due) * 1000)
            except (ApiError, aiohttp.ClientError, TimeoutError) as err:
                reason = err.message[:160] if isinstance(err, ApiError) else type(err).__name__
                errors[reason] = errors.get(reason, 0) + 1
            finally:
                in_flight -= 1

    try:
        await on_schedule(n, rate, start, one)
    finally:
        finished.set()
        for client in clients:
            await client.close()
    wall = loop.time() - start
    record = await sampler if sampler is not None else {}
    if backlog is not None:
        after = await served_counts(bench.served)
        record = {**record, "most_annotations_pending": await backlog,
                  **{k: v - before.get(k, 0) for k, v in after.items()}}
    row = {"namespace": ns, "offered_per_s": rate, "seconds": seconds, "created": len(latencies),
           "failed": sum(errors.values()), "errors": errors, "achieved_per_s": round(len(latencies) / wall, 1),
           "p50_ms": round(percentile(latencies, 0.5), 1), "p99_ms": round(percentile(latencies, 0.99), 1),
           "max_ms": round(max(latencies, default=float("nan")), 1), "most_in_flight": most, **record,
           "load_average": load_average()}
    print(f"  {ns}: {row['created']} created of {n} ({row['achieved_per_s']}/s), failed {row['failed']} {errors or ''}; "
          f"p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms max {row['max_ms']} ms; at most {most} in flight"
          + (f"; the DeviceQuota at most {row['max_bytes']} bytes, {row['max_entries']} entries; admitted under "
             f"a lease {row['admitted_lease']:.0f}, exact {row['admitted_exact']:.0f}; lease writes "
             f"{row['lease_writes']:.0f}; at most {row['most_annotations_pending']:.0f} charges waiting for the "
             "leader's patch" if record else "")
          + f"; load average {row['load_average']}")
    return row


# -- (e) RSS with many claims -------------------------------------------------------------------


async def reserved_devices(bench: Bench, ns: str) -> str:
    """The `reserved devices=` a dry-run claim of one GPU is denied with in `ns`."""
    body = encoded(ADMIT, review(claim(one_gpu(), ns), namespace=ns, dry_run=True))[1]

    async def probe() -> str | None:
        async with bench.http.post(bench.base + ADMIT, data=body, headers=HEADERS) as resp:
            found = re.search(rb"reserved devices=(\d+)", await resp.read())
        return found.group(1).decode() if found else None

    return str(await poll(probe, timeout=60, what=f"serve to enforce the DeviceQuota of {ns}"))


async def section_e(bench: Bench, claims: int, checkpoints: int) -> JSON:
    print(f"\n(e) RSS of serve with {len(bench.slices)} slices and {claims} ResourceClaims created in the API server")
    assert bench.served.process is not None
    for ns in generate_namespaces(NAMESPACES):  # odd ones allow adminAccess claims
        await bench.kube.create("v1", "namespaces", {"kind": "Namespace", "metadata": ns["metadata"]})
    mix = claim_mix(claims, bench.slices, seed=11)
    for c in mix:
        del c["metadata"]["uid"]  # the API server assigns it
    clients = [bench.cluster.client() for _ in range(4)]
    samples = [{"claims": 0, "serve_rss_mib": round(rss_of(bench.served.process.pid)), "create_s": 0.0}]
    total_s = 0.0
    try:
        chunk = -(-claims // checkpoints)
        for start in range(0, claims, chunk):
            part = mix[start:start + chunk]
            count, seconds = await create_many(
                clients, ((RESOURCE_V1, "resourceclaims", c, c["metadata"]["namespace"]) for c in part), workers=48)
            total_s += seconds
            pids = bench.pids()
            sample = {"claims": start + count, "create_s": round(total_s, 1), "creates_per_s": round(count / seconds),
                      "serve_rss_mib": round(rss_of(pids["serve"])),
                      "apiserver_rss_mib": round(rss_of(pids["apiserver"])), "etcd_rss_mib": round(rss_of(pids["etcd"]))}
            samples.append(sample)
            print(f"  {sample['claims']:>7} claims after {total_s:6.1f} s ({sample['creates_per_s']}/s in this chunk): "
                  f"serve {sample['serve_rss_mib']} MiB, apiserver {sample['apiserver_rss_mib']} MiB, "
                  f"etcd {sample['etcd_rss_mib']} MiB; load {load_average()}")
    finally:
        for client in clients:
            await client.close()
    del mix
    # What the running process counts in one namespace (a dry-run review against a quota
    # of one device names the devices reserved there), against a fresh process below.
    probe_ns = generate_namespaces(1)[0]["metadata"]["name"]
    await device_quota(bench.kube, probe_ns, {"devices": 1}, name="probe")
    running = await reserved_devices(bench, probe_ns)
    # A fresh process: the list at start-up is what a restarted replica goes through.
    await bench.served.terminate()
    await bench.served.start()
    assert bench.served.process is not None
    fresh = {"ready_s": round(bench.served.ready_seconds, 1), "rss_mib": round(rss_of(bench.served.process.pid)),
             "peak_rss_mib": round(rss_of(bench.served.process.pid, "VmHWM"))}
    counted = {"namespace": probe_ns, "running_serve": running, "fresh_serve": await reserved_devices(bench, probe_ns)}
    print(f"  devices reserved in {probe_ns} by the claims there: the running serve counts {running}, "
          f"a fresh one {counted['fresh_serve']}")
    # Fresh process against fresh process: the running one also holds what the load
    # sections left (connections, caches of novel selectors, heap fragmentation).
    slope = (fresh["rss_mib"] - bench.results["serve_rss_mib"]) / samples[-1]["claims"] * 1024
    print(f"  creates: {claims} in {total_s:.0f} s ({claims / total_s:.0f}/s); a fresh serve: ready in "
          f"{fresh['ready_s']} s, RSS {fresh['rss_mib']} MiB (peak {fresh['peak_rss_mib']} MiB), "
          f"{bench.results['serve_rss_mib']} MiB without claims: {slope:.2f} KiB per claim")
    return {"claims": claims, "create_s": round(total_s, 1), "samples": samples, "fresh_serve": fresh,
            "reserved_devices": counted,
            "fresh_kib_per_claim": round(slope, 2)}


# -- main ---------------------------------------------------------------------------------------


async def cluster_sections(args: argparse.Namespace, only: set[str], results: JSON) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-admission-") as tmp:
        # (f) reads serve's metrics (admissions by path, the annotator's backlog).
        async with control_plane(args, Path(tmp), metrics_port=free_ports(1)[0] if "f" in only else 0) as bench:
            results["cluster"] = bench.results
            # The generator's own long-lived data (the slices it created, the bodies it
            # sends) must not cost it full collections while it measures: `serve` is
            # what is measured.
            gc.collect()
            gc.freeze()
            print(f"load average {load_average()}")
            if "b" in only:
                results["b"] = await section_b(bench, args.seconds, args.rates)
                results["b_persisted"] = await section_b_persisted(bench, args.persisted, args.persisted_rates,
                                                                   args.seconds)
                bench.note_rss("b")
            if "d" in only:
                results["d"] = await section_d(bench, max(args.seconds, 5), 200, 10)
                bench.note_rss("d")
            if "c" in only:
                results["c"] = await section_c(bench, args.seconds, args.rounds, args.workers)
                bench.note_rss("c")
            if "f" in only:
                results["f"] = await section_f(bench, args.sustained_rate, args.sustained_seconds, args.sustained_in_flight)
                bench.note_rss("f")
            if "e" in only:
                results["e"] = await section_e(bench, args.claims, args.checkpoints)
            results["load_average_end"] = load_average()
            results["serve_rss_after_mib"] = bench.rss_after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="a,b,c,d,e,f", help="sections to run (comma-separated)")
    parser.add_argument("--nodes", type=int, default=5000, help="inventory size (8 GPUs a node)")
    parser.add_argument("--claims", type=int, default=150_000, help="(e): claims created in the API server")
    parser.add_argument("--inprocess-claims", type=int, default=5000, help="(a): claims reviewed in-process")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load step")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")],
                        default=[100, 200, 300, 500, 750, 1500, 2000, 2500, 3000, 4000],
                        help="(b): rates tried after 1,000/s (above it while p99 holds, below it otherwise)")
    parser.add_argument("--persisted", type=int, default=300, help="(b): persisted admissions one at a time")
    parser.add_argument("--persisted-rates", type=lambda s: [float(x) for x in s.split(",")], default=[20, 50, 100])
    parser.add_argument("--rounds", type=int, default=2, help="(c): alternating rounds per mode")
    parser.add_argument("--workers", type=int, default=16, help="(c): creates in flight")
    parser.add_argument("--checkpoints", type=int, default=5, help="(e): RSS samples while creating")
    parser.add_argument("--sustained-rate", type=float, default=200.0, help="(f): creates per second offered")
    parser.add_argument("--sustained-seconds", type=float, default=300.0, help="(f): for how long, in each namespace")
    parser.add_argument("--sustained-in-flight", type=int, default=64, help="(f): creates in flight at most")
    parser.add_argument("--reservation-ttl", type=float, default=None,
                        help="serve's --reservation-ttl (its default, 60 s, when not given)")
    parser.add_argument("--lease-period", type=float, default=None,
                        help="serve's --lease-period, and (a)'s (serve's default when not given)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 200 nodes, 2,000 claims, 2 s steps, 1 round, (f) for 20 s")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "admission.json")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.claims, args.inprocess_claims, args.seconds = 200, 2000, 500, 2.0
        args.rates, args.persisted, args.persisted_rates, args.rounds, args.checkpoints = [500, 2000], 50, [20], 1, 2
        args.sustained_seconds = 20.0
    only = set(args.only.split(","))
    results: JSON = {"nodes": args.nodes, "cores": os.cpu_count(), "load_average_start": load_average(),
                     "reservation_ttl": args.reservation_ttl, "lease_period": args.lease_period,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(f"admission benchmark: {args.nodes} nodes, {os.cpu_count()} cores, load average {load_average()}")
    if "a" in only:
        results["a"] = section_a(generate_slices(args.nodes), args.inprocess_claims,
                                 SERVE_LEASE_PERIOD if args.lease_period is None else args.lease_period)
    if only & {"b", "c", "d", "e", "f"}:
        asyncio.run(cluster_sections(args, only, results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nload average at the end {load_average()}; results written to {args.output}")


if __name__ == "__main__":
    main()
