"""Event-loop stalls at 150,000 claims and 58,000 devices, each operation under an honest review stream.

The target: no stall above 50 ms anywhere. This runs what `serve` runs, in-process, on
the real event loop: `commands.wiring.Caches` (every reflector, store, the refiner, the
relists in slices), the quota controller leading, the usage metrics on the metrics
listener, and the admission app (`webhook.endpoints` over a loopback socket, plain HTTP);
only the API server is a stand-in (`Api`: list pages cut at the request's `limit` and
resumed at its `continue`, as the API server pages, from objects encoded once, and
decoded as `kube.api` decodes them; watches that end in a 410 Gone on demand, or deliver
an event; quota status writes kept in memory and sent back as watch events). A child process sends an
honest dryRun claim CREATE every `--every` seconds (open loop: each timed from when it was
due) to a namespace with a DeviceQuota. Then, one at a time: the stored claims priced
after ready, the first usage-metrics scrape and the next ones, a quota controller pass
over every DeviceQuota, relists (410) of ResourceSlices, ResourceClaims (unchanged, then
every claim changed) and DeviceQuotas, then a team quota (a ClusterDeviceQuota whose scope
no DeviceQuota shares, so its parts are counted from the claims: `kube.recounts`) created
over 48 namespaces (144,000 claims), its selector changed to 24 of them, and one more
namespace relabelled into it; for each, the longest stall of the loop (a 5 ms
timer's lateness, as `runtime.stalls` measures it, and the CPU time the loop's thread spent
between two ticks), the longest full collection, and the honest
reviews due meanwhile (p50/p99/max), with the load average.

    python bench/stalls.py [--nodes 5000] [--claims 150000] [--at-once] [--quick]
                           [--only PREFIX ...] [--claim-page N] [--why [--why-ms MS]]

`--at-once` runs relists, scrapes and team counts as before the slicing work (in one
piece, `gc.freeze()` at ready as `serve` did): the before figures. `--only` measures the
operations whose names start so (`ResourceClaims`, `team`); `--claim-page 500` lists the
claims in pages of 500, as before `commands.wiring.CLAIM_PAGE`. Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from admission import ROOMY, claim, load_average, one_gpu, percentile, review  # noqa: E402
from inventory import ADMIN_ACCESS_LABEL, generate_claims, generate_device_classes, generate_slices  # noqa: E402
from longticks import Sampler  # noqa: E402

from commands.wiring import Caches  # noqa: E402
from controllers.quotas import QuotaController  # noqa: E402
from kube.api import KubeApi, Resource  # noqa: E402
from kube.apierror import ApiError  # noqa: E402
from kube.loaders import Configuration  # noqa: E402
from kube.resources import CLAIMS, CLASSES, CLUSTER_QUOTAS, NAMESPACES, QUOTAS, SLICES  # noqa: E402
from kube.watching import Reflector  # noqa: E402
from quota.admission.policy import AdminAccessPolicy  # noqa: E402
from quota.values.raw import Obj  # noqa: E402
from webhook.claimreview import ClaimContext  # noqa: E402
from webhook.endpoints import endpoints  # noqa: E402
from webhook.metrics import Metrics  # noqa: E402
from webhook.metricsserver import serve_metrics  # noqa: E402
from webhook.server import build_app  # noqa: E402
from webhook.usagemetrics import UsageMetrics  # noqa: E402

JSON = dict[str, Any]
PROBE = 0.005  # seconds between two ticks of the stall probe
TEAMS = 50


# -- the stand-in API server ------------------------------------------------------------------------


class Api(KubeApi):
    """`KubeApi` with the round trip served from memory (module doc)."""

    def __init__(self) -> None:
        configuration = Configuration()
        configuration.host = "http://127.0.0.1:1"
        super().__init__(configuration)
        # list path -> (head of a page, its items each encoded, the page's kind): pages are
        # cut at the request's `limit` and resumed at its `continue` (an offset), as the
        # API server pages a list; only the joins run per request.
        self.lists: dict[str, tuple[str, list[bytes]]] = {}
        self.objects: dict[str, JSON] = {}  # object path -> object (DeviceQuotas)
        self.expire: dict[str, asyncio.Event] = {}  # list path -> set: its watch ends in a 410
        self.events: dict[str, asyncio.Queue[tuple[str, JSON]]] = {}
        self.version = 10_000_000

    def serve_list(self, resource: Resource, items: Sequence[JSON]) -> None:
        path = resource.path()
        kind = items[0]["kind"] if items else ""
        self.lists[path] = (f'{{"apiVersion": {json.dumps(resource.api_version)}, "kind": "{kind}List", '
                            f'"items": [', [json.dumps(item).encode() for item in items])
        self.expire.setdefault(path, asyncio.Event())
        self.events.setdefault(path, asyncio.Queue())

    def page(self, path: str, params: Mapping[str, Any]) -> bytes:
        """One page: `limit` items from the `continue` offset, and the next offset while any are left."""
        head, items = self.lists[path]
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items) or 1
        end = min(start + limit, len(items))
        meta = json.dumps({"resourceVersion": str(self.version), "continue": str(end) if end < len(items) else ""})
        return b"".join((head.encode(), b",".join(items[start:end]), b'], "metadata": ', meta.encode(), b"}"))

    async def _round_trip(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                          body: Any = None, **_: Any) -> bytes:
        await asyncio.sleep(0)
        if method == "GET" and path in self.lists:
            return self.page(path, params or {})
        if method == "GET" and path in self.objects:
            return json.dumps(self.objects[path]).encode()
        if method == "PUT" and path.endswith("/status"):
            self.version += 1
            stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
            self.objects[path.removesuffix("/status")] = stored
            watched = QUOTAS if stored["metadata"].get("namespace") else CLUSTER_QUOTAS
            self.events[watched.path()].put_nowait(("MODIFIED", stored))
            return json.dumps(stored).encode()
        raise ApiError(404, "NotFound", f"{method} {path}")

    async def watch(self, resource: Resource, **kwargs: Any) -> AsyncGenerator[tuple[str, Obj], None]:
        if kwargs.get("send_initial_events"):
            # Refused as an API server without streamed lists refuses it: serve lists by pages here.
            raise ApiError(422, "Invalid", "sendInitialEvents: the stand-in serves lists by pages")
        path = resource.path()
        if path not in self.expire:
            await asyncio.Event().wait()  # a kind the stand-in does not serve: a quiet watch
        expired, events = self.expire[path], self.events[path]
        while True:
            getting = asyncio.ensure_future(events.get())
            ending = asyncio.ensure_future(expired.wait())
            await asyncio.wait([getting, ending], return_when=asyncio.FIRST_COMPLETED)
            getting.cancel()
            ending.cancel()
            if expired.is_set():
                expired.clear()
                raise ApiError(410, "Expired", "too old resource version")
            if getting.done() and not getting.cancelled():
                yield getting.result()


TEAM = "bench-team"
TEAM_LABEL = "team.draquota.io/name"
IN_TEAM = 48  # namespaces team-000 ... team-047 carry the team's label; team-048 is relabelled in
HALF = [f"team-{k:03d}" for k in range(IN_TEAM // 2)]


def team_quota(version: int, selector: JSON) -> JSON:
    """A ClusterDeviceQuota whose scope (MIG and AMD classes) no DeviceQuota shares: its part
    of each namespace is counted from the claims, not taken from a DeviceQuota's usage."""
    return {"apiVersion": CLUSTER_QUOTAS.api_version, "kind": "ClusterDeviceQuota",
            "metadata": {"name": TEAM, "uid": "cdq-bench", "resourceVersion": str(version), "generation": version},
            "spec": {"hard": ROOMY, "namespaceSelector": selector,
                     "deviceClassNames": ["mig.nvidia.com", "gpu.amd.com"]}}


def namespace(k: int, *, in_team: bool) -> JSON:
    meta: JSON = {"name": f"team-{k:03d}", "resourceVersion": "1",
                  "labels": {**({ADMIN_ACCESS_LABEL: "true"} if k % 2 == 1 else {}),
                             **({TEAM_LABEL: "ml"} if in_team else {})}}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def quota(namespace: str) -> JSON:
    return {"apiVersion": QUOTAS.api_version, "kind": "DeviceQuota",
            "metadata": {"name": "gpus", "namespace": namespace, "uid": f"dq-{namespace}", "resourceVersion": "1",
                         "generation": 1}, "spec": {"hard": ROOMY}}


# -- what is measured ---------------------------------------------------------------------------------


@dataclass
class Probe:
    """Every tick's lateness and the loop thread's CPU time since the tick before (on a
    shared machine the OS also takes the CPU away: the CPU figure is what our code held),
    and every full collection, timestamped (wall clock)."""

    ticks: list[tuple[float, float, float]] = field(default_factory=list)
    collections: list[tuple[float, int, float]] = field(default_factory=list)  # (when, generation, seconds)
    why: Sampler | None = None  # `--why`: what ran in the long ticks
    _started: float = 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, cpu, began = loop.time() + PROBE, time.thread_time(), time.time()
            await asyncio.sleep(PROBE)
            tick = (time.time(), max(0.0, loop.time() - due), time.thread_time() - cpu)
            self.ticks.append(tick)
            if self.why is not None:
                self.why.tick(began, *tick)

    def collected(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.collections.append((time.time(), info["generation"], time.thread_time() - self._started))


@dataclass
class Window:
    name: str
    start: float
    end: float
    load: str

    def row(self, probe: Probe, reviews: Sequence[tuple[float, float, bool]]) -> JSON:
        late = [v for t, v, _ in probe.ticks if self.start <= t <= self.end]
        busy = [c for t, _, c in probe.ticks if self.start <= t <= self.end]
        full = [v for t, g, v in probe.collections if self.start <= t <= self.end and g == 2]
        young = [v for t, g, v in probe.collections if self.start <= t <= self.end and g < 2]
        answered = [ms for due, ms, ok in reviews if self.start <= due <= self.end and ok]
        failed = sum(1 for due, _, ok in reviews if self.start <= due <= self.end and not ok)
        return {"what": self.name, "seconds": round(self.end - self.start, 1),
                "stall_max_ms": round(max(late, default=0.0) * 1000, 1),
                "stall_cpu_max_ms": round(max(busy, default=0.0) * 1000, 1),
                "ticks_over_50ms": sum(1 for v in late if v > 0.05),
                "ticks_cpu_over_50ms": sum(1 for c in busy if c > 0.05),
                "full_gc_max_ms": round(max(full, default=0.0) * 1000, 1), "full_gcs": len(full),
                "young_gc_max_ms": round(max(young, default=0.0) * 1000, 1),
                "reviews": len(answered), "failed": failed,
                "p50_ms": round(percentile(answered, 0.5), 1), "p99_ms": round(percentile(answered, 0.99), 1),
                "max_ms": round(max(answered, default=float("nan")), 1), "load": self.load}


# -- the honest reviewer (child process) ---------------------------------------------------------------


def reviewer(url: str, every: float, stop: Any, out: Any) -> None:
    async def main() -> list[tuple[float, float, bool]]:
        done: list[tuple[float, float, bool]] = []
        bodies = [json.dumps(review(claim(one_gpu(), "team-001"), namespace="team-001", dry_run=True)).encode()
                  for _ in range(64)]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            tasks: set[asyncio.Task[None]] = set()

            async def one(due: float, body: bytes) -> None:
                try:
                    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                        ok = resp.status == 200 and (await resp.json())["response"]["allowed"]
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                done.append((due, (time.time() - due) * 1000, ok))

            start, n = time.time(), 0
            while not stop.is_set():
                due = start + n * every
                await asyncio.sleep(max(0.0, due - time.time()))
                task = asyncio.create_task(one(due, bodies[n % len(bodies)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
            await asyncio.gather(*tasks)
        return done

    out.send(asyncio.run(main()))


# -- the run ------------------------------------------------------------------------------------------------


@dataclass
class World:
    api: Api
    caches: Caches
    controller: QuotaController
    probe: Probe
    windows: list[Window] = field(default_factory=list)

    def reflector(self, resource: Resource) -> Reflector:
        return next(r for r in (*self.caches.first, self.caches.claims) if r.resource == resource)

    async def measure(self, name: str, operation: Callable[[], Any], settle: float) -> None:
        start = time.time()
        await operation()
        await asyncio.sleep(settle)  # what follows it (a collection) counts with it
        self.windows.append(Window(name, start, time.time(), load_average()))
        print(f"  {name}: {time.time() - start - settle:.1f} s from {start:.2f} (load average {load_average()})",
              flush=True)

    async def relist(self, resource: Resource) -> None:
        reflector = self.reflector(resource)
        lists = reflector.stats.lists
        self.api.expire[resource.path()].set()
        await until(lambda: reflector.stats.lists > lists)

    async def scrape(self, port: int) -> None:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=900).read()",
            f"http://127.0.0.1:{port}/metrics")
        await child.wait()

    async def watched(self, resource: Resource, kind: str, obj: JSON) -> None:
        """`obj` delivered by `resource`'s watch; done once the team's recount (if any) ended."""
        ledger = self.caches.admitter.ledger
        events = self.reflector(resource).stats.events
        if resource is CLUSTER_QUOTAS:
            self.api.objects[CLUSTER_QUOTAS.path(None, TEAM)] = obj
        self.api.events[resource.path()].put_nowait((kind, obj))
        await until(lambda: self.reflector(resource).stats.events > events and not ledger.recounting(TEAM), 0.005)

    async def pass_over_every_quota(self) -> None:
        passes = self.controller.passes
        self.controller.changed(None)
        await until(lambda: self.controller.passes > passes)


async def whole(fetch: Callable[[], Awaitable[list[JSON]]], replace: Callable[[list[JSON]], None]) -> None:
    """A list in one piece (`--at-once`: as before this work)."""
    replace(await fetch())


async def until(condition: Callable[[], bool], every: float = 0.05) -> None:
    while not condition():
        await asyncio.sleep(every)


async def run(args: argparse.Namespace) -> list[JSON]:
    print(f"generating {args.nodes} nodes and {args.claims} claims ...", flush=True)
    slices = generate_slices(args.nodes)
    claims = generate_claims(args.claims, TEAMS, 7, slices)
    for i, c in enumerate(claims):
        c["metadata"]["resourceVersion"] = str(1000 + i)
        if (c.get("status") or {}).get("allocation"):
            c["status"]["reservedFor"] = [{"resource": "pods", "name": f"pod-{i}", "uid": f"pod-uid-{i}"}]
    api = Api()
    api.serve_list(SLICES, slices)
    api.serve_list(CLASSES, generate_device_classes())
    api.serve_list(NAMESPACES, [namespace(k, in_team=k < IN_TEAM) for k in range(TEAMS)])
    quotas = [quota(f"team-{k:03d}") for k in range(TEAMS)]
    api.serve_list(QUOTAS, quotas)
    api.serve_list(CLUSTER_QUOTAS, [])
    for q in quotas:
        api.objects[QUOTAS.path(q["metadata"]["namespace"], "gpus")] = q
    api.serve_list(CLAIMS, claims)
    changed = [{**c, "metadata": {**c["metadata"], "resourceVersion": str(int(c["metadata"]["resourceVersion"]) + 1)}}
               for c in claims]
    changed_pages = Api()
    changed_pages.serve_list(CLAIMS, changed)
    del slices, claims, changed
    gc.collect()
    gc.freeze()  # the generator's own data: not what is measured
    # A full collection over nothing (all frozen): CPython runs the next automatic one once
    # the objects promoted since exceed a quarter of those the last one kept, which was
    # the generator's millions; `serve` has no such data, so its full collections come
    # far sooner. Counted from zero, as in `serve`.
    gc.collect()

    caches = Caches(api, "conservative", reservation_ttl=120.0)
    if args.at_once:
        for r in (*caches.first, caches.claims):
            r.rebuild = whole
    if args.claim_page:
        caches.claims.settings = replace(caches.claims.settings, page_size=args.claim_page)
    if args.at_once:
        caches.admitter.ledger.defer_recounts(None)  # a team's parts counted in the watch event, as before
    probe = Probe(why=Sampler(threshold=args.why_ms / 1000) if args.why else None)
    gc.callbacks.append(probe.collected)
    if probe.why is not None:
        gc.callbacks.append(probe.why.collected)
        probe.why.start()
    controller = QuotaController(caches.admitter.ledger, caches.reservations, leading=lambda: True, resync=3600)
    caches.changed.append(controller.changed)
    metrics = Metrics()
    UsageMetrics(caches.admitter.ledger, caches.inventory, caches.holders, pending=caches.reservations.pending
                 ).register(metrics)
    ctx = ClaimContext(caches.admitter, caches.namespaces.get, AdminAccessPolicy,
                       reservations=caches.reservations, slicer=caches.slicer)
    runner = web.AppRunner(build_app(endpoints(ctx), ready=lambda: caches.synced), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()

    async def at_once(exposition: Callable[[], list[bytes]]) -> list[bytes]:
        return exposition()

    async def sliced(exposition: Callable[[], list[bytes]]) -> list[bytes]:
        return await caches.rebuilds.run(exposition)

    metrics_runner, metrics_port = await serve_metrics(metrics, host="127.0.0.1", port=0, context=None, access=None,
                                                       render=at_once if args.at_once else sliced)
    world = World(api, caches, controller, probe)
    background = [asyncio.create_task(probe.run()), asyncio.create_task(caches.run())]
    if not args.at_once:
        background.append(asyncio.create_task(caches.rebuilds.collect()))
    stop, (receive, send) = multiprocessing.Event(), multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=reviewer, args=(f"http://127.0.0.1:{args.port}/validate", args.every,
                                                           stop, send), daemon=True)
    try:
        started = time.time()
        await caches.wait_synced()
        world.windows.append(Window("start-up: every list, before ready (no reviews)", started, time.time(),
                                    load_average()))
        if args.at_once:
            gc.freeze()  # as `serve` did once its caches first synced
        print(f"synced in {time.time() - started:.1f} s; {len(caches.inventory.usable())} devices, "
              f"{sum(1 for _ in caches.admitter.ledger.entries())} claims, {caches.refiner.pending} at their bound",
              flush=True)
        async def priced() -> None:
            caches.ready.set()
            await until(lambda: caches.refiner.pending == 0)

        async def relist_changed() -> None:
            api.lists[CLAIMS.path()] = changed_pages.lists[CLAIMS.path()]
            await world.relist(CLAIMS)

        background.append(asyncio.create_task(controller.run()))
        await until(lambda: controller.passes > 0)
        child.start()
        await asyncio.sleep(3)
        phases: list[tuple[str, Callable[[], Awaitable[Any]], float]] = [
            ("idle", lambda: asyncio.sleep(args.idle), 0),
            (f"stored claims priced after ready ({caches.refiner.pending})", priced, 1),
            ("first usage-metrics scrape", lambda: world.scrape(metrics_port), 1),
            ("next scrape, nothing changed", lambda: world.scrape(metrics_port), 1),
            (f"quota controller: a pass over every DeviceQuota ({TEAMS})", world.pass_over_every_quota, 1),
            ("ResourceSlices relist (410)", lambda: world.relist(SLICES), 1),
            ("scrape after the slice relist (every claim rendered again)", lambda: world.scrape(metrics_port), 1),
            ("ResourceClaims relist, nothing changed (410)", lambda: world.relist(CLAIMS), 1),
            ("ResourceClaims relist, every claim changed (410)", relist_changed, 1),
            ("DeviceQuotas relist (410)", lambda: world.relist(QUOTAS), 1),
            (f"team quota created: {IN_TEAM} namespaces' claims counted", lambda: world.watched(
                CLUSTER_QUOTAS, "ADDED", team_quota(2, {"matchLabels": {TEAM_LABEL: "ml"}})), 1),
            (f"team quota's selector changed: {IN_TEAM - len(HALF)} namespaces counted", lambda: world.watched(
                CLUSTER_QUOTAS, "MODIFIED", team_quota(3, {"matchLabels": {TEAM_LABEL: "ml"}, "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": HALF}]})), 1),
            ("team quota: a namespace relabelled into it, its claims counted", lambda: world.watched(
                NAMESPACES, "MODIFIED", namespace(IN_TEAM, in_team=True)), 1),
            ("idle after", lambda: asyncio.sleep(args.idle), 0),
        ]
        for name, operation, settle in phases:
            if not args.only or any(name.startswith(prefix) for prefix in args.only):
                await world.measure(name, operation, settle)
        stop.set()
        reviews: list[tuple[float, float, bool]] = await asyncio.to_thread(receive.recv)
        # What the freezes cost: cycles frozen that became garbage, never collected since
        # (the generator's own frozen data is acyclic). Measured last: this is a full
        # collection over everything.
        gc.unfreeze()
        leaked = gc.collect()
        print(f"freezes: {caches.rebuilds.freezes}; cyclic garbage found among the frozen objects once unfrozen: "
              f"{leaked} objects", flush=True)
    finally:
        stop.set()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await runner.cleanup()
        await metrics_runner.cleanup()
        child.join(timeout=30)
        if probe.why is not None:
            probe.why.stop()
            probe.why.report([(w.name, w.start, w.end) for w in world.windows])
    return [w.row(probe, reviews) for w in world.windows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000, help="inventory size (8 GPUs a node)")
    parser.add_argument("--claims", type=int, default=150_000)
    parser.add_argument("--every", type=float, default=0.02, help="seconds between two honest reviews")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the idle windows")
    parser.add_argument("--port", type=int, default=18944)
    parser.add_argument("--at-once", action="store_true", help="relists and scrapes in one piece (the before)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 nodes, 5,000 claims")
    parser.add_argument("--why", action="store_true", help="sample the loop's stack: print what ran in long ticks")
    parser.add_argument("--claim-page", type=int, default=0,
                        help="claims a list page (default: serve's, commands.wiring.CLAIM_PAGE; before it, 500)")
    parser.add_argument("--why-ms", type=float, default=50.0, help="--why: what a long tick is, in ms of CPU")
    parser.add_argument("--only", nargs="*", default=[], metavar="PREFIX",
                        help="only the operations whose name starts so (e.g. 'ResourceClaims' 'team'); "
                             "without 'stored', the stored claims stay at their bound")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent / "results" / "stalls.json")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.claims, args.idle = 200, 5000, 2.0
    print(f"stalls: {args.nodes} nodes, {args.claims} claims, {os.cpu_count()} cores, load average {load_average()}"
          f"{' (--at-once)' if args.at_once else ''}", flush=True)
    rows = asyncio.run(run(args))
    print(f"\n{'':<60} {'longest stall, ms':>17} {'ticks >50ms':>11} {'longest GC, ms':>15} "
          f"{'honest reviews, ms':>22}\n{'what':<60} {'wall':>8} {'CPU':>8} {'wall':>5} {'CPU':>5} {'young':>7} "
          f"{'full':>7} {'p50':>6} {'p99':>7} {'max':>7} {'n':>5} {'fail':>4}  load")
    for r in rows:
        print(f"{r['what'][:60]:<60} {r['stall_max_ms']:>8.1f} {r['stall_cpu_max_ms']:>8.1f} {r['ticks_over_50ms']:>5} "
              f"{r['ticks_cpu_over_50ms']:>5} {r['young_gc_max_ms']:>7.1f} {r['full_gc_max_ms']:>7.1f} "
              f"{r['p50_ms']:>6.1f} {r['p99_ms']:>7.1f} {r['max_ms']:>7.1f} {r['reviews']:>5} {r['failed']:>4}  "
              f"{r['load']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"nodes": args.nodes, "claims": args.claims, "at_once": args.at_once,
                                       "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
