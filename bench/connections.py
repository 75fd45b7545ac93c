"""Idle and slow connections against `dra-quota serve`: its memory, and honest latency.

The control plane (tests/e2e/cluster.py) with a small generated inventory and `serve` at
its defaults (`--max-connections 1000`, 10 s handshake, header and body timeouts, 120 s
idle), started by bench/admission.py's `control_plane`. Then, with honest reviews posted
open-loop (bench/admission.py's write-nothing mix: a free claim, a claim a DeviceQuota
denies, a template, the mutating call; over a pool of kept-alive HTTPS connections, as the
API server posts them) at --rate a second for --seconds:

1. baseline: no attack;
2. attack: a second process (tests/e2e/attack.py's `Attacker`) holds --connections
   (10,000) idle and slow connections (TCP only, TLS only, slowloris
   headers, slow POST bodies; each re-opened --reopen s after serve dropped it); once it has
   opened them all, the honest load runs again. The attacker runs at --nice 19: on this
   2-core machine its own CPU would otherwise be taken from serve, where a real attacker
   runs on other hosts (--nice 0 shows that case too).

Printed for each: honest p50/p99 (target p99 <= 50 ms) and failures, and the time a new
connection (TCP + TLS) takes; during the attack also serve's peak RSS (sampled every
0.2 s), its event loop stalls (what draquota_event_loop_stall_seconds gained meanwhile:
the longest, and how many ticks were late by over 50 and 250 ms; its full collections,
draquota_gc_pause_seconds), serve's connection
counts and drops (draquota_connections*), and the load average beside every number. Not a timed test: `python bench/connections.py [--connections N] [--seconds S]`;
results also in bench/results/connections.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from admission import (  # noqa: E402
    Bench, control_plane, load_average, open_loop, percentile, rss_of, show, warm, write_nothing_bodies,
)

from tests.e2e.attack import Attack, Attacker  # noqa: E402
from tests.e2e.cluster import free_ports  # noqa: E402
from runtime.metricnames import (  # noqa: E402
    ADMISSION_DURATION, CONNECTIONS, CONNECTIONS_DROPPED, EVENT_LOOP_STALL, EVENT_LOOP_STALL_MAX, GC_PAUSE,
)

JSON = dict[str, Any]
TARGET_P99_MS = 50.0
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def buckets(samples: Samples, metric: str, **only: str) -> dict[float, float]:
    """A histogram's cumulative buckets, summed over its series (those with the labels `only`)."""
    out: dict[float, float] = {}
    for (name, labels), value in samples.items():
        if name == f"{metric}_bucket" and only.items() <= dict(labels).items():
            le = float(dict(labels)["le"])
            out[le] = out.get(le, 0.0) + value
    return out


def gained(before: Samples, after: Samples, metric: str, **only: str) -> dict[float, float]:
    """What a histogram's cumulative buckets gained between two scrapes."""
    old, new = buckets(before, metric, **only), buckets(after, metric, **only)
    return {b: new[b] - old.get(b, 0.0) for b in sorted(new)}


def bucket_of(counts: dict[float, float], q: float) -> tuple[float, float]:
    """(a, b]: the bucket of cumulative `counts` holding their q-quantile."""
    top = next(b for b in sorted(counts) if counts[b] >= q * counts[float("inf")])
    return max((b for b in counts if b < top), default=0.0), top


def quantile_between(before: Samples, after: Samples, metric: str, q: float) -> str:
    """The bucket "(a, b] ms" holding the q-quantile of what a histogram observed between two scrapes."""
    counts = gained(before, after, metric)
    if not counts.get(float("inf")):
        return "none"
    lower, top = bucket_of(counts, q)
    return f"({lower * 1000:g}, {top * 1000:g}] ms"


def stalls_between(before: Samples, after: Samples) -> str:
    """The longest stall observed between two scrapes, as its bucket "(a, b] s", and how
    many ticks were over 50 ms and over 250 ms (cumulative buckets: the counts gained)."""
    counts = gained(before, after, EVENT_LOOP_STALL)
    total = counts.get(float("inf"), 0.0)
    if not total:
        return "none"
    lower, top = bucket_of(counts, 1.0)
    return (f"longest ({lower:g}, {top:g}] s; {total - counts[0.05]:.0f} ticks over 50 ms, "
            f"{total - counts[0.25]:.0f} over 250 ms, of {total:.0f}")


def full_collections_between(before: Samples, after: Samples) -> str:
    """How many full collections serve made between two scrapes, and the longest's bucket
    (draquota_gc_pause_seconds; "not exported" by a serve older than it)."""
    counts = gained(before, after, GC_PAUSE, generation="2")
    if not counts:
        return "not exported"
    total = counts.get(float("inf"), 0.0)
    if not total:
        return "none"
    lower, top = bucket_of(counts, 1.0)
    return f"{total:.0f}, the longest ({lower * 1000:g}, {top * 1000:g}] ms"


def connection_counts(samples: Samples) -> JSON:
    open_by_phase = {dict(labels)["phase"]: int(value) for (name, labels), value in samples.items()
                     if name == CONNECTIONS and dict(labels)["listener"] == "webhook"}
    dropped = {dict(labels)["reason"]: int(value) for (name, labels), value in samples.items()
               if name == CONNECTIONS_DROPPED and dict(labels)["listener"] == "webhook" and value}
    return {"open": open_by_phase, "dropped": dropped}


@contextlib.asynccontextmanager
async def peak_rss(pid: int) -> AsyncIterator[list[float]]:
    """Samples the RSS of `pid` every 0.2 s while inside; yields [peak so far], in MiB."""
    peak, stop = [rss_of(pid)], asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_of(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.2)  # the sampling period

    sampler = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        stop.set()
        await sampler


@dataclass
class Breakdown:
    """Where each honest request's time went, by the client's aiohttp trace hooks: those
    that waited for a free connection of the pool, those that opened a new one (TCP + TLS:
    it waits in serve's accept queue behind the flood's connects), and the rest, on a
    kept-alive connection (only serve's loop and the kernel in between)."""

    new: list[tuple[float, float]] = field(default_factory=list)  # (connecting ms, whole request ms)
    kept: list[float] = field(default_factory=list)
    queued: int = 0

    def config(self) -> aiohttp.TraceConfig:
        trace = aiohttp.TraceConfig()
        clock = asyncio.get_running_loop().time

        async def start(_: object, ctx: SimpleNamespace, __: object) -> None:
            ctx.started, ctx.connecting = clock(), None

        async def queued(_: object, ctx: SimpleNamespace, __: object) -> None:
            self.queued += 1

        async def connecting(_: object, ctx: SimpleNamespace, __: object) -> None:
            ctx.connecting = clock()

        async def connected(_: object, ctx: SimpleNamespace, __: object) -> None:
            ctx.connecting = (clock() - ctx.connecting) * 1000

        async def end(_: object, ctx: SimpleNamespace, __: object) -> None:
            took = (clock() - ctx.started) * 1000
            if ctx.connecting is None:
                self.kept.append(took)
            else:
                self.new.append((ctx.connecting, took))

        trace.on_request_start.append(start)
        trace.on_connection_queued_start.append(queued)
        trace.on_connection_create_start.append(connecting)
        trace.on_connection_create_end.append(connected)
        trace.on_request_end.append(end)
        return trace

    def take(self) -> JSON:
        """What was recorded since the last take, and start afresh."""
        out = {"kept_alive": len(self.kept), "kept_alive_p50_ms": round(percentile(self.kept, 0.5), 1),
               "kept_alive_p99_ms": round(percentile(self.kept, 0.99), 1), "new_connection": len(self.new),
               "new_connection_connect_p99_ms": round(percentile([c for c, _ in self.new], 0.99), 1),
               "new_connection_p99_ms": round(percentile([t for _, t in self.new], 0.99), 1),
               "waited_for_the_pool": self.queued}
        self.new, self.kept, self.queued = [], [], 0
        return out


def save(results: JSON, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nload average at the end {load_average()}; results written to {output}")


async def honest(bench: Bench, bodies: list[tuple[str, bytes]], rate: float, seconds: float, name: str,
                 breakdown: Breakdown) -> JSON:
    """The open-loop honest load; beside it, a new connection (TCP and TLS handshake) every
    100 ms timed alone: what a pool's new connection waits, apart from the reviews."""
    loop = asyncio.get_running_loop()
    handshakes: list[float] = []
    context = ssl.create_default_context(cafile=str(bench.cluster.ca_file))
    context.check_hostname = False

    async def connect() -> None:
        end = loop.time() + seconds
        while loop.time() < end:
            started = loop.time()
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", bench.served.port, ssl=context), timeout=30)
                handshakes.append((loop.time() - started) * 1000)
                writer.close()
            except (OSError, TimeoutError):
                handshakes.append(float("inf"))
            await asyncio.sleep(0.1)  # the probe's period

    breakdown.take()
    before = await bench.served.metrics()
    started = time.monotonic()  # the system's clock: serve's own records of the window can be matched to it
    load, _ = await asyncio.gather(open_loop(bench.http, bench.base, bodies, rate, seconds, bench.serve_pid),
                                   connect())
    row: JSON = load.row(name)
    row["monotonic_window"] = [round(started, 3), round(time.monotonic(), 3)]
    row["load_average"] = load_average()
    row["new_connection_p50_ms"] = round(percentile(handshakes, 0.5), 1)
    row["new_connection_p99_ms"] = round(percentile(handshakes, 0.99), 1)
    row["requests"] = breakdown.take()
    # serve's own clock: from the review's headers read to its answer written.
    row["serve_p99"] = quantile_between(before, await bench.served.metrics(), ADMISSION_DURATION, 0.99)
    show(row, TARGET_P99_MS)
    print(f"    a new connection (TCP + TLS): p50 {row['new_connection_p50_ms']} ms, p99 "
          f"{row['new_connection_p99_ms']} ms ({len(handshakes)}); load average {row['load_average']}")
    r = row["requests"]
    print(f"    honest requests on a kept-alive connection: {r['kept_alive']}, p50 {r['kept_alive_p50_ms']} ms, "
          f"p99 {r['kept_alive_p99_ms']} ms; on a new one: {r['new_connection']}, p99 {r['new_connection_p99_ms']} ms "
          f"(connecting p99 {r['new_connection_connect_p99_ms']} ms); waited for a free one of the pool: "
          f"{r['waited_for_the_pool']}; serve's own p99 (draquota_admission_duration_seconds) {row['serve_p99']}")
    return row


async def run(args: argparse.Namespace) -> JSON:
    results: JSON = {"connections": args.connections, "rate": args.rate, "seconds": args.seconds,
                     "cores": os.cpu_count(), "load_average_start": load_average()}
    with tempfile.TemporaryDirectory(prefix="bench-connections-") as tmp:
        breakdown = Breakdown()
        async with control_plane(args, Path(tmp), metrics_port=args.metrics_port,
                                 trace=[breakdown.config()]) as bench:
            bodies = await write_nothing_bodies(bench)
            await warm(bench, bodies)
            print(f"\nserve RSS {rss_of(bench.serve_pid):.0f} MiB before; load average {load_average()}")
            quiet = await bench.served.metrics()
            results["baseline"] = await honest(bench, bodies, args.rate, args.seconds, "honest reviews, no attack",
                                               breakdown)
            before_rss, before = rss_of(bench.serve_pid), await bench.served.metrics()
            results["baseline"]["stalls"] = stalls_between(quiet, before)
            print(f"    event loop stalls without the attack: {results['baseline']['stalls']}")
            attacker = Attacker(bench.served.port, args.connections, Path(tmp) / "attack.json", ramp=args.ramp,
                                reopen=args.reopen, nice=args.nice, host="::1")
            async with peak_rss(bench.serve_pid) as peak:
                await attacker.start()
                started = time.monotonic()
                while attacker.opened() < args.connections:
                    assert attacker.alive(), "the attacker died"
                    await asyncio.sleep(0.5)  # the attacker reports once a second
                print(f"  the attack opened {args.connections} connections in {time.monotonic() - started:.1f} s; "
                      f"load average {load_average()}")
                during = await honest(bench, bodies, args.rate, args.seconds,
                                      f"honest reviews, {args.connections} idle/slow connections", breakdown)
                after = await bench.served.metrics()
                report = (await attacker.stop()).__dict__
                attack_seconds = time.monotonic() - started
            results["attack"] = {
                "honest": during, "attack": report, "serve_rss_before_mib": round(before_rss),
                "serve_peak_rss_mib": round(peak[0]), "serve_rss_after_mib": round(rss_of(bench.serve_pid)),
                "stalls": stalls_between(before, after), "full_collections": full_collections_between(before, after),
                "longest_stall_since_start_s": after.get((EVENT_LOOP_STALL_MAX, frozenset()), float("nan")),
                "serve_connections": connection_counts(after), "load_average": load_average(),
                "attempts_per_s": round((sum(report.get("opened", {}).values()) + report.get("failed", 0))
                                        / attack_seconds)}
            a = results["attack"]
            print(f"  serve RSS {a['serve_rss_before_mib']} MiB before, peak {a['serve_peak_rss_mib']} MiB during, "
                  f"{a['serve_rss_after_mib']} MiB after; event loop stalls during the attack: {a['stalls']}; full "
                  f"collections: {a['full_collections']}; "
                  f"load average {a['load_average']}")
            print(f"  serve's webhook connections at the end: {a['serve_connections']}")
            print(f"  {Attack(**report).line()}; "
                  f"{a['attempts_per_s']} connection attempts a second over {attack_seconds:.0f} s")
    results["load_average_end"] = load_average()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000, help="idle and slow connections held")
    parser.add_argument("--rate", type=float, default=100.0, help="honest reviews a second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each honest load step")
    parser.add_argument("--ramp", type=float, default=1000.0, help="connections the attack opens a second")
    parser.add_argument("--reopen", type=float, default=5.0, help="seconds before the attack re-opens a dropped one")
    parser.add_argument("--nice", type=int, default=19, help="the attacking process's niceness (0: as serve)")
    parser.add_argument("--nodes", type=int, default=50, help="inventory size (8 GPUs a node)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "connections.json")
    args = parser.parse_args()
    args.reservation_ttl = None  # control_plane reads it: serve's default
    args.metrics_port = free_ports(1)[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"connections benchmark: {args.connections} idle/slow connections, honest reviews at {args.rate:.0f}/s, "
          f"{os.cpu_count()} cores, load average {load_average()}; open files limit {soft}/{hard}")
    save(asyncio.run(run(args)), args.output)


if __name__ == "__main__":
    main()
