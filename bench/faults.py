"""Faults under a steady load of claim creates, full size: a frozen leader, an API server
restart, an etcd compaction (tests/e2e/test_faults.py proves the outcomes; this prints the numbers).

    python bench/faults.py                 # --namespaces 24 --full 6 --in-flight 64 --settle 15
    python bench/faults.py --only restart

One control plane (tests/e2e/cluster.py's, with the API server's watch cache, as a
production API server runs), --namespaces namespaces each with a DeviceQuota on one
DeviceClass (the first --full of them `hard: {devices: 8}`, so they fill and deny; the
others with room) and one team over all of them (tests/e2e/faults.py's `tenants`). Two
`serve` replicas share one Lease (lease 4 s, renew deadline 3 s, retry 1 s; reservations'
TTL 20 s): A runs the controller only (`--no-webhook`: what it writes after waking is a
leader's), B serves the webhooks and campaigns. The load (tests/e2e/faults.py's `Load`):
one-GPU creates round-robin over the namespaces from 4 clients, --in-flight at a time,
each tried once, through all the phases:
- frozen: A leads; SIGSTOP A; B takes the Lease over and writes; SIGCONT A once B has
  led for --settle s; A steps down. Time to ready: from the SIGSTOP to B leading.
- restart: kube-apiserver SIGKILLed and started again on the same etcd and port. Time to
  ready: from the kill to B's /readyz answering 200 again after it dropped.
- compaction: etcd compacted to its current revision while the API server is down (a
  restart as above), so every watch comes back from a revision etcd no longer has
  (410 Gone) and relists. Time to ready as for the restart.
- compaction-up: etcd compacted to its current revision while the API server runs (as
  its own periodic compaction does): whether any watch relists or readiness drops.
Each phase runs the load --settle s before and after its fault and prints: creates
(created, denied by a quota, denied by our webhook to retry, failed: by the API server
being unreachable, by a webhook call, other) and their rate; over-commit: the largest
used + reserved - hard any watched resourceVersion of any DeviceQuota showed in the
phase (a reflector of ours over them: it reconnects and relists too); time to ready;
watch restarts and relists (B's metrics); the longest event loop stall of each replica
(its wall time and its own CPU; A's wall stall includes its freeze); and, for the frozen
leader, A's writes sent after it woke (its debug log) and refused by its Lease gate. At the end: every quota's status against
the claims (exact once the reservations of creates cut by the faults expired), and
claims past `hard`. Writes bench/results/faults.json. Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devcluster.binary import build  # noqa: E402
from devcluster.controlplane import ControlPlane  # noqa: E402
from kube.api import KubeApi  # noqa: E402
from runtime.metricnames import (  # noqa: E402
    EVENT_LOOP_STALL_CPU_MAX, EVENT_LOOP_STALL_MAX, WATCH_RELISTS, WATCH_RESTARTS,
)
from tests.e2e.cluster import free_ports  # noqa: E402
from tests.e2e.faults import (  # noqa: E402
    Load, QuotaWatch, Readiness, mismatches, overcommit, own_tenants, running, sampled, until, watching,
    writes_sent_after,
)
from tests.e2e.harness import Served, adapted_webhooks, governed, installed  # noqa: E402
from tests.e2e.kube import Kube, poll  # noqa: E402

JSON = dict[str, Any]
TTL = 20.0
SMALL = 8
LEASE = ("--leader-election-lease-duration", "4", "--leader-election-renew-deadline", "3",
         "--leader-election-retry-period", "1")
PHASES = ("frozen", "restart", "compaction", "compaction-up")


async def scrape(served: Served) -> dict[str, float]:
    scraped = await served.metrics()
    out: dict[str, float] = {}
    for (name, _), value in scraped.items():
        if name in (WATCH_RESTARTS, WATCH_RELISTS):
            out[name] = out.get(name, 0.0) + value
        elif name in (EVENT_LOOP_STALL_MAX, EVENT_LOOP_STALL_CPU_MAX):
            out[name] = max(out.get(name, 0.0), value)
    return out


async def holder(kube: Kube, lease: str) -> str:
    obj = await kube.get("coordination.k8s.io/v1", "leases", lease, namespace="default")
    return str((obj.get("spec") or {}).get("holderIdentity") or "")


class Phase:
    """One fault's numbers: the load's counters and the quota watch's worst, from its start."""

    def __init__(self, name: str, load: Load, watch: QuotaWatch) -> None:
        self.name, self.load, self.watch = name, load, watch
        self.started = time.monotonic()
        self.base = self.counts()
        watch.worst, watch.worst_at = -(10**9), ""
        self.row: JSON = {"phase": name}

    def counts(self) -> dict[str, int]:
        load = self.load
        return {"created": load.admitted, "denied": load.exceeded, "denied_to_retry": sum(load.retried.values()),
                "failed": sum(load.failed.values()), "failed_unreachable": load.failed_in("unreachable"),
                "failed_by_webhook": load.failed_in("webhook"), "failed_other": load.failed_in("other")}

    def end(self, **more: Any) -> JSON:
        seconds = time.monotonic() - self.started
        counts = {key: n - self.base[key] for key, n in self.counts().items()}
        answered = counts["created"] + counts["denied"] + counts["denied_to_retry"] + counts["failed"]
        self.row.update(seconds=round(seconds, 1), **counts, creates_per_second=round(answered / seconds, 1),
                        overcommit=self.watch.worst, overcommit_at=self.watch.worst_at, **more)
        return self.row


def show(row: JSON) -> None:
    print(f"\n[{row['phase']}] {row['seconds']} s: {row['created']} created, {row['denied']} denied by a quota, "
          f"{row['denied_to_retry']} denied by our webhook to retry, {row['failed']} failed "
          f"({row['failed_unreachable']} API server unreachable, {row['failed_by_webhook']} by a webhook call, "
          f"{row['failed_other']} other), {row['creates_per_second']} creates/s")
    print(f"  over-commit (max used+reserved-hard at any watched resourceVersion): {row['overcommit']}"
          f"{' at ' + row['overcommit_at'] if row['overcommit'] > 0 else ''}")
    print(f"  time to ready: {row['ready_seconds']:.1f} s ({row['ready_what']})")
    for key in ("watch_restarts", "watch_relists", "stall_max_a", "stall_cpu_max_a", "stall_max_b", "stall_cpu_max_b",
                "apiserver_ready_seconds", "a_writes_after_waking", "a_writes_refused"):
        if key in row:
            print(f"  {key.replace('_', ' ')}: {row[key]}")


async def frozen(args: argparse.Namespace, kube: Kube, a: Served, b: Served, lease: str, phase: Phase) -> JSON:
    assert a.process is not None
    await asyncio.sleep(args.settle)  # the load before the fault
    mark = len(a.log_text())
    stopped = time.monotonic()
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        await poll(lambda: _is_holder(kube, lease, "b"), timeout=120, what="B to take the Lease over")
        took = time.monotonic() - stopped
        await asyncio.sleep(args.settle)  # B leads and admits while A is frozen
    finally:
        woke = time.time()
        os.kill(a.process.pid, signal.SIGCONT)
    await until(lambda: "stopped leading" in a.log_text()[mark:], timeout=60, what="A to step down")
    await asyncio.sleep(args.settle)  # the load after the fault
    log = a.log_text()[mark:]
    metrics_a, metrics_b = await scrape(a), await scrape(b)
    return phase.end(ready_seconds=took, ready_what="SIGSTOP of the leader to the other replica leading",
                     a_writes_after_waking=len(writes_sent_after(log, woke)), a_writes_refused=log.count("NotLeading"),
                     **stalls(metrics_a, metrics_b))


async def _is_holder(kube: Kube, lease: str, identity: str) -> bool:
    return await holder(kube, lease) == identity


def stalls(metrics_a: dict[str, float], metrics_b: dict[str, float]) -> JSON:
    return {"stall_max_a": metrics_a.get(EVENT_LOOP_STALL_MAX), "stall_cpu_max_a": metrics_a.get(EVENT_LOOP_STALL_CPU_MAX),
            "stall_max_b": metrics_b.get(EVENT_LOOP_STALL_MAX), "stall_cpu_max_b": metrics_b.get(EVENT_LOOP_STALL_CPU_MAX)}


async def restart(args: argparse.Namespace, cluster: ControlPlane, a: Served, b: Served, readiness: Readiness,
                  phase: Phase, *, compact: bool) -> JSON:
    await asyncio.sleep(args.settle)
    before = await scrape(b)
    killed = time.monotonic()
    apiserver = await asyncio.to_thread(cluster.restart_apiserver,
                                        while_down=cluster.compact_etcd if compact else lambda: None)
    await until(lambda: readiness.ready_again(killed) is not None, timeout=300, what="B ready again")
    back = readiness.ready_again(killed)
    assert back is not None
    await asyncio.sleep(args.settle)
    after, metrics_a = await scrape(b), await scrape(a)
    return phase.end(ready_seconds=back - killed, ready_what="kill of the API server to serve's /readyz 200 again",
                     apiserver_ready_seconds=round(apiserver, 1),
                     watch_restarts=after.get(WATCH_RESTARTS, 0) - before.get(WATCH_RESTARTS, 0),
                     watch_relists=after.get(WATCH_RELISTS, 0) - before.get(WATCH_RELISTS, 0),
                     **stalls(metrics_a, after))


async def compaction_up(args: argparse.Namespace, cluster: ControlPlane, a: Served, b: Served,
                        readiness: Readiness, phase: Phase) -> JSON:
    await asyncio.sleep(args.settle)
    before = await scrape(b)
    compacted = time.monotonic()
    revision = await asyncio.to_thread(cluster.compact_etcd)
    await asyncio.sleep(args.settle)
    after, metrics_a = await scrape(b), await scrape(a)
    dropped = any(at >= compacted and not ok for at, ok in readiness.answers)
    return phase.end(ready_seconds=0.0, ready_what=f"readiness dropped: {dropped} (compacted at revision {revision})",
                     watch_restarts=after.get(WATCH_RESTARTS, 0) - before.get(WATCH_RESTARTS, 0),
                     watch_relists=after.get(WATCH_RELISTS, 0) - before.get(WATCH_RELISTS, 0),
                     **stalls(metrics_a, after))


async def bench(args: argparse.Namespace, workdir: Path) -> JSON:
    cluster = ControlPlane(binary=build(), workdir=workdir)
    cluster.start()
    print(f"control plane ready in {cluster.startup_seconds:.1f} s")
    results: JSON = {"args": vars(args), "phases": []}
    kube = cluster.client()
    clients = [cluster.client() for _ in range(4)]
    api = await KubeApi.from_kubeconfig(str(cluster.kubeconfig))
    run = uuid.uuid4().hex[:8]
    lease = f"faults-{run}"
    port, a_metrics, b_metrics = free_ports(3)
    lease_args = ("--leader-election-namespace", "default", "--leader-election-lease-name", lease, *LEASE)
    # self_managed: with --no-webhook its metrics listener's certificate is its own.
    a = Served(cluster, 0, workdir / "a.log", webhook=False, self_managed=True, metrics_port=a_metrics, args=lease_args)
    b = Served(cluster, port, workdir / "b.log", metrics_port=b_metrics,
               args=(*lease_args, "--reservation-ttl", str(TTL)))
    try:
        t = await own_tenants(kube, run=run, count=args.namespaces, full=args.full, small=SMALL)
        await a.start()
        await poll(lambda: _is_holder(kube, lease, "a"), timeout=60, what="A to lead")
        await b.start()
        load = Load(clients, t, workers=args.in_flight)
        async with installed(kube, adapted_webhooks(run, port, cluster)), watching(api, t) as watch, \
                sampled(b) as readiness:
            for namespace in t.namespaces:
                await governed(kube, namespace, timeout=60)
            async with running(load):
                for name in PHASES:
                    if args.only and name not in args.only:
                        continue
                    phase = Phase(name, load, watch)
                    if name == "frozen":
                        row = await frozen(args, kube, a, b, lease, phase)
                    elif name == "compaction-up":
                        row = await compaction_up(args, cluster, a, b, readiness, phase)
                    else:
                        row = await restart(args, cluster, a, b, readiness, phase, compact=name == "compaction")
                    show(row)
                    results["phases"].append(row)

            async def settled() -> bool:
                return not await mismatches(kube, t)

            exact = True
            try:
                await poll(settled, timeout=TTL + 120, what="every status to equal the claims")
            except AssertionError:
                exact = False
            results["exact_at_the_end"] = exact
            results["claims_past_hard"] = max(0, await overcommit(kube, t))
            results["mismatches"] = await mismatches(kube, t)
        print(f"\nat the end: every status equal to the claims: {exact}; claims past hard: "
              f"{results['claims_past_hard']}; load: {load.summary()}")
    finally:
        for served in (a, b):
            if served.process is not None and served.process.poll() is None:
                os.kill(served.process.pid, signal.SIGCONT)
            await served.kill()
        await api.close()
        for c in clients:
            await c.close()
        await kube.close()
        cluster.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespaces", type=int, default=24)
    parser.add_argument("--full", type=int, default=6, help="namespaces whose quota fills (hard 8 devices)")
    parser.add_argument("--in-flight", type=int, default=64, help="creates in flight")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds of load before and after each fault")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), default=set(), help=f"some of {','.join(PHASES)}")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (the replicas' and the control "
                                                  "plane's logs)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(bench(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
            results = asyncio.run(bench(args, Path(tmp)))
    out = ROOT / "bench" / "results" / "faults.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
